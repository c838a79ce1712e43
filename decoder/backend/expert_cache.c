/* expert_cache.c - mixture-of-experts weights in a bounded set of slots,
 * read on demand from the checkpoint (expert_cache.h). */
#define _GNU_SOURCE /* O_DIRECT */
#include "expert_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel.h"

#define MAX_READS 4 /* blocks per expert: gate, up, down (fused: gate_up, down) */
#define DIRECT_ALIGN ((size_t)4096) /* O_DIRECT: offsets, lengths and buffers in these units */

struct read_job {
    int fd, file; /* file: index into m->fs, for the error message */
    size_t off, len;
    size_t need; /* bytes that must arrive: len, or with O_DIRECT the block's end within the
                  * aligned range (the file may end before the range does) */
    uint8_t *dst;
};

struct kvq_expert_cache {
    const struct kvq_model *m;
    int n_slots, E;
    size_t slot_bytes;
    int direct;               /* the fds are O_DIRECT: reads of aligned ranges */
    uint8_t *mem;             /* [n_slots][slot_bytes] */
    int32_t *slot_key;        /* layer * E + expert held, or -1 */
    uint64_t *slot_used;      /* clock of the last fetch that used it */
    int32_t *where;           /* [n_layers * E] slot of an expert, or -1 */
    struct kvq_wmat *slot_gu, *slot_down;
    int *fds;                 /* [files] */
    struct read_job *jobs;    /* [n_slots * MAX_READS] one fetch's reads */
    atomic_int read_error;
    char why[320];            /* the failed fetch's first failed read (kvq_expert_cache_error) */
    uint64_t clock;
    struct kvq_expert_cache_stats st;
    /* read-ahead: one reader thread, started by the first prefetch. mu
     * guards loading, failed, the queue, stop and st's read-ahead fields;
     * the rest is the calling thread's */
    uint8_t *loading;         /* [n_slots] the reader owns the slot's memory until it clears this */
    uint8_t *failed;          /* [n_slots] its read of the slot failed */
    uint8_t *ahead;           /* [n_slots] read ahead and not fetched since */
    struct read_job *ajobs;   /* [n_slots][MAX_READS] each slot's read-ahead */
    int *anjobs;              /* [n_slots] */
    int *queue, q_head, q_len; /* ring of slots to read */
    int reader_on, stop;
    pthread_t reader;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
};

/* Bytes a block of len bytes at file offset off takes in a slot: itself,
 * or with O_DIRECT the aligned range around it. */
static size_t span_of(int direct, size_t off, size_t len)
{
    if (!direct)
        return len;
    const size_t a = off & ~(DIRECT_ALIGN - 1);
    return (off + len + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN - a;
}

/* The file holding p, and p's offset in it; -1 when p is not in a mapping. */
static int file_of(const struct kvq_model *m, const void *p, size_t *off)
{
    for (int i = 0; i < m->fs.n; i++) {
        const uint8_t *base = kvq_st_file_data(m->fs.files[i]);
        const size_t size = kvq_st_file_size(m->fs.files[i]);
        if ((const uint8_t *)p >= base && (const uint8_t *)p < base + size) {
            *off = (size_t)((const uint8_t *)p - base);
            return i;
        }
    }
    return -1;
}

void kvq_expert_cache_free(struct kvq_expert_cache *c)
{
    if (!c)
        return;
    if (c->reader_on) { /* the reader finishes the slot it reads, leaves the rest */
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->reader, NULL);
    }
    if (c->loading) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->work);
        pthread_cond_destroy(&c->done);
    }
    free(c->loading);
    free(c->failed);
    free(c->ahead);
    free(c->ajobs);
    free(c->anjobs);
    free(c->queue);
    for (int i = 0; c->fds && i < c->m->fs.n; i++)
        if (c->fds[i] >= 0)
            close(c->fds[i]);
    free(c->fds);
    free(c->mem);
    free(c->slot_key);
    free(c->slot_used);
    free(c->where);
    free(c->slot_gu);
    free(c->slot_down);
    free(c->jobs);
    free(c);
}

kvq_status kvq_expert_cache_create(const struct kvq_model *m, size_t bytes, int direct, struct kvq_expert_cache **out,
                                   kvq_error *err)
{
    const struct kvq_model_config *cfg = &m->cfg;
    *out = NULL;
    if (cfg->arch.n_experts <= 0 || !m->moe)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "expert cache: the model has no experts");
    size_t slot = 0, total = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int e = 0; kvq_model_layer_is_moe(cfg, l) && e < cfg->arch.n_experts; e++) {
            const struct kvq_wmat *w[2] = {&m->moe[l].gu[e], &m->moe[l].down[e]};
            size_t s = 0, off;
            for (int i = 0; i < 2; i++)
                for (int b = 0; b < w[i]->n_blocks; b++) {
                    if (file_of(m, w[i]->b[b].data, &off) < 0)
                        return kvq_error_set(err, KVQ_ERR_INVALID_ARG,
                                             "expert cache: the experts must be read from the checkpoint's files "
                                             "(not widened to f32 at load)");
                    s += span_of(direct, off,
                                 (size_t)w[i]->b[b].rows * (size_t)w[i]->cols * kvq_st_dtype_size(w[i]->b[b].dtype));
                }
            const size_t unit = direct ? DIRECT_ALIGN : 64;
            s = (s + unit - 1) / unit * unit;
            slot = s > slot ? s : slot;
            total++;
        }
    if (bytes < slot)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "expert cache of %zu bytes holds no expert (one takes %zu)",
                             bytes, slot);
    struct kvq_expert_cache *c = calloc(1, sizeof *c);
    if (!c)
        return KVQ_ERR_NOMEM;
    c->m = m;
    c->E = cfg->arch.n_experts;
    c->slot_bytes = slot;
    c->direct = direct;
    c->n_slots = (int)(bytes / slot < total ? bytes / slot : total);
    const size_t keys = (size_t)cfg->n_layers * (size_t)c->E;
    c->mem = aligned_alloc(direct ? DIRECT_ALIGN : 64, (size_t)c->n_slots * slot); /* pages become resident as slots fill */
    c->slot_key = malloc((size_t)c->n_slots * sizeof *c->slot_key);
    c->slot_used = calloc((size_t)c->n_slots, sizeof *c->slot_used);
    c->where = malloc(keys * sizeof *c->where);
    c->slot_gu = calloc((size_t)c->n_slots, sizeof *c->slot_gu);
    c->slot_down = calloc((size_t)c->n_slots, sizeof *c->slot_down);
    c->jobs = malloc((size_t)c->n_slots * MAX_READS * sizeof *c->jobs);
    c->fds = malloc((size_t)m->fs.n * sizeof *c->fds);
    const size_t ns = (size_t)c->n_slots;
    c->loading = calloc(ns, 1);
    c->failed = calloc(ns, 1);
    c->ahead = calloc(ns, 1);
    c->ajobs = malloc(ns * MAX_READS * sizeof *c->ajobs);
    c->anjobs = calloc(ns, sizeof *c->anjobs);
    c->queue = malloc(ns * sizeof *c->queue);
    if (!c->mem || !c->slot_key || !c->slot_used || !c->where || !c->slot_gu || !c->slot_down || !c->jobs || !c->fds ||
        !c->loading || !c->failed || !c->ahead || !c->ajobs || !c->anjobs || !c->queue) {
        free(c->loading); /* the mutex is not made yet: free must not destroy it */
        c->loading = NULL;
        kvq_expert_cache_free(c);
        return KVQ_ERR_NOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    for (int i = 0; i < m->fs.n; i++)
        c->fds[i] = -1;
    for (int i = 0; i < m->fs.n; i++)
        if ((c->fds[i] = open(m->fs.paths[i], O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0))) < 0) {
            const int e = errno;
            kvq_expert_cache_free(c);
            return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot open%s: %s", m->fs.paths[i],
                                 direct ? " for direct reads (O_DIRECT)" : "", strerror(e));
        }
    for (int s = 0; s < c->n_slots; s++)
        c->slot_key[s] = -1;
    for (size_t k = 0; k < keys; k++)
        c->where[k] = -1;
    c->st.slots = (size_t)c->n_slots;
    c->st.slot_bytes = slot;
    *out = c;
    return KVQ_OK;
}

int kvq_expert_cache_slots(const struct kvq_expert_cache *c)
{
    return c->n_slots;
}

void kvq_expert_cache_get_stats(struct kvq_expert_cache *c, struct kvq_expert_cache_stats *st)
{
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    pthread_mutex_unlock(&c->mu);
}

/* @return 0 when all of j's bytes were read, else the errno of the failed
 * read (0 bytes read, the file ended early: -1). */
static int read_job_run(const struct read_job *j)
{
    size_t done = 0;
    while (done < j->need) {
        const ssize_t r = pread(j->fd, j->dst + done, j->len - done, (off_t)(j->off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? errno : -1;
        done += (size_t)r;
    }
    return 0;
}

static void read_task(void *p, int i, int w)
{
    (void)w;
    struct kvq_expert_cache *c = p;
    const struct read_job *j = &c->jobs[i];
    const int e = read_job_run(j);
    if (e && atomic_exchange(&c->read_error, 1) == 0) /* the first failure says why */
        snprintf(c->why, sizeof c->why, "%s: cannot read %zu bytes of expert weights at offset %zu: %s",
                 c->m->fs.paths[j->file], j->len, j->off, e < 0 ? "the file ends before them" : strerror(e));
}

const char *kvq_expert_cache_error(const struct kvq_expert_cache *c)
{
    return c && c->why[0] ? c->why : NULL;
}

/* The reader thread: the queued slots' reads, one slot at a time. */
static void *reader_main(void *p)
{
    struct kvq_expert_cache *c = p;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->q_len && !c->stop)
            pthread_cond_wait(&c->work, &c->mu);
        if (c->stop)
            break;
        const int s = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % c->n_slots;
        c->q_len--;
        pthread_mutex_unlock(&c->mu);
        int ok = 1;
        size_t bytes = 0;
        const double t0 = kvq_now();
        for (int j = 0; j < c->anjobs[s]; j++) {
            ok &= read_job_run(&c->ajobs[(size_t)s * MAX_READS + (size_t)j]) == 0;
            bytes += c->ajobs[(size_t)s * MAX_READS + (size_t)j].len;
        }
        pthread_mutex_lock(&c->mu);
        c->loading[s] = 0;
        c->failed[s] = (uint8_t)!ok;
        c->st.prefetch_bytes += bytes;
        c->st.prefetch_seconds += kvq_now() - t0;
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Slot s's matrices: src's blocks, their data in the slot; the reads that
 * fill it appended to jobs at *n_jobs. */
static void place(struct kvq_expert_cache *c, int s, const struct kvq_wmat *src_gu, const struct kvq_wmat *src_down,
                  struct read_job *jobs, int *n_jobs)
{
    uint8_t *dst = c->mem + (size_t)s * c->slot_bytes;
    const struct kvq_wmat *src[2] = {src_gu, src_down};
    struct kvq_wmat *to[2] = {&c->slot_gu[s], &c->slot_down[s]};
    for (int i = 0; i < 2; i++) {
        *to[i] = *src[i];
        for (int b = 0; b < src[i]->n_blocks; b++) {
            const size_t len = (size_t)src[i]->b[b].rows * (size_t)src[i]->cols * kvq_st_dtype_size(src[i]->b[b].dtype);
            size_t off = 0;
            const int f = file_of(c->m, src[i]->b[b].data, &off);
            /* O_DIRECT: the aligned range around the block, the block inside it */
            const size_t a = c->direct ? off & ~(DIRECT_ALIGN - 1) : off, span = span_of(c->direct, off, len);
            jobs[(*n_jobs)++] = (struct read_job){c->fds[f], f, a, span, off - a + len, dst};
            to[i]->b[b].data = dst + (off - a);
            dst += span;
        }
    }
}

/* The least recently used slot not taken since `stamp` and not being read
 * (c->mu held); -1 when every such slot is taken. */
static int victim(const struct kvq_expert_cache *c, uint64_t stamp)
{
    int s = -1;
    for (int t = 0; t < c->n_slots; t++)
        if (c->slot_used[t] < stamp && !c->loading[t] && (s < 0 || c->slot_used[t] < c->slot_used[s]))
            s = t;
    return s;
}

/* Slot s now holds expert key (the one it held, if any, leaves; c->mu held). */
static void assign(struct kvq_expert_cache *c, int s, int32_t key)
{
    if (c->slot_key[s] >= 0)
        c->where[c->slot_key[s]] = -1;
    c->slot_key[s] = key;
    c->where[key] = s;
    c->failed[s] = 0;
}

int kvq_expert_cache_prefetch(struct kvq_expert_cache *c, int l, const int32_t *ids, int n)
{
    int started = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        const int32_t key = l * c->E + ids[i];
        if (c->where[key] >= 0)
            continue;
        /* the last fetch's slots and this call's are taken; layer l's own are
         * kept too: they hold its last picks, which the next token often
         * repeats (taking them lowered the hit rate, bench_experts) */
        int s = -1;
        for (int t = 0; t < c->n_slots; t++)
            if (c->slot_used[t] < c->clock && !c->loading[t] && (c->slot_key[t] < 0 || c->slot_key[t] / c->E != l) &&
                (s < 0 || c->slot_used[t] < c->slot_used[s]))
                s = t;
        if (s < 0)
            break;
        assign(c, s, key);
        c->slot_used[s] = c->clock;
        c->anjobs[s] = 0;
        place(c, s, &c->m->moe[l].gu[ids[i]], &c->m->moe[l].down[ids[i]], c->ajobs + (size_t)s * MAX_READS,
              &c->anjobs[s]);
        c->loading[s] = 1;
        c->failed[s] = 0;
        c->ahead[s] = 1;
        c->queue[(c->q_head + c->q_len++) % c->n_slots] = s;
        c->st.prefetched++;
        started++;
    }
    if (started && !c->reader_on)
        c->reader_on = pthread_create(&c->reader, NULL, reader_main, c) == 0;
    if (started && !c->reader_on) { /* no thread: the reads happen at the fetch instead */
        for (int i = 0; i < c->q_len; i++) {
            const int s = c->queue[(c->q_head + i) % c->n_slots];
            c->loading[s] = 0;
            c->failed[s] = 1;
        }
        c->q_len = 0;
    }
    if (started)
        pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    return started;
}

kvq_status kvq_expert_cache_fetch(struct kvq_expert_cache *c, int l, const int32_t *ids, int n,
                                  const struct kvq_wmat **gu, const struct kvq_wmat **down)
{
    const uint64_t stamp = ++c->clock; /* slots used at stamp are this fetch's: not victims */
    int n_jobs = 0, missed[KVQ_MAX_EXPERTS], n_missed = 0;
    c->why[0] = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        const int32_t key = l * c->E + ids[i];
        int s = c->where[key];
        int read = s < 0;
        if (s >= 0 && c->loading[s]) { /* read ahead, not there yet */
            const double t0 = kvq_now();
            while (c->loading[s])
                pthread_cond_wait(&c->done, &c->mu);
            c->st.prefetch_wait_seconds += kvq_now() - t0;
        }
        if (s >= 0 && c->failed[s]) { /* the read-ahead failed: read it here (and fail here if it does again) */
            c->failed[s] = 0;
            c->ahead[s] = 0;
            read = 1;
        }
        if (s < 0) {
            while ((s = victim(c, stamp)) < 0) /* every free slot is being read ahead */
                pthread_cond_wait(&c->done, &c->mu);
            assign(c, s, key);
            c->ahead[s] = 0;
        }
        if (read) {
            place(c, s, &c->m->moe[l].gu[ids[i]], &c->m->moe[l].down[ids[i]], c->jobs, &n_jobs);
            missed[n_missed++] = s;
            c->st.misses++;
        } else {
            c->st.hits++;
            if (c->ahead[s]) {
                c->st.prefetch_hits++;
                c->ahead[s] = 0;
            }
        }
        c->slot_used[s] = stamp;
        gu[i] = &c->slot_gu[s];
        down[i] = &c->slot_down[s];
    }
    pthread_mutex_unlock(&c->mu);
    if (!n_jobs)
        return KVQ_OK;
    const double t0 = kvq_now();
    atomic_store(&c->read_error, 0);
    kvq_par_for(n_jobs, kvq_par_threads(), read_task, c);
    c->st.read_seconds += kvq_now() - t0;
    size_t bytes = 0;
    for (int j = 0; j < n_jobs; j++)
        bytes += c->jobs[j].len;
    pthread_mutex_lock(&c->mu);
    c->st.bytes_read += bytes;
    pthread_mutex_unlock(&c->mu);
    if (atomic_load(&c->read_error)) { /* the slots read hold nothing usable */
        for (int i = 0; i < n_missed; i++) {
            c->where[c->slot_key[missed[i]]] = -1;
            c->slot_key[missed[i]] = -1;
            c->slot_used[missed[i]] = 0;
        }
        return KVQ_ERR_IO;
    }
    return KVQ_OK;
}
