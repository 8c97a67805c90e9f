#!/bin/bash
# device_prefill.sh - the prefill work (docs/cuda.md "Prefill") on the
# GPU machine, one call: `drama contract --only cuda --no-limits` (and the tensor-core entry's
# time), tests/e2e/backend_parity.sh on the goldens carried in DIR/golden (greedy frames = goldens /
# CPU, seeded runs = CPU), then for each format in $FORMATS (default "fp8 q4") a full-shape model
# in /dev/shm, `drama bench frame` (TTFA and its parts), for fp8 also with DRAMA_CUDA_TC=0 and
# DRAMA_CUDA_MOE_GROUPED=0 and a per-op profile of the prefill ($EXTRAS picks), and for $PARITY
# (default q4; "none": no format) CUDA vs CPU logits/hidden over 16 steps and 16 seeded frames' codes.
# If the contract fails an entry of the new paths, the rest runs with that path off (said so;
# KEEP_PATHS=1 keeps them on).
# Usage: src/backend/cuda/device_prefill.sh DIR   (DIR from device_carry.sh + golden/ + this script)
set -u
H=$(cd "$(dirname "$0")" && pwd)
. "$H/device_env.sh"
L=/tmp/devlog # logs (only logs.tgz and the env's two files go to $OUT: at most 8 files come back)
mkdir -p $L
T=${THREADS:-16}
FR=${FRAMES:-48}
[ -x "$D/jq" ] && export PATH="$D:$PATH"
save() { tar czf $O/logs.tgz -C /tmp devlog 2>/dev/null; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
t=$(date +%s%N)
timeout 200 /tmp/drama-dev contract --only "${CONTRACT_ONLY:-cuda}" --no-limits >$L/contract.txt 2>&1 # a glob selects fewer
echo "contract rc=$? $(ms_since $t) ms"
grep -E "^(SUMMARY|FAIL|MISSED|NOT RUN)" $L/contract.txt | head -20
grep -E "gemm_tc|moe\." $L/contract.txt | head -24
if [ -z "${KEEP_PATHS:-}" ] && grep -E "^FAIL" $L/contract.txt | grep -q gemm_tc; then export DRAMA_CUDA_TC=0; echo "gemm_tc failed: DRAMA_CUDA_TC=0 from here"; fi
if [ -z "${KEEP_PATHS:-}" ] && grep -E "^FAIL" $L/contract.txt | grep -q "moe\."; then export DRAMA_CUDA_MOE_GROUPED=0; echo "moe failed: grouped off from here"; fi
save
timeout 60 /tmp/drama-dev contract --only 'cuda/gemm_tc*' >$L/contract_time.txt 2>&1
grep -iE "gemm_tc|ms" $L/contract_time.txt | head -6
if [ -d "$D/golden" ]; then
    t=$(date +%s%N)
    DRAMA_BIN=/tmp/drama-dev DRAMA_GOLDEN=$D/golden DRAMA_TEST_BACKEND=cuda timeout 150 bash tests/e2e/backend_parity.sh \
        >$L/parity_golden.txt 2>&1
    echo "backend_parity rc=$? $(ms_since $t) ms"
    tail -n 6 $L/parity_golden.txt
    save
fi
bench() { # label, "VAR=value ...", then bench frame's options
    local lab=$1 envs=$2; shift 2
    env $envs /tmp/drama-dev bench frame --backend cuda --model $M --prompt-rows 100 "$@" >$L/bench-$lab.txt 2>$L/bench-$lab.err
    local rc=$?
    save
    echo "-- bench $lab rc=$rc: $(grep -E '^ *(ms_per_frame|ttfa_prompt |ttfa_prompt_prefill|ttfa_cached)' $L/bench-$lab.txt | awk '{printf "%s %s; ", $1, $2}')"
}
for F in ${FORMATS:-fp8 q4}; do
    M=/dev/shm/m-$F
    t=$(date +%s%N)
    if ! timeout 120 /tmp/drama-dev make-model $M --shape full --experts $F --expert-fill direct --codec none --threads $T \
        >$L/make-$F.txt 2>&1; then
        echo "make-model $F failed: $(tail -2 $L/make-$F.txt)"; rm -rf $M; continue
    fi
    echo "== $F: make-model $(ms_since $t) ms"
    python3 "$H/device_rows.py" $M $L >/dev/null
    bench $F DRAMA_BENCH=1 --frames $FR
    cat $L/bench-$F.txt
    if [ "$F" = fp8 ]; then # $EXTRAS: which of the comparison runs (default all three)
        [[ " ${EXTRAS:-tc0 grp0 prof} " == *" tc0 "* ]] && bench $F-tc0 DRAMA_CUDA_TC=0 --frames 8 --warmup 1
        [[ " ${EXTRAS:-tc0 grp0 prof} " == *" grp0 "* ]] && bench $F-grp0 DRAMA_CUDA_MOE_GROUPED=0 --frames 8 --warmup 1
        if [[ " ${EXTRAS:-tc0 grp0 prof} " == *" prof "* ]]; then
            bench $F-prof DRAMA_CUDA_PROFILE=1 --frames 4 --warmup 1
            grep -A20 "outside regions" $L/bench-$F-prof.err | head -18
        fi
    fi
    if [[ " ${PARITY:-q4} " == *" $F "* ]]; then
        for b in cuda cpu; do
            timeout 120 /tmp/drama-dev forward --model $M --rows $L/rows16.json --backend $b --threads $T --dump /tmp/fwd-$F-$b.st \
                >$L/fwd-$F-$b.txt 2>&1 || { echo "forward $b failed"; tail -2 $L/fwd-$F-$b.txt; }
            timeout 120 /tmp/drama-dev generate --model $M --rows $L/rows16.json --frames 16 --seed 5 --backend $b --threads $T \
                --codes-out $L/codes-$F-$b.json >$L/gen16-$F-$b.txt 2>&1 || { echo "generate $b failed"; tail -2 $L/gen16-$F-$b.txt; }
        done
        echo "-- $F CUDA vs CPU, backbone over 16 steps (8 prefill + 8 decode rows):"
        python3 "$H/device_cmp.py" /tmp/fwd-$F-cuda.st /tmp/fwd-$F-cpu.st | cut -c1-200
        if cmp -s $L/codes-$F-cuda.json $L/codes-$F-cpu.json; then echo "-- $F: 16 seeded frames, CUDA codes == CPU codes"
        else echo "-- $F: 16 seeded frames, CUDA codes DIFFER from CPU codes"; fi
        rm -f /tmp/fwd-$F-*.st
        save
    fi
    rm -rf $M
done
save
