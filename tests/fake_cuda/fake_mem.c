/* The fake CUDA driver's memory: the registry of regions (allocations, IPC mappings, host
 * registrations, VMM mappings and reservations), cuMemAlloc/cuMemFree over memfds, host
 * registration, pointer attributes and IPC handles that another process opens through
 * /proc/<pid>/fd/<fd>. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

/* ---- the registry ---------------------------------------------------------------------- */

static struct fake_region *regions;

static int contains(const struct fake_region *r, uintptr_t p)
{
    uintptr_t base = (uintptr_t)r->base;
    return p >= base && p - base < r->size;
}

struct fake_region *fake_region_at(uintptr_t p, unsigned kinds)
{
    for (struct fake_region *r = regions; r; r = r->next)
        if ((r->kind & kinds) && contains(r, p))
            return r;
    return NULL;
}

struct fake_region *fake_region_overlapping(uintptr_t p, size_t n, unsigned kinds)
{
    for (struct fake_region *r = regions; r; r = r->next) {
        uintptr_t base = (uintptr_t)r->base;
        if ((r->kind & kinds) && p < base + r->size && base < p + n)
            return r;
    }
    return NULL;
}

struct fake_region *fake_region_next(struct fake_region *r, unsigned kinds)
{
    for (r = r ? r->next : regions; r; r = r->next)
        if (r->kind & kinds)
            return r;
    return NULL;
}

struct fake_region *fake_region_add(enum fake_kind kind, void *base, size_t size)
{
    struct fake_region *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->kind = kind;
    r->base = base;
    r->size = size;
    r->fd = -1;
    r->next = regions;
    regions = r;
    return r;
}

void fake_region_remove(struct fake_region *r)
{
    for (struct fake_region **at = &regions; *at; at = &(*at)->next)
        if (*at == r) {
            *at = r->next;
            break;
        }
    free(r);
}

void fake_region_drain(struct fake_region *r, const char *call)
{
    int warned = 0;
    while (r->pending) {
        if (warned) {
            pthread_cond_wait(&fake_progress, &fake_lock);
            continue;
        }
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 2;
        if (pthread_cond_timedwait(&fake_progress, &fake_lock, &deadline) == ETIMEDOUT &&
            r->pending) {
            warned = 1;
            fake_warn("%s(%p) waits for %u stream operation(s) that use the memory (behind a "
                      "cuStreamWaitValue32 that never completes?)",
                      call, (void *)r->base, r->pending);
        }
    }
}

CUresult fake_check_span(uintptr_t p, size_t n, struct fake_region **region)
{
    *region = NULL;
    if (!p || p + n < p)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_region *r = fake_region_at(p, FAKE_DEVICE_MEMORY | FAKE_HOSTREG);
    if (r) {
        if (r->dying || r->pool_free || n > r->size - (p - (uintptr_t)r->base))
            return CUDA_ERROR_INVALID_VALUE;
        if (r->kind == FAKE_VMM && !r->accessible)
            return FAKE_CUDA_ERROR_ILLEGAL_ADDRESS;
        *region = r;
        return CUDA_SUCCESS;
    }
    /* Pageable host memory, which must not run into device memory or address space that
     * is reserved but not mapped. */
    if (fake_region_overlapping(p, n ? n : 1, FAKE_DEVICE_MEMORY | FAKE_RESERVED))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

int fake_live_regions(void)
{
    int n = 0;
    for (struct fake_region *r = regions; r; r = r->next)
        n += r->kind == FAKE_IPC ? (int)r->ipc_refs : r->kind == FAKE_POOLED ? !r->pool_free : 1;
    return n;
}

/* ---- allocations ----------------------------------------------------------------------- */

FAKE_DECLARE(cuMemAlloc);
static CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    FAKE_ENTER(cuMemAlloc);
    int device;
    CUresult rc = fake_need_context(&device);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    rc = fake_reserve_bytes(device, bytesize);
    pthread_mutex_unlock(&fake_lock);
    if (rc != CUDA_SUCCESS)
        return rc;

    char name[64];
    snprintf(name, sizeof(name), "ferry-fake-cuda:alloc:dev%d", device);
    void *p = MAP_FAILED;
    struct stat st;
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)bytesize) == 0 && fstat(fd, &st) == 0)
        p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = p != MAP_FAILED ? fake_region_add(FAKE_ALLOC, p, bytesize) : NULL;
    if (!r) {
        fake_unreserve_bytes(device, bytesize);
        pthread_mutex_unlock(&fake_lock);
        if (p != MAP_FAILED)
            munmap(p, bytesize);
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->fd = fd;
    r->device = device;
    r->ipc_ino = (uint64_t)st.st_ino;
    pthread_mutex_unlock(&fake_lock);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuMemFree);
static CUresult cuMemFree(CUdeviceptr dptr)
{
    FAKE_ENTER(cuMemFree);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)dptr, FAKE_ALLOC | FAKE_POOLED);
    if (!r || r->dying || r->pool_free || (uintptr_t)r->base != dptr) {
        pthread_mutex_unlock(&fake_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    r->dying = 1;
    fake_region_drain(r, "cuMemFree");
    if (r->kind == FAKE_POOLED) { /* back to its pool, as CUDA's cuMemFree takes it */
        r->dying = 0;
        r->pool_free = 1;
        pthread_mutex_unlock(&fake_lock);
        return CUDA_SUCCESS;
    }
    munmap(r->base, r->size);
    close(r->fd);
    fake_unreserve_bytes(r->device, r->size);
    fake_region_remove(r);
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

/* ---- host registration ----------------------------------------------------------------- */

FAKE_DECLARE(cuMemHostRegister);
static CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    FAKE_ENTER(cuMemHostRegister);
    int device;
    CUresult rc = fake_need_context(&device);
    if (rc != CUDA_SUCCESS)
        return rc;
    uintptr_t a = (uintptr_t)p;
    if (!p || bytesize == 0 || a + bytesize < a ||
        (Flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    if (fake_region_overlapping(a, bytesize, FAKE_HOSTREG))
        rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (fake_region_overlapping(a, bytesize, FAKE_DEVICE_MEMORY | FAKE_RESERVED))
        rc = CUDA_ERROR_INVALID_VALUE;
    else {
        struct fake_region *r = fake_region_add(FAKE_HOSTREG, p, bytesize);
        if (r) {
            r->flags = Flags;
            r->device = device;
        } else
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemHostUnregister);
static CUresult cuMemHostUnregister(void *p)
{
    FAKE_ENTER(cuMemHostUnregister);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)p, FAKE_HOSTREG);
    if (!r || r->dying || r->base != (char *)p) {
        pthread_mutex_unlock(&fake_lock);
        return FAKE_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    r->dying = 1;
    fake_region_drain(r, "cuMemHostUnregister");
    fake_region_remove(r);
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuMemHostGetDevicePointer);
static CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    FAKE_ENTER(cuMemHostGetDevicePointer);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pdptr || !p || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)p, FAKE_HOSTREG);
    if (r && !r->dying)
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuPointerGetAttribute);
static CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    FAKE_ENTER(cuPointerGetAttribute);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)ptr, FAKE_DEVICE_MEMORY | FAKE_HOSTREG);
    if (!r || r->dying || r->pool_free)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
        unsigned int type = r->kind == FAKE_HOSTREG ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        memcpy(data, &type, sizeof(type));
    } else if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        memcpy(data, &r->device, sizeof(r->device));
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

/* ---- IPC ------------------------------------------------------------------------------- */

/* What a CUipcMemHandle carries: enough for another process to reopen the exporter's memfd
 * through /proc/<pid>/fd/<fd> and to check that it is still the same file. */
#define FAKE_IPC_MAGIC   0x46435546u /* "FUCF" */
#define FAKE_IPC_VERSION 1u

struct ipc_blob {
    uint32_t magic;
    uint32_t version;
    int32_t pid;
    int32_t fd;
    uint64_t ino;
    uint64_t size;
    uint64_t offset;
    int32_t device;
    uint32_t check; /* FNV-1a of the fields above */
};
_Static_assert(sizeof(struct ipc_blob) <= FERRY_CU_IPC_HANDLE_SIZE, "IPC blob too large");

static uint32_t blob_check(const struct ipc_blob *b)
{
    const unsigned char *p = (const unsigned char *)b;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < offsetof(struct ipc_blob, check); i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

FAKE_DECLARE(cuIpcGetMemHandle);
static CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    FAKE_ENTER(cuIpcGetMemHandle);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_blob b;
    memset(&b, 0, sizeof(b));
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)dptr, FAKE_ALLOC);
    if (r && !r->dying) {
        b.magic = FAKE_IPC_MAGIC;
        b.version = FAKE_IPC_VERSION;
        b.pid = (int32_t)getpid();
        b.fd = r->fd;
        b.ino = r->ipc_ino;
        b.size = r->size;
        b.offset = (uint64_t)((uintptr_t)dptr - (uintptr_t)r->base);
        b.device = r->device;
        b.check = blob_check(&b);
    } else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    if (rc == CUDA_SUCCESS) {
        memset(pHandle, 0, sizeof(*pHandle));
        memcpy(pHandle->reserved, &b, sizeof(b));
    }
    return rc;
}

/* Maps the exporter's memfd (under fake_lock): the new region, or NULL with *rc set. */
static struct fake_region *ipc_map(const struct ipc_blob *b, CUresult *rc)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)b->pid, (int)b->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        *rc = FAKE_CUDA_ERROR_INVALID_HANDLE; /* the exporter or its allocation is gone */
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != b->ino || st.st_size < 0 ||
        (uint64_t)st.st_size != b->size) {
        close(fd);
        *rc = FAKE_CUDA_ERROR_INVALID_HANDLE; /* the fd now names another file */
        return NULL;
    }
    void *p = mmap(NULL, (size_t)b->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    struct fake_region *r = p != MAP_FAILED ? fake_region_add(FAKE_IPC, p, (size_t)b->size) : NULL;
    if (!r) {
        if (p != MAP_FAILED)
            munmap(p, (size_t)b->size);
        *rc = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    r->device = b->device;
    r->ipc_pid = (pid_t)b->pid;
    r->ipc_fd = b->fd;
    r->ipc_ino = b->ino;
    return r;
}

FAKE_DECLARE(cuIpcOpenMemHandle);
static CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    FAKE_ENTER(cuIpcOpenMemHandle);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pdptr || (Flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_blob b;
    memcpy(&b, handle.reserved, sizeof(b));
    if (b.magic != FAKE_IPC_MAGIC || b.version != FAKE_IPC_VERSION || b.check != blob_check(&b) ||
        b.size == 0 || b.offset >= b.size)
        return CUDA_ERROR_INVALID_VALUE;
    if (b.pid == (int32_t)getpid())
        return FAKE_CUDA_ERROR_INVALID_CONTEXT; /* as CUDA answers in the exporting process */
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = regions;
    while (r && !(r->kind == FAKE_IPC && !r->dying && r->ipc_pid == (pid_t)b.pid &&
                  r->ipc_fd == b.fd && r->ipc_ino == b.ino))
        r = r->next;
    if (r)
        r->ipc_refs++;
    else if ((r = ipc_map(&b, &rc)))
        r->ipc_refs = 1;
    if (r)
        *pdptr = (CUdeviceptr)(uintptr_t)(r->base + b.offset);
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuIpcCloseMemHandle);
static CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FAKE_ENTER(cuIpcCloseMemHandle);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)dptr, FAKE_IPC);
    if (!r || r->dying) {
        pthread_mutex_unlock(&fake_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (--r->ipc_refs == 0) {
        r->dying = 1;
        fake_region_drain(r, "cuIpcCloseMemHandle");
        munmap(r->base, r->size);
        fake_region_remove(r);
    }
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

void fake_register_mem(fake_generic_fn *table)
{
    FAKE_REGISTER(table, cuMemAlloc);
    FAKE_REGISTER(table, cuMemFree);
    FAKE_REGISTER(table, cuMemHostRegister);
    FAKE_REGISTER(table, cuMemHostUnregister);
    FAKE_REGISTER(table, cuMemHostGetDevicePointer);
    FAKE_REGISTER(table, cuPointerGetAttribute);
    FAKE_REGISTER(table, cuIpcGetMemHandle);
    FAKE_REGISTER(table, cuIpcOpenMemHandle);
    FAKE_REGISTER(table, cuIpcCloseMemHandle);
}
