#!/bin/sh
# tp_scale.sh - issue 23's multi-GPU run in one device call: the 32-layer
# Llama-3.1-8B-shaped random checkpoint (bench/hf_llama_shape.py make), then
# bench/tp_scale.py under torchrun for each GPU count, then the table.
#
#   sh bench/tp_scale.sh OUT [PYDEV_TAR] [COUNTS]
# PYDEV_TAR: python/bundle.sh's folder packed as bench/device_round.sh
# prepare packs it (default .devbundle/round/pydev.tar.xz); COUNTS: GPU
# counts (default "1 N" for the N GPUs present). OUT gets tpN.json,
# table.md and log.txt. TP_ARGS adds options to tp_scale.py.
out=${1:?usage: sh bench/tp_scale.sh OUT [PYDEV_TAR] [COUNTS]}
tarball=${2:-.devbundle/round/pydev.tar.xz}
mkdir -p "$out"
log=$out/log.txt
say() { echo "[$(date -u +%T)] $*" | tee -a "$log"; }
work=${TMPDIR:-/tmp}/kvq-tp
mkdir -p "$work"
[ -f "$tarball" ] || { say "tp_scale: no $tarball"; exit 2; }
xz -dc "$tarball" | tar xf - -C "$work" || { say "tp_scale: cannot unpack $tarball"; exit 2; }
dev=$work/pydev
export KVQ_LIB="$dev/lib/libkvq.so.0" LD_LIBRARY_PATH="$dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
counts=${3:-$( [ "$ngpu" -gt 1 ] && echo "1 $ngpu" || echo 1)}
say "$ngpu GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); counts: $counts"
ckpt=$work/llama31-8b-shape
if [ ! -f "$ckpt/config.json" ]; then
    say "making the checkpoint"
    python3 bench/hf_llama_shape.py make --layers 32 --out "$ckpt" >>"$log" 2>&1 || { say "make failed"; tail -5 "$log"; exit 1; }
fi
say "checkpoint: $(du -sh "$ckpt" | cut -f1)"
files=""
for n in $counts; do
    say "torchrun --nproc-per-node $n"
    # shellcheck disable=SC2086
    torchrun --standalone --nproc-per-node "$n" bench/tp_scale.py --model "$ckpt" --json "$out/tp$n.json" \
        ${TP_ARGS:-} >>"$log" 2>&1
    say "world $n: exit $?"
    grep '^{\|^tp_scale' "$log" | tail -n 12
    [ -f "$out/tp$n.json" ] && files="$files $out/tp$n.json"
done
# shellcheck disable=SC2086
[ -n "$files" ] && python3 bench/tp_scale.py --table $files | tee "$out/table.md"
