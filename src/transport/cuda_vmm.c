/* CUDA VMM transport: the pool is a cuMemCreate allocation mapped into a reserved range,
 * shared either as a FABRIC handle carried in every descriptor (multi-node NVLink) or as a
 * POSIX file descriptor handed out by a broker of its own (single node, and containers
 * that forbid legacy CUDA IPC). The handle type is chosen per device by a real probe. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/error.h"
#include "pool/pool.h"
#include "transport/cuda_pool.h"

#define VMM_FD_BROKER   "CUDA VMM POSIX FD broker"

typedef struct vmm {
    int type;                            /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR or FABRIC */
    size_t size;                         /* the pool rounded down to the granularity */
    CUmemGenericAllocationHandle handle; /* valid when created */
    int created, reserved, mapped;
    int fd; /* the exported POSIX fd, or -1 */
    ferry__broker *fd_broker;
} vmm;

/* ---- handle type: a real probe per device, cached --------------------------------------- */

typedef struct probe {
    int done;
    int logged; /* the POSIX_FD fallback was logged for this device */
    ferry_status status;
    char error[256];
} probe;

static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static probe probes[FERRY_MAX_DEVICES][2]; /* [device][0 FABRIC, 1 POSIX_FD] */

static CUmemAllocationProp vmm_prop(int device, int type)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = type;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

static ferry_status granularity_of(const ferry__cuda *cuda, int device, int type, size_t *g)
{
    CUmemAllocationProp prop = vmm_prop(device, type);
    FERRY_CU_TRY(cuda, cuMemGetAllocationGranularity, (g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return FERRY_OK;
}

/* A tiny cuMemCreate of one granule with the handle type: the attribute alone can lie. */
static ferry_status try_create(const ferry__cuda *cuda, int device, int type)
{
    size_t g;
    ferry_status st = granularity_of(cuda, device, type, &g);
    if (st != FERRY_OK)
        return st;
    CUmemAllocationProp prop = vmm_prop(device, type);
    CUmemGenericAllocationHandle h;
    FERRY_CU_TRY(cuda, cuMemCreate, (&h, g, &prop, 0));
    cuda->cuMemRelease(h);
    return FERRY_OK;
}

static ferry_status probe_type(const ferry__cuda *cuda, int device, int type, char *why,
                               size_t size)
{
    probe *p = &probes[device][type == CU_MEM_HANDLE_TYPE_FABRIC ? 0 : 1];
    pthread_mutex_lock(&probe_lock);
    if (!p->done) {
        p->status = try_create(cuda, device, type);
        snprintf(p->error, sizeof(p->error), "%s", p->status == FERRY_OK ? "" : ferry_last_error());
        p->done = 1;
    }
    ferry_status st = p->status;
    snprintf(why, size, "%s", p->error);
    pthread_mutex_unlock(&probe_lock);
    return st;
}

/* 1 the first time a device falls back to POSIX_FD in this process: it is logged once. */
static int first_fallback(int device)
{
    pthread_mutex_lock(&probe_lock);
    int first = !probes[device][1].logged;
    probes[device][1].logged = 1;
    pthread_mutex_unlock(&probe_lock);
    return first;
}

static ferry_status choose_type(const ferry__cuda *cuda, int device, int wanted, int *type)
{
    char fabric[256] = "not asked for", posix[256];
    if (wanted != FERRY_VMM_HANDLE_POSIX_FD &&
        probe_type(cuda, device, CU_MEM_HANDLE_TYPE_FABRIC, fabric, sizeof(fabric)) == FERRY_OK) {
        *type = CU_MEM_HANDLE_TYPE_FABRIC;
        return FERRY_OK;
    }
    if (probe_type(cuda, device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, posix, sizeof(posix)) !=
        FERRY_OK)
        return ferry__fail(FERRY_NOT_SUPPORTED,
                           "CUDA VMM multimodal transport found no shareable handle type on "
                           "device %d: FABRIC: %s; POSIX_FD: %s",
                           device, fabric, posix);
    if (wanted == FERRY_VMM_HANDLE_FABRIC)
        return ferry__fail(FERRY_NOT_SUPPORTED,
                           "CUDA VMM multimodal transport selected POSIX_FD, but this pool "
                           "requires FABRIC (%s)",
                           fabric);
    if (wanted == FERRY_VMM_HANDLE_AUTO && first_fallback(device))
        ferry__log(FERRY_LOG_INFO,
                   "CUDA VMM pool on device %d shares POSIX_FD handles (single node): FABRIC "
                   "refused: %s",
                   device, fabric);
    *type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return FERRY_OK;
}

/* ---- construction and release ---------------------------------------------------------- */

static ferry_status round_size(ferry__cuda_pool *c, const ferry_pool_config *config, vmm *v)
{
    size_t g;
    ferry_status st = granularity_of(c->cuda, c->device, v->type, &g);
    if (st != FERRY_OK)
        return st;
    if ((uint64_t)config->memory_size < g)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "memory_size=%lld is smaller than CUDA VMM granularity=%zu",
                           (long long)config->memory_size, g);
    v->size = (size_t)config->memory_size / g * g;
    return FERRY_OK;
}

static ferry_status allocate(ferry__cuda_pool *c, vmm *v)
{
    size_t g;
    ferry_status st = granularity_of(c->cuda, c->device, v->type, &g);
    if (st != FERRY_OK)
        return st;
    CUmemAllocationProp prop = vmm_prop(c->device, v->type);
    FERRY_CU_TRY(c->cuda, cuMemCreate, (&v->handle, v->size, &prop, 0));
    v->created = 1;
    FERRY_CU_TRY(c->cuda, cuMemAddressReserve, (&c->base, v->size, g, 0, 0));
    v->reserved = 1;
    FERRY_CU_TRY(c->cuda, cuMemMap, (c->base, v->size, 0, v->handle, 0));
    v->mapped = 1;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, c->device},
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    FERRY_CU_TRY(c->cuda, cuMemSetAccess, (c->base, v->size, &access, 1));
    return FERRY_OK;
}

static ferry_status export_fabric(ferry__cuda_pool *c, vmm *v, ferry__pool_memory *mem)
{
    uint8_t fabric[64];
    FERRY_CU_TRY(c->cuda, cuMemExportToShareableHandle,
                 (fabric, v->handle, CU_MEM_HANDLE_TYPE_FABRIC, 0));
    memcpy(mem->handle, fabric, sizeof(mem->handle));
    mem->flags |= FERRY_DESC_FLAG_FABRIC;
    return FERRY_OK;
}

static ferry_status export_fd(ferry__cuda_pool *c, const ferry_pool_config *config, vmm *v,
                              ferry__pool_memory *mem)
{
    int fd = -1;
    FERRY_CU_TRY(c->cuda, cuMemExportToShareableHandle,
                 (&fd, v->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    v->fd = fd;
    ferry__broker_config bc = {
        .pool_id = mem->pool_id,
        .shared_fd = v->fd,
        .shared_size = v->size,
        .consumer_count = (uint32_t)config->consumer_count,
        .label = VMM_FD_BROKER,
    };
    /* The broker's name goes in the descriptor's handle field. */
    return ferry__broker_start(&bc, &v->fd_broker, mem->handle);
}

static void vmm_free_device(const ferry__cuda *cuda, CUdeviceptr base, uint64_t size,
                            uint64_t handle)
{
    cuda->cuMemUnmap(base, size);
    cuda->cuMemAddressFree(base, size);
    cuda->cuMemRelease((CUmemGenericAllocationHandle)handle);
}

static void vmm_release(ferry__cuda_pool *c, ferry__pool_memory *mem)
{
    vmm *v = c->backend;
    int borrowed = ferry__cuda_local_retire(c);
    if (v) {
        ferry__broker_stop(v->fd_broker);
        if (v->fd >= 0)
            close(v->fd);
        if (!borrowed && (v->mapped || v->reserved || v->created) &&
            ferry__cuda_pool_use_device(c) == FERRY_OK) {
            if (v->mapped)
                c->cuda->cuMemUnmap(c->base, v->size);
            if (v->reserved)
                c->cuda->cuMemAddressFree(c->base, v->size);
            if (v->created)
                c->cuda->cuMemRelease(v->handle);
        }
        free(v);
    }
    ferry__cuda_pool_release(c, mem);
    free(c);
}

static ferry_status vmm_build(ferry__cuda_pool *c, const ferry_pool_config *config,
                              uint64_t data_start, ferry__pool_memory *mem)
{
    ferry_status st = ferry__cuda_pool_init(c, "CUDA VMM", config, data_start, mem);
    vmm *v = c->backend;
    if (st == FERRY_OK && !c->cuda->cuMemCreate)
        st = ferry__fail(FERRY_NOT_SUPPORTED, "CUDA VMM: this driver has no VMM entry points");
    if (st == FERRY_OK && (config->device < 0 || config->device >= FERRY_MAX_DEVICES))
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "CUDA VMM: device %d is out of range",
                         config->device);
    if (st == FERRY_OK)
        st = choose_type(c->cuda, c->device, config->vmm_handle, &v->type);
    if (st == FERRY_OK)
        st = round_size(c, config, v);
    if (st == FERRY_OK)
        st = allocate(c, v);
    if (st == FERRY_OK)
        st = ferry__cuda_pool_place(c, config, mem);
    if (st == FERRY_OK)
        st = v->type == CU_MEM_HANDLE_TYPE_FABRIC ? export_fabric(c, v, mem)
                                                  : export_fd(c, config, v, mem);
    if (st == FERRY_OK)
        mem->memory_size = v->size;
    if (st == FERRY_OK)
        st = ferry__cuda_local_add(c, mem, vmm_free_device, (uint64_t)v->handle);
    return st;
}

static ferry_status vmm_create(const ferry_pool_config *config, uint64_t data_start,
                               ferry__pool_memory *mem)
{
    ferry__cuda_pool *c = calloc(1, sizeof(*c));
    vmm *v = calloc(1, sizeof(*v));
    if (!c || !v) {
        free(c);
        free(v);
        return ferry__fail(FERRY_NO_MEMORY, "CUDA VMM pool: out of memory");
    }
    v->fd = -1;
    c->backend = v;
    mem->shared_fd = -1;
    ferry_status st = vmm_build(c, config, data_start, mem);
    if (st != FERRY_OK) {
        vmm_release(c, mem); /* every step undone once, the first cause kept */
        uint8_t id[16];
        memcpy(id, mem->pool_id, sizeof(id));
        memset(mem, 0, sizeof(*mem));
        memcpy(mem->pool_id, id, sizeof(id));
        mem->shared_fd = -1;
    }
    return st;
}

static void vmm_destroy(ferry__pool_memory *mem)
{
    if (mem->priv)
        vmm_release(mem->priv, mem);
    memset(mem, 0, sizeof(*mem));
    mem->shared_fd = -1;
}

static void vmm_forget(ferry__pool_memory *mem)
{
    ferry__cuda_pool *c = mem->priv;
    if (c) {
        vmm *v = c->backend;
        ferry__broker_forget(v->fd_broker);
        if (v->fd >= 0)
            close(v->fd);
        free(v);
        ferry__cuda_pool_forget(c, mem);
        free(c);
    }
    memset(mem, 0, sizeof(*mem));
    mem->shared_fd = -1;
}

static ferry_status vmm_check(ferry__pool_memory *mem, char *cause, size_t size)
{
    ferry__cuda_pool *c = mem->priv;
    vmm *v = c->backend;
    if (!v->fd_broker)
        return FERRY_OK;
    return ferry__broker_error(v->fd_broker, cause, size);
}

const ferry__transport_ops ferry__cuda_vmm_transport = {
    .name = "CUDA VMM",
    .pool_name = "CUDA VMM multimodal",
    .backend = FERRY_BACKEND_CUDA_VMM,
    .rounds_size = 1,
    .create = vmm_create,
    .destroy = vmm_destroy,
    .forget = vmm_forget,
    .check = vmm_check,
    FERRY_CUDA_SHARED_OPS,
};

int ferry__vmm_break_broker_for_tests(ferry_pool *pool)
{
    if (pool->ops != &ferry__cuda_vmm_transport)
        return -1;
    ferry__cuda_pool *c = pool->mem.priv;
    vmm *v = c->backend;
    return v->fd_broker ? ferry__broker_shutdown_for_tests(v->fd_broker) : -1;
}
