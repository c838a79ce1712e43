#!/bin/sh
# The PyTorch backend's device-free tests (python/tests/test_pure.py) against
# this build's libkvq.so: above all that every ctypes struct still has the C
# layout (a field added to a C config must reach python/kvq_torch/_lib.py).
# Skipped without python3 or cc, and for a sanitized library (python would
# need the sanitizer runtime preloaded). KVQ_BUILD names the build directory.
name=test_python.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
lib=$build/lib/libkvq.so
if ! command -v python3 >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1 || [ ! -f "$lib" ]; then
    echo "skip: needs python3, cc and $lib"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
if nm -D "$lib" 2>/dev/null | grep -q ' U __asan_init'; then
    echo "skip: $lib is sanitized"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
out=$(cd "$root" && KVQ_LIB=$lib timeout 300 python3 python/tests/runner.py test_pure 2>&1); rc=$?
echo "$out"
counts=$(echo "$out" | sed -n -E 's/^([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/p' | tail -n 1)
if [ -z "$counts" ]; then
    echo "$name: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
set -- $counts
[ "$2" -eq 0 ] && [ "$rc" -ne 0 ] && set -- "$1" 1 "$3"
echo "$name: $1 passed, $2 failed, $3 skipped"
[ "$2" -eq 0 ]
