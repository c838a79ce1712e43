/* bench_encode.c - time to encode, decode and score one token-head row, per type.
 *
 * The headline: encoding one K tq3j row plus one V tq3 row at d = 128 (what
 * appending one token costs per KV head), target <= 1 us single-threaded.
 * Also every type's encode/decode/score, fast path and scalar reference,
 * and the batch API (which checks every row before writing any).
 *
 * Median over REPEATS of the time per call, each repeat long enough
 * (>= 2 ms) over NVEC different random vectors. Thread CPU time, so time
 * spent descheduled on a shared machine does not count. Prints a table;
 * writes bench_encode.json to $KVQ_BENCH_JSON_DIR (default: this binary's
 * folder).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec_internal.h"
#include "kvq_cpu.h"
#include "kvq_rng.h"
#include "bench_util.h"

#define DIM 128
#define NVEC 64
#define REPEATS 21
#define MIN_REPEAT_S 2e-3

/* What one timed call does; i picks the vector/row. */
struct job {
    const kvq_codec *k, *v;     /* v: the second codec of a K+V pair, or NULL */
    uint8_t *krows, *vrows;     /* NVEC rows each */
    const float *x;             /* NVEC vectors (K and V use the same data) */
    float *out;                 /* decode output */
    const float *qprep;         /* prepared query of codec k */
    int ref;
    volatile float sink;
};

enum op { OP_ENCODE, OP_DECODE, OP_SCORE, OP_PAIR, OP_BATCH };

static void run_once(struct job *j, enum op op, int i)
{
    const kvq_codec *c = j->k;
    const struct kvq_type_traits *tr = c->traits;
    struct kvq_row r = kvq_codec_packed_row(c, j->krows + (size_t)i * c->row_bytes);
    switch (op) {
    case OP_ENCODE:
        (j->ref ? tr->encode_ref : tr->encode)(c, j->x + i * DIM, &r);
        break;
    case OP_DECODE:
        (j->ref ? tr->decode_ref : tr->decode)(c, &r, j->out);
        break;
    case OP_SCORE:
        j->sink = (j->ref ? tr->score_ref : tr->score)(c, j->qprep, &r);
        break;
    case OP_PAIR: {
        struct kvq_row rv = kvq_codec_packed_row(j->v, j->vrows + (size_t)i * j->v->row_bytes);
        (j->ref ? tr->encode_ref : tr->encode)(c, j->x + i * DIM, &r);
        (j->ref ? j->v->traits->encode_ref : j->v->traits->encode)(j->v, j->x + ((i + 1) % NVEC) * DIM, &rv);
        break;
    }
    case OP_BATCH: /* all NVEC rows at once; divided by NVEC below */
        kvq_codec_encode(c, j->x, NVEC, j->krows);
        break;
    }
}

static double time_op(struct job *j, enum op op)
{
    double med[REPEATS];
    int calls = 1;
    for (;;) { /* calibrate: enough calls for MIN_REPEAT_S */
        double t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (int c = 0; c < calls; c++)
            run_once(j, op, c % NVEC);
        if (bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0 >= MIN_REPEAT_S || calls > (1 << 24))
            break;
        calls *= 2;
    }
    for (int r = 0; r < REPEATS; r++) {
        double t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (int c = 0; c < calls; c++)
            run_once(j, op, c % NVEC);
        med[r] = (bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / calls;
    }
    qsort(med, REPEATS, sizeof med[0], bench_cmp_double);
    return med[REPEATS / 2] * 1e9 / (op == OP_BATCH ? NVEC : 1);
}

static kvq_codec *make(enum kvq_type t)
{
    struct kvq_codec_config cfg;
    kvq_codec_config_default(&cfg, t, DIM);
    kvq_codec *c = NULL;
    kvq_status st = kvq_codec_create(&cfg, &c);
    if (st != KVQ_OK)
        fprintf(stderr, "bench_encode: %s: %s\n", kvq_type_traits(t)->name, kvq_status_str(st));
    return c;
}

static FILE *open_json(const char *argv0)
{
    char path[4096];
    const char *dir = getenv("KVQ_BENCH_JSON_DIR");
    if (dir && *dir) {
        snprintf(path, sizeof path, "%s/bench_encode.json", dir);
    } else {
        const char *slash = strrchr(argv0, '/');
        int len = slash ? (int)(slash - argv0) : 1;
        snprintf(path, sizeof path, "%.*s/bench_encode.json", len, slash ? argv0 : ".");
    }
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "bench_encode: cannot write %s\n", path);
    else
        printf("\nJSON: %s\n", path);
    return f;
}

int main(int argc, char **argv)
{
    (void)argc;
    static float x[NVEC * DIM], out[DIM], q[DIM], qprep[2 * DIM];
    static uint8_t krows[NVEC * 4 * DIM], vrows[NVEC * 4 * DIM];
    kvq_rng rng;
    kvq_rng_init(&rng, 1);
    for (int i = 0; i < NVEC * DIM; i++)
        x[i] = (float)kvq_rng_gauss(&rng);
    for (int i = 0; i < DIM; i++)
        q[i] = (float)kvq_rng_gauss(&rng);
    int simd = kvq_cpu_has_avx2();

    printf("bench_encode: one row (token x head) at d = %d, ns per call (median of %d), %s\n", DIM, REPEATS,
           simd ? "fast path = AVX2" : "fast path = scalar (no AVX2 or KVQ_FORCE_SCALAR)");
    double t_enc[KVQ_TYPE_COUNT][2], t_dec[KVQ_TYPE_COUNT][2], t_score[KVQ_TYPE_COUNT][2], t_batch[KVQ_TYPE_COUNT];
    printf("\n%-6s %6s %10s %10s %10s %10s %10s %10s %10s\n", "type", "bytes", "encode", "enc_ref", "batch/row",
           "decode", "dec_ref", "score", "score_ref");
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        kvq_codec *c = make((enum kvq_type)t);
        if (!c)
            return 1;
        kvq_codec_prepare_query(c, q, qprep);
        struct job j = {c, NULL, krows, vrows, x, out, qprep, 0, 0};
        for (int ref = 0; ref < 2; ref++) {
            j.ref = ref;
            t_enc[t][ref] = time_op(&j, OP_ENCODE);
            t_dec[t][ref] = time_op(&j, OP_DECODE);
            t_score[t][ref] = time_op(&j, OP_SCORE);
        }
        t_batch[t] = time_op(&j, OP_BATCH);
        printf("%-6s %6zu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n", c->traits->name, c->row_bytes,
               t_enc[t][0], t_enc[t][1], t_batch[t], t_dec[t][0], t_dec[t][1], t_score[t][0], t_score[t][1]);
        kvq_codec_free(c);
    }

    kvq_codec *ck = make(KVQ_DEFAULT_TYPE_K), *cv = make(KVQ_DEFAULT_TYPE_V);
    if (!ck || !cv)
        return 1;
    struct job pj = {ck, cv, krows, vrows, x, out, qprep, 0, 0};
    double pair = time_op(&pj, OP_PAIR);
    pj.ref = 1;
    double pair_ref = time_op(&pj, OP_PAIR);
    printf("\nK %s + V %s encode of one token-head pair: %.1f ns (target <= 1000 ns: %s); scalar reference %.1f ns "
           "(%.1fx)\n",
           ck->traits->name, cv->traits->name, pair, pair <= 1000.0 ? "met" : "MISSED", pair_ref, pair_ref / pair);
    printf("vs baselines, same data: q8_0 K+V %.1f ns, q4_0 K+V %.1f ns, f16 K+V %.1f ns\n",
           2 * t_enc[KVQ_TYPE_Q8_0][0], 2 * t_enc[KVQ_TYPE_Q4_0][0], 2 * t_enc[KVQ_TYPE_F16][0]);

    FILE *f = open_json(argv[0]);
    if (f) {
        fprintf(f, "{\n  \"bench\": \"bench_encode\",\n  \"dim\": %d,\n  \"simd\": %s,\n  \"unit\": \"ns per row\",\n",
                DIM, simd ? "true" : "false");
        fprintf(f, "  \"pair\": {\"k\": \"%s\", \"v\": \"%s\", \"encode_ns\": %.2f, \"encode_ref_ns\": %.2f, "
                   "\"target_ns\": 1000},\n  \"types\": [",
                ck->traits->name, cv->traits->name, pair, pair_ref);
        for (int t = 0; t < KVQ_TYPE_COUNT; t++)
            fprintf(f,
                    "%s\n    {\"type\": \"%s\", \"row_bytes\": %zu, \"encode_ns\": %.2f, \"encode_ref_ns\": %.2f, "
                    "\"batch_encode_ns\": %.2f, \"decode_ns\": %.2f, \"decode_ref_ns\": %.2f, \"score_ns\": %.2f, "
                    "\"score_ref_ns\": %.2f}",
                    t ? "," : "", kvq_type_traits((enum kvq_type)t)->name, kvq_type_row_bytes((enum kvq_type)t, DIM),
                    t_enc[t][0], t_enc[t][1], t_batch[t], t_dec[t][0], t_dec[t][1], t_score[t][0], t_score[t][1]);
        fprintf(f, "\n  ]\n}\n");
        fclose(f);
    }
    kvq_codec_free(ck);
    kvq_codec_free(cv);
    return 0;
}
