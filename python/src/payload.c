/* Received memory, and the leases that views hold. Everything here may run on any thread,
 * without the GIL, even after the interpreter finalised: a DLPack deleter runs whenever the
 * consumer's framework frees its tensor. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

/* ---- host copies' memory ----------------------------------------------------------------
 *
 * Buffers of FY_HOST_REUSE_MIN bytes or more are kept for reuse when freed (a few, at most
 * FY_HOST_REUSE_BYTES in all): malloc serves such sizes with fresh mappings past its threshold
 * (32 MiB at most), and touching a fresh 64 MiB mapping costs more page faults than the copy
 * itself. A kept buffer serves a request of at least half its size. */

#define FY_HOST_REUSE_MIN   (1u << 20)
#define FY_HOST_REUSE_BYTES (256ull << 20)
#define FY_HOST_REUSE_SLOTS 4

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t size;
} host_kept[FY_HOST_REUSE_SLOTS];
static uint64_t host_kept_bytes;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

/* A forked child may inherit the lock held: it starts with a lock of its own (what was kept
 * is left to it, unused). */
static void host_after_fork(void)
{
    pthread_mutex_init(&host_lock, NULL);
    memset(host_kept, 0, sizeof(host_kept));
    host_kept_bytes = 0;
}

static void host_init(void)
{
    pthread_atfork(NULL, NULL, host_after_fork);
}

/* The smallest kept buffer that serves size bytes, taken out (under host_lock), or NULL. */
static void *host_take_kept(size_t size, size_t *got)
{
    int best = -1;
    for (int i = 0; i < FY_HOST_REUSE_SLOTS; i++)
        if (host_kept[i].p && host_kept[i].size >= size && host_kept[i].size / 2 <= size &&
            (best < 0 || host_kept[i].size < host_kept[best].size))
            best = i;
    if (best < 0)
        return NULL;
    void *p = host_kept[best].p;
    *got = host_kept[best].size;
    host_kept_bytes -= *got;
    host_kept[best].p = NULL;
    return p;
}

void *fy_host_buffer(uint64_t nbytes, uint64_t *size)
{
    size_t n = (size_t)((nbytes + 63) & ~(uint64_t)63);
    n = n ? n : 64;
    void *p = NULL;
    size_t got = n;
    if (n >= FY_HOST_REUSE_MIN) {
        pthread_once(&host_once, host_init);
        pthread_mutex_lock(&host_lock);
        p = host_take_kept(n, &got);
        pthread_mutex_unlock(&host_lock);
    }
    if (!p)
        p = aligned_alloc(64, got = n);
    *size = got;
    return p;
}

/* Keeps p (under host_lock) in a free slot, or in place of the smallest kept buffer when p is
 * larger, within FY_HOST_REUSE_BYTES: 1 if kept (*evicted: a buffer to free), else 0. */
static int host_keep(void *p, size_t size, void **evicted)
{
    int slot = 0; /* a free slot, else the smallest kept buffer */
    for (int i = 0; i < FY_HOST_REUSE_SLOTS; i++) {
        if (!host_kept[i].p) {
            slot = i;
            break;
        }
        if (host_kept[i].size < host_kept[slot].size)
            slot = i;
    }
    size_t out = host_kept[slot].p ? host_kept[slot].size : 0;
    if ((host_kept[slot].p && out >= size) || host_kept_bytes - out + size > FY_HOST_REUSE_BYTES)
        return 0;
    *evicted = host_kept[slot].p;
    host_kept_bytes += size - out;
    host_kept[slot].p = p;
    host_kept[slot].size = size;
    return 1;
}

void fy_host_buffer_free(void *p, uint64_t size)
{
    void *evicted = NULL;
    int kept = 0;
    if (!p)
        return;
    if (size >= FY_HOST_REUSE_MIN) {
        pthread_once(&host_once, host_init);
        pthread_mutex_lock(&host_lock);
        kept = host_keep(p, (size_t)size, &evicted);
        pthread_mutex_unlock(&host_lock);
    }
    free(kept ? evicted : p);
}

void fy_host_buffers_release(void)
{
    void *kept[FY_HOST_REUSE_SLOTS];
    pthread_once(&host_once, host_init);
    pthread_mutex_lock(&host_lock);
    for (int i = 0; i < FY_HOST_REUSE_SLOTS; i++) {
        kept[i] = host_kept[i].p;
        host_kept[i].p = NULL;
    }
    host_kept_bytes = 0;
    pthread_mutex_unlock(&host_lock);
    for (int i = 0; i < FY_HOST_REUSE_SLOTS; i++)
        free(kept[i]);
}

uint64_t fy_host_buffers_kept(void)
{
    pthread_once(&host_once, host_init);
    pthread_mutex_lock(&host_lock);
    uint64_t n = host_kept_bytes;
    pthread_mutex_unlock(&host_lock);
    return n;
}

struct fy_lease {
    long refs; /* atomic */
    fy_consumer *consumer;
    ferry_descriptor desc;
    int ack_on_drop;
};

fy_lease *fy_lease_new(fy_consumer *consumer, const ferry_descriptor *d, int ack_on_drop)
{
    fy_lease *lease = calloc(1, sizeof(*lease));
    if (!lease)
        return NULL;
    lease->refs = 1;
    fy_consumer_ref(consumer);
    lease->consumer = consumer;
    lease->desc = *d;
    lease->ack_on_drop = ack_on_drop;
    return lease;
}

void fy_lease_ref(fy_lease *lease)
{
    __atomic_add_fetch(&lease->refs, 1, __ATOMIC_RELAXED);
}

void fy_lease_forget(fy_lease *lease)
{
    if (lease)
        lease->ack_on_drop = 0;
    fy_lease_drop(lease, NULL);
}

/* GPU views: the acknowledgement is enqueued after the work on the consumer's stream (that
 * read the view); the CPU acknowledges when that cannot be done. */
static void ack_gpu(fy_lease *lease, void *const *stream)
{
    ferry_status st = FERRY_OK;
    if (stream)
        st = ferry_consumer_ack_async(lease->consumer->handle, &lease->desc, *stream);
    if (st == FERRY_OK && stream)
        return;
    if (stream)
        fy_cuda_stream_sync(lease->consumer->device, *stream);
    ferry_consumer_ack(lease->consumer->handle, &lease->desc);
}

void fy_lease_drop(fy_lease *lease, void *const *stream)
{
    if (!lease || __atomic_sub_fetch(&lease->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    /* Errors cannot be reported from here; a STALE answer means that the lease was
     * acknowledged for this rank already (ferry.ack) or the pool went away. */
    if (lease->ack_on_drop && lease->desc.device < 0) /* host memory: nothing on a stream */
        ferry_consumer_ack(lease->consumer->handle, &lease->desc);
    else if (lease->ack_on_drop)
        ack_gpu(lease, stream);
    fy_consumer_unref(lease->consumer);
    free(lease);
}

/* Freed in the order of the stream that uses it: work enqueued there before runs first. */
static void release_gpu_copy(fy_payload *p)
{
    fy_cuda_free_async(p->device.device_id, p->buffer,
                       p->has_use_stream ? p->use_stream : p->recv_stream);
}

void fy_payload_ref(fy_payload *p)
{
    __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
}

void fy_payload_release(void *ctx)
{
    fy_payload *p = ctx;
    if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    switch (p->kind) {
    case FY_HOST_COPY:
        fy_host_buffer_free(p->buffer, p->buffer_size);
        break;
    case FY_GPU_COPY:
        release_gpu_copy(p);
        fy_lease_drop(p->lease, NULL);
        break;
    case FY_HOST_VIEW:
        fy_lease_drop(p->lease, NULL);
        break;
    case FY_GPU_VIEW:
        fy_lease_drop(p->lease, p->has_use_stream ? &p->use_stream : NULL);
        break;
    }
    free(p);
}
