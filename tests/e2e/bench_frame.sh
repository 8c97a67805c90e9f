#!/usr/bin/env bash
# `drama bench frame` on the CPU backend over a generated tiny model: the table has the frame time,
# the per-part bytes (experts = top_k of the kept per layer), both times to first codes and their
# parts (clone, prefill, first frame), and ends in `ratio_to_floor X`; bad options name the flag
# (speed itself goes to bench/RESULTS.md).
set -euo pipefail
: "${DRAMA_BIN:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$DRAMA_BIN" make-model "$T/m" --experts fp8 --expert-fill direct --codec none --threads 2 >/dev/null
"$DRAMA_BIN" bench frame --model "$T/m" --backend cpu --threads 2 --frames 6 --warmup 1 --prompt-rows 20 >"$T/out" \
    || { echo "FAIL: bench frame"; cat "$T/out"; exit 1; }
last=$(tail -n 1 "$T/out")
awk -v l="$last" 'BEGIN { split(l, f, " "); exit !(f[1] == "ratio_to_floor" && f[2] > 0 && f[2] < 1e5) }' \
    || { echo "FAIL: last line '$last'"; cat "$T/out"; exit 1; }
val() { awk -v k="$1" '$1 == k { print $2 }' "$T/out"; }
for k in ms_per_frame ttfa_prompt ttfa_cached_voice ttfa_cached_text_rows ttfa_cached_first_frame \
    ttfa_prompt_prefill ttfa_prompt_first_frame bytes_dense bytes_tower; do
    awk -v v="$(val $k)" 'BEGIN { exit !(v > 0) }' || { echo "FAIL: $k = '$(val $k)'"; cat "$T/out"; exit 1; }
done
# the cached voice's parts (clone, text rows, first frame) add up to its total (2-decimal rounding)
awk -v t="$(val ttfa_cached_voice)" -v a="$(val ttfa_cached_clone)" -v b="$(val ttfa_cached_text_rows)" \
    -v c="$(val ttfa_cached_first_frame)" 'BEGIN { d = a + b + c - t; exit !(a >= 0 && d < 0.025 && d > -0.025) }' \
    || { echo "FAIL: cached-voice parts do not add up"; cat "$T/out"; exit 1; }
# tiny model: 8 layers x top-4 of 16 experts x (gate + up [64, 64] + down [64, 64]) FP8 + 128x128 f32 scale
# blocks (one per matrix): 8 * 4 * 3 * (4096 + 4) bytes = 0.394 MB
[ "$(val bytes_experts)" = "0.394" ] || { echo "FAIL: bytes_experts"; cat "$T/out"; exit 1; }
grep -q "^bench frame: cpu backend" "$T/out" || { echo "FAIL: header"; cat "$T/out"; exit 1; }
# no codec in the directory (--codec none): the first chunk's decode says why it did not run
grep -q "^codec_first_chunk: not run (" "$T/out" || { echo "FAIL: codec_first_chunk line"; cat "$T/out"; exit 1; }
expect_usage() { # expect status $1 and the message naming the flag
    local rc_want=$1 want=$2; shift 2
    set +e; "$DRAMA_BIN" bench frame "$@" >/dev/null 2>"$T/err"; local rc=$?; set -e
    [ "$rc" = "$rc_want" ] && grep -q -- "$want" "$T/err" || { echo "FAIL: bench frame $* -> rc $rc"; cat "$T/err"; exit 1; }
}
expect_usage 2 "--model DIR is required" --frames 3
expect_usage 2 "--frames: invalid value '0'" --model "$T/m" --frames 0
expect_usage 2 "--backend" --model "$T/m" --backend tpu
expect_usage 2 "unknown option '--nope'" --model "$T/m" --nope 1
expect_usage 1 "$T/nothing" --model "$T/nothing" --backend cpu
echo "bench_frame: ok"
