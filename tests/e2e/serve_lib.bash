# serve_lib.bash - shared helpers of the tests/e2e/serve_*.sh tests (sourced, not a test itself).
# Starts `drama serve` on 127.0.0.1 with --port 0 (the OS picks the port; the server prints it),
# talks to it with curl only on that address, stops it with SIGTERM (a clean drain must exit 0:
# under ASan a leak makes that fail) and prints the server's log when a test fails.
set -u
: "${DRAMA_BIN:?DRAMA_BIN must point to the drama binary}"
: "${DRAMA_GOLDEN:=$(dirname "$0")/../../../shared/golden}"
: "${DRAMA_SRC:=$(cd "$(dirname "$0")/../.." && pwd)}"

WORK=$(mktemp -d /tmp/drama-e2e-serve.XXXXXX)
export DRAMA_CACHE_DIR="$WORK/cache"
MODEL="$DRAMA_GOLDEN/tiny-drama3"
SERVER_PID=""
BASE=""
SPF=2048      # samples per frame of the tiny model's codec
RATE=44100

LOGS_SHOWN=0
show_logs() {
    [ $LOGS_SHOWN = 0 ] || return 0
    LOGS_SHOWN=1
    for f in "$WORK"/server*.err; do
        [ -f "$f" ] || continue
        echo "---- $f (last 40 lines) ----" >&2
        tail -40 "$f" >&2
    done
}

fail() {
    echo "FAIL: $*" >&2
    show_logs
    exit 1
}
ok() { echo "ok: $*"; }

cleanup() {
    local rc=$?
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    [ $rc -eq 0 ] || [ $rc -eq 77 ] || show_logs
    rm -rf "$WORK"
    exit $rc
}
trap cleanup EXIT

# start_server [flags...]: starts the server, waits (bounded) for the bound address and for
# /health 200. Sets SERVER_PID, PORT, BASE. SERVER_TAG names its log files (default "server").
start_server() {
    local tag=${SERVER_TAG:-server}
    rm -f "$WORK/$tag.out" # before the fork: the child truncates it only when it runs
    "$DRAMA_BIN" serve --model "$MODEL" --port 0 "$@" >"$WORK/$tag.out" 2>"$WORK/$tag.err" &
    SERVER_PID=$!
    local i
    for i in $(seq 1 200); do
        grep -q 'listening on http://' "$WORK/$tag.out" 2>/dev/null && break
        kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited at start: $(tail -3 "$WORK/$tag.err")"
        sleep 0.05
    done
    BASE=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/$tag.out" | head -1)
    [ -n "$BASE" ] || fail "no 'listening on' line from the server"
    PORT=${BASE##*:}
    case "$BASE" in http://127.0.0.1:*) ;; *) fail "server bound to $BASE, expected 127.0.0.1" ;; esac
    for i in $(seq 1 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited while loading: $(tail -3 "$WORK/$tag.err")"
        sleep 0.1
    done
    fail "server not healthy after 60 s"
}

# wait_server_exit: after a SIGTERM already sent, wait (bounded, 60 s), require exit status 0.
wait_server_exit() {
    local i
    for i in $(seq 1 600); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$SERVER_PID" 2>/dev/null && fail "server did not exit within 60 s of SIGTERM"
    local rc=0
    wait "$SERVER_PID" || rc=$?
    SERVER_PID=""
    [ $rc -eq 0 ] || fail "server exited with status $rc after SIGTERM"
}

# stop_server: SIGTERM, then wait_server_exit.
stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID"
    wait_server_exit
}

# req METHOD PATH OUT [curl args...]: one request; prints the status; headers in OUT.h.
req() {
    local method=$1 path=$2 out=$3
    shift 3
    curl -sS --max-time 120 -X "$method" -D "$out.h" -o "$out" -w '%{http_code}' "$@" "$BASE$path"
}

# post_json PATH JSON OUT [curl args...] (the body goes through a file: one argument may not
# exceed 128 KiB, and references are larger)
post_json() {
    local path=$1 out=$3
    printf '%s' "$2" >"$out.body"
    shift 3
    req POST "$path" "$out" -H 'Content-Type: application/json' --data-binary @"$out.body" "$@"
}

# header OUT NAME: a response header's value (case-insensitive name).
header() { tr -d '\r' <"$1.h" | awk -v n="$(echo "$2" | tr 'A-Z' 'a-z')" -F': ' 'tolower($1) == n {print $2}' | tail -1; }

# expect_error OUT STATUS GOT CODE PARAM: the status and the JSON envelope of an error (PARAM
# "null" for none).
expect_error() {
    local out=$1 want=$2 got=$3 code=$4 param=$5
    [ "$got" = "$want" ] || fail "$out: status $got, want $want: $(head -c 300 "$out")"
    local c p t
    c=$(jq -r .error.code "$out") || fail "$out: not a JSON envelope: $(head -c 200 "$out")"
    p=$(jq -r .error.param "$out")
    t=$(jq -r .error.type "$out")
    [ "$c" = "$code" ] || fail "$out: code '$c', want '$code' ($(jq -r .error.message "$out"))"
    [ "$p" = "$param" ] || fail "$out: param '$p', want '$param' ($(jq -r .error.message "$out"))"
    [ -n "$t" ] && [ "$t" != null ] || fail "$out: no error.type"
    [ -n "$(header "$out" X-Request-Id)" ] || fail "$out: no X-Request-Id"
}

# healthy: /health 200 and a small synthesis succeeds (the server survived what came before).
healthy() {
    local s
    s=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")
    [ "$s" = 200 ] || fail "health $s after: $1"
    s=$(post_json /v1/tts '{"text": "ok", "frames": 2, "seed": 1, "format": "pcm"}' "$WORK/healthy.pcm")
    [ "$s" = 200 ] || fail "a good request failed ($s) after: $1: $(head -c 200 "$WORK/healthy.pcm")"
    [ "$(stat -c %s "$WORK/healthy.pcm")" = $((2 * 2 * SPF)) ] || fail "healthy.pcm size after: $1"
}

# install_clients: the Node packages of tests/clients/package-lock.json (npm ci, cache in the build
# tree, skipped when that lockfile is already installed) and the scripts, into $CLIENTS.
CLIENTS="$(dirname "$DRAMA_BIN")/clients"
install_clients() {
    mkdir -p "$CLIENTS"
    cp "$DRAMA_SRC/tests/clients/package.json" "$DRAMA_SRC/tests/clients/package-lock.json" \
        "$DRAMA_SRC/tests/clients/.npmrc" "$DRAMA_SRC/tests/clients/"*.mjs "$CLIENTS/"
    if ! cmp -s "$CLIENTS/package-lock.json" "$CLIENTS/node_modules/.drama-installed-lock" 2>/dev/null; then
        (cd "$CLIENTS" && npm ci --cache "$CLIENTS/npm-cache" --prefer-offline --no-audit --no-fund --loglevel=error) \
            >"$WORK/npm.log" 2>&1 || fail "npm ci: $(tail -5 "$WORK/npm.log")"
        cp "$CLIENTS/package-lock.json" "$CLIENTS/node_modules/.drama-installed-lock"
    fi
}

size() { stat -c %s "$1"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# metric NAME_WITH_LABELS: its value from /metrics (auth via $METRICS_AUTH if set).
metric() {
    curl -s ${METRICS_AUTH:+-H "$METRICS_AUTH"} "$BASE/metrics" | awk -v n="$1" '$1 == n {print $2}' | tail -1
}

# A reference clip for voices: a short 44.1 kHz mono sine made by hand (no external tool).
make_wav() {
    local out=$1 seconds=${2:-1}
    node -e '
const [out, secs] = [process.argv[1], Number(process.argv[2])];
const n = Math.round(44100 * secs), b = Buffer.alloc(44 + 2 * n);
b.write("RIFF", 0); b.writeUInt32LE(36 + 2 * n, 4); b.write("WAVEfmt ", 8); b.writeUInt32LE(16, 16);
b.writeUInt16LE(1, 20); b.writeUInt16LE(1, 22); b.writeUInt32LE(44100, 24); b.writeUInt32LE(88200, 28);
b.writeUInt16LE(2, 32); b.writeUInt16LE(16, 34); b.write("data", 36); b.writeUInt32LE(2 * n, 40);
for (let i = 0; i < n; i++) b.writeInt16LE(Math.round(8000 * Math.sin(2 * Math.PI * 220 * i / 44100) * (1 + 0.3 * Math.sin(i / 3000))), 44 + 2 * i);
require("fs").writeFileSync(out, b);' "$out" "$seconds"
}
