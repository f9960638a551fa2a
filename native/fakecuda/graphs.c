/*
 * graphs.c - fake driver (a STAND-IN for tests, see fake.h): CUDA graphs with kernel nodes
 * and memory nodes. A launch runs the nodes in the order they were added (always a valid
 * order: a node's dependencies exist before it) on the launch stream. Graph memory follows
 * the real driver: an alloc node's address is fixed when the node is added; the memory is
 * taken at cuGraphLaunch from the device's graph pool (which grows from device memory in
 * 2 MiB chunks: a launch returns CUDA_ERROR_OUT_OF_MEMORY when it cannot); a free node (or
 * cuMemFree / cuMemFreeAsync of the address) returns it to the graph pool, and
 * cuDeviceGraphMemTrim gives the unused part of the pool back to the device. A child graph
 * moved into its parent (graph_nodes.c) runs in place of its node and dies with the parent.
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    if (phGraph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_graph *g = calloc(1, sizeof *g);
    if (g == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = FK_GRAPH_MAGIC;
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

CUresult fk_graph_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                      const struct fk_node *proto)
{
    struct fk_graph *g = (struct fk_graph *)hg;
    if (out == NULL || (ndeps > 0 && deps == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (g == NULL || g->magic != FK_GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++) {
        const struct fk_node *d = (const struct fk_node *)deps[i];
        if (d == NULL || d->magic != FK_NODE_MAGIC)
            return CUDA_ERROR_INVALID_VALUE;
    }
    struct fk_node *node = malloc(sizeof *node);
    if (node == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *node = *proto;
    node->magic = FK_NODE_MAGIC;
    pthread_mutex_lock(&fk_g.lock);
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 8;
        struct fk_node **grown = realloc(g->nodes, cap * sizeof *grown);
        if (grown == NULL) {
            pthread_mutex_unlock(&fk_g.lock);
            free(node);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g->nodes = grown;
        g->cap = cap;
    }
    g->nodes[g->n++] = node;
    pthread_mutex_unlock(&fk_g.lock);
    *out = (CUgraphNode)node;
    return CUDA_SUCCESS;
}

static CUresult kernel_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                            CUfunction func, const unsigned dims[6], void **params)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    for (int i = 0; i < 6; i++)
        if (dims[i] == 0)
            return CUDA_ERROR_INVALID_VALUE;
    struct fk_node proto = {.kind = FK_N_KERNEL};
    proto.ns = fk_kernel_ns((struct fk_func *)func, params, &rc);
    if (rc == CUDA_ERROR_INVALID_HANDLE)
        rc = CUDA_ERROR_INVALID_VALUE;
    return rc != CUDA_SUCCESS ? rc : fk_graph_add(out, g, deps, ndeps, &proto);
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                              const CUgraphNode *dependencies, size_t numDependencies,
                              const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned dims[6] = {p->gridDimX,  p->gridDimY,  p->gridDimZ,
                              p->blockDimX, p->blockDimY, p->blockDimZ};
    return kernel_node(phGraphNode, hGraph, dependencies, numDependencies, p->func, dims,
                       p->kernelParams);
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                 const CUgraphNode *dependencies, size_t numDependencies,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (p == NULL || p->func == NULL) /* CUkernel handles (p->kern) are not modelled */
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned dims[6] = {p->gridDimX,  p->gridDimY,  p->gridDimZ,
                              p->blockDimX, p->blockDimY, p->blockDimZ};
    return kernel_node(phGraphNode, hGraph, dependencies, numDependencies, p->func, dims,
                       p->kernelParams);
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    int gpu;
    if (p == NULL || p->bytesize == 0 || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(p->poolProps.location.id, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
    struct fk_node proto = {.kind = FK_N_ALLOC, .gpu = gpu, .dev = p->poolProps.location.id,
                            .bytes = p->bytesize};
    proto.dptr = fk_new_va(p->bytesize);
    rc = fk_graph_add(phGraphNode, hGraph, dependencies, numDependencies, &proto);
    if (rc == CUDA_SUCCESS)
        p->dptr = proto.dptr;
    return rc;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr)
{
    if (dptr == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_node proto = {.kind = FK_N_FREE, .dptr = dptr};
    return fk_graph_add(phGraphNode, hGraph, dependencies, numDependencies, &proto);
}

/* The nodes an executable graph runs: a child graph's nodes in place of its node
 * (caller: fk_g.lock). */
static size_t flat_count(const struct fk_graph *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n; i++)
        n += g->nodes[i]->kind == FK_N_CHILD ? flat_count(g->nodes[i]->child) : 1;
    return n;
}

static void flat_copy(const struct fk_graph *g, struct fk_exec *x)
{
    for (size_t i = 0; i < g->n; i++) {
        if (g->nodes[i]->kind == FK_N_CHILD)
            flat_copy(g->nodes[i]->child, x);
        else
            x->nodes[x->n++] = *g->nodes[i];
    }
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    struct fk_graph *g = (struct fk_graph *)hGraph;
    (void)flags;
    if (phGraphExec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (g == NULL || g->magic != FK_GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_exec *x = calloc(1, sizeof *x);
    if (x == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk_g.lock);
    size_t n = flat_count(g);
    x->nodes = calloc(n ? n : 1, sizeof *x->nodes);
    if (x->nodes != NULL)
        flat_copy(g, x);
    pthread_mutex_unlock(&fk_g.lock);
    if (x->nodes == NULL) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    x->magic = FK_EXEC_MAGIC;
    *phGraphExec = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

static int allocated_here(const struct fk_exec *x, size_t before, uint64_t dptr)
{
    for (size_t i = 0; i < before; i++)
        if (x->nodes[i].kind == FK_N_ALLOC && x->nodes[i].dptr == dptr)
            return 1;
    return 0;
}

/* caller: fk_g.lock. Grows the graph pool of each GPU to hold need[g] more bytes. */
static CUresult grow_pool(const uint64_t need[FK_MAX_GPUS])
{
    uint64_t grown[FK_MAX_GPUS] = {0};
    for (int g = 0; g < FK_MAX_GPUS; g++) {
        uint64_t want = fk_g.graph_used[g] + need[g];
        if (need[g] == 0 || want <= fk_g.graph_reserved[g])
            continue;
        uint64_t grow = (want - fk_g.graph_reserved[g] + FK_CHUNK - 1) / FK_CHUNK * FK_CHUNK;
        if (fk_reserve(g, grow) != CUDA_SUCCESS) {
            for (int k = 0; k < g; k++) {
                fk_release(k, grown[k]);
                fk_g.graph_reserved[k] -= grown[k];
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        grown[g] = grow;
        fk_g.graph_reserved[g] += grow;
    }
    return CUDA_SUCCESS;
}

/* caller: fk_g.lock. What the exec's alloc nodes need, per GPU; an error when a node's
 * address is still allocated from an earlier launch or a free node frees nothing it may. */
static CUresult graph_need(const struct fk_exec *x, uint64_t need[FK_MAX_GPUS])
{
    for (size_t i = 0; i < x->n; i++) {
        const struct fk_node *n = &x->nodes[i];
        if (n->kind == FK_N_ALLOC) {
            if (fk_alloc_find(n->dptr) != NULL)
                return CUDA_ERROR_INVALID_VALUE; /* still allocated from an earlier launch */
            need[n->gpu] += n->bytes;
        } else if (n->kind == FK_N_FREE && !allocated_here(x, i, n->dptr)) {
            const struct fk_alloc *a = fk_alloc_find(n->dptr);
            if (a == NULL || (a->kind != FK_A_GRAPH && a->kind != FK_A_ASYNC &&
                              a->kind != FK_A_POOL))
                return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

CUresult fk_graph_upload(struct fk_exec *x)
{
    uint64_t need[FK_MAX_GPUS] = {0};
    pthread_mutex_lock(&fk_g.lock);
    CUresult rc = graph_need(x, need);
    if (rc == CUDA_SUCCESS)
        rc = grow_pool(need);
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

/* caller: fk_g.lock. Takes graph memory for every alloc node, all or nothing. */
static CUresult take_graph_memory(const struct fk_exec *x)
{
    uint64_t need[FK_MAX_GPUS] = {0};
    CUresult rc = graph_need(x, need);
    if (rc == CUDA_SUCCESS)
        rc = grow_pool(need);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0; i < x->n; i++) {
        const struct fk_node *n = &x->nodes[i];
        if (n->kind != FK_N_ALLOC)
            continue;
        struct fk_alloc *a = fk_alloc_new(n->dptr, n->bytes, n->gpu, FK_A_GRAPH);
        if (a == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        fk_alloc_put(a);
        fk_g.graph_used[n->gpu] += n->bytes;
    }
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec hx, CUstream h, int ptsz)
{
    struct fk_exec *x = (struct fk_exec *)hx;
    struct fk_stream *s;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (x == NULL || x->magic != FK_EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_op **ops = calloc(x->n ? x->n : 1, sizeof *ops);
    if (ops == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < x->n; i++) {
        if (x->nodes[i].kind != FK_N_ALLOC && x->nodes[i].kind != FK_N_EMPTY &&
            (ops[i] = calloc(1, sizeof *ops[i])) == NULL)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fk_g.lock);
    if (rc == CUDA_SUCCESS)
        rc = take_graph_memory(x);
    for (size_t i = 0; i < x->n && rc == CUDA_SUCCESS; i++) {
        const struct fk_node *n = &x->nodes[i];
        if (n->kind == FK_N_KERNEL) {
            ops[i]->kind = FK_OP_KERNEL;
            ops[i]->ns = n->ns;
        } else if (n->kind == FK_N_FREE) {
            ops[i]->kind = FK_OP_FREE;
            ops[i]->free_alloc = fk_alloc_take(n->dptr);
        }
    }
    pthread_mutex_unlock(&fk_g.lock);
    for (size_t i = 0; i < x->n; i++) {
        if (ops[i] == NULL)
            continue;
        if (rc == CUDA_SUCCESS)
            fk_enqueue(s, ops[i]);
        else
            free(ops[i]);
    }
    free(ops);
    return rc;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, 0);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, 1);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    struct fk_exec *x = (struct fk_exec *)hGraphExec;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (x == NULL || x->magic != FK_EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    x->magic = 0;
    free(x->nodes);
    free(x);
    return CUDA_SUCCESS;
}

static void graph_free(struct fk_graph *g) /* with the child graphs its nodes own */
{
    g->magic = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (g->nodes[i]->kind == FK_N_CHILD)
            graph_free(g->nodes[i]->child);
        g->nodes[i]->magic = 0;
        free(g->nodes[i]);
    }
    free(g->nodes);
    free(g);
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    struct fk_graph *g = (struct fk_graph *)hGraph;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (g == NULL || g->magic != FK_GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    graph_free(g);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    int gpu;
    CUresult rc = fk_dev_gpu(device, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    uint64_t keep = (fk_g.graph_used[gpu] + FK_CHUNK - 1) / FK_CHUNK * FK_CHUNK;
    if (fk_g.graph_reserved[gpu] > keep) {
        fk_release(gpu, fk_g.graph_reserved[gpu] - keep);
        fk_g.graph_reserved[gpu] = keep;
    }
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}
