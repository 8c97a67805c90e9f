#!/usr/bin/env bash
# serve_voices.sh - the voice catalog (API.md 5): JSON and multipart uploads (msgpack uploads run
# in serve_clients.sh with a real msgpack library), 201 body, 409, list sorted, get, delete (204,
# then 404), ids checked after percent-decoding, persistence across a restart, a stored voice
# gives the same audio as the same clip inline, a voice deleted mid-request does not disturb it.
set -eu
. "$(dirname "$0")/serve_lib.bash"
VOICES="$WORK/voices"
start_server --voices-dir "$VOICES" --prompt-cache-mib 64 -q
O="$WORK/out"
make_wav "$WORK/clip.wav" 0.6
b64=$(base64 -w0 "$WORK/clip.wav")
sum=$(sha "$WORK/clip.wav")

s=$(post_json /v1/voices "{\"id\": \"zed\", \"text\": \"A short clip.\", \"audio\": \"$b64\"}" "$O")
[ "$s" = 201 ] || fail "create zed: $s $(cat "$O")"
[ "$(jq -r .id "$O")" = zed ] && [ "$(jq -r .sha256 "$O")" = "$sum" ] || fail "201 body: $(cat "$O")"
frames=$(jq -r .frames "$O")
[ "$frames" -gt 0 ] || fail "frames $frames"
awk -v d="$(jq -r .duration_s "$O")" 'BEGIN {exit !(d > 0.55 && d < 0.65)}' || fail "duration_s $(jq -r .duration_s "$O")"
ok "POST /v1/voices (JSON): 201, sha256, $frames frames"
s=$(req POST /v1/voices "$O" -F id=alice -F "text=Multipart clip." -F "audio=@$WORK/clip.wav;type=audio/wav")
[ "$s" = 201 ] && [ "$(jq -r .id "$O")" = alice ] && [ "$(jq -r .sha256 "$O")" = "$sum" ] || fail "multipart: $s $(cat "$O")"
ok "POST /v1/voices (multipart): 201"
s=$(req POST /v1/voices "$O" -F id=alice -F "text=again" -F "audio=@$WORK/clip.wav")
expect_error "$O" 409 "$s" voice_exists id
s=$(req POST /v1/voices "$O" -F id=bad -F "text=x" -F "audio=@$WORK/clip.wav" -F "audio=@$WORK/clip.wav")
expect_error "$O" 400 "$s" invalid_multipart null
s=$(req POST /v1/voices "$O" -F "id=../../tmp/x" -F "text=x" -F "audio=@$WORK/clip.wav")
expect_error "$O" 400 "$s" invalid_voice_id id
s=$(req POST /v1/voices "$O" -F id=nofile -F "text=x" -F "audio=@$DRAMA_GOLDEN/tiny-drama3/config.json")
expect_error "$O" 400 "$s" bad_audio audio
s=$(post_json /v1/voices "{\"id\": \"empty\", \"text\": \"  \", \"audio\": \"$b64\"}" "$O")
expect_error "$O" 400 "$s" empty_text text
ok "409 voice_exists, duplicate field, bad id, bad audio, empty transcript"
[ ! -e "$WORK/tmp/x" ] && [ -z "$(find "$VOICES" -maxdepth 1 -name '.tmp-*')" ] || fail "stray files after refused uploads"

s=$(req GET /v1/voices "$O"); [ "$s" = 200 ] || fail "list: $s"
[ "$(jq -r '[.voices[].id] | join(",")' "$O")" = alice,zed ] || fail "list not sorted: $(cat "$O")"
[ "$(jq -r '.voices[0] | has("id") and has("text") and has("frames") and has("duration_s") and has("created")' "$O")" = true ] || fail "list entry fields"
s=$(req GET /v1/voices/zed "$O"); [ "$s" = 200 ] && [ "$(jq -r .text "$O")" = "A short clip." ] || fail "get zed: $s"
s=$(req GET /v1/voices/Zed "$O"); expect_error "$O" 404 "$s" not_found id
ok "GET list (sorted), GET one, ids case-sensitive"

# a stored voice = the same clip inline (same codes, same prompt, same seed)
R='"frames": 12, "seed": 5, "format": "pcm"'
s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", \"reference_id\": \"zed\", $R}" "$WORK/by_id.pcm"); [ "$s" = 200 ] || fail "by id: $s $(cat "$WORK/by_id.pcm" | head -c 200)"
s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", \"references\": [{\"audio\": \"$b64\", \"text\": \"A short clip.\"}], $R}" "$WORK/inline.pcm"); [ "$s" = 200 ] || fail "inline: $s"
cmp -s "$WORK/by_id.pcm" "$WORK/inline.pcm" || fail "reference_id audio != inline reference audio"
s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", $R}" "$WORK/noref.pcm")
cmp -s "$WORK/by_id.pcm" "$WORK/noref.pcm" && fail "the voice had no effect"
s=$(post_json /v1/audio/speech "{\"input\": \"Hello voice.\", \"voice\": \"zed\", \"response_format\": \"pcm\", \"frames\": 12, \"seed\": 5}" "$WORK/oa.pcm"); [ "$s" = 200 ] || fail "openai voice: $s"
s=$(post_json /v1/tts "{\"text\": \"Two voices.\", \"reference_id\": [\"zed\", \"alice\"], $R}" "$WORK/two.pcm"); [ "$s" = 200 ] || fail "two ids: $s"
s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", \"reference_id\": \"zed\", $R}" "$WORK/again.pcm")
cmp -s "$WORK/by_id.pcm" "$WORK/again.pcm" || fail "A -> B -> A: the voice's audio changed after another voice"
[ "$(metric drama_voice_cache_hits_total)" -ge 1 ] || fail "no prompt cache hit for a repeated voice"
[ "$(metric 'drama_time_to_first_audio_seconds_count{voice_cached="true"}')" -ge 1 ] || fail "ttfa{voice_cached=true} not counted"
ok "reference_id = inline reference; voice on /v1/audio/speech; two ids; A -> B -> A identical (prompt cache hit)"

# delete while a request uses the voice: that request completes with the audio of a solo run
post_json /v1/tts "{\"text\": \"Long with zed.\", \"reference_id\": \"zed\", \"frames\": 200, \"seed\": 9, \"format\": \"pcm\"}" "$WORK/during.pcm" >"$WORK/during.status" &
P=$!
sleep 0.3
s=$(req DELETE /v1/voices/zed "$O"); [ "$s" = 204 ] || fail "delete: $s"
wait $P
[ "$(cat "$WORK/during.status")" = 200 ] || fail "the request using a deleted voice failed"
s=$(req GET /v1/voices/zed "$O"); expect_error "$O" 404 "$s" not_found id
s=$(req DELETE /v1/voices/zed "$O"); expect_error "$O" 404 "$s" not_found id
s=$(post_json /v1/tts '{"text": "x", "reference_id": "zed", "frames": 2}' "$O"); expect_error "$O" 400 "$s" unknown_voice reference_id
[ ! -e "$VOICES/zed" ] || fail "voice directory still on disk"
ok "DELETE 204 while in use (request unaffected), then 404 / unknown_voice; removed from disk"

s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", \"reference_id\": \"alice\", $R}" "$WORK/alice_first.pcm"); [ "$s" = 200 ] || fail "alice"
# persistence: alice survives a restart, a recreated zed with other audio gives other audio
stop_server
SERVER_TAG=server2 start_server --voices-dir "$VOICES" -q
s=$(req GET /v1/voices "$O"); [ "$(jq -r '[.voices[].id] | join(",")' "$O")" = alice ] || fail "after restart: $(cat "$O")"
s=$(post_json /v1/tts "{\"text\": \"Two voices.\", \"reference_id\": [\"zed\", \"alice\"], $R}" "$WORK/two_fresh.pcm")
[ "$s" = 400 ] || fail "zed was deleted: $s"
s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", \"reference_id\": \"alice\", $R}" "$WORK/alice.pcm"); [ "$s" = 200 ] || fail "alice after restart"
cmp -s "$WORK/alice.pcm" "$WORK/alice_first.pcm" || fail "alice on a fresh server differs from alice after other voices"
make_wav "$WORK/other.wav" 0.4
s=$(post_json /v1/voices "{\"id\": \"zed\", \"text\": \"A short clip.\", \"audio\": \"$(base64 -w0 "$WORK/other.wav")\"}" "$O"); [ "$s" = 201 ] || fail "recreate zed: $s"
s=$(post_json /v1/tts "{\"text\": \"Hello voice.\", \"reference_id\": \"zed\", $R}" "$WORK/by_id2.pcm")
cmp -s "$WORK/by_id.pcm" "$WORK/by_id2.pcm" && fail "a recreated voice with other audio gave the old audio"
ok "voices persist across a restart (same audio as on the first server after other voices); a recreated id uses its new audio"
stop_server
echo "serve_voices: all passed"
