#!/bin/sh
# bench_eval.sh - times `kvq eval --sweep` over both fixture dumps (the
# issue's budget: under a minute, single thread) and keeps its results.
#
#   sh bench/bench_eval.sh [BUILD]        (default build; REPEAT=3 runs)
#
# Prints one line per run and the median, writes bench_eval.json (times) to
# $KVQ_BENCH_JSON_DIR (default BUILD/bench) and the sweep's own JSON, CSV
# and plots next to it. Measures only; never fails on speed.
set -eu
build=${1:-build}
kvq=$build/bin/kvq
ref=models/kvq-tiny-llama/reference
out=${KVQ_BENCH_JSON_DIR:-$build/bench}
repeat=${REPEAT:-3}
[ -x "$kvq" ] || { echo "bench_eval: $kvq not built (make BUILD=$build)" >&2; exit 1; }
mkdir -p "$out"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "kvq eval --sweep $ref/kv_text.safetensors $ref/kv_passkey.safetensors (OpenBLAS and kvq single-threaded)"
times=""
i=1
while [ "$i" -le "$repeat" ]; do
    # The first run also draws the plots (gnuplot adds well under a second).
    plot=""
    if [ "$i" -eq 1 ] && command -v gnuplot >/dev/null 2>&1; then plot="--plot $out/eval.png"; fi
    t0=$(date +%s.%N)
    OPENBLAS_NUM_THREADS=1 "$kvq" eval --sweep --quiet "$ref/kv_text.safetensors" "$ref/kv_passkey.safetensors" \
        --json-out "$out/eval_sweep.json" --csv "$out/eval_sweep.csv" $plot >"$out/eval_sweep.txt"
    t1=$(date +%s.%N)
    t=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
    printf "  run %d: %6.2f s\n" "$i" "$t"
    times="$times $t"
    i=$((i + 1))
done
median=$(printf "%s\n" $times | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
configs=$(grep -c '"label"' "$out/eval_sweep.json")
printf "median %.2f s for %d configuration runs (%s)\n" "$median" "$configs" "budget 60 s"
printf '{"bench": "eval_sweep", "inputs": ["kv_text", "kv_passkey"], "configurations": %d, "runs_s": [%s], "median_s": %s, "budget_s": 60}\n' \
    "$configs" "$(echo $times | sed 's/ /, /g')" "$median" >"$out/bench_eval.json"
echo "results: $out/eval_sweep.txt (table), eval_sweep.csv/json, eval-*.png; timings: $out/bench_eval.json"
