/*
 * graph_nodes.c - fake driver (a STAND-IN for tests, see fake.h): the graph entry points
 * beside graphs.c that the CUDA 12/13 runtime uses: cuGraphAddNode (the 12.2 symbol) and
 * cuGraphAddNode_v2 (12.3, with edge data) for kernel, empty, memory-allocation and
 * memory-free nodes and child graphs moved into their parent (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE:
 * the parent owns the child from then on); other node types and cloned child graphs:
 * CUDA_ERROR_NOT_SUPPORTED, which the real driver never answers for them); the instantiate variants (cuGraphInstantiate and _v2, the pre-12.0
 * symbols; cuGraphInstantiateWithParams and _ptsz, with the upload flag); cuGraphUpload and
 * _ptsz (grows the graph memory pool to what the graph's alloc nodes need, as a launch
 * would, without allocating); and the node queries (cuGraphGetNodes, cuGraphNodeGetType,
 * cuGraphMemAllocNodeGetParams, cuGraphMemFreeNodeGetParams, cuGraphChildGraphNodeGetGraph).
 */
#include <string.h>

#include "graph.h"

static CUresult add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                         const CUgraphEdgeData *edges, CUgraphNodeParams *p)
{
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (edges != NULL) { /* only plain edges are modelled (the zeroed default) */
        static const CUgraphEdgeData plain;
        for (size_t i = 0; i < ndeps; i++)
            if (memcmp(&edges[i], &plain, sizeof plain) != 0)
                return CUDA_ERROR_NOT_SUPPORTED;
    }
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return cuGraphAddKernelNode_v2(out, g, deps, ndeps, &p->kernel);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
        return cuGraphAddMemAllocNode(out, g, deps, ndeps, &p->alloc);
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
        return cuGraphAddMemFreeNode(out, g, deps, ndeps, p->free.dptr);
    case CU_GRAPH_NODE_TYPE_EMPTY: {
        CUresult rc = fk_check_init();
        if (rc != CUDA_SUCCESS)
            return rc;
        const struct fk_node proto = {.kind = FK_N_EMPTY};
        return fk_graph_add(out, g, deps, ndeps, &proto);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
        struct fk_graph *child = (struct fk_graph *)p->graph.graph;
        CUresult rc = fk_check_init();
        if (rc != CUDA_SUCCESS)
            return rc;
        if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
            return CUDA_ERROR_NOT_SUPPORTED;
        if (child == NULL || child->magic != FK_GRAPH_MAGIC || child == (struct fk_graph *)g)
            return CUDA_ERROR_INVALID_VALUE;
        const struct fk_node proto = {.kind = FK_N_CHILD, .child = child};
        return fk_graph_add(out, g, deps, ndeps, &proto);
    }
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, NULL, nodeParams);
}

CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                           const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                           size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, dependencyData,
                    nodeParams);
}

static CUresult legacy_instantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log,
                                   size_t log_size)
{
    if (err_node != NULL)
        *err_node = NULL;
    if (log != NULL && log_size > 0)
        log[0] = '\0';
    return cuGraphInstantiateWithFlags(exec, g, 0);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize)
{
    return legacy_instantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    return legacy_instantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

static CUresult upload(CUgraphExec hx, CUstream h, int ptsz)
{
    struct fk_stream *s;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_exec *x = (struct fk_exec *)hx;
    if (x == NULL || x->magic != FK_EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    return fk_graph_upload(x);
}

static CUresult with_params(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p,
                            int ptsz)
{
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const cuuint64_t known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                             CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                             CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                             CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    p->hErrNode_out = NULL;
    p->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
    if ((p->flags & ~known) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc =
        cuGraphInstantiateWithFlags(exec, g, p->flags & ~CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    if (rc == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {
        rc = upload(*exec, p->hUploadStream, ptsz);
        if (rc != CUDA_SUCCESS) {
            cuGraphExecDestroy(*exec);
            *exec = NULL;
        }
    }
    if (rc == CUDA_SUCCESS)
        p->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return rc;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return with_params(phGraphExec, hGraph, instantiateParams, 0);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return with_params(phGraphExec, hGraph, instantiateParams, 1);
}

CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    return upload(hGraphExec, hStream, 0);
}

CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return upload(hGraphExec, hStream, 1);
}

/* ------------------------------------------------------------------ node queries */

static const struct fk_node *node_of(CUgraphNode h)
{
    const struct fk_node *n = (const struct fk_node *)h;
    return n != NULL && n->magic == FK_NODE_MAGIC ? n : NULL;
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    struct fk_graph *g = (struct fk_graph *)hGraph;
    if (numNodes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (g == NULL || g->magic != FK_GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    if (nodes != NULL) { /* as the driver: up to *numNodes, the rest of the array NULL */
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < g->n ? (CUgraphNode)g->nodes[i] : NULL;
    }
    if (nodes == NULL || *numNodes > g->n)
        *numNodes = g->n;
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    const struct fk_node *n = node_of(hNode);
    if (n == NULL || type == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    switch (n->kind) {
    case FK_N_KERNEL: *type = CU_GRAPH_NODE_TYPE_KERNEL; break;
    case FK_N_ALLOC: *type = CU_GRAPH_NODE_TYPE_MEM_ALLOC; break;
    case FK_N_FREE: *type = CU_GRAPH_NODE_TYPE_MEM_FREE; break;
    case FK_N_CHILD: *type = CU_GRAPH_NODE_TYPE_GRAPH; break;
    default: *type = CU_GRAPH_NODE_TYPE_EMPTY; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    const struct fk_node *n = node_of(hNode);
    if (n == NULL || n->kind != FK_N_ALLOC || params_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(params_out, 0, sizeof *params_out);
    params_out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params_out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params_out->poolProps.location.id = n->dev;
    params_out->bytesize = n->bytes;
    params_out->dptr = n->dptr;
    return CUDA_SUCCESS;
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)
{
    const struct fk_node *n = node_of(hNode);
    if (n == NULL || n->kind != FK_N_FREE || dptr_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr_out = n->dptr;
    return CUDA_SUCCESS;
}

CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    const struct fk_node *n = node_of(hNode);
    if (n == NULL || n->kind != FK_N_CHILD || phGraph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = (CUgraph)n->child;
    return CUDA_SUCCESS;
}
