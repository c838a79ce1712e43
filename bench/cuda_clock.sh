#!/bin/sh
# The SM clock each kernel actually ran at (docs/attention-cuda.md, "What limits it"):
# ncu without clock control, four metrics (one pass, so no replay), on the
# fused kernel of the normal bundle, of the arithmetic-alone and copies-alone
# bundles (as for bench/cuda_floors.sh), on the plain read, and on PyTorch
# SDPA's flash kernel. The clock is GPC cycles elapsed over the kernel's
# duration; nvidia-smi reports the target clock, which can differ.
#
#   sh bench/cuda_clock.sh NORMAL_DEV COMPUTE_DEV LOAD_DEV OUT ["B CTX;B CTX;..."]
#   e.g. sh bench/cuda_clock.sh build-cuda/dev build-co/dev build-lo/dev "$OUT"
#
# Needs ncu and, for SDPA, PyTorch. Writes OUT/clock.csv (ncu's rows, each
# prefixed with what ran and the shape), OUT/clock.json, and prints the table.
set -e
[ $# -ge 4 ] || { echo "usage: $0 NORMAL_DEV COMPUTE_DEV LOAD_DEV OUT [shapes]" >&2; exit 2; }
normal=$1 compute=$2 load=$3 out=$4
shapes=${5:-"1 32768;8 32768;8 65536;32 131072"}
here=$(dirname "$0")
metrics=gpc__cycles_elapsed.avg.per_second,gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum
mkdir -p "$out/clock-json"
csv="$out/clock.csv"
: >"$csv"
# ncu's CSV rows of one run, prefixed with what ran and the shape
tag() { grep '^"' | sed "s/^/$1,$2,$3,/" >>"$csv" || true; }
old_ifs=$IFS
IFS=';'
for shape in $shapes; do
    IFS=$old_ifs
    set -- $shape
    b=$1 n=$2
    for kind in call compute load; do
        case $kind in call) dev=$normal ;; compute) dev=$compute ;; load) dev=$load ;; esac
        # the normal bundle's touch_kernel launches are plain reads (the flush and the read floor)
        k='regex:^fast_kernel'
        [ $kind = call ] && k='regex:^(fast_kernel|touch_kernel)'
        env LD_LIBRARY_PATH="$dev/lib" KVQ_BENCH_PROFILE=1 KVQ_BENCH_BATCH="$b" KVQ_BENCH_CTX="$n" KVQ_BENCH_REPS=5 \
            KVQ_BENCH_COMPARE=0 KVQ_BENCH_GRAPH=0 KVQ_BENCH_JSON_DIR="$out/clock-json" \
            timeout 300 ncu --clock-control none --metrics "$metrics" --csv -k "$k" "$dev/bench/bench_cuda" 2>&1 |
            tag $kind "$b" "$n"
    done
    timeout 300 ncu --clock-control none --metrics "$metrics" --csv -k regex:flash_fwd python3 "$here/cuda_sdpa.py" \
        --batches "$b" --contexts "$n" --reps 5 --out "$out/clock-json/sdpa.json" 2>&1 | tag sdpa "$b" "$n"
    echo "$b x $n done" >&2
    IFS=';'
done
IFS=$old_ifs
python3 "$here/cuda_clock.py" "$csv" "$out/clock.json"
