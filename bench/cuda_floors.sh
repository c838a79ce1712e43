#!/bin/sh
# The fused attention call next to its floors (docs/history/attention-cuda.md, ninth pass):
# the arithmetic alone (a bundle built with MEASURE=-DKVQ_CU_MEASURE_COMPUTEONLY),
# the copies alone (MEASURE=-DKVQ_CU_MEASURE_LOADONLY) and a plain read of the
# same bytes (the normal bundle's us_read). The three bundles run in turn,
# ROUNDS times, tq3j/tq3 only; each figure is the median over the rounds.
#
#   sh bench/cuda_floors.sh NORMAL_DEV COMPUTE_DEV LOAD_DEV OUT [batches] [contexts] [rounds]
#   e.g. sh bench/cuda_floors.sh build-cuda/dev build-co/dev build-lo/dev "$OUT"
#
# Bundles come from bench/cuda_bundle.sh (with the same MEASURE as their
# make). Writes OUT/floors.json and prints the table.
set -e
[ $# -ge 4 ] || { echo "usage: $0 NORMAL_DEV COMPUTE_DEV LOAD_DEV OUT [batches] [contexts] [rounds]" >&2; exit 2; }
normal=$1 compute=$2 load=$3 out=$4
batches=${5:-1,8,32} contexts=${6:-131072,65536,32768,16384,4096} rounds=${7:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
r=1
while [ "$r" -le "$rounds" ]; do
    for kind in call compute load; do
        case $kind in call) dev=$normal ;; compute) dev=$compute ;; load) dev=$load ;; esac
        mkdir -p "$tmp/$kind$r"
        LD_LIBRARY_PATH="$dev/lib" KVQ_BENCH_PROFILE=1 KVQ_BENCH_BATCH="$batches" KVQ_BENCH_CTX="$contexts" \
            KVQ_BENCH_COMPARE=0 KVQ_BENCH_GRAPH=0 KVQ_BENCH_JSON_DIR="$tmp/$kind$r" \
            "$dev/bench/bench_cuda" >"$tmp/$kind$r/stdout.txt" 2>&1 ||
            { tail -5 "$tmp/$kind$r/stdout.txt" >&2; exit 1; }
    done
    echo "round $r of $rounds done" >&2
    r=$((r + 1))
done
python3 - "$tmp" "$rounds" "$out/floors.json" <<'PY'
import json, statistics, sys
tmp, rounds, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {}
for kind in ("call", "compute", "load"):
    for r in range(1, rounds + 1):
        for x in json.load(open(f"{tmp}/{kind}{r}/bench_cuda.json"))["results"]:
            key = (x["batch"], x["context"])
            runs.setdefault(key, {}).setdefault(kind, []).append(x["us"])
            if kind == "call" and "us_read" in x:
                runs[key].setdefault("read", []).append(x["us_read"])
rows = []
for (b, n), v in sorted(runs.items()):
    med = {k: statistics.median(v[k]) for k in v}
    rows.append({"batch": b, "context": n, "us_call": med["call"], "us_compute_only": med["compute"],
                 "us_load_only": med["load"], "us_read": med.get("read", 0.0), "rounds": rounds})
json.dump({"kind": "tq3j/tq3", "results": rows}, open(dst, "w"), indent=1)
print("| batch | context | call us | arithmetic alone | copies alone | plain read | call / max(floors) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for x in rows:
    fl = max(x["us_compute_only"], x["us_load_only"])
    print(f"| {x['batch']} | {x['context'] // 1024}K | {x['us_call']:.1f} | {x['us_compute_only']:.1f} | "
          f"{x['us_load_only']:.1f} | {x['us_read']:.1f} | {x['us_call'] / fl:.2f}x |")
PY
