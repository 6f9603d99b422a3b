/* Consumer operations: wait for a lease, read or view it, acknowledge it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/futex.h"
#include "common/proc.h"
#include "consumer/consumer.h"

/* Longest single sleep of a waiting consumer: the bound on noticing a dead producer. */
#define FERRY_READY_WAIT_SLICE_NS 10000000ull

struct ferry_consumer {
    uint32_t rank;
    pthread_mutex_t lock;       /* guards pools */
    ferry__mapped_pool **pools; /* pools this consumer holds a reference on */
    size_t npools;
    size_t cap;
};

ferry_status ferry_consumer_create(uint32_t rank, ferry_consumer **out)
{
    if (!out)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer output pointer is NULL");
    ferry_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for a consumer");
    c->rank = rank;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    ferry__clear_error();
    return FERRY_OK;
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
    if (d->backend != FERRY_BACKEND_HOST)
        return ferry__fail(FERRY_MISMATCH, "descriptor backend %u is not host", d->backend);
    if (d->consumer_count != p->consumers || d->max_inflight != p->max_inflight ||
        d->pool_size != p->memory_size)
        return ferry__fail(FERRY_MISMATCH,
                           "descriptor disagrees with the pool (consumers %u/%u, max_inflight "
                           "%u/%u, size %llu/%llu)",
                           d->consumer_count, p->consumers, d->max_inflight, p->max_inflight,
                           (unsigned long long)d->pool_size, (unsigned long long)p->memory_size);
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
static ferry_status pool_for(ferry_consumer *c, const ferry_descriptor *d, ferry__mapped_pool **out)
{
    if (!c || !d)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer or descriptor is NULL");
    pthread_mutex_lock(&c->lock);
    ferry__mapped_pool *p = find_held(c, d->pool_id);
    ferry_status st = FERRY_OK;
    if (!p) {
        st = ferry__cache_acquire(d, c->rank, &p);
        if (st == FERRY_OK && (st = hold(c, p)) != FERRY_OK)
            ferry__cache_release(p);
    }
    pthread_mutex_unlock(&c->lock);
    if (st == FERRY_OK)
        st = check_against_pool(p, d);
    if (st == FERRY_OK)
        *out = p;
    return st;
}

ferry_status ferry_consumer_open(ferry_consumer *c, const ferry_descriptor *d)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* ---- lease state -------------------------------------------------------------------- */

static uint32_t *row_of(const ferry__mapped_pool *p, uint32_t slot)
{
    return ferry__row(p->control, p->row_words, slot);
}

static ferry_status stale(const ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank)
{
    uint32_t now = ferry__load_acquire32(&p->generations[d->slot]);
    if (now != d->generation)
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: slot %u now holds generation %u, descriptor has %u",
                           d->slot, now, d->generation);
    return ferry__fail(FERRY_STALE,
                       "stale descriptor: lease (slot=%u, generation=%u) was already "
                       "acknowledged for rank %u or cancelled",
                       d->slot, d->generation, rank);
}

/* 1 ready, 0 not yet, -1 stale (slot reused, or already acknowledged for rank). */
static int lease_state(const ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank)
{
    const uint32_t *row = row_of(p, d->slot);
    if (ferry__load_acquire32(&p->generations[d->slot]) != d->generation)
        return -1;
    if (ferry__load_acquire32(&row[1 + rank]) == d->generation)
        return -1;
    return ferry__load_acquire32(&row[0]) == d->generation;
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

static void sleep_on_ready(ferry__mapped_pool *p, const ferry_descriptor *d, uint64_t ns)
{
    uint32_t *ready = &row_of(p, d->slot)[0];
    ferry__fetch_add_seqcst32(&p->header->consumer_waiters, 1);
    uint32_t seen = ferry__load_seqcst32(ready);
    if (seen != d->generation)
        ferry__futex_wait(ready, seen,
                          ns < FERRY_READY_WAIT_SLICE_NS ? ns : FERRY_READY_WAIT_SLICE_NS);
    ferry__fetch_add_seqcst32(&p->header->consumer_waiters, (uint32_t)-1);
}

static ferry_status wait_ready(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank,
                               uint64_t timeout_ns)
{
    uint64_t deadline = 0;
    for (;;) {
        int state = lease_state(p, d, rank);
        if (state > 0)
            return FERRY_OK;
        if (state < 0)
            return stale(p, d, rank);
        if (producer_gone(p))
            return ferry__fail(FERRY_PRODUCER_GONE,
                               "producer of the host pool (pid %d) is gone or closed the pool; "
                               "lease (slot=%u, generation=%u) will never be ready",
                               (int)p->producer_pid, d->slot, d->generation);
        uint64_t now = ferry__now_ns();
        if (!deadline)
            deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
        if (now >= deadline)
            return ferry__fail(FERRY_TIMEOUT,
                               "lease (slot=%u, generation=%u) not ready after %.3f ms", d->slot,
                               d->generation, (double)timeout_ns / 1e6);
        sleep_on_ready(p, d, deadline - now);
    }
}

ferry_status ferry_consumer_wait(ferry_consumer *c, const ferry_descriptor *d, uint64_t timeout_ns)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK)
        st = wait_ready(p, d, c->rank, timeout_ns);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

ferry_status ferry_consumer_read(ferry_consumer *c, const ferry_descriptor *d, void *dst,
                                 size_t dst_size, uint64_t timeout_ns)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK && d->length && !dst)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "destination is NULL");
    if (st == FERRY_OK && dst_size < d->length)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "destination holds %zu bytes, tensor has %llu",
                         dst_size, (unsigned long long)d->length);
    if (st == FERRY_OK)
        st = wait_ready(p, d, c->rank, timeout_ns);
    if (st != FERRY_OK)
        return st;
    if (d->length)
        memcpy(dst, p->data + d->offset, d->length);
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
    ferry_status st = pool_for(c, d, &p);
    if (st == FERRY_OK && !data)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "data output is NULL");
    if (st == FERRY_OK)
        st = wait_ready(p, d, c->rank, timeout_ns);
    if (st != FERRY_OK)
        return st;
    *data = p->data + d->offset;
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

/* Writes ack words for ranks [first, first + count). Fails STALE if the slot was reused, or
 * (strict) if any rank had already acknowledged. */
static ferry_status ack_ranks(ferry_consumer *c, const ferry_descriptor *d, uint32_t first,
                              uint32_t count, int strict)
{
    ferry__mapped_pool *p;
    ferry_status st = pool_for(c, d, &p);
    if (st != FERRY_OK)
        return st;
    if (count == 0 || first >= p->consumers || count > p->consumers - first)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank range [%u, %u) is outside [0, %u)", first,
                           first + count, p->consumers);
    if (ferry__load_acquire32(&p->generations[d->slot]) != d->generation)
        return stale(p, d, first);
    uint32_t *row = row_of(p, d->slot);
    uint32_t written = 0;
    for (uint32_t r = first; r < first + count; r++) {
        if (ferry__load_acquire32(&row[1 + r]) == d->generation)
            continue;
        ferry__store_release32(&row[1 + r], d->generation);
        written++;
    }
    if (written)
        signal_ack(p);
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
