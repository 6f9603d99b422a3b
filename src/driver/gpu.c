/* The public GPU helpers (ferry.h): a few driver calls for programs with no CUDA runtime of
 * their own, through the driver table loaded at run time. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/error.h"
#include "driver/driver.h"

/* The driver, with device's primary context current (the boundary puts the caller's back). */
static ferry_status on_device(int32_t device, const ferry__cuda **cuda)
{
    ferry_status st = ferry__cuda_get(cuda);
    if (st != FERRY_OK)
        return st;
    return ferry__cuda_use_device(*cuda, device);
}

ferry_status ferry_gpu_driver_symbol(const char *name, int cuda_version, void **fn)
{
    typedef CUresult (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);
    const ferry__cuda *cuda;
    get_proc_fn get_proc;
    void *p = NULL;
    int found = 0;
    if (!name || !fn)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "name or output pointer is NULL");
    ferry_status st = ferry__cuda_get(&cuda);
    if (st != FERRY_OK)
        return st;
    memcpy(&get_proc, &cuda->get_proc, sizeof(get_proc));
    if (get_proc(name, &p, cuda_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) !=
            CUDA_SUCCESS ||
        found != 0 || !p)
        return ferry__fail(FERRY_NOT_SUPPORTED, "CUDA driver %s has no %.100s for CUDA %d",
                           cuda->path, name, cuda_version);
    *fn = p;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_gpu_alloc(int32_t device, uint64_t size, void **ptr)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    if (!ptr)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "output pointer is NULL");
    ferry_status st = on_device(device, &cuda);
    if (st != FERRY_OK)
        return st;
    CUdeviceptr p = 0;
    FERRY_CU_TRY(cuda, cuMemAlloc, (&p, size ? (size_t)size : 1));
    *ptr = (void *)(uintptr_t)p;
    ferry__clear_error();
    return FERRY_OK;
}

void ferry_gpu_free(int32_t device, void *ptr)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    if (ptr && on_device(device, &cuda) == FERRY_OK)
        cuda->cuMemFree((CUdeviceptr)(uintptr_t)ptr);
}

ferry_status ferry_gpu_copy_async(int32_t device, void *dst, const void *src, uint64_t n,
                                  void *stream)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    ferry_status st = on_device(device, &cuda);
    if (st != FERRY_OK || n == 0)
        return st;
    FERRY_CU_TRY(cuda, cuMemcpyAsync,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream));
    return FERRY_OK;
}

ferry_status ferry_gpu_stream_synchronize(int32_t device, void *stream)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    ferry_status st = on_device(device, &cuda);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(cuda, cuStreamSynchronize, ((CUstream)stream));
    return FERRY_OK;
}

ferry_status ferry_gpu_event_record(int32_t device, void *stream, void **event)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    if (!event)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "event output is NULL");
    ferry_status st = on_device(device, &cuda);
    if (st != FERRY_OK)
        return st;
    CUevent ev = NULL;
    FERRY_CU_TRY(cuda, cuEventCreate, (&ev, CU_EVENT_DISABLE_TIMING));
    CUresult rc = cuda->cuEventRecord(ev, (CUstream)stream);
    if (rc != CUDA_SUCCESS) {
        cuda->cuEventDestroy(ev);
        return ferry__cuda_fail(cuda, "cuEventRecord", rc);
    }
    *event = ev;
    return FERRY_OK;
}

ferry_status ferry_gpu_event_wait(int32_t device, void *event)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    ferry_status st = event ? on_device(device, &cuda) : FERRY_OK;
    if (st != FERRY_OK || !event)
        return st;
    FERRY_CU_TRY(cuda, cuEventSynchronize, ((CUevent)event));
    return FERRY_OK;
}

ferry_status ferry_gpu_event_query(int32_t device, void *event, int *done)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    if (!done)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "done output is NULL");
    ferry_status st = event ? on_device(device, &cuda) : FERRY_OK;
    if (st != FERRY_OK)
        return st;
    CUresult rc = event ? cuda->cuEventQuery((CUevent)event) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY)
        return ferry__cuda_fail(cuda, "cuEventQuery", rc);
    *done = rc == CUDA_SUCCESS;
    return FERRY_OK;
}

void ferry_gpu_event_destroy(int32_t device, void *event)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    if (event && on_device(device, &cuda) == FERRY_OK)
        cuda->cuEventDestroy((CUevent)event);
}

/* ---- stream-ordered memory ----------------------------------------------------------------
 *
 * One CUDA memory pool per device, made on first use and kept for the process (as the primary
 * contexts are): allocations and frees are enqueued on streams and served from memory the pool
 * already holds, so that neither calls the driver's allocator nor waits for the device once the
 * pool has grown to the working set. Its release threshold is the largest value, so that the
 * driver does not hand memory back at every synchronisation (and take it again at the next
 * allocation); ferry_gpu_trim gives it back on request. A device or driver without memory
 * pools gets cuMemAlloc and cuMemFree, with a warning once. */

enum { MEM_UNKNOWN = 0, MEM_POOL = 1, MEM_PLAIN = -1 };

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int kind; /* MEM_*, read without the lock once set (atomic) */
    CUmemoryPool pool;
} mem[FERRY_MAX_DEVICES];

/* Why device cannot have a pool (NULL: it can). */
static const char *no_pool_reason(const ferry__cuda *cuda, int32_t device)
{
    int supported = 0;
    if (!cuda->cuMemPoolCreate || !cuda->cuMemPoolSetAttribute || !cuda->cuMemPoolTrimTo ||
        !cuda->cuMemAllocFromPoolAsync || !cuda->cuMemFreeAsync)
        return "the driver has no stream-ordered allocator (CUDA 11.2)";
    if (cuda->cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                                   device) != CUDA_SUCCESS ||
        !supported)
        return "the device does not support memory pools";
    return NULL;
}

/* Makes device's pool (under mem_lock): MEM_POOL, or MEM_PLAIN with the reason logged. */
static int make_pool(const ferry__cuda *cuda, int32_t device)
{
    const char *why = no_pool_reason(cuda, device);
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool pool = NULL;
    unsigned long long keep = ~0ull;
    if (!why && cuda->cuMemPoolCreate(&pool, &props) != CUDA_SUCCESS)
        why = "cuMemPoolCreate failed";
    if (!why &&
        cuda->cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) != CUDA_SUCCESS)
        why = "cuMemPoolSetAttribute(RELEASE_THRESHOLD) failed";
    if (why) {
        ferry__log(FERRY_LOG_WARN,
                   "GPU %d: %s; received tensors are allocated with cuMemAlloc and freed with "
                   "cuMemFree, which waits for the device",
                   (int)device, why);
        return MEM_PLAIN; /* a pool made before the attribute failed is left to the process */
    }
    mem[device].pool = pool;
    return MEM_POOL;
}

/* The driver with device current, and device's allocator: *pool NULL for cuMemAlloc. */
static ferry_status mem_pool(int32_t device, const ferry__cuda **cuda, CUmemoryPool *pool)
{
    ferry_status st = on_device(device, cuda);
    if (st != FERRY_OK)
        return st;
    int kind = __atomic_load_n(&mem[device].kind, __ATOMIC_ACQUIRE);
    if (kind == MEM_UNKNOWN) {
        pthread_mutex_lock(&mem_lock);
        kind = mem[device].kind;
        if (kind == MEM_UNKNOWN) {
            kind = make_pool(*cuda, device);
            __atomic_store_n(&mem[device].kind, kind, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&mem_lock);
    }
    *pool = kind == MEM_POOL ? mem[device].pool : NULL;
    return FERRY_OK;
}

ferry_status ferry_gpu_alloc_async(int32_t device, uint64_t size, void *stream, void **ptr)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    CUmemoryPool pool;
    if (!ptr)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "output pointer is NULL");
    ferry_status st = mem_pool(device, &cuda, &pool);
    if (st != FERRY_OK)
        return st;
    CUdeviceptr p = 0;
    size_t n = size ? (size_t)size : 1;
    if (pool)
        FERRY_CU_TRY(cuda, cuMemAllocFromPoolAsync, (&p, n, pool, (CUstream)stream));
    else
        FERRY_CU_TRY(cuda, cuMemAlloc, (&p, n));
    *ptr = (void *)(uintptr_t)p;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_gpu_free_async(int32_t device, void *ptr, void *stream)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    CUmemoryPool pool;
    if (!ptr)
        return FERRY_OK;
    ferry_status st = mem_pool(device, &cuda, &pool);
    if (st != FERRY_OK)
        return st;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    CUresult rc = pool ? cuda->cuMemFreeAsync(p, (CUstream)stream) : CUDA_SUCCESS;
    if (pool && rc == CUDA_SUCCESS)
        return FERRY_OK;
    /* No pool, or the stream refused the free (destroyed meanwhile): cuMemFree, which waits
     * for the work that uses the memory, takes pool memory too. */
    CUresult plain = cuda->cuMemFree(p);
    if (rc != CUDA_SUCCESS)
        return ferry__cuda_fail(cuda, "cuMemFreeAsync", rc);
    if (plain != CUDA_SUCCESS)
        return ferry__cuda_fail(cuda, "cuMemFree", plain);
    return FERRY_OK;
}

ferry_status ferry_gpu_trim(int32_t device, uint64_t keep)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    CUmemoryPool pool;
    ferry_status st = mem_pool(device, &cuda, &pool);
    if (st != FERRY_OK || !pool)
        return st;
    FERRY_CU_TRY(cuda, cuMemPoolTrimTo, (pool, (size_t)keep));
    return FERRY_OK;
}

ferry_status ferry_gpu_stream_wait_event(int32_t device, void *stream, void *event)
{
    FERRY_CUDA_BOUNDARY;
    const ferry__cuda *cuda;
    ferry_status st = event ? on_device(device, &cuda) : FERRY_OK;
    if (st != FERRY_OK || !event)
        return st;
    FERRY_CU_TRY(cuda, cuStreamWaitEvent, ((CUstream)stream, (CUevent)event, 0));
    return FERRY_OK;
}
