/* codec.c - codec objects: planning (codebook, R, S, kappa) and the batch entry points.
 *
 * The QJL scale kappa. decode() reconstructs the residual r (norm gamma) as
 * gamma * kappa * S^T s~ with s~ = sign(S r). For an orthogonal S and a
 * direction v = S r / gamma uniform on the sphere S^{d-1},
 *     E[S^T sign(S r)] = r / gamma * E[<v, sign v>] = r / gamma * d * E|v_1|,
 * so the estimate is unbiased exactly when kappa = 1 / (d E|v_1|), with
 *     E|v_1| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)).
 * The usual sqrt(pi/(2d)) is this constant's large-d limit (v_1 -> N(0, 1/d)).
 * A sphere coordinate has lighter tails than the Gaussian, so E|v_1| is a
 * little larger and the exact kappa smaller, by the factor 1 - 1/(4d) + O(1/d^2):
 * the limit would inflate every QJL term by ~0.2% at d = 128 and ~0.4% at
 * d = 64, an O(1/d) bias that does not average away over many keys.
 * (Exact for a Haar-distributed S r / gamma. With the single-round randomised
 * Hadamard S, E|(S r)_i| also depends on how heavy-tailed the residual is,
 * an effect of the same O(1/d) order: see tests/test_codec_qjl.c.)
 * For the paper's i.i.d. N(0,1) S with m = d rows, E[(S^T sign(S r))] =
 * m sqrt(2/pi) r / gamma, hence kappa = sqrt(pi/2) / d, exact at any d.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "rotation_internal.h"
#include "kvq_cpu.h"
#include "kvq_rng.h"

void kvq_codec_config_default(struct kvq_codec_config *cfg, enum kvq_type type, int dim)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->type = type;
    cfg->dim = dim;
    cfg->seed = 0;
    cfg->rot = KVQ_ROT_HADAMARD;
    cfg->qjl = KVQ_QJL_ORTHO;
}

static double qjl_kappa(enum kvq_qjl_kind kind, int d)
{
    if (kind == KVQ_QJL_GAUSS)
        return sqrt(M_PI / 2.0) / d;
    /* lgamma: Gamma(d/2) overflows a double beyond d ~ 340. */
    double e_abs = exp(lgamma(0.5 * d) - lgamma(0.5 * (d + 1))) / sqrt(M_PI);
    return 1.0 / (d * e_abs);
}

kvq_status kvq_codec_create(const struct kvq_codec_config *cfg, kvq_codec **out)
{
    if (!cfg || !out)
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_type_traits *tr = kvq_type_traits(cfg->type);
    if (!tr || (int)cfg->rot < 0 || cfg->rot >= KVQ_ROT_KIND_COUNT || (int)cfg->qjl < 0 ||
        cfg->qjl >= KVQ_QJL_KIND_COUNT)
        return KVQ_ERR_INVALID_ARG;
    /* R must be orthogonal: the norm and the codebook density rely on it. */
    if (cfg->rot == KVQ_ROT_GAUSS)
        return KVQ_ERR_INVALID_ARG;
    kvq_status st = kvq_type_check_dim(cfg->type, cfg->dim);
    if (st != KVQ_OK)
        return st;

    kvq_codec *c = calloc(1, sizeof *c);
    if (!c)
        return KVQ_ERR_NOMEM;
    c->cfg = *cfg;
    c->traits = tr;
    c->fields = kvq_layout_row_fields((int)cfg->type, cfg->dim);
    c->row_bytes = kvq_layout_row_bytes((int)cfg->type, cfg->dim);
    if (tr->rotated) {
        kvq_codebook cb;
        st = kvq_codebook_get(cfg->dim, tr->bits, KVQ_DIST_BETA, &cb);
        if (st != KVQ_OK)
            goto fail;
        if (cb.levels != (1 << tr->bits) || cb.levels > KVQ_TQ_MAX_LEVELS) {
            st = KVQ_ERR_INTERNAL;
            goto fail;
        }
        c->bits = tr->bits;
        c->levels = cb.levels;
        for (int i = 0; i < cb.levels; i++)
            c->centroids[i] = (float)cb.centroids[i];
        for (int i = 0; i + 1 < cb.levels; i++)
            c->boundaries[i] = (float)cb.boundaries[i];
        c->codebook_mse = cb.mse;
        st = kvq_rotation_create(cfg->dim, cfg->rot, kvq_seed_derive(cfg->seed, KVQ_SEED_STREAM_R),
                                 &c->rot);
        if (st != KVQ_OK)
            goto fail;
        if (tr->qjl) {
            enum kvq_rot_kind sk = cfg->qjl == KVQ_QJL_GAUSS ? KVQ_ROT_GAUSS : cfg->rot;
            /* rounds 0: the kind's default (only Hadamard takes several) */
            st = kvq_rotation_create_rounds(cfg->dim, sk, kvq_seed_derive(cfg->seed, KVQ_SEED_STREAM_S),
                                            sk == KVQ_ROT_HADAMARD ? KVQ_QJL_ROUNDS : 0, &c->qjl);
            if (st != KVQ_OK)
                goto fail;
            c->qjl_kappa = qjl_kappa(cfg->qjl, cfg->dim);
            c->qjl_kappa_f = (float)c->qjl_kappa;
        }
    } else if (tr->base != tr->type) { /* rotated baseline: R only, from the same stream as tq's */
        st = kvq_rotation_create(cfg->dim, cfg->rot, kvq_seed_derive(cfg->seed, KVQ_SEED_STREAM_R), &c->rot);
        if (st != KVQ_OK)
            goto fail;
    }
    *out = c;
    return KVQ_OK;
fail:
    kvq_codec_free(c);
    return st;
}

void kvq_codec_free(kvq_codec *c)
{
    if (!c)
        return;
    kvq_rotation_free(c->rot);
    kvq_rotation_free(c->qjl);
    free(c);
}

const struct kvq_codec_config *kvq_codec_config_of(const kvq_codec *c)
{
    return c ? &c->cfg : NULL;
}

const struct kvq_type_traits *kvq_codec_traits(const kvq_codec *c)
{
    return c ? c->traits : NULL;
}

size_t kvq_codec_row_bytes(const kvq_codec *c)
{
    return c ? c->row_bytes : 0;
}

double kvq_codec_qjl_kappa(const kvq_codec *c)
{
    return c ? c->qjl_kappa : 0.0;
}

struct kvq_row kvq_codec_packed_row(const kvq_codec *c, void *row)
{
    uint8_t *p = row;
    struct kvq_row r = {NULL, NULL, NULL, NULL};
    if (c->fields.norm) {
        r.norm = (uint16_t *)(void *)p;
        p += c->fields.norm;
    }
    if (c->fields.rnorm) {
        r.rnorm = (uint16_t *)(void *)p;
        p += c->fields.rnorm;
    }
    r.codes = p;
    p += c->fields.codes;
    if (c->fields.signs)
        r.signs = p;
    return r;
}

kvq_status kvq_codec_check_row(const kvq_codec *c, const float *x)
{
    if (c->traits->rotated)
        return kvq_cpu_has_avx2() ? kvq_tq_check_avx2(c, x) : kvq_tq_check_ref(c, x);
    if (c->traits->base != c->traits->type)
        return kvq_rotbase_check(c, x);
    return kvq_cpu_has_avx2() ? kvq_baseline_check_avx2(c, x) : kvq_baseline_check(c, x);
}

static kvq_status encode_rows(const kvq_codec *c, const float *x, size_t n_rows, void *rows, kvq_encode_fn enc)
{
    if (!c || (!x && n_rows) || (!rows && n_rows))
        return KVQ_ERR_INVALID_ARG;
    size_t d = (size_t)c->cfg.dim;
    for (size_t i = 0; i < n_rows; i++) {
        kvq_status st = kvq_codec_check_row(c, x + i * d);
        if (st != KVQ_OK)
            return st;
    }
    for (size_t i = 0; i < n_rows; i++) {
        struct kvq_row r = kvq_codec_packed_row(c, (uint8_t *)rows + i * c->row_bytes);
        kvq_status st = enc(c, x + i * d, &r);
        if (st != KVQ_OK)
            return KVQ_ERR_INTERNAL; /* the checks above admit exactly what encode accepts */
    }
    return KVQ_OK;
}

kvq_status kvq_codec_encode(const kvq_codec *c, const float *x, size_t n_rows, void *rows)
{
    return encode_rows(c, x, n_rows, rows, c ? c->traits->encode : NULL);
}

kvq_status kvq_codec_encode_ref(const kvq_codec *c, const float *x, size_t n_rows, void *rows)
{
    return encode_rows(c, x, n_rows, rows, c ? c->traits->encode_ref : NULL);
}

static kvq_status decode_rows(const kvq_codec *c, const void *rows, size_t n_rows, float *x, kvq_decode_fn dec)
{
    if (!c || (!x && n_rows) || (!rows && n_rows))
        return KVQ_ERR_INVALID_ARG;
    size_t d = (size_t)c->cfg.dim;
    for (size_t i = 0; i < n_rows; i++) {
        /* Decoding only reads the row; the view's pointers are non-const by type only. */
        struct kvq_row r = kvq_codec_packed_row(c, (uint8_t *)(uintptr_t)rows + i * c->row_bytes);
        dec(c, &r, x + i * d);
    }
    return KVQ_OK;
}

kvq_status kvq_codec_decode(const kvq_codec *c, const void *rows, size_t n_rows, float *x)
{
    return decode_rows(c, rows, n_rows, x, c ? c->traits->decode : NULL);
}

kvq_status kvq_codec_decode_ref(const kvq_codec *c, const void *rows, size_t n_rows, float *x)
{
    return decode_rows(c, rows, n_rows, x, c ? c->traits->decode_ref : NULL);
}

size_t kvq_codec_query_floats(const kvq_codec *c)
{
    if (!c)
        return 0;
    return (size_t)c->cfg.dim * (c->traits->rotated ? 2u : 1u);
}

kvq_status kvq_codec_prepare_query(const kvq_codec *c, const float *q, float *qprep)
{
    if (!c || !q || !qprep)
        return KVQ_ERR_INVALID_ARG;
    int d = c->cfg.dim;
    if (!kvq_all_finite(q, d))
        return KVQ_ERR_NONFINITE;
    if (c->traits->base != c->traits->type) { /* rotated baseline: <R q, R x> = <q, x> */
        kvq_rotation_apply(c->rot, q, qprep);
        return KVQ_OK;
    }
    if (!c->traits->rotated) {
        memmove(qprep, q, (size_t)d * sizeof(float));
        return KVQ_OK;
    }
    kvq_rotation_apply(c->rot, q, qprep);
    if (c->qjl)
        kvq_codec_s_apply(c, qprep, qprep + d);
    else /* tqB: no S; zeros keep the prepared query fully defined */
        memset(qprep + d, 0, (size_t)d * sizeof(float));
    return KVQ_OK;
}

float kvq_codec_score(const kvq_codec *c, const float *qprep, const struct kvq_row *row)
{
    return c->traits->score(c, qprep, row);
}
