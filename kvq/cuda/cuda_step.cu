/* cuda_step.cu - a repeated step recorded once as a CUDA graph and replayed
 * with each call's current arguments (kvq_cuda.h, "step graphs").
 *
 * Capture uses stream capture, so the caller's code path is the same in
 * every mode: after each captured launch the stream's capture dependency is
 * the node just added, which is remembered with a copy of the arguments'
 * bytes. A replay walks the same calls: equal arguments cost a memcmp,
 * changed ones one cudaGraphExec*SetParams on the instantiated graph. While
 * replaying, the stream is put in capture mode too, into a throwaway graph:
 * anything issued around the recorder lands there instead of running out of
 * order before the graph, and makes the launch fail.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

namespace {

enum { NODE_KERNEL = 0, NODE_COPY = 1 };

struct step_node {
    cudaGraphNode_t node;
    int kind;
    /* kernel */
    const void *func;
    dim3 grid, block;
    size_t smem;
    int pdl;
    size_t arg_off, arg_len; /* the arguments' bytes in the key's blob */
    /* copy */
    void *dst;
    const void *src;
    size_t bytes;
};

struct step_graph {
    uint64_t key;
    int used;
    unsigned long long last_use;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    step_node *nodes;
    size_t n, cap;
    uint8_t *blob;
    size_t blob_len, blob_cap;
};

void graph_drop(step_graph *g)
{
    if (g->exec)
        (void)cudaGraphExecDestroy(g->exec);
    if (g->graph)
        (void)cudaGraphDestroy(g->graph);
    g->exec = NULL;
    g->graph = NULL;
    g->used = 0;
    g->n = 0;
    g->blob_len = 0;
}

} /* namespace */

struct kvq_cuda_step {
    cudaStream_t stream;
    step_graph *graphs;
    int n_graphs;
    step_graph *cur; /* the open step's graph */
    enum kvq_cuda_step_mode mode;
    size_t cursor;   /* replay: the next recorded node */
    int failed;      /* the open step cannot be launched */
    unsigned long long clock;
    size_t captured, replayed;
};

kvq_status kvq_cuda_step_create(void *stream, int max_keys, kvq_cuda_step **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (!stream || max_keys < 1 || max_keys > 64)
        return KVQ_ERR_INVALID_ARG;
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    kvq_cuda_step *s = (kvq_cuda_step *)calloc(1, sizeof *s);
    if (!s || !(s->graphs = (step_graph *)calloc((size_t)max_keys, sizeof *s->graphs))) {
        free(s);
        return KVQ_ERR_NOMEM;
    }
    s->stream = (cudaStream_t)stream;
    s->n_graphs = max_keys;
    *out = s;
    return KVQ_OK;
}

void kvq_cuda_step_free(kvq_cuda_step *s)
{
    if (!s)
        return;
    kvq_cuda_step_cancel(s);
    for (int i = 0; i < s->n_graphs; i++) {
        graph_drop(&s->graphs[i]);
        free(s->graphs[i].nodes);
        free(s->graphs[i].blob);
    }
    free(s->graphs);
    free(s);
}

enum kvq_cuda_step_mode kvq_cuda_step_mode(const kvq_cuda_step *s)
{
    return s ? s->mode : KVQ_CUDA_STEP_OFF;
}

void kvq_cuda_step_counts(const kvq_cuda_step *s, size_t *captured, size_t *replayed)
{
    if (captured)
        *captured = s ? s->captured : 0;
    if (replayed)
        *replayed = s ? s->replayed : 0;
}

enum kvq_cuda_step_mode kvq_cuda_step_begin(kvq_cuda_step *s, uint64_t key)
{
    if (!s || s->mode != KVQ_CUDA_STEP_OFF)
        return KVQ_CUDA_STEP_OFF;
    step_graph *g = NULL, *lru = &s->graphs[0];
    for (int i = 0; i < s->n_graphs; i++) {
        step_graph *x = &s->graphs[i];
        if (x->used && x->key == key)
            g = x;
        if (!x->used || (lru->used && x->last_use < lru->last_use))
            lru = x;
    }
    /* ThreadLocal: calls from other threads (another sequence's host work)
     * are not caught by this capture */
    if (cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return KVQ_CUDA_STEP_OFF;
    }
    if (!g) {
        g = lru;
        graph_drop(g);
        g->key = key;
    }
    g->last_use = ++s->clock;
    s->cur = g;
    s->cursor = 0;
    s->failed = 0;
    s->mode = g->used ? KVQ_CUDA_STEP_REPLAY : KVQ_CUDA_STEP_CAPTURE;
    return s->mode;
}

/* Ends the stream's capture; *out the graph (NULL on failure). */
static cudaError_t end_capture(kvq_cuda_step *s, cudaGraph_t *out)
{
    *out = NULL;
    cudaError_t e = cudaStreamEndCapture(s->stream, out);
    if (e != cudaSuccess) {
        if (*out)
            (void)cudaGraphDestroy(*out);
        *out = NULL;
        (void)cudaGetLastError();
    }
    return e;
}

void kvq_cuda_step_cancel(kvq_cuda_step *s)
{
    if (!s || s->mode == KVQ_CUDA_STEP_OFF)
        return;
    cudaGraph_t g = NULL;
    (void)end_capture(s, &g);
    if (g)
        (void)cudaGraphDestroy(g);
    if (s->mode == KVQ_CUDA_STEP_CAPTURE)
        graph_drop(s->cur);
    s->mode = KVQ_CUDA_STEP_OFF;
    s->cur = NULL;
}

kvq_status kvq_cuda_step_launch(kvq_cuda_step *s)
{
    if (!s || s->mode == KVQ_CUDA_STEP_OFF)
        return KVQ_ERR_INVALID_ARG;
    step_graph *g = s->cur;
    const enum kvq_cuda_step_mode mode = s->mode;
    s->mode = KVQ_CUDA_STEP_OFF;
    s->cur = NULL;
    cudaGraph_t captured = NULL;
    const cudaError_t e = end_capture(s, &captured);
    int ok = e == cudaSuccess && captured && !s->failed;
    if (mode == KVQ_CUDA_STEP_CAPTURE) {
        if (ok && cudaGraphInstantiate(&g->exec, captured, 0) != cudaSuccess) {
            (void)cudaGetLastError();
            g->exec = NULL;
            ok = 0;
        }
        g->graph = captured;
        captured = NULL;
        g->used = ok;
        s->captured += (size_t)ok;
    } else {
        /* nothing may have reached the stream but through the recorder,
         * and every recorded node must have been met */
        size_t stray = 1;
        if (ok && cudaGraphGetNodes(captured, NULL, &stray) != cudaSuccess)
            stray = 1;
        ok = ok && stray == 0 && s->cursor == g->n;
        s->replayed += (size_t)ok;
    }
    if (captured)
        (void)cudaGraphDestroy(captured);
    if (ok && cudaGraphLaunch(g->exec, s->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        ok = 0;
    }
    if (!ok) {
        graph_drop(g);
        return KVQ_ERR_DEVICE;
    }
    return KVQ_OK;
}

/* The node the stream's capture added last. */
static cudaGraphNode_t last_node(kvq_cuda_step *s)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
    if (cudaStreamGetCaptureInfo(s->stream, &cs, NULL, NULL, &deps, NULL, &nd) != cudaSuccess ||
        cs != cudaStreamCaptureStatusActive || nd != 1)
        return NULL;
    return deps[0];
}

/* The open step cannot be launched any more (kvq_cuda_step_launch reports it). */
static kvq_status step_fail(kvq_cuda_step *s)
{
    (void)cudaGetLastError();
    s->failed = 1;
    return KVQ_ERR_DEVICE;
}

/* Replay: the next recorded node, if it is of this kind. */
static step_node *replay_next(kvq_cuda_step *s, int kind)
{
    step_graph *g = s->cur;
    step_node *n = s->cursor < g->n ? &g->nodes[s->cursor] : NULL;
    if (!n || n->kind != kind)
        return NULL;
    s->cursor++;
    return n;
}

static step_node *node_push(kvq_cuda_step *s)
{
    step_graph *g = s->cur;
    if (g->n == g->cap) {
        const size_t cap = g->cap ? 2 * g->cap : 256;
        step_node *n = (step_node *)realloc(g->nodes, cap * sizeof *n);
        if (!n)
            return NULL;
        g->nodes = n;
        g->cap = cap;
    }
    step_node *n = &g->nodes[g->n++];
    memset(n, 0, sizeof *n);
    return n;
}

static size_t args_len(const size_t *bytes, int n)
{
    size_t t = 0;
    for (int i = 0; i < n; i++)
        t += bytes[i];
    return t;
}

static int args_equal(const uint8_t *blob, void **args, const size_t *bytes, int n)
{
    for (int i = 0; i < n; i++) {
        if (memcmp(blob, args[i], bytes[i]) != 0)
            return 0;
        blob += bytes[i];
    }
    return 1;
}

static void args_store(uint8_t *blob, void **args, const size_t *bytes, int n)
{
    for (int i = 0; i < n; i++) {
        memcpy(blob, args[i], bytes[i]);
        blob += bytes[i];
    }
}

static kvq_status launch_plain(cudaStream_t stream, const void *func, dim3 grid, dim3 block, size_t smem, int pdl,
                               void **args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    KVQ_CU_TRY(cudaLaunchKernelExC(&cfg, func, args));
    return KVQ_OK;
}

static int dim_eq(dim3 a, dim3 b)
{
    return a.x == b.x && a.y == b.y && a.z == b.z;
}

kvq_status kvq_cuda_step_kernel(kvq_cuda_step *s, void *stream, const void *func, const unsigned grid[3],
                                const unsigned block[3], size_t smem, int pdl, void **args, const size_t *arg_bytes,
                                int n_args)
{
    if (!func || !grid || !block || n_args < 0 || (n_args && (!args || !arg_bytes)))
        return KVQ_ERR_INVALID_ARG;
    const dim3 g3(grid[0], grid[1], grid[2]), b3(block[0], block[1], block[2]);
    if (!s || s->mode == KVQ_CUDA_STEP_OFF)
        return launch_plain((cudaStream_t)stream, func, g3, b3, smem, pdl, args);
    if ((cudaStream_t)stream != s->stream || s->failed)
        return step_fail(s);
    step_graph *g = s->cur;
    const size_t len = args_len(arg_bytes, n_args);
    if (s->mode == KVQ_CUDA_STEP_CAPTURE) {
        kvq_status st = launch_plain(s->stream, func, g3, b3, smem, pdl, args);
        step_node *n = st == KVQ_OK ? node_push(s) : NULL;
        if (n && g->blob_len + len > g->blob_cap) {
            size_t cap = g->blob_cap ? g->blob_cap : 1 << 16;
            while (cap < g->blob_len + len)
                cap *= 2;
            uint8_t *b = (uint8_t *)realloc(g->blob, cap);
            if (b) {
                g->blob = b;
                g->blob_cap = cap;
            } else {
                n = NULL;
            }
        }
        if (!n || !(n->node = last_node(s)))
            return st != KVQ_OK ? (s->failed = 1, st) : step_fail(s);
        n->kind = NODE_KERNEL;
        n->func = func;
        n->grid = g3;
        n->block = b3;
        n->smem = smem;
        n->pdl = pdl;
        n->arg_off = g->blob_len;
        n->arg_len = len;
        args_store(g->blob + g->blob_len, args, arg_bytes, n_args);
        g->blob_len += len;
        return KVQ_OK;
    }
    /* replay: same kind, same launch attribute (it decides the edge) and
     * argument size; anything else may differ and is patched */
    step_node *n = replay_next(s, NODE_KERNEL);
    if (!n || n->pdl != pdl || n->arg_len != len)
        return step_fail(s);
    uint8_t *blob = g->blob + n->arg_off;
    if (n->func == func && dim_eq(n->grid, g3) && dim_eq(n->block, b3) && n->smem == smem &&
        args_equal(blob, args, arg_bytes, n_args))
        return KVQ_OK;
    cudaKernelNodeParams kp = {};
    kp.func = (void *)func;
    kp.gridDim = g3;
    kp.blockDim = b3;
    kp.sharedMemBytes = (unsigned)smem;
    kp.kernelParams = args;
    if (cudaGraphExecKernelNodeSetParams(g->exec, n->node, &kp) != cudaSuccess)
        return step_fail(s);
    n->func = func;
    n->grid = g3;
    n->block = b3;
    n->smem = smem;
    args_store(blob, args, arg_bytes, n_args);
    return KVQ_OK;
}

kvq_status kvq_cuda_step_copy(kvq_cuda_step *s, void *stream, void *dst, const void *src, size_t bytes)
{
    if (!dst || !src)
        return KVQ_ERR_INVALID_ARG;
    if (!s || s->mode == KVQ_CUDA_STEP_OFF) {
        KVQ_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
        return KVQ_OK;
    }
    if ((cudaStream_t)stream != s->stream || s->failed)
        return step_fail(s);
    if (s->mode == KVQ_CUDA_STEP_CAPTURE) {
        step_node *n = NULL;
        if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->stream) != cudaSuccess ||
            !(n = node_push(s)) || !(n->node = last_node(s)))
            return step_fail(s);
        n->kind = NODE_COPY;
        n->dst = dst;
        n->src = src;
        n->bytes = bytes;
        return KVQ_OK;
    }
    step_node *n = replay_next(s, NODE_COPY);
    if (!n)
        return step_fail(s);
    if (n->dst == dst && n->src == src && n->bytes == bytes)
        return KVQ_OK;
    if (cudaGraphExecMemcpyNodeSetParams1D(s->cur->exec, n->node, dst, src, bytes, cudaMemcpyDefault) != cudaSuccess)
        return step_fail(s);
    n->dst = dst;
    n->src = src;
    n->bytes = bytes;
    return KVQ_OK;
}
