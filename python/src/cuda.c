/* The few GPU calls the package makes itself, through ferry's public GPU helpers (the driver
 * is loaded at run time: the package builds and runs without CUDA). */
#include "ferry_py.h"

ferry_status fy_cuda_alloc_async(int device, uint64_t bytes, void *stream, void **ptr)
{
    return ferry_gpu_alloc_async(device, bytes, stream, ptr);
}

void fy_cuda_free_async(int device, void *ptr, void *stream)
{
    ferry_gpu_free_async(device, ptr, stream); /* freed either way; nobody to tell */
}

ferry_status fy_cuda_copy_async(int device, void *dst, const void *src, uint64_t n, void *stream)
{
    return ferry_gpu_copy_async(device, dst, src, n, stream);
}

ferry_status fy_cuda_event_record(int device, void *stream, void **event)
{
    return ferry_gpu_event_record(device, stream, event);
}

ferry_status fy_cuda_stream_sync(int device, void *stream)
{
    return ferry_gpu_stream_synchronize(device, stream);
}

ferry_status fy_cuda_order(int device, void *before, void *after)
{
    void *event = NULL;
    ferry_status st = ferry_gpu_event_record(device, before, &event);
    if (st == FERRY_OK)
        st = ferry_gpu_stream_wait_event(device, after, event);
    ferry_gpu_event_destroy(device, event); /* released once it has completed */
    return st;
}

ferry_status fy_cuda_wait_stream(int device, void *stream)
{
    void *event = NULL;
    ferry_status st = ferry_gpu_event_record(device, stream, &event);
    if (st == FERRY_OK)
        st = ferry_gpu_event_wait(device, event);
    ferry_gpu_event_destroy(device, event);
    return st;
}

ferry_status fy_cuda_event_wait(void *event, int device)
{
    return ferry_gpu_event_wait(device, event);
}

int fy_cuda_event_done(void *event, int device)
{
    int done = 1;
    if (event && ferry_gpu_event_query(device, event, &done) != FERRY_OK)
        done = 1; /* a failed event waits for nothing */
    return done;
}

void fy_cuda_event_destroy(void *event, int device)
{
    ferry_gpu_event_destroy(device, event);
}
