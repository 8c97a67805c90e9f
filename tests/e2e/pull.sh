#!/usr/bin/env bash
# drama pull against the test hub (tests/tools/hubd.c, 127.0.0.1 only): the tiny model (as a repo
# with a subfolder, LFS files redirected to a second listener, the tree in pages of 3) is pulled
# into the store and synthesizes; a branch is recorded as its commit; the --allow-latest rule; the
# token goes to the hub as Bearer and nowhere else (not the CDN, output, receipt, manifest); a
# rerun downloads nothing; corrupted, cut, lying, refused and unreachable transfers fail naming the
# file with nothing put in place, and the resumable ones complete on a rerun with a Range request.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 77; }
[ -n "${DRAMA_TEST_HUBD:-}" ] && [ -x "$DRAMA_TEST_HUBD" ] || { echo "DRAMA_TEST_HUBD not set"; exit 77; }
[ -n "${DRAMA_GOLDEN:-}" ] && [ -d "$DRAMA_GOLDEN/tiny-drama3" ] || { echo "DRAMA_GOLDEN not set"; exit 77; }
T=$(mktemp -d)
HUB_PIDS=()
cleanup() {
    for p in "${HUB_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
export XDG_DATA_HOME="$T/data" DRAMA_CACHE_DIR="$T/cache" DRAMA_NO_PROGRESS=1
unset HF_TOKEN HF_ENDPOINT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
TOKEN="hf_test_$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
STORE="$T/data/drama/models/org/tiny"
SHARD1=model-00001-of-00002.safetensors
SHARD2=model-00002-of-00002.safetensors

mkdir -p "$T/repo/extra"
cp -L "$DRAMA_GOLDEN"/tiny-drama3/* "$T/repo/"
printf 'notes in a subfolder\n' > "$T/repo/extra/notes.txt"

# start_hub NAME [hubd options]: sets EP (endpoint), COMMIT, LOG; the hub exits by itself in 300 s
start_hub() {
    local name=$1
    shift
    LOG="$T/$name.log"
    "$DRAMA_TEST_HUBD" --dir "$T/repo" --repo org/tiny --tag v1 --page-size 3 --lfs-min 65536 --token "$TOKEN" \
        --log "$LOG" --port-file "$T/$name.port" --max-seconds 300 "$@" 2> "$T/$name.hubd.err" &
    HUB_PIDS+=($!)
    for _ in $(seq 1 100); do [ -s "$T/$name.port" ] && break; sleep 0.05; done
    local port cdn
    read -r port cdn COMMIT < "$T/$name.port" || { echo "hub $name did not start: $(cat "$T/$name.hubd.err")"; exit 1; }
    EP="http://127.0.0.1:$port"
}
pull() { HF_TOKEN="$TOKEN" "$DRAMA_BIN" pull --endpoint "$EP" --retry-wait 0.01 "$@"; }
no_token_in() { for f in "$@"; do grep -qF "$TOKEN" "$f" && bad "the token appears in $f"; done; return 0; }
same_as_source() { # DIR: every repo file is there, byte for byte
    for f in $(cd "$T/repo" && find . -type f | sed 's|^\./||'); do
        cmp -s "$T/repo/$f" "$1/$f" || bad "$1/$f differs from the repo's"
    done
}

# ---- pinned by default; a branch or tag with --allow-latest is recorded as its commit ----
start_hub main
pull org/tiny > "$T/unpinned.out" 2>&1 && bad "an unpinned pull (no revision) was accepted"
grep -q "is a branch or tag.*now commit $COMMIT.*--allow-latest" "$T/unpinned.out" || bad "unpinned: $(cat "$T/unpinned.out")"
pull org/tiny@v1 > "$T/tag.out" 2>&1 && bad "an unpinned pull of a tag was accepted"
[ -e "$STORE" ] && bad "a refused pull left $STORE"
pull org/tiny@main --allow-latest > "$T/main.out" 2> "$T/main.err" || bad "pull @main --allow-latest: $(cat "$T/main.err")"
D="$STORE/$COMMIT"
[ "$(cat "$T/main.out")" = "$D" ] || bad "stdout is not the store folder: $(cat "$T/main.out")"
same_as_source "$D"
[ -d "$D/.partial" ] && bad ".partial left after a complete pull"
[ "$(cat "$STORE/refs/main" 2>/dev/null)" = "$COMMIT" ] || bad "refs/main does not record the commit"
grep -q "\"revision\": \"main\"" "$D/drama-pull.json" && grep -q "\"commit\": \"$COMMIT\"" "$D/drama-pull.json" \
    || bad "the receipt does not record main as $COMMIT"
for f in "$D"/*.safetensors "$D/codec.pth" "$D/config.json" "$D/extra/notes.txt"; do
    grep -q "$(sha256sum "$f" | cut -c1-64)" "$D/drama-pull.json" || bad "receipt: no sha256sum of $f"
done
"$DRAMA_BIN" verify "$D" --reverify > "$T/verify.out" 2>&1 || bad "drama verify of the pull: $(tail -3 "$T/verify.out")"
grep -q '^10 ok, 0 failed' "$T/verify.out" || bad "verify: $(tail -1 "$T/verify.out")"
grep -q "cursor=9" "$LOG" || bad "the tree's last page (cursor=9) was never requested"
grep -q "^cdn GET /cdn-lfs/.* auth=none" "$LOG" || bad "LFS files did not come from the CDN listener"
grep -q "^cdn .*auth=present" "$LOG" && bad "the Authorization header reached the CDN (another host)"
grep "^hub " "$LOG" | grep -qv "auth=ok" && bad "a hub request without the Bearer token"
no_token_in "$T/main.out" "$T/main.err" "$D/drama-pull.json" "$D/drama-manifest.json" "$T/unpinned.out"
echo "pulled @main as $COMMIT: $(grep -c '^hub GET .*/resolve/' "$LOG") resolves, $(grep -c '^cdn ' "$LOG") CDN transfers"

# the store serves synthesize: @commit, @main (the ref), bare name (the recorded main)
"$DRAMA_BIN" synthesize --model "org/tiny@$COMMIT" --text "Pulled weights." --frames 3 --seed 1 -q -o "$T/a.wav" \
    || bad "synthesize --model org/tiny@COMMIT"
"$DRAMA_BIN" synthesize --model org/tiny@main --text "Pulled weights." --frames 3 --seed 1 -q -o "$T/b.wav" || bad "@main"
"$DRAMA_BIN" synthesize --model org/tiny --text "Pulled weights." --frames 3 --seed 1 -q -o "$T/c.wav" || bad "org/tiny"
"$DRAMA_BIN" synthesize --model "$DRAMA_GOLDEN/tiny-drama3" --text "Pulled weights." --frames 3 --seed 1 -q -o "$T/g.wav"
cmp -s "$T/a.wav" "$T/g.wav" && cmp -s "$T/b.wav" "$T/g.wav" && cmp -s "$T/c.wav" "$T/g.wav" \
    || bad "audio from the store differs from the golden folder's"
"$DRAMA_BIN" synthesize --model org/tiny@v9 --text x -o "$T/x.wav" > "$T/v9.out" 2>&1 && bad "an unrecorded ref resolved"
grep -q "no pull of 'v9' recorded" "$T/v9.out" || bad "unrecorded ref: $(cat "$T/v9.out")"

# a rerun downloads nothing (every file verified in place, hashes from the cache)
n_before=$(grep -c '/resolve/' "$LOG")
pull "org/tiny@$COMMIT" --progress-json > /dev/null 2> "$T/again.json" || bad "rerun failed: $(tail -2 "$T/again.json")"
[ "$(grep -c '/resolve/' "$LOG")" -eq "$n_before" ] || bad "a rerun downloaded files again"
grep -q '"event":"done","status":"ok".*"downloaded":0,"reused":10' "$T/again.json" || bad "rerun: $(tail -1 "$T/again.json")"
grep -q '"event":"file","path":"config.json","action":"reuse"' "$T/again.json" || bad "rerun: no reuse event"
no_token_in "$T/again.json"

# --include: only matching files (a trailing '/' takes a folder)
pull "org/tiny@$COMMIT" --dir "$T/inc" --include 'config.json' --include '*.jinja' --include 'extra/' -q > /dev/null \
    || bad "--include pull failed"
[ "$(cd "$T/inc" && find . -type f | sort | tr '\n' ' ')" = "./chat_template.jinja ./config.json ./drama-manifest.json ./drama-pull.json ./extra/notes.txt " ] \
    || bad "--include selected: $(cd "$T/inc" && find . -type f | sort | tr '\n' ' ')"
pull "org/tiny@$COMMIT" --dir "$T/inc2" --include 'nothing*' > "$T/inc2.out" 2>&1 && bad "an --include matching nothing passed"
grep -q "matches the --include patterns" "$T/inc2.out" || bad "--include nothing: $(cat "$T/inc2.out")"

# ---- refusals: 401 (no token, wrong token), 404 (repo, revision), 403, unreachable ----
"$DRAMA_BIN" pull --endpoint "$EP" "org/tiny@$COMMIT" --dir "$T/noauth" --retries 0 > "$T/e401.out" 2>&1 && bad "no token accepted"
grep -q "authentication required.*HF_TOKEN.*HTTP 401" "$T/e401.out" || bad "401: $(cat "$T/e401.out")"
HF_TOKEN=wrong "$DRAMA_BIN" pull --endpoint "$EP" "org/tiny@$COMMIT" --dir "$T/noauth" > "$T/ebad.out" 2>&1 && bad "wrong token accepted"
grep -q "token was refused.*HTTP 401" "$T/ebad.out" || bad "wrong token: $(cat "$T/ebad.out")"
echo "$TOKEN" > "$T/token.txt"
"$DRAMA_BIN" pull --endpoint "$EP" --token-file "$T/token.txt" "org/tiny@$COMMIT" --dir "$T/tokfile" -q > /dev/null 2>&1 \
    || bad "--token-file pull failed"
pull org/nope@main --allow-latest > "$T/e404r.out" 2>&1 && bad "unknown repo accepted"
grep -q "org/nope@main: repo not found.*HTTP 404, RepoNotFound" "$T/e404r.out" || bad "404 repo: $(cat "$T/e404r.out")"
pull org/tiny@nosuchbranch --allow-latest > "$T/e404v.out" 2>&1 && bad "unknown revision accepted"
grep -q "revision not found (HTTP 404, RevisionNotFound" "$T/e404v.out" || bad "404 rev: $(cat "$T/e404v.out")"
pull org/tiny@0123456789012345678901234567890123456789 > "$T/e404c.out" 2>&1 && bad "unknown commit accepted"
grep -q "revision not found" "$T/e404c.out" || bad "404 commit: $(cat "$T/e404c.out")"
[ -e "$STORE/0123456789012345678901234567890123456789" ] && bad "an unknown commit left a store folder"
start_hub forbid --forbid
pull "org/tiny@$COMMIT" --dir "$T/forbid" > "$T/e403.out" 2>&1 && bad "403 accepted"
grep -q "access denied.*HTTP 403" "$T/e403.out" || bad "403: $(cat "$T/e403.out")"
closed=$(grep -o '[0-9]*$' <<< "$EP")  # a port with nobody listening once this hub is gone
kill "${HUB_PIDS[-1]}"; wait "${HUB_PIDS[-1]}" 2>/dev/null
HF_TOKEN="$TOKEN" "$DRAMA_BIN" pull --endpoint "http://127.0.0.1:$closed" "org/tiny@$COMMIT" --dir "$T/down" --retries 2 \
    --retry-wait 0.01 > "$T/down.out" 2>&1 && bad "an unreachable hub passed"
[ "$(grep -c '^retry ' "$T/down.out")" -eq 2 ] || bad "unreachable: not 2 retries: $(cat "$T/down.out")"
grep -q "after 2 retries.*rerun" "$T/down.out" || bad "unreachable: $(tail -1 "$T/down.out")"
"$DRAMA_BIN" pull --endpoint "http://user:pw@127.0.0.1:1" "org/tiny@$COMMIT" > "$T/cred.out" 2>&1 && bad "credentials in the URL accepted"
grep -q "without user credentials" "$T/cred.out" || bad "endpoint credentials: $(cat "$T/cred.out")"
no_token_in "$T"/e4*.out "$T/ebad.out" "$T/down.out"

# transient 503s: retried with backoff, then the pull completes
start_hub busy --fail-first 3
pull "org/tiny@$COMMIT" --dir "$T/busy" > /dev/null 2> "$T/busy.err" || bad "503 x3 then ok: $(tail -2 "$T/busy.err")"
[ "$(grep -c '^retry .*HTTP 503' "$T/busy.err")" -eq 3 ] || bad "503: expected 3 retries: $(cat "$T/busy.err")"

# ---- a corrupted file: fails naming it, expected and actual digest; nothing in place ----
start_hub corrupt --corrupt "$SHARD2"
pull "org/tiny@$COMMIT" --dir "$T/corrupt" > "$T/corrupt.out" 2>&1 && bad "a corrupted shard was accepted"
want=$(sha256sum "$T/repo/$SHARD2" | cut -c1-64)
grep -q "$SHARD2: SHA-256 mismatch: expected $want, got [0-9a-f]\{64\}" "$T/corrupt.out" || bad "corrupt: $(cat "$T/corrupt.out")"
[ -e "$T/corrupt/$SHARD2" ] && bad "the corrupted shard was put in place"
[ -n "$(ls -A "$T/corrupt/.partial" 2>/dev/null)" ] && bad "the corrupted download was left in .partial"
[ -e "$T/corrupt/drama-pull.json" ] || [ -e "$T/corrupt/drama-manifest.json" ] && bad "receipt/manifest after a failure"
start_hub corruptgit --corrupt config.json
pull "org/tiny@$COMMIT" --dir "$T/corruptgit" > "$T/corruptgit.out" 2>&1 && bad "a corrupted git file was accepted"
grep -q "config.json: git blob id mismatch: expected $(git hash-object "$T/repo/config.json" 2>/dev/null || echo '[0-9a-f]*')" \
    "$T/corruptgit.out" || bad "corrupt git file: $(cat "$T/corruptgit.out")"
[ -e "$T/corruptgit/config.json" ] && bad "the corrupted config.json was put in place"

# ---- a transfer cut at half, every time: the pull fails resumable; a rerun (hub fixed) sends Range ----
start_hub cut --cut-all "$SHARD1"
pull "org/tiny@$COMMIT" --dir "$T/cut" --retries 1 > "$T/cut1.out" 2>&1 && bad "a cut transfer passed"
grep -q "$SHARD1: .*after 1 retry without progress; [0-9]* of 16388344 bytes are kept in .*rerun the same command to resume" \
    "$T/cut1.out" || bad "cut: $(cat "$T/cut1.out")"
part=$(ls "$T/cut/.partial/"*.part 2>/dev/null | head -1)
psize=$(stat -c %s "$part" 2>/dev/null || echo 0)
[ "$psize" -eq 8194172 ] || bad "cut: partial of $psize bytes, expected half the shard (8194172)"
[ -e "$T/cut/$SHARD1" ] && bad "cut: the half shard was put in place"
start_hub cutok
pull "org/tiny@$COMMIT" --dir "$T/cut" --progress-json > /dev/null 2> "$T/cut2.json" || bad "cut rerun: $(tail -1 "$T/cut2.json")"
grep -q "^cdn GET .* range=bytes=$psize- " "$LOG" || bad "the rerun sent no Range: bytes=$psize- ($(grep range=bytes "$LOG"))"
grep -q "\"path\":\"$SHARD1\",\"action\":\"resume\"" "$T/cut2.json" || bad "cut rerun: no resume event"
# the first run had finished the files before the shard: the rerun fetches the shard's second half and the rest
rest=$(( $(stat -c %s "$T/repo/$SHARD1") - psize ))
for f in "$SHARD2" model.safetensors.index.json tokenizer.json tokenizer_config.json; do rest=$((rest + $(stat -c %s "$T/repo/$f"))); done
grep -q "\"downloaded\":5,\"reused\":5,\"bytes\":[0-9]*,\"bytes_downloaded\":$rest," "$T/cut2.json" \
    || bad "cut rerun: expected 5 reused and $rest bytes downloaded: $(tail -1 "$T/cut2.json")"
cmp -s "$T/repo/$SHARD1" "$T/cut/$SHARD1" || bad "cut rerun: the shard differs"
"$DRAMA_BIN" verify "$T/cut" --reverify > /dev/null 2>&1 || bad "cut rerun: verify failed"
# the same cut with retries: resumed inside one run
start_hub cutretry --cut "$SHARD1"
pull "org/tiny@$COMMIT" --dir "$T/cutretry" > /dev/null 2> "$T/cutretry.err" || bad "cut + retries: $(tail -1 "$T/cutretry.err")"
grep -q "^cdn GET .* range=bytes=[1-9][0-9]*- " "$LOG" || bad "cut + retries: no Range request"
cmp -s "$T/repo/$SHARD1" "$T/cutretry/$SHARD1" || bad "cut + retries: the shard differs"
# a server that ignores Range (200): the partial restarts from 0 and the file is still right
start_hub norange --ignore-range
head -c 1000 "$T/repo/$SHARD1" > "$T/p.bin"
mkdir -p "$T/norange/.partial" && cp "$T/p.bin" "$T/norange/.partial/$(sha256sum "$T/repo/$SHARD1" | cut -c1-64).part"
pull "org/tiny@$COMMIT" --dir "$T/norange" -q > /dev/null 2> "$T/norange.err" || bad "Range ignored: $(cat "$T/norange.err")"
cmp -s "$T/repo/$SHARD1" "$T/norange/$SHARD1" || bad "Range ignored: the shard differs"
# a killed pull (SIGKILL mid-transfer) resumes
start_hub slow --slow "$SHARD1"
HF_TOKEN="$TOKEN" "$DRAMA_BIN" pull --endpoint "$EP" "org/tiny@$COMMIT" --dir "$T/killed" -q > /dev/null 2>&1 &
kpid=$!  # drama itself (not a subshell), so SIGKILL stops the download
for _ in $(seq 1 200); do
    s=$(stat -c %s "$T/killed/.partial/"*.part 2>/dev/null | sort -n | tail -1)
    [ "${s:-0}" -gt 100000 ] && grep -q "cdn GET /cdn-lfs/$(sha256sum "$T/repo/$SHARD1" | cut -c1-64)" "$LOG" && break
    sleep 0.05
done
kill -9 "$kpid" 2>/dev/null; wait "$kpid" 2>/dev/null
[ -e "$T/killed/drama-pull.json" ] && bad "killed: the pull finished before it was killed (the test proves nothing)"
pull "org/tiny@$COMMIT" --dir "$T/killed" -q > /dev/null 2> "$T/killed.err" || bad "killed rerun: $(cat "$T/killed.err")"
grep -q "^cdn GET .* range=bytes=[1-9][0-9]*- " "$LOG" || bad "killed rerun: no Range request"
same_as_source "$T/killed"

# ---- a disk that fills up: the partial is kept, the rerun resumes ----
start_hub full
pull "org/tiny@$COMMIT" --dir "$T/full" --test-enospc-after 5000000 > "$T/full.out" 2>&1 && bad "ENOSPC passed"
grep -q "No space left on device.*free some space and rerun to resume" "$T/full.out" || bad "ENOSPC: $(cat "$T/full.out")"
pull "org/tiny@$COMMIT" --dir "$T/full" -q > /dev/null 2> "$T/full2.err" || bad "ENOSPC rerun: $(cat "$T/full2.err")"
grep -q "range=bytes=[1-9][0-9]*- " "$LOG" || bad "ENOSPC rerun: no Range request"
same_as_source "$T/full"

# ---- a server that lies about sizes: more bytes, fewer bytes ----
start_hub extra --extra tokenizer.json
pull "org/tiny@$COMMIT" --dir "$T/extra" > "$T/extra.out" 2>&1 && bad "extra bytes accepted"
grep -q "tokenizer.json: the server sent more than the 566967 bytes the tree announces" "$T/extra.out" || bad "extra: $(cat "$T/extra.out")"
[ -e "$T/extra/tokenizer.json" ] || [ -n "$(ls -A "$T/extra/.partial" 2>/dev/null)" ] && bad "extra: a file was left"
start_hub lie --lie-size "$SHARD2"
pull "org/tiny@$COMMIT" --dir "$T/lie" > "$T/lie.out" 2>&1 && bad "a short file accepted"
grep -q "$SHARD2: the server sends 3194920 bytes (Content-Length) but the tree says 3199016" "$T/lie.out" || bad "lie: $(cat "$T/lie.out")"
[ -e "$T/lie/$SHARD2" ] || [ -n "$(ls -A "$T/lie/.partial" 2>/dev/null)" ] && bad "lie: a file was left"

# two pulls into one folder: the second finds the partial locked (flock) and says so
start_hub lock
mkdir -p "$T/locked/.partial"
lp="$T/locked/.partial/$(sha256sum "$T/repo/$SHARD1" | cut -c1-64).part"
: > "$lp"
flock "$lp" env HF_TOKEN="$TOKEN" "$DRAMA_BIN" pull --endpoint "$EP" "org/tiny@$COMMIT" --dir "$T/locked" -q \
    > "$T/locked.out" 2>&1 && bad "a locked partial was written"
grep -q "$(basename "$lp"): another drama pull is downloading this file" "$T/locked.out" || bad "lock: $(cat "$T/locked.out")"

# command line
"$DRAMA_BIN" pull > /dev/null 2>&1; [ $? -eq 2 ] || bad "no REPO: not exit 2"
"$DRAMA_BIN" pull 'bad/../x' > "$T/u.out" 2>&1; [ $? -eq 2 ] || bad "bad repo id: not exit 2"
"$DRAMA_BIN" pull org/tiny --bogus > /dev/null 2>&1; [ $? -eq 2 ] || bad "unknown flag: not exit 2"
"$DRAMA_BIN" pull --help | grep -q -- '--allow-latest' || bad "--help lacks --allow-latest"
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
