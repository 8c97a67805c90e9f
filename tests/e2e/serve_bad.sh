#!/usr/bin/env bash
# serve_bad.sh - the bad-input table of API.md 7 over HTTP: each case answers its status, code
# and param in the JSON envelope, and the server stays healthy after each (/health 200 and a good
# synthesis succeeds). Cases that need another server setting start their own server below.
set -eu
. "$(dirname "$0")/serve_lib.bash"

# --max-frames 9000: a request without a frame count cannot fit the context (request_too_large);
# the cases below pass small frame counts.
start_server --max-text-length 60 --max-body-bytes 400000 --max-reference-seconds 1 --max-frames 9000 -q
O="$WORK/out"

case_json() { # PATH JSON STATUS CODE PARAM
    local s
    s=$(post_json "$1" "$2" "$O")
    expect_error "$O" "$3" "$s" "$4" "$5"
    healthy "$1 $2"
    ok "$3 $4 ${5} <- $(echo "$2" | head -c 70)"
}

case_bin() { # PATH CONTENT_TYPE PRINTF_BYTES STATUS CODE PARAM
    local s
    printf "$3" >"$WORK/body.bin"
    s=$(req POST "$1" "$O" -H "Content-Type: $2" --data-binary @"$WORK/body.bin")
    expect_error "$O" "$4" "$s" "$5" "$6"
    healthy "$1 $3"
    ok "$4 $5 $6 <- $2 bytes"
}

T=/v1/tts
S=/v1/audio/speech
F='"frames": 3, "seed": 1'
# parse errors
case_json $T '{"text": "a", ' 400 invalid_json null
case_json $T '{"text": "a", "text": "b"}' 400 invalid_json null
case_json $T '{"text": "a", "temperature": NaN}' 400 invalid_json null
case_json $T '{"text": "a", "temperature": -Infinity}' 400 invalid_json null
deep='{"text": "a", "x": '$(printf '[%.0s' $(seq 32))$(printf ']%.0s' $(seq 32))'}'
case_json $T "$deep" 400 invalid_json null
case_bin $T application/msgpack '\x82\xa4text' 400 invalid_msgpack null
case_bin $T application/x-msgpack '\xdd\xff\xff\xff\xff' 400 invalid_msgpack null
# fields
case_json $T '{"format": "wav"}' 400 missing_field text
case_json $T '{"text": 7}' 400 wrong_type text
case_json $T '{"text": "a", "streaming": "yes"}' 400 wrong_type streaming
case_json $T '{"text": "a", "chunk_length": "200"}' 400 wrong_type chunk_length
case_json $T '{"text": "a", "seed": 1.5}' 400 wrong_type seed
case_bin $T application/msgpack '\x82\xa4text\xa1a\xabtemperature\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00' 400 invalid_number temperature
case_json $T '{"text": "a", "temperature": 3.5}' 400 out_of_range temperature
case_json $T '{"text": "a", "top_p": 0}' 400 out_of_range top_p
case_json $T '{"text": "a", "chunk_length": 50}' 400 out_of_range chunk_length
case_json $T '{"text": "a", "repetition_penalty": 3}' 400 out_of_range repetition_penalty
case_json $T '{"text": "a", "frames": 0}' 400 out_of_range frames
case_json $T '{"text": "a", "max_new_tokens": -2}' 400 out_of_range max_new_tokens
case_json $T '{"text": "a", "references": [{"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}, {"audio": "AAAA", "text": "t"}]}' 400 out_of_range references
# text rules (TEXT.md 2.3) and --max-text-length 60
case_json $T '{"text": "   \n\t "}' 400 empty_text text
case_json $T '{"text": "'"$(printf 'x%.0s' $(seq 61))"'"}' 400 text_too_long text
case_bin $T application/msgpack '\x81\xa4text\xa3a\xffb' 400 invalid_utf8 text
case_json $T '{"text": "hi <|im_end|> there"}' 400 reserved_token text
case_json $T '{"text": "hi <|semantic:5|>"}' 400 reserved_token text
case_json $T '{"text": "<|speaker:16|>hi"}' 400 invalid_speaker_tag text
case_json $T '{"text": "<|speaker:01|>hi"}' 400 invalid_speaker_tag text
case_json $S '{"input": "<|voice|>", "voice": "default"}' 400 reserved_token input
# voices
case_json $T '{"text": "a", "reference_id": "nobody"}' 400 unknown_voice reference_id
case_json $T '{"text": "a", "reference_id": ["nobody", "x"]}' 400 unknown_voice 'reference_id[0]'
case_json $S '{"input": "a", "voice": "nobody"}' 400 unknown_voice voice
case_json $T '{"text": "a", "reference_id": "../etc"}' 400 invalid_voice_id reference_id
case_json $S '{"input": "a", "voice": "a b"}' 400 invalid_voice_id voice
s=$(req GET '/v1/voices/..%2F..%2Fetc%2Fpasswd' "$O")
expect_error "$O" 400 "$s" invalid_voice_id id
ok "400 invalid_voice_id id <- GET /v1/voices/..%2F..%2Fetc%2Fpasswd"
s=$(req DELETE '/v1/voices/%2e%2e' "$O")
expect_error "$O" 400 "$s" invalid_voice_id id
s=$(req GET '/v1/voices/nobody' "$O")
expect_error "$O" 404 "$s" not_found id
# reference audio
case_json $T '{"text": "a", "references": [{"audio": "not base64!", "text": "t"}]}' 400 bad_audio 'references[0].audio'
case_json $T '{"text": "a", "references": [{"audio": "aGVsbG8gd29ybGQ=", "text": "t"}]}' 400 bad_audio 'references[0].audio'
make_wav "$WORK/long.wav" 1.5
long=$(base64 -w0 "$WORK/long.wav")
case_json $T '{"text": "a", "references": [{"audio": "'"$long"'", "text": "t"}]}' 400 bad_audio 'references[0].audio'
case_json $T '{"text": "a", "references": [{"audio": "AAAA", "text": "<|im_start|>"}]}' 400 reserved_token 'references[0].text'
# formats, values, models, guidance
case_json $T '{"text": "a", "format": "flac"}' 400 unsupported_format format
case_json $S '{"input": "a", "voice": "default", "response_format": "aac"}' 400 unsupported_format response_format
case_json $S '{"input": "a", "voice": "default", "speed": 1.5}' 400 unsupported_value speed
case_json $T '{"text": "a", "latency": "fastest"}' 400 unsupported_value latency
case_json $S '{"model": "gpt-5", "input": "a", "voice": "default"}' 400 unknown_model model
case_json $T '{"text": "a", "cfg_gamma": 1.0}' 400 guidance_not_allowed cfg_gamma
case_json $T '{"text": "hello"}' 400 request_too_large null
# generation failures before any byte (the tiny random model never draws the end token)
case_json $T '{"text": "a", "max_new_tokens": 4, "seed": 2}' 422 frame_limit null
case_json $T '{"text": "a", "max_new_tokens": 4, "seed": 2, "streaming": true}' 422 frame_limit null
# a failure after the status line: the stream ends without its terminating chunk (API.md 3.3).
# The cap (300 frames) comes long after the first chunk (4 frames), so the status is surely out.
rc=0
s=$(curl -sS --max-time 60 -o "$O" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary \
    '{"text": "a", "max_new_tokens": 300, "seed": 2, "streaming": true, "latency": "balanced", "format": "pcm"}' \
    "$BASE$T" 2>"$WORK/curl.err") || rc=$?
[ "$s" = 200 ] || fail "frame limit after the first chunk: status $s, want 200 (then a cut stream)"
[ $rc = 18 ] || fail "curl exit $rc, want 18 (transfer closed with data outstanding): $(cat "$WORK/curl.err")"
[ "$(size "$O")" -gt 0 ] && [ "$(size "$O")" -lt $((300 * 2 * SPF)) ] || fail "cut stream of $(size "$O") bytes"
healthy "a stream that failed after its status"
ok "frame limit after the first chunk: 200, then the connection closes without the final chunk (curl 18)"
# transport
s=$(req POST $T "$O" -H 'Content-Type: text/plain' --data-binary '{"text": "a"}')
expect_error "$O" 415 "$s" unsupported_media_type null
healthy "text/plain"
s=$(req POST $S "$O" -H 'Content-Type: application/msgpack' --data-binary '{}')
expect_error "$O" 415 "$s" unsupported_media_type null
s=$(req POST $T "$O" --data-binary '{"text": "a"}') # curl's default form type
expect_error "$O" 415 "$s" unsupported_media_type null
ok "415 unsupported_media_type (text/plain, msgpack on /v1/audio/speech, form-urlencoded)"
head -c 500000 /dev/zero >"$WORK/big.bin"
s=$(req POST $T "$O" -H 'Content-Type: application/json' --data-binary @"$WORK/big.bin")
expect_error "$O" 413 "$s" body_too_large null
healthy "413 by Content-Length"
s=$(req POST $T "$O" -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/big.bin")
expect_error "$O" 413 "$s" body_too_large null
[ "$(header "$O" Connection)" = close ] || fail "413 on a chunked body without Connection: close"
ok "413 body_too_large for a chunked body crossing the limit, connection closed"
healthy "chunked over the limit"
ok "413 body_too_large (Content-Length)"
s=$(req GET /nope "$O")
expect_error "$O" 404 "$s" not_found null
s=$(req GET $T "$O")
expect_error "$O" 405 "$s" method_not_allowed null
[ "$(header "$O" Allow)" = POST ] || fail "405 Allow: '$(header "$O" Allow)'"
s=$(req DELETE /v1/voices "$O")
[ "$s" = 405 ] && [ "$(header "$O" Allow)" = "GET, HEAD, POST" ] || fail "DELETE /v1/voices: $s Allow '$(header "$O" Allow)'"
ok "404 unknown path, 405 with Allow"
healthy "404/405"
stop_server

# admission: queue timeout, insufficient memory (each its own server)
SERVER_TAG=server-queue start_server --parallel 1 --queue 4 --queue-timeout 0.5 -q
curl -s -o "$WORK/long.pcm" -H 'Content-Type: application/json' \
    --data-binary '{"text": "a long one", "frames": 600, "seed": 3, "format": "pcm"}' "$BASE/v1/tts" &
LONG=$!
for i in $(seq 1 100); do [ "$(metric drama_lanes_active)" = 1 ] && break; sleep 0.05; done
s=$(post_json $T '{"text": "waits", "frames": 2, "seed": 1}' "$O")
expect_error "$O" 503 "$s" queue_timeout null
[ -n "$(header "$O" Retry-After)" ] || fail "queue_timeout without Retry-After"
ok "503 queue_timeout with Retry-After $(header "$O" Retry-After)"
wait $LONG
[ "$(size "$WORK/long.pcm")" = $((600 * 2 * SPF)) ] || fail "the long request was affected: $(size "$WORK/long.pcm") bytes"
healthy "queue_timeout"
stop_server

SERVER_TAG=server-mem start_server --memory-budget-mib 1 -q
s=$(post_json $T '{"text": "needs more", "frames": 2, "seed": 1}' "$O")
expect_error "$O" 503 "$s" insufficient_memory null
[ -n "$(header "$O" Retry-After)" ] || fail "insufficient_memory without Retry-After"
ok "503 insufficient_memory"
stop_server
echo "serve_bad: all cases passed"
