#!/usr/bin/env bash
# drama synthesize (whole mode) decodes beside generation on its own thread (src/gen/engine_decoder.c):
# the WAV is byte-identical with the overlap off (DRAMA_DECODE_OVERLAP=0), on, and on with a queue of
# 8 frames (generation waits for the decoder), at 1 and 3 threads and over several text batches;
# a frame-limit failure and a SIGINT mid-generation (DRAMA_TEST_PAUSE_AFTER_FRAMES holds the CLI
# after frame 30, so the signal lands while the decoder thread holds frames) end cleanly: the same
# exit status as without the overlap, nothing published, no temporary file, and no hang.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"

for args in "--frames 13" "--frames 120" "--frames 40 --threads 1" "--frames 40 --threads 3"; do
    # shellcheck disable=SC2086
    DRAMA_DECODE_OVERLAP=0 synth off.wav $args --seed 7 --receipt off.json
    [ $rc -eq 0 ] || fail "overlap off ($args) failed: $(cat last.err)"
    for q in 1 8; do
        # shellcheck disable=SC2086
        DRAMA_DECODE_OVERLAP=$q synth on.wav $args --seed 7 --receipt on.json
        [ $rc -eq 0 ] || fail "overlap $q ($args) failed: $(cat last.err)"
        cmp off.wav on.wav || fail "overlap $q ($args): WAV differs from the overlap off"
        [ "$(jq -r .samples on.json)" = "$(jq -r .samples off.json)" ] || fail "overlap $q ($args): samples differ"
    done
    ok "overlap on (queue 128 and 8) == off, byte for byte: $args ($(stat -c %s off.wav) bytes)"
done

LONG="First sentence here. Second one follows it. A third, to be sure. And a fourth."
DRAMA_DECODE_OVERLAP=0 "$DRAMA_BIN" synthesize --model "$MODEL" --text "$LONG" -q -o boff.wav --seed 2 \
    --frames-per-batch 12 --chunk-tokens 8 2>last.err || fail "batches, overlap off: $(cat last.err)"
"$DRAMA_BIN" synthesize --model "$MODEL" --text "$LONG" -q -o bon.wav --seed 2 \
    --frames-per-batch 12 --chunk-tokens 8 2>last.err || fail "batches, overlap on: $(cat last.err)"
cmp boff.wav bon.wav || fail "several batches: overlap on differs from off"
ok "several text batches: overlap on == off"

# A failure during generation (the frame cap) with the decoder thread running.
DRAMA_DECODE_OVERLAP=0 synth capoff.wav --max-frames 9 --seed 1
rc_off=$rc
DRAMA_DECODE_OVERLAP=8 synth capon.wav --max-frames 9 --seed 1 --receipt cap.json
[ $rc -ne 0 ] && [ $rc -eq $rc_off ] || fail "frame cap: exit $rc with the overlap, $rc_off without"
[ ! -e capon.wav ] || fail "frame cap: output published"
[ "$(jq -r .finish_reason cap.json)" = frame_limit ] || fail "frame cap: finish_reason $(jq -r .finish_reason cap.json)"
no_leftovers "$WORK"
ok "frame cap with the decoder running: exit $rc as without it, nothing published"

# SIGINT / SIGTERM mid-generation, frames queued on the decoder thread. While the CLI is held at
# frame 30 (--threads 1: no pool workers), the overlap shows as exactly one more thread.
declare -A tasks
for run in "0 INT" "8 INT" "8 TERM"; do
    read -r q sig <<<"$run"
    rm -f cut.wav ev.log
    DRAMA_DECODE_OVERLAP=$q DRAMA_TEST_PAUSE_AFTER_FRAMES=30 "$DRAMA_BIN" synthesize --model "$MODEL" --text "$TEXT" \
        -o cut.wav --frames 120 --seed 5 --threads 1 --progress-json --receipt cut.json 2>ev.log &
    pid=$!
    wait_frames $pid 30 ev.log
    tasks[$q]=$(ls /proc/$pid/task | wc -l)
    kill -$sig $pid
    set +e
    for _ in $(seq 1 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $pid 2>/dev/null; then kill -KILL $pid; fail "SIG$sig: still running 30 s after the signal (hang)"; fi
    wait $pid
    rc=$?
    set -e
    [ $rc -eq 130 ] || fail "SIG$sig (overlap $q): exit $rc, expected 130: $(tail -2 ev.log)"
    [ ! -e cut.wav ] || fail "SIG$sig (overlap $q): output was published"
    no_leftovers "$WORK"
    [ "$(jq -r .finish_reason cut.json)" = cancelled ] || fail "SIG$sig: finish_reason $(jq -r .finish_reason cut.json)"
    ok "SIG$sig mid-generation (overlap $q, ${tasks[$q]} threads): exit 130, nothing published"
done
[ "${tasks[8]}" -eq $((tasks[0] + 1)) ] || fail "overlap on: ${tasks[8]} threads, off: ${tasks[0]} (the decoder thread is not running)"
ok "the decoder runs on its own thread (${tasks[8]} threads with the overlap, ${tasks[0]} without)"
echo PASS
