#!/bin/bash
# device_carry.sh - fill a folder with what the GPU machine needs to run binaries built here: the
# programs (stripped of debug info), the shared libraries `ldd` names (the GPU image lacks jansson,
# pcre2, sndfile, ...), glibc's libc/libm/loader in DIR/glibc (used only when the machine's own
# loader cannot start them, see device_contract.sh) and the golden format fixtures.
# Usage: src/backend/cuda/device_carry.sh BUILD_DIR CARRY_DIR [GOLDEN_DIR]
set -euo pipefail
B=$1
D=$2
G=${3:-../shared/golden}
mkdir -p "$D/glibc" "$D/ref"
for f in drama tests/test_cuda_matmul bench/bench_cuda_matmul; do
  [ -x "$B/$f" ] || continue
  strip --strip-debug -o "$D/$(basename "$f")" "$B/$f"
  ldd "$B/$f" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*) cp -L "$lib" "$D/glibc/" ;;
      *) cp -L "$lib" "$D/" ;;
    esac
  done
done
cp -L /lib64/ld-linux-x86-64.so.2 "$D/glibc/"
[ -f "$G/ref/quant-units.safetensors" ] && cp -L "$G/ref/quant-units.safetensors" "$D/ref/"
du -sh "$D"
