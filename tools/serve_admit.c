/* serve_admit.c - the wait queue and admission of `kvq serve` (the design
 * is in serve_engine.c's opening comment).
 *
 * The queue is singly linked with a tail for O(1) submits; every removal goes
 * through unlink_waiting, which moves the tail back when it removes the last
 * request: a tail left on a request that was then freed had the next submit
 * link onto freed memory and the queue lose every later request (issue 36).
 * A cancelled request anywhere in the queue leaves it at the next step, not
 * only when it reaches the head, so a client that gives up behind a head
 * waiting for pages is not counted as waiting for the rest of that wait.
 */
#include <stdio.h>
#include <stdlib.h>

#include "serve_engine_int.h"

/* Takes r out of the queue; prev is the request before it (NULL: r is the head). */
static void unlink_waiting(struct serve_engine *e, struct serve_req *prev, struct serve_req *r)
{
    if (prev)
        prev->next = r->next;
    else
        e->head = r->next;
    if (e->tail == r)
        e->tail = prev;
    r->next = NULL;
    e->n_waiting--;
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
        r->t_submit = serve_now();
        r->refs++;
        r->next = NULL;
        if (e->tail)
            e->tail->next = r;
        else
            e->head = r;
        e->tail = r; /* kept exact by unlink_waiting, the one way out of the queue */
        e->n_waiting++;
        pthread_cond_signal(&e->work);
    }
    serve_unlock(e);
    return rc;
}

void serve_queue_sweep(struct serve_engine *e)
{
    struct serve_req *prev = NULL, *r = e->head;
    while (r) {
        struct serve_req *next = r->next;
        if (r->cancelled) {
            unlink_waiting(e, prev, r);
            serve_finish(e, r, "cancelled"); /* may free r */
        } else {
            prev = r;
        }
        r = next;
    }
}

/* A cached prefix gives its slot up (remove: and its pages). */
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

/* The oldest cached prefix other than slot keep, or -1. */
static int oldest_cached(const struct serve_engine *e, int keep)
{
    int old = -1;
    for (int s = 0; s < e->cfg.batch.max_seqs; s++)
        if (e->cached[s].ids && s != keep && (old < 0 || e->cached[s].t_used < e->cached[old].t_used))
            old = s;
    return old;
}

/* Prefix reuse: a completed sequence keeps the whole chunks of its prompt in
 * its slot. Those tokens were prefilled in chunks at multiples of `chunk`,
 * exactly as a new prompt with the same start would prefill them, so a
 * request that takes them over computes bit-identical logits (CPU) while
 * skipping their prefill. The oldest cached sequence goes first whenever a
 * slot or pages are needed. */
int serve_keep_prefix(struct serve_engine *e, struct serve_req *r)
{
    const size_t C = (size_t)e->cfg.chunk, kept = r->n_prompt / C * C;
    if (!e->cfg.prefix_cache || r->status || r->cancelled || kept == 0)
        return 0;
    while (e->n_cached >= e->cfg.prefix_cache) { /* the oldest makes room */
        int old = oldest_cached(e, -1);
        if (old < 0)
            return 0;
        uncache(e, old, 1);
    }
    if (kvq_batch_truncate(e->b, r->slot, kept) != KVQ_OK)
        return 0;
    struct cached_prefix *c = &e->cached[r->slot];
    c->ids = r->ids; /* the request gives its prompt to the cache */
    r->ids = NULL;
    c->kept = kept;
    c->t_used = serve_now();
    e->n_cached++;
    e->cached_pages += kvq_batch_pages_for(e->b, kept);
    return 1;
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
void serve_count_pages(struct serve_engine *e)
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

void serve_admit(struct serve_engine *e)
{
    serve_queue_sweep(e);
    while (e->head) {
        struct serve_req *r = e->head;
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
        unlink_waiting(e, NULL, r);
        r->slot = slot;
        r->done = r->cached_tokens = best;
        r->state = SERVE_PREFILL;
        e->run[slot] = r;
        e->n_running++;
        e->prompt_tokens += r->n_prompt;
    }
}
