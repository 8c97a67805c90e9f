#!/usr/bin/env bash
# drama synthesize at 1, 2 and 3 threads (issue 17, helper tiny2): the WAV is byte-identical at
# every thread count, with the decoder at its own priority or not (DRAMA_DECODE_NICE=0) and with
# the prefill's logits for every row or the last only (DRAMA_PREFILL_ALL_LOGITS=1). Beside a pool
# of 2+ threads the overlapped decoder's thread and its pool's worker run at nice +10 (the
# language model's threads at the process's own), at 1 thread and with DRAMA_DECODE_NICE=0 none.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"

synth ref.wav --frames 60 --seed 7 --threads 1
[ $rc -eq 0 ] || fail "threads 1 failed: $(cat last.err)"
for t in 1 2 3; do
    for env in "" DRAMA_DECODE_NICE=0 DRAMA_PREFILL_ALL_LOGITS=1 DRAMA_DECODE_OVERLAP=0; do
        if [ -n "$env" ]; then export "${env?}"; fi
        synth out.wav --frames 60 --seed 7 --threads $t
        if [ -n "$env" ]; then unset "${env%%=*}"; fi
        [ $rc -eq 0 ] || fail "threads $t $env failed: $(cat last.err)"
        cmp ref.wav out.wav || fail "threads $t $env: WAV differs from threads 1"
    done
done
ok "WAV byte-identical at 1, 2, 3 threads, decoder nice on/off, last-row/all-row prefill logits, overlap on/off"

# niced PID: how many tasks of PID have a nice value other than 0
niced() { local n=0 s; for s in /proc/"$1"/task/*/stat; do
    # field 19 of stat is nice; the command name (field 2) has no spaces here
    [ "$(awk '{print $19}' "$s")" = 0 ] || n=$((n + 1)); done; echo $n; }

for run in "2 10 2" "2 0 0" "1 10 0" "3 10 3"; do
    read -r t nice want <<<"$run"
    rm -f cut.wav ev.log
    DRAMA_DECODE_NICE=$nice DRAMA_TEST_PAUSE_AFTER_FRAMES=30 "$DRAMA_BIN" synthesize --model "$MODEL" --text "$TEXT" \
        -o cut.wav --frames 120 --seed 5 --threads "$t" --progress-json 2>ev.log &
    pid=$!
    wait_frames $pid 30 ev.log
    got=$(niced $pid)
    kill -INT $pid
    set +e
    wait $pid
    set -e
    [ "$got" -eq "$want" ] || fail "threads $t, DRAMA_DECODE_NICE=$nice: $got niced threads, expected $want"
    ok "threads $t, DRAMA_DECODE_NICE=$nice: $got threads at a lower priority (the decoder and its pool's workers)"
done
echo PASS
