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

typedef struct local_entry {
    struct local_entry *next;
    uint8_t pool_id[16];
    const ferry__cuda_pool *owner;
    ferry__cuda_local info;
} local_entry;

static pthread_mutex_t local_lock = PTHREAD_MUTEX_INITIALIZER;
static local_entry *local_head;
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

ferry_status ferry__cuda_local_add(ferry__cuda_pool *c, const ferry__pool_memory *mem)
{
    pthread_once(&local_once, local_init);
    local_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory", c->transport);
    memcpy(e->pool_id, mem->pool_id, sizeof(e->pool_id));
    e->owner = c;
    e->info.base = c->base;
    e->info.size = mem->memory_size;
    e->info.device = c->device;
    pthread_mutex_lock(&local_lock);
    e->next = local_head;
    local_head = e;
    pthread_mutex_unlock(&local_lock);
    c->local = 1;
    return FERRY_OK;
}

static void local_remove(const ferry__cuda_pool *c)
{
    pthread_mutex_lock(&local_lock);
    for (local_entry **pp = &local_head; *pp; pp = &(*pp)->next) {
        if ((*pp)->owner == c) {
            local_entry *e = *pp;
            *pp = e->next;
            free(e);
            break;
        }
    }
    pthread_mutex_unlock(&local_lock);
}

int ferry__cuda_local_find(const uint8_t pool_id[16], ferry__cuda_local *out)
{
    int found = 0;
    pthread_once(&local_once, local_init);
    pthread_mutex_lock(&local_lock);
    for (local_entry *e = local_head; e && !found; e = e->next) {
        if (memcmp(e->pool_id, pool_id, sizeof(e->pool_id)) == 0) {
            *out = e->info;
            found = 1;
        }
    }
    pthread_mutex_unlock(&local_lock);
    return found;
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
    c->control_words =
        (uint64_t)config->max_inflight_slices * (1 + (uint64_t)config->consumer_count);
    mem->shared_fd = -1;
    mem->shared_size = ferry__header_bytes((uint64_t)config->max_inflight_slices) +
                       (c->device_control ? 0 : data_start);
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
    ferry__segment_layout(mem, c->segment, (uint64_t)config->max_inflight_slices);
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
    if (c->local)
        local_remove(c);
    c->local = 0;
    if (c->registered && ferry__cuda_pool_use_device(c) == FERRY_OK)
        c->cuda->cuMemHostUnregister(c->segment);
    c->registered = 0;
    if (c->segment)
        munmap(c->segment, mem->shared_size);
    c->segment = NULL;
    if (mem->shared_fd >= 0)
        close(mem->shared_fd);
    mem->shared_fd = -1;
    free(c->mirror);
    c->mirror = NULL;
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
    ferry__cuda_pool *c = state_of(mem);
    if (!c->device_control)
        return ferry__host_write_words(mem, first, count, value);
    ferry_status st = ferry__cuda_pool_use_device(c);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(c->cuda, cuMemsetD32, (c->control_dev + first * sizeof(uint32_t), value, count));
    ferry__fill_words(c->mirror + first, count, value);
    return FERRY_OK;
}

ferry_status ferry__cuda_sync_control(ferry__pool_memory *mem)
{
    ferry__cuda_pool *c = state_of(mem);
    if (!c->device_control)
        return FERRY_OK;
    ferry_status st = ferry__cuda_pool_use_device(c);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(
        c->cuda, cuMemcpy,
        ((CUdeviceptr)(uintptr_t)c->mirror, c->control_dev, c->control_words * sizeof(uint32_t)));
    return FERRY_OK;
}

ferry_status ferry__cuda_slice_ptr(ferry__pool_memory *mem, uint64_t offset, void **ptr)
{
    ferry__cuda_pool *c = state_of(mem);
    *ptr = (void *)(uintptr_t)(c->base + mem->data_start + offset);
    return FERRY_OK;
}
