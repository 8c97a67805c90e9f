#!/bin/bash
# device_frame.sh - the frame step at full shape on the GPU machine, one call: for each expert
# format in $FORMATS (fp8 nvfp4 q4), a full-shape model made in /dev/shm (make-model --expert-fill
# direct: random stored codes), a per-op profile (DRAMA_CUDA_GRAPHS=0 DRAMA_CUDA_PROFILE=1, 32
# frames, with $PROFILE), `drama bench frame` on CUDA (graphs), and for the formats in $PARITY the backbone's
# logits and hidden on CUDA vs CPU over 16 steps (8 prefill + 8 decode rows) and 16 seeded frames'
# codes on both; the model is deleted before the next format. $CONTRACT=1 first runs
# `drama contract --only cuda --no-limits`. Binaries come from device_carry.sh in DIR.
# Logs: $OUT/logs.tgz (refreshed after every stage); summaries on stdout.
# $PROFILE=1: the per-op profile; $NCU="fp8": per-kernel times (ncu) of the listed formats.
# $SWITCHES: kernel switches that are off by default (docs/cuda.md "Not yet run on a GPU"), each
# VAR=value[,VAR=value...]; `drama bench frame` runs once more per entry, and (with $SWPARITY=1) the
# backbone's logits / hidden and 16 seeded frames' codes with all of them on must equal the default
# run's byte for byte (the variants are bit-identical by design). With $SWITCHES, $CONTRACT also
# times the n = 1 products (`contract --only 'cuda/matmul*'`) and `bench_cuda_matmul` runs (and
# with DRAMA_CUDA_XT=0 among $SWITCHES, once more with it); $SASS=1 counts the n = 1 and MoE decode
# kernels' load instructions (cuobjdump).
# $KEEP=1 leaves the last model in /dev/shm/m-FORMAT (the caller deletes it). $CODEC=1 makes the models
# with the real-size random codec, so `bench frame` also times the first chunk of audio.
# Usage: FORMATS="fp8 nvfp4" PARITY=nvfp4 CONTRACT=1 src/backend/cuda/device_frame.sh [DIR]
# The switches in one call (< 300 s): CONTRACT=1 SASS=1 FORMATS=fp8 FRAMES=64 SWPARITY=1
#   SWITCHES="DRAMA_CUDA_MOE_DOWN=lean" src/backend/cuda/device_frame.sh DIR
# The activation layout (DRAMA_CUDA_XT, default 1 = chunk-transposed) against the old one:
#   CONTRACT=1 SASS=1 FORMATS="fp8 nvfp4" FRAMES=64 SWPARITY=1 SWITCHES="DRAMA_CUDA_XT=0" src/backend/cuda/device_frame.sh DIR
set -u
H=$(cd "$(dirname "$0")" && pwd)
. "$H/device_env.sh"
L=/tmp/devlog
mkdir -p $L
T=${THREADS:-16}
FR=${FRAMES:-128}
save() { cp "$O"/*.txt $L/ 2>/dev/null; tar czf "$O/logs.tgz" -C /tmp devlog 2>/dev/null; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

if [ -n "${CONTRACT:-}" ]; then
    /tmp/drama-dev contract --only cuda --no-limits >$L/contract.txt 2>&1
    echo "contract rc=$?"
    grep -E "^(SUMMARY|FAIL|MISSED|NOT RUN)" $L/contract.txt | head -20
    grep -E "us|ms" $L/contract.txt | grep -iE "sample|time" | head -8
    if [ -n "${SWITCHES:-}" ]; then # the n = 1 products timed, [2048, 2048]
        /tmp/drama-dev contract --only 'cuda/matmul*' >$L/contract-mm.txt 2>&1
        grep -oE "^(PASS|FAIL) +matmul[a-z_]*\.[a-z0-9_]+|time=[0-9.]+ms" $L/contract-mm.txt | paste - - | column -t
        # n = 1 products on the model's shapes, weights beyond the L2
        [ -x "$D/bench_cuda_matmul" ] && "${PREFIX[@]}" "$D/bench_cuda_matmul" 9 >$L/bench-mm-default.txt 2>&1 &&
            { echo "-- bench_cuda_matmul"; cat $L/bench-mm-default.txt; }
        if [[ "$SWITCHES" == *DRAMA_CUDA_XT=0* ]] && [ -x "$D/bench_cuda_matmul" ]; then # x staged plain (default: transposed)
            DRAMA_CUDA_XT=0 "${PREFIX[@]}" "$D/bench_cuda_matmul" 9 >$L/bench-mm-xt0.txt 2>&1 &&
                { echo "-- bench_cuda_matmul, DRAMA_CUDA_XT=0"; cat $L/bench-mm-xt0.txt; }
        fi
    fi
    save
fi
if [ -n "${SASS:-}" ] && ! command -v cuobjdump >/dev/null; then echo "SASS: no cuobjdump on this machine"; fi
if [ -n "${SASS:-}" ] && command -v cuobjdump >/dev/null; then # the kernels' loads: LDS.128, LDG.E.128
    cuobjdump -sass "$D/drama" 2>/dev/null | awk '/Function : /{f=$3} f ~ /matvec1_kernel|moe_down|gate_up_decode/ {
        if ($0 ~ /LDS\.128/) l[f]++; if ($0 ~ /LDG\.E\.128/) g[f]++; n[f]=1 }
        END { for (f in n) printf "%-60s LDS.128 %d LDG.E.128 %d\n", f, l[f], g[f] }' | sort | tee $L/sass.txt
    cuobjdump -res-usage "$D/drama" 2>/dev/null | grep -A1 -E "matvec1?_?kernel|moe_down|gate_up_decode" | grep -oE "Function [^:]+|REG:[0-9]+|SHARED:[0-9]+" |
        paste - - - | tee $L/regs.txt
    save
fi
for F in ${FORMATS:-fp8}; do
    M=/dev/shm/m-$F
    t=$(date +%s%N)
    CX=(--codec none); [ -n "${CODEC:-}" ] && CX=() # CODEC=1: the real-size random codec too (ttfa_cached_voice_audio)
    if ! /tmp/drama-dev make-model $M --shape full --experts $F --expert-fill direct "${CX[@]}" --threads $T \
        >$L/make-$F.txt 2>&1; then
        echo "make-model $F failed:"
        tail -3 $L/make-$F.txt
        rm -rf $M
        continue
    fi
    echo "== $F: make-model $(ms_since $t) ms, $(du -sh $M | cut -f1)"
    python3 "$H/device_rows.py" $M $L
    t=$(date +%s%N)
    [ -n "${PROFILE:-}" ] && DRAMA_CUDA_GRAPHS=0 DRAMA_CUDA_PROFILE=1 /tmp/drama-dev generate --model $M --rows $L/rows100.json --frames 32 \
        --seed 11 --backend cuda --codes-out $L/prof-$F.json >$L/profile-$F.txt 2>&1
    [ -n "${PROFILE:-}" ] && { echo "profile run $(ms_since $t) ms"; grep -E "ms/frame|profile" $L/profile-$F.txt; }
    if [[ " ${NCU:-} " == *" $F "* ]]; then # per-kernel device times of 2 direct frame steps
        timeout 200 env DRAMA_CUDA_GRAPHS=0 ncu --clock-control none --launch-skip 3000 --launch-count 700 \
            --metrics gpu__time_duration.sum --csv /tmp/drama-dev generate --model $M --rows $L/rows100.json \
            --frames 16 --seed 11 --backend cuda --codes-out $L/ncu-$F.json >$L/ncu-$F.csv 2>$L/ncu-$F.err
        echo "ncu rc=$?"
        python3 "$H/device_ncu.py" $L/ncu-$F.csv | tee $L/ncu-$F-summary.txt
    fi
    save
    if /tmp/drama-dev bench frame --help >/dev/null 2>&1; then
        /tmp/drama-dev bench frame --backend cuda --model $M --frames $FR --prompt-rows 100 >$L/bench-$F.txt 2>&1
        echo "bench frame rc=$?"
        cat $L/bench-$F.txt | tail -30
        for S in ${SWITCHES:-}; do # the off-by-default kernels, one switch set per run
            env ${S//,/ } /tmp/drama-dev bench frame --backend cuda --model $M --frames $FR --prompt-rows 100 \
                >$L/bench-$F-$S.txt 2>&1
            echo "== $F with $S: bench frame rc=$?"
            grep -E "ms_per_frame|achieved|ratio_to_floor|ttfa" $L/bench-$F-$S.txt
            save
        done
    else
        /tmp/drama-dev generate --model $M --rows $L/rows100.json --frames $FR --seed 11 --backend cuda \
            --codes-out $L/gen-$F.json 2>&1 | tail -1
    fi
    save
    if [ -n "${SWPARITY:-}" ] && [ -n "${SWITCHES:-}" ]; then # all switches on == all off, byte for byte
        ALL=$(echo ${SWITCHES} | tr ' ,' '\n\n' | awk -F= '{v[$1]=$0} END {for (k in v) printf "%s ", v[k]}')
        for on in 0 1; do
            e=(); [ $on = 1 ] && e=($ALL)
            env "${e[@]}" /tmp/drama-dev forward --model $M --rows $L/rows16.json --backend cuda --dump $L/sw-$F-$on.st \
                >$L/sw-fwd-$F-$on.txt 2>&1 || { echo "forward (switches $on) failed"; tail -2 $L/sw-fwd-$F-$on.txt; }
            env "${e[@]}" /tmp/drama-dev generate --model $M --rows $L/rows16.json --frames 16 --seed 5 --backend cuda \
                --codes-out $L/sw-codes-$F-$on.json >$L/sw-gen-$F-$on.txt 2>&1 || echo "generate (switches $on) failed"
        done
        cmp -s $L/sw-$F-0.st $L/sw-$F-1.st && echo "-- $F: forward with [$ALL] == default, byte for byte" ||
            { echo "-- $F: forward with [$ALL] DIFFERS from default"; python3 "$H/device_cmp.py" $L/sw-$F-1.st $L/sw-$F-0.st; }
        cmp -s $L/sw-codes-$F-0.json $L/sw-codes-$F-1.json && echo "-- $F: 16 seeded frames, codes equal" ||
            echo "-- $F: 16 seeded frames, codes DIFFER"
        rm -f $L/sw-$F-*.st
        save
    fi
    if [[ " ${PARITY:-} " == *" $F "* ]]; then
        for b in cuda cpu; do
            /tmp/drama-dev forward --model $M --rows $L/rows16.json --backend $b --threads $T --dump $L/fwd-$F-$b.st \
                >$L/fwd-$F-$b.txt 2>&1 || { echo "forward $b failed"; tail -2 $L/fwd-$F-$b.txt; }
            /tmp/drama-dev generate --model $M --rows $L/rows16.json --frames 16 --seed 5 --backend $b --threads $T \
                --codes-out $L/codes-$F-$b.json >$L/gen16-$F-$b.txt 2>&1 || { echo "generate $b failed"; tail -2 $L/gen16-$F-$b.txt; }
        done
        echo "-- $F CUDA vs CPU, backbone over 16 steps:"
        python3 "$H/device_cmp.py" $L/fwd-$F-cuda.st $L/fwd-$F-cpu.st
        if cmp -s $L/codes-$F-cuda.json $L/codes-$F-cpu.json; then echo "-- $F: 16 seeded frames, CUDA codes == CPU codes"
        else echo "-- $F: 16 seeded frames, CUDA codes DIFFER from CPU codes"; fi
        rm -f $L/fwd-$F-*.st
        save
    fi
    [ -n "${KEEP:-}" ] || rm -rf $M # KEEP=1: the model stays in /dev/shm for the caller's own runs
done
save
