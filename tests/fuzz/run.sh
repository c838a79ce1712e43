#!/bin/sh
# Runs every libFuzzer target in BUILD/fuzz for SECONDS each, starting from
# the seed corpus in tests/fuzz/corpus/NAME/ (copied, so runs never write
# into the repository). Fails when a target finds a crash.
build=$1; seconds=${2:-30}
status=0
for f in "$build"/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    work=$(mktemp -d)
    [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$work/"
    echo "== $name ($seconds s)"
    if ! "$f" -max_total_time="$seconds" -max_len=65536 -artifact_prefix="$build/fuzz/$name-" "$work" 2>"$build/fuzz/$name.log"; then
        echo "FAIL $name: see $build/fuzz/$name.log and $build/fuzz/$name-crash-*"
        status=1
    else
        tail -n 1 "$build/fuzz/$name.log"
    fi
    rm -rf "$work"
done
exit $status
