/* serve_engine.c - the scheduler of `kvq serve`: one thread owns the batch.
 *
 * Admission by KV pages: a request reserves the pages of its whole
 * sequence (prompt + max_tokens) when it leaves the queue, so a running
 * sequence never runs out of pages; the queue is FIFO and waits while the
 * head does not fit (no starvation of long prompts); a request that could
 * never fit the pool is refused at once (400).
 *
 * Each step carries a decode row for every sequence past its prompt, then
 * prompt chunks of exactly `chunk` tokens (the last one shorter) while rows
 * remain: chunk boundaries never depend on the load, so a sequence's logits
 * are bit-identical alone or batched (kvq_batch.h), and so are its tokens,
 * greedy or sampled with a seed. A long prompt takes one chunk per step and
 * never stalls the decode rows.
 *
 * Prefix sharing (--prefix-share, on by default): a request
 * whose prompt starts with whole chunks of a running sequence's prompt
 * shares those pages (kvq_batch_share: one copy in the pool, reference
 * counted) instead of prefilling them. They were prefilled in the same
 * chunks the request would use, so its logits stay bit-identical. When the
 * running sequence is still prefilling that start, the request waits at the
 * head of the queue until it is in (vLLM and SGLang would prefill it twice
 * meanwhile). Pages are admitted against what the pool holds plus what every
 * running sequence may still take in pages of its own.
 *
 * Every request field is behind the one mutex; the batch is touched only by
 * this thread, outside the mutex during the forward.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve.h"

#define N_TTFT_BUCKETS 12
static const double ttft_le[N_TTFT_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

#define N_ROUTES 8
#define N_RATE 10 /* seconds of the tokens/s window */

struct route_count {
    char route[24];
    int status;
    unsigned long n;
};

/* A finished sequence kept in its slot for prefix reuse: its first `kept`
 * tokens (whole prompt chunks) stay in the cache. */
struct cached_prefix {
    int32_t *ids;              /* NULL: the slot holds no cached prefix */
    size_t kept;
    double t_used;
};

struct serve_engine {
    const kvq_model *m;
    const kvq_tokenizer *tok;
    struct serve_engine_config cfg;
    kvq_batch *b;
    struct kvq_batch_stats bs; /* refreshed by the engine after every change, under mu */
    size_t max_ctx, pages_total; /* constants of the batch */
    double t_stats;            /* when bs was last refreshed after a step */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t work;       /* the engine waits for requests */
    pthread_cond_t idle;       /* drain waits for the last request */
    int stop, draining;
    struct serve_req *head, *tail; /* waiting */
    int n_waiting;
    struct serve_req **run;    /* [max_seqs] admitted, by slot */
    int n_running;
    int n_live;                /* requests created and not yet freed */
    struct cached_prefix *cached; /* [max_seqs] by slot */
    int n_cached;
    size_t cached_pages;
    unsigned long reused_tokens, reuse_hits, shared_tokens, share_hits;
    size_t unit;               /* prefix lengths reused or shared: multiples of the chunk and the page */
    size_t pages_committed, pages_peak, shared_peak;
    unsigned long seq_no;
    struct kvq_batch_item *items;
    struct serve_req **item_req;
    /* metrics */
    unsigned long prompt_tokens, gen_tokens, finished, cancelled_n, failed;
    unsigned long ttft_count, ttft_bucket[N_TTFT_BUCKETS];
    double ttft_sum;
    unsigned long rate[N_RATE];
    long rate_sec[N_RATE];
    struct route_count routes[64];
    int n_routes;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void serve_lock(struct serve_engine *e)
{
    pthread_mutex_lock(&e->mu);
}

void serve_unlock(struct serve_engine *e)
{
    pthread_mutex_unlock(&e->mu);
}

/* Request conditions run on CLOCK_MONOTONIC, as serve_wait's deadlines. */
static void cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

void serve_wait(struct serve_engine *e, struct serve_req *r, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&r->cond, &e->mu, &ts);
}

const char *serve_model_name(const struct serve_engine *e)
{
    return e->cfg.model_name;
}

const char *serve_cache_name(const struct serve_engine *e)
{
    return e->cfg.cache_name;
}

const kvq_tokenizer *serve_tokenizer(const struct serve_engine *e)
{
    return e->tok;
}

int serve_draining(const struct serve_engine *e)
{
    return e->draining;
}

static int is_eos(const struct kvq_model_config *c, int32_t id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

/* ---- requests -------------------------------------------------------- */

static void req_free(struct serve_req *r)
{
    serve_params_free(&r->p);
    free(r->ids);
    free(r->out);
    free(r->lps);
    free(r->logits);
    free(r->text);
    kvq_sampler_free(r->smp);
    kvq_detok_free(r->detok);
    pthread_cond_destroy(&r->cond);
    free(r);
}

/* Chat messages -> prompt text through the model's template (kvq_chat.h),
 * BOS/EOS spelled as the tokenizer spells them. The text is tokenized
 * without an added BOS, as transformers' apply_chat_template(tokenize=True):
 * a template that wants one writes bos_token itself. */
static int render_chat(struct serve_engine *e, struct serve_req *r, char *err, size_t cap)
{
    if (!e->cfg.chat) {
        snprintf(err, cap, "%s", e->cfg.chat_missing ? e->cfg.chat_missing : "this server has no chat template");
        return 400;
    }
    char *msgs = cJSON_PrintUnformatted((const cJSON *)r->p.messages);
    if (!msgs) {
        snprintf(err, cap, "out of memory");
        return 400;
    }
    kvq_chat_options opt = kvq_chat_options_default();
    const char *piece;
    size_t n;
    char bos[64] = "", eos[64] = "";
    if (kvq_tokenizer_piece(e->tok, kvq_tokenizer_bos_id(e->tok), &piece, &n) == KVQ_OK && n < sizeof bos)
        memcpy(bos, piece, n), bos[n] = 0, opt.bos_token = bos;
    if (kvq_tokenizer_piece(e->tok, kvq_tokenizer_eos_id(e->tok), &piece, &n) == KVQ_OK && n < sizeof eos)
        memcpy(eos, piece, n), eos[n] = 0, opt.eos_token = eos;
    kvq_error kerr = {0};
    size_t len;
    kvq_status st = kvq_chat_render_json(e->cfg.chat, msgs, &opt, &r->p.prompt, &len, &kerr);
    free(msgs);
    if (st != KVQ_OK) {
        snprintf(err, cap, "the chat template cannot render these messages: %s", kerr.msg);
        return 400;
    }
    return 0;
}

struct serve_req *serve_req_create(struct serve_engine *e, struct serve_params *p, int *status, char *err,
                                   size_t cap)
{
    const struct kvq_model_config *c = kvq_model_config_of(e->m);
    struct serve_req *r = calloc(1, sizeof *r);
    *status = 400;
    if (!r) {
        snprintf(err, cap, "out of memory");
        *status = 503;
        return NULL;
    }
    cond_init(&r->cond);
    r->e = e;
    r->refs = 1;
    r->p = *p;
    memset(p, 0, sizeof *p); /* r owns the params now */
    r->slot = -1;
    kvq_status st = KVQ_OK;
    if (r->p.has_types && (r->p.type_k != (int)e->cfg.batch.seq.type_k || r->p.type_v != (int)e->cfg.batch.seq.type_v)) {
        snprintf(err, cap, "this server's page pool holds %s caches; 'kvq' asked for %s/%s", e->cfg.cache_name,
                 kvq_type_traits((enum kvq_type)r->p.type_k)->name, kvq_type_traits((enum kvq_type)r->p.type_v)->name);
        goto fail;
    }
    if (r->p.chat && render_chat(e, r, err, cap))
        goto fail;
    if (r->p.prompt_ids) {
        r->ids = r->p.prompt_ids;
        r->n_prompt = r->p.n_prompt_ids;
        r->p.prompt_ids = NULL;
        for (size_t i = 0; i < r->n_prompt; i++)
            if (r->ids[i] >= c->vocab) {
                snprintf(err, cap, "prompt token id %d is outside the vocabulary [0, %d)", r->ids[i], c->vocab);
                goto fail;
            }
    } else {
        st = kvq_tokenizer_encode_alloc(e->tok, r->p.prompt, strlen(r->p.prompt), !r->p.chat, &r->ids,
                                        &r->n_prompt);
        if (st != KVQ_OK) {
            snprintf(err, cap, "the prompt cannot be tokenized: %s", kvq_status_str(st));
            goto fail;
        }
    }
    if (r->n_prompt == 0) {
        snprintf(err, cap, "the prompt is empty");
        goto fail;
    }
    r->max_tokens = r->p.max_tokens > 0 ? r->p.max_tokens : r->p.chat ? 256 : 16;
    if (r->n_prompt >= e->max_ctx || (size_t)r->max_tokens > e->max_ctx - r->n_prompt) {
        snprintf(err, cap,
                 "this model's maximum context length is %zu tokens; the prompt has %zu tokens and max_tokens is "
                 "%d",
                 e->max_ctx, r->n_prompt, r->max_tokens);
        *status = 400;
        goto fail_code;
    }
    r->pages = kvq_batch_pages_for(e->b, r->n_prompt + (size_t)r->max_tokens);
    if (r->pages > e->pages_total) {
        snprintf(err, cap,
                 "the request needs %zu KV pages (%zu prompt tokens + max_tokens %d) and the whole pool (--kv-budget) "
                 "holds %zu: it can never run",
                 r->pages, r->n_prompt, r->max_tokens, e->pages_total);
        goto fail;
    }
    kvq_sampler_params sp = kvq_sampler_params_default();
    sp.temperature = r->p.temperature;
    sp.top_k = r->p.top_k;
    sp.top_p = r->p.top_p;
    serve_lock(e);
    sp.seed = r->p.has_seed ? r->p.seed : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + ++e->seq_no;
    snprintf(r->id, sizeof r->id, "%s-%lx%lu", r->p.chat ? "chatcmpl" : "cmpl", (unsigned long)time(NULL),
             ++e->seq_no);
    e->n_live++;
    serve_unlock(e);
    r->created = (long)time(NULL);
    int need_logits = r->p.logprobs >= 0;
    if (kvq_sampler_create(c->vocab, &sp, &r->smp) != KVQ_OK ||
        kvq_detok_create(e->tok, KVQ_DETOK_SKIP_CONTROL, &r->detok) != KVQ_OK ||
        !(r->out = malloc((size_t)r->max_tokens * sizeof *r->out)) ||
        (r->p.logprobs >= 0 && !(r->lps = calloc((size_t)r->max_tokens, sizeof *r->lps))) ||
        (need_logits && !(r->logits = malloc((size_t)c->vocab * sizeof *r->logits)))) {
        snprintf(err, cap, "out of memory for the request");
        *status = 503;
        serve_req_release(e, r);
        return NULL;
    }
    return r;
fail:
    *status = 400;
fail_code:
    req_free(r);
    return NULL;
}

int serve_submit(struct serve_engine *e, struct serve_req *r, char *err, size_t cap)
{
    serve_lock(e);
    int rc = 0;
    if (e->draining) {
        snprintf(err, cap, "the server is shutting down");
        rc = 503;
    } else if (e->n_waiting >= e->cfg.max_queue) {
        snprintf(err, cap, "the queue is full (%d waiting requests); retry later", e->n_waiting);
        rc = 429;
    } else {
        r->state = SERVE_WAITING;
        r->t_submit = now_s();
        r->refs++;
        r->next = NULL;
        if (e->tail)
            e->tail->next = r;
        else
            e->head = r;
        e->tail = r;
        e->n_waiting++;
        pthread_cond_signal(&e->work);
    }
    serve_unlock(e);
    return rc;
}

void serve_cancel(struct serve_engine *e, struct serve_req *r)
{
    serve_lock(e);
    if (r->state != SERVE_DONE) {
        r->cancelled = 1;
        pthread_cond_signal(&e->work);
    }
    serve_unlock(e);
}

/* Drops a reference, mu held. */
static void unref(struct serve_engine *e, struct serve_req *r)
{
    if (--r->refs > 0)
        return;
    req_free(r);
    e->n_live--;
    pthread_cond_broadcast(&e->idle);
}

void serve_req_release(struct serve_engine *e, struct serve_req *r)
{
    if (!r)
        return;
    serve_lock(e);
    unref(e, r);
    serve_unlock(e);
}

/* ---- the scheduler --------------------------------------------------- */

/* Ends r (mu held): its slot and pages go back at once. */
static void uncache(struct serve_engine *e, int slot, int remove)
{
    struct cached_prefix *c = &e->cached[slot];
    free(c->ids);
    c->ids = NULL;
    e->n_cached--;
    e->cached_pages -= kvq_batch_pages_for(e->b, c->kept);
    if (remove)
        kvq_batch_remove(e->b, slot);
}

/* Prefix reuse: a completed sequence keeps the whole chunks of its prompt in
 * its slot. Those tokens were prefilled in chunks at multiples of `chunk`,
 * exactly as a new prompt with the same start would prefill them, so a
 * request that takes them over computes bit-identical logits (CPU) while
 * skipping their prefill. The oldest cached sequence goes first whenever a
 * slot or pages are needed. */
static int keep_prefix(struct serve_engine *e, struct serve_req *r)
{
    const size_t C = (size_t)e->cfg.chunk, kept = r->n_prompt / C * C;
    if (!e->cfg.prefix_cache || r->status || r->cancelled || kept == 0)
        return 0;
    while (e->n_cached >= e->cfg.prefix_cache) { /* the oldest makes room */
        int old = -1;
        for (int s = 0; s < e->cfg.batch.max_seqs; s++)
            if (e->cached[s].ids && (old < 0 || e->cached[s].t_used < e->cached[old].t_used))
                old = s;
        uncache(e, old, 1);
    }
    if (kvq_batch_truncate(e->b, r->slot, kept) != KVQ_OK)
        return 0;
    struct cached_prefix *c = &e->cached[r->slot];
    c->ids = r->ids; /* the request gives its prompt to the cache */
    r->ids = NULL;
    c->kept = kept;
    c->t_used = now_s();
    e->n_cached++;
    e->cached_pages += kvq_batch_pages_for(e->b, kept);
    return 1;
}

static void finish(struct serve_engine *e, struct serve_req *r, const char *why)
{
    if (r->slot >= 0) {
        if (!keep_prefix(e, r))
            kvq_batch_remove(e->b, r->slot);
        e->run[r->slot] = NULL;
        e->n_running--;
        r->slot = -1;
        kvq_batch_get_stats(e->b, &e->bs);
    }
    const char *tail;
    size_t n;
    if (!r->status && !r->cancelled && kvq_detok_finish(r->detok, &tail, &n) == KVQ_OK && n &&
        r->finish == NULL) { /* a pending byte run, unless a stop string ended the text */
        if (r->text_len + n + 1 > r->text_cap) {
            size_t cap = (r->text_len + n + 1) * 2;
            char *t = realloc(r->text, cap);
            if (t)
                r->text = t, r->text_cap = cap;
        }
        if (r->text_len + n + 1 <= r->text_cap) {
            memcpy(r->text + r->text_len, tail, n);
            r->text_len += n;
            r->text[r->text_len] = 0;
        }
    }
    if (!r->finish)
        r->finish = why;
    r->state = SERVE_DONE;
    r->t_done = now_s();
    if (r->cancelled)
        e->cancelled_n++;
    else if (r->status)
        e->failed++;
    else
        e->finished++;
    pthread_cond_broadcast(&r->cond);
    unref(e, r);
}

static void count_rate(struct serve_engine *e, unsigned long n)
{
    long sec = (long)now_s();
    int i = (int)(sec % N_RATE);
    if (e->rate_sec[i] != sec)
        e->rate_sec[i] = sec, e->rate[i] = 0;
    e->rate[i] += n;
}

/* Pages the pool holds plus those the running sequences may still take in
 * pages of their own (each up to prompt + max_tokens; a shared page is in
 * the pool's count once). */
static size_t pages_committed(struct serve_engine *e)
{
    size_t n = 0;
    kvq_batch_page_counts(e->b, &n, NULL, NULL);
    for (int s = 0; s < e->cfg.batch.max_seqs; s++)
        if (e->run[s])
            n += e->run[s]->pages - kvq_batch_pages_for(e->b, kvq_batch_len(e->b, s));
    return n;
}

/* The cheap page counts after a change (the engine thread only). */
static void count_pages(struct serve_engine *e)
{
    kvq_batch_page_counts(e->b, &e->bs.pages_used, &e->bs.pages_shared, &e->bs.page_refs);
    e->pages_committed = pages_committed(e);
    e->pages_peak = e->bs.pages_used > e->pages_peak ? e->bs.pages_used : e->pages_peak;
    e->shared_peak = e->bs.pages_shared > e->shared_peak ? e->bs.pages_shared : e->shared_peak;
}

/* How much of r's prompt, in whole units and leaving its last token to run
 * (for the logits), ids[0..n) starts with too. */
static size_t common_prefix(const struct serve_engine *e, const struct serve_req *r, const int32_t *ids, size_t n)
{
    size_t lim = n < r->n_prompt - 1 ? n : r->n_prompt - 1, k = 0;
    while (k < lim && ids[k] == r->ids[k])
        k++;
    return k / e->unit * e->unit;
}

/* The oldest cached prefix other than slot keep, or -1. */
static int oldest_cached(const struct serve_engine *e, int keep)
{
    int old = -1;
    for (int s = 0; s < e->cfg.batch.max_seqs; s++)
        if (e->cached[s].ids && s != keep && (old < 0 || e->cached[s].t_used < e->cached[old].t_used))
            old = s;
    return old;
}

/* Moves queued requests into free slots while their pages fit (FIFO). */
static void admit(struct serve_engine *e)
{
    while (e->head) {
        struct serve_req *r = e->head;
        if (r->cancelled) {
            e->head = r->next;
            e->n_waiting--;
            finish(e, r, "cancelled");
            continue;
        }
        /* where the prompt's start already is: a cached prefix to take
         * over, or a running sequence's pages to share */
        int reuse = -1, src = -1;
        size_t best = 0, share = 0, later = 0;
        for (int s = 0; e->n_cached && s < e->cfg.batch.max_seqs; s++) {
            const struct cached_prefix *c = &e->cached[s];
            size_t n = c->ids ? common_prefix(e, r, c->ids, c->kept) : 0;
            if (n > best)
                best = n, reuse = s;
        }
        for (int s = 0; e->cfg.prefix_share && s < e->cfg.batch.max_seqs; s++) {
            const struct serve_req *a = e->run[s];
            if (!a || a->cancelled || a->status)
                continue;
            const size_t pot = common_prefix(e, r, a->ids, a->n_prompt);
            const size_t have = a->state == SERVE_PREFILL ? a->done / e->unit * e->unit : a->n_prompt;
            const size_t now = pot < have ? pot : have;
            if (now > share)
                share = now, src = s;
            if (pot > now && pot > later)
                later = pot;
        }
        if (later > best && later > share)
            return; /* a running prompt is prefilling more of this one's start: wait for it */
        if (share > best)
            reuse = -1, best = share;
        else
            src = -1, share = 0;
        const size_t held = kvq_batch_pages_for(e->b, best), need = r->pages - held;
        while (pages_committed(e) + need > e->pages_total) {
            int old = oldest_cached(e, reuse); /* cached prefixes give their pages back first */
            if (old < 0)
                return;
            uncache(e, old, 1);
        }
        int slot = reuse;
        if (reuse >= 0) {
            uncache(e, reuse, 0);
            kvq_batch_truncate(e->b, reuse, best);
            e->reused_tokens += best;
            e->reuse_hits++;
        } else {
            while (kvq_batch_add(e->b, &slot) != KVQ_OK) {
                int old = oldest_cached(e, -1);
                if (old < 0)
                    return;
                uncache(e, old, 1);
            }
            kvq_error err = {0};
            if (src >= 0 && kvq_batch_share(e->b, slot, src, share, &err) == KVQ_OK) {
                e->shared_tokens += share;
                e->share_hits++;
            } else {
                best = 0; /* (not expected on the CPU) prefill it all */
            }
        }
        e->head = r->next;
        if (!e->head)
            e->tail = NULL;
        e->n_waiting--;
        r->slot = slot;
        r->done = r->cached_tokens = best;
        r->state = SERVE_PREFILL;
        e->run[slot] = r;
        e->n_running++;
        e->prompt_tokens += r->n_prompt;
    }
}

static void append_text(struct serve_req *r, const char *s, size_t n)
{
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = (r->text_len + n + 1) * 2 + 64;
        char *t = realloc(r->text, cap);
        if (!t)
            return;
        r->text = t;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = 0;
}

/* Log-probabilities of token id and the top n of logits. */
static void logprobs_of(const float *logits, int V, int32_t id, int n, struct serve_logprob *lp)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    lp->id = id;
    lp->lp = (float)((double)logits[id] - lse);
    lp->n_top = 0;
    for (int i = 0; i < V; i++) { /* insertion into the sorted top n (ties: lower id first) */
        int k = lp->n_top;
        if (k == n && !(logits[i] > logits[lp->top_id[n - 1]]))
            continue;
        if (k < n)
            lp->n_top++;
        else
            k = n - 1;
        while (k > 0 && logits[i] > logits[lp->top_id[k - 1]]) {
            lp->top_id[k] = lp->top_id[k - 1];
            k--;
        }
        lp->top_id[k] = i;
    }
    for (int k = 0; k < lp->n_top; k++)
        lp->top_lp[k] = (float)((double)logits[lp->top_id[k]] - lse);
}

/* The output of a step for r (mu held): picks the token, detokenizes,
 * applies EOS, stop strings, max_tokens and the context end. */
static void take_token(struct serve_engine *e, struct serve_req *r)
{
    const struct kvq_model_config *c = kvq_model_config_of(e->m);
    int32_t tok = r->next_tok;
    if (r->p.temperature > 0 && r->logits && kvq_sampler_sample(r->smp, r->logits, &tok) != KVQ_OK)
        tok = -1;
    if (tok < 0) {
        r->status = 500;
        snprintf(r->error, sizeof r->error, "the model produced non-finite logits");
        finish(e, r, "error");
        return;
    }
    if (r->n_out == 0) {
        r->t_first = now_s();
        double t = r->t_first - r->t_submit;
        e->ttft_count++;
        e->ttft_sum += t;
        for (int i = 0; i < N_TTFT_BUCKETS; i++)
            if (t <= ttft_le[i])
                e->ttft_bucket[i]++;
    }
    e->gen_tokens++;
    count_rate(e, 1);
    if (!r->p.ignore_eos && is_eos(c, tok)) {
        finish(e, r, "stop");
        return;
    }
    if (r->lps)
        logprobs_of(r->logits, c->vocab, tok, r->p.logprobs, &r->lps[r->n_out]);
    r->out[r->n_out++] = tok;
    const char *s;
    size_t n;
    size_t before = r->text_len;
    if (kvq_detok_push(r->detok, tok, &s, &n) == KVQ_OK && n)
        append_text(r, s, n);
    for (int i = 0; i < r->p.n_stop; i++) { /* a stop string may straddle the new text */
        size_t sl = strlen(r->p.stop[i]), from = before >= sl ? before - sl + 1 : 0;
        for (size_t at = from; at + sl <= r->text_len; at++)
            if (memcmp(r->text + at, r->p.stop[i], sl) == 0) {
                r->text_len = at;
                r->text[at] = 0;
                r->finish = "stop";
                finish(e, r, "stop");
                return;
            }
    }
    if (r->n_out >= (size_t)r->max_tokens || kvq_batch_len(e->b, r->slot) >= e->max_ctx)
        finish(e, r, "length");
    else
        pthread_cond_broadcast(&r->cond);
}

/* r's rows ids[0..n) as a step's item; with last, it asks for the next
 * token: drawn where the logits are, unless logprobs bring them to the host
 * (the draw is then made there, from the same logits). */
static struct kvq_batch_item item_of(struct serve_req *r, const int32_t *ids, size_t n, int last)
{
    struct kvq_batch_item it = {r->slot, ids, n, NULL, NULL, NULL, NULL};
    if (!last)
        return it;
    it.logits = r->logits;
    if (r->p.temperature > 0 && !r->logits) {
        it.sampler = r->smp;
        it.token = &r->next_tok;
    } else {
        it.argmax = &r->next_tok;
    }
    return it;
}

/* One step's items (mu held): decode rows, then whole prompt chunks. */
static int build_step(struct serve_engine *e, size_t *rows_out)
{
    const int S = e->cfg.batch.max_seqs;
    int n = 0;
    size_t rows = 0;
    for (int s = 0; s < S; s++) {
        struct serve_req *r = e->run[s];
        if (!r || r->state != SERVE_DECODE)
            continue;
        e->items[n] = item_of(r, &r->out[r->n_out - 1], 1, 1);
        e->item_req[n++] = r;
        rows++;
    }
    /* prompts in admission order: the oldest first */
    for (int pass = 0; pass < S; pass++) {
        struct serve_req *best = NULL;
        for (int s = 0; s < S; s++) {
            struct serve_req *r = e->run[s];
            int taken = 0;
            for (int k = 0; k < n && !taken; k++)
                taken = e->item_req[k] == r;
            if (r && r->state == SERVE_PREFILL && !taken && (!best || r->t_submit < best->t_submit))
                best = r;
        }
        if (!best)
            break;
        size_t c = best->n_prompt - best->done;
        c = c < (size_t)e->cfg.chunk ? c : (size_t)e->cfg.chunk;
        if (c > e->bs.max_rows - rows)
            break;
        e->items[n] = item_of(best, best->ids + best->done, c, best->done + c == best->n_prompt);
        e->item_req[n++] = best;
        rows += c;
    }
    *rows_out = rows;
    return n;
}

static void *engine_main(void *arg)
{
    struct serve_engine *e = arg;
    serve_lock(e);
    for (;;) {
        for (int s = 0; s < e->cfg.batch.max_seqs; s++) /* cancelled: pages back before the next step */
            if (e->run[s] && e->run[s]->cancelled)
                finish(e, e->run[s], "cancelled");
        admit(e);
        count_pages(e);
        size_t rows;
        int n = build_step(e, &rows);
        if (n == 0) {
            if (e->stop)
                break;
            kvq_batch_get_stats(e->b, &e->bs); /* exact whenever idle */
            pthread_cond_wait(&e->work, &e->mu);
            continue;
        }
        serve_unlock(e);
        kvq_error err = {0};
        kvq_status st = kvq_batch_step(e->b, e->items, n, &err);
        serve_lock(e);
        /* the stats walk every slot and layer: at most every 100 ms while busy */
        const double t = now_s();
        if (t - e->t_stats > 0.1) {
            kvq_batch_get_stats(e->b, &e->bs);
            e->t_stats = t;
        }
        count_pages(e);
        for (int k = 0; k < n; k++) {
            struct serve_req *r = e->item_req[k];
            if (st != KVQ_OK) {
                r->status = 500;
                snprintf(r->error, sizeof r->error, "the forward failed: %.200s", err.msg);
                finish(e, r, "error");
                continue;
            }
            if (r->state == SERVE_PREFILL) {
                r->done += e->items[k].n;
                if (r->done < r->n_prompt)
                    continue;
                r->state = SERVE_DECODE;
            }
            if (r->cancelled)
                finish(e, r, "cancelled");
            else
                take_token(e, r);
        }
    }
    serve_unlock(e);
    return NULL;
}

int serve_engine_start(const kvq_model *m, const kvq_tokenizer *tok, const struct serve_engine_config *cfg,
                       struct serve_engine **out, char *err, size_t cap)
{
    struct serve_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, cap, "out of memory");
        return 1;
    }
    e->m = m;
    e->tok = tok;
    e->cfg = *cfg;
    if (e->cfg.chunk <= 0)
        e->cfg.chunk = 256;
    if (e->cfg.max_queue <= 0)
        e->cfg.max_queue = 128;
    if (!e->cfg.batch.max_rows)
        e->cfg.batch.max_rows = e->cfg.chunk + e->cfg.batch.max_seqs;
    kvq_error kerr = {0};
    kvq_status st = kvq_batch_create(m, &e->cfg.batch, &e->b, &kerr);
    if (st != KVQ_OK) {
        snprintf(err, cap, "%s", kerr.msg);
        free(e);
        return st == KVQ_ERR_NOMEM || st == KVQ_ERR_DEVICE ? 1 : 2;
    }
    kvq_batch_get_stats(e->b, &e->bs);
    if (e->cfg.prefix_cache && e->cfg.chunk % (int)e->bs.page_tokens) {
        /* a kept prefix must end on a page boundary, where the recent f16
         * window of the next token starts empty, as in a fresh prefill */
        snprintf(err, cap, "--prefix-cache needs --chunk to be a multiple of the page (%zu tokens)",
                 e->bs.page_tokens);
        kvq_batch_free(e->b);
        free(e);
        return 2;
    }
    e->unit = (size_t)e->cfg.chunk;
    while (e->unit % e->bs.page_tokens) /* lcm(chunk, page) */
        e->unit += (size_t)e->cfg.chunk;
    e->max_ctx = e->bs.max_ctx;
    e->pages_total = e->bs.pages_total;
    const size_t S = (size_t)e->cfg.batch.max_seqs;
    e->run = calloc(S, sizeof *e->run);
    e->cached = calloc(S, sizeof *e->cached);
    e->items = calloc(S, sizeof *e->items);
    e->item_req = calloc(S, sizeof *e->item_req);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->idle, NULL);
    if (!e->run || !e->cached || !e->items || !e->item_req || pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        snprintf(err, cap, "cannot start the scheduler thread");
        serve_engine_stop(e);
        return 1;
    }
    e->started = 1;
    *out = e;
    return 0;
}

void serve_engine_drain(struct serve_engine *e)
{
    serve_lock(e);
    e->draining = 1;
    while (e->n_live > 0)
        pthread_cond_wait(&e->idle, &e->mu);
    serve_unlock(e);
}

void serve_engine_stop(struct serve_engine *e)
{
    if (!e)
        return;
    if (e->started) {
        serve_lock(e);
        e->stop = 1;
        pthread_cond_signal(&e->work);
        serve_unlock(e);
        pthread_join(e->thread, NULL);
    }
    for (int s = 0; e->cached && s < e->cfg.batch.max_seqs; s++)
        free(e->cached[s].ids);
    free(e->cached);
    kvq_batch_free(e->b);
    free(e->run);
    free(e->items);
    free(e->item_req);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->idle);
    free(e);
}

void serve_count_request(struct serve_engine *e, const char *route, int status)
{
    serve_lock(e);
    int i = 0;
    while (i < e->n_routes && (e->routes[i].status != status || strcmp(e->routes[i].route, route) != 0))
        i++;
    if (i == e->n_routes && i < (int)(sizeof e->routes / sizeof e->routes[0])) {
        snprintf(e->routes[i].route, sizeof e->routes[i].route, "%s", route);
        e->routes[i].status = status;
        e->n_routes++;
    }
    if (i < e->n_routes)
        e->routes[i].n++;
    serve_unlock(e);
}

/* Appends printf output to a growing buffer. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void out(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return;
        }
        size_t c = (*cap + (size_t)n + 1) * 2;
        char *b = realloc(*buf, c);
        if (!b)
            return;
        *buf = b;
        *cap = c;
    }
}

char *serve_metrics_text(struct serve_engine *e)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    serve_lock(e);
    const struct kvq_batch_stats *bs = &e->bs, now = e->bs;
    long sec = (long)now_s();
    unsigned long recent = 0;
    for (int i = 0; i < N_RATE; i++)
        if (e->rate_sec[i] > sec - N_RATE && e->rate_sec[i] < sec) /* whole seconds only */
            recent += e->rate[i];
    out(&buf, &len, &cap, "# HELP kvq_requests_total HTTP requests answered, by route and status.\n"
                          "# TYPE kvq_requests_total counter\n");
    for (int i = 0; i < e->n_routes; i++)
        out(&buf, &len, &cap, "kvq_requests_total{route=\"%s\",status=\"%d\"} %lu\n", e->routes[i].route,
            e->routes[i].status, e->routes[i].n);
    out(&buf, &len, &cap,
        "# HELP kvq_prompt_tokens_total Prompt tokens of admitted requests.\n# TYPE kvq_prompt_tokens_total counter\n"
        "kvq_prompt_tokens_total %lu\n"
        "# HELP kvq_generation_tokens_total Tokens generated.\n# TYPE kvq_generation_tokens_total counter\n"
        "kvq_generation_tokens_total %lu\n"
        "# HELP kvq_generation_tokens_per_second Tokens generated per second over the last %d whole seconds.\n"
        "# TYPE kvq_generation_tokens_per_second gauge\nkvq_generation_tokens_per_second %.3f\n"
        "# HELP kvq_sequences_finished_total Requests finished, cancelled (client gone) or failed.\n"
        "# TYPE kvq_sequences_finished_total counter\n"
        "kvq_sequences_finished_total{how=\"completed\"} %lu\nkvq_sequences_finished_total{how=\"cancelled\"} %lu\n"
        "kvq_sequences_finished_total{how=\"failed\"} %lu\n"
        "# HELP kvq_running_sequences Sequences holding a slot.\n# TYPE kvq_running_sequences gauge\n"
        "kvq_running_sequences %d\n"
        "# HELP kvq_waiting_requests Requests queued for pages or a slot.\n# TYPE kvq_waiting_requests gauge\n"
        "kvq_waiting_requests %d\n",
        e->prompt_tokens, e->gen_tokens, N_RATE - 1, (double)recent / (N_RATE - 1), e->finished, e->cancelled_n,
        e->failed, e->n_running, e->n_waiting);
    out(&buf, &len, &cap,
        "# HELP kvq_kv_pages_total Pages of the KV pool (one page: %zu tokens of one sequence, all layers).\n"
        "# TYPE kvq_kv_pages_total gauge\nkvq_kv_pages_total %zu\n"
        "# HELP kvq_kv_pages_used Pages holding tokens.\n# TYPE kvq_kv_pages_used gauge\nkvq_kv_pages_used %zu\n"
        "# HELP kvq_kv_pages_free Pages holding no tokens.\n# TYPE kvq_kv_pages_free gauge\nkvq_kv_pages_free %zu\n"
        "# HELP kvq_kv_pages_reserved Pages held plus those admitted requests may still take (up to prompt + "
        "max_tokens each).\n"
        "# TYPE kvq_kv_pages_reserved gauge\nkvq_kv_pages_reserved %zu\n"
        "# HELP kvq_kv_pages_shared Pages held by two sequences or more (prefix sharing; counted once in used).\n"
        "# TYPE kvq_kv_pages_shared gauge\nkvq_kv_pages_shared %zu\n"
        "# HELP kvq_kv_pages_referenced Pages the sequences would hold without sharing.\n"
        "# TYPE kvq_kv_pages_referenced gauge\nkvq_kv_pages_referenced %zu\n"
        "# HELP kvq_kv_pages_used_peak Most pages used at once since the start.\n"
        "# TYPE kvq_kv_pages_used_peak gauge\nkvq_kv_pages_used_peak %zu\n"
        "# HELP kvq_kv_pages_shared_peak Most pages shared at once since the start.\n"
        "# TYPE kvq_kv_pages_shared_peak gauge\nkvq_kv_pages_shared_peak %zu\n"
        "# HELP kvq_kv_bytes_allocated Bytes the KV caches hold now (pages and f16 buffers).\n"
        "# TYPE kvq_kv_bytes_allocated gauge\nkvq_kv_bytes_allocated %zu\n"
        "# HELP kvq_kv_bytes_per_token Encoded K+V bytes of one token over all layers, by cache type.\n"
        "# TYPE kvq_kv_bytes_per_token gauge\nkvq_kv_bytes_per_token{cache=\"%s\"} %zu\n"
        "# HELP kvq_kv_page_bytes Bytes of one page (all layers).\n# TYPE kvq_kv_page_bytes gauge\n"
        "kvq_kv_page_bytes{cache=\"%s\"} %zu\n"
        "# HELP kvq_kv_budget_bytes The --kv-budget (0: none).\n# TYPE kvq_kv_budget_bytes gauge\n"
        "kvq_kv_budget_bytes %zu\n"
        "# HELP kvq_prefix_cache_sequences Finished sequences kept for prefix reuse (--prefix-cache).\n"
        "# TYPE kvq_prefix_cache_sequences gauge\nkvq_prefix_cache_sequences %d\n"
        "# HELP kvq_prefix_cache_pages Pages they hold.\n# TYPE kvq_prefix_cache_pages gauge\n"
        "kvq_prefix_cache_pages %zu\n"
        "# HELP kvq_prefix_reused_tokens_total Prompt tokens taken over from a cached prefix, not prefilled.\n"
        "# TYPE kvq_prefix_reused_tokens_total counter\nkvq_prefix_reused_tokens_total %lu\n"
        "# HELP kvq_prefix_reuse_hits_total Requests that took over a cached prefix.\n"
        "# TYPE kvq_prefix_reuse_hits_total counter\nkvq_prefix_reuse_hits_total %lu\n"
        "# HELP kvq_prefix_shared_tokens_total Prompt tokens whose pages were shared with a running sequence, "
        "not prefilled.\n"
        "# TYPE kvq_prefix_shared_tokens_total counter\nkvq_prefix_shared_tokens_total %lu\n"
        "# HELP kvq_prefix_share_hits_total Requests that shared a running sequence's pages.\n"
        "# TYPE kvq_prefix_share_hits_total counter\nkvq_prefix_share_hits_total %lu\n"
        "# HELP kvq_steps_total Batched forwards.\n# TYPE kvq_steps_total counter\nkvq_steps_total %zu\n"
        "# HELP kvq_step_rows_total Rows through them.\n# TYPE kvq_step_rows_total counter\n"
        "kvq_step_rows_total %zu\n",
        bs->page_tokens, now.pages_total, now.pages_used, now.pages_total - now.pages_used, e->pages_committed,
        now.pages_shared, now.page_refs, e->pages_peak, e->shared_peak, now.bytes_allocated, e->cfg.cache_name, now.bytes_per_token, e->cfg.cache_name, now.page_bytes,
        now.kv_budget, e->n_cached, e->cached_pages, e->reused_tokens, e->reuse_hits, e->shared_tokens, e->share_hits, now.steps, now.rows);
    out(&buf, &len, &cap,
        "# HELP kvq_time_to_first_token_seconds From queueing to the first generated token.\n"
        "# TYPE kvq_time_to_first_token_seconds histogram\n");
    for (int i = 0; i < N_TTFT_BUCKETS; i++)
        out(&buf, &len, &cap, "kvq_time_to_first_token_seconds_bucket{le=\"%g\"} %lu\n", ttft_le[i],
            e->ttft_bucket[i]);
    out(&buf, &len, &cap,
        "kvq_time_to_first_token_seconds_bucket{le=\"+Inf\"} %lu\nkvq_time_to_first_token_seconds_sum %.6f\n"
        "kvq_time_to_first_token_seconds_count %lu\n",
        e->ttft_count, e->ttft_sum, e->ttft_count);
    serve_unlock(e);
    return buf;
}
