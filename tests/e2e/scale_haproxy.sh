#!/usr/bin/env bash
# scale_haproxy.sh - replicas behind a real load balancer (issue 16, docs/deploy.md): three
# `drama serve` replicas of the tiny model share one --voices-dir behind HAProxy configured from
# deploy/haproxy.cfg, all on 127.0.0.1. A voice registered through the balancer is usable on
# every replica directly; the same request and seed give the same bytes from every replica;
# mixed whole/streamed /v1/tts and /v1/audio/speech requests through the balancer all answer 200
# with exactly the reference bytes and are spread over >1 replica; one replica SIGTERMed
# mid-load drains and exits 0 while HAProxy sends the rest to the others, and no response is
# cut without the client seeing it (curl status and bytes of every response are checked).
set -eu
. "$(dirname "$0")/serve_lib.bash"
command -v haproxy >/dev/null || fail "haproxy not installed (scripts/install-deps.sh installs it)"
O="$WORK/out"
VOICES="$WORK/voices"
N=3
# requests per load phase (before, around and after r0's drain) and each request's deadline. Under
# ASan a request costs seconds of CPU (CI's 2 cores: 360 took ~600 s of the 900 s timeout; with 6
# in flight on a loaded machine one can wait over 60 s), so that build runs a quarter of them with
# a longer deadline: the same kinds, concurrency, drain and assertions.
A=150 B=180 C=30 MAXT=60
if readelf -d "$DRAMA_BIN" 2>/dev/null | grep -q 'NEEDED.*libasan'; then A=30 B=48 C=12 MAXT=300; fi
PIDS=()
BASES=()
LB_PID=""

scale_cleanup() {
    local rc=$? p
    for p in "${PIDS[@]}" $LB_PID; do
        if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; fi
    done
    if [ $rc -ne 0 ] && [ -f "$WORK/haproxy.log" ]; then
        echo "---- haproxy log (last 30 lines) ----" >&2
        tail -30 "$WORK/haproxy.log" >&2
    fi
    (exit $rc)
    cleanup
}
trap scale_cleanup EXIT

for i in $(seq 0 $((N - 1))); do
    SERVER_TAG=server$i start_server --voices-dir "$VOICES" --replica-id "r$i" --parallel 2 \
        --threads 1 --drain-timeout 30 -q
    PIDS[i]=$SERVER_PID
    BASES[i]=$BASE
    SERVER_PID=""
done
ok "$N replicas up: ${BASES[*]}"

# the balancer: deploy/haproxy.cfg with this test's bind and servers (nothing else changed)
free_port() {
    node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}
make_cfg() {
    local port=$1 i servers=""
    for i in $(seq 0 $((N - 1))); do servers="$servers    server r$i ${BASES[i]#http://}\n"; done
    awk -v port="$port" -v servers="$servers" '
        /^    bind / { print "    bind 127.0.0.1:" port; next }
        /# BEGIN servers/ { print; printf "%s", servers; skip = 1; next }
        /# END servers/ { skip = 0 }
        !skip { print }' "$DRAMA_SRC/deploy/haproxy.cfg" >"$WORK/haproxy.cfg"
    grep -c '^    server r' "$WORK/haproxy.cfg" | grep -qx "$N" || fail "generated config lacks the servers"
}
for attempt in 1 2 3; do
    LB_PORT=$(free_port)
    make_cfg "$LB_PORT"
    haproxy -c -f "$WORK/haproxy.cfg" >"$WORK/haproxy.check" 2>&1 || fail "haproxy -c: $(cat "$WORK/haproxy.check")"
    haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
    LB_PID=$!
    LB="http://127.0.0.1:$LB_PORT"
    for i in $(seq 1 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$LB/health")" = 200 ] && break
        kill -0 "$LB_PID" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$LB_PID" 2>/dev/null && break
    wait "$LB_PID" || true
    LB_PID=""
done
[ -n "$LB_PID" ] || fail "haproxy did not start: $(tail -5 "$WORK/haproxy.log")"
s=$(curl -s -o /dev/null -w '%{http_code}' "$LB/health"); [ "$s" = 200 ] || fail "health through haproxy: $s"
ok "haproxy on $LB (generated from deploy/haproxy.cfg)"

# a voice registered through the balancer is usable on every replica directly
make_wav "$WORK/clip.wav" 0.6
printf '{"id": "shared", "text": "A short clip.", "audio": "%s"}' "$(base64 -w0 "$WORK/clip.wav")" >"$WORK/voice.json"
s=$(curl -sS --max-time $MAXT -o "$O" -D "$O.h" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$WORK/voice.json" "$LB/v1/voices")
[ "$s" = 201 ] || fail "POST /v1/voices through haproxy: $s $(head -c 300 "$O")"
made_by=$(header "$O" X-Served-By)
ok "voice 'shared' registered through haproxy (served by $made_by)"

# the request kinds of the load: each body, its path, and its reference bytes from every replica
kinds="tts_whole tts_stream speech_pcm speech_voice tts_voice_stream"
body_of() {
    case $1 in
    tts_whole) echo '{"text": "Whole through the balancer.", "frames": 4, "seed": 11, "format": "wav"}' ;;
    tts_stream) echo '{"text": "Streamed through the balancer.", "frames": 6, "seed": 12, "format": "pcm", "streaming": true, "latency": "balanced"}' ;;
    speech_pcm) echo '{"input": "OpenAI through the balancer.", "voice": "default", "frames": 5, "seed": 13, "response_format": "pcm"}' ;;
    speech_voice) echo '{"input": "A stored voice.", "voice": "shared", "frames": 4, "seed": 14, "response_format": "wav"}' ;;
    tts_voice_stream) echo '{"text": "A stored voice, streamed.", "reference_id": "shared", "frames": 5, "seed": 15, "format": "pcm", "streaming": true}' ;;
    esac
}
path_of() { case $1 in speech_*) echo /v1/audio/speech ;; *) echo /v1/tts ;; esac; }
for k in $kinds; do
    body_of "$k" >"$WORK/$k.json"
    for i in $(seq 0 $((N - 1))); do
        s=$(curl -sS --max-time $MAXT -o "$WORK/$k.r$i" -D "$WORK/$k.r$i.h" -w '%{http_code}' \
            -H 'Content-Type: application/json' --data-binary @"$WORK/$k.json" "${BASES[i]}$(path_of "$k")")
        [ "$s" = 200 ] || fail "$k directly on r$i: $s $(head -c 300 "$WORK/$k.r$i")"
        [ "$(size "$WORK/$k.r$i")" -gt 1000 ] || fail "$k on r$i: only $(size "$WORK/$k.r$i") bytes"
        cmp -s "$WORK/$k.r0" "$WORK/$k.r$i" || fail "$k: r$i's bytes differ from r0's (same request and seed)"
    done
    sha "$WORK/$k.r0" >"$WORK/$k.sha"
done
cmp -s "$WORK/speech_voice.r0" "$WORK/speech_pcm.r0" && fail "control: two different requests gave the same bytes"
ok "every kind byte-identical on r0..r$((N - 1)) directly (the voice from the balancer is usable on each)"

# one request through the balancer; its outcome in R/SEQ.{out,h,code,rc}
R="$WORK/r"
mkdir -p "$R"
one() {
    local k=$1 n=$2 rc=0
    curl -sS --max-time $MAXT -o "$R/$n.out" -D "$R/$n.out.h" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary @"$WORK/$k.json" "$LB$(path_of "$k")" >"$R/$n.code" 2>"$R/$n.err" || rc=$?
    echo "$k $rc" >"$R/$n.rc"
}
export -f one path_of
export R WORK LB MAXT
# load SEQ_FROM SEQ_TO: that many mixed requests, 6 at a time
load() {
    local n kk=($kinds)
    for n in $(seq "$1" "$2"); do echo "${kk[n % ${#kk[@]}]} $n"; done | xargs -P 6 -n 2 bash -c 'one "$0" "$1"'
}
# check SEQ_FROM SEQ_TO: every response 200, curl status 0, exactly the reference bytes; prints
# the served-by counts. A cut response that curl reports (rc != 0) is an error the client saw;
# a cut or changed body with rc 0 and 200 would be a silent truncation: both fail here.
check() {
    local n k rc code silent=0 seen=0 bad=""
    for n in $(seq "$1" "$2"); do
        read -r k rc <"$R/$n.rc"
        code=$(cat "$R/$n.code")
        if [ "$rc" = 0 ] && [ "$code" = 200 ]; then
            if [ "$(sha "$R/$n.out")" != "$(cat "$WORK/$k.sha")" ]; then silent=$((silent + 1)); bad="$bad $n:$k:silent"; fi
        else
            seen=$((seen + 1)); bad="$bad $n:$k:code=$code:curl=$rc"
        fi
        header "$R/$n.out" X-Served-By >>"$WORK/served.$1"
    done
    [ $silent = 0 ] || fail "$silent responses 200 with curl status 0 but not the reference bytes (silent truncation):$bad"
    [ $seen = 0 ] || fail "$seen requests failed (5xx or cut with an error):$bad $(n1=${bad# }; cat "$R/${n1%%:*}.err" 2>/dev/null | head -c 200)"
    sort "$WORK/served.$1" | uniq -c | tr '\n' ' '
}

t0=$(date +%s)
load 1 $A
spread=$(check 1 $A)
[ "$(sort -u "$WORK/served.1" | grep -c .)" -ge 2 ] || fail "all $A requests served by one replica: $spread"
grep -qv '^r[0-9]$' "$WORK/served.1" && fail "a response without a replica's X-Served-By: $spread"
ok "$A mixed requests through haproxy in $(($(date +%s) - t0)) s: all 200, complete, reference bytes; served by: $spread"

# SIGTERM r0 mid-load: it finishes what it runs and exits 0, the balancer routes around it
D1=$((A + 1)) D2=$((A + B))
load $D1 $D2 &
LOAD=$!
# wait (bounded, 300 s) until the load is well under way (a sixth answered), then until r0 runs a request
t_end=$(($(date +%s) + 300))
until [ "$(ls "$R" | grep -c '\.rc$')" -ge $((A + B / 6)) ]; do
    [ "$(date +%s)" -lt "$t_end" ] || fail "the drain phase's load did not get under way in 300 s"
    sleep 0.05
done
busy=0 t_end=$(($(date +%s) + 60))
while [ "$(date +%s)" -lt "$t_end" ]; do
    a=$(curl -s "${BASES[0]}/metrics" | awk '$1 == "drama_lanes_active" {print $2}')
    [ "${a:-0}" -ge 1 ] && { busy=1; break; }
    sleep 0.02
done
[ $busy = 1 ] || fail "r0 never had a running request under load"
kill -TERM "${PIDS[0]}"
for i in $(seq 1 400); do kill -0 "${PIDS[0]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${PIDS[0]}" 2>/dev/null && fail "r0 still running 40 s after SIGTERM"
rc=0; wait "${PIDS[0]}" || rc=$?
PIDS[0]=""
[ $rc = 0 ] || fail "r0 exited with status $rc after SIGTERM"
wait $LOAD
spread=$(check $D1 $D2)
grep -q '^r[12]$' "$WORK/served.$D1" || fail "no request of the drain phase went to r1/r2: $spread"
# the retries field of HAProxy's log ("+N": sent again to another replica after a 503 draining
# or a refused connection); how many depends on timing, so it is reported, not asserted
moved=$(grep -c ' ---- [0-9]*/[0-9]*/[0-9]*/[0-9]*/+[0-9]' "$WORK/haproxy.log" || true)
ok "r0 SIGTERMed with a request running: exit 0; $B requests around it all 200 and complete; served by: $spread; $moved redispatched by haproxy"

load $((D2 + 1)) $((D2 + C))
spread=$(check $((D2 + 1)) $((D2 + C)))
grep -q '^r0$' "$WORK/served.$((D2 + 1))" && fail "a request went to the stopped r0: $spread"
ok "after the drain: $C requests, none to r0; served by: $spread"

kill -TERM "$LB_PID"
wait "$LB_PID" 2>/dev/null || true
LB_PID=""
for i in 1 2; do SERVER_PID=${PIDS[i]}; PIDS[i]=""; stop_server; done
echo "scale_haproxy: all passed in $(($(date +%s) - t0)) s of load"
