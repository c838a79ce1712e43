/* generate.c - prefill, then plain or n-gram speculative decoding.
 *
 * A speculative step feeds the pending token followed by up to N drafted
 * tokens in one forward (T = N + 1) and gets the model's own choice after
 * each prefix. Drafts are accepted while they equal that choice; the first
 * mismatch position supplies the next token for free, and the caches are
 * truncated back to drop the rejected drafts. Each accepted token was chosen
 * by the model from exactly the prefix plain decoding would have had, so
 * greedy output is identical to plain decoding, and sampled output (drawing
 * each row only while every earlier draft was accepted) has exactly the same
 * distribution.
 */
#include <string.h>

#include "backend.h"
#include "decoder_internal.h"
#include "matvec_internal.h"

_Static_assert(KVQ_MAX_DRAFT + 1 <= KVQ_MATVEC_MAX_M,
               "a verification pass must go through the batch-invariant kernel");

void kvq_gen_params_default(struct kvq_gen_params *p)
{
    memset(p, 0, sizeof *p);
    p->max_tokens = 64;
    p->top_p = 1.0f;
    p->stop_at_eos = 1;
}

int kvq_model_is_eos(const struct kvq_model_config *c, int32_t id)
{
    for (int i = 0; c && i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

/* The model's tokens after each of rows first..n-1 of ids (at most
 * KVQ_MAX_DRAFT + 1): the greedy argmax, or draws where the logits are, row
 * j at the sampler's j-th next uniform; row_st[j] is row j's status. The
 * caller advances the RNG past the draws it keeps, so the stream is the one
 * drawing row by row would give. */
static kvq_status next_tokens(kvq_seq *s, int greedy, const int32_t *ids, size_t n, size_t first, int32_t *tok,
                              kvq_status *row_st)
{
    if (greedy) {
        kvq_status st = kvq_seq_forward(s, ids, n, first, NULL, tok);
        for (size_t j = 0; j < n - first; j++)
            row_st[j] = st;
        return st;
    }
    double u[KVQ_MAX_DRAFT + 1];
    kvq_sampler_peek(s->sampler, u, (int)(n - first));
    struct kvq_seq_out o = {NULL, NULL, u, tok, row_st};
    return kvq_seq_forward_out(s, ids, n, first, &o);
}

/* New sampling parameters restart the RNG; unchanged ones keep the stream
 * going, so generating in several calls draws what one call would. */
static kvq_status set_sampling(kvq_seq *s, const struct kvq_gen_params *p)
{
    kvq_sampler_params sp = kvq_sampler_get_params(s->sampler);
    if (sp.temperature == p->temperature && sp.top_k == p->top_k && sp.top_p == p->top_p)
        return KVQ_OK;
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p;
    return kvq_sampler_set_params(s->sampler, &sp);
}

struct emitter {
    kvq_seq *s;
    const struct kvq_gen_params *p;
    int32_t *out;
    size_t n, max;
    kvq_token_fn fn;
    void *user;
};

/* @return 1 when generation must stop after this token. */
static int emit(struct emitter *e, int32_t id)
{
    e->out[e->n++] = id;
    e->s->st.decode_tokens++;
    int stop = e->n >= e->max || (e->p->stop_at_eos && kvq_model_is_eos(&e->s->m->cfg, id));
    if (e->fn && e->fn(e->user, id))
        stop = 1;
    return stop;
}

static kvq_status check_params(const struct kvq_gen_params *p)
{
    kvq_sampler_params sp = {p->temperature, p->top_k, p->top_p, 0};
    if (p->max_tokens < 0 || p->speculative < 0 || p->speculative > KVQ_MAX_DRAFT)
        return KVQ_ERR_INVALID_ARG;
    return kvq_sampler_params_check(&sp);
}

kvq_status kvq_seq_generate(kvq_seq *s, const int32_t *prompt, size_t n_prompt, const struct kvq_gen_params *p,
                            int32_t *out, size_t max_out, size_t *n_out, kvq_token_fn fn, void *user)
{
    if (!s || !prompt || !n_prompt || !p || !n_out || (!out && max_out))
        return KVQ_ERR_INVALID_ARG;
    *n_out = 0;
    kvq_status st = check_params(p);
    if (st == KVQ_OK)
        st = set_sampling(s, p);
    if (st != KVQ_OK)
        return st;
    int greedy = p->temperature == 0.0f;
    s->decoding = 0;
    int32_t tok;
    kvq_status row_st[KVQ_MAX_DRAFT + 1];
    st = next_tokens(s, greedy, prompt, n_prompt, n_prompt - 1, &tok, row_st);
    if (st == KVQ_OK)
        st = row_st[0];
    if (st != KVQ_OK)
        return st;
    kvq_sampler_skip(s->sampler, 1);
    struct emitter e = {s, p, out, 0, (size_t)p->max_tokens < max_out ? (size_t)p->max_tokens : max_out, fn, user};
    if (e.max == 0)
        return KVQ_OK;

    s->decoding = 1;
    double t0 = kvq_now();
    while (st == KVQ_OK && tok >= 0 && !emit(&e, tok) && s->pos < s->max_ctx) {
        size_t pos0 = s->pos;
        int32_t *buf = s->draft;
        buf[0] = tok;
        int k = 0;
        if (p->speculative > 0) {
            s->tokens[pos0] = tok; /* the pending token ends the history the drafts continue */
            kvq_ngram_update(s->ngram, s->tokens, pos0 + 1);
            size_t room = s->max_ctx - pos0 - 1;
            size_t want = e.max - e.n - 1; /* drafts beyond the output limit would be wasted */
            size_t lim = (size_t)p->speculative;
            lim = lim < room ? lim : room;
            lim = lim < want ? lim : want;
            /* with the window: not past the page (kvq_layer_cache_config's pages) */
            lim = kvq_draft_limit(pos0, s->cfg.recent_f16, KVQ_DEFAULT_PAGE_TOKENS, lim);
            k = kvq_ngram_draft(s->ngram, s->tokens, pos0 + 1, buf + 1, (int)lim);
        }
        st = next_tokens(s, greedy, buf, (size_t)k + 1, 0, s->verify, row_st);
        if (st != KVQ_OK)
            break;
        s->st.decode_forwards++;
        s->st.drafted += (size_t)k;
        /* verify[i] is the model's token after buf[0..i]. */
        int a = 0;
        for (;;) {
            if ((st = row_st[a]) != KVQ_OK)
                break;
            kvq_sampler_skip(s->sampler, 1); /* the draw row a made is kept */
            if (a == k || s->verify[a] != buf[a + 1])
                break;
            a++;
        }
        if (st != KVQ_OK)
            break;
        s->st.accepted += (size_t)a;
        if (a < k)
            kvq_seq_truncate(s, pos0 + 1 + (size_t)a);
        int stop = 0;
        for (int i = 1; i <= a && !stop; i++) {
            stop = emit(&e, buf[i]);
            if (stop) /* as in plain decoding, the last emitted token is not in the cache */
                kvq_seq_truncate(s, pos0 + (size_t)i);
        }
        if (stop)
            break;
        tok = s->verify[a];
    }
    if (st == KVQ_OK && tok < 0)
        st = KVQ_ERR_NONFINITE; /* every logit was NaN */
    s->st.t_decode += kvq_now() - t0;
    s->decoding = 0;
    *n_out = e.n;
    return st;
}
