/* cuda_graph.cu - CUDA-graph capture of a cache's work, for fixed-shape
 * replay and for timing the device side without the host's launch cost.
 *
 * Between begin and end the cache issues on a private stream in capture
 * mode, so its calls are recorded, not run; the graph then replays them on
 * the legacy default stream, ordered with everything else queued there
 * (e.g. the benchmark timer's events).
 */
#include <stdlib.h>

#include "cuda_internal.cuh"

struct kvq_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

kvq_status kvq_cuda_graph_begin(kvq_cuda_cache *c)
{
    if (!c || c->capture_stream)
        return KVQ_ERR_INVALID_ARG;
    cudaStream_t s = NULL;
    KVQ_CU_TRY(cudaStreamCreate(&s));
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaStreamDestroy(s);
        return KVQ_ERR_DEVICE;
    }
    c->saved_stream = c->stream;
    c->capture_stream = s;
    c->stream = s;
    return KVQ_OK;
}

cudaError_t kvq_cu_capture_end(kvq_cuda_cache *c, cudaGraph_t *graph)
{
    *graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(c->capture_stream, graph);
    (void)cudaStreamDestroy(c->capture_stream);
    c->stream = c->saved_stream;
    c->capture_stream = NULL;
    return e;
}

kvq_status kvq_cuda_graph_end(kvq_cuda_cache *c, kvq_cuda_graph **out)
{
    if (out)
        *out = NULL;
    if (!c || !c->capture_stream)
        return KVQ_ERR_INVALID_ARG;
    cudaGraph_t graph = NULL;
    const cudaError_t e = kvq_cu_capture_end(c, &graph);
    if (e != cudaSuccess || !graph) {
        if (graph)
            (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        return KVQ_ERR_DEVICE;
    }
    if (!out) {
        (void)cudaGraphDestroy(graph);
        return KVQ_ERR_INVALID_ARG;
    }
    kvq_cuda_graph *g = (kvq_cuda_graph *)calloc(1, sizeof *g);
    if (!g) {
        (void)cudaGraphDestroy(graph);
        return KVQ_ERR_NOMEM;
    }
    g->graph = graph;
    if (cudaGraphInstantiate(&g->exec, graph, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        kvq_cuda_graph_free(g);
        return KVQ_ERR_DEVICE;
    }
    *out = g;
    return KVQ_OK;
}

kvq_status kvq_cuda_graph_launch(kvq_cuda_graph *g)
{
    if (!g)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaGraphLaunch(g->exec, 0));
    return KVQ_OK;
}

void kvq_cuda_graph_free(kvq_cuda_graph *g)
{
    if (!g)
        return;
    if (g->exec)
        (void)cudaGraphExecDestroy(g->exec);
    if (g->graph)
        (void)cudaGraphDestroy(g->graph);
    free(g);
}
