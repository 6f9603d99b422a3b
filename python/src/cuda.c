/* The few CUDA driver calls the package makes itself, through ferry's driver table (loaded at
 * run time: the package builds and runs without CUDA). */
#include "driver/driver.h"
#include "ferry_py.h"

/* The loaded driver; callers only get here for GPU pools, whose creation loaded it. */
static const ferry__cuda *driver(void)
{
    const ferry__cuda *cuda = NULL;
    return ferry__cuda_get(&cuda) == FERRY_OK ? cuda : NULL;
}

ferry_status fy_cuda_enter(fy_cuda_scope *scope, int device)
{
    const ferry__cuda *cuda;
    scope->active = 0;
    scope->saved = NULL;
    if (device == FY_CUDA_NONE)
        return FERRY_OK;
    ferry_status st = ferry__cuda_get(&cuda);
    if (st != FERRY_OK)
        return device < 0 ? FERRY_OK : st;
    CUcontext current = NULL;
    if (cuda->cuCtxGetCurrent(&current) != CUDA_SUCCESS)
        current = NULL;
    scope->saved = current;
    scope->active = 1;
    if (device >= 0 && (st = ferry__cuda_use_device(cuda, device)) != FERRY_OK) {
        fy_cuda_leave(scope);
        return st;
    }
    return FERRY_OK;
}

void fy_cuda_leave(fy_cuda_scope *scope)
{
    const ferry__cuda *cuda = scope->active ? driver() : NULL;
    CUcontext current = NULL;
    if (cuda && (cuda->cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != scope->saved))
        cuda->cuCtxSetCurrent((CUcontext)scope->saved);
    scope->active = 0;
}

ferry_status fy_cuda_alloc(uint64_t bytes, void **ptr)
{
    const ferry__cuda *cuda;
    ferry_status st = ferry__cuda_get(&cuda);
    if (st != FERRY_OK)
        return st;
    CUdeviceptr p = 0;
    FERRY_CU_TRY(cuda, cuMemAlloc, (&p, bytes ? (size_t)bytes : 1));
    *ptr = (void *)(uintptr_t)p;
    return FERRY_OK;
}

void fy_cuda_free(void *ptr)
{
    const ferry__cuda *cuda = ptr ? driver() : NULL;
    if (cuda)
        cuda->cuMemFree((CUdeviceptr)(uintptr_t)ptr);
}

ferry_status fy_cuda_copy_async(void *dst, const void *src, uint64_t n, void *stream)
{
    const ferry__cuda *cuda;
    ferry_status st = ferry__cuda_get(&cuda);
    if (st != FERRY_OK || n == 0)
        return st;
    FERRY_CU_TRY(cuda, cuMemcpyAsync,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream));
    return FERRY_OK;
}

ferry_status fy_cuda_event_record(void *stream, void **event)
{
    const ferry__cuda *cuda;
    ferry_status st = ferry__cuda_get(&cuda);
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

ferry_status fy_cuda_stream_sync(void *stream)
{
    const ferry__cuda *cuda;
    ferry_status st = ferry__cuda_get(&cuda);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(cuda, cuStreamSynchronize, ((CUstream)stream));
    return FERRY_OK;
}

/* Event calls need a current context: the event's device's, entered and left around them. */
ferry_status fy_cuda_event_wait(void *event, int device)
{
    const ferry__cuda *cuda = event ? driver() : NULL; /* no event: no driver to load */
    fy_cuda_scope scope;
    if (!cuda)
        return FERRY_OK;
    ferry_status st = fy_cuda_enter(&scope, device);
    if (st != FERRY_OK)
        return st;
    CUresult rc = cuda->cuEventSynchronize((CUevent)event);
    fy_cuda_leave(&scope);
    return rc == CUDA_SUCCESS ? FERRY_OK : ferry__cuda_fail(cuda, "cuEventSynchronize", rc);
}

int fy_cuda_event_done(void *event, int device)
{
    const ferry__cuda *cuda = event ? driver() : NULL;
    fy_cuda_scope scope;
    if (!cuda || fy_cuda_enter(&scope, device) != FERRY_OK)
        return 1;
    CUresult rc = cuda->cuEventQuery((CUevent)event);
    fy_cuda_leave(&scope);
    return rc != CUDA_ERROR_NOT_READY;
}

void fy_cuda_event_destroy(void *event, int device)
{
    const ferry__cuda *cuda = event ? driver() : NULL;
    fy_cuda_scope scope;
    if (!cuda || fy_cuda_enter(&scope, device) != FERRY_OK)
        return;
    cuda->cuEventDestroy((CUevent)event);
    fy_cuda_leave(&scope);
}
