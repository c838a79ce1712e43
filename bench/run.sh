#!/bin/sh
# Runs every benchmark binary given. Each prints a readable table on stdout
# and writes BENCH.json into $KVQ_BENCH_JSON_DIR (the build's bench/ folder).
# Benchmarks measure; they never pass or fail on speed.
build=$1; shift
KVQ_BENCH_JSON_DIR=${KVQ_BENCH_JSON_DIR:-$build/bench}
export KVQ_BENCH_JSON_DIR
mkdir -p "$KVQ_BENCH_JSON_DIR"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
status=0
for b in "$@"; do
    echo
    echo "== $(basename "$b")"
    "$b" || { echo "benchmark $(basename "$b") failed"; status=1; }
done
# Script benchmarks (whole-command timings, e.g. the eval sweep).
for s in bench/bench_*.sh; do
    [ -f "$s" ] || continue
    echo
    echo "== $(basename "$s")"
    sh "$s" "$build" || { echo "benchmark $(basename "$s") failed"; status=1; }
done
echo
echo "JSON results: $KVQ_BENCH_JSON_DIR/"
exit $status
