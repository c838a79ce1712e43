#!/bin/sh
# `make run`: the bundled model (kvq-tiny-llama) answers a ~3.5K-token
# passkey prompt with the default compressed KV cache (tq3j keys, tq3 values,
# recent-token f16 window)
# and reports the memory the cache saved against f16.
# The prompt (models/passkey-3500.txt) follows the fixture's passkey format
# (models/kvq-tiny-llama/FIXTURES.md); the model answers " KEY." greedily.
set -eu
# BUILD: the directory whose bin/kvq runs (the Makefile passes build/cpu
# when CUDA is on: the demo runs on the CPU and needs no .cu object).
build=${1:-build}
kvq="$build/bin/kvq"
model=models/kvq-tiny-llama
prompt=models/passkey-3500.txt
key=$(sed -n 's/.*The pass key is \([0-9][0-9]*\)\. Remember it.*/\1/p' "$prompt")
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "== kvq run: $model (Llama, 4 layers, 4 query / 2 KV heads, head_dim 128)"
echo "   prompt:   $prompt, $(wc -c <"$prompt") bytes of filler with a key hidden inside (the key is $key)"
echo "   KV cache: tq3j keys (4.25 bits/value) + tq3 values (3.125 bits/value), fused attention;"
echo "             the last, partly filled 64-token page also in f16 (the default recent-token window)"
echo
printf 'model answer: '
"$kvq" run --model "$model" --prompt-file "$prompt" --max-tokens 16 | tee "$out"
echo
if grep -q "$key" "$out"; then
    echo "passkey retrieved: $key"
else
    echo "passkey NOT retrieved (expected $key)"
    exit 1
fi
