/*
 * memory_graphs.c - graph memory (rules in memory.c): every instantiate entry point reserves
 * the memory of the graph's allocation nodes before the driver makes the executable graph.
 *
 * The driver's rule: an alloc node's memory is taken when the executable graph is uploaded
 * or launched and lives until a free node of the graph, or cuMemFree / cuMemFreeAsync of its
 * address. Nodes reach a graph by many roads: cuGraphAddMemAllocNode, cuGraphAddNode / _v2
 * with CU_GRAPH_NODE_TYPE_MEM_ALLOC, stream capture of cuMemAllocAsync (the allocation on a
 * capturing stream is a node, not memory: memory_pools.c lets it through uncounted),
 * a child graph moved into its parent (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, CUDA 13). So the
 * interposer does not follow the roads: at instantiation it
 * asks the driver for the graph's nodes (cuGraphGetNodes, cuGraphNodeGetType,
 * cuGraphMemAllocNodeGetParams / MemFreeNodeGetParams, child graphs through
 * cuGraphChildGraphNodeGetGraph, 8 levels deep at most) and reserves the sum of the alloc
 * nodes, all or nothing (over the cap: CUDA_ERROR_OUT_OF_MEMORY, nothing instantiated).
 * Hooked: cuGraphInstantiate and cuGraphInstantiate_v2 (the pre-12.0 symbols),
 * cuGraphInstantiateWithFlags, cuGraphInstantiateWithParams (+ _ptsz; its upload flag
 * included). cuGraphUpload and cuGraphLaunch need no reservation of their own: every
 * executable graph was made by one of these, and cuGraphExecUpdate cannot add memory nodes.
 * Nodes the graph also frees are held for the executable graph and given back at
 * cuGraphExecDestroy or when its context is destroyed or reset; nodes it does not free are held for their address and given back at
 * cuMemFree / cuMemFreeAsync of it (an executable graph destroyed without a launch keeps
 * those counted: stricter, never looser). An upper bound: the driver may reuse freed graph
 * memory inside one launch. A captured cuMemFreeAsync of memory allocated outside the graph
 * keeps that memory counted until it is freed outside a capture (stricter).
 */
#include <stdlib.h>

#include "fgpu.h"

#define MAX_DEPTH 8

struct walk {
    struct fgpu_gnode *nodes; /* alloc nodes */
    size_t n, cap;
    CUdeviceptr *frees; /* free nodes' addresses */
    size_t nf, capf;
    int failed; /* out of host memory: refuse rather than let memory through uncounted */
};

static void *grow(void *p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return p;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(p, c * size);
    if (q != NULL)
        *cap = c;
    return q;
}

static void walk_graph(CUgraph graph, struct walk *w, int depth)
{
    size_t n = 0;
    if (fgpu_real.cuGraphGetNodes == NULL || fgpu_real.cuGraphNodeGetType == NULL ||
        fgpu_real.cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS || n == 0)
        return; /* an invalid graph: the driver's instantiate says so */
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (nodes == NULL) {
        w->failed = 1;
        return;
    }
    if (fgpu_real.cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS)
        n = 0;
    for (size_t i = 0; i < n && !w->failed; i++) {
        CUgraphNodeType type;
        if (nodes[i] == NULL || fgpu_real.cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS)
            continue;
        if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && fgpu_real.cuGraphMemAllocNodeGetParams) {
            CUDA_MEM_ALLOC_NODE_PARAMS p = {0};
            if (fgpu_real.cuGraphMemAllocNodeGetParams(nodes[i], &p) != CUDA_SUCCESS)
                continue;
            struct fgpu_gnode *grown = grow(w->nodes, &w->cap, w->n + 1, sizeof *grown);
            if (grown == NULL) {
                w->failed = 1;
                break;
            }
            w->nodes = grown;
            w->nodes[w->n++] = (struct fgpu_gnode){
                .gpu = fgpu_gpu_of_device(p.poolProps.location.id),
                .bytes = p.bytesize,
                .dptr = p.dptr,
            };
        } else if (type == CU_GRAPH_NODE_TYPE_MEM_FREE && fgpu_real.cuGraphMemFreeNodeGetParams) {
            CUdeviceptr d = 0;
            if (fgpu_real.cuGraphMemFreeNodeGetParams(nodes[i], &d) != CUDA_SUCCESS)
                continue;
            CUdeviceptr *grown = grow(w->frees, &w->capf, w->nf + 1, sizeof *grown);
            if (grown == NULL) {
                w->failed = 1;
                break;
            }
            w->frees = grown;
            w->frees[w->nf++] = d;
        } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && depth < MAX_DEPTH &&
                   fgpu_real.cuGraphChildGraphNodeGetGraph != NULL) {
            CUgraph child = NULL;
            if (fgpu_real.cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS &&
                child != NULL)
                walk_graph(child, w, depth + 1);
        }
    }
    free(nodes);
}

static void walk_free(struct walk *w)
{
    free(w->nodes);
    free(w->frees);
}

/* Before the driver's instantiate: reserve every alloc node of graph. CUDA_SUCCESS, or
 * CUDA_ERROR_OUT_OF_MEMORY (nothing held; w freed). */
static CUresult graph_reserve(CUgraph graph, struct walk *w)
{
    *w = (struct walk){0};
    walk_graph(graph, w, 0);
    if (w->failed) {
        walk_free(w);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < w->n; i++) {
        for (size_t k = 0; k < w->nf; k++)
            w->nodes[i].freed |= w->frees[k] == w->nodes[i].dptr;
        if (fgpu_mem_take(&w->nodes[i].gpu, w->nodes[i].bytes) != CUDA_SUCCESS) {
            for (size_t j = 0; j < i; j++)
                fgpu_mem_give(w->nodes[j].gpu, w->nodes[j].bytes);
            walk_free(w);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    return CUDA_SUCCESS;
}

/* After it: hold the reservations for the executable graph (or the addresses), or give them
 * back when the driver failed. Frees w. */
static void graph_settle(struct walk *w, CUresult r, const CUgraphExec *exec)
{
    for (size_t i = 0; i < w->n; i++) {
        const struct fgpu_gnode *n = &w->nodes[i];
        if (r != CUDA_SUCCESS)
            fgpu_mem_give(n->gpu, n->bytes);
        else if (n->freed) /* an executable graph belongs to its context, and ends with it */
            fgpu_mem_track(K_GEXEC, (uint64_t)(uintptr_t)*exec, n->gpu, n->bytes);
        else
            fgpu_mem_track_unbound(K_PTR, n->dptr, n->gpu, n->bytes);
    }
    walk_free(w);
}

FGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                 unsigned long long flags)
{
    PASS_IF_INACTIVE(cuGraphInstantiateWithFlags, phGraphExec, hGraph, flags);
    struct walk w;
    CUresult r = graph_reserve(hGraph, &w);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
    graph_settle(&w, r, phGraphExec);
    return r;
}

static CUresult with_params(__typeof__(&cuGraphInstantiateWithParams) real, CUgraphExec *exec,
                            CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active)
        return real(exec, graph, params);
    struct walk w;
    CUresult r = graph_reserve(graph, &w);
    if (r != CUDA_SUCCESS) {
        if (params != NULL) {
            params->hErrNode_out = NULL;
            params->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
        }
        return r;
    }
    r = real(exec, graph, params);
    graph_settle(&w, r, exec);
    return r;
}

FGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    FGPU_REAL_OR(cuGraphInstantiateWithParams, CUDA_ERROR_NOT_INITIALIZED);
    return with_params(fgpu_real.cuGraphInstantiateWithParams, phGraphExec, hGraph, params);
}

FGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    FGPU_REAL_OR(cuGraphInstantiateWithParams_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return with_params(fgpu_real.cuGraphInstantiateWithParams_ptsz, phGraphExec, hGraph,
                       params);
}

static CUresult legacy(__typeof__(&cuGraphInstantiate) real, CUgraphExec *exec, CUgraph graph,
                       CUgraphNode *err_node, char *log, size_t log_size)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active)
        return real(exec, graph, err_node, log, log_size);
    struct walk w;
    CUresult r = graph_reserve(graph, &w);
    if (r != CUDA_SUCCESS) {
        if (log != NULL && log_size > 0)
            log[0] = '\0';
        return r;
    }
    r = real(exec, graph, err_node, log, log_size);
    graph_settle(&w, r, exec);
    return r;
}

FGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                        CUgraphNode *phErrorNode, char *logBuffer,
                                        size_t bufferSize)
{
    FGPU_REAL_OR(cuGraphInstantiate, CUDA_ERROR_NOT_INITIALIZED);
    return legacy(fgpu_real.cuGraphInstantiate, phGraphExec, hGraph, phErrorNode, logBuffer,
                  bufferSize);
}

FGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUgraphNode *phErrorNode, char *logBuffer,
                                           size_t bufferSize)
{
    FGPU_REAL_OR(cuGraphInstantiate_v2, CUDA_ERROR_NOT_INITIALIZED);
    return legacy(fgpu_real.cuGraphInstantiate_v2, phGraphExec, hGraph, phErrorNode, logBuffer,
                  bufferSize);
}

FGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    PASS_IF_INACTIVE(cuGraphExecDestroy, hGraphExec);
    CUresult r = fgpu_real.cuGraphExecDestroy(hGraphExec);
    if (r == CUDA_SUCCESS) {
        while (fgpu_mem_release(K_GEXEC, (uint64_t)(uintptr_t)hGraphExec)) {
        }
    }
    return r;
}
