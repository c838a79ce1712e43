/* serve_metrics.c - /metrics of `kvq serve`: the engine's counters and
 * gauges as Prometheus text, and the HTTP exchanges by route and status.
 * Read under the engine's mutex, so one page is one consistent moment. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_engine_int.h"

const double serve_ttft_le[N_TTFT_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

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
    long sec = (long)serve_now();
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
        "# HELP kvq_prefix_cache_pages Pages they hold (one two of them share counts for each, once in "
        "kvq_kv_pages_used).\n# TYPE kvq_prefix_cache_pages gauge\n"
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
        "kvq_step_rows_total %zu\n"
        "# HELP kvq_speculative_drafted_tokens_total Draft tokens verified (--speculative).\n"
        "# TYPE kvq_speculative_drafted_tokens_total counter\nkvq_speculative_drafted_tokens_total %lu\n"
        "# HELP kvq_speculative_accepted_tokens_total Of those, the tokens the model agreed with.\n"
        "# TYPE kvq_speculative_accepted_tokens_total counter\nkvq_speculative_accepted_tokens_total %lu\n",
        bs->page_tokens, now.pages_total, now.pages_used, now.pages_total - now.pages_used, e->pages_committed,
        now.pages_shared, now.page_refs, e->pages_peak, e->shared_peak, now.bytes_allocated, e->cfg.cache_name, now.bytes_per_token, e->cfg.cache_name, now.page_bytes,
        now.kv_budget, e->n_cached, e->cached_pages, e->reused_tokens, e->reuse_hits, e->shared_tokens, e->share_hits, now.steps, now.rows,
        e->drafted, e->accepted);
    if (now.experts.cache_bytes) /* --expert-cache */
        out(&buf, &len, &cap,
            "# HELP kvq_expert_cache_bytes Memory of the expert cache's slots (--expert-cache).\n"
            "# TYPE kvq_expert_cache_bytes gauge\nkvq_expert_cache_bytes %zu\n"
            "# HELP kvq_expert_fetches_total Experts the forwards used, by whether a slot held them.\n"
            "# TYPE kvq_expert_fetches_total counter\nkvq_expert_fetches_total{result=\"hit\"} %zu\n"
            "kvq_expert_fetches_total{result=\"miss\"} %zu\n"
            "# HELP kvq_expert_read_bytes_total Bytes the misses read from the checkpoint.\n"
            "# TYPE kvq_expert_read_bytes_total counter\nkvq_expert_read_bytes_total %zu\n"
            "# HELP kvq_expert_read_seconds_total Seconds those reads took (bytes / seconds: the read rate).\n"
            "# TYPE kvq_expert_read_seconds_total counter\nkvq_expert_read_seconds_total %.6f\n"
            "# HELP kvq_expert_prefetched_total Experts read ahead (--expert-prefetch on).\n"
            "# TYPE kvq_expert_prefetched_total counter\nkvq_expert_prefetched_total %zu\n"
            "# HELP kvq_expert_prefetch_hits_total Hits on an expert read ahead.\n"
            "# TYPE kvq_expert_prefetch_hits_total counter\nkvq_expert_prefetch_hits_total %zu\n",
            now.experts.cache_bytes, now.experts.hits, now.experts.misses, now.experts.bytes_read, now.experts.t_read,
            now.experts.prefetched, now.experts.prefetch_hits);
    out(&buf, &len, &cap,
        "# HELP kvq_time_to_first_token_seconds From queueing to the first generated token.\n"
        "# TYPE kvq_time_to_first_token_seconds histogram\n");
    for (int i = 0; i < N_TTFT_BUCKETS; i++)
        out(&buf, &len, &cap, "kvq_time_to_first_token_seconds_bucket{le=\"%g\"} %lu\n", serve_ttft_le[i],
            e->ttft_bucket[i]);
    out(&buf, &len, &cap,
        "kvq_time_to_first_token_seconds_bucket{le=\"+Inf\"} %lu\nkvq_time_to_first_token_seconds_sum %.6f\n"
        "kvq_time_to_first_token_seconds_count %lu\n",
        e->ttft_count, e->ttft_sum, e->ttft_count);
    serve_unlock(e);
    return buf;
}
