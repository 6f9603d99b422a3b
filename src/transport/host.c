/* Host transport: the whole segment (header, generations, control table, data) is one memfd
 * that consumers receive from the broker and map once. Also the host-memory pieces that the
 * GPU transports share. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/atomic.h"
#include "common/error.h"
#include "shm/signal.h"
#include "transport/transport.h"

ferry_status ferry__segment_create(const char *transport, uint64_t size, int *fd_out,
                                   void **base_out)
{
    ferry_status st;
    int fd = memfd_create("ferry-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "%s pool: memfd_create failed", transport);
    if (ftruncate(fd, (off_t)size) != 0) {
        st = ferry__fail_errno(FERRY_NO_MEMORY, errno, "%s pool: ftruncate to %llu bytes failed",
                               transport, (unsigned long long)size);
        goto close_fd;
    }
    /* The size is fixed for the pool's life: consumers may rely on it. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        st = ferry__fail_errno(FERRY_SYSTEM, errno, "%s pool: sealing the memfd failed", transport);
        goto close_fd;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        st = ferry__fail_errno(FERRY_NO_MEMORY, errno, "%s pool: mmap of %llu bytes failed",
                               transport, (unsigned long long)size);
        goto close_fd;
    }
    *fd_out = fd;
    *base_out = base;
    return FERRY_OK;
close_fd:
    close(fd);
    return st;
}

void ferry__segment_layout(ferry__pool_memory *mem, void *base, const ferry_pool_config *config)
{
    ferry__shm_layout_init(&mem->shm.layout, config);
    ferry__shm_map(&mem->shm, base);
    mem->control = (uint32_t *)((uint8_t *)base + mem->shm.layout.header_bytes);
}

void ferry__fill_words(uint32_t *words, uint64_t count, uint32_t value)
{
    for (uint64_t i = 0; i < count; i++)
        words[i] = value;
}

ferry_status ferry__host_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                     uint32_t value)
{
    for (uint32_t i = 0; i < count; i++)
        ferry__store_release32(&mem->control[first + i], value);
    return FERRY_OK;
}

ferry_status ferry__host_sync_control(ferry__pool_memory *mem)
{
    (void)mem;
    return FERRY_OK;
}

static ferry_status host_create(const ferry_pool_config *config, uint64_t data_start,
                                ferry__pool_memory *mem)
{
    uint64_t max_inflight = (uint64_t)config->max_inflight_slices;
    uint64_t size = ferry__header_bytes_of(config) + (uint64_t)config->memory_size;
    void *base = NULL;
    ferry_status st = ferry__segment_create("host", size, &mem->shared_fd, &base);
    if (st != FERRY_OK)
        return st;
    ferry__segment_layout(mem, base, config);
    ferry__fill_words(mem->control, max_inflight * (1 + (uint64_t)config->consumer_count),
                      config->initial_generation);
    mem->data_start = data_start;
    mem->memory_size = (uint64_t)config->memory_size;
    mem->shared_size = size;
    mem->device = -1;
    mem->priv = base;
    return FERRY_OK;
}

static void host_destroy(ferry__pool_memory *mem)
{
    if (mem->priv)
        munmap(mem->priv, mem->shared_size);
    if (mem->shared_fd >= 0)
        close(mem->shared_fd);
    memset(mem, 0, sizeof(*mem));
    mem->shared_fd = -1;
}

/* The host transport owns nothing but its mapping and its fd: forgetting is destroying. */
static void host_forget(ferry__pool_memory *mem)
{
    host_destroy(mem);
}

static ferry_status host_check(ferry__pool_memory *mem, char *cause, size_t size)
{
    (void)mem;
    (void)cause;
    (void)size;
    return FERRY_OK;
}

static uint8_t *host_data(ferry__pool_memory *mem)
{
    return (uint8_t *)mem->control + mem->data_start;
}

static ferry_status host_copy_in(ferry__pool_memory *mem, uint64_t offset, const void *src,
                                 uint64_t n, void *stream)
{
    if (stream)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "host pool: a stream needs a GPU pool");
    if (n)
        memcpy(host_data(mem) + offset, src, n);
    return FERRY_OK;
}

static ferry_status host_mark_ready(ferry__pool_memory *mem, uint64_t word, uint32_t generation,
                                    void *stream)
{
    if (stream)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "host pool: a stream needs a GPU pool");
    ferry__shm_ready_store(&mem->shm, &mem->control[word], generation);
    return FERRY_OK;
}

static ferry_status host_slice_ptr(ferry__pool_memory *mem, uint64_t offset, void **ptr)
{
    *ptr = host_data(mem) + offset;
    return FERRY_OK;
}

/* ---- control words in host shared memory (every transport's default placement) -------- */

static ferry_status words_open(ferry__mapped_pool *p)
{
    p->control = (uint32_t *)((uint8_t *)p->base + p->shm.layout.header_bytes);
    return FERRY_OK;
}

static void words_close(ferry__mapped_pool *p)
{
    p->control = NULL;
}

static ferry_status words_load(ferry__mapped_pool *p, int device, uint64_t word, uint32_t *value)
{
    (void)device;
    *value = ferry__load_acquire32(&p->control[word]);
    return FERRY_OK;
}

static ferry_status words_load_ack(ferry__mapped_pool *p, int device, uint32_t slot, uint32_t rank,
                                   uint32_t *value)
{
    return words_load(p, device, ferry__shm_ack_word(&p->shm.layout, slot, rank), value);
}

static ferry_status words_replace(ferry__mapped_pool *p, int device, uint64_t word,
                                  uint32_t *expected, uint32_t value, int *done)
{
    (void)device;
    *done = ferry__cas_acqrel32(&p->control[word], expected, value);
    return FERRY_OK;
}

static void words_note_ack(ferry__mapped_pool *p, uint32_t slot, uint32_t rank, uint32_t gen)
{
    (void)p;
    (void)slot;
    (void)rank;
    (void)gen;
}

static int words_seen(const ferry__mapped_pool *p, uint64_t word, uint32_t value)
{
    return ferry__load_acquire32(&p->control[word]) == value;
}

static void words_sleep(ferry__mapped_pool *p, uint64_t word, uint32_t seen, uint64_t ns)
{
    ferry__shm_sleep_on_ready(&p->shm, &p->control[word], seen, ns);
}

const ferry__placement ferry__host_placement = {
    .name = "host",
    .open = words_open,
    .close = words_close,
    .load = words_load,
    .load_ack = words_load_ack,
    .replace = words_replace,
    .replace_compares = 1,
    .note_ack = words_note_ack,
    .seen = words_seen,
    .sleep = words_sleep,
    .write_words = ferry__host_write_words,
    .sync = ferry__host_sync_control,
};

/* ---- the consumer side: the whole pool region lives in the segment ---------------------- */

static const char *host_view_check(const ferry__shm_layout *l, uint64_t *tail)
{
    if (l->device >= 0 || (l->desc_flags & FERRY_DESC_FLAG_DEVICE_CONTROL))
        return "placement differs";
    *tail = l->memory_size;
    return NULL;
}

static const ferry__placement *host_view_placement(const ferry__shm_layout *l)
{
    (void)l;
    return &ferry__host_placement;
}

static ferry_status host_view_attach(ferry__mapped_pool *p, int device)
{
    (void)device;
    p->data = (uint8_t *)p->base + p->shm.layout.header_bytes + p->shm.layout.data_start;
    return FERRY_OK;
}

static void host_view_detach(ferry__mapped_pool *p)
{
    p->data = NULL;
}

static ferry_status host_view_map(ferry__mapped_pool *p, int device, uint64_t deadline)
{
    (void)p;
    (void)device;
    (void)deadline;
    return FERRY_OK;
}

static ferry_status host_view_copy_out(ferry__mapped_pool *p, int device, uint64_t offset,
                                       void *dst, uint64_t n)
{
    (void)device;
    if (n)
        memcpy(dst, p->data + offset, n);
    return FERRY_OK;
}

static ferry_status host_view_data(ferry__mapped_pool *p, int device, uint64_t offset,
                                   const void **data)
{
    (void)device;
    *data = p->data + offset;
    return FERRY_OK;
}

static ferry_status no_streams(void)
{
    return ferry__fail(FERRY_NOT_SUPPORTED, "stream-ordered operations need a GPU pool");
}

/* A host pool is given no stream work: nothing to track or wait for. */
static void host_view_track(ferry__mapped_pool *p, int device, uint32_t rank, void *stream)
{
    (void)p;
    (void)device;
    (void)rank;
    (void)stream;
}

static ferry_status host_view_quiesce(ferry__mapped_pool *p, uint32_t rank, uint64_t deadline)
{
    (void)p;
    (void)rank;
    (void)deadline;
    return FERRY_OK;
}

static ferry_status host_view_streams(const ferry__mapped_pool *p)
{
    (void)p;
    return no_streams();
}

static ferry_status host_view_enqueue_word(ferry__mapped_pool *p, int device, uint64_t word,
                                           uint32_t value, void *stream)
{
    (void)p;
    (void)device;
    (void)word;
    (void)value;
    (void)stream;
    return no_streams();
}

static ferry_status host_view_enqueue_copy(ferry__mapped_pool *p, int device, uint64_t offset,
                                           void *dst, uint64_t n, void *stream)
{
    (void)p;
    (void)device;
    (void)offset;
    (void)dst;
    (void)n;
    (void)stream;
    return no_streams();
}

/* One region: the whole memfd, control words and data after the header. */
static void host_memory_map(const ferry__pool_memory *mem, ferry__memory_map *map)
{
    *map = (ferry__memory_map){
        .base = {mem->priv, NULL},
        .size = {mem->shared_size, 0},
        .control_offset = mem->shm.layout.header_bytes,
        .data_offset = mem->shm.layout.header_bytes + mem->data_start,
    };
}

const ferry__transport_ops ferry__host_transport = {
    .name = "host",
    .pool_name = "host",
    .backend = FERRY_BACKEND_HOST,
    .gpu = 0,
    .device_placement = 0,
    .rounds_size = 0,
    .space_poll_ns = 100000000ull,
    .create = host_create,
    .destroy = host_destroy,
    .forget = host_forget,
    .check = host_check,
    .copy_in = host_copy_in,
    .mark_ready = host_mark_ready,
    .write_words = ferry__host_write_words,
    .sync_control = ferry__host_sync_control,
    .slice_ptr = host_slice_ptr,
    .memory_map = host_memory_map,
    .ready_poll_ns = 10000000ull,
    .ready_spin_ns = 0,
    .view_check = host_view_check,
    .view_placement = host_view_placement,
    .view_attach = host_view_attach,
    .view_detach = host_view_detach,
    .view_track = host_view_track,
    .view_quiesce = host_view_quiesce,
    .view_map = host_view_map,
    .view_copy_out = host_view_copy_out,
    .view_data = host_view_data,
    .view_streams = host_view_streams,
    .view_enqueue_wait = host_view_enqueue_word,
    .view_enqueue_copy = host_view_enqueue_copy,
    .view_enqueue_store = host_view_enqueue_word,
};

ferry_status ferry__transport_of(uint32_t backend, const ferry__transport_ops **ops)
{
    switch (backend) {
    case FERRY_BACKEND_HOST:
        *ops = &ferry__host_transport;
        return FERRY_OK;
    case FERRY_BACKEND_CUDA_IPC:
        *ops = &ferry__cuda_ipc_transport;
        return FERRY_OK;
    case FERRY_BACKEND_CUDA_VMM:
        *ops = &ferry__cuda_vmm_transport;
        return FERRY_OK;
    default:
        return ferry__fail(FERRY_MISMATCH, "pool has unknown backend %u", backend);
    }
}

int ferry_backend_uses_gpu(ferry_backend backend)
{
    const ferry__transport_ops *ops;
    if (backend < FERRY_BACKEND_HOST || backend > FERRY_BACKEND_CUDA_VMM) /* auto, unknown */
        return 0;
    return ferry__transport_of((uint32_t)backend, &ops) == FERRY_OK && ops->gpu;
}

ferry_status ferry__transport_select(ferry_backend backend, const ferry__transport_ops **ops)
{
    switch (backend) {
    case FERRY_BACKEND_AUTO:
    case FERRY_BACKEND_HOST:
        *ops = &ferry__host_transport;
        return FERRY_OK;
    case FERRY_BACKEND_CUDA_IPC:
        *ops = &ferry__cuda_ipc_transport;
        return FERRY_OK;
    case FERRY_BACKEND_CUDA_VMM:
        *ops = &ferry__cuda_vmm_transport;
        return FERRY_OK;
    }
    return ferry__fail(FERRY_INVALID_ARGUMENT, "unknown backend %d", (int)backend);
}
