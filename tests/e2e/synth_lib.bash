# synth_lib.bash - shared helpers of the tests/e2e/synth_*.sh tests (sourced, not a test itself).
# Needs $DRAMA_BIN (the CLI) and $DRAMA_GOLDEN; makes a tiny random model once per test run.
set -u
: "${DRAMA_BIN:?DRAMA_BIN must point to the drama binary}"
: "${DRAMA_GOLDEN:=$(dirname "$0")/../../../shared/golden}"

WORK=$(mktemp -d /tmp/drama-e2e-synth.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

# The tiny model: `drama make-model` (the documented path); a copy of the golden tiny model when
# make-model is not usable in this build.
MODEL="$WORK/model"
if ! "$DRAMA_BIN" make-model "$MODEL" --shape tiny --seed 1 >"$WORK/make-model.log" 2>&1; then
    echo "note: make-model failed ($(tail -1 "$WORK/make-model.log")); using golden tiny-drama3" >&2
    rm -rf "$MODEL"
    cp -a "$DRAMA_GOLDEN/tiny-drama3" "$MODEL" || fail "cannot copy golden tiny-drama3"
fi
export DRAMA_CACHE_DIR="$WORK/cache"   # receipts' hash cache stays inside the test

TEXT="Hello there. This is a test."

# synth OUT [flags...]: runs synthesize on the tiny model, quiet; status in $rc.
synth() {
    local out=$1; shift
    set +e
    "$DRAMA_BIN" synthesize --model "$MODEL" --text "$TEXT" -q -o "$out" "$@" 2>"$WORK/last.err"
    rc=$?
    set -e
}

# no_leftovers DIR: no temporary output file left in DIR.
no_leftovers() {
    local left
    left=$(find "$1" -maxdepth 1 -name '*.tmp.*' | head -1)
    [ -z "$left" ] || fail "temporary file left behind: $left"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# wait_frames PID N LOG: waits (at most 60 s) until the progress events in LOG report frame N of
# the synthesize running as PID (held there by DRAMA_TEST_PAUSE_AFTER_FRAMES); kills it and fails if not.
wait_frames() {
    local pid=$1 n=$2 log=$3
    for _ in $(seq 1 600); do
        grep -q "\"frames\":$n" "$log" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    grep -q "\"frames\":$n" "$log" || { kill -KILL "$pid" 2>/dev/null; fail "no frame $n: $(tail -3 "$log")"; }
}
