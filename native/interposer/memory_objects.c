/*
 * memory_objects.c - memory hooks for objects that are not plain pointers: CUDA arrays,
 * mipmapped arrays, graph memory nodes and context destruction (rules in memory.c).
 *
 * Arrays: width x height x depth x channels x bytes per channel (a 0 dimension counts as 1),
 * summed over mip levels (each level halves width, height and, unless layered, depth). The
 * driver's padding is not seen; the NVML guard is the backstop.
 * Graph memory nodes (the driver's rule: an alloc node's memory is taken at launch and lives
 * until a free node of the graph, or cuMemFree / cuMemFreeAsync of its address): the graph's
 * alloc nodes are remembered (nothing reserved yet); cuGraphInstantiateWithFlags reserves all
 * of them (over the cap: CUDA_ERROR_OUT_OF_MEMORY, nothing instantiated). Nodes the graph also
 * frees are held for the exec and given back at cuGraphExecDestroy; nodes it does not free
 * are held for their address and given back at cuMemFree / cuMemFreeAsync of it (an exec
 * destroyed without ever being launched keeps those counted: stricter, never looser).
 * An upper bound: the driver may reuse freed graph memory inside one launch.
 */
#include "fgpu.h"

#define FGPU_ARRAY3D_LAYERED 0x01u /* cuda.h CUDA_ARRAY3D_LAYERED: Depth is a layer count */
#define MAX_GRAPH_NODES 256

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    unsigned per = fgpu_cu_array_format_bytes(f);
    if (per == 0)
        per = 4; /* a format the header does not list: counted as 4 bytes per channel */
    uint64_t e = (uint64_t)per * (ch == 0 ? 1 : ch);
    uint64_t wh = fgpu_mul_sat(w == 0 ? 1 : w, h == 0 ? 1 : h);
    return fgpu_mul_sat(fgpu_mul_sat(wh, d == 0 ? 1 : d), e);
}


FGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    PASS_IF_INACTIVE(cuArrayCreate_v2, pHandle, desc);
    if (desc == NULL)
        return fgpu_real.cuArrayCreate_v2(pHandle, desc);
    uint64_t n = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuArrayCreate_v2(pHandle, desc);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_ARRAY, (uint64_t)(uintptr_t)*pHandle, g, n);
    return r;
}

FGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    PASS_IF_INACTIVE(cuArray3DCreate_v2, pHandle, desc);
    if (desc == NULL)
        return fgpu_real.cuArray3DCreate_v2(pHandle, desc);
    uint64_t n =
        array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuArray3DCreate_v2(pHandle, desc);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_ARRAY, (uint64_t)(uintptr_t)*pHandle, g, n);
    return r;
}

FGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    PASS_IF_INACTIVE(cuArrayDestroy, hArray);
    CUresult r = fgpu_real.cuArrayDestroy(hArray);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_ARRAY, (uint64_t)(uintptr_t)hArray);
    return r;
}

FGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int numMipmapLevels)
{
    PASS_IF_INACTIVE(cuMipmappedArrayCreate, pHandle, desc, numMipmapLevels);
    if (desc == NULL)
        return fgpu_real.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    uint64_t n = 0;
    size_t w = desc->Width, h = desc->Height, d = desc->Depth;
    int layered = (desc->Flags & FGPU_ARRAY3D_LAYERED) != 0;
    for (unsigned l = 0; l < numMipmapLevels && l < 64; l++) {
        n = fgpu_add_sat(n, array_bytes(w, h, d, desc->Format, desc->NumChannels));
        w = w > 1 ? w / 2 : w;
        h = h > 1 ? h / 2 : h;
        if (!layered)
            d = d > 1 ? d / 2 : d;
    }
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_MIPMAP, (uint64_t)(uintptr_t)*pHandle, g, n);
    return r;
}

FGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    PASS_IF_INACTIVE(cuMipmappedArrayDestroy, hMipmappedArray);
    CUresult r = fgpu_real.cuMipmappedArrayDestroy(hMipmappedArray);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_MIPMAP, (uint64_t)(uintptr_t)hMipmappedArray);
    return r;
}

FGPU_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                            const CUgraphNode *dependencies,
                                            size_t numDependencies,
                                            CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    PASS_IF_INACTIVE(cuGraphAddMemAllocNode, phGraphNode, hGraph, dependencies, numDependencies,
                     nodeParams);
    CUresult r = fgpu_real.cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies,
                                                  numDependencies, nodeParams);
    if (r == CUDA_SUCCESS && nodeParams != NULL) {
        int g = fgpu_gpu_of_device(nodeParams->poolProps.location.id);
        fgpu_mem_graph_alloc_node((uint64_t)(uintptr_t)hGraph, nodeParams->dptr, g,
                                  nodeParams->bytesize);
    }
    return r;
}

FGPU_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                           const CUgraphNode *dependencies,
                                           size_t numDependencies, CUdeviceptr dptr)
{
    PASS_IF_INACTIVE(cuGraphAddMemFreeNode, phGraphNode, hGraph, dependencies, numDependencies,
                     dptr);
    CUresult r = fgpu_real.cuGraphAddMemFreeNode(phGraphNode, hGraph, dependencies,
                                                 numDependencies, dptr);
    if (r == CUDA_SUCCESS)
        fgpu_mem_graph_free_node((uint64_t)(uintptr_t)hGraph, dptr);
    return r;
}

FGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                 unsigned long long flags)
{
    PASS_IF_INACTIVE(cuGraphInstantiateWithFlags, phGraphExec, hGraph, flags);
    static _Thread_local struct fgpu_gnode nodes[MAX_GRAPH_NODES];
    int n = fgpu_mem_graph_nodes((uint64_t)(uintptr_t)hGraph, nodes, MAX_GRAPH_NODES);
    for (int i = 0; i < n; i++) {
        if (fgpu_mem_take(&nodes[i].gpu, nodes[i].bytes) != CUDA_SUCCESS) {
            for (int j = 0; j < i; j++)
                fgpu_mem_give(nodes[j].gpu, nodes[j].bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    CUresult r = fgpu_real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
    for (int i = 0; i < n; i++) {
        if (r != CUDA_SUCCESS)
            fgpu_mem_give(nodes[i].gpu, nodes[i].bytes);
        else if (nodes[i].freed)
            fgpu_mem_track(K_GEXEC, (uint64_t)(uintptr_t)*phGraphExec, nodes[i].gpu,
                           nodes[i].bytes);
        else
            fgpu_mem_track(K_PTR, nodes[i].dptr, nodes[i].gpu, nodes[i].bytes);
    }
    return r;
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

FGPU_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    PASS_IF_INACTIVE(cuGraphDestroy, hGraph);
    CUresult r = fgpu_real.cuGraphDestroy(hGraph);
    if (r == CUDA_SUCCESS)
        fgpu_mem_drop(K_GNODE, (uint64_t)(uintptr_t)hGraph);
    return r;
}

FGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    PASS_IF_INACTIVE(cuCtxDestroy_v2, ctx);
    fgpu_launch_forget_context(ctx); /* its events die with it */
    CUresult r = fgpu_real.cuCtxDestroy_v2(ctx);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release_ctx(ctx);
    return r;
}
