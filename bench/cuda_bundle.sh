#!/bin/sh
# Packs test_cuda and bench_cuda for a GPU machine that has no Debian -dev
# packages and a small transfer budget: FFTW linked statically, the few
# shared libraries left copied next to the binaries, and BLAS replaced by a
# plain-loop shim (the CUDA path never calls BLAS; OpenBLAS's static archive
# alone is ~28 MB). Where libkvq holds the decoder's CUDA backend, its cuBLAS
# calls get stubs that fail (CUBLAS_STATUS_NOT_INITIALIZED): neither binary
# runs the decoder, and cuBLAS itself is hundreds of MB. Run after
# `make BUILD=$BUILD tests benches`.
#
#   sh bench/cuda_bundle.sh BUILD        -> BUILD/dev/{tests,bench,lib}
# On the GPU machine:  LD_LIBRARY_PATH=BUILD/dev/lib sh bench/run_cuda.sh BUILD/dev OUT
set -e
build=${1:-build}
dev="$build/dev"
mkdir -p "$dev/tests" "$dev/bench" "$dev/lib" "$dev/obj"
cat >"$dev/obj/blas_shim.c" <<'EOF'
/* Naive CBLAS subset (row/column major, transposes), for the GPU bundle only. */
enum { RowMajor = 101, NoTrans = 111 };
#define AT(M, ld, r, c, rowmajor) ((rowmajor) ? (M)[(long)(r) * (ld) + (c)] : (M)[(long)(c) * (ld) + (r)])
void openblas_set_num_threads(int n) { (void)n; }
void cblas_sgemv(int order, int ta, int m, int n, float alpha, const float *a, int lda, const float *x, int incx,
                 float beta, float *y, int incy)
{
    int rm = order == RowMajor, tr = ta != NoTrans, rows = tr ? n : m, cols = tr ? m : n;
    for (int i = 0; i < rows; i++) {
        double s = 0.0;
        for (int j = 0; j < cols; j++)
            s += (double)(tr ? AT(a, lda, j, i, rm) : AT(a, lda, i, j, rm)) * x[(long)j * incx];
        y[(long)i * incy] = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * y[(long)i * incy]));
    }
}
#define GEMM(NAME, T)                                                                                      \
    void NAME(int order, int ta, int tb, int m, int n, int k, T alpha, const T *a, int lda, const T *b,  \
              int ldb, T beta, T *c, int ldc)                                                            \
    {                                                                                                    \
        int rm = order == RowMajor;                                                                      \
        for (int i = 0; i < m; i++)                                                                      \
            for (int j = 0; j < n; j++) {                                                                \
                double s = 0.0;                                                                          \
                for (int l = 0; l < k; l++)                                                              \
                    s += (double)(ta != NoTrans ? AT(a, lda, l, i, rm) : AT(a, lda, i, l, rm)) *          \
                         (double)(tb != NoTrans ? AT(b, ldb, j, l, rm) : AT(b, ldb, l, j, rm));           \
                T *cij = rm ? &c[(long)i * ldc + j] : &c[(long)j * ldc + i];                             \
                *cij = (T)(alpha * s + (beta == 0 ? 0.0 : (double)beta * *cij));                         \
            }                                                                                            \
    }
GEMM(cblas_sgemm, float)
GEMM(cblas_dgemm, double)
EOF
cc -O2 -c "$dev/obj/blas_shim.c" -o "$dev/obj/blas_shim.o"
# one failing stub per cuBLAS function libkvq calls (none, without the decoder's CUDA backend)
{
    echo "/* cuBLAS stubs for the GPU bundle only: every call fails (CUBLAS_STATUS_NOT_INITIALIZED). */"
    nm -u "$build/lib/libkvq.a" 2>/dev/null | awk '$1 == "U" && $2 ~ /^cublas/ {print $2}' | sort -u |
        while read -r f; do echo "int $f(void) { return 1; }"; done
} >"$dev/obj/cublas_shim.c"
cc -O2 -c "$dev/obj/cublas_shim.c" -o "$dev/obj/cublas_shim.o"
tool_objs=$(ls "$build"/obj/tools/*.o | grep -v '/kvq\.o$')
libs="$build/lib/libkvq.a $dev/obj/blas_shim.o $dev/obj/cublas_shim.o -Wl,-Bstatic -lfftw3f -Wl,-Bdynamic -lcjson -lm -lpthread"
libs="$libs -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++"
cc -o "$dev/tests/test_cuda" "$build/obj/tests/test_cuda.o" $tool_objs $libs
# bench_cuda: make's objects, with the bench-only GPU helpers (bench_cuda_util.cu)
cc -o "$dev/bench/bench_cuda" "$build/obj/bench/bench_cuda.o" "$build/obj/bench/bench_cuda_util.o" $libs
strip "$dev/tests/test_cuda" "$dev/bench/bench_cuda"
for so in $(ldd "$dev/tests/test_cuda" | awk '/=>/ {print $3}'); do
    case "$so" in */libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*|*/ld-linux*) ;; *) cp -L "$so" "$dev/lib/" ;; esac
done
rm -rf "$dev/obj"
du -sh "$dev"
