/* The slice of the CUDA driver API that ferry calls, declared here so that ferry builds
 * without the CUDA toolkit. Types and values are those of the driver's cuda.h (CUDA 12/13
 * ABI); the functions are never linked, only loaded at run time (driver.c). */
#ifndef FERRY_DRIVER_CUDA_API_H
#define FERRY_DRIVER_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

#define FERRY_CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle {
    char reserved[FERRY_CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* Device attributes. */
enum {
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128,
};

#define CU_GET_PROC_ADDRESS_LEGACY_STREAM   1ull
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS  0x1u
#define CU_STREAM_NON_BLOCKING              0x1u
#define CU_EVENT_DISABLE_TIMING             0x2u
#define CU_STREAM_WAIT_VALUE_GEQ            0x0u
#define CU_STREAM_WAIT_VALUE_EQ             0x1u
#define CU_STREAM_WRITE_VALUE_DEFAULT       0x0u
#define CU_MEMHOSTREGISTER_PORTABLE         0x01u
#define CU_MEMHOSTREGISTER_DEVICEMAP        0x02u
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE    2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_HOST                  0x01u
#define CU_MEMORYTYPE_DEVICE                0x02u

/* Virtual memory management (cuMemCreate and friends). */
enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
    CU_MEM_HANDLE_TYPE_FABRIC = 0x8,
};
#define CU_MEM_ALLOCATION_TYPE_PINNED      0x1
#define CU_MEM_LOCATION_TYPE_DEVICE        0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM   0x0

typedef struct CUmemLocation {
    int type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;

/* Stream-ordered memory pools (cuMemPoolCreate, cuMemAllocFromPoolAsync). */
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4

typedef struct CUmemPoolProps {
    int allocType; /* CU_MEM_ALLOCATION_TYPE_PINNED */
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize; /* 0: the driver's default */
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

#endif
