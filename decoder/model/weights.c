/* weights.c - weight matrices in the dtype they were stored in.
 *
 * A projection is read where it lies (the mapped safetensors file) and
 * widened to f32 only by the code that uses it: the few-row kernel widens
 * 8 weights per load, a chunk's sgemm widens a tile of rows at a time
 * (backend_cpu.c), an upload widens the whole matrix here. bf16 and f16
 * widen exactly, so every path computes over the same f32 values.
 */
#include <stdint.h>
#include <string.h>

#include "decoder_internal.h"
#include "kvq_half.h"

static void widen(const struct kvq_wblock *b, size_t first, size_t n, const int cols, float *dst)
{
    (void)cols;
    const uint8_t *p = b->data;
    switch (b->dtype) {
    case KVQ_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * (first + i), 2);
            dst[i] = kvq_bits_f32((uint32_t)h << 16);
        }
        break;
    case KVQ_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * (first + i), 2);
            dst[i] = kvq_f16_to_f32(h);
        }
        break;
    default:
        memcpy(dst, p + 4 * first, n * sizeof(float));
        break;
    }
}

void kvq_wmat_rows_f32(const struct kvq_wmat *w, int r0, int n, float *dst)
{
    int base = 0;
    for (int i = 0; i < w->n_blocks && n > 0; i++) {
        const struct kvq_wblock *b = &w->b[i];
        if (r0 < base + b->rows) {
            int from = r0 - base, take = b->rows - from < n ? b->rows - from : n;
            widen(b, (size_t)from * (size_t)w->cols, (size_t)take * (size_t)w->cols, w->cols, dst);
            dst += (size_t)take * (size_t)w->cols;
            r0 += take;
            n -= take;
        }
        base += b->rows;
    }
}

void kvq_wmat_to_f32(const struct kvq_wmat *w, float *dst)
{
    kvq_wmat_rows_f32(w, 0, w->rows, dst);
}

size_t kvq_wmat_bytes(const struct kvq_wmat *w)
{
    size_t s = 0;
    for (int i = 0; i < w->n_blocks; i++)
        s += (size_t)w->b[i].rows * (size_t)w->cols * kvq_st_dtype_size(w->b[i].dtype);
    return s;
}
