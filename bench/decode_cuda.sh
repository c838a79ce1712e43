#!/bin/sh
# decode_cuda.sh - the GPU decode work in one device call (issue 38):
#   test   test_decoder_cuda (KVQ_DECODE_TESTS: a KVQ_TEST_ONLY list);
#   ops    test_backend_ops' decode-attention ops on the GPU against the CPU
#          (attend, attend-window: the window's rows, the key means' gains),
#          then compute-sanitizer memcheck over them (KVQ_CUDA_TEST_SMALL=1);
#   b1     bench_decoder_cuda on the Llama-3.1-8B-shaped checkpoint, batch 1,
#          f16 and the default cache at 4K / 32K / 128K;
#   b8     the same at batch 8;
#   ncu    one decode step per shape under Nsight Compute: every kernel's
#          device time and DRAM bytes, summed per kernel name
#          (bench/ncu_step.py), against the step's wall time.
#
#   sh bench/decode_cuda.sh KIT OUT [STAGES]
# KIT: bench/device_kit.sh's archive; the build (build-dev, sm_90a) is made
# there first, while the checkpoint is written (/tmp/llama31-8b).
kit=$1
out=$2
stages=${3:-b1,ncu,b8,ops,test}
mkdir -p "$out"
dev=build-dev
M=/tmp/llama31-8b
t0=$(date +%s)
. bench/device_step.sh
device_info
[ -f $M/config.json ] || (python3 bench/hf_llama_shape.py make --out $M >"$out/make8b.log" 2>&1; echo "make8b rc=$?" >>"$out/summary.txt") &
ckpt=$!
step build 300 sh bench/device_kit.sh --build "$kit" "$dev" $dev/bench/bench_decoder_cuda $dev/tests/test_decoder_cuda \
    $dev/tests/test_backend_ops
tail -n 3 "$out/build.log"
do_test() {
    KVQ_TEST_ONLY=${KVQ_DECODE_TESTS:-} step test 120 stdbuf -oL "$dev/tests/test_decoder_cuda"
    grep -E "FAIL|bit-identical|passed" "$out/test.log" | tail -n 30
}
do_ops() {
    step ops 120 stdbuf -oL "$dev/tests/test_backend_ops" -o attend,attend-window -b "cuda*"
    grep -E "FAIL|worst|passed" "$out/ops.log" | tail -n 20
    KVQ_CUDA_TEST_SMALL=1 step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$dev/tests/test_backend_ops" -o attend-window -b cuda
    tail -n 3 "$out/memcheck.log"
}
run_bench() { # NAME CAP ARGS...
    name=$1 cap=$2
    shift 2
    wait $ckpt
    step "$name" "$cap" "$dev/bench/bench_decoder_cuda" --model $M --prefill 0 --steps 24 --graphs on \
        --json "$out/$name.json" "$@"
    grep -E "^(f16|tq3j)" "$out/$name.log"
}
do_b1() {
    run_bench batch1 200 --batch 1 --ctx "${KVQ_DECODE_CTX:-4096,32768,131072}" --types f16/f16,tq3j/tq3+ctr
}
do_b8() {
    run_bench batch8 200 --batch 8 --ctx 4096,32768,131072 --types f16/f16,tq3j/tq3+ctr
}
do_ncu() {
    wait $ckpt
    for shape in "tq3j/tq3+ctr 1 4096" "tq3j/tq3+ctr 1 131072" "tq3j/tq3+ctr 8 32768"; do
        set -- $shape
        tag=ncu-$(echo "$1" | tr -d '/+')-b$2-$3
        KVQ_BENCH_PROFILE=1 step "$tag" 120 ncu --profile-from-start off --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
            "$dev/bench/bench_decoder_cuda" --model $M --prefill 0 --steps 2 --graphs on --types "$1" --batch "$2" \
            --ctx "$3"
        python3 bench/ncu_step.py "$out/$tag.log" | tee "$out/$tag.txt"
    done
}
# the stages in the order given
for s in $(echo "$stages" | tr , ' '); do
    "do_$s"
done
echo "total $(($(date +%s) - t0))s" | tee -a "$out/summary.txt"
# the device tool brings back 8 files: the logs travel as one archive
(cd "$out" && tar czf logs.tar.gz ./*.log ./*.txt 2>/dev/null && rm -f ./*.log)
