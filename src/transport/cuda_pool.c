/* The GPU transports' shared part: host segment, control placement, data path. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/error.h"
#include "transport/cuda_pool.h"

static ferry__cuda_pool *state_of(ferry__pool_memory *mem)
{
    return mem->priv;
}

/* ---- pools of this process -------------------------------------------------------------- */

struct ferry__cuda_local {
    ferry__cuda_local *next;
    uint8_t pool_id[16];
    const ferry__cuda_pool *owner; /* NULL once the producer released the pool */
    int refs;                      /* the producer's (until it retires) and one per borrower */
    const ferry__cuda *cuda;
    int device;
    CUdeviceptr base;
    uint64_t size;
    ferry__cuda_free_fn free;
    uint64_t cookie;
};

static pthread_mutex_t local_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry__cuda_local *local_head;
static pthread_once_t local_once = PTHREAD_ONCE_INIT;

/* A forked child created none of its parent's pools: it forgets them (no CUDA, no free of
 * what other threads of the parent may have held: the list is only dropped). */
static void local_after_fork(void)
{
    pthread_mutex_init(&local_lock, NULL);
    local_head = NULL;
}

static void local_init(void)
{
    pthread_atfork(NULL, NULL, local_after_fork);
}

ferry_status ferry__cuda_local_add(ferry__cuda_pool *c, const ferry__pool_memory *mem,
                                   ferry__cuda_free_fn free_device, uint64_t cookie)
{
    pthread_once(&local_once, local_init);
    ferry__cuda_local *e = calloc(1, sizeof(*e));
    if (!e)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory", c->transport);
    memcpy(e->pool_id, mem->pool_id, sizeof(e->pool_id));
    e->owner = c;
    e->refs = 1;
    e->cuda = c->cuda;
    e->device = c->device;
    e->base = c->base;
    e->size = mem->memory_size;
    e->free = free_device;
    e->cookie = cookie;
    pthread_mutex_lock(&local_lock);
    e->next = local_head;
    local_head = e;
    pthread_mutex_unlock(&local_lock);
    c->local = e;
    return FERRY_OK;
}

static void local_unlink_locked(ferry__cuda_local *e)
{
    for (ferry__cuda_local **pp = &local_head; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            return;
        }
    }
}

/* Drops a reference; the last one frees the device memory if the producer left it. */
static void local_drop(ferry__cuda_local *e)
{
    pthread_mutex_lock(&local_lock);
    int last = --e->refs == 0;
    int orphan = last && !e->owner;
    pthread_mutex_unlock(&local_lock);
    if (!last)
        return;
    if (orphan && ferry__cuda_use_device(e->cuda, e->device) == FERRY_OK)
        e->free(e->cuda, e->base, e->size, e->cookie);
    free(e);
}

int ferry__cuda_local_retire(ferry__cuda_pool *c)
{
    ferry__cuda_local *e = c->local;
    if (!e)
        return 0;
    c->local = NULL;
    pthread_mutex_lock(&local_lock);
    local_unlink_locked(e); /* no new borrower */
    int borrowed = e->refs > 1;
    e->owner = borrowed ? NULL : e->owner;
    pthread_mutex_unlock(&local_lock);
    if (!borrowed) {
        free(e); /* the only reference: the transport frees its memory itself */
        return 0;
    }
    local_drop(e);
    return 1;
}

int ferry__cuda_local_find(const uint8_t pool_id[16], ferry__cuda_local **entry, CUdeviceptr *base,
                           uint64_t *size, int *device)
{
    ferry__cuda_local *found = NULL;
    pthread_once(&local_once, local_init);
    pthread_mutex_lock(&local_lock);
    for (ferry__cuda_local *e = local_head; e && !found; e = e->next) {
        if (memcmp(e->pool_id, pool_id, sizeof(e->pool_id)) == 0) {
            found = e;
            e->refs++;
        }
    }
    pthread_mutex_unlock(&local_lock);
    if (!found)
        return 0;
    *entry = found;
    *base = found->base;
    *size = found->size;
    *device = found->device;
    return 1;
}

void ferry__cuda_local_put(ferry__cuda_local *entry)
{
    if (entry)
        local_drop(entry);
}

ferry_status ferry__cuda_pool_use_device(ferry__cuda_pool *c)
{
    return ferry__cuda_use_device(c->cuda, c->device);
}

ferry_status ferry__cuda_pool_init(ferry__cuda_pool *c, const char *transport,
                                   const ferry_pool_config *config, uint64_t data_start,
                                   ferry__pool_memory *mem)
{
    ferry_status st = ferry__cuda_get(&c->cuda);
    if (st != FERRY_OK)
        return ferry__fail_wrap(st, "%s pool needs the CUDA driver", transport);
    c->transport = transport;
    c->device = config->device;
    c->device_control = config->control_placement == FERRY_CONTROL_DEVICE;
    c->place = c->device_control ? &ferry__device_placement : &ferry__host_placement;
    c->control_words =
        (uint64_t)config->max_inflight_slices * (1 + (uint64_t)config->consumer_count);
    mem->shared_fd = -1;
    mem->shared_size = ferry__header_bytes_of(config) + (c->device_control ? 0 : data_start);
    mem->data_start = data_start;
    mem->device = config->device;
    mem->priv = c;
    return ferry__cuda_pool_use_device(c);
}

/* Host placement: control words in the segment, registered so that streams can reach them. */
static ferry_status control_on_host(ferry__cuda_pool *c, ferry__pool_memory *mem,
                                    uint32_t first_generation)
{
    ferry__fill_words(mem->control, c->control_words, first_generation);
    FERRY_CU_TRY(
        c->cuda, cuMemHostRegister,
        (c->segment, mem->shared_size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    c->registered = 1;
    CUdeviceptr seg;
    FERRY_CU_TRY(c->cuda, cuMemHostGetDevicePointer, (&seg, c->segment, 0));
    c->control_dev = seg + (CUdeviceptr)((uint8_t *)mem->control - (uint8_t *)c->segment);
    return FERRY_OK;
}

/* Device placement: control words at the start of the pool, a host mirror for reading. */
static ferry_status control_on_device(ferry__cuda_pool *c, ferry__pool_memory *mem,
                                      uint32_t first_generation)
{
    c->mirror = malloc(c->control_words * sizeof(uint32_t));
    if (!c->mirror)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory for the control mirror",
                           c->transport);
    ferry__fill_words(c->mirror, c->control_words, first_generation);
    mem->control = c->mirror;
    c->control_dev = c->base;
    FERRY_CU_TRY(c->cuda, cuMemsetD32, (c->base, first_generation, c->control_words));
    ferry_status st = ferry__cuda_io_stream(c->cuda, &c->io);
    if (st != FERRY_OK)
        return st;
    mem->flags |= FERRY_DESC_FLAG_DEVICE_CONTROL;
    return FERRY_OK;
}

ferry_status ferry__cuda_pool_place(ferry__cuda_pool *c, const ferry_pool_config *config,
                                    ferry__pool_memory *mem)
{
    ferry_status st =
        ferry__segment_create(c->transport, mem->shared_size, &mem->shared_fd, &c->segment);
    if (st != FERRY_OK)
        return st;
    ferry__segment_layout(mem, c->segment, config);
    return c->device_control ? control_on_device(c, mem, config->initial_generation)
                             : control_on_host(c, mem, config->initial_generation);
}

void ferry__cuda_pool_forget(ferry__cuda_pool *c, ferry__pool_memory *mem)
{
    if (c->segment)
        munmap(c->segment, mem->shared_size);
    c->segment = NULL;
    if (mem->shared_fd >= 0)
        close(mem->shared_fd);
    mem->shared_fd = -1;
    free(c->mirror);
    c->mirror = NULL;
}

void ferry__cuda_pool_release(ferry__cuda_pool *c, ferry__pool_memory *mem)
{
    if (c->io && ferry__cuda_pool_use_device(c) == FERRY_OK)
        c->cuda->cuStreamDestroy(c->io);
    c->io = NULL;
    if (c->registered && ferry__cuda_pool_use_device(c) == FERRY_OK)
        c->cuda->cuMemHostUnregister(c->segment);
    c->registered = 0;
    ferry__cuda_pool_forget(c, mem); /* what is left is the process's own: mapping, fd, mirror */
}

ferry_status ferry__cuda_copy_in(ferry__pool_memory *mem, uint64_t offset, const void *src,
                                 uint64_t n, void *stream)
{
    ferry__cuda_pool *c = state_of(mem);
    ferry_status st = ferry__cuda_pool_use_device(c);
    if (st != FERRY_OK)
        return st;
    CUdeviceptr dst = c->base + mem->data_start + offset;
    FERRY_CU_TRY(c->cuda, cuMemcpyAsync, (dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream));
    return FERRY_OK;
}

ferry_status ferry__cuda_mark_ready(ferry__pool_memory *mem, uint64_t word, uint32_t generation,
                                    void *stream)
{
    ferry__cuda_pool *c = state_of(mem);
    ferry_status st = ferry__cuda_pool_use_device(c);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(c->cuda, cuStreamWriteValue32,
                 ((CUstream)stream, c->control_dev + word * sizeof(uint32_t), generation,
                  CU_STREAM_WRITE_VALUE_DEFAULT));
    return FERRY_OK;
}

ferry_status ferry__cuda_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                     uint32_t value)
{
    return state_of(mem)->place->write_words(mem, first, count, value);
}

ferry_status ferry__cuda_sync_control(ferry__pool_memory *mem)
{
    return state_of(mem)->place->sync(mem);
}

ferry_status ferry__cuda_device_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                            uint32_t value)
{
    ferry__cuda_pool *c = state_of(mem);
    ferry_status st = ferry__cuda_pool_use_device(c);
    if (st != FERRY_OK)
        return st;
    st = ferry__cuda_words_write(c->cuda, c->io, c->control_dev + first * sizeof(uint32_t), count,
                                 value);
    if (st == FERRY_OK)
        ferry__fill_words(c->mirror + first, count, value);
    return st;
}

ferry_status ferry__cuda_device_sync(ferry__pool_memory *mem)
{
    ferry__cuda_pool *c = state_of(mem);
    ferry_status st = ferry__cuda_pool_use_device(c);
    if (st != FERRY_OK)
        return st;
    return ferry__cuda_words_read(c->cuda, c->io, c->mirror, c->control_dev,
                                  c->control_words * sizeof(uint32_t));
}

ferry_status ferry__cuda_slice_ptr(ferry__pool_memory *mem, uint64_t offset, void **ptr)
{
    ferry__cuda_pool *c = state_of(mem);
    *ptr = (void *)(uintptr_t)(c->base + mem->data_start + offset);
    return FERRY_OK;
}

/* The host segment and the device pool; the control words in one or the other. */
void ferry__cuda_memory_map(const ferry__pool_memory *mem, ferry__memory_map *map)
{
    const ferry__cuda_pool *c = mem->priv;
    *map = (ferry__memory_map){
        .base = {c->segment, (void *)(uintptr_t)c->base},
        .size = {mem->shared_size, mem->memory_size},
        .gpu = {0, 1},
        .control_region = c->device_control,
        .control_offset = c->device_control
                              ? 0
                              : (uint64_t)((const uint8_t *)mem->control - (uint8_t *)c->segment),
        .data_region = 1,
        .data_offset = mem->data_start,
    };
}
