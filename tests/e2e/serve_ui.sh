#!/usr/bin/env bash
# serve_ui.sh - the playground's HTTP side (docs/serve.md "Playground"): GET / and /ui/<file> give
# the files of src/serve/ui byte for byte with their Content-Type, a strict Content-Security-Policy
# and nosniff, without a key even when one is set; HEAD works, POST is 405, an unknown file 404;
# with --no-ui all of them are 404 and the API is unaffected; /v1/models carries the documented
# "drama" object; index.html passes HTML Tidy. The page in a browser: serve_ui_browser.sh.
set -eu
. "$(dirname "$0")/serve_lib.bash"
UI="$DRAMA_SRC/src/serve/ui"
O="$WORK/r"

check_file() { # PATH FILE CONTENT-TYPE
    local s
    s=$(req GET "$1" "$O"); [ "$s" = 200 ] || fail "GET $1: $s"
    cmp -s "$O" "$UI/$2" || fail "GET $1 differs from src/serve/ui/$2"
    [ "$(header "$O" Content-Type)" = "$3" ] || fail "GET $1: Content-Type '$(header "$O" Content-Type)'"
    local csp
    csp=$(header "$O" Content-Security-Policy)
    for d in "default-src 'none'" "script-src 'self'" "style-src 'self'" "connect-src 'self'" "frame-ancestors 'none'"; do
        case "$csp" in *"$d"*) ;; *) fail "GET $1: CSP lacks \"$d\": $csp" ;; esac
    done
    case "$csp" in *unsafe-inline*|*unsafe-eval*|*"*"*|*http:*|*https:*) fail "GET $1: CSP too loose: $csp" ;; esac
    [ "$(header "$O" X-Content-Type-Options)" = nosniff ] || fail "GET $1: no nosniff"
}

# the page is valid HTML: HTML Tidy reports no error and no warning
command -v tidy >/dev/null || fail "tidy missing (scripts/install-deps.sh installs it)"
tidy -errors -q "$UI/index.html" >"$WORK/tidy.txt" 2>&1 || fail "tidy: $(head -5 "$WORK/tidy.txt")"
ok "index.html: HTML Tidy $(tidy --version | sed 's/.*version //'), no errors or warnings"

start_server --api-key ui-key -q
check_file / index.html "text/html; charset=utf-8"
check_file /ui/app.js app.js "text/javascript; charset=utf-8"
check_file /ui/style.css style.css "text/css; charset=utf-8"
# the page names only files the server has, and no other origin
for src in $(grep -o '\(src\|href\)="[^"]*"' "$UI/index.html" | sed 's/.*="\(.*\)"/\1/'); do
    case "$src" in data:,) continue ;; /ui/*) ;; *) fail "index.html refers to $src" ;; esac
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE$src")" = 200 ] || fail "index.html refers to $src: not served"
done
grep -qE 'https?://' "$UI/index.html" "$UI/app.js" "$UI/style.css" && fail "a playground file names an external URL"
s=$(curl -sS -I -o /dev/null -w '%{http_code}' "$BASE/"); [ "$s" = 200 ] || fail "HEAD /: $s"
s=$(req POST / "$O" -d x); expect_error "$O" 405 "$s" method_not_allowed null
s=$(req GET /ui/nope.js "$O"); expect_error "$O" 404 "$s" not_found null
s=$(req GET /ui/ "$O"); expect_error "$O" 404 "$s" not_found null
s=$(req GET /index.html "$O"); expect_error "$O" 404 "$s" not_found null
s=$(req GET /v1/models "$O"); expect_error "$O" 401 "$s" unauthorized null # the page is public, the API is not
ok "/ and /ui/{app.js,style.css}: the source files, Content-Type, CSP, nosniff, no key needed; HEAD 200, POST 405, unknown 404"
stop_server

start_server --cfg-allow-request-gamma --cfg-max-gamma 3 --max-frames 99 -q
s=$(req GET /v1/models "$O"); [ "$s" = 200 ] || fail "models: $s"
[ "$(jq -c .data[0].drama "$O")" = '{"cfg_allow_request_gamma":true,"cfg_max_gamma":3,"cfg_gamma":0,"max_frames":99,"max_text_length":10000,"sample_rate":44100,"samples_per_frame":2048}' ] \
    || fail "models .drama: $(jq -c .data[0].drama "$O")"
ok "/v1/models .drama reflects --cfg-allow-request-gamma, --cfg-max-gamma, --max-frames"
stop_server

start_server --no-ui -q
for p in / /ui/app.js /ui/style.css; do
    s=$(req GET "$p" "$O"); expect_error "$O" 404 "$s" not_found null
done
s=$(req POST / "$O" -d x); expect_error "$O" 404 "$s" not_found null
s=$(req GET /v1/models "$O"); [ "$s" = 200 ] || fail "--no-ui: models $s"
[ "$(jq .data[0].drama.cfg_allow_request_gamma "$O")" = false ] || fail "models .drama without the flag"
healthy "--no-ui"
ok "--no-ui: /, /ui/* 404 (any method), the API unaffected"
stop_server
echo "serve_ui: all passed"
