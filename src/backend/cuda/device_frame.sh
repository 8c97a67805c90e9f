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
# Usage: FORMATS="fp8 nvfp4" PARITY=nvfp4 CONTRACT=1 src/backend/cuda/device_frame.sh [DIR]
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
    save
fi
for F in ${FORMATS:-fp8}; do
    M=/dev/shm/m-$F
    t=$(date +%s%N)
    if ! /tmp/drama-dev make-model $M --shape full --experts $F --expert-fill direct --codec none --threads $T \
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
    else
        /tmp/drama-dev generate --model $M --rows $L/rows100.json --frames $FR --seed 11 --backend cuda \
            --codes-out $L/gen-$F.json 2>&1 | tail -1
    fi
    save
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
    rm -rf $M
done
save
