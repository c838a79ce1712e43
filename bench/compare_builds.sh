#!/bin/sh
# Two builds of the benchmarks against each other on one machine: runs each
# benchmark of OLD and NEW alternately, ROUNDS times (old, new, old, new, ...,
# so a noisy neighbour hits both alike), then prints, per benchmark, the
# new/old ratios of every timing in its table, best of the rounds (min time,
# max rate): the median and the 10-90% band. This is how a refactoring's
# "within noise" is measured.
#
#   sh bench/compare_builds.sh OLD NEW [ROUNDS] [BENCHMARKS]
#
# OLD and NEW hold bench/<name> (a build directory, or a bench/cuda_bundle.sh
# bundle, whose lib/ is put on LD_LIBRARY_PATH). BENCHMARKS defaults to
# "bench_attn bench_encode bench_rotation bench_decode"; bench_cuda works too
# (KVQ_BENCH_QUICK=1 in the environment for its subset). Outputs go to
# ${OUT:-/tmp/kvq-compare}/{old,new}N/.
set -eu
old=$1; new=$2; rounds=${3:-3}
benches=${4:-bench_attn bench_encode bench_rotation bench_decode}
out=${OUT:-/tmp/kvq-compare}
rm -rf "$out"
for r in $(seq 1 "$rounds"); do
    for b in $benches; do
        for v in old new; do
            dir=$old; [ $v = new ] && dir=$new
            mkdir -p "$out/$v$r"
            LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KVQ_BENCH_JSON_DIR="$out/$v$r" \
                "$dir/bench/$b" > "$out/$v$r/$b.txt" 2>&1 || echo "$v$r $b failed" >&2
        done
    done
done
python3 "$(dirname "$0")/compare_builds.py" "$out" "$rounds" $benches
