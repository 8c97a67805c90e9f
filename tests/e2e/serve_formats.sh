#!/usr/bin/env bash
# serve_formats.sh - every format, whole and streamed, on both synthesis endpoints (API.md 3.2,
# 3.3, 4): exact wav/pcm sizes, mp3 and opus decoded by independent decoders (mpg123, opusdec),
# 24 kHz pcm on /v1/audio/speech, streamed = whole (wav: only header bytes 4-7 and 40-43
# differ), SSE deltas = the audio stream, X-Seed reproduces a request, headers.
set -eu
. "$(dirname "$0")/serve_lib.bash"
command -v mpg123 >/dev/null && command -v opusdec >/dev/null || { echo "skip: mpg123/opusdec missing (scripts/install-deps.sh)"; exit 77; }
start_server -q
N=30
SEED=42
TXT="Formats test, one two three."

tts() { # FORMAT STREAMING OUT
    post_json /v1/tts "{\"text\": \"$TXT\", \"frames\": $N, \"seed\": $SEED, \"format\": \"$1\", \"streaming\": $2}" "$3"
}

for fmt in wav pcm mp3 opus; do
    s=$(tts $fmt false "$WORK/whole.$fmt"); [ "$s" = 200 ] || fail "$fmt whole: $s $(head -c 200 "$WORK/whole.$fmt")"
    s=$(tts $fmt true "$WORK/stream.$fmt"); [ "$s" = 200 ] || fail "$fmt stream: $s"
    [ "$(header "$WORK/whole.$fmt" X-Seed)" = $SEED ] || fail "$fmt: X-Seed '$(header "$WORK/whole.$fmt" X-Seed)'"
    [ "$(header "$WORK/whole.$fmt" X-Audio-Frames)" = $N ] || fail "$fmt: X-Audio-Frames"
    [ "$(header "$WORK/whole.$fmt" Content-Disposition)" = "attachment; filename=audio.$fmt" ] || fail "$fmt: Content-Disposition"
    [ "$(header "$WORK/stream.$fmt" Transfer-Encoding)" = chunked ] || fail "$fmt stream: not chunked"
    ct=$(header "$WORK/whole.$fmt" Content-Type)
    case $fmt in wav) want=audio/wav ;; pcm) want=application/octet-stream ;; mp3) want=audio/mpeg ;; opus) want=audio/ogg ;; esac
    [ "$ct" = "$want" ] || fail "$fmt: Content-Type '$ct', want $want"
    if [ $fmt = wav ]; then
        diffs=$(cmp -l "$WORK/whole.wav" "$WORK/stream.wav" | awk '$1 < 5 || ($1 > 8 && $1 < 41) || $1 > 44' | wc -l)
        [ "$diffs" = 0 ] || fail "wav: streamed differs from whole outside the size fields"
        [ "$(size "$WORK/whole.wav")" = $((44 + 2 * N * SPF)) ] || fail "wav size $(size "$WORK/whole.wav")"
        [ "$(od -An -tu4 -j40 -N4 "$WORK/whole.wav" | tr -d ' ')" = $((2 * N * SPF)) ] || fail "wav data size field"
        [ "$(od -An -tx4 -j40 -N4 "$WORK/stream.wav" | tr -d ' ')" = ffffffff ] || fail "streamed wav: data size not 0xFFFFFFFF"
    else
        cmp -s "$WORK/whole.$fmt" "$WORK/stream.$fmt" || fail "$fmt: streamed bytes differ from whole"
    fi
    ok "$fmt: whole = streamed ($(size "$WORK/whole.$fmt") bytes), headers"
done
[ "$(size "$WORK/whole.pcm")" = $((2 * N * SPF)) ] || fail "pcm size"
cmp -s <(tail -c +45 "$WORK/whole.wav") "$WORK/whole.pcm" || fail "wav samples != pcm samples"
ok "pcm = the wav's samples"

mpg123 -q -w "$WORK/mp3.wav" "$WORK/whole.mp3" 2>"$WORK/mpg123.err" || fail "mpg123 cannot decode: $(cat "$WORK/mpg123.err")"
[ "$(od -An -tu4 -j24 -N4 "$WORK/mp3.wav" | tr -d ' ')" = 44100 ] || fail "mp3 decodes at another rate"
[ "$(od -An -tu2 -j22 -N2 "$WORK/mp3.wav" | tr -d ' ')" = 1 ] || fail "mp3 is not mono"
got=$((($(size "$WORK/mp3.wav") - 44) / 2))
[ $got -ge $((N * SPF)) ] && [ $got -le $((N * SPF + 4 * 1152)) ] || fail "mp3 decodes to $got samples, want ~$((N * SPF))"
ok "mp3: mpg123 decodes $got samples, 44.1 kHz mono"
opusdec --quiet --rate 44100 "$WORK/whole.opus" "$WORK/opus.wav" 2>"$WORK/opusdec.err" || fail "opusdec: $(cat "$WORK/opusdec.err")"
got=$((($(size "$WORK/opus.wav") - 44) / 2))
[ $got -ge $((N * SPF - 100)) ] && [ $got -le $((N * SPF + 100)) ] || fail "opus decodes to $got samples, want $((N * SPF))"
opusinfo "$WORK/whole.opus" >"$WORK/opusinfo.txt" 2>&1 || fail "opusinfo: $(tail -3 "$WORK/opusinfo.txt")"
grep -q "Original sample rate: 44100" "$WORK/opusinfo.txt" || fail "opus header does not record 44100 Hz"
ok "opus: opusdec decodes $got samples; input rate 44100 in the header"

# X-Seed reproduces a request without a seed; another seed changes the audio
post_json /v1/tts "{\"text\": \"$TXT\", \"frames\": $N, \"format\": \"pcm\"}" "$WORK/noseed.pcm" >/dev/null
drawn=$(header "$WORK/noseed.pcm" X-Seed)
[ -n "$drawn" ] || fail "no X-Seed without a seed"
post_json /v1/tts "{\"text\": \"$TXT\", \"frames\": $N, \"format\": \"pcm\", \"seed\": $drawn}" "$WORK/reseed.pcm" >/dev/null
cmp -s "$WORK/noseed.pcm" "$WORK/reseed.pcm" || fail "X-Seed $drawn does not reproduce the request"
post_json /v1/tts "{\"text\": \"$TXT\", \"frames\": $N, \"format\": \"pcm\", \"seed\": $((SEED + 1))}" "$WORK/other.pcm" >/dev/null
cmp -s "$WORK/whole.pcm" "$WORK/other.pcm" && fail "another seed gave the same audio"
ok "X-Seed $drawn reproduces; another seed differs"

# OpenAI endpoint: always streamed; pcm at 24 kHz; same samples as /v1/tts for the same request
sp() { # FORMAT OUT [extra json]
    post_json /v1/audio/speech "{\"model\": \"tts-1\", \"input\": \"$TXT\", \"voice\": \"default\", \"frames\": $N, \"seed\": $SEED, \"response_format\": \"$1\"$3}" "$2"
}
s=$(sp wav "$WORK/oa.wav" ""); [ "$s" = 200 ] || fail "speech wav: $s $(head -c 200 "$WORK/oa.wav")"
diffs=$(cmp -l "$WORK/whole.wav" "$WORK/oa.wav" | awk '$1 < 5 || ($1 > 8 && $1 < 41) || $1 > 44' | wc -l)
[ "$diffs" = 0 ] || fail "/v1/audio/speech wav differs from /v1/tts wav"
s=$(sp pcm "$WORK/oa.pcm" ""); [ "$s" = 200 ] || fail "speech pcm: $s"
[ "$(header "$WORK/oa.pcm" Content-Type)" = audio/pcm ] || fail "speech pcm Content-Type"
want=$((N * SPF * 24000 / RATE))
got=$(($(size "$WORK/oa.pcm") / 2))
[ $got -ge $((want - 2)) ] && [ $got -le $((want + 2)) ] || fail "24 kHz pcm: $got samples, want $want"
ok "/v1/audio/speech: wav = /v1/tts wav; pcm at 24 kHz ($got samples)"
s=$(sp mp3 "$WORK/oa.mp3" ""); [ "$s" = 200 ] && [ "$(header "$WORK/oa.mp3" Content-Type)" = audio/mpeg ] || fail "speech mp3"
mpg123 -q -w /dev/null "$WORK/oa.mp3" || fail "speech mp3 does not decode"
s=$(post_json /v1/audio/speech "{\"input\": \"$TXT\", \"voice\": \"default\", \"frames\": 4, \"seed\": 1}" "$WORK/default.out")
[ "$s" = 200 ] && [ "$(header "$WORK/default.out" Content-Type)" = audio/mpeg ] || fail "default format is not mp3"
ok "/v1/audio/speech mp3 (the default)"

# SSE: the deltas concatenate to the "audio" stream; then speech.audio.done with usage
s=$(sp wav "$WORK/oa.sse" ', "stream_format": "sse"'); [ "$s" = 200 ] || fail "sse: $s"
[ "$(header "$WORK/oa.sse" Content-Type)" = text/event-stream ] || fail "sse Content-Type"
grep -a '^data: ' "$WORK/oa.sse" | sed 's/^data: //' >"$WORK/events.jsonl"
jq -r 'select(.type == "speech.audio.delta") | .audio' "$WORK/events.jsonl" | while read -r b; do printf '%s' "$b" | base64 -d; done >"$WORK/sse.wav"
cmp -s "$WORK/sse.wav" "$WORK/oa.wav" || fail "SSE deltas != the audio stream ($(size "$WORK/sse.wav") vs $(size "$WORK/oa.wav"))"
[ "$(tail -1 "$WORK/events.jsonl" | jq -r .type)" = speech.audio.done ] || fail "last SSE event is not speech.audio.done"
[ "$(tail -1 "$WORK/events.jsonl" | jq -r .usage.output_tokens)" = $N ] || fail "usage.output_tokens"
u=$(tail -1 "$WORK/events.jsonl" | jq '.usage.input_tokens + .usage.output_tokens == .usage.total_tokens')
[ "$u" = true ] || fail "usage totals"
ok "SSE: $(grep -c speech.audio.delta "$WORK/events.jsonl") deltas = the audio stream; done event with usage"
stop_server
echo "serve_formats: all passed"
