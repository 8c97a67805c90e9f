#!/usr/bin/env bash
# `drama bench codec`: one frame through the real-size codec (random weights): the table has every
# mode, streaming equals the whole decode, the peak states its factors, the last line is
# ratio_to_floor, the clock names its source, the whole decode is broken down by stage, and bad options exit 2 naming the flag (speed is measured in bench/, not here).
set -euo pipefail
: "${DRAMA_BIN:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

"$DRAMA_BIN" bench codec --frames 2 --threads 2 >"$T/out" || { echo "FAIL: bench codec"; cat "$T/out"; exit 1; }
for mode in "decode whole" "decode stream, 1/call" "encode"; do
    grep -q "^  $mode " "$T/out" || { echo "FAIL: no '$mode' row"; cat "$T/out"; exit 1; }
done
grep -q "streaming == whole decode (bitwise): yes" "$T/out" || { echo "FAIL: streaming differs"; cat "$T/out"; exit 1; }
grep -Eq "peak = [0-9]+ cores x [0-9]+ FMA units x [0-9]+ fp32 lanes x 2 x [0-9.]+ GHz" "$T/out" ||
    { echo "FAIL: peak factors not stated"; cat "$T/out"; exit 1; }
grep -Eq "^  clock [0-9.]+ GHz \((measured|cpuinfo|stated)" "$T/out" || { echo "FAIL: clock source not stated"; cat "$T/out"; exit 1; }
grep -q "^    block 0 residual units " "$T/out" || { echo "FAIL: no stage breakdown"; cat "$T/out"; exit 1; }
"$DRAMA_BIN" bench codec --frames 1 --threads 1 --no-encode --clock-ghz 2.5 >"$T/out2" || { echo "FAIL: --clock-ghz"; exit 1; }
grep -q "^  clock 2.500 GHz (stated with --clock-ghz)" "$T/out2" || { echo "FAIL: stated clock not used"; cat "$T/out2"; exit 1; }
tail -n 1 "$T/out" | grep -Eq '^ratio_to_floor [0-9.]+$' || { echo "FAIL: last line"; tail -n 2 "$T/out"; exit 1; }

expect_usage() { # expect status 2 and the message naming the flag
    local want=$1; shift
    set +e; "$DRAMA_BIN" bench codec "$@" >/dev/null 2>"$T/err"; local rc=$?; set -e
    [ "$rc" = 2 ] && grep -q -- "$want" "$T/err" || { echo "FAIL: bench codec $* -> rc $rc"; cat "$T/err"; exit 1; }
}
expect_usage "--frames: invalid value '0'" --frames 0
expect_usage "--threads: invalid value 'x'" --threads x
expect_usage "unknown option '--bogus'" --bogus
expect_usage "--clock-ghz: invalid value '0'" --clock-ghz 0
echo "bench_codec: ok"
