#!/bin/sh
# The kvq command as people type it: every write checked (> /dev/full exits 1
# with the reason, said once; streamed text too), llama.cpp's short options
# and --opt=value mean the same as the long ones, '-' reads stdin, kvq help CMD, type names in any case,
# errors that say why (stray argument, range, UTF-8 byte offset, output paths
# refused before the work), --plan with --layer-types, kvq eval's --json and
# --json-out, kvq shard's --out rules.
# KVQ_BUILD names the build directory (default: build).
name=test_cli.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
kvq=$build/bin/kvq
# a hung command fails its check instead of the suite
command -v timeout >/dev/null 2>&1 && kvq_t="timeout 300 $build/bin/kvq" || kvq_t=$kvq
model=$root/models/kvq-tiny-llama
passed=0; failed=0; skipped=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
# check NAME CONDITION-STATUS: ok when the last command's test held
check() { if [ "$2" -eq 0 ]; then ok "$1"; else bad "$1"; fi; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
if [ ! -x "$kvq" ]; then
    echo "SKIP: no $kvq"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
fi

# -- write errors -------------------------------------------------------
# Streamed text (run without --json) stops at the first failed write: that
# must not be reported as a full context (it was, with exit 3), and the
# error is said once, naming standard output.
printf 'The quick brown fox\n' > "$tmp/ppl.txt"
if [ -c /dev/full ]; then
    for cmd in "types" "types --json" "codebook --bits 2 --dim 64" "--help" "help run" \
               "eval --synthetic --tokens 64 --queries 4 --n-layers 1 --types q8_0 --quiet" \
               "run -m $model -p The -n 2 --json" "run -m $model -p The -n 8 --no-eos" \
               "run -m $model --plan" "ppl -m $model -f $tmp/ppl.txt --quiet" "tokenize -m $model --text hi" \
               "tokenize -m $model --decode 1,2" "passkey -m $model --lengths 200 --trials 1 --quiet" \
               "shard -m $model --out $tmp/full-sh"; do
        # shellcheck disable=SC2086
        $kvq_t $cmd >/dev/full 2>"$tmp/err"; rc=$?
        n=$(grep -c "error: writing to standard output: No space left on device" "$tmp/err")
        grep -q "stopped\|context" "$tmp/err"; wrong=$?
        check "kvq $(echo "$cmd" | sed "s|$model|M|; s|$tmp/||" | cut -c1-36) > /dev/full: exit 1, the reason once (got $rc, $n)" \
            $([ "$rc" -eq 1 ] && [ "$n" -eq 1 ] && [ "$wrong" -ne 0 ] && echo 0 || echo 1)
    done
    # what else was asked for is still written
    $kvq_t run -m "$model" -p The -n 8 --no-eos --dump-qkv "$tmp/full.safetensors" >/dev/full 2>"$tmp/err"; rc=$?
    [ "$rc" -eq 1 ] && [ -s "$tmp/full.safetensors" ] && grep -q "writing to standard output" "$tmp/err"
    check "run --dump-qkv F > /dev/full: exit 1, F written all the same" $?
else
    echo "skip /dev/full: not a device here"; skipped=$((skipped + 1))
fi

# -- the same run spelled four ways ---------------------------------------
ids() { sed -n 's/.*"ids":\(\[[^]]*\]\).*/\1/p'; }
$kvq_t run --model "$model" --prompt Paris --max-tokens 4 --seed 3 --cache-type-k q8_0 --json 2>/dev/null | ids > "$tmp/long"
$kvq_t run -m "$model" -p Paris -n 4 -s 3 -ctk Q8_0 --json 2>/dev/null | ids > "$tmp/short"
$kvq_t run --model="$model" --prompt=Paris --max-tokens=4 --seed=3 --cache-type-k=q8_0 --json 2>/dev/null | ids > "$tmp/eq"
printf 'Paris\n' | $kvq_t run -m "$model" -f - -n 4 -s 3 --cache-type-k Q8_0 --json 2>/dev/null | ids > "$tmp/stdin"
[ -s "$tmp/long" ] && cmp -s "$tmp/long" "$tmp/short" && cmp -s "$tmp/long" "$tmp/eq" && cmp -s "$tmp/long" "$tmp/stdin"
check "run: short options, --opt=value, -f - (stdin) and type names in capitals give the same ids $(cat "$tmp/long")" $?
pid() { sed -n 's/.*"prompt_ids":\(\[[^]]*\]\).*/\1/p'; }
$kvq_t run -m "$model" -p -n -n 1 --json 2>/dev/null | pid > "$tmp/p1"
$kvq_t run -m "$model" --prompt=-n --max-tokens 1 --json 2>/dev/null | pid > "$tmp/p2"
[ -s "$tmp/p1" ] && cmp -s "$tmp/p1" "$tmp/p2" && [ "$(cat "$tmp/p1")" != "[1]" ]
check "run: a value that looks like an option (-p -n) stays the value $(cat "$tmp/p1")" $?
$kvq_t run -m "$model" -p "The" -n 1 -ctk q8_0 --json 2>/dev/null | grep -q '"cache_type_k":"q8_0"'
check "run: -ctk sets the key cache type" $?

# -- help and version -----------------------------------------------------
$kvq_t help run > "$tmp/h1"; rc1=$?
$kvq_t run --help > "$tmp/h2"
[ "$rc1" -eq 0 ] && cmp -s "$tmp/h1" "$tmp/h2" && grep -q -- "--prompt-file" "$tmp/h1"
check "kvq help run prints kvq run --help" $?
$kvq_t help nosuch 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "unknown command 'nosuch'" "$tmp/err"
check "kvq help nosuch: exit 2, one line" $?
$kvq_t --help | grep -q -- "--version" && $kvq_t --help | grep -q "MiB" && $kvq_t --version | grep -q "^kvq [0-9]"
check "kvq --help names --version and the size units; --version prints it" $?

# -- errors that say why, before the work ---------------------------------
$kvq_t run --model "$model" hi 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "unexpected argument 'hi'" "$tmp/err" && ! grep -q "needs a value" "$tmp/err"
check "run: a stray word is named as such, not as an option needing a value" $?
for cmd in "ppl -m $model" "passkey -m $model" "shard -m $model"; do
    # shellcheck disable=SC2086
    $kvq_t $cmd stray 2>"$tmp/err"; rc=$?
    [ "$rc" -eq 2 ] && grep -q "unexpected argument 'stray'" "$tmp/err"
    check "$(echo "$cmd" | cut -d' ' -f1): a stray word is named as such" $?
done
$kvq_t run -m "$model" -p hi -n 1000000000 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "16777216" "$tmp/err"
check "run: --max-tokens out of range names the limit" $?
$kvq_t run -m "$model" -p hi --expert-prefetch maybe 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "expert-prefetch.*on or off" "$tmp/err"
check "run: --expert-prefetch takes on or off, one line" $?
$kvq_t run -m "$model" -p hi --expert-direct yes 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "expert-direct.*on or off" "$tmp/err"
check "run: --expert-direct takes on or off, one line" $?
$kvq_t run -m "$model" -p hi --expert-cache 1MiB 2>"$tmp/err"; rc=$?
[ "$rc" -ne 0 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "no experts" "$tmp/err"
check "run: --expert-cache on a dense model: one line naming why" $?
printf 'caf\303\251 \377 ok' > "$tmp/bad.txt"
$kvq_t run -m "$model" -f "$tmp/bad.txt" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "not valid UTF-8 at byte 6 (0xff)" "$tmp/err"
check "run: invalid UTF-8 is reported with its byte offset" $?
$kvq_t run -m "$model" -p Paris -c 1 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "longer than the --ctx context of 1" "$tmp/err"
check "run: -c (--ctx) sets the context; a longer prompt is refused" $?
$kvq_t run -m "$model" -f "$tmp/none.txt" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "No such file or directory" "$tmp/err"
check "run: an unreadable prompt file says why" $?
start=$(date +%s)
$kvq_t run -m "$model" -p hi --dump-qkv "$tmp/nodir/d.safetensors" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "nodir: No such file or directory" "$tmp/err" && ! grep -q "loaded" "$tmp/err"
check "run: --dump-qkv into a missing directory is refused before loading" $?
# the refusal names the options to change, not the library's config fields
for cmd in "run -m $model -p hi -n 1" "ppl -m $model -f $tmp/ppl.txt"; do
    # shellcheck disable=SC2086
    $kvq_t $cmd --kv-center-k --no-kv-recent-f16 2>"$tmp/err"; rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "--kv-center-k needs the recent-token window, which --no-kv-recent-f16" "$tmp/err" &&
        ! grep -q "center_k\|recent_f16" "$tmp/err" && [ "$(wc -l < "$tmp/err")" -eq 1 ]
    check "$(echo "$cmd" | cut -d' ' -f1): --kv-center-k --no-kv-recent-f16 is refused in the options' names" $?
done
$kvq_t run -m "$model" -p hi -n 1 -ctk f16 -ctv f16 --kv-center-k 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--kv-center-k needs the recent-token window, which is off for f16/f32 caches (--kv-recent-f16" "$tmp/err"
check "run: --kv-center-k on f16 caches says --kv-recent-f16 turns the window on" $?
$kvq_t run -m "$model" --plan --layer-types q8_0/q8_0,tq3j/tq3,f16/f16,tq2/tq2 > "$tmp/plan" 2>&1
grep -q "^per-layer" "$tmp/plan" && grep -q "q8_0/q8_0,tq3j/tq3,f16/f16,tq2/tq2" "$tmp/plan"
check "run --plan shows the --layer-types choice" $?

# -- kvq tokenize: a NUL byte survives both ways ------------------------------
printf 'nul \000 inside' > "$tmp/nul.txt"
ids=$($kvq_t tokenize -m "$model" --file "$tmp/nul.txt" --no-bos | tr ' ' ',')
$kvq_t tokenize -m "$model" --decode "$ids" --json > "$tmp/nul.json"
grep -q '^{"text": "nul \\u0000 inside"}$' "$tmp/nul.json"
check "tokenize --decode --json: the text after a NUL is kept (\\u0000)" $?
$kvq_t tokenize -m "$model" --decode "$ids" > "$tmp/nul.out"
printf 'nul \000 inside\n' | cmp -s - "$tmp/nul.out"
check "tokenize --decode: every byte, the NUL included" $?
$kvq_t tokenize -m "$model" --decode 1,2 --json > "$tmp/plain.json"
grep -q '^{"text": ".*"}$' "$tmp/plain.json"
check "tokenize --decode --json: one JSON object" $?

# -- kvq eval: --json on stdout, --json-out FILE, the old --json FILE -----
ev="eval --synthetic --tokens 64 --queries 4 --n-layers 1 --types q8_0 --quiet"
# shellcheck disable=SC2086
$kvq_t $ev --json > "$tmp/ej"
[ "$(wc -l < "$tmp/ej")" -eq 1 ] && grep -q '^{"inputs":' "$tmp/ej"
check "eval --json: one JSON line on stdout" $?
# shellcheck disable=SC2086
$kvq_t $ev --json-out "$tmp/a.json" > /dev/null && $kvq_t $ev --json "$tmp/b.json" > /dev/null
grep -q '"inputs"' "$tmp/a.json" && cmp -s "$tmp/a.json" "$tmp/b.json"
check "eval --json-out FILE, and the old --json FILE, write the same file" $?
# shellcheck disable=SC2086
$kvq_t $ev --csv "$tmp/nodir/x.csv" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "No such file or directory" "$tmp/err" && [ ! -e "$tmp/nodir" ]
check "eval --csv into a missing directory: refused before the work" $?

# -- kvq shard --out -------------------------------------------------------
$kvq_t shard -m "$model" --out "$tmp/sh" > /dev/null 2>&1
$kvq_t shard -m "$model" --out "$tmp/sh" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "not empty" "$tmp/err"
check "shard: a non-empty --out is refused without --force" $?
$kvq_t shard -m "$model" --out "$tmp/sh" --force --max-shard-mb=1 > /dev/null 2>&1; rc=$?
[ "$rc" -eq 0 ] && [ "$(ls "$tmp/sh" | grep -c '^layers-')" -eq 4 ] && [ -z "$(ls -a "$tmp" | grep kvq-tmp)" ]
check "shard --force replaces it (4 layer shards, no stale or temporary files)" $?
$kvq_t shard -m "$model" --out "$model" --force 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "source model directory" "$tmp/err"
check "shard: the model directory itself is refused as --out" $?

echo "$name: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
