#!/bin/sh
# The decoder's C example (docs/examples/generate.c, shown in docs/api.md)
# builds and runs as the page says: the program in the page is the file byte
# for byte; it compiles with the line of its first comment ("cc generate.c
# $(pkg-config ...) ...") against the build's kvq-uninstalled.pc (found with
# PKG_CONFIG_PATH=BUILD/lib, as the README's snippet in test_readme.sh), and
# with -Werror; on the bundled model it prints exactly what `kvq run` prints
# for the same prompt (the page says so), finds the key of the `make run`
# passkey prompt, and fails in one line on a missing model.
# KVQ_BUILD names the build directory (default: build).
name=test_example.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
example=$root/docs/examples/generate.c
model=$root/models/kvq-tiny-llama
. "$root/tests/tally.sh"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# 1. What the page shows is the file (no build needed).
awk '/^```c$/ { inside = 1; next } inside && /^```$/ { exit } inside { print }' "$root/docs/api.md" > "$tmp/page.c"
if cmp -s "$tmp/page.c" "$example"; then
    ok "docs/api.md shows docs/examples/generate.c as it is"
else
    bad "docs/api.md's C block differs from docs/examples/generate.c:"
    diff "$example" "$tmp/page.c" | head -n 10 | sed 's/^/     /'
fi

if ! command -v pkg-config >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1 || [ ! -f "$build/lib/libkvq.so" ] ||
   [ ! -f "$build/lib/kvq-uninstalled.pc" ]; then
    skip "needs pkg-config, cc, $build/lib/libkvq.so and kvq-uninstalled.pc"
    finish
fi

# 2. Build with the file's own line, in a directory of its own.
line=$(sed -n '1s|^/\* generate.c: \(.*\) \*/$|\1|p' "$example")
case $line in
"cc generate.c "*"pkg-config --cflags --libs kvq"*) ok "the build line: $line" ;;
*) bad "docs/examples/generate.c: no '/* generate.c: cc generate.c ... */' first line (got '$(head -n 1 "$example")')"; finish ;;
esac
# A sanitized libkvq.so needs its runtime in the program too.
extra=
nm -D "$build/lib/libkvq.so" 2>/dev/null | grep -q ' U __asan_init' && extra="-fsanitize=address,undefined"
mkdir -p "$tmp/ex" "$tmp/strict"
cp "$example" "$tmp/ex/"
cp "$example" "$tmp/strict/"
export PKG_CONFIG_PATH="$build/lib"
if (cd "$tmp/ex" && sh -c "$line $extra" > build.log 2>&1) && [ -x "$tmp/ex/generate" ]; then
    ok "builds with its line against $build/lib/kvq-uninstalled.pc"
else
    bad "'$line' failed:"
    sed 's/^/     /' "$tmp/ex/build.log" | head -n 20
    finish
fi
# The example is what people copy: no warning with the library's own flags.
if (cd "$tmp/strict" && sh -c "${line%% -o *} -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wvla -Werror $extra -o generate" \
    > build.log 2>&1); then
    ok "builds with -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wvla -Werror"
else
    bad "warnings with -Werror:"
    sed 's/^/     /' "$tmp/strict/build.log" | head -n 20
fi

gen() { env ASAN_OPTIONS=detect_leaks=0 "$tmp/ex/generate" "$@"; }

# 3. The same text as `kvq run` (greedy, the same defaults), stats on stderr.
prompt="The grass is green."
gen "$model" "$prompt" 32 > "$tmp/ex.out" 2> "$tmp/ex.err"; rc=$?
if [ "$rc" -eq 0 ] && [ "$(wc -c < "$tmp/ex.out")" -gt 20 ]; then
    ok "runs on the bundled model: $(head -c 60 "$tmp/ex.out" | tr '\n' ' ')..."
else
    bad "exit $rc on the bundled model: $(cat "$tmp/ex.out" "$tmp/ex.err" | head -n 5)"
fi
if [ -x "$build/bin/kvq" ]; then
    env ASAN_OPTIONS=detect_leaks=0 "$build/bin/kvq" run --model "$model" --prompt "$prompt" --max-tokens 32 \
        > "$tmp/run.out" 2> /dev/null
    if [ -s "$tmp/run.out" ] && cmp -s "$tmp/ex.out" "$tmp/run.out"; then
        ok "prints exactly what kvq run prints ($(wc -c < "$tmp/run.out") bytes)"
    else
        bad "differs from kvq run: '$(head -c 80 "$tmp/ex.out")' vs '$(head -c 80 "$tmp/run.out")'"
    fi
else
    skip "no $build/bin/kvq to compare with"
fi
# "N prompt + M generated tokens; KV cache U bytes, F as f16": the packed
# cache (window included) must hold these tokens in fewer bytes than f16.
set -- $(sed -n 's/^\([0-9]*\) prompt + \([0-9]*\) generated tokens; KV cache \([0-9]*\) bytes, \([0-9]*\) as f16$/\1 \2 \3 \4/p' "$tmp/ex.err")
if [ $# -eq 4 ] && [ "$2" -eq 32 ] && [ "$3" -gt 0 ] && [ "$3" -lt "$4" ]; then
    ok "stderr: $1 prompt + $2 generated tokens, KV cache $3 bytes < $4 as f16"
else
    bad "stderr not '<n> prompt + 32 generated tokens; KV cache U bytes, F as f16' with U < F: $(cat "$tmp/ex.err")"
fi

# 4. The passkey prompt of `make run`: the key comes back.
pk=$root/models/passkey-3500.txt
key=$(sed -n 's/.*The pass key is \([0-9][0-9]*\)\. Remember it.*/\1/p' "$pk")
gen "$model" "$(cat "$pk")" 16 > "$tmp/pk.out" 2> "$tmp/pk.err"; rc=$?
if [ -n "$key" ] && [ "$rc" -eq 0 ] && grep -q "$key" "$tmp/pk.out"; then
    ok "passkey-3500.txt: the key $key retrieved ($(tr -d '\n' < "$tmp/pk.out"))"
else
    bad "passkey-3500.txt: key '$key' not in '$(cat "$tmp/pk.out")' (exit $rc: $(head -n 2 "$tmp/pk.err"))"
fi

# 5. Errors: a missing model is one line and exit status 1; bad arguments 2.
gen "$tmp/no-such-model" "$prompt" 4 > /dev/null 2> "$tmp/err"; rc=$?
if [ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q '^generate: ' "$tmp/err"; then
    ok "a missing model: exit 1, '$(cat "$tmp/err")'"
else
    bad "a missing model: exit $rc, '$(cat "$tmp/err")'"
fi
gen "$model" "$prompt" 0 > /dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] && ok "MAX_TOKENS 0: usage, exit 2" || bad "MAX_TOKENS 0: exit $rc, not 2"
finish
