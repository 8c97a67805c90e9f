#!/bin/bash
# device_cpu.sh - the CPU figures of issue 17 on the GPU machine's host CPU (16 cores), from a
# `drama` built here and carried there (src/backend/cuda/device_carry.sh BUILD_DIR DIR makes DIR;
# also copy BUILD_DIR/bench/bench_matmul and bench_prefill into DIR for the matmul and prefill rows).
# Runs: the read bandwidth at 1, 2, 16 threads; bench_matmul n = 1 [2048,2048] for every stored
# format on the avx2 and avx512 loops (DRAMA_CPU_PATH) at 1, 2, 16 threads, GB/s and % of the
# read bandwidth measured in the same run (issue 17: >= 80%), and at 16 threads again with the pool's
# grain growing past 2 threads (DRAMA_POOL_CLAIM_THREADS=2 and 4, rows claim=; default 0); `drama bench decode --layers L` with
# q4 experts at 1, 2, 16 threads, q4 at 16 threads on the AVX2 loops, fp8 at 16;
# `drama bench codec` at 16, 8 and 1 threads and the AVX2 path at 16, with the whole decode by stage
# (issue 17: why 16 cores scale poorly), when the binary has it. Each command has a timeout (the
# matmul + decode part took about 4.5 minutes on the loaded 2-core dev VM, 16-thread rows included;
# the decode builds dominate); prefill (issue 17): bench_prefill at 16 threads (n > 1 block kernels vs
# the old tiles, DeltaNet chunked vs row by row) and `drama bench decode --prefill 256` row by row and
# chunked, about 1 minute more. Logs in $OUT (default ./device-out):
# cpu.txt (lscpu, commit), bench_*.txt; a summary on stdout.
# Usage, from the repository root: bench/device_cpu.sh [DIR] [LAYERS (default 4)]
set -u
. "$(dirname "$0")/../src/backend/cuda/device_env.sh"
L=${2:-4}
{ lscpu; nproc; /tmp/drama-dev --version; } >"$O/cpu.txt" 2>&1
grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|CPU max MHz|Flags)" "$O/cpu.txt" | cut -c1-200
grep -o 'avx512[a-z_0-9]*' "$O/cpu.txt" | sort -u | tr '\n' ' '; echo

for t in 1 2 16; do
    f="$O/bench_bandwidth_t$t.txt"
    timeout 60 /tmp/drama-dev bench bandwidth --threads "$t" >"$f" 2>&1
    echo "bandwidth threads=$t: $(awk '$1 == "read_bandwidth" { print $2, $3 }' "$f")"
done

if [ -x "$D/bench_matmul" ]; then
    printf '#!/bin/sh\nexec %s "%s/bench_matmul" "$@"\n' "${PREFIX[*]:-}" "$D" >/tmp/bench-matmul-dev
    chmod +x /tmp/bench-matmul-dev
    # t16c2 / t16c4: 16 threads with the pool's grain growing past 2 threads (DRAMA_POOL_CLAIM_THREADS=2, 4; default 0)
    for p in avx2 avx512; do
        for t in 1 2 16 16c2 16c4; do
            f="$O/bench_matmul_${p}_t$t.txt"
            c=0; case $t in *c*) c=${t#*c} ;; esac
            DRAMA_POOL_CLAIM_THREADS=$c DRAMA_CPU_PATH=$p timeout 60 /tmp/bench-matmul-dev --threads "${t%c*}" --n 1 --shape 2048x2048 --min-ms 30 >"$f" 2>&1
            echo "rc=$?" >>"$f"
            echo "matmul n=1 [2048,2048] claim=$c $(head -n 1 "$f" | awk '{ print $3, $4 }') $(awk '/1 GiB/ { print "read", $(NF-1), "GB/s:" }
                NF == 8 && $3 == 1 { printf " %s %s GB/s %s;", $1, $6, $8 } /^rc=/ { print " " $1 }' "$f" | tr -d '\n')"
        done
    done
else
    echo "matmul: no bench_matmul in $D (cp BUILD_DIR/bench/bench_matmul $D/)"
fi

run_decode() { # fmt threads tag [env]
    f="$O/bench_decode_${1}_t$2$3.txt"
    env ${4:-} timeout 120 /tmp/drama-dev bench decode --layers "$L" --experts "$1" --threads "$2" --steps 16 >"$f" 2>&1
    echo "rc=$?" >>"$f"
    echo "decode $1 layers=$L threads=$2 $3: $(awk '$1 == "step_mean" { s = $2 } $1 == "bandwidth" { b = $2 }
        $1 == "ratio_to_floor" { r = $2 } $1 ~ /^rc=/ { rc = $1 }
        END { printf "%s ms/step, %s GB/s read, ratio_to_floor %s, %s", s, b, r, rc }' "$f")"
}
for t in 1 2 16; do run_decode q4 "$t" ""; done
run_decode q4 16 _avx2 DRAMA_CPU_PATH=avx2
run_decode fp8 16 ""

if [ -x "$D/bench_prefill" ]; then
    printf '#!/bin/sh\nexec %s "%s/bench_prefill" "$@"\n' "${PREFIX[*]:-}" "$D" >/tmp/bench-prefill-dev
    chmod +x /tmp/bench-prefill-dev
    f="$O/bench_prefill_t16.txt"
    timeout 90 /tmp/bench-prefill-dev --threads 16 --reps 3 >"$f" 2>&1
    echo "rc=$?" >>"$f"
    echo "prefill products threads=16: $(awk '/^gemm/ { printf "%s %s:", $2, $4 } $1 ~ /^(dot_rows_tiles|block_avx2|block_avx512)$/ { printf " %s %s", $1, $2 }
        $1 == "chunked_16_speedup" { printf " deltanet chunked (16-row blocks) x%s", $2 } /^rc=/ { print " " $1 }' "$f" | tr -d '\n')"
    echo
else
    echo "prefill: no bench_prefill in $D (cp BUILD_DIR/bench/bench_prefill $D/)"
fi
for c in --deltanet-recurrent --deltanet-chunked; do
    f="$O/bench_prefill_decode_t16${c#--deltanet}.txt"
    timeout 120 /tmp/drama-dev bench decode --layers "$L" --experts q4 --threads 16 --steps 2 --context 1 --prefill 256 $c >"$f" 2>&1
    echo "rc=$?" >>"$f"
    echo "prefill 256 rows layers=$L q4 threads=16 ${c#--deltanet-}: $(awk '$1 == "prefill_rows_per_s" { print $2, "rows/s" }
        /^rc=/ { print $1 }' "$f" | tr '\n' ' ')"
done

if /tmp/drama-dev bench --help 2>&1 | grep -q '^  codec '; then
    # issue 17: scaling (1, 8, 16 threads), the AVX2 path at 16, and where the time goes by stage
    run_codec() { # threads frames tag extra-args [env]
        f="$O/bench_codec_t$1$3.txt"
        env ${5:-} timeout 60 /tmp/drama-dev bench codec --threads "$1" --frames "$2" $4 >"$f" 2>&1
        echo "rc=$?" >>"$f"
        echo "codec threads=$1 frames=$2 $3: $(grep -E '^  clock ' "$f")"
        grep -E '^  (peak|mode|decode whole|decode stream|encode)( |,)' "$f"
        grep -E '^rc=|^ratio_to_floor' "$f" | tr '\n' ' '
        echo
    }
    run_codec 16 32 "" ""
    grep -E '^    ' "$O/bench_codec_t16.txt"   # the whole decode by stage at 16 threads
    run_codec 8 32 "" "--no-encode"
    run_codec 16 32 _avx2 "--no-encode" DRAMA_CODEC_ISA=avx2
    run_codec 1 16 "" "--no-encode"
    grep -E '^    ' "$O/bench_codec_t1.txt"    # ... and at 1 thread: the stages that do not scale
else
    echo "codec: this drama has no 'bench codec' (not landed when it was built)"
fi
