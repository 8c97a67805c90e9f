#!/usr/bin/env bash
# serve_clients.sh - real client libraries against drama serve: the `openai` npm package (7.x)
# audio.speech.create whole and streamed (+ SSE, + an error), and msgpack bodies built with
# @msgpack/msgpack. Packages come from tests/clients/package-lock.json through `npm ci` into the
# build tree (cache there too); exit 77 (skipped) only when npm itself is missing.
set -eu
. "$(dirname "$0")/serve_lib.bash"
command -v npm >/dev/null || { echo "skip: npm missing (scripts/install-deps.sh installs it)"; exit 77; }
install_clients
KEY=client-test-key
start_server --api-key "$KEY" -q
node "$CLIENTS/openai_speech.mjs" "$BASE" "$KEY" "$WORK" >"$WORK/openai.log" 2>&1 || fail "openai client: $(tail -5 "$WORK/openai.log")"
cat "$WORK/openai.log"
for fmt in wav mp3; do
    cmp -s "$WORK/whole.$fmt" "$WORK/stream.$fmt" || fail "openai: streamed $fmt != whole"
done
cmp -s "$WORK/sse.wav" "$WORK/whole.wav" || fail "openai: SSE audio != the audio stream"
[ "$(size "$WORK/whole.wav")" = $((44 + 2 * 20 * SPF)) ] || fail "openai wav size $(size "$WORK/whole.wav")"
mpg123 -q -w /dev/null "$WORK/whole.mp3" || fail "openai mp3 does not decode"
ok "openai $(node -p 'require(process.argv[1]).version' "$CLIENTS/node_modules/openai/package.json"): whole = streamed = SSE"

make_wav "$WORK/clip.wav" 0.5
node "$CLIENTS/msgpack_tts.mjs" "$BASE" "$KEY" "$WORK/clip.wav" "$WORK" >"$WORK/mp.log" 2>&1 || fail "msgpack client: $(tail -5 "$WORK/mp.log")"
cat "$WORK/mp.log"
cmp -s "$WORK/bin.wav" "$WORK/b64.wav" || fail "msgpack: bin audio and base64 audio give different results"
[ "$(size "$WORK/bin.wav")" = $((44 + 2 * 16 * SPF)) ] || fail "msgpack wav size"
s=$(curl -s -o "$WORK/v.json" -w '%{http_code}' -H "X-Api-Key: $KEY" "$BASE/v1/voices/mp-voice")
[ "$s" = 200 ] || fail "the msgpack-uploaded voice: $s"
ok "@msgpack/msgpack: bin = base64 reference; msgpack voice upload"
stop_server
echo "serve_clients: all passed"
