#!/bin/sh
# Packs the GPU tests (test_cuda, test_decoder_cuda, test_backend_ops,
# test_batch, test_batch_share, test_sample_cuda), the
# kvq command, bench_cuda and bench_prefill_cuda for a GPU machine that has no Debian -dev
# packages and a small transfer budget: FFTW linked statically, the few
# shared libraries left copied next to the binaries, and BLAS replaced by a
# plain-loop shim (OpenBLAS's static archive alone is ~28 MB; only the CPU
# decoder calls BLAS, in the tests that compare the GPU decoder with it, and
# the shim's double-precision loops are exact enough and merely slow there).
# cuBLAS, which the decoder's CUDA backend calls, is taken from the GPU
# machine's toolkit. Run after
# `make BUILD=$BUILD tests benches`.
#
#   sh bench/cuda_bundle.sh BUILD        -> BUILD/dev/{tests,bench,lib,kvq}
# On the GPU machine:  LD_LIBRARY_PATH=BUILD/dev/lib sh bench/run_cuda.sh BUILD/dev OUT
set -e
build=${1:-build}
dev="$build/dev"
mkdir -p "$dev/tests" "$dev/bench" "$dev/lib" "$dev/obj"
cat >"$dev/obj/blas_shim.c" <<'EOF'
/* Naive CBLAS subset (row/column major, transposes), for the GPU bundle only;
 * entries of a product in parallel (OpenMP; a decode step is one row, so
 * rows alone would leave it on one thread), each computed alone, so results do
 * not depend on the thread count. */
enum { RowMajor = 101, NoTrans = 111 };
#define AT(M, ld, r, c, rowmajor) ((rowmajor) ? (M)[(long)(r) * (ld) + (c)] : (M)[(long)(c) * (ld) + (r)])
void openblas_set_num_threads(int n) { (void)n; }
char *openblas_get_corename(void) { return (char *)"kvq-shim"; }
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
        _Pragma("omp parallel for collapse(2) schedule(static)")                                         \
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
cc -O2 -fopenmp -c "$dev/obj/blas_shim.c" -o "$dev/obj/blas_shim.o"
# cuBLAS (the decoder's CUDA backend) stays a shared library: the GPU
# machine's toolkit has it under /usr/local/cuda/lib64 (rpath), and it is far
# larger than the transfer limit, so it is never copied into the bundle.
tool_objs=$(ls "$build"/obj/tools/*.o | grep -v '/kvq\.o$')
libs="$build/lib/libkvq.a $dev/obj/blas_shim.o -fopenmp -Wl,-Bstatic -lfftw3f -Wl,-Bdynamic -lcjson -lpcre2-8 -lutf8proc"
libs="$libs -lmicrohttpd -lm -lpthread"
libs="$libs -L/usr/local/cuda/lib64 -lcudart_static -lcublas -Wl,-rpath,/usr/local/cuda/lib64 -ldl -lrt -lstdc++"
for t in test_cuda test_decoder_cuda test_backend_ops test_batch test_batch_share test_sample_cuda; do
    [ -f "$build/obj/tests/$t.o" ] && cc -o "$dev/tests/$t" "$build/obj/tests/$t.o" $tool_objs $libs
done
cc -o "$dev/kvq" "$build/obj/tools/kvq.o" $tool_objs $libs
# bench_cuda, bench_prefill_cuda: make's objects, with the bench-only GPU
# helpers (bench_cuda_util.cu)
for b in bench_cuda bench_prefill_cuda; do
    cc -o "$dev/bench/$b" "$build/obj/bench/$b.o" "$build/obj/bench/bench_cuda_util.o" $libs
done
cc -o "$dev/bench/bench_decoder_cuda" "$build/obj/bench/bench_decoder_cuda.o" $libs
strip "$dev"/tests/* "$dev"/bench/* "$dev/kvq"
for so in $(ldd "$dev/kvq" | awk '/=>/ {print $3}'); do
    case "$so" in */libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*|*/ld-linux*|*/libcublas*) ;; *) cp -L "$so" "$dev/lib/" ;; esac
done
rm -rf "$dev/obj"
du -sh "$dev"
