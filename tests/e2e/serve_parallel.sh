#!/usr/bin/env bash
# serve_parallel.sh - continuous batching over HTTP (API.md 8): N = 3 x --parallel concurrent
# requests of different lengths, voices and formats, each byte-equal to its solo run on an idle
# server; a full queue answers 429 with Retry-After at once; a client that hangs up mid-stream
# is cancelled, the next identical request gives identical audio and /metrics returns to idle.
set -eu
. "$(dirname "$0")/serve_lib.bash"
start_server --parallel 2 --queue 16 -q
make_wav "$WORK/clip.wav" 0.5
b64=$(base64 -w0 "$WORK/clip.wav")
s=$(post_json /v1/voices "{\"id\": \"v1\", \"text\": \"Reference words.\", \"audio\": \"$b64\"}" "$WORK/v.json")
[ "$s" = 201 ] || fail "voice: $s"

body() { # K: request K's body
    local k=$1 f=$((6 + 7 * $1)) fmt ref=""
    case $((k % 3)) in 0) fmt=pcm ;; 1) fmt=wav ;; 2) fmt=mp3 ;; esac
    [ $((k % 2)) = 1 ] && ref=', "reference_id": "v1"'
    echo "{\"text\": \"Request number $k. Some words.\", \"frames\": $f, \"seed\": $((100 + k)), \"format\": \"$fmt\", \"streaming\": $([ $((k % 4)) = 0 ] && echo true || echo false)$ref}"
}
N=6
for k in $(seq 0 $((N - 1))); do
    s=$(post_json /v1/tts "$(body $k)" "$WORK/solo.$k"); [ "$s" = 200 ] || fail "solo $k: $s $(head -c 200 "$WORK/solo.$k")"
done
ok "$N solo runs"
pids=()
for k in $(seq 0 $((N - 1))); do
    post_json /v1/tts "$(body $k)" "$WORK/par.$k" >"$WORK/par.$k.status" &
    pids+=($!)
done
wait "${pids[@]}" # not a bare wait: the server is a background job too
for k in $(seq 0 $((N - 1))); do
    [ "$(cat "$WORK/par.$k.status")" = 200 ] || fail "parallel $k: $(cat "$WORK/par.$k.status")"
    cmp -s "$WORK/solo.$k" "$WORK/par.$k" || fail "parallel request $k differs from its solo run"
done
ok "$N concurrent requests on 2 lanes, each byte-equal to its solo run"
[ "$(metric drama_lanes_total)" = 2 ] || fail "lanes_total"
stop_server

# queue full: 1 lane, no queue: while one runs, the next is refused at once with 429
SERVER_TAG=server-q start_server --parallel 1 --queue 0 -q
curl -s -o "$WORK/long.pcm" -H 'Content-Type: application/json' \
    --data-binary '{"text": "occupies the lane", "frames": 400, "seed": 1, "format": "pcm"}' "$BASE/v1/tts" &
LONG=$!
for i in $(seq 1 100); do [ "$(metric drama_lanes_active)" = 1 ] && break; sleep 0.05; done
s=$(post_json /v1/tts '{"text": "refused", "frames": 2, "seed": 1}' "$WORK/q.out")
expect_error "$WORK/q.out" 429 "$s" queue_full null
ra=$(header "$WORK/q.out" Retry-After)
[ -n "$ra" ] && [ "$ra" -ge 1 ] || fail "429 without Retry-After"
wait $LONG
[ "$(size "$WORK/long.pcm")" = $((400 * 2 * SPF)) ] || fail "the running request was affected"
[ "$(metric 'drama_admission_rejected_total{reason="queue_full"}')" = 1 ] || fail "rejected metric"
ok "429 queue_full with Retry-After $ra; the running request unaffected"

# disconnect mid-stream, then the identical request: identical audio; metrics back to idle
D='{"text": "Hang up on me.", "frames": 500, "seed": 77, "format": "pcm", "streaming": true}'
curl -s -N --max-time 120 -H 'Content-Type: application/json' --data-binary "$D" "$BASE/v1/tts" -o "$WORK/cut.pcm" &
CUT=$!
for i in $(seq 1 600); do [ "$(size "$WORK/cut.pcm" 2>/dev/null || echo 0)" -gt 0 ] && break; sleep 0.05; done
kill $CUT 2>/dev/null # hang up once audio flows
wait $CUT 2>/dev/null || true
[ "$(size "$WORK/cut.pcm")" -gt 0 ] && [ "$(size "$WORK/cut.pcm")" -lt $((500 * 2 * SPF)) ] || fail "the cut stream got $(size "$WORK/cut.pcm") bytes"
for i in $(seq 1 100); do [ "$(metric drama_lanes_active)" = 0 ] && break; sleep 0.05; done
[ "$(metric drama_lanes_active)" = 0 ] || fail "lane still active after the client hung up"
[ "$(metric 'drama_cancelled_total{reason="client_gone"}')" = 1 ] || fail "cancelled{client_gone} = $(metric 'drama_cancelled_total{reason="client_gone"}')"
s=$(post_json /v1/tts "$D" "$WORK/full.pcm"); [ "$s" = 200 ] || fail "after the hang-up: $s"
[ "$(size "$WORK/full.pcm")" = $((500 * 2 * SPF)) ] || fail "full size"
cmp -s "$WORK/cut.pcm" <(head -c "$(size "$WORK/cut.pcm")" "$WORK/full.pcm") || fail "the cut stream is not a prefix of the full one"
s=$(post_json /v1/tts "${D/\"streaming\": true/\"streaming\": false}" "$WORK/full2.pcm")
cmp -s "$WORK/full.pcm" "$WORK/full2.pcm" || fail "the identical request after a hang-up differs"
[ "$(metric drama_lanes_active)" = 0 ] && [ "$(metric drama_queue_depth)" = 0 ] || fail "not idle at the end"
ok "hang-up mid-stream cancelled (client_gone), identical audio after, lanes and queue idle"
stop_server
echo "serve_parallel: all passed"
