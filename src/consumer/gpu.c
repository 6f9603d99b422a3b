/* GPU pools as a consumer sees them: the host segment registered with CUDA once per process,
 * the pool's IPC handle opened once per process and device, on the consumer's own device
 * with lazy peer access (no context is ever made on the producer's GPU). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "consumer/consumer.h"
#include "driver/driver.h"
#include "transport/cuda_pool.h"


struct ferry__gpu_pool {
    const ferry__cuda *cuda;
    pthread_mutex_t lock;                    /* guards base[] while opening */
    int registered;                          /* the segment is registered with CUDA */
    int device;                              /* the device whose context registered it */
    CUdeviceptr segment_dev;                 /* its device address */
    CUdeviceptr base[FERRY_MAX_DEVICES]; /* the pool opened on each device, 0 if not */
    uint8_t borrowed[FERRY_MAX_DEVICES]; /* base is the producer's own (same process) */
    CUmemGenericAllocationHandle vmm[FERRY_MAX_DEVICES]; /* CUDA VMM: imported handles */
};

/* Calls that reach gpu_map after their pool was opened give the VMM broker this long. */
#define FERRY_VMM_BROKER_TIMEOUT_NS 5000000000ull

static int device_control(const ferry__mapped_pool *p)
{
    return (p->flags & FERRY_DESC_FLAG_DEVICE_CONTROL) != 0;
}

static ferry_status check_device(int device)
{
    if (device < 0 || device >= FERRY_MAX_DEVICES)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "a GPU pool needs a consumer on a device (ferry_consumer_create_on), "
                           "got device %d",
                           device);
    return FERRY_OK;
}

ferry_status ferry__gpu_attach(ferry__mapped_pool *p, int device)
{
    const ferry__cuda *cuda = NULL;
    ferry_status st = check_device(device);
    if (st == FERRY_OK && (st = ferry__cuda_get(&cuda)) != FERRY_OK)
        return ferry__fail_wrap(st, "opening a GPU pool needs the CUDA driver");
    if (st == FERRY_OK)
        st = ferry__cuda_use_device(cuda, device); /* registering needs a current context */
    if (st != FERRY_OK)
        return st;
    ferry__gpu_pool *g = calloc(1, sizeof(*g));
    if (!g)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory opening a GPU pool");
    g->cuda = cuda;
    g->device = device;
    pthread_mutex_init(&g->lock, NULL);
    p->gpu = g;
    if (device_control(p))
        return FERRY_OK;
    /* Streams wait on and write the control words in this process's mapping of them. */
    FERRY_CU_TRY(cuda, cuMemHostRegister,
                 (p->base, p->size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    g->registered = 1;
    FERRY_CU_TRY(cuda, cuMemHostGetDevicePointer, (&g->segment_dev, p->base, 0));
    return FERRY_OK;
}

static ferry_status open_ipc(ferry__mapped_pool *p, CUdeviceptr *base)
{
    const ferry__cuda *cuda = p->gpu->cuda;
    CUipcMemHandle h;
    memcpy(&h, p->handle, sizeof(h));
    CUresult rc = cuda->cuIpcOpenMemHandle(base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (rc != CUDA_SUCCESS) {
        /* A stale mapping of a dead producer's pool can stand in the way: drop the cache's
         * pools whose producer is gone, then try once more. */
        ferry__cache_sweep();
        rc = cuda->cuIpcOpenMemHandle(base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    }
    if (rc != CUDA_SUCCESS)
        return ferry__cuda_fail(cuda, "cuIpcOpenMemHandle", rc);
    return FERRY_OK;
}

/* CUDA VMM: the allocation handle, from the FABRIC bytes or the broker's POSIX fd. */
static ferry_status import_vmm(ferry__mapped_pool *p, uint64_t deadline,
                               CUmemGenericAllocationHandle *h)
{
    const ferry__cuda *cuda = p->gpu->cuda;
    if (p->flags & FERRY_DESC_FLAG_FABRIC) {
        FERRY_CU_TRY(cuda, cuMemImportFromShareableHandle,
                     (h, p->handle, CU_MEM_HANDLE_TYPE_FABRIC));
        return FERRY_OK;
    }
    int fd;
    uint64_t size;
    pid_t pid;
    uint64_t now = ferry__now_ns();
    ferry_status st = ferry__broker_request(p->handle, p->pool_id, FERRY__RANK_NONE,
                                            "CUDA VMM POSIX FD broker",
                                            deadline > now ? deadline - now : 0, &fd, &size, &pid);
    if (st != FERRY_OK)
        return st;
    CUresult rc = cuda->cuMemImportFromShareableHandle(h, (void *)(intptr_t)fd,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (rc != CUDA_SUCCESS)
        return ferry__cuda_fail(cuda, "cuMemImportFromShareableHandle", rc);
    return FERRY_OK;
}

/* Reserves a range, maps h into it and lets device read and write it; undone on failure. */
static ferry_status map_range(const ferry__cuda *cuda, CUmemGenericAllocationHandle h,
                              uint64_t size, size_t granularity, int device, CUdeviceptr *out)
{
    CUdeviceptr va = 0;
    FERRY_CU_TRY(cuda, cuMemAddressReserve, (&va, size, granularity, 0, 0));
    CUresult rc = cuda->cuMemMap(va, size, 0, h, 0);
    if (rc != CUDA_SUCCESS) {
        cuda->cuMemAddressFree(va, size);
        return ferry__cuda_fail(cuda, "cuMemMap", rc);
    }
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = cuda->cuMemSetAccess(va, size, &access, 1);
    if (rc != CUDA_SUCCESS) {
        cuda->cuMemUnmap(va, size);
        cuda->cuMemAddressFree(va, size);
        return ferry__cuda_fail(cuda, "cuMemSetAccess", rc);
    }
    *out = va;
    return FERRY_OK;
}

/* CUDA VMM: imports the pool and maps it on the consumer's device. */
static ferry_status open_vmm(ferry__mapped_pool *p, int device, uint64_t deadline,
                             CUdeviceptr *base)
{
    const ferry__cuda *cuda = p->gpu->cuda;
    if (!cuda->cuMemCreate)
        return ferry__fail(FERRY_NOT_SUPPORTED, "CUDA VMM: this driver has no VMM entry points");
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, device}};
    size_t g;
    CUmemGenericAllocationHandle h;
    FERRY_CU_TRY(cuda, cuMemGetAllocationGranularity,
                 (&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    ferry_status st = import_vmm(p, deadline, &h);
    if (st == FERRY_OK && (st = map_range(cuda, h, p->memory_size, g, device, base)) != FERRY_OK)
        cuda->cuMemRelease(h);
    if (st == FERRY_OK)
        p->gpu->vmm[device] = h;
    return st;
}

/* A consumer in the producer's own process reads the producer's mapping: CUDA refuses to
 * open a process's own IPC handle, and importing its own VMM allocation would map it twice.
 * A CUDA VMM mapping is made accessible from the consumer's device too. */
static ferry_status borrow_local(ferry__mapped_pool *p, int device, const ferry__cuda_local *l,
                                 CUdeviceptr *base)
{
    if (p->backend == FERRY_BACKEND_CUDA_VMM && device != l->device) {
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                                  CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        FERRY_CU_TRY(p->gpu->cuda, cuMemSetAccess, (l->base, l->size, &access, 1));
    }
    *base = l->base;
    p->gpu->borrowed[device] = 1;
    return FERRY_OK;
}

static ferry_status open_handle(ferry__mapped_pool *p, int device, uint64_t deadline,
                                CUdeviceptr *base)
{
    ferry__cuda_local local;
    if (ferry__cuda_local_find(p->pool_id, &local))
        return borrow_local(p, device, &local, base);
    return p->backend == FERRY_BACKEND_CUDA_VMM ? open_vmm(p, device, deadline, base)
                                                : open_ipc(p, base);
}

ferry_status ferry__gpu_map(ferry__mapped_pool *p, int device, uint64_t deadline)
{
    ferry_status st = check_device(device);
    if (st != FERRY_OK)
        return st;
    ferry__gpu_pool *g = p->gpu;
    st = ferry__cuda_use_device(g->cuda, device);
    if (st != FERRY_OK || __atomic_load_n(&g->base[device], __ATOMIC_ACQUIRE))
        return st;
    pthread_mutex_lock(&g->lock);
    if (!g->base[device]) {
        CUdeviceptr base = 0;
        st = open_handle(p, device, deadline, &base);
        if (st == FERRY_OK)
            __atomic_store_n(&g->base[device], base, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g->lock);
    return st;
}

void ferry__gpu_detach(ferry__mapped_pool *p)
{
    ferry__gpu_pool *g = p->gpu;
    if (!g)
        return;
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        if (!g->base[d] || g->borrowed[d] || ferry__cuda_use_device(g->cuda, d) != FERRY_OK)
            continue;
        if (p->backend == FERRY_BACKEND_CUDA_VMM) {
            g->cuda->cuMemUnmap(g->base[d], p->memory_size);
            g->cuda->cuMemAddressFree(g->base[d], p->memory_size);
            g->cuda->cuMemRelease(g->vmm[d]);
        } else {
            g->cuda->cuIpcCloseMemHandle(g->base[d]);
        }
    }
    if (g->registered && ferry__cuda_use_device(g->cuda, g->device) == FERRY_OK)
        g->cuda->cuMemHostUnregister(p->base);
    pthread_mutex_destroy(&g->lock);
    free(g);
    p->gpu = NULL;
}

/* The device address of a control word, as the consumer's device sees it. */
static ferry_status word_address(ferry__mapped_pool *p, int device, uint64_t word,
                                 CUdeviceptr *addr)
{
    ferry_status st = ferry__gpu_map(p, device, ferry__deadline(FERRY_VMM_BROKER_TIMEOUT_NS));
    if (st != FERRY_OK)
        return st;
    ferry__gpu_pool *g = p->gpu;
    if (device_control(p))
        *addr = g->base[device] + word * sizeof(uint32_t);
    else
        *addr = g->segment_dev + p->header->header_bytes + word * sizeof(uint32_t);
    return FERRY_OK;
}

ferry_status ferry__gpu_load(ferry__mapped_pool *p, int device, uint64_t word, uint32_t *value)
{
    if (!device_control(p)) {
        *value = ferry__load_acquire32(&p->control[word]);
        return FERRY_OK;
    }
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    uint32_t v;
    FERRY_CU_TRY(p->gpu->cuda, cuMemcpy, ((CUdeviceptr)(uintptr_t)&v, addr, sizeof(v)));
    *value = v;
    return FERRY_OK;
}

ferry_status ferry__gpu_store(ferry__mapped_pool *p, int device, uint64_t word, uint32_t value)
{
    if (!device_control(p)) {
        ferry__store_release32(&p->control[word], value);
        return FERRY_OK;
    }
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(p->gpu->cuda, cuMemsetD32, (addr, value, 1));
    return FERRY_OK;
}

ferry_status ferry__gpu_data(ferry__mapped_pool *p, int device, uint64_t offset, const void **data)
{
    ferry_status st = ferry__gpu_map(p, device, ferry__deadline(FERRY_VMM_BROKER_TIMEOUT_NS));
    if (st != FERRY_OK)
        return st;
    *data = (const void *)(uintptr_t)(p->gpu->base[device] + p->header->data_start + offset);
    return FERRY_OK;
}

ferry_status ferry__gpu_copy_out(ferry__mapped_pool *p, int device, uint64_t offset, void *dst,
                                 uint64_t n)
{
    const void *src;
    ferry_status st = ferry__gpu_data(p, device, offset, &src);
    if (st != FERRY_OK || n == 0)
        return st;
    FERRY_CU_TRY(p->gpu->cuda, cuMemcpy,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n));
    return FERRY_OK;
}

ferry_status ferry__gpu_enqueue_wait(ferry__mapped_pool *p, int device, uint64_t word,
                                     uint32_t value, void *stream)
{
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(p->gpu->cuda, cuStreamWaitValue32,
                 ((CUstream)stream, addr, value, CU_STREAM_WAIT_VALUE_GEQ));
    return FERRY_OK;
}

ferry_status ferry__gpu_enqueue_copy(ferry__mapped_pool *p, int device, uint64_t offset, void *dst,
                                     uint64_t n, void *stream)
{
    const void *src;
    ferry_status st = ferry__gpu_data(p, device, offset, &src);
    if (st != FERRY_OK || n == 0)
        return st;
    FERRY_CU_TRY(p->gpu->cuda, cuMemcpyAsync,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream));
    return FERRY_OK;
}

ferry_status ferry__gpu_enqueue_store(ferry__mapped_pool *p, int device, uint64_t word,
                                      uint32_t value, void *stream)
{
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(p->gpu->cuda, cuStreamWriteValue32,
                 ((CUstream)stream, addr, value, CU_STREAM_WRITE_VALUE_DEFAULT));
    return FERRY_OK;
}
