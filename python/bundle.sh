#!/bin/sh
# Packs what python/run_device.sh needs on a GPU machine that has no Debian
# -dev packages (nor, for these, their runtime libraries), as
# bench/cuda_bundle.sh does for the C binaries:
#   BUILD/pydev/lib/libkvq.so.0  libkvq with CUDA, relinked self-contained:
#                                FFTW and the CUDA runtime static, BLAS
#                                replaced by cuda_bundle.sh's plain-loop shim
#                                (only the CPU decoder calls BLAS; kvq_torch
#                                never does), the few shared libraries left
#                                copied next to it (rpath $ORIGIN); cuBLAS
#                                comes from the GPU machine's toolkit
#   BUILD/pydev/kvq              the kvq command (the C decoder's `kvq ppl`
#                                and tokenizer, the references of the tests)
# Run after `make BUILD=BUILD all` with nvcc present:
#   sh python/bundle.sh BUILD        (about 20 MB; carry BUILD/pydev to the device)
set -e
build=${1:-build}
out="$build/pydev"
[ -f "$build/lib/libkvq.a" ] && [ -f "$build/obj/tools/kvq.o" ] || { echo "bundle.sh: run make BUILD=$build all first" >&2; exit 2; }
if ! nm -A "$build/lib/libkvq.a" 2>/dev/null | grep -q 'cuda_cache\.o:.* T kvq_cuda_cache_create'; then
    echo "bundle.sh: $build/lib/libkvq.a has no CUDA device cache (built without nvcc?)" >&2
    exit 2
fi
rm -rf "$out"
mkdir -p "$out/lib" "$out/obj"
out=$(cd "$out" && pwd) # absolute: ldd prints the copies it finds through the rpath that way
# the BLAS shim: the one bench/cuda_bundle.sh writes (its here-document), so there is one copy of it
sed -n "/<<'EOF'/,/^EOF\$/p" bench/cuda_bundle.sh | sed '1d;$d' >"$out/obj/blas_shim.c"
cc -O2 -fPIC -fvisibility=hidden -fopenmp -c "$out/obj/blas_shim.c" -o "$out/obj/blas_shim.o"
cudart=$(ls /usr/local/cuda/lib64/libcudart_static.a /usr/local/cuda/targets/*/lib/libcudart_static.a 2>/dev/null | head -1)
sys="-fopenmp -Wl,-Bstatic -lfftw3f -Wl,-Bdynamic -lcjson -lpcre2-8 -lutf8proc -lm -lpthread"
cuda="$cudart -ldl -lrt -lstdc++ -L/usr/local/cuda/lib64 -lcublas -Wl,-rpath,/usr/local/cuda/lib64"
# --exclude-libs keeps FFTW's and the CUDA runtime's symbols out of the export
# table; libkvq.a's own KVQ_API functions stay exported (whole archive)
cc -shared -Wl,-soname,libkvq.so.0 -Wl,--exclude-libs,libfftw3f.a:$(basename "$cudart") -o "$out/lib/libkvq.so.0" \
    -Wl,--whole-archive "$build/lib/libkvq.a" -Wl,--no-whole-archive "$out/obj/blas_shim.o" $sys $cuda \
    -Wl,-rpath,'$ORIGIN'
ln -sf libkvq.so.0 "$out/lib/libkvq.so"
tool_objs=$(ls "$build"/obj/tools/*.o | grep -v '/kvq\.o$')
cc -o "$out/kvq" "$build/obj/tools/kvq.o" $tool_objs "$build/lib/libkvq.a" "$out/obj/blas_shim.o" $sys -lmicrohttpd \
    $cuda -Wl,-rpath,'$ORIGIN/lib'
strip --strip-unneeded "$out/lib/libkvq.so.0"
strip "$out/kvq"
for f in "$out/lib/libkvq.so.0" "$out/kvq"; do
    for so in $(ldd "$f" | awk '/=>/ {print $3}'); do
        case "$so" in */libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*|*/ld-linux*|*/libcublas*|*/libdl.so*|*/librt.so*|*/libpthread.so*) ;;
        "$out"/*) ;;
        *) cp -L "$so" "$out/lib/" ;; esac
    done
done
rm -rf "$out/obj"
du -sh "$out"
ls "$out" "$out/lib"
