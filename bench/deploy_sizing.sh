#!/usr/bin/env bash
# deploy_sizing.sh DRAMA_BIN MODEL_DIR [run|plan|cache] - memory figures for sizing replicas
# (docs/deploy.md "Sizing", bench/RESULTS.md), all from drama serve's own accounting on 127.0.0.1:
#  plan: the state bytes the engine reserves per request (drama_request_plan, model/state_bytes.c),
#        read from the 503 insufficient_memory answer of a server started with a 1 MiB budget:
#        nothing runs, so this works on a large model on a small machine. Requests: no reference
#        at F frames (default 750 = the --max-frames cap), a 3 s and a 10 s inline reference,
#        and the 10 s one guided (cfg_gamma 1: a second backbone state).
#  run (default, also does plan): RSS of the server process (VmRSS = RssAnon + RssFile; RssFile =
#        file-backed pages: libraries and the mapped model files; "weights" = the resident pages of
#        the mappings of files under MODEL_DIR, from /proc/PID/smaps) after load, and its peak
#        (VmRSS; RssAnon: request state is anonymous memory) while P requests of F frames run
#        at --parallel P (P = 1, 4), with drama_memory_bytes{kind="host"} (the
#        reservations) at the same moments; then the prompt cache: drama_prompt_cache_bytes after
#        each of three voices (1 s, 3 s, 10 s clips; VOICES="1 3 10") is first used,
#        --prompt-cache-mib 1024.
#  cache: only the prompt cache part (VOICES="3" for one 3 s voice on a large model).
# Prints markdown tables. Loopback only; every request bounded by curl --max-time.
set -eu
BIN=${1:?usage: deploy_sizing.sh DRAMA_BIN MODEL_DIR [run|plan|cache]}
MODEL=${2:?usage: deploy_sizing.sh DRAMA_BIN MODEL_DIR [run|plan|cache]}
MODE=${3:-run}
F=${F:-750}
VOICES=${VOICES:-1 3 10}
THREADS=${THREADS:-2}
WORK=$(mktemp -d /tmp/drama-sizing.XXXXXX)
PID=""
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; rm -rf "$WORK"' EXIT
start() {
    rm -f "$WORK/out"
    "$BIN" serve --model "$MODEL" --port 0 -q --threads "$THREADS" "$@" >"$WORK/out" 2>"$WORK/err" &
    PID=$!
    for i in $(seq 1 600); do grep -q listening "$WORK/out" 2>/dev/null && break; sleep 0.05; done
    BASE=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/out")
    [ -n "$BASE" ] || { echo "server did not start: $(tail -3 "$WORK/err")" >&2; exit 1; }
    for i in $(seq 1 6000); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && return; sleep 0.1; done
    echo "server not ready after 600 s" >&2; exit 1
}
stop() { kill -TERM $PID; wait $PID || true; PID=""; }
metric() { curl -s "$BASE/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
kib() { awk -v k="$1" '$1 == k":" {print $2}' /proc/$PID/status; }
# resident KiB of the mappings of files under the model directory (the memory-mapped weights)
model_rss() {
    awk -v d="$(cd "$MODEL" && pwd -P)/" '/^[0-9a-f]+-[0-9a-f]+ / {m = (index($6, d) == 1)} m && $1 == "Rss:" {t += $2} END {print t + 0}' /proc/$PID/smaps
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
wav() { # OUT SECONDS HZ: a mono 44.1 kHz tone
    node -e 'const [o,s,hz]=[process.argv[1],+process.argv[2],+process.argv[3]];const n=Math.round(44100*s),b=Buffer.alloc(44+2*n);
b.write("RIFF",0);b.writeUInt32LE(36+2*n,4);b.write("WAVEfmt ",8);b.writeUInt32LE(16,16);b.writeUInt16LE(1,20);b.writeUInt16LE(1,22);
b.writeUInt32LE(44100,24);b.writeUInt32LE(88200,28);b.writeUInt16LE(2,32);b.writeUInt16LE(16,34);b.write("data",36);b.writeUInt32LE(2*n,40);
for(let i=0;i<n;i++)b.writeInt16LE(Math.round(8000*Math.sin(2*Math.PI*hz*i/44100)*(1+0.3*Math.sin(i/3000))),44+2*i);require("fs").writeFileSync(o,b);' "$1" "$2" "$3"
}
TEXT="A sentence of ordinary length for sizing the memory of one request."
for s in 1 3 10; do wav "$WORK/r$s.wav" $s $((140 + 10 * s)); done
ref() { # SECONDS: a references array with that clip
    printf '[{"audio": "%s", "text": "A reference clip of %s seconds for sizing."}]' "$(base64 -w0 "$WORK/r$1.wav")" "$1"
}

# plan: 503 insufficient_memory names the reserved bytes
if [ "$MODE" != cache ]; then
start --memory-budget-mib 1 --cfg-allow-request-gamma
echo "| request (plan, F = $F frames) | state bytes | MiB |"
echo "|---|---|---|"
plan() { # LABEL JSON-EXTRA
    printf '{"text": "%s", "frames": %d, "seed": 1, "format": "pcm"%s}' "$TEXT" "$F" "$2" >"$WORK/plan.json"
    curl -s -m 600 -o "$WORK/plan.out" -H 'Content-Type: application/json' --data-binary @"$WORK/plan.json" "$BASE/v1/tts"
    b=$(jq -r .error.message "$WORK/plan.out" | sed -n 's/.*needs \([0-9]*\) bytes of state.*/\1/p')
    [ -n "$b" ] || { echo "no state bytes in: $(head -c 300 "$WORK/plan.out")" >&2; exit 1; }
    printf '| %s | %s | %s |\n' "$1" "$b" "$(mib "$b")"
}
plan "no reference" ""
plan "3 s reference" ", \"references\": $(ref 3)"
plan "10 s reference" ", \"references\": $(ref 10)"
plan "10 s reference, guided (cfg_gamma 1)" ", \"references\": $(ref 10), \"cfg_gamma\": 1"
stop
fi
[ "$MODE" != plan ] || exit 0
if [ "$MODE" = run ]; then

echo
echo "| --parallel | requests x frames | RSS after load MiB (anon + file; model files) | peak RSS MiB | peak anon - idle anon MiB | per lane MiB | drama_memory_bytes host at peak MiB | per lane MiB | model files resident after MiB |"
echo "|---|---|---|---|---|---|---|---|---|"
for P in 1 4; do
    start --parallel $P --queue 16
    # one short request first: code paths and the weights it touches are resident before "idle"
    curl -s -m 120 -o /dev/null -H 'Content-Type: application/json' --data-binary '{"text": "Warm up.", "frames": 4, "seed": 1, "format": "pcm"}' "$BASE/v1/tts"
    sleep 0.5
    idle=$(kib VmRSS); anon=$(kib RssAnon); file=$(kib RssFile); weights=$(model_rss)
    printf '{"text": "%s", "frames": %d, "seed": 2, "format": "pcm", "streaming": true}' "$TEXT" "$F" >"$WORK/run.json"
    pids=()
    for k in $(seq 1 $P); do
        curl -s -m 600 -o "$WORK/run$k.out" -H 'Content-Type: application/json' --data-binary @"$WORK/run.json" "$BASE/v1/tts" &
        pids+=($!)
    done
    peak=0; peak_anon=0; host=0
    while kill -0 "${pids[@]}" 2>/dev/null; do
        r=$(kib VmRSS); [ "$r" -gt "$peak" ] && peak=$r
        r=$(kib RssAnon); [ "$r" -gt "$peak_anon" ] && peak_anon=$r
        h=$(metric 'drama_memory_bytes{kind="host"}'); [ "${h%.*}" -gt "$host" ] && host=${h%.*}
        sleep 0.05
    done
    wait "${pids[@]}"
    for k in $(seq 1 $P); do
        [ "$(stat -c %s "$WORK/run$k.out")" = $((2 * F * 2048)) ] || { echo "request $k: $(stat -c %s "$WORK/run$k.out") bytes" >&2; exit 1; }
    done
    after=$(model_rss)
    stop
    printf '| %d | %d x %d | %s (%s + %s; %s) | %s | %s | %s | %s | %s | %s |\n' $P $P $F "$(mib $((idle * 1024)))" \
        "$(mib $((anon * 1024)))" "$(mib $((file * 1024)))" "$(mib $((weights * 1024)))" "$(mib $((peak * 1024)))" \
        "$(mib $(((peak_anon - anon) * 1024)))" "$(mib $(((peak_anon - anon) * 1024 / P)))" "$(mib "$host")" \
        "$(mib $((host / P)))" "$(mib $((after * 1024)))"
done

fi
echo
echo "| voices used | last clip | drama_prompt_cache_bytes | this voice's entry MiB |"
echo "|---|---|---|---|"
start --prompt-cache-mib 1024 --voices-dir "$WORK/voices"
prev=0
n=0
for s in $VOICES; do
    printf '{"id": "v%s", "text": "A reference clip of %s seconds for sizing.", "audio": "%s"}' $s $s "$(base64 -w0 "$WORK/r$s.wav")" >"$WORK/v.json"
    curl -s -m 600 -o /dev/null -H 'Content-Type: application/json' --data-binary @"$WORK/v.json" "$BASE/v1/voices"
    curl -s -m 600 -o /dev/null -H 'Content-Type: application/json' \
        --data-binary "{\"text\": \"Cached.\", \"reference_id\": \"v$s\", \"frames\": 2, \"seed\": 1, \"format\": \"pcm\"}" "$BASE/v1/tts"
    n=$((n + 1))
    c=$(metric drama_prompt_cache_bytes); c=${c%.*}
    printf '| %d | %s s | %s | %s |\n' $n $s "$c" "$(mib $((c - prev)))"
    prev=$c
done
echo "(voice cache misses $(metric drama_voice_cache_misses_total), hits $(metric drama_voice_cache_hits_total))"
stop
