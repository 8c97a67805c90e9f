#!/usr/bin/env bash
# --low-memory: the backbone and tower are released before decoding, and the receipt shows it:
# the decode phase's peak resident set is far below the generate phase's (the weights are
# unmapped). Without --low-memory they stay resident. Same bytes either way.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"
[ -r /proc/self/clear_refs ] || { echo "no per-phase peak windows on this system"; exit 77; }
# Experts large enough (about 100 MB of weights) that their residency dominates the process.
"$DRAMA_BIN" make-model big --shape custom --hidden 128 --num-experts 64 --moe-inter 256 --seed 4 >/dev/null 2>mm.err \
    || fail "make-model: $(cat mm.err)"
T="Memory phases, measured."
"$DRAMA_BIN" synthesize --model big --text "$T" --frames 24 --seed 2 -q -o lm.wav --low-memory --receipt lm.json \
    || fail "low-memory run failed"
"$DRAMA_BIN" synthesize --model big --text "$T" --frames 24 --seed 2 -q -o rs.wav --receipt rs.json \
    || fail "resident run failed"
cmp lm.wav rs.wav || fail "--low-memory changed the audio"
g=$(jq .phases.generate.peak_rss_bytes lm.json); d=$(jq .phases.decode.peak_rss_bytes lm.json)
rg=$(jq .phases.generate.peak_rss_bytes rs.json); rd=$(jq .phases.decode.peak_rss_bytes rs.json)
echo "low-memory: generate peak $g, decode peak $d; resident: generate peak $rg, decode peak $rd"
[ "$d" -gt 0 ] && [ "$g" -gt 0 ] || fail "peaks not measured"
# Compare the drop with the weights' size (absolute RSS differs by build: ASan adds shadow memory).
w=$(cat big/model-*.safetensors | wc -c)
echo "weights $w bytes"
[ $((g - d)) -gt $((w / 2)) ] || fail "low-memory: decode peak $d is not at least half the weights ($w) below the generate peak $g"
[ $((rg - rd)) -lt $((w / 2)) ] || fail "without --low-memory the weights should stay resident while decoding ($rg -> $rd)"
ok "low-memory: decode peak $((d >> 20)) MiB vs generate peak $((g >> 20)) MiB (resident mode decodes at $((rd >> 20)) MiB)"
echo PASS
