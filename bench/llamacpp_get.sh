#!/bin/sh
# llamacpp_get.sh - llama.cpp's CPU build for the prefill comparison
# (bench/prefill_llamacpp.py), into build/llama/ (ignored by git):
#   - the npm package node-llama-cpp ships llama.cpp's source as a git bundle
#     (llama/gitRelease.bundle, tag in llama/llama.cpp.info.json); it is cloned
#     and built with cmake for this CPU (GGML_NATIVE), shared libraries, no
#     network features;
#   - bench/prefill_llamacpp.c is compiled against its llama.h;
#   - bench/gguf_write.py converts the bundled model to GGUF (bf16 = the
#     checkpoint's own bits, f32, f16).
#
#   sh bench/llamacpp_get.sh [NODE_LLAMA_CPP_VERSION]      (default 3.22.1)
#
# Needs npm, cmake, a C/C++ compiler, python3. Re-running skips what exists.
set -eu
ver=${1:-3.22.1}
root=$(pwd)
dir=build/llama
mkdir -p "$dir/gguf"
cd "$dir"
if [ ! -d src ]; then
    [ -f "node-llama-cpp-$ver.tgz" ] || npm pack "node-llama-cpp@$ver" >/dev/null
    mkdir -p nlc
    tar xzf "node-llama-cpp-$ver.tgz" -C nlc
    git clone -q nlc/package/llama/gitRelease.bundle src
fi
if [ ! -f src/b/bin/libllama.so ]; then
    cmake -S src -B src/b -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF >cmake.log
    cmake --build src/b -j"$(nproc)" --target llama >build.log
fi
lib=$(pwd)/src/b/bin
cc -O2 -std=c11 -Wall -Wextra -D_POSIX_C_SOURCE=200809L -I src/include -I src/ggml/include \
    "$root/bench/prefill_llamacpp.c" -o prefill_llamacpp -L"$lib" -lllama -lggml -lggml-base -Wl,-rpath,"$lib"
cd "$root"
for t in bf16 f32 f16; do
    [ -f "$dir/gguf/tiny-$t.gguf" ] || python3 bench/gguf_write.py models/kvq-tiny-llama "$dir/gguf/tiny-$t.gguf" --type "$t"
done
echo "llamacpp_get: $dir/prefill_llamacpp, $dir/gguf/ ($(git -C $dir/src log -1 --format=%h), node-llama-cpp $ver)"
