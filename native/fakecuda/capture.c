/*
 * capture.c - fake driver (a STAND-IN for tests, see fake.h): stream capture. Between
 * cuStreamBeginCapture and cuStreamEndCapture a stream's work is not run: kernels and copies
 * become kernel nodes of a new graph (streams.c), cuMemAllocAsync / cuMemAllocFromPoolAsync
 * become memory-allocation nodes (an address, no memory) and cuMemFreeAsync a free node
 * (memory.c), in the order issued. Only the captured stream itself is modelled (no capture
 * across streams through events); the legacy NULL stream cannot be captured
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), a stream already capturing neither
 * (CUDA_ERROR_ILLEGAL_STATE). Modes are accepted and not modelled.
 */
#include "graph.h"

static CUresult begin(CUstream h, int ptsz, CUstreamCaptureMode mode)
{
    struct fk_stream *s;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (h == CU_STREAM_LEGACY || (h == NULL && !ptsz))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (fk_stream_capture(s) != NULL)
        return CUDA_ERROR_ILLEGAL_STATE;
    CUgraph g;
    if ((rc = cuGraphCreate(&g, 0)) != CUDA_SUCCESS)
        return rc;
    fk_stream_set_capture(s, (struct fk_graph *)g);
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    return begin(hStream, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    return begin(hStream, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin(hStream, 0, mode);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin(hStream, 1, mode);
}

static CUresult end(CUstream h, int ptsz, CUgraph *out)
{
    struct fk_stream *s;
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_graph *g = fk_stream_capture(s);
    if (g == NULL)
        return CUDA_ERROR_ILLEGAL_STATE;
    fk_stream_set_capture(s, NULL);
    *out = (CUgraph)g;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return end(hStream, 0, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return end(hStream, 1, phGraph);
}

static CUresult is_capturing(CUstream h, int ptsz, CUstreamCaptureStatus *status)
{
    struct fk_stream *s;
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    *status = fk_stream_capture(s) != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                           : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return is_capturing(hStream, 0, captureStatus);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return is_capturing(hStream, 1, captureStatus);
}
