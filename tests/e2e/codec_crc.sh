#!/usr/bin/env bash
# codec.pth integrity: one flipped byte inside a stored tensor of a copy of the tiny model's
# codec.pth makes `drama inspect` report the model unloadable and `drama synthesize` fail before
# generation, both naming the zip member; nothing is published. The golden files are only read.
set -euo pipefail
: "${DRAMA_BIN:?DRAMA_BIN must point to the drama binary}"
: "${DRAMA_GOLDEN:=$(dirname "$0")/../../../shared/golden}"
WORK=$(mktemp -d /tmp/drama-e2e-crc.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
M="$WORK/model"
cp -rL "$DRAMA_GOLDEN/tiny-drama3" "$M" || { echo "no golden tiny-drama3; skipped"; exit 77; }
chmod -R u+w "$M"
"$DRAMA_BIN" synthesize --model "$M" --text "Hello." --frames 2 --seed 1 -q -o "$WORK/ok.wav" ||
    fail "the unmodified copy does not synthesize"
ok "unmodified copy synthesizes"

# member codec/data/191 is a 32768-byte codebook; its data begins after the local header's name
# and an alignment extra field (< 100 bytes), so name + 1000 lies inside it
member=codec/data/191
at=$(LC_ALL=C grep -obUa "$member" "$M/codec.pth" | head -1 | cut -d: -f1)
[ -n "$at" ] || fail "no $member in codec.pth"
off=$((at + ${#member} + 1000))
byte=$(od -A n -t u1 -j $off -N 1 "$M/codec.pth" | tr -d ' ')
printf "\\x$(printf %02x $((byte ^ 255)))" | dd of="$M/codec.pth" bs=1 seek=$off conv=notrunc status=none

set +e
"$DRAMA_BIN" inspect "$M" > "$WORK/inspect.out" 2>&1
r=$?
set -e
[ $r -eq 1 ] || fail "inspect: exit $r, expected 1"
grep -q "'$member'.*CRC-32" "$WORK/inspect.out" || fail "inspect does not name the member: $(grep -i crc "$WORK/inspect.out")"
ok "inspect: $(grep -o "zip member '$member'[^.]*" "$WORK/inspect.out" | head -1)"

set +e
"$DRAMA_BIN" synthesize --model "$M" --text "Hello." --frames 2 --seed 1 -o "$WORK/bad.wav" --progress-json 2> "$WORK/err"
r=$?
set -e
[ $r -eq 1 ] || fail "synthesize: exit $r, expected 1"
[ ! -e "$WORK/bad.wav" ] || fail "synthesize published output"
grep -q "'$member'.*CRC-32" "$WORK/err" || fail "synthesize does not name the member: $(tail -1 "$WORK/err")"
if grep -q '"phase":"generate"' "$WORK/err"; then fail "generation started"; fi
ok "synthesize: $(grep -v '^{' "$WORK/err" | tail -1)"
echo PASS
