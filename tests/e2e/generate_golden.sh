#!/usr/bin/env bash
# drama generate: golden greedy frames (ref/e2e-noref, ref/e2e-ref12) exact through the CLI;
# same seed twice and threads 1 vs 2 byte-identical; guidance paired vs separate identical;
# frame cap -> exit 3 and no file; bad parameters -> exit 2 naming the flag; a non-golden shape
# (make-model custom: tower dim != hidden, 5 codebooks, 300-row heads) generates reproducibly,
# guided paired = separate; guidance's ROWS.json / U.json pairing errors exit 2.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 77; }
[ -n "${DRAMA_GOLDEN:-}" ] && [ -d "$DRAMA_GOLDEN" ] || { echo "DRAMA_GOLDEN not set"; exit 77; }
command -v jq > /dev/null || { echo "jq missing"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
M="$DRAMA_GOLDEN/tiny-drama3"
G=("$DRAMA_BIN" generate --model "$M")

for c in noref ref12; do
    jq -c '{rows: .prompt_rows, prefill: (.prompt_rows | length)}' "$DRAMA_GOLDEN/ref/e2e-$c.json" > "$T/rows-$c.json"
    jq -c '.generated_frames' "$DRAMA_GOLDEN/ref/e2e-$c.json" > "$T/want-$c.json"
    n=$(jq '.generated_frames | length' "$DRAMA_GOLDEN/ref/e2e-$c.json")
    "${G[@]}" --rows "$T/rows-$c.json" --frames "$n" --temperature 0 --threads 2 --codes-out "$T/got-$c.json" \
        2> "$T/err-$c" || bad "$c: exit $?: $(cat "$T/err-$c")"
    jq -c '.codes' "$T/got-$c.json" > "$T/got-$c.codes" 2> /dev/null
    [ "$c" = ref12 ] && { "${G[@]}" --rows "$T/rows-$c.json" --frames 2 --temperature 0 --codes-out "$T/d.json" \
        --dump "$T/d.safetensors" 2> /dev/null && head -c 1000 "$T/d.safetensors" | grep -aq head_logits \
        || bad "--dump: no safetensors with head_logits"; }
    cmp -s "$T/got-$c.codes" "$T/want-$c.json" && echo "$c: $n greedy frames equal the golden" \
        || bad "$c: frames differ from the golden"
done

# same seed twice, threads 1 vs 2
S=(--rows "$T/rows-ref12.json" --frames 12 --seed -42 --temperature 1 --top-p 0.9)
"${G[@]}" "${S[@]}" --threads 1 --codes-out "$T/s1.json" 2> /dev/null || bad "seeded run 1: exit $?"
"${G[@]}" "${S[@]}" --threads 1 --codes-out "$T/s2.json" 2> /dev/null || bad "seeded run 2: exit $?"
"${G[@]}" "${S[@]}" --threads 2 --codes-out "$T/s3.json" 2> /dev/null || bad "seeded run 3: exit $?"
cmp -s "$T/s1.json" "$T/s2.json" && echo "same seed twice: identical" || bad "same seed twice differs"
cmp -s "$T/s1.json" "$T/s3.json" && echo "threads 1 vs 2: identical" || bad "threads 1 vs 2 differ"
"${G[@]}" "${S[@]/-42/-43}" --codes-out "$T/s4.json" 2> /dev/null
cmp -s "$T/s1.json" "$T/s4.json" && bad "seeds -42 and -43 gave the same codes"

# guidance: paired vs separate
C=(--rows "$T/rows-ref12.json" --uncond-rows "$T/rows-noref.json" --frames 10 --seed 5 --cfg-gamma 1.5)
"${G[@]}" "${C[@]}" --cfg-mode paired --codes-out "$T/g1.json" 2> "$T/g1.err" || bad "guided paired: $(cat "$T/g1.err")"
"${G[@]}" "${C[@]}" --cfg-mode separate --codes-out "$T/g2.json" 2> /dev/null || bad "guided separate: exit $?"
cmp -s "$T/g1.json" "$T/g2.json" && echo "guidance paired vs separate: identical" || bad "paired vs separate differ"
grep -q guided "$T/g1.err" || bad "guided run does not report guidance"

# frame cap: the greedy noref run has no end token in 16 frames
"${G[@]}" --rows "$T/rows-noref.json" --temperature 0 --frame-cap 3 --codes-out "$T/cap.json" 2> "$T/cap.err"
rc=$?
[ $rc -eq 3 ] || bad "frame cap: exit $rc, expected 3"
grep -q "frame limit reached" "$T/cap.err" || bad "frame cap: message: $(cat "$T/cap.err")"
[ -e "$T/cap.json" ] && bad "frame cap: an output file was published"
ls "$T" | grep -q 'cap.json' && bad "frame cap: a temporary file was left"
echo "frame cap: exit $rc, nothing written"

# SIGINT: exit 130, nothing written (the signal lands during loading, prefill or the loop;
# every case ends the same way)
# (job control on: a background job of a script would otherwise start with SIGINT ignored)
set -m
"${G[@]}" --rows "$T/rows-noref.json" --frames 5000 --seed 1 --codes-out "$T/int.json" 2> "$T/int.err" &
pid=$!
set +m
sleep 0.2
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || bad "SIGINT: exit $rc, expected 130: $(tail -2 "$T/int.err")"
ls "$T" | grep -q '^int.json' && bad "SIGINT: a file was written"
echo "SIGINT: exit $rc, nothing written"

# bad parameters name the parameter
for p in "--temperature 2.5:temperature" "--top-p 0:top_p" "--cfg-gamma nan:cfg_gamma" "--acoustic-top-k 2000:acoustic_top_k" \
         "--ras-window 65:ras_window"; do
    flag=${p%%:*}
    name=${p##*:}
    "${G[@]}" --rows "$T/rows-noref.json" --frames 2 $flag --codes-out "$T/bad.json" 2> "$T/bad.err"
    rc=$?
    # named as the sampler parameter (library check) or as the flag (the CLI refuses a non-number)
    [ $rc -ne 0 ] && grep -q -e "$name" -e "${flag%% *}:" "$T/bad.err" || bad "$flag: exit $rc, message: $(cat "$T/bad.err")"
    [ -e "$T/bad.json" ] && bad "$flag: output written"
done
# rows of the wrong width are rejected with the file named
echo '{"rows": [[1, 0, 0]], "prefill": 1}' > "$T/narrow.json"
"${G[@]}" --rows "$T/narrow.json" --frames 2 --codes-out "$T/bad.json" 2> "$T/bad.err" && bad "narrow rows accepted"
grep -q narrow.json "$T/bad.err" || bad "narrow rows: message does not name the file: $(cat "$T/bad.err")"

# --score: the tower's teacher-forced NLL of the reference frames, no generation
"${G[@]}" --rows "$T/rows-ref12.json" --score > "$T/score.json" 2> "$T/score.err" || bad "score: $(cat "$T/score.err")"
nref=$(jq '.case.ref.frames' "$DRAMA_GOLDEN/ref/e2e-ref12.json")
[ "$(jq '.scored_positions' "$T/score.json")" = "$nref" ] && [ "$(jq '.tower_nll | length' "$T/score.json")" = 9 ] \
    && echo "score: $(cat "$T/score.json")" || bad "score output: $(cat "$T/score.json")"

# another shape (held out from the golden one): tower dim != backbone hidden, other head counts, 5
# codebooks, code vocabulary 512, heads of 300 rows (the default head_vocab follows them), 2
# shared layers; a prompt with a reference (audio rows) and one without
if "$DRAMA_BIN" make-model "$T/custom" --shape custom --hidden 96 --layers 4 --num-experts 8 --top-k 2 --moe-inter 32 \
      --shared-inter 48 --head-dim 32 --tower-dim 80 --tower-heads 5 --tower-kv-heads 1 --tower-head-dim 16 \
      --tower-inter 112 --tower-shared-layers 2 --codebooks 5 --code-vocab 512 --head-rows 300 --codec none \
      --seed 3 > "$T/custom.make" 2>&1; then
    S0=$(jq '.semantic_start_token_id' "$T/custom/config.json")
    jq -nc --argjson s "$S0" '[[1,0,0,0,0,0],[2,0,0,0,0,0]] as $t | [[7,0,0,0,0,0],[8,0,0,0,0,0]] as $u
        | [range(6) | [$s + (. * 37 % 512), (. * 37 % 512), (. * 11 % 300), (. * 13 % 300), (. * 17 % 300), (. * 19 % 300)]] as $a
        | {ref: {rows: ($t + $a + $u), prefill: 8}, noref: {rows: ($t + $u), prefill: 2}}' > "$T/cprompts.json"
    jq -c '.ref' "$T/cprompts.json" > "$T/cref.json"      # prefill 8: the last two rows one call each
    jq -c '.noref' "$T/cprompts.json" > "$T/cnoref.json"
    CG=("$DRAMA_BIN" generate --model "$T/custom" --frames 6 --seed 77)
    "${CG[@]}" --rows "$T/cref.json" --threads 1 --codes-out "$T/c1.json" 2> "$T/c.err" || bad "custom shape: $(cat "$T/c.err")"
    "${CG[@]}" --rows "$T/cref.json" --threads 2 --codes-out "$T/c2.json" 2> /dev/null || bad "custom shape, 2 threads"
    [ "$(jq '.codes | length' "$T/c1.json" 2> /dev/null)" = 6 ] && [ "$(jq '[.codes[][1:][]] | max' "$T/c1.json")" -lt 300 ] \
        && [ "$(jq '[.codes[] | length] | unique' -c "$T/c1.json")" = "[5]" ] && echo "custom shape: 6 frames of 5 codes" \
        || bad "custom shape: codes $(cat "$T/c1.json" 2> /dev/null)"
    cmp -s "$T/c1.json" "$T/c2.json" || bad "custom shape: threads 1 vs 2 differ"
    for mode in paired separate; do
        "${CG[@]}" --rows "$T/cref.json" --uncond-rows "$T/cnoref.json" --cfg-gamma 2 --cfg-mode $mode \
            --codes-out "$T/cg-$mode.json" 2> "$T/cg.err" || bad "custom guided $mode: $(cat "$T/cg.err")"
    done
    cmp -s "$T/cg-paired.json" "$T/cg-separate.json" && ! cmp -s "$T/c1.json" "$T/cg-paired.json" \
        && echo "custom shape: guided paired = separate, != unguided" || bad "custom shape: guidance codes"
    # U.json must pair its continuation rows with ROWS.json's (here 2 after the prefill); a guided
    # reference prompt without U.json is a usage error
    jq -c '.prefill = 4' "$T/cnoref.json" > "$T/cnoref4.json"
    "${CG[@]}" --rows "$T/cref.json" --uncond-rows "$T/cnoref4.json" --cfg-gamma 2 --codes-out "$T/x.json" 2> "$T/x.err"
    rc=$?
    [ $rc -eq 2 ] && grep -q "counts must match" "$T/x.err" && [ ! -e "$T/x.json" ] \
        || bad "unpaired continuation rows: exit $rc: $(cat "$T/x.err")"
    "${CG[@]}" --rows "$T/cref.json" --cfg-gamma 2 --codes-out "$T/x.json" 2> "$T/x.err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "--uncond-rows" "$T/x.err" && [ ! -e "$T/x.json" ] \
        || bad "guided without U.json: exit $rc: $(cat "$T/x.err")"
    # a reference after the prefill split still counts: prefill 1, every later row one call
    jq -c '.prefill = 1' "$T/cref.json" > "$T/cref1.json"
    "${CG[@]}" --rows "$T/cref1.json" --cfg-gamma 2 --codes-out "$T/x.json" 2> "$T/x.err"
    rc=$?
    [ $rc -eq 2 ] || bad "reference after the prefill split not seen: exit $rc: $(cat "$T/x.err")"
    "$DRAMA_BIN" generate --model "$T/custom" --rows "$T/cref.json" --score > "$T/cs.json" 2> "$T/cs.err" \
        && [ "$(jq '.tower_nll | length' "$T/cs.json")" = 4 ] && [ "$(jq '.scored_positions' "$T/cs.json")" = 6 ] \
        && echo "custom shape score: $(cat "$T/cs.json")" || bad "custom score: $(cat "$T/cs.json" "$T/cs.err")"
else
    bad "make-model custom failed, so the non-golden shape was not generated: $(tail -2 "$T/custom.make")"
fi
exit $fail
