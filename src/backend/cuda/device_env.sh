# device_env.sh - sourced by the device_*.sh scripts on the GPU machine: D = the carried folder (see
# device_carry.sh), O = the log folder ($OUT, default ./device-out), gpu.txt, and /tmp/drama-dev,
# which starts the carried `drama` with the machine's loader or, when that fails, the carried glibc.
D=$(cd "${1:-.devcarry}" && pwd)
O=${OUT:-device-out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$O/gpu.txt" 2>&1
uname -a >>"$O/gpu.txt"
export LD_LIBRARY_PATH=$D
PREFIX=()
if ! "$D/drama" --version >"$O/start.txt" 2>&1; then
    echo "carried binary does not start with the machine's loader: using the carried glibc" >>"$O/start.txt"
    PREFIX=("$D/glibc/ld-linux-x86-64.so.2" --library-path "$D:$D/glibc")
    "${PREFIX[@]}" "$D/drama" --version >>"$O/start.txt" 2>&1
fi
printf '#!/bin/sh\nexec %s "%s/drama" "$@"\n' "${PREFIX[*]:-}" "$D" >/tmp/drama-dev
chmod +x /tmp/drama-dev
cat "$O/start.txt"
