#!/usr/bin/env bash
# A model folder with drama-manifest.json is verified before it is used (FORMATS.md 7):
# intact -> synthesize works; one changed byte in a shard -> synthesize and inspect fail
# naming the file, and nothing is published.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export XDG_CACHE_HOME="$T/cache"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
"$DRAMA_BIN" make-model "$T/m" --shape tiny --seed 4 > /dev/null || { echo "make-model failed"; exit 1; }
"$DRAMA_BIN" verify "$T/m" --write > /dev/null || bad "verify --write"
"$DRAMA_BIN" synthesize --model "$T/m" --text "Checked weights." --frames 3 --seed 1 -q -o "$T/ok.wav" || bad "intact model"
[ -f "$T/ok.wav" ] || bad "no output for the intact model"
shard=$(ls "$T"/m/model-*.safetensors | tail -n 1)
size=$(stat -c %s "$shard")
printf '\x5a' | dd of="$shard" bs=1 seek=$((size - 3)) conv=notrunc status=none
touch -d '2001-01-01' "$shard"   # same size, new mtime: the digest cache must not vouch for it
"$DRAMA_BIN" synthesize --model "$T/m" --text "Checked weights." --frames 3 --seed 1 -q -o "$T/bad.wav" 2> "$T/err"
rc=$?
[ $rc -ne 0 ] || bad "synthesize accepted a changed shard"
[ ! -e "$T/bad.wav" ] || bad "an output file was published"
grep -q "$(basename "$shard")" "$T/err" || bad "message does not name the shard: $(cat "$T/err")"
"$DRAMA_BIN" inspect "$T/m" > "$T/inspect.out" 2>&1 && bad "inspect called a changed model loadable"
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
