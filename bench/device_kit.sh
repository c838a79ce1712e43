#!/bin/sh
# device_kit.sh - what the GPU machine needs to build kvq itself: its image
# has nvcc and the CUDA toolkit but none of Debian's -dev packages, and a
# call carries at most 64 MiB (the tracked tree takes ~58), too little for
# prebuilt binaries (each holds ~12 MB of sm_90a code). The kit is the
# headers and libraries of the build dependencies from this machine (FFTW
# static, BLAS as bench/cuda_bundle.sh's plain-loop shim, the rest shared),
# ~3 MB packed.
#
#   sh bench/device_kit.sh OUT.tar.xz                      HERE: makes the kit
#   sh bench/device_kit.sh --build KIT.tar.xz BUILD [TARGETS]   ON THE DEVICE: unpacks it
#       to /tmp/kvq-kit and runs make BUILD=BUILD -j(cores) TARGETS (default:
#       all tests benches), sm_90a only
set -eu
if [ "${1:-}" = --build ]; then
    kit=/tmp/kvq-kit
    rm -rf "$kit" && mkdir -p "$kit"
    tar xJf "$2" -C "$kit"
    build=$3
    shift 3
    mkdir -p "$build" && touch "$build/.deps-ok" # the kit stands in for the packages mk/deps.sh checks
    export LD_LIBRARY_PATH="$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    exec make BUILD="$build" -j"$(nproc)" CC="cc -I$kit/include -L$kit/lib -Wl,-rpath,$kit/lib" \
        NVCC_GENCODE="-gencode=arch=compute_90a,code=sm_90a" EXTRA_LDLIBS="-fopenmp" ${@:-all tests benches}
fi
out=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include/cjson" "$tmp/lib"
for h in fftw3.h pcre2.h utf8proc.h microhttpd.h; do cp "/usr/include/$h" "$tmp/include/"; done
cp /usr/include/cjson/cJSON.h "$tmp/include/cjson/"
cp /usr/include/x86_64-linux-gnu/cblas.h /usr/include/x86_64-linux-gnu/openblas_config.h "$tmp/include/"
cp /usr/lib/x86_64-linux-gnu/libfftw3f.a "$tmp/lib/"
sed -n '/^cat >"$dev\/obj\/blas_shim.c" <<.EOF.$/,/^EOF$/p' bench/cuda_bundle.sh | sed '1d;$d' >"$tmp/blas_shim.c"
cc -O2 -fopenmp -c "$tmp/blas_shim.c" -o "$tmp/blas_shim.o"
ar rcs "$tmp/lib/libopenblas.a" "$tmp/blas_shim.o"
rm "$tmp/blas_shim.c" "$tmp/blas_shim.o"
# shared ones: the link name and the run-time name, and what they need at run time
for l in cjson pcre2-8 utf8proc microhttpd; do
    so=$(readlink -f "/usr/lib/x86_64-linux-gnu/lib$l.so")
    cp "$so" "$tmp/lib/"
    ln -sf "$(basename "$so")" "$tmp/lib/lib$l.so"
    soname=$(objdump -p "$so" | sed -n 's/ *SONAME *//p')
    [ "$soname" = "$(basename "$so")" ] || ln -sf "$(basename "$so")" "$tmp/lib/$soname"
done
for d in $(ldd /usr/lib/x86_64-linux-gnu/libmicrohttpd.so | awk '/=> \//{print $3}' | grep -v -E 'libc\.so|libm\.so|ld-linux'); do
    [ -e "$tmp/lib/$(basename "$d")" ] || cp -L "$d" "$tmp/lib/"
done
tar cf - -C "$tmp" include lib | xz -9 -T2 >"$out"
ls -la "$out"
