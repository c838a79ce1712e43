# device_step.sh - what the device-call scripts (prefill_cuda.sh,
# decode_cuda.sh) share; sourced with $out set:
#   step NAME CAP CMD...   runs CMD under CAP seconds, its output in
#                          $out/NAME.log, one line "NAME rc=RC Ns" in
#                          $out/summary.txt (and on stdout)
#   device_info            the GPU's name, memory, clock and driver in
#                          $out/device.txt
step() {
    name=$1 cap=$2
    shift 2
    s=$(date +%s)
    timeout "$cap" "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $(($(date +%s) - s))s" | tee -a "$out/summary.txt"
}
device_info() {
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv >"$out/device.txt" 2>&1
}
