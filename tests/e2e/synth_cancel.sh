#!/usr/bin/env bash
# Cancellation: SIGINT (and SIGTERM) after the first streamed chunk -> exit 130, no published
# file, no temporary file; the next run with the same seed equals an uninterrupted run.
# DRAMA_TEST_PAUSE_AFTER_CHUNK makes the CLI wait for the signal after its first chunk, so the
# signal always lands mid-request (no timing race).
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"
N=40

synth ref.wav --frames $N --seed 5 --stream
[ $rc -eq 0 ] || fail "uninterrupted run failed: $(cat last.err)"

for sig in INT TERM; do
    rm -f cut.wav ev.log
    DRAMA_TEST_PAUSE_AFTER_CHUNK=1 "$DRAMA_BIN" synthesize --model "$MODEL" --text "$TEXT" -o cut.wav \
        --frames $N --seed 5 --stream --progress-json --receipt cut.json 2>ev.log &
    pid=$!
    for _ in $(seq 1 600); do   # wait (up to 60 s) for the first chunk event
        grep -q '"event":"chunk"' ev.log 2>/dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    grep -q '"event":"chunk"' ev.log || { kill -KILL $pid 2>/dev/null; fail "no chunk before the signal: $(tail -3 ev.log)"; }
    ls cut.wav.tmp.* >/dev/null 2>&1 || fail "no temporary file while streaming (expected one)"
    kill -$sig $pid
    set +e
    wait $pid
    rc=$?
    set -e
    [ $rc -eq 130 ] || fail "SIG$sig: exit $rc, expected 130: $(tail -2 ev.log)"
    [ ! -e cut.wav ] || fail "SIG$sig: output was published"
    no_leftovers "$WORK"
    [ "$(jq -r .finish_reason cut.json)" = cancelled ] || fail "receipt finish_reason $(jq -r .finish_reason cut.json)"
    [ "$(jq -r .output cut.json)" = null ] || fail "receipt names an output after cancellation"
    ok "SIG$sig after the first chunk: exit 130, nothing published, no temporary file"
done

synth again.wav --frames $N --seed 5 --stream
[ $rc -eq 0 ] || fail "run after cancellation failed"
cmp ref.wav again.wav || fail "run after cancellation differs from the uninterrupted run"
ok "next run equals the uninterrupted run"
echo PASS
