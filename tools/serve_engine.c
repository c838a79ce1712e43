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
 * Speculative decoding (--speculative N): a decode row becomes the pending
 * token and up to N drafts from the request's n-gram table (kvq_ngram.h),
 * verified in the same step (kvq_batch_item.n_out); the drafts the model
 * agrees with are taken one by one as if decoded alone, the rest rolled
 * back, so the answer is plain decoding's, greedy or seeded.
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

#include "serve_engine_int.h"

double serve_now(void)
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

/* ---- requests -------------------------------------------------------- */

void serve_req_free(struct serve_req *r)
{
    serve_params_free(&r->p);
    free(r->ids);
    free(r->out);
    free(r->lps);
    free(r->logits);
    free(r->text);
    kvq_sampler_free(r->smp);
    kvq_detok_free(r->detok);
    free(r->hist);
    kvq_ngram_free(r->ngram);
    pthread_cond_destroy(&r->cond);
    free(r);
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
    serve_req_free(r);
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

void serve_finish(struct serve_engine *e, struct serve_req *r, const char *why)
{
    if (r->slot >= 0) {
        if (!serve_keep_prefix(e, r))
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
    r->t_done = serve_now();
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
    long sec = (long)serve_now();
    int i = (int)(sec % N_RATE);
    if (e->rate_sec[i] != sec)
        e->rate_sec[i] = sec, e->rate[i] = 0;
    e->rate[i] += n;
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
 * applies EOS, stop strings, max_tokens and the context end (len: the
 * slot's length plain decoding would have now). @return 0 when r finished
 * (it may be freed), 1 while it runs. */
static int take_token(struct serve_engine *e, struct serve_req *r, size_t len)
{
    const struct kvq_model_config *c = kvq_model_config_of(e->m);
    int32_t tok = r->next_tok;
    if (r->p.n_bias) { /* logit_bias: the step brought the logits here; the pick is made from them biased */
        for (int i = 0; i < r->p.n_bias; i++)
            r->logits[r->p.bias_ids[i]] += r->p.bias[i];
        kvq_best best = kvq_best_none();
        if (r->p.temperature == 0)
            tok = kvq_argmax(r->logits, c->vocab, 0, &best) == KVQ_OK ? best.token : -1;
    }
    if (r->p.temperature > 0 && r->logits && kvq_sampler_sample(r->smp, r->logits, &tok) != KVQ_OK)
        tok = -1;
    if (tok < 0) {
        r->status = 500;
        snprintf(r->error, sizeof r->error, "the model produced non-finite logits");
        serve_finish(e, r, "error");
        return 0;
    }
    if (r->n_out == 0) {
        r->t_first = serve_now();
        double t = r->t_first - r->t_submit;
        e->ttft_count++;
        e->ttft_sum += t;
        for (int i = 0; i < N_TTFT_BUCKETS; i++)
            if (t <= serve_ttft_le[i])
                e->ttft_bucket[i]++;
    }
    e->gen_tokens++;
    count_rate(e, 1);
    if (!r->p.ignore_eos && kvq_model_is_eos(c, tok)) {
        serve_finish(e, r, "stop");
        return 0;
    }
    if (r->lps)
        logprobs_of(r->logits, c->vocab, tok, r->p.logprobs, &r->lps[r->n_out]);
    r->out[r->n_out++] = tok;
    if (r->hist)
        r->hist[r->n_prompt + r->n_out - 1] = tok;
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
                serve_finish(e, r, "stop");
                return 0;
            }
    }
    if (r->n_out >= (size_t)r->max_tokens || len >= e->max_ctx) {
        serve_finish(e, r, "length");
        return 0;
    }
    pthread_cond_broadcast(&r->cond);
    return 1;
}

/* The drafts of r's next step, at most cap (mu held; greedy or sampled,
 * when no logits come to the host): what its n-gram
 * table continues the history with, as kvq_seq_generate drafts (up to
 * --speculative, not past max_tokens or the context, not past the page
 * with the window: kvq_draft_limit). r->draft[0] is the pending token. */
static int draft_for(struct serve_engine *e, struct serve_req *r, size_t cap)
{
    const size_t len = r->n_prompt + r->n_out, pos0 = len - 1; /* the pending token's position */
    r->draft[0] = r->out[r->n_out - 1];
    r->n_draft = 0;
    if (!r->ngram || pos0 + 1 >= e->max_ctx || r->n_out + 1 >= (size_t)r->max_tokens)
        return 0;
    kvq_ngram_update(r->ngram, r->hist, len);
    size_t lim = (size_t)e->cfg.speculative, room = e->max_ctx - pos0 - 1, want = (size_t)r->max_tokens - r->n_out - 1;
    lim = lim < room ? lim : room;
    lim = lim < want ? lim : want;
    lim = lim < cap ? lim : cap;
    lim = kvq_draft_limit(pos0, e->window, e->bs.page_tokens, lim);
    return r->n_draft = kvq_ngram_draft(r->ngram, r->hist, len, r->draft + 1, (int)lim);
}

/* The tokens of r's verify pass (mu held): the drafts the model agrees
 * with, then its own token after them; the rest rolled back. Each goes
 * through take_token as if decoded alone, so the answer is plain
 * decoding's. */
static void take_verified(struct serve_engine *e, struct serve_req *r)
{
    const size_t pos0 = r->n_prompt + r->n_out - 1;
    const int k = r->n_draft;
    int a = 0;
    while (a < k && r->verify[a] == r->draft[a + 1])
        a++;
    e->drafted += (unsigned long)k;
    e->accepted += (unsigned long)a;
    if (r->p.temperature > 0) /* the draws of rows 0..a are kept, as plain decoding draws them */
        kvq_sampler_skip(r->smp, a + 1);
    if (a < k)
        kvq_batch_truncate(e->b, r->slot, pos0 + 1 + (size_t)a);
    for (int j = 0; j <= a; j++) {
        r->next_tok = j < a ? r->draft[j + 1] : r->verify[a];
        if (!take_token(e, r, pos0 + 1 + (size_t)j))
            return;
    }
}


/* r's rows ids[0..n) as a step's item; with last, it asks for the next
 * token: drawn where the logits are, unless logprobs bring them to the host
 * (the draw is then made there, from the same logits). */
static struct kvq_batch_item item_of(struct serve_req *r, const int32_t *ids, size_t n, int last)
{
    struct kvq_batch_item it = {r->slot, ids, n, NULL, NULL, NULL, NULL, 0};
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
    int n_dec = 0;
    for (int s = 0; s < S; s++)
        n_dec += e->run[s] && e->run[s]->state == SERVE_DECODE;
    for (int s = 0; s < S; s++) {
        struct serve_req *r = e->run[s];
        if (!r || r->state != SERVE_DECODE)
            continue;
        /* drafts leave a row for each decode row still to come */
        const int k = draft_for(e, r, e->bs.max_rows - rows - (size_t)(n_dec - n));
        e->items[n] = item_of(r, &r->out[r->n_out - 1], 1, 1);
        if (k > 0) { /* a verify pass: the model's token after each row, as item_of picks it */
            const int sampled = r->p.temperature > 0;
            e->items[n] = (struct kvq_batch_item){r->slot, r->draft, (size_t)k + 1, NULL, sampled ? NULL : r->verify,
                                                  sampled ? r->smp : NULL, sampled ? r->verify : NULL, (size_t)k + 1};
        }
        e->item_req[n++] = r;
        rows += (size_t)k + 1;
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
                serve_finish(e, e->run[s], "cancelled");
        serve_admit(e);
        serve_count_pages(e);
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
        const double t = serve_now();
        if (t - e->t_stats > 0.1) {
            kvq_batch_get_stats(e->b, &e->bs);
            e->t_stats = t;
        }
        serve_count_pages(e);
        for (int k = 0; k < n; k++) {
            struct serve_req *r = e->item_req[k];
            if (st != KVQ_OK) {
                r->status = 500;
                snprintf(r->error, sizeof r->error, "the forward failed: %.200s", err.msg);
                serve_finish(e, r, "error");
                continue;
            }
            if (r->state == SERVE_PREFILL) {
                r->done += e->items[k].n;
                if (r->done < r->n_prompt)
                    continue;
                r->state = SERVE_DECODE;
            }
            if (r->cancelled)
                serve_finish(e, r, "cancelled");
            else if (r->state == SERVE_DECODE && r->n_draft > 0)
                take_verified(e, r);
            else
                take_token(e, r, kvq_batch_len(e->b, r->slot));
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
        /* 256 on either device: prefixes are reused in whole chunks, and a
         * long chunk would stall the running sequences' steps (kvq run's
         * CPU chunks, so the same bits; on the GPU --chunk 8192 gives run's) */
        e->cfg.chunk = KVQ_DEFAULT_MAX_CHUNK;
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
    /* Sliding-window layers keep a ring of their last tokens, not a prefix:
     * there is nothing to share (the answers are the same without), and a
     * finished sequence cannot go back to a kept prefix. */
    e->cfg.prefix_share &= e->bs.can_share;
    e->window = kvq_seq_window_for(&e->cfg.batch.seq, kvq_model_config_of(m)->n_layers);
    if (e->cfg.prefix_cache && !e->bs.can_rollback) {
        snprintf(err, cap, "--prefix-cache: the sliding-window layers of this model keep only their last tokens, "
                           "so a finished sequence cannot go back to a kept prefix");
        kvq_batch_free(e->b);
        free(e);
        return 2;
    }
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
    pthread_condattr_t ca; /* the drain deadline runs on CLOCK_MONOTONIC */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->idle, &ca);
    pthread_condattr_destroy(&ca);
    if (!e->run || !e->cached || !e->items || !e->item_req || pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        snprintf(err, cap, "cannot start the scheduler thread");
        serve_engine_stop(e);
        return 1;
    }
    e->started = 1;
    *out = e;
    return 0;
}

/* Waits on e->idle until no request is live or until the monotonic time t
 * (t <= 0: no limit). @return 1 when none is live. */
static int wait_idle(struct serve_engine *e, double t)
{
    while (e->n_live > 0) {
        if (t <= 0) {
            pthread_cond_wait(&e->idle, &e->mu);
            continue;
        }
        if (t <= serve_now())
            return 0;
        struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)}; /* serve_now's clock */
        pthread_cond_timedwait(&e->idle, &e->mu, &ts);
    }
    return 1;
}

/* Ends r at the drain deadline: cancelled (its pages go at the next step)
 * with a 503 for its client, which is still there. */
static void cut(struct serve_req *r)
{
    r->cancelled = 1;
    r->status = 503;
    snprintf(r->error, sizeof r->error, "the server shut down before the request finished (--drain-timeout)");
}

int serve_engine_drain(struct serve_engine *e, double timeout_s)
{
    serve_lock(e);
    e->draining = 1;
    int n = 0;
    if (!wait_idle(e, timeout_s > 0 ? serve_now() + timeout_s : 0)) {
        for (struct serve_req *r = e->head; r; r = r->next)
            if (!r->cancelled)
                cut(r), n++;
        for (int s = 0; s < e->cfg.batch.max_seqs; s++)
            if (e->run[s] && !e->run[s]->cancelled)
                cut(e->run[s]), n++;
        pthread_cond_signal(&e->work);
        /* every connection sees its request done within one wait (50 ms) and
         * lets go; the bound only guards against a stuck client socket */
        wait_idle(e, serve_now() + 2.0);
    }
    serve_unlock(e);
    return n;
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
