/* The CUDA driver, loaded at run time.
 *
 * ferry never links libcuda: ferry__cuda_get() dlopens "libcuda.so.1" (or the library named
 * by FERRY_CUDA_DRIVER, e.g. the test suite's fake driver) once per process and resolves
 * every entry point through cuGetProcAddress at an explicit CUDA version. Mandatory entry
 * points missing make loading fail; optional ones (virtual memory management) are left
 * NULL and the features that need them answer NOT_SUPPORTED. Without a driver, GPU
 * backends fail with a clear message and the host backend works as ever. */
#ifndef FERRY_DRIVER_DRIVER_H
#define FERRY_DRIVER_DRIVER_H

#include "driver/cuda_api.h"
#include "ferry.h"

/* Device ordinals ferry serves: 0 .. FERRY_MAX_DEVICES - 1 (one table of each kind per
 * device: primary contexts, VMM probes, a consumer's mappings). */
#define FERRY_MAX_DEVICES 64

/* X(name, cuda_version, mandatory, return-and-params). The version is the CUDA release
 * whose ABI of the symbol ferry was written against. */
#define FERRY_CUDA_FUNCTIONS(X)                                                                    \
    X(cuGetErrorName, 6000, 1, (CUresult, const char **))                                          \
    X(cuGetErrorString, 6000, 1, (CUresult, const char **))                                        \
    X(cuInit, 2000, 1, (unsigned int))                                                             \
    X(cuDriverGetVersion, 2020, 1, (int *))                                                        \
    X(cuDeviceGet, 2000, 1, (CUdevice *, int))                                                     \
    X(cuDeviceGetCount, 2000, 1, (int *))                                                          \
    X(cuDeviceGetName, 2000, 1, (char *, int, CUdevice))                                           \
    X(cuDeviceGetAttribute, 2000, 1, (int *, int, CUdevice))                                       \
    X(cuDeviceCanAccessPeer, 4000, 1, (int *, CUdevice, CUdevice))                                 \
    X(cuDevicePrimaryCtxRetain, 7000, 1, (CUcontext *, CUdevice))                                  \
    X(cuDevicePrimaryCtxRelease, 11000, 1, (CUdevice))                                             \
    X(cuCtxSetCurrent, 4000, 1, (CUcontext))                                                       \
    X(cuCtxGetCurrent, 4000, 1, (CUcontext *))                                                     \
    X(cuMemAlloc, 3020, 1, (CUdeviceptr *, size_t))                                                \
    X(cuMemFree, 3020, 1, (CUdeviceptr))                                                           \
    X(cuMemcpy, 4000, 1, (CUdeviceptr, CUdeviceptr, size_t))                                       \
    X(cuMemcpyAsync, 4000, 1, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                        \
    X(cuMemsetD32, 3020, 1, (CUdeviceptr, unsigned int, size_t))                                   \
    X(cuMemHostRegister, 6050, 1, (void *, size_t, unsigned int))                                  \
    X(cuMemHostUnregister, 4000, 1, (void *))                                                      \
    X(cuMemHostGetDevicePointer, 3020, 1, (CUdeviceptr *, void *, unsigned int))                   \
    X(cuPointerGetAttribute, 4000, 1, (void *, int, CUdeviceptr))                                  \
    X(cuIpcGetMemHandle, 4010, 1, (CUipcMemHandle *, CUdeviceptr))                                 \
    X(cuIpcOpenMemHandle, 11000, 1, (CUdeviceptr *, CUipcMemHandle, unsigned int))                 \
    X(cuIpcCloseMemHandle, 4010, 1, (CUdeviceptr))                                                 \
    X(cuStreamCreate, 2000, 1, (CUstream *, unsigned int))                                         \
    X(cuStreamDestroy, 4000, 1, (CUstream))                                                        \
    X(cuStreamSynchronize, 2000, 1, (CUstream))                                                    \
    X(cuStreamQuery, 2000, 1, (CUstream))                                                          \
    X(cuStreamWaitValue32, 12000, 1, (CUstream, CUdeviceptr, uint32_t, unsigned int))              \
    X(cuStreamWriteValue32, 12000, 1, (CUstream, CUdeviceptr, uint32_t, unsigned int))             \
    X(cuEventCreate, 2000, 1, (CUevent *, unsigned int))                                           \
    X(cuEventRecord, 2000, 1, (CUevent, CUstream))                                                 \
    X(cuEventQuery, 2000, 1, (CUevent))                                                            \
    X(cuEventSynchronize, 2000, 1, (CUevent))                                                      \
    X(cuEventDestroy, 4000, 1, (CUevent))                                                          \
    X(cuStreamWaitEvent, 3020, 1, (CUstream, CUevent, unsigned int))                               \
    X(cuStreamGetId, 12000, 1, (CUstream, unsigned long long *))                                   \
    X(cuMemPoolCreate, 11020, 0, (CUmemoryPool *, const CUmemPoolProps *))                         \
    X(cuMemPoolSetAttribute, 11020, 0, (CUmemoryPool, int, void *))                                \
    X(cuMemPoolTrimTo, 11020, 0, (CUmemoryPool, size_t))                                           \
    X(cuMemAllocFromPoolAsync, 11020, 0, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))          \
    X(cuMemFreeAsync, 11020, 0, (CUdeviceptr, CUstream))                                           \
    X(cuMemGetAllocationGranularity, 10020, 0, (size_t *, const CUmemAllocationProp *, int))       \
    X(cuMemCreate, 10020, 0,                                                                       \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))   \
    X(cuMemRelease, 10020, 0, (CUmemGenericAllocationHandle))                                      \
    X(cuMemAddressReserve, 10020, 0,                                                               \
      (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                            \
    X(cuMemAddressFree, 10020, 0, (CUdeviceptr, size_t))                                           \
    X(cuMemMap, 10020, 0,                                                                          \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))             \
    X(cuMemUnmap, 10020, 0, (CUdeviceptr, size_t))                                                 \
    X(cuMemSetAccess, 10020, 0, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))            \
    X(cuMemExportToShareableHandle, 10020, 0,                                                      \
      (void *, CUmemGenericAllocationHandle, int, unsigned long long))                             \
    X(cuMemImportFromShareableHandle, 10020, 0, (CUmemGenericAllocationHandle *, void *, int))

typedef struct ferry__cuda {
    void *library;
    int driver_version; /* cuDriverGetVersion, e.g. 13000 */
    int device_count;
    char path[256]; /* the library that was loaded */
    void *get_proc; /* its cuGetProcAddress_v2 */
#define FERRY_CUDA_SLOT_(name, version, mandatory, params) CUresult(*name) params;
    FERRY_CUDA_FUNCTIONS(FERRY_CUDA_SLOT_)
#undef FERRY_CUDA_SLOT_
} ferry__cuda;

/* The process's driver table, loading it on first use (thread-safe). NOT_SUPPORTED, with
 * the first cause ("no CUDA driver: libcuda.so.1: cannot open shared object file"), when
 * there is no usable driver; the answer is cached. */
ferry_status ferry__cuda_get(const ferry__cuda **cuda);

/* Reports a failed driver call: "<call> failed: CUDA_ERROR_X (text)" with status DRIVER
 * (NO_MEMORY for CUDA_ERROR_OUT_OF_MEMORY). */
ferry_status ferry__cuda_fail(const ferry__cuda *cuda, const char *call, CUresult result);

/* Runs a driver call; on failure reports it once, where it happened, and returns. */
#define FERRY_CU_TRY(cuda, fn, args)                                                               \
    do {                                                                                           \
        CUresult ferry_cu_rc_ = (cuda)->fn args;                                                   \
        if (ferry_cu_rc_ != CUDA_SUCCESS)                                                          \
            return ferry__cuda_fail((cuda), #fn, ferry_cu_rc_);                                    \
    } while (0)

/* Makes the primary context of device current on this thread (retaining it once per
 * process and device). */
ferry_status ferry__cuda_use_device(const ferry__cuda *cuda, int device);

/* Control words in device memory, read and written by the CPU on io, a non-blocking stream of
 * ferry's own (never the legacy default stream, which would wait behind the application's
 * work and, under the pool's lock, deadlock with a stream waiting for that pool), then
 * synchronised. */
ferry_status ferry__cuda_io_stream(const ferry__cuda *cuda, CUstream *io);
ferry_status ferry__cuda_words_read(const ferry__cuda *cuda, CUstream io, void *host,
                                    CUdeviceptr words, size_t bytes);
/* Copies n bytes from src to dst (either in device or host memory, pageable host memory
 * included: unified addressing) on io, then synchronises io. */
ferry_status ferry__cuda_copy(const ferry__cuda *cuda, CUstream io, void *dst, const void *src,
                              size_t n);
ferry_status ferry__cuda_words_write(const ferry__cuda *cuda, CUstream io, CUdeviceptr words,
                                     uint32_t count, uint32_t value);

/* The library's boundary: a public call that may switch the thread's CUDA context (to a
 * device's primary context, ferry__cuda_use_device) puts the caller's back when it returns.
 * FERRY_CUDA_BOUNDARY at the top of such a call does that (a cleanup attribute; nesting is
 * counted, and a call that switched nothing costs two thread-local updates). */
int ferry__cuda_boundary_begin(void);
void ferry__cuda_boundary_end(int *unused);
#define FERRY_CUDA_BOUNDARY                                                                        \
    int ferry__cuda_boundary_ __attribute__((cleanup(ferry__cuda_boundary_end), unused)) =         \
        ferry__cuda_boundary_begin()

#endif
