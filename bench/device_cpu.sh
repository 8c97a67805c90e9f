#!/bin/bash
# device_cpu.sh - the CPU figures of issue 17 on the GPU machine's host CPU (16 cores), from a
# `drama` built here and carried there (src/backend/cuda/device_carry.sh BUILD_DIR DIR makes DIR).
# Runs the read bandwidth and `drama bench decode` (q4 and fp8 experts) at 1, 2, 16 threads and
# the default (physical cores), then `drama bench codec` when the binary has it. Logs in $OUT
# (default ./device-out): cpu.txt (lscpu, commit), bench_*.txt; a summary on stdout.
# Usage, from the repository root: bench/device_cpu.sh [DIR] [LAYERS (default 12)]
set -u
. "$(dirname "$0")/../src/backend/cuda/device_env.sh"
L=${2:-12}
{ lscpu; nproc; /tmp/drama-dev --version; } >"$O/cpu.txt" 2>&1
grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|CPU max MHz)" "$O/cpu.txt"

for t in 1 2 16; do
    f="$O/bench_bandwidth_t$t.txt"
    timeout 120 /tmp/drama-dev bench bandwidth --threads "$t" >"$f" 2>&1
    echo "bandwidth threads=$t: $(awk '$1 == "read_bandwidth" { print $2, $3 }' "$f")"
done

for fmt in q4 fp8; do
    for t in 1 2 16 0; do
        f="$O/bench_decode_${fmt}_t$t.txt"
        timeout 500 /tmp/drama-dev bench decode --layers "$L" --experts "$fmt" --threads "$t" --steps 16 >"$f" 2>&1
        echo "rc=$?" >>"$f"
        echo "decode $fmt layers=$L threads=$t: $(awk '$1 == "step_mean" { s = $2 } $1 == "bandwidth" { b = $2 }
            $1 == "ratio_to_floor" { r = $2 } $1 ~ /^rc=/ { rc = $1 }
            END { printf "%s ms/step, %s GB/s read, ratio_to_floor %s, %s", s, b, r, rc }' "$f")"
    done
done

if /tmp/drama-dev bench --help 2>&1 | grep -q '^  codec '; then
    for t in 1 2 16; do
        f="$O/bench_codec_t$t.txt"
        timeout 500 /tmp/drama-dev bench codec --threads "$t" >"$f" 2>&1
        echo "rc=$?" >>"$f"
        echo "codec threads=$t: $(tail -n 2 "$f" | tr '\n' ' ')"
    done
else
    echo "codec: this drama has no 'bench codec' (not landed when it was built)"
fi
