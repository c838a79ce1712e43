#!/bin/sh
# Runs every test binary given, shows their output, and closes with the
# suite's totals: "N skipped", then the plain last line "N passed, N failed".
# Exits non-zero when any test failed or a binary crashed.
build=$1; shift
passed=0; failed=0; skipped=0; crashed=0
for t in "$@"; do
    name=$(basename "$t")
    out=$(mktemp)
    "$t" >"$out" 2>&1
    rc=$?
    cat "$out"
    line=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$" "$out" | tail -n 1)
    rm -f "$out"
    if [ -z "$line" ]; then
        echo "FAIL $name: exited with status $rc before reporting"
        failed=$((failed + 1)); crashed=1
        continue
    fi
    counts=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')
    p=${counts%% *}; rest=${counts#* }; f=${rest%% *}; s=${rest#* }
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited with status $rc"
        failed=$((failed + 1)); crashed=1
    fi
done
echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ]
