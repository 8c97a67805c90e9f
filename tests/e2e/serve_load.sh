#!/usr/bin/env bash
# serve_load.sh - a bounded load test with wrk (serve_load.lua): runs of 3 s alternating 4 and
# 16 connections of mixed requests against --parallel 2, until 320 requests are done (at most 50
# runs); zero 5xx, no socket errors or timeouts, the expected 400s for the one bad body in the
# mix, then an idle server that drains and exits 0 (under the ASan build: no leak either).
set -eu
. "$(dirname "$0")/serve_lib.bash"
command -v wrk >/dev/null || { echo "skip: wrk missing (scripts/install-deps.sh)"; exit 77; }
start_server --parallel 2 --queue 64 -q
total=0
runs=0
get() { echo "$r" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
while [ $total -lt 320 ] && [ $runs -lt 50 ]; do
    c=$([ $((runs % 2)) = 0 ] && echo 4 || echo 16)
    export LOAD_REPORT="$WORK/load.$runs"
    wrk -t2 -c$c -d3s --timeout 60s -s "$DRAMA_SRC/tests/e2e/serve_load.lua" "$BASE" >"$WORK/wrk.$runs.txt" 2>&1 ||
        fail "wrk: $(tail -5 "$WORK/wrk.$runs.txt")"
    r=$(cat "$LOAD_REPORT")
    [ "$(get server_errors)" = 0 ] || fail "5xx under load (c=$c): $r"
    [ "$(get other)" = 0 ] && [ "$(get connect)" = 0 ] && [ "$(get read)" = 0 ] && [ "$(get write)" = 0 ] &&
        [ "$(get timeout)" = 0 ] || fail "socket errors or odd statuses (c=$c): $r"
    [ "$(get odd_4xx)" = 0 ] || fail "4xx other than the bad body's (c=$c): $r"
    n=$(get requests)
    bad=$(get client_errors)
    # one body in 7 is bad; the requests in flight when wrk stops (at most c) blur the ratio
    [ "$bad" -ge $((n / 7 - c)) ] && [ "$bad" -le $((n / 7 + c)) ] || fail "400s $bad of $n: only the bad body (1 in 7) should fail"
    total=$((total + n))
    runs=$((runs + 1))
done
echo "$runs runs of wrk (c=4 and c=16 alternating): $total requests"
[ $total -ge 320 ] || fail "only $total requests in $runs runs"
for i in $(seq 1 100); do [ "$(metric drama_lanes_active)" = 0 ] && break; sleep 0.05; done
[ "$(metric drama_lanes_active)" = 0 ] && [ "$(metric drama_queue_depth)" = 0 ] || fail "not idle after the load"
healthy "the load"
ok "$total requests at 4 and 16 connections: zero 5xx, no socket errors, idle after"
stop_server
echo "serve_load: all passed"
