/* serve_engine_int.h - what the engine's files share (not an API):
 *  - serve_req.c: a request from parsed params (chat, tokens, checks);
 *  - serve_engine.c: the requests' lives, the scheduler thread, start/drain/stop;
 *  - serve_admit.c: the wait queue, admission by pages, the prefix cache;
 *  - serve_metrics.c: the Prometheus text and the HTTP counts.
 * Everything here is behind e->mu unless it says otherwise.
 */
#ifndef KVQ_SERVE_ENGINE_INT_H
#define KVQ_SERVE_ENGINE_INT_H

#include "serve.h"

#define N_TTFT_BUCKETS 12
extern const double serve_ttft_le[N_TTFT_BUCKETS];

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
    unsigned long drafted, accepted; /* speculative draft tokens verified / kept */
    int window;                /* the recent-token f16 window is on (drafts stop at page ends) */
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
double serve_now(void); /* CLOCK_MONOTONIC seconds */

/* serve_engine.c: frees r and all it holds (refs not looked at). */
void serve_req_free(struct serve_req *r);
/* serve_engine.c: ends r (why: "stop", "length", "cancelled", "error"): its
 * slot and pages go back at once, its connection is woken, the engine's
 * reference is dropped (r may be freed on return). */
void serve_finish(struct serve_engine *e, struct serve_req *r, const char *why);

/* serve_admit.c */
/* Unlinks and finishes every cancelled request in the wait queue. */
void serve_queue_sweep(struct serve_engine *e);
/* Moves queued requests into free slots while their pages fit (FIFO). */
void serve_admit(struct serve_engine *e);
/* Keeps r's whole prompt chunks in its slot for reuse. @return 1 if kept
 * (the slot is then the cache's), 0 if the slot is to be removed. */
int serve_keep_prefix(struct serve_engine *e, struct serve_req *r);
/* The cheap page counts after a change (the engine thread only). */
void serve_count_pages(struct serve_engine *e);

#endif
