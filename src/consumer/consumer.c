/* Consumer operations: wait for a lease, read or view it, acknowledge it; on GPU pools also
 * stream-ordered. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/futex.h"
#include "common/proc.h"
#include "consumer/consumer.h"

/* Longest single sleep of a waiting consumer: the bound on noticing a dead producer. */
#define FERRY_READY_WAIT_SLICE_NS 10000000ull
/* GPU streams write ready words without waking anybody: CPU waiters look this often. */
#define FERRY_GPU_POLL_NS 20000ull
/* For so long after a GPU pool's lease was first found not ready, CPU waiters yield instead of
 * sleeping: the producer's stream usually writes the ready word within microseconds, and the
 * shortest sleep takes tens of them. */
#define FERRY_GPU_SPIN_NS 100000ull

struct ferry_consumer {
    uint32_t rank;
    int32_t device;             /* for GPU pools; -1 for host pools only */
    pthread_mutex_t lock;       /* guards pools */
    ferry__mapped_pool **pools; /* pools this consumer holds a reference on */
    size_t npools;
    size_t cap;
};

ferry_status ferry_consumer_create_on(uint32_t rank, int32_t device, ferry_consumer **out)
{
    if (!out)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer output pointer is NULL");
    if (device < -1)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "device %d is not a device", device);
    ferry_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for a consumer");
    c->rank = rank;
    c->device = device;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_consumer_create(uint32_t rank, ferry_consumer **out)
{
    return ferry_consumer_create_on(rank, -1, out);
}

void ferry_consumer_destroy(ferry_consumer *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->npools; i++)
        ferry__cache_release(c->pools[i]);
    free(c->pools);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static ferry__mapped_pool *find_held(ferry_consumer *c, const uint8_t id[16])
{
    for (size_t i = 0; i < c->npools; i++)
        if (memcmp(c->pools[i]->pool_id, id, 16) == 0)
            return c->pools[i];
    return NULL;
}

static ferry_status hold(ferry_consumer *c, ferry__mapped_pool *pool)
{
    if (c->npools == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 4;
        ferry__mapped_pool **p = realloc(c->pools, cap * sizeof(*p));
        if (!p)
            return ferry__fail(FERRY_NO_MEMORY, "out of memory for the consumer's pools");
        c->pools = p;
        c->cap = cap;
    }
    c->pools[c->npools++] = pool;
    return FERRY_OK;
}

/* Checks a descriptor against the opened pool's own header. */
static ferry_status check_against_pool(const ferry__mapped_pool *p, const ferry_descriptor *d)
{
    if (d->backend != p->backend || (d->flags & FERRY_DESC_FLAG_DEVICE_CONTROL) != p->flags ||
        memcmp(d->handle, p->handle, sizeof(d->handle)) != 0)
        return ferry__fail(FERRY_MISMATCH, "descriptor backend, placement or handle differs "
                                           "from the opened pool");
    if (d->consumer_count != p->consumers || d->max_inflight != p->max_inflight ||
        d->pool_size != p->memory_size)
        return ferry__fail(FERRY_MISMATCH,
                           "descriptor disagrees with the pool (consumers %u/%u, max_inflight "
                           "%u/%u, size %llu/%llu)",
                           d->consumer_count, p->consumers, d->max_inflight, p->max_inflight,
                           (unsigned long long)d->pool_size, (unsigned long long)p->memory_size);
    if (d->flags & FERRY_DESC_FLAG_POOL_ONLY)
        return FERRY_OK;
    if (d->slot >= p->max_inflight || d->generation == 0 || d->generation > FERRY_GENERATION_MAX)
        return ferry__fail(FERRY_MISMATCH, "descriptor slot %u / generation %u out of range",
                           d->slot, d->generation);
    if (d->offset > p->data_size || d->length > p->data_size - d->offset)
        return ferry__fail(FERRY_MISMATCH,
                           "descriptor range [%llu, +%llu) exceeds the pool's %llu data bytes",
                           (unsigned long long)d->offset, (unsigned long long)d->length,
                           (unsigned long long)p->data_size);
    return FERRY_OK;
}

/* The opened pool for a descriptor (opening it on first use), checked against it. */
static ferry_status pool_lookup(ferry_consumer *c, const ferry_descriptor *d, int open_only,
                                ferry__mapped_pool **out)
{
    if (!c || !d)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer or descriptor is NULL");
    pthread_mutex_lock(&c->lock);
    ferry__mapped_pool *p = find_held(c, d->pool_id);
    ferry_status st = FERRY_OK;
    if (!p) {
        st = ferry__cache_acquire(d, c->rank, c->device, &p);
        if (st == FERRY_OK && (st = hold(c, p)) != FERRY_OK)
            ferry__cache_release(p);
    }
    pthread_mutex_unlock(&c->lock);
    if (st == FERRY_OK)
        st = check_against_pool(p, d);
    if (st == FERRY_OK && (d->flags & FERRY_DESC_FLAG_POOL_ONLY) && !open_only)
        st = ferry__fail(FERRY_INVALID_ARGUMENT,
                         "a pool-only descriptor names no lease: it can only open the pool");
    if (st == FERRY_OK && p->backend != FERRY_BACKEND_HOST)
        st = ferry__gpu_map(p, c->device);
    if (st == FERRY_OK)
        *out = p;
    return st;
}

static ferry_status pool_for(ferry_consumer *c, const ferry_descriptor *d, ferry__mapped_pool **out)
{
    return pool_lookup(c, d, 0, out);
}

ferry_status ferry_consumer_open(ferry_consumer *c, const ferry_descriptor *d)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_lookup(c, d, 1, &p);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* ---- control words -------------------------------------------------------------------- */

static uint64_t row_word(const ferry__mapped_pool *p, uint32_t slot)
{
    return (uint64_t)slot * p->row_words;
}

static ferry_status load_word(ferry_consumer *c, ferry__mapped_pool *p, uint64_t word,
                              uint32_t *value)
{
    if (p->control) {
        *value = ferry__load_acquire32(&p->control[word]);
        return FERRY_OK;
    }
    return ferry__gpu_load(p, c->device, word, value);
}

static ferry_status store_word(ferry_consumer *c, ferry__mapped_pool *p, uint64_t word,
                               uint32_t value)
{
    if (p->control) {
        ferry__store_release32(&p->control[word], value);
        return FERRY_OK;
    }
    return ferry__gpu_store(p, c->device, word, value);
}

/* A rank's acknowledgement word: read where the CPU can see it, else this process's own
 * record of the acknowledgements it wrote. */
static ferry_status load_ack(ferry_consumer *c, ferry__mapped_pool *p, uint32_t slot, uint32_t rank,
                             uint32_t *value)
{
    if (p->my_acks) {
        *value = ferry__load_acquire32(&p->my_acks[(uint64_t)slot * p->consumers + rank]);
        return FERRY_OK;
    }
    return load_word(c, p, row_word(p, slot) + 1 + rank, value);
}

static void note_ack(ferry__mapped_pool *p, uint32_t slot, uint32_t rank, uint32_t generation)
{
    if (p->my_acks)
        ferry__store_release32(&p->my_acks[(uint64_t)slot * p->consumers + rank], generation);
}

static ferry_status stale(const ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank)
{
    uint32_t now = ferry__load_acquire32(&p->generations[d->slot]);
    if (now == (d->generation | FERRY_GEN_CANCELLED))
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: lease (slot=%u, generation=%u) was cancelled by "
                           "the producer",
                           d->slot, d->generation);
    if (now != d->generation)
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: slot %u now holds generation %u, descriptor has %u",
                           d->slot, now, d->generation);
    return ferry__fail(FERRY_STALE,
                       "stale descriptor: lease (slot=%u, generation=%u) was already "
                       "acknowledged for rank %u or cancelled",
                       d->slot, d->generation, rank);
}

/* *state: 1 ready, 0 not yet, -1 stale (slot reused, or already acknowledged for rank). */
static ferry_status lease_state(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                                int check_ready, int *state)
{
    uint32_t ack, ready = 0;
    *state = -1;
    if (ferry__load_acquire32(&p->generations[d->slot]) != d->generation)
        return FERRY_OK;
    ferry_status st = load_ack(c, p, d->slot, c->rank, &ack);
    if (st == FERRY_OK && ack != d->generation && check_ready)
        st = load_word(c, p, row_word(p, d->slot), &ready);
    if (st == FERRY_OK && ack != d->generation)
        *state = check_ready ? ready == d->generation : 1;
    return st;
}

static int producer_gone(ferry__mapped_pool *p)
{
    if (ferry__load_acquire32(&p->gone) || ferry__load_acquire32(&p->header->closing) ||
        !ferry__proc_alive(p->producer_pid, p->producer_start)) {
        ferry__cache_evict(p);
        return 1;
    }
    return 0;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* Sleeps until the ready word may have changed: a futex for host pools, whose producer wakes
 * sleepers; a short sleep for GPU pools, whose streams wake nobody. */
static void sleep_on_ready(ferry__mapped_pool *p, const ferry_descriptor *d, uint64_t ns)
{
    if (!p->control) {
        sleep_ns(ns < FERRY_GPU_POLL_NS ? ns : FERRY_GPU_POLL_NS);
        return;
    }
    uint64_t cap = p->backend == FERRY_BACKEND_HOST ? FERRY_READY_WAIT_SLICE_NS : FERRY_GPU_POLL_NS;
    uint32_t *ready = &p->control[row_word(p, d->slot)];
    ferry__fetch_add_seqcst32(&p->header->consumer_waiters, 1);
    uint32_t seen = ferry__load_seqcst32(ready);
    if (seen != d->generation)
        ferry__futex_wait(ready, seen, ns < cap ? ns : cap);
    ferry__fetch_add_seqcst32(&p->header->consumer_waiters, (uint32_t)-1);
}

static ferry_status gone_error(const ferry__mapped_pool *p, const ferry_descriptor *d)
{
    return ferry__fail(FERRY_PRODUCER_GONE,
                       "producer of the pool (pid %d) is gone or closed the pool; lease "
                       "(slot=%u, generation=%u) will never be ready",
                       (int)p->producer_pid, d->slot, d->generation);
}

static ferry_status wait_ready(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                               uint64_t timeout_ns)
{
    uint64_t start = 0, deadline = 0, next_check = 0;
    for (;;) {
        int state;
        ferry_status st = lease_state(c, p, d, 1, &state);
        if (st != FERRY_OK || state > 0)
            return st;
        if (state < 0)
            return stale(p, d, c->rank);
        uint64_t now = ferry__now_ns();
        if (!start) {
            start = now;
            deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
            next_check = now + FERRY_READY_WAIT_SLICE_NS;
        } else if (now >= next_check) {
            /* /proc is read at most every slice, however short the sleeps. */
            if (producer_gone(p))
                return gone_error(p, d);
            next_check = now + FERRY_READY_WAIT_SLICE_NS;
        }
        if (now >= deadline)
            return ferry__fail(FERRY_TIMEOUT,
                               "lease (slot=%u, generation=%u) not ready after %.3f ms", d->slot,
                               d->generation, (double)timeout_ns / 1e6);
        if (p->backend != FERRY_BACKEND_HOST && now - start < FERRY_GPU_SPIN_NS)
            sched_yield(); /* a GPU stream is about to write it: a sleep would overshoot */
        else
            sleep_on_ready(p, d, deadline - now);
    }
}

ferry_status ferry_consumer_wait(ferry_consumer *c, const ferry_descriptor *d, uint64_t timeout_ns)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK)
        st = wait_ready(c, p, d, timeout_ns);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

static ferry_status copy_out(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                             void *dst)
{
    if (p->data) {
        if (d->length)
            memcpy(dst, p->data + d->offset, d->length);
        return FERRY_OK;
    }
    return ferry__gpu_copy_out(p, c->device, d->offset, dst, d->length);
}

static ferry_status check_dst(const ferry_descriptor *d, const void *dst, size_t dst_size)
{
    if (d->length && !dst)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "destination is NULL");
    if (dst_size < d->length)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "destination holds %zu bytes, tensor has %llu",
                           dst_size, (unsigned long long)d->length);
    return FERRY_OK;
}

ferry_status ferry_consumer_read(ferry_consumer *c, const ferry_descriptor *d, void *dst,
                                 size_t dst_size, uint64_t timeout_ns)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK)
        st = check_dst(d, dst, dst_size);
    if (st == FERRY_OK)
        st = wait_ready(c, p, d, timeout_ns);
    if (st == FERRY_OK)
        st = copy_out(c, p, d, dst);
    if (st != FERRY_OK)
        return st;
    /* Seqlock-style re-check: the copy must not have overlapped a reuse of the slot. */
    if (ferry__load_after_reads32(&p->generations[d->slot]) != d->generation)
        return stale(p, d, c->rank);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_consumer_view(ferry_consumer *c, const ferry_descriptor *d, const void **data,
                                 uint64_t timeout_ns)
{
    ferry__mapped_pool *p;
    const void *ptr = NULL;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK && !data)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "data output is NULL");
    if (st == FERRY_OK)
        st = wait_ready(c, p, d, timeout_ns);
    if (st == FERRY_OK && p->data)
        ptr = p->data + d->offset;
    else if (st == FERRY_OK)
        st = ferry__gpu_data(p, c->device, d->offset, &ptr);
    if (st != FERRY_OK)
        return st;
    *data = ptr;
    ferry__clear_error();
    return FERRY_OK;
}

/* ---- acknowledgements --------------------------------------------------------------- */

static void signal_ack(ferry__mapped_pool *p)
{
    ferry__fetch_add_seqcst32(&p->header->ack_seq, 1);
    if (ferry__load_seqcst32(&p->header->producer_waiters))
        ferry__futex_wake_all(&p->header->ack_seq);
}

static ferry_status check_range(const ferry__mapped_pool *p, uint32_t first, uint32_t count)
{
    if (count == 0 || first >= p->consumers || count > p->consumers - first)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank range [%u, %u) is outside [0, %u)", first,
                           first + count, p->consumers);
    return FERRY_OK;
}

/* Writes ack words for ranks [first, first + count). Fails STALE if the slot was reused, or
 * (strict) if any rank had already acknowledged. */
static ferry_status ack_ranks(ferry_consumer *c, const ferry_descriptor *d, uint32_t first,
                              uint32_t count, int strict)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK)
        st = check_range(p, first, count);
    if (st != FERRY_OK)
        return st;
    if (ferry__load_acquire32(&p->generations[d->slot]) != d->generation)
        return stale(p, d, first);
    uint32_t written = 0;
    for (uint32_t r = first; r < first + count && st == FERRY_OK; r++) {
        uint32_t ack;
        st = load_ack(c, p, d->slot, r, &ack);
        if (st == FERRY_OK && ack != d->generation &&
            (st = store_word(c, p, row_word(p, d->slot) + 1 + r, d->generation)) == FERRY_OK) {
            note_ack(p, d->slot, r, d->generation);
            written++;
        }
    }
    if (written)
        signal_ack(p);
    if (st != FERRY_OK)
        return st;
    if ((strict && written < count) || !written)
        return stale(p, d, first);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_consumer_ack(ferry_consumer *c, const ferry_descriptor *d)
{
    if (!c)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer is NULL");
    return ack_ranks(c, d, c->rank, 1, 1);
}

ferry_status ferry_consumer_ack_range(ferry_consumer *c, const ferry_descriptor *d, uint32_t first,
                                      uint32_t count)
{
    return ack_ranks(c, d, first, count, 0);
}

ferry_status ferry_consumer_ack_all(ferry_consumer *c, const ferry_descriptor *d)
{
    if (!d)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "descriptor is NULL");
    return ack_ranks(c, d, 0, d->consumer_count, 0);
}

/* ---- stream-ordered (GPU pools) -------------------------------------------------------- */

/* The GPU pool of a descriptor, refusing a lease this rank can no longer read. */
static ferry_status gpu_pool_for(ferry_consumer *c, const ferry_descriptor *d,
                                 ferry__mapped_pool **out)
{
    ferry__mapped_pool *p;
    int state;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK && p->backend == FERRY_BACKEND_HOST)
        st = ferry__fail(FERRY_NOT_SUPPORTED, "stream-ordered operations need a GPU pool");
    if (st == FERRY_OK)
        st = lease_state(c, p, d, 0, &state);
    if (st == FERRY_OK && state < 0)
        st = stale(p, d, c->rank);
    if (st == FERRY_OK)
        *out = p;
    return st;
}

/* Enqueues the stream's wait for the lease's ready word, unless the CPU sees it written
 * already (control words in host memory): the producer's stream fenced its copy before that
 * write, so the data is complete for every reader from then on. */
static ferry_status enqueue_ready_wait(ferry_consumer *c, ferry__mapped_pool *p,
                                       const ferry_descriptor *d, void *stream)
{
    if (p->control && ferry__load_acquire32(&p->control[row_word(p, d->slot)]) == d->generation)
        return FERRY_OK;
    return ferry__gpu_enqueue_wait(p, c->device, row_word(p, d->slot), d->generation, stream);
}

/* Enqueues this rank's acknowledgement after the stream's work, and notes it. */
static ferry_status enqueue_ack(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                                void *stream)
{
    ferry_status st = ferry__gpu_enqueue_store(p, c->device, row_word(p, d->slot) + 1 + c->rank,
                                               d->generation, stream);
    if (st == FERRY_OK) {
        note_ack(p, d->slot, c->rank, d->generation);
        ferry__clear_error();
    }
    return st;
}

ferry_status ferry_consumer_read_async(ferry_consumer *c, const ferry_descriptor *d, void *dst,
                                       size_t dst_size, void *stream)
{
    ferry__mapped_pool *p;
    ferry_status st = gpu_pool_for(c, d, &p);
    if (st == FERRY_OK)
        st = check_dst(d, dst, dst_size);
    if (st == FERRY_OK)
        st = enqueue_ready_wait(c, p, d, stream);
    if (st == FERRY_OK)
        st = ferry__gpu_enqueue_copy(p, c->device, d->offset, dst, d->length, stream);
    if (st == FERRY_OK)
        st = enqueue_ack(c, p, d, stream);
    return st;
}

ferry_status ferry_consumer_view_async(ferry_consumer *c, const ferry_descriptor *d, void *stream,
                                       const void **data)
{
    ferry__mapped_pool *p;
    const void *ptr = NULL;
    ferry_status st = gpu_pool_for(c, d, &p);
    if (st == FERRY_OK && !data)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "data output is NULL");
    if (st == FERRY_OK)
        st = enqueue_ready_wait(c, p, d, stream);
    if (st == FERRY_OK)
        st = ferry__gpu_data(p, c->device, d->offset, &ptr);
    if (st != FERRY_OK)
        return st;
    *data = ptr;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_consumer_ack_async(ferry_consumer *c, const ferry_descriptor *d, void *stream)
{
    ferry__mapped_pool *p;
    ferry_status st = gpu_pool_for(c, d, &p);
    if (st == FERRY_OK)
        st = enqueue_ack(c, p, d, stream);
    return st;
}
