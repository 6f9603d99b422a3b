/* The public GPU helpers (ferry.h): a few driver calls for programs with no CUDA runtime of
 * their own, through the driver table loaded at run time. */
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
