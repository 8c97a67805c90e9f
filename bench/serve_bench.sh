#!/usr/bin/env bash
# serve_bench.sh DRAMA_BIN MODEL_DIR - drama serve over HTTP on 127.0.0.1 (bench/RESULTS.md):
#  1. time to first audio (curl's time to the first body byte of a streamed /v1/tts request; the
#     status goes out with the first chunk) for a voice whose prompt is not cached (a fresh voice
#     each time) and for a cached one (the same voice again), --prompt-cache-mib 256, 5 each;
#  2. aggregate frames/s at --parallel 1, 2, 4: 2 x P concurrent requests of F frames each.
# Prints one table per part. Only loopback traffic; every request bounded by curl --max-time.
set -eu
BIN=${1:?usage: serve_bench.sh DRAMA_BIN MODEL_DIR}
MODEL=${2:?usage: serve_bench.sh DRAMA_BIN MODEL_DIR}
F=${F:-100}
WORK=$(mktemp -d /tmp/drama-serve-bench.XXXXXX)
PID=""
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; rm -rf "$WORK"' EXIT
start() {
    rm -f "$WORK/out" # before the fork: the child truncates it only when it runs
    "$BIN" serve --model "$MODEL" --port 0 -q "$@" >"$WORK/out" 2>"$WORK/err" &
    PID=$!
    for i in $(seq 1 200); do grep -q listening "$WORK/out" 2>/dev/null && break; sleep 0.05; done
    BASE=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/out")
    for i in $(seq 1 600); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && return; sleep 0.1; done
    echo "server not ready" >&2; exit 1
}
stop() { kill -TERM $PID; wait $PID || true; PID=""; }
wav() { # OUT SECONDS HZ: a mono 44.1 kHz tone
    node -e 'const [o,s,hz]=[process.argv[1],+process.argv[2],+process.argv[3]];const n=Math.round(44100*s),b=Buffer.alloc(44+2*n);
b.write("RIFF",0);b.writeUInt32LE(36+2*n,4);b.write("WAVEfmt ",8);b.writeUInt32LE(16,16);b.writeUInt16LE(1,20);b.writeUInt16LE(1,22);
b.writeUInt32LE(44100,24);b.writeUInt32LE(88200,28);b.writeUInt16LE(2,32);b.writeUInt16LE(16,34);b.write("data",36);b.writeUInt32LE(2*n,40);
for(let i=0;i<n;i++)b.writeInt16LE(Math.round(8000*Math.sin(2*Math.PI*hz*i/44100)),44+2*i);require("fs").writeFileSync(o,b);' "$1" "$2" "$3"
}
ttfa() { # VOICE: seconds to the first audio byte
    curl -s -m 120 -o /dev/null -w '%{time_starttransfer}' -H 'Content-Type: application/json' \
        --data-binary "{\"text\": \"Time to first audio.\", \"reference_id\": \"$1\", \"frames\": 40, \"seed\": 1, \"format\": \"pcm\", \"streaming\": true, \"latency\": \"balanced\"}" "$BASE/v1/tts"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

start --prompt-cache-mib 256
for k in 1 2 3 4 5; do
    wav "$WORK/v$k.wav" 3 $((150 + 20 * k))
    printf '{"id": "v%d", "text": "A reference clip of three seconds, number %d.", "audio": "%s"}' $k $k "$(base64 -w0 "$WORK/v$k.wav")" >"$WORK/v$k.json"
    curl -s -m 120 -o /dev/null -H 'Content-Type: application/json' --data-binary @"$WORK/v$k.json" "$BASE/v1/voices"
done
: >"$WORK/unc"; : >"$WORK/cac"
for k in 1 2 3 4 5; do ttfa v$k >>"$WORK/unc"; echo >>"$WORK/unc"; ttfa v$k >>"$WORK/cac"; echo >>"$WORK/cac"; done
hits=$(curl -s "$BASE/metrics" | awk '$1 == "drama_voice_cache_hits_total" {print $2}')
stop
echo "| voice prompt | requests | median TTFA (s) | min | max |"
echo "|---|---|---|---|---|"
for kind in unc cac; do
    label=$([ $kind = unc ] && echo "not cached (new voice, 3 s clip)" || echo "cached (same voice again)")
    printf '| %s | 5 | %s | %s | %s |\n' "$label" "$(median <"$WORK/$kind")" "$(sort -g "$WORK/$kind" | head -1)" "$(sort -g "$WORK/$kind" | tail -1)"
done
echo "(prompt cache hits reported by /metrics: $hits)"
echo
echo "| --parallel | requests | frames each | wall (s) | aggregate frames/s |"
echo "|---|---|---|---|---|"
for P in 1 2 4; do
    start --parallel $P --queue 64
    n=$((2 * P))
    t0=$(date +%s.%N)
    pids=()
    for k in $(seq 1 $n); do
        curl -s -m 300 -o /dev/null -H 'Content-Type: application/json' \
            --data-binary "{\"text\": \"Throughput request $k.\", \"frames\": $F, \"seed\": $k, \"format\": \"pcm\"}" "$BASE/v1/tts" &
        pids+=($!)
    done
    wait "${pids[@]}"
    t1=$(date +%s.%N)
    stop
    awk -v p=$P -v n=$n -v f=$F -v a=$t0 -v b=$t1 'BEGIN {printf "| %d | %d | %d | %.2f | %.1f |\n", p, n, f, b - a, n * f / (b - a)}'
done
