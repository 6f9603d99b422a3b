/* The fake CUDA driver's virtual memory management: allocation handles are memfds
 * ("ferry-fake-cuda:vmm:devN"), address reservations are PROT_NONE mappings, cuMemMap maps
 * the memfd over a reservation, and POSIX file descriptor handles are dups of the memfd.
 * FABRIC handles are refused with CUDA_ERROR_NOT_PERMITTED, as on a machine without an IMEX
 * channel, although the devices claim HANDLE_TYPE_FABRIC_SUPPORTED. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cuda.h"

#define FAKE_GRANULARITY                          ((size_t)2 << 20)
#define FAKE_VMM_NAME                             "ferry-fake-cuda:vmm:dev"
#define FAKE_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1
#define FAKE_CU_MEM_ACCESS_FLAGS_PROT_NONE        0x0
#define FAKE_CU_MEM_ACCESS_FLAGS_PROT_READ        0x1

struct fake_vmm_handle {
    struct fake_vmm_handle *next;
    int fd;
    size_t size;
    int device;
    int types;     /* requestedHandleTypes */
    int released;  /* cuMemRelease was called */
    unsigned maps; /* cuMemMap mappings not yet unmapped */
};

static struct fake_vmm_handle *handles;

int fake_live_vmm_handles(void)
{
    int n = 0;
    for (struct fake_vmm_handle *h = handles; h; h = h->next)
        n += !h->released;
    return n;
}

/* The unreleased handle a value names (under fake_lock), or NULL. */
static struct fake_vmm_handle *handle_lookup(CUmemGenericAllocationHandle value)
{
    for (struct fake_vmm_handle *h = handles; h; h = h->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)h == value && !h->released)
            return h;
    return NULL;
}

/* Frees h once it is released and unmapped (under fake_lock). */
static void handle_put(struct fake_vmm_handle *h)
{
    if (!h->released || h->maps)
        return;
    for (struct fake_vmm_handle **at = &handles; *at; at = &(*at)->next)
        if (*at == h) {
            *at = h->next;
            break;
        }
    close(h->fd);
    fake_unreserve_bytes(h->device, h->size);
    free(h);
}

/* A new handle over fd (which it owns) (under fake_lock), or NULL. */
static struct fake_vmm_handle *handle_new(int fd, size_t size, int device, int types)
{
    struct fake_vmm_handle *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->fd = fd;
    h->size = size;
    h->device = device;
    h->types = types;
    h->next = handles;
    handles = h;
    return h;
}

static CUresult check_prop(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= fake_device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

static int aligned(uintptr_t v)
{
    return v % FAKE_GRANULARITY == 0;
}

FAKE_DECLARE(cuMemGetAllocationGranularity);
static CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              int option)
{
    FAKE_ENTER(cuMemGetAllocationGranularity);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != FAKE_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    rc = check_prop(prop);
    if (rc == CUDA_SUCCESS)
        *granularity = FAKE_GRANULARITY;
    return rc;
}

FAKE_DECLARE(cuMemCreate);
static CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    FAKE_ENTER(cuMemCreate);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle || flags != 0 || size == 0 || !aligned(size))
        return CUDA_ERROR_INVALID_VALUE;
    rc = check_prop(prop);
    if (rc != CUDA_SUCCESS)
        return rc;
    int types = prop->requestedHandleTypes;
    if (types & CU_MEM_HANDLE_TYPE_FABRIC)
        return CUDA_ERROR_NOT_PERMITTED; /* no IMEX channel, as on the real machine */
    if (types & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int device = prop->location.id;
    pthread_mutex_lock(&fake_lock);
    rc = fake_reserve_bytes(device, size);
    pthread_mutex_unlock(&fake_lock);
    if (rc != CUDA_SUCCESS)
        return rc;
    char name[64];
    snprintf(name, sizeof(name), FAKE_VMM_NAME "%d", device);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        fd = -1;
    }
    pthread_mutex_lock(&fake_lock);
    struct fake_vmm_handle *h = fd >= 0 ? handle_new(fd, size, device, types) : NULL;
    if (!h) {
        fake_unreserve_bytes(device, size);
        if (fd >= 0)
            close(fd);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemRelease);
static CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FAKE_ENTER(cuMemRelease);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct fake_vmm_handle *h = handle_lookup(handle);
    if (h) {
        h->released = 1; /* the memory lives on while mapped */
        handle_put(h);
    } else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemAddressReserve);
static CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    FAKE_ENTER(cuMemAddressReserve);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ptr || size == 0 || !aligned(size) || flags != 0 || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > FAKE_GRANULARITY ? alignment : FAKE_GRANULARITY;
    if (size > SIZE_MAX - align)
        return CUDA_ERROR_OUT_OF_MEMORY;
    const int prot = PROT_NONE, mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    char *base = MAP_FAILED;
    if (addr && addr % align == 0) { /* the address asked for, if free */
        base = mmap((void *)(uintptr_t)addr, size, prot, mflags | MAP_FIXED_NOREPLACE, -1, 0);
        if (base != MAP_FAILED && base != (char *)(uintptr_t)addr) {
            munmap(base, size);
            base = MAP_FAILED;
        }
    }
    if (base == MAP_FAILED) {
        char *raw = mmap(NULL, size + align, prot, mflags, -1, 0);
        if (raw == MAP_FAILED)
            return CUDA_ERROR_OUT_OF_MEMORY;
        base = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
        if (base > raw)
            munmap(raw, (size_t)(base - raw));
        if (raw + size + align > base + size)
            munmap(base + size, (size_t)(raw + size + align - (base + size)));
    }
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_add(FAKE_RESERVED, base, size);
    pthread_mutex_unlock(&fake_lock);
    if (!r) {
        munmap(base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)(uintptr_t)base;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuMemAddressFree);
static CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FAKE_ENTER(cuMemAddressFree);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)ptr, FAKE_RESERVED);
    /* Stricter than CUDA's documentation says: mappings must be gone first. */
    if (!r || (uintptr_t)r->base != ptr || r->size != size ||
        fake_region_overlapping((uintptr_t)ptr, size, FAKE_VMM))
        rc = CUDA_ERROR_INVALID_VALUE;
    else {
        munmap(r->base, r->size);
        fake_region_remove(r);
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemMap);
static CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    FAKE_ENTER(cuMemMap);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags != 0 || size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_vmm_handle *h = handle_lookup(handle);
    struct fake_region *res = fake_region_at((uintptr_t)ptr, FAKE_RESERVED);
    struct fake_region *r = NULL;
    if (!h || offset > h->size || size > h->size - offset || !res ||
        size > res->size - ((uintptr_t)ptr - (uintptr_t)res->base) ||
        fake_region_overlapping((uintptr_t)ptr, size, FAKE_VMM))
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                  h->fd, (off_t)offset) == MAP_FAILED)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (!(r = fake_region_add(FAKE_VMM, (void *)(uintptr_t)ptr, size))) {
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        r->handle = h;
        r->device = h->device;
        h->maps++;
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemUnmap);
static CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FAKE_ENTER(cuMemUnmap);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (size == 0 || !aligned(ptr) || !aligned(size))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    /* Whole mappings inside one reservation: every mapping the range touches must lie in it. */
    struct fake_region *res = fake_region_at((uintptr_t)ptr, FAKE_RESERVED), *r;
    int found = 0, ok = res && size <= res->size - ((uintptr_t)ptr - (uintptr_t)res->base);
    uintptr_t end = (uintptr_t)ptr + size;
    for (uintptr_t p = (uintptr_t)ptr; ok && p < end; p += FAKE_GRANULARITY)
        if ((r = fake_region_at(p, FAKE_VMM))) {
            ok = !r->dying && (uintptr_t)r->base >= (uintptr_t)ptr &&
                 r->size <= end - (uintptr_t)r->base;
            found = 1;
            p = (uintptr_t)r->base + r->size - FAKE_GRANULARITY;
        }
    if (!ok || !found) {
        pthread_mutex_unlock(&fake_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    while ((r = fake_region_overlapping((uintptr_t)ptr, size, FAKE_VMM))) {
        r->dying = 1;
        fake_region_drain(r, "cuMemUnmap");
        /* Back to reserved address space. */
        mmap(r->base, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
        struct fake_vmm_handle *h = r->handle;
        fake_region_remove(r);
        h->maps--;
        handle_put(h);
    }
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuMemSetAccess);
static CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    FAKE_ENTER(cuMemSetAccess);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int access = 0;
    for (size_t i = 0; i < count; i++) {
        int f = desc[i].flags;
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.id < 0 || desc[i].location.id >= fake_device_count())
            return CUDA_ERROR_INVALID_DEVICE;
        if (f != FAKE_CU_MEM_ACCESS_FLAGS_PROT_NONE && f != FAKE_CU_MEM_ACCESS_FLAGS_PROT_READ &&
            f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        access |= f != FAKE_CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    pthread_mutex_lock(&fake_lock);
    /* The range must be mapped throughout. */
    uintptr_t end = (uintptr_t)ptr + size;
    struct fake_region *r;
    for (uintptr_t p = (uintptr_t)ptr; p < end && rc == CUDA_SUCCESS;)
        if (!(r = fake_region_at(p, FAKE_VMM)) || r->dying)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            p = (uintptr_t)r->base + r->size;
    for (uintptr_t p = (uintptr_t)ptr; p < end && rc == CUDA_SUCCESS;) {
        r = fake_region_at(p, FAKE_VMM);
        r->accessible = access;
        p = (uintptr_t)r->base + r->size;
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemExportToShareableHandle);
static CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                             CUmemGenericAllocationHandle handle, int handleType,
                                             unsigned long long flags)
{
    FAKE_ENTER(cuMemExportToShareableHandle);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_vmm_handle *h = handle_lookup(handle);
    int fd = -1;
    if (!h)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (handleType == CU_MEM_HANDLE_TYPE_FABRIC)
        rc = CUDA_ERROR_NOT_PERMITTED;
    else if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        rc = CUDA_ERROR_NOT_SUPPORTED;
    else if (!(h->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        rc = CUDA_ERROR_INVALID_VALUE; /* not requested at cuMemCreate */
    else if ((fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0)) < 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&fake_lock);
    if (rc == CUDA_SUCCESS)
        memcpy(shareableHandle, &fd, sizeof(fd));
    return rc;
}

/* The device a memfd of cuMemCreate was made for, from its name; -1 if fd is not one. */
static int vmm_fd_device(int fd)
{
    char path[64], link[256];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n <= 0)
        return -1;
    link[n] = '\0';
    const char *prefix = "/memfd:" FAKE_VMM_NAME;
    if (strncmp(link, prefix, strlen(prefix)) != 0)
        return -1;
    return atoi(link + strlen(prefix));
}

FAKE_DECLARE(cuMemImportFromShareableHandle);
static CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               int shHandleType)
{
    FAKE_ENTER(cuMemImportFromShareableHandle);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC)
        return CUDA_ERROR_NOT_PERMITTED;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* The file descriptor travels in the pointer's value, as CUDA expects. */
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    int device = fd >= 0 ? vmm_fd_device(fd) : -1;
    if (device < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 || !aligned((size_t)st.st_size))
        return CUDA_ERROR_INVALID_VALUE;
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fake_lock);
    /* Imported memory is accounted to this process's device too (CUDA maps it there). */
    rc = fake_reserve_bytes(device, (size_t)st.st_size);
    struct fake_vmm_handle *h = NULL;
    if (rc == CUDA_SUCCESS && !(h = handle_new(dup, (size_t)st.st_size, device,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))) {
        fake_unreserve_bytes(device, (size_t)st.st_size);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&fake_lock);
    if (!h) {
        close(dup);
        return rc;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

void fake_register_vmm(fake_generic_fn *table)
{
    FAKE_REGISTER(table, cuMemGetAllocationGranularity);
    FAKE_REGISTER(table, cuMemCreate);
    FAKE_REGISTER(table, cuMemRelease);
    FAKE_REGISTER(table, cuMemAddressReserve);
    FAKE_REGISTER(table, cuMemAddressFree);
    FAKE_REGISTER(table, cuMemMap);
    FAKE_REGISTER(table, cuMemUnmap);
    FAKE_REGISTER(table, cuMemSetAccess);
    FAKE_REGISTER(table, cuMemExportToShareableHandle);
    FAKE_REGISTER(table, cuMemImportFromShareableHandle);
}
