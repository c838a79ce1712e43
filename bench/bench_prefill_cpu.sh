#!/bin/sh
# bench_prefill_cpu.sh - CPU prefill tok/s at 1, 2 and all threads, default
# cache and f16 (bench/prefill_cpu.py; KVQ_BENCH_BASE=path/to/kvq adds the
# binary of another build, e.g. the branch point, in the same sitting), then,
# where bench/llamacpp_get.sh has built it, kvq against llama.cpp's CPU build
# on the same token ids at 3.5K and 16K tokens (bench/prefill_llamacpp.py).
#
#   sh bench/bench_prefill_cpu.sh [BUILD]        (REPEAT=3 runs of each)
set -eu
build=${1:-build}
[ -x "$build/bin/kvq" ] || { echo "bench_prefill_cpu: $build/bin/kvq not built" >&2; exit 1; }
python3 bench/prefill_cpu.py "$build" ${KVQ_BENCH_BASE:+--base "$KVQ_BENCH_BASE"}
if [ -x build/llama/prefill_llamacpp ]; then
    python3 bench/prefill_llamacpp.py "$build" ${KVQ_BENCH_BASE:+--base "$KVQ_BENCH_BASE"}
else
    echo "bench_prefill_cpu: no llama.cpp build (sh bench/llamacpp_get.sh makes one); skipped the comparison"
fi
