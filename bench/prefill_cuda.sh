#!/bin/sh
# prefill_cuda.sh - the GPU prefill work in one device call (issue 37):
#   test   test_backend_ops -o prefill,prefill-dense -b cuda: the tile kernel
#          and the dense path (kvq_cuda_prefill_ws) against token-by-token
#          attention on a CPU cache, every position, every case;
#   test-mma, attn-mma   the same with KVQ_CUDA_NO_WGMMA=1 (the dense path's
#          mma.sync kernel instead of the warpgroup one: the A/B);
#   memcheck, racecheck   compute-sanitizer on prefill-dense
#          (KVQ_CUDA_TEST_SMALL=1);
#   ppl    kvq ppl on the bundled model, CPU against GPU (the dense path),
#          f16 and the default cache, 4K context, KVQ_PPL_TOKENS (8192)
#          tokens; on the GPU also with --exact-prefill;
#   attn   bench_prefill_cuda: tile vs dense, chunk of 2048 after pasts of
#          0 .. 126K, f16 / tq3j/tq3 / + window;
#   ref    the 2-layer Llama-3.1-8B-shaped checkpoint: test_decoder_cuda
#          against transformers (bench/decoder_cuda.sh ref);
#   model  the 32-layer checkpoint: bench_decoder_cuda --prefill (f16 and
#          the default pair, exact and --fast-prefill products);
#   hf     transformers (DynamicCache, SDPA, bf16) on the same checkpoint,
#          32K and 128K prompts;
#   sdpa   bench/sdpa_prefill.py: PyTorch's SDPA (cuDNN / flash) on
#          bench_prefill_cuda's chunk;
#   gputests  the decoder's GPU tests (test_batch, test_batch_share,
#          test_cache_window, test_decoder_moe, test_decoder_window);
#   ab     test_batch_share and test_decoder_cuda with each dense-path
#          kernel (default, KVQ_CUDA_NO_WGMMA=1).
#
#   sh bench/prefill_cuda.sh KIT OUT [STAGES]
# KIT: bench/device_kit.sh's archive, made here; the build (build-dev, sm_90a)
# is made there first. Every stage under its own timeout; a summary line per
# stage in OUT/summary.txt.
kit=$1
out=$2
stages=${3:-test,memcheck,racecheck,ppl,attn,model}
mkdir -p "$out"
dev=build-dev
has() { case ",$stages," in *",$1,"*) return 0 ;; esac; return 1; }
t0=$(date +%s)
. bench/device_step.sh
device_info
step build 400 sh bench/device_kit.sh --build "$kit" "$dev" ${KVQ_BUILD_TARGETS:-all tests benches}
tail -n 3 "$out/build.log"
if has test; then
    step test 300 "$dev/tests/test_backend_ops" -o "${KVQ_TEST_OPS:-prefill,prefill-dense}" -b "cuda*" -v
    grep -E "FAIL|worst|passed|prefill" "$out/test.log" | tail -n 60
fi
if has test-mma; then
    KVQ_CUDA_NO_WGMMA=1 step test-mma 300 "$dev/tests/test_backend_ops" -o prefill-dense -b "cuda*" -v
    grep -E "FAIL|worst|passed" "$out/test-mma.log" | tail -n 20
fi
if has memcheck; then
    KVQ_CUDA_TEST_SMALL=1 step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$dev/tests/test_backend_ops" -o prefill-dense -b cuda -t tq3j/tq3,f16/f16
    tail -n 3 "$out/memcheck.log"
fi
if has racecheck; then
    KVQ_CUDA_TEST_SMALL=1 step racecheck 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$dev/tests/test_backend_ops" -o prefill-dense -b cuda -t tq3j/tq3
    tail -n 3 "$out/racecheck.log"
fi
if has ppl; then
    M=models/kvq-tiny-llama
    for dv in ${KVQ_PPL_DEVICES:-cpu cuda}; do
        for ty in "-ctk f16 -ctv f16" "" "-ctk f16 -ctv f16 --exact-prefill" "--exact-prefill"; do
            [ $dv = cpu ] && case "$ty" in *exact*) continue ;; esac
            tag="ppl-$dv-$(echo "${ty:-default}" | tr -d ' -')"
            step "$tag" 240 "$dev/bin/kvq" ppl --model $M --file $M/reference/valid.txt --ctx 4096 \
                --max-tokens "${KVQ_PPL_TOKENS:-8192}" --device $dv $ty
            grep "^ppl " "$out/$tag.log" | tail -n 1
        done
    done
fi
if has attn; then
    step attn 300 "$dev/bench/bench_prefill_cuda" --json "$out/bench_prefill_cuda.json"
    cat "$out/attn.log"
fi
if has attn-mma; then
    KVQ_CUDA_NO_WGMMA=1 step attn-mma 300 "$dev/bench/bench_prefill_cuda" --json "$out/bench_prefill_cuda_mma.json"
    cat "$out/attn-mma.log"
fi
if has ncu; then # one attention launch over a 32K past (f16 cache): the kernel's limiter
    KVQ_BENCH_REPS=1 step ncu 240 ncu --clock-control none -k regex:"${KVQ_NCU_KERNEL:-fa_ws_kernel}" --launch-skip 8 -c 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats "$dev/bench/bench_prefill_cuda"
    grep -E "Throughput|Pipe|Occupancy|Registers|Stall|Warp Cycles|Duration|Bank|Shared" "$out/ncu.log" | head -n 40
fi
if has model; then
    [ -f /tmp/llama31-8b/config.json ] || step make8b 300 python3 bench/hf_llama_shape.py make --out /tmp/llama31-8b
    step model "${KVQ_MODEL_TIMEOUT:-420}" "$dev/bench/bench_decoder_cuda" --model /tmp/llama31-8b --ctx 0 --batch 1 \
        --types "${KVQ_PREFILL_TYPES:-f16/f16,tq3j/tq3+ctr}" --prefill "${KVQ_PREFILL_CTX:-4096,32768,131072}" \
        --fast-prefill both --json "$out/bench_decoder_cuda.json"
    grep -iE "prefill|error|skip" "$out/model.log" | head -n 40
fi
if has hf; then
    [ -f /tmp/llama31-8b/config.json ] || step make8b 300 python3 bench/hf_llama_shape.py make --out /tmp/llama31-8b
    step hf 300 python3 bench/hf_llama_shape.py bench --model /tmp/llama31-8b --ctx 32768,131072 --json "$out/hf.json"
    tail -n 5 "$out/hf.log"
fi
if has sdpa; then
    step sdpa 200 python3 bench/sdpa_prefill.py --out "$out/sdpa_prefill.json"
    tail -n 12 "$out/sdpa.log"
fi
if has gputests; then
    for t in test_batch test_batch_share test_cache_window test_decoder_moe test_decoder_window; do
        step "$t" 200 "$dev/tests/$t"
        tail -n 1 "$out/$t.log"
    done
fi
if has ab; then
    for t in test_batch_share test_decoder_cuda; do
        for v in default NO_WGMMA; do
            case $v in default) e= ;; *) e="KVQ_CUDA_$v=1" ;; esac
            timeout 150 env $e "$dev/tests/$t" >"$out/ab-$t-$v.log" 2>&1
            echo "ab $t $v: rc $? $(grep -E 'FAIL|perplexity|passed|failed' "$out/ab-$t-$v.log" | tail -n 12 | tr '\n' ' ')" |
                tee -a "$out/summary.txt"
        done
    done
fi
if has ref; then
    KVQ_SHAPE_TMP=/tmp step ref 400 sh bench/decoder_cuda.sh "$dev" "$out/ref" ref
    tail -n 20 "$out/ref.log"
fi
echo "total $(($(date +%s) - t0))s" | tee -a "$out/summary.txt"
# the device tool brings back 8 files: the logs travel as one archive
(cd "$out" && tar czf logs.tar.gz ./*.log ./*.txt ./*.json 2>/dev/null && rm -f ./*.log)
