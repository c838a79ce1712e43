/* matvec_internal.h - y = x . W^T for a few rows of x (decode, verification).
 *
 * OpenBLAS sgemm is slow for one row (it packs the whole matrix first), and
 * sgemv for a handful of rows streams the matrix once per row. This kernel
 * streams each weight row once for up to KVQ_MATVEC_MAX_M input rows, which
 * keeps an n-gram verification pass (T = N + 1) about as cheap as one decode
 * step. It is also batch-invariant: y[m][n] is computed by the same sequence
 * of floating-point operations whatever M is and wherever row m sits in the
 * batch, so the greedy token of a verification row is bit-identical to the
 * one plain decoding computes, which is what makes speculative greedy output
 * identical to plain decoding.
 *
 * Shapes: x [M][ldx] (K used), w [N][K] row-major, y [M][ldy] (N used).
 * accumulate: y += x . W^T instead of y = x . W^T.
 */
#ifndef KVQ_MATVEC_INTERNAL_H
#define KVQ_MATVEC_INTERNAL_H

#define KVQ_MATVEC_MAX_M 16

/* Weight element types of the _w variants: each weight is widened to f32
 * exactly before it is used, so the result equals the f32 kernel's over the
 * widened matrix, bit for bit. */
enum { KVQ_MV_F32 = 0, KVQ_MV_BF16 = 1, KVQ_MV_F16 = 2 };

/* Dispatches to the AVX2 kernel when the CPU has it, else the scalar one. */
void kvq_matvec(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate);

/* Scalar reference (double accumulation, k in order). */
void kvq_matvec_ref(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K,
                    int accumulate);

/* AVX2 + FMA kernel; call only when kvq_cpu_has_avx2(). */
void kvq_matvec_avx2(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K,
                     int accumulate);

/* The same over weights w of element type dtype (KVQ_MV_*), any alignment. */
void kvq_matvec_w(const float *x, int ldx, const void *w, int dtype, float *y, int ldy, int M, int N, int K,
                  int accumulate);
void kvq_matvec_ref_w(const float *x, int ldx, const void *w, int dtype, float *y, int ldy, int M, int N, int K,
                      int accumulate);
void kvq_matvec_avx2_w(const float *x, int ldx, const void *w, int dtype, float *y, int ldy, int M, int N, int K,
                       int accumulate);


#endif
