/* expert_cache.c - mixture-of-experts weights in a bounded set of slots,
 * read on demand from the checkpoint (expert_cache.h). */
#include "expert_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel.h"

#define MAX_READS 4 /* blocks per expert: gate, up, down (fused: gate_up, down) */

struct read_job {
    int fd;
    size_t off, len;
    uint8_t *dst;
};

struct kvq_expert_cache {
    const struct kvq_model *m;
    int n_slots, E;
    size_t slot_bytes;
    uint8_t *mem;             /* [n_slots][slot_bytes] */
    int32_t *slot_key;        /* layer * E + expert held, or -1 */
    uint64_t *slot_used;      /* clock of the last fetch that used it */
    int32_t *where;           /* [n_layers * E] slot of an expert, or -1 */
    struct kvq_wmat *slot_gu, *slot_down;
    int *fds;                 /* [files] */
    struct read_job *jobs;    /* [n_slots * MAX_READS] one fetch's reads */
    atomic_int read_error;
    uint64_t clock;
    struct kvq_expert_cache_stats st;
};

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

kvq_status kvq_expert_cache_create(const struct kvq_model *m, size_t bytes, struct kvq_expert_cache **out,
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
                    s += (size_t)w[i]->b[b].rows * (size_t)w[i]->cols * kvq_st_dtype_size(w[i]->b[b].dtype);
                }
            s = (s + 63) & ~(size_t)63;
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
    c->n_slots = (int)(bytes / slot < total ? bytes / slot : total);
    const size_t keys = (size_t)cfg->n_layers * (size_t)c->E;
    c->mem = aligned_alloc(64, (size_t)c->n_slots * slot); /* pages become resident as slots fill */
    c->slot_key = malloc((size_t)c->n_slots * sizeof *c->slot_key);
    c->slot_used = calloc((size_t)c->n_slots, sizeof *c->slot_used);
    c->where = malloc(keys * sizeof *c->where);
    c->slot_gu = calloc((size_t)c->n_slots, sizeof *c->slot_gu);
    c->slot_down = calloc((size_t)c->n_slots, sizeof *c->slot_down);
    c->jobs = malloc((size_t)c->n_slots * MAX_READS * sizeof *c->jobs);
    c->fds = malloc((size_t)m->fs.n * sizeof *c->fds);
    if (!c->mem || !c->slot_key || !c->slot_used || !c->where || !c->slot_gu || !c->slot_down || !c->jobs || !c->fds) {
        kvq_expert_cache_free(c);
        return KVQ_ERR_NOMEM;
    }
    for (int i = 0; i < m->fs.n; i++)
        c->fds[i] = -1;
    for (int i = 0; i < m->fs.n; i++)
        if ((c->fds[i] = open(m->fs.paths[i], O_RDONLY | O_CLOEXEC)) < 0) {
            const int e = errno;
            kvq_expert_cache_free(c);
            return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot open: %s", m->fs.paths[i], strerror(e));
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

void kvq_expert_cache_get_stats(const struct kvq_expert_cache *c, struct kvq_expert_cache_stats *st)
{
    *st = c->st;
}

static void read_task(void *p, int i, int w)
{
    (void)w;
    struct kvq_expert_cache *c = p;
    const struct read_job *j = &c->jobs[i];
    size_t done = 0;
    while (done < j->len) {
        const ssize_t r = pread(j->fd, j->dst + done, j->len - done, (off_t)(j->off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            atomic_store(&c->read_error, 1);
            return;
        }
        done += (size_t)r;
    }
}

/* Slot s's matrices: src's blocks, their data in the slot; the reads that
 * fill it appended at *n_jobs. */
static void place(struct kvq_expert_cache *c, int s, const struct kvq_wmat *src_gu, const struct kvq_wmat *src_down,
                  int *n_jobs)
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
            c->jobs[(*n_jobs)++] = (struct read_job){c->fds[f], off, len, dst};
            to[i]->b[b].data = dst;
            dst += len;
        }
    }
}

kvq_status kvq_expert_cache_fetch(struct kvq_expert_cache *c, int l, const int32_t *ids, int n,
                                  const struct kvq_wmat **gu, const struct kvq_wmat **down)
{
    const uint64_t stamp = ++c->clock; /* slots used at stamp are this fetch's: not victims */
    int n_jobs = 0, missed[KVQ_MAX_EXPERTS], n_missed = 0;
    for (int i = 0; i < n; i++) {
        const int32_t key = l * c->E + ids[i];
        int s = c->where[key];
        if (s >= 0) {
            c->st.hits++;
        } else {
            s = 0; /* the least recently used slot not taken by this fetch */
            for (int t = 1; t < c->n_slots; t++)
                if (c->slot_used[t] < c->slot_used[s])
                    s = t;
            if (c->slot_key[s] >= 0)
                c->where[c->slot_key[s]] = -1;
            c->slot_key[s] = key;
            c->where[key] = s;
            place(c, s, &c->m->moe[l].gu[ids[i]], &c->m->moe[l].down[ids[i]], &n_jobs);
            missed[n_missed++] = s;
            c->st.misses++;
        }
        c->slot_used[s] = stamp;
        gu[i] = &c->slot_gu[s];
        down[i] = &c->slot_down[s];
    }
    if (!n_jobs)
        return KVQ_OK;
    const double t0 = kvq_now();
    atomic_store(&c->read_error, 0);
    kvq_par_for(n_jobs, kvq_par_threads(), read_task, c);
    c->st.read_seconds += kvq_now() - t0;
    for (int j = 0; j < n_jobs; j++)
        c->st.bytes_read += c->jobs[j].len;
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
