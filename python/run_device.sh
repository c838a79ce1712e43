#!/bin/sh
# The whole kvq_torch GPU session in one call (budget: under 8 minutes on one
# H100): the pure and device tests (tests/runner.py), then the transformers
# benchmark (bench_hf.py). Writes 3 files to OUT: log.txt (everything printed),
# tests.json, bench.json. Progress and one PASS/FAIL/SKIP line per test go to
# stdout as they happen; the last lines summarise.
#
#   sh python/run_device.sh OUT [DEV]
# DEV: the folder python/bundle.sh made (default build/pydev; KVQ_DEV also works),
# with lib/libkvq.so.0 (CUDA) and the kvq command. Run from the repository root.
# BENCH_ARGS adds options to bench_hf.py (e.g. BENCH_ARGS="--ctx 32768 --no-compile").
out=${1:?usage: sh python/run_device.sh OUT [DEV]}
dev=${2:-${KVQ_DEV:-build/pydev}}
mkdir -p "$out"
log="$out/log.txt"
: >"$log"
start=$(date +%s)
say() { echo "$*" | tee -a "$log"; }
left() { echo $((460 - ($(date +%s) - start))); }
if [ ! -f "$dev/lib/libkvq.so.0" ] || [ ! -x "$dev/kvq" ]; then
    say "run_device: $dev/lib/libkvq.so.0 or $dev/kvq is missing: build them with python/bundle.sh"
    exit 2
fi
dev=$(cd "$dev" && pwd)
export KVQ_LIB="$dev/lib/libkvq.so.0" KVQ_BIN="$dev/kvq" LD_LIBRARY_PATH="$dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
say "== kvq_torch device run $(date -u '+%F %T') UTC"
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1 | tail -1)"
say "$("$KVQ_BIN" types --dim 128 2>&1 | grep '^default pair')"

say "== tests ($(left) s left)"
(timeout 270 python3 python/tests/runner.py test_pure test_device --json "$out/tests.json" 2>&1
 echo "tests: exit $? after $(($(date +%s) - start)) s") | tee -a "$log"

budget=$(left)
if [ "$budget" -gt 90 ]; then
    say "== bench ($budget s left)"
    (timeout "$budget" python3 python/bench_hf.py --json "$out/bench.json" --deadline-s $((budget - 20)) ${BENCH_ARGS:-} 2>&1
     echo "bench: exit $? after $(($(date +%s) - start)) s") | tee -a "$log"
else
    say "== bench skipped: $budget s left"
fi
summary=$(grep -E '^(FAIL|SKIP) |passed, .* failed|^(tests|bench): exit|^\||^torch.compile path' "$log")
say "== summary"
say "$summary"
say "total $(($(date +%s) - start)) s; results in $out (log.txt, tests.json, bench.json)"
