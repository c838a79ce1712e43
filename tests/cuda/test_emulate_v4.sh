#!/bin/sh
# Runs the lane-level model of the V4 score path (emulate_v4.py: device code
# order, selectors, PRMT lookups, s8/u8 MMA fragments, biased accumulators)
# as part of `make test`; it needs no GPU, only python3 (skipped without).
name=test_emulate_v4.sh
dir=$(dirname "$0")
if ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP emulate_v4: no python3"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
if python3 "$dir/emulate_v4.py"; then
    echo "$name: 1 passed, 0 failed, 0 skipped"
else
    echo "$name: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
