/*
 * cuda_api.h - the part of the CUDA driver API that fgpu uses, declared from NVIDIA's
 * documentation ("CUDA Driver API", docs.nvidia.com/cuda/cuda-driver-api), because no CUDA
 * toolkit is present at build time.
 *
 * Users: the interposer (native/interposer, libfgpu), the fake driver written for the tests
 * (native/fakecuda, a stand-in for libcuda.so.1) and the test program (native/tests/cudemo.c).
 *
 * Rules: types, values and struct layouts are the driver's ABI on 64-bit Linux (LP64); a
 * layout the interposer reads on a real GPU (CUDA_MEM_ALLOC_NODE_PARAMS.bytesize,
 * CUlaunchConfig.hStream, the array descriptors) is checked with static assertions below.
 * Only symbols the real libcuda.so.1 exports are declared as functions; prototypes carry the
 * versioned names (cuMemAlloc_v2, ...) that the driver exports, not the macros of cuda.h.
 */
#ifndef FGPU_CUDA_API_H
#define FGPU_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FGPU_CUDA_API_VERSION 13000 /* the cuda.h version these declarations follow */

/* ---------------------------------------------------------------- result codes */
typedef int CUresult;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_STUB_LIBRARY 34
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_CONTEXT_ALREADY_CURRENT 202
#define CUDA_ERROR_MAP_FAILED 205
#define CUDA_ERROR_UNMAP_FAILED 206
#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_NOT_MAPPED 211
#define CUDA_ERROR_UNSUPPORTED_LIMIT 215
#define CUDA_ERROR_INVALID_SOURCE 300
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701
#define CUDA_ERROR_LAUNCH_TIMEOUT 702
#define CUDA_ERROR_CONTEXT_IS_DESTROYED 709
#define CUDA_ERROR_LAUNCH_FAILED 719
#define CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE 720
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_UNKNOWN 999

/* ---------------------------------------------------------------- scalar and handle types */
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle; /* an integer in the driver ABI */

typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

/* Special stream handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle; /* passed by value to cuIpcOpenMemHandle_v2 */

/* ---------------------------------------------------------------- flags */
#define CU_CTX_SCHED_AUTO 0x0u
#define CU_STREAM_DEFAULT 0x0u
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_DEFAULT 0x0u
#define CU_EVENT_BLOCKING_SYNC 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_EVENT_INTERPROCESS 0x4u
#define CU_MEM_ATTACH_GLOBAL 0x1u
#define CU_MEM_ATTACH_HOST 0x2u
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u

/* cuGetProcAddress flags (CUdriverProcAddress_flags) */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* ---------------------------------------------------------------- device attributes (subset) */
typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
} CUdevice_attribute;

/* ---------------------------------------------------------------- arrays */
typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,  /* 1 byte per channel */
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02, /* 2 */
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03, /* 4 */
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,    /* 1 */
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,   /* 2 */
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,   /* 4 */
    CU_AD_FORMAT_HALF = 0x10,           /* 2 */
    CU_AD_FORMAT_FLOAT = 0x20           /* 4 */
} CUarray_format;

/* Bytes per channel of an array element; 0 for a format not listed above. */
static inline unsigned int fgpu_cu_array_format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0;
}

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;  /* elements */
    size_t Height; /* rows; 0 means a 1D array */
    CUarray_format Format;
    unsigned int NumChannels; /* 1, 2 or 4 */
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height; /* 0 for 1D */
    size_t Depth;  /* 0 for 1D and 2D */
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* ---------------------------------------------------------------- virtual memory and pools */
typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1
} CUmemAllocationType;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
} CUmemAllocationHandleType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1
} CUmemLocationType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} CUmemAccess_flags;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id; /* the device ordinal when type is DEVICE */
} CUmemLocation;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize; /* 0 = no limit (CUDA 12.2+) */
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* ---------------------------------------------------------------- graphs */
/* cuGraphAddKernelNode (v1 symbol) */
typedef struct CUDA_KERNEL_NODE_PARAMS_v1_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

/* cuGraphAddKernelNode_v2 (what cuda.h 12 calls CUDA_KERNEL_NODE_PARAMS) */
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern; /* used when func is NULL */
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef CUDA_KERNEL_NODE_PARAMS_v2 CUDA_KERNEL_NODE_PARAMS;

typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps; /* in: location.id is the device */
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;  /* in: bytes */
    CUdeviceptr dptr; /* out: the address the graph will allocate at */
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* ---------------------------------------------------------------- graph nodes, capture, limits
 * (what the interposer needs to see every path to device memory: cuda.h 13.0 layouts) */
typedef enum CUlimit_enum {
    CU_LIMIT_STACK_SIZE = 0x00,
    CU_LIMIT_PRINTF_FIFO_SIZE = 0x01,
    CU_LIMIT_MALLOC_HEAP_SIZE = 0x02 /* device memory for in-kernel malloc, per context */
} CUlimit;

typedef enum CUgraphNodeType_enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_MEMCPY = 1,
    CU_GRAPH_NODE_TYPE_MEMSET = 2,
    CU_GRAPH_NODE_TYPE_HOST = 3,
    CU_GRAPH_NODE_TYPE_GRAPH = 4, /* a child graph */
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_WAIT_EVENT = 6,
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7,
    CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL = 8,
    CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT = 9,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
    CU_GRAPH_NODE_TYPE_BATCH_MEM_OP = 12,
    CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
} CUgraphNodeType;

typedef struct CUgraphEdgeData_st {
    unsigned char from_port;
    unsigned char to_port;
    unsigned char type;
    unsigned char reserved[5];
} CUgraphEdgeData;

typedef enum CUgraphInstantiateResult_enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
    CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2,
    CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3,
    CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED = 4,
    CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED = 5
} CUgraphInstantiateResult;

#define CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH 1ull
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2ull
#define CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH 4ull
#define CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY 8ull

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;               /* with FLAG_UPLOAD */
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUDA_MEM_FREE_NODE_PARAMS_st {
    CUdeviceptr dptr;
} CUDA_MEM_FREE_NODE_PARAMS;

typedef enum CUgraphChildGraphNodeOwnership_enum {
    CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE = 0,
    CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE = 1 /* the only way a child may hold memory nodes */
} CUgraphChildGraphNodeOwnership;

typedef struct CUDA_CHILD_GRAPH_NODE_PARAMS_st {
    CUgraph graph;
    CUgraphChildGraphNodeOwnership ownership;
} CUDA_CHILD_GRAPH_NODE_PARAMS;

/* cuGraphAddNode / _v2: a tagged union (the members fgpu reads; the rest is padding) */
typedef struct CUgraphNodeParams_st {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel; /* cuda.h: CUDA_KERNEL_NODE_PARAMS_v3, same layout */
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;  /* cuda.h: CUDA_MEM_ALLOC_NODE_PARAMS_v2, same layout */
        CUDA_MEM_FREE_NODE_PARAMS free;
        CUDA_CHILD_GRAPH_NODE_PARAMS graph;
    };
    long long reserved2;
} CUgraphNodeParams;

typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

/* ---------------------------------------------------------------- cuLaunchKernelEx */
typedef enum CUlaunchAttributeID_enum {
    CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
    CU_LAUNCH_ATTRIBUTE_PRIORITY = 8
} CUlaunchAttributeID;

typedef union CUlaunchAttributeValue_union {
    _Alignas(8) char pad[64]; /* the driver's union holds pointers and 64-bit members */
    int cooperative;
    int priority;
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* Checkpointing (cuda.h since CUDA 12.8: CUprocessState, CUcheckpoint*Args). */
typedef enum CUprocessState_enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED,
    CU_PROCESS_STATE_CHECKPOINTED,
    CU_PROCESS_STATE_FAILED,
} CUprocessState;

typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs; /* 0 = no timeout */
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;

typedef struct CUcheckpointCheckpointArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;

typedef struct CUcheckpointGpuPair_st {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;

typedef struct CUcheckpointRestoreArgs_st {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    cuuint64_t reserved1;
} CUcheckpointRestoreArgs;

typedef struct CUcheckpointUnlockArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;

/* ---------------------------------------------------------------- layout checks (LP64) */
#if defined(__LP64__)
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle is 64 bytes");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps layout");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104,
               "CUDA_MEM_ALLOC_NODE_PARAMS.bytesize offset");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112,
               "CUDA_MEM_ALLOC_NODE_PARAMS.dptr offset");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v1) == 56, "CUDA_KERNEL_NODE_PARAMS_v1 layout");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 layout");
_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute layout");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream offset");
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24, "CUDA_ARRAY_DESCRIPTOR layout");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR layout");
_Static_assert(sizeof(CUgraphEdgeData) == 8, "CUgraphEdgeData layout");
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "CUDA_GRAPH_INSTANTIATE_PARAMS layout");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams layout");
_Static_assert(offsetof(CUgraphNodeParams, alloc) == 16, "CUgraphNodeParams.alloc offset");
_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs layout");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs layout");
#endif

/* ---------------------------------------------------------------- functions */
/* initialisation, version, errors */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

/* devices */
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);

/* contexts */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);

/* modules */
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuModuleUnload(CUmodule hmod);

/* streams and events */
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);

/* memory */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t widthInBytes, size_t height,
                            unsigned int elementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);

/* virtual memory management */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);

/* arrays */
CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);

/* graphs */
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                              const CUgraphNode *dependencies, size_t numDependencies,
                              const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                 const CUgraphNode *dependencies, size_t numDependencies,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams);
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuDeviceGraphMemTrim(CUdevice device);

/* memory paths beside the allocation calls: limits, primary contexts, graphs, capture */
CUresult cuCtxSetLimit(CUlimit limit, size_t value);
CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev); /* the v7000 symbol; same as _v2 */
CUresult cuDevicePrimaryCtxReset(CUdevice dev);   /* the v7000 symbol; same as _v2 */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams);
CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                           const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                           size_t numDependencies, CUgraphNodeParams *nodeParams);
/* the pre-12.0 instantiate symbols (cuda.h 12+ maps the name cuGraphInstantiate to
 * cuGraphInstantiateWithFlags; the driver still exports these for older programs) */
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize);
CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes);
CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type);
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out);
CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out);
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph);
CUresult cuStreamBeginCapture(CUstream hStream); /* v10000: global mode */
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus);

/* inter-process memory */
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);

/* launches */
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);

/* copies and memsets */
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t byteCount);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t byteCount);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t byteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t byteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t byteCount,
                              CUstream hStream);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t n);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t n, CUstream hStream);
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t n, CUstream hStream);

/* per-thread-default-stream variants: same arguments; a NULL stream means the calling
 * thread's per-thread stream (what nvcc --default-stream per-thread compiles to). */
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX,
                             unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                             void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void **kernelParams);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t byteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t byteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t byteCount,
                                   CUstream hStream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t n,
                              CUstream hStream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t n,
                               CUstream hStream);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuStreamQuery_ptsz(CUstream hStream);

/* ---------------------------------------------------------------- CUDA 12.5 / 13.0 forms
 * (cudaTypedefs.h: PFN_cuCtxCreate_v11040/_v12050, PFN_cuCtxSynchronize_v13000, ...): what
 * cuGetProcAddress answers at those versions. */
typedef enum CUexecAffinityType_enum {
    CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0,
    CU_EXEC_AFFINITY_TYPE_MAX
} CUexecAffinityType;
typedef struct CUexecAffinitySmCount_st {
    unsigned int val;
} CUexecAffinitySmCount;
typedef struct CUexecAffinityParam_st {
    CUexecAffinityType type;
    union {
        CUexecAffinitySmCount smCount;
    } param;
} CUexecAffinityParam;
typedef enum CUcigDataType_enum {
    CIG_DATA_TYPE_D3D12_COMMAND_QUEUE = 0x1,
    CIG_DATA_TYPE_NV_BLOB = 0x2
} CUcigDataType;
typedef struct CUctxCigParam_st {
    CUcigDataType sharedDataType;
    void *sharedData;
} CUctxCigParam;
typedef struct CUctxCreateParams_st {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    CUctxCigParam *cigParams;
} CUctxCreateParams;
#if defined(__LP64__)
_Static_assert(sizeof(CUexecAffinityParam) == 8, "CUexecAffinityParam layout");
_Static_assert(sizeof(CUctxCreateParams) == 24, "CUctxCreateParams layout");
#endif

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev);
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
CUresult cuCtxSynchronize_v2(CUcontext ctx);
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId);
/* synchronous copies and memsets on the per-thread default stream (_ptds) */
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t byteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t byteCount);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t n);
/* checkpointing (by pid, from another process) */
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);
CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state);
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args);

#ifdef __cplusplus
}
#endif

#endif /* FGPU_CUDA_API_H */
