#!/bin/sh
# The decoder on the GPU, on the device machine, in one command:
#   ref    a 2-layer Llama-3.1-8B-shaped checkpoint with random bf16 weights
#          and transformers' logits for it (bench/hf_llama_shape.py make --ref),
#          then test_decoder_cuda against them (KVQ_HF_SHAPE_DIR);
#   kvq    the 32-layer checkpoint of that shape and bench_decoder_cuda on it
#          (decode at 4K/32K/128K, batch 1 and 8, f16 vs tq3j/tq3; prefill;
#          capacity);
#   hf     transformers (DynamicCache, SDPA, bf16) on the same checkpoint.
#
#   sh bench/decoder_cuda.sh DEV OUT [STAGES]     (DEV: bench/cuda_bundle.sh's output)
# Checkpoints go to $KVQ_SHAPE_TMP (default /tmp): ~3 GB and ~16 GB.
dev=$1
out=$2
stages=${3:-ref,kvq,hf}
tmp=${KVQ_SHAPE_TMP:-/tmp}
mkdir -p "$out"
has() { case ",$stages," in *",$1,"*) return 0 ;; esac; return 1; }
status=0
if has ref; then
    echo "== ref: 2 layers + transformers reference"
    timeout 300 python3 bench/hf_llama_shape.py make --out "$tmp/llama31-2l" --layers 2 --ref || status=1
    KVQ_HF_SHAPE_DIR="$tmp/llama31-2l" timeout 300 "$dev/tests/test_decoder_cuda" >"$out/test_decoder_cuda.log" 2>&1 ||
        status=1
    grep -E "^(ok|FAIL|SKIP)|Llama-3.1|perplexity|test_decoder_cuda:" "$out/test_decoder_cuda.log"
    rm -rf "$tmp/llama31-2l"
fi
if has kvq || has hf; then
    echo "== the 32-layer checkpoint"
    [ -f "$tmp/llama31-8b/config.json" ] || timeout 400 python3 bench/hf_llama_shape.py make --out "$tmp/llama31-8b" ||
        status=1
fi
if has kvq; then
    echo "== bench_decoder_cuda"
    timeout ${KVQ_BENCH_TIMEOUT:-900} "$dev/bench/bench_decoder_cuda" --model "$tmp/llama31-8b" \
        ${KVQ_BENCH_ARGS:-} --json "$out/bench_decoder_cuda.json" | tee "$out/bench_decoder_cuda.txt" || status=1
fi
if has hf; then
    echo "== transformers"
    timeout ${KVQ_HF_TIMEOUT:-600} python3 bench/hf_llama_shape.py bench --model "$tmp/llama31-8b" \
        ${KVQ_HF_ARGS:-} --json "$out/hf_peer.json" | tee "$out/hf_peer.txt" || status=1
fi
exit $status
