#!/usr/bin/env bash
# serve_load.sh - a bounded load test with wrk (serve_load.lua): two phases (4 then 16
# connections, 4 s each) of mixed requests against --parallel 2; zero 5xx, no socket errors or
# timeouts, a few hundred requests in all, the expected 400s for the one bad body in the mix,
# then an idle server that drains and exits 0 (under the ASan build: no leak either).
set -eu
. "$(dirname "$0")/serve_lib.bash"
command -v wrk >/dev/null || { echo "skip: wrk missing (scripts/install-deps.sh)"; exit 77; }
start_server --parallel 2 --queue 64 -q
total=0
for c in 4 16; do
    export LOAD_REPORT="$WORK/load.$c"
    wrk -t2 -c$c -d4s --timeout 30s -s "$DRAMA_SRC/tests/e2e/serve_load.lua" "$BASE" >"$WORK/wrk.$c.txt" 2>&1 || fail "wrk: $(tail -5 "$WORK/wrk.$c.txt")"
    r=$(cat "$LOAD_REPORT")
    echo "c=$c: $r"
    get() { echo "$r" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    [ "$(get server_errors)" = 0 ] || fail "5xx under load (c=$c): $r"
    [ "$(get other)" = 0 ] && [ "$(get connect)" = 0 ] && [ "$(get read)" = 0 ] && [ "$(get write)" = 0 ] && \
        [ "$(get timeout)" = 0 ] || fail "socket errors or odd statuses (c=$c): $r"
    n=$(get requests)
    bad=$(get client_errors)
    [ "$bad" -ge $((n / 7 - 2)) ] && [ "$bad" -le $((n / 7 + 2)) ] || fail "400s $bad of $n: only the bad body (1 in 7) should fail"
    total=$((total + n))
done
[ $total -ge 200 ] || fail "only $total requests in 8 s"
for i in $(seq 1 100); do [ "$(metric drama_lanes_active)" = 0 ] && break; sleep 0.05; done
[ "$(metric drama_lanes_active)" = 0 ] && [ "$(metric drama_queue_depth)" = 0 ] || fail "not idle after the load"
healthy "the load"
ok "$total requests at 4 and 16 connections: zero 5xx, no socket errors, idle after"
stop_server
echo "serve_load: all passed"
