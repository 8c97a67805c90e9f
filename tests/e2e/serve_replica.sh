#!/usr/bin/env bash
# serve_replica.sh - what a load balancer sees of one replica (issue 16): while the model loads
# (made observable by the --test-load-delay hook; --test-step-delay keeps the drained request running) /health is 503 "loading" with Retry-After and
# synthesis answers 503 loading + Retry-After, while the liveness check /health/live is 200 from
# the start to the end of the drain; X-Served-By carries --replica-id (default HOSTNAME:PORT) on
# every response (health, errors, whole and streamed audio); drama_replica_info has the replica
# id, backend and device as labels; a bad --replica-id is refused; during the SIGTERM drain
# /health and new requests are 503 draining with Retry-After while the running request ends whole.
set -eu
. "$(dirname "$0")/serve_lib.bash"
O="$WORK/out"

set +e
"$DRAMA_BIN" serve --model "$MODEL" --port 0 --replica-id 'bad id' >"$O" 2>&1
rc=$?
set -e
[ $rc = 2 ] && grep -q -- "--replica-id" "$O" || fail "--replica-id 'bad id': exit $rc: $(cat "$O")"
"$DRAMA_BIN" serve --help | grep -q -- --replica-id || fail "serve --help lacks --replica-id"
ok "--replica-id validated and documented"

# loading: the listener answers before the model is loaded
rm -f "$WORK/server.out"
"$DRAMA_BIN" serve --model "$MODEL" --port 0 --replica-id gpu-a.0 --test-load-delay 4 --test-step-delay 0.005 -q >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
for i in $(seq 1 200); do grep -q 'listening on' "$WORK/server.out" 2>/dev/null && break; sleep 0.05; done
BASE=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/server.out" | head -1)
[ -n "$BASE" ] || fail "no 'listening on' line"
s=$(req GET /health "$O")
[ "$s" = 503 ] && [ "$(jq -r .status "$O")" = loading ] || fail "health while loading: $s $(cat "$O")"
ra=$(header "$O" Retry-After); [ -n "$ra" ] && [ "$ra" -ge 1 ] || fail "loading health without Retry-After"
[ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "X-Served-By while loading: '$(header "$O" X-Served-By)'"
s=$(req GET /health/live "$O"); [ "$s" = 200 ] && [ "$(jq -r .status "$O")" = alive ] || fail "liveness while loading: $s"
s=$(post_json /v1/tts '{"text": "too early", "frames": 2}' "$O"); expect_error "$O" 503 "$s" loading null
[ -n "$(header "$O" Retry-After)" ] || fail "503 loading synthesis without Retry-After"
s=$(post_json /v1/audio/speech '{"input": "too early", "voice": "default"}' "$O"); expect_error "$O" 503 "$s" loading null
[ -n "$(header "$O" Retry-After)" ] || fail "503 loading speech without Retry-After"
still=$(req GET /health "$O")
[ "$still" = 503 ] || fail "the load delay passed before the checks ran (health $still): the test proves nothing"
ok "loading: /health 503 loading + Retry-After $ra, /health/live 200, synthesis 503 loading + Retry-After"
for i in $(seq 1 300); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && break; sleep 0.1; done
s=$(req GET /health "$O"); [ "$s" = 200 ] || fail "not ready after the delay: $s"
ok "ready after the load"

# X-Served-By on every kind of response
s=$(post_json /v1/tts '{"text": "whole", "frames": 3, "seed": 2}' "$O"); [ "$s" = 200 ] || fail "tts: $s"
[ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "no X-Served-By on a whole response"
s=$(post_json /v1/tts '{"text": "streamed", "frames": 3, "seed": 2, "streaming": true}' "$O"); [ "$s" = 200 ] || fail "stream: $s"
[ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "no X-Served-By on a streamed response"
s=$(post_json /v1/audio/speech '{"input": "sse", "voice": "default", "stream_format": "sse", "frames": 3}' "$O" --max-time 60)
[ "$s" = 200 ] && [ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "no X-Served-By on SSE ($s)"
s=$(req GET /nope "$O"); [ "$s" = 404 ] && [ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "no X-Served-By on a 404"
s=$(post_json /v1/tts '{"text": ""}' "$O"); [ "$s" = 400 ] && [ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "no X-Served-By on a 400"
s=$(req GET /metrics "$O"); [ "$(header "$O" X-Served-By)" = gpu-a.0 ] || fail "no X-Served-By on /metrics"
grep -q '^drama_replica_info{replica_id="gpu-a.0",backend="[a-z]*",device="0"} 1$' "$O" ||
    fail "drama_replica_info: $(grep replica_info "$O")"
ok "X-Served-By on whole, streamed, SSE, 404, 400, metrics; drama_replica_info{replica_id,backend,device}"

# the drain as a balancer sees it
post_json /v1/tts '{"text": "finish me", "frames": 200, "seed": 4, "format": "pcm"}' "$WORK/drain.pcm" >"$WORK/drain.status" &
P=$!
for i in $(seq 1 100); do [ "$(metric drama_lanes_active)" = 1 ] && break; sleep 0.05; done
[ "$(metric drama_lanes_active)" = 1 ] || fail "the long request never started"
kill -TERM "$SERVER_PID"
sleep 0.2
s=$(req GET /health "$O"); [ "$s" = 503 ] && [ "$(jq -r .status "$O")" = draining ] || fail "health while draining: $s"
[ -n "$(header "$O" Retry-After)" ] || fail "draining health without Retry-After"
s=$(req GET /health/live "$O"); [ "$s" = 200 ] || fail "liveness while draining: $s"
s=$(post_json /v1/tts '{"text": "late", "frames": 2}' "$O"); expect_error "$O" 503 "$s" draining null
[ -n "$(header "$O" Retry-After)" ] || fail "503 draining without Retry-After"
wait $P
[ "$(cat "$WORK/drain.status")" = 200 ] && [ "$(size "$WORK/drain.pcm")" = $((200 * 2 * SPF)) ] || fail "the running request was cut"
wait_server_exit
ok "drain: health 503 draining + Retry-After, liveness 200, new requests 503 + Retry-After, running one whole, exit 0"

# the default replica id is HOSTNAME:PORT
SERVER_TAG=server-default start_server -q
s=$(req GET /health/live "$O")
[ "$(header "$O" X-Served-By)" = "$(hostname | tr -c 'A-Za-z0-9._:\n-' _):$PORT" ] || fail "default X-Served-By '$(header "$O" X-Served-By)'"
ok "default replica id $(header "$O" X-Served-By)"
stop_server
echo "serve_replica: all passed"
