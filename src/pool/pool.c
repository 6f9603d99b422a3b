/* The pool engine: leases, publishing, commit, cancel and the pool's life cycle. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/futex.h"
#include "common/proc.h"
#include "pool/pool.h"

/* A lease being created: where its slice is and which generation it carries. */
typedef struct lease {
    uint32_t slot;
    uint32_t generation;
    uint64_t offset;
} lease;

/* Longest single sleep of a publisher waiting for space; it re-checks after each. */
#define FERRY_SPACE_WAIT_SLICE_NS 100000000ull

/* ---- creation and destruction ------------------------------------------------------- */

static ferry_status random_bytes(uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0 && errno != EINTR)
            return ferry__fail_errno(FERRY_SYSTEM, errno, "getrandom failed");
        if (r > 0)
            got += (size_t)r;
    }
    return FERRY_OK;
}

static void init_shared(ferry_pool *pool)
{
    ferry__shm_header *h = pool->mem.header;
    uint32_t g = pool->config.initial_generation;
    h->version = FERRY_SHM_VERSION;
    h->header_bytes = ferry__header_bytes(pool->max_inflight);
    memcpy(h->pool_id, pool->pool_id, 16);
    h->backend = (uint32_t)pool->ops->backend;
    h->consumer_count = pool->consumers;
    h->max_inflight = pool->max_inflight;
    h->row_words = pool->row_words;
    h->memory_size = (uint64_t)pool->config.memory_size;
    h->data_start = pool->data_start;
    h->data_size = pool->data_size;
    h->gen_offset = FERRY_GEN_TABLE_OFFSET;
    for (uint32_t s = 0; s < pool->max_inflight; s++) {
        pool->mem.generations[s] = g;
        uint32_t *row = ferry__row(pool->mem.control, pool->row_words, s);
        for (uint32_t w = 0; w < pool->row_words; w++)
            row[w] = g;
    }
    ferry__store_release32(&h->magic, FERRY_SHM_MAGIC);
}

static ferry_status init_tables(ferry_pool *pool)
{
    ferry_status st =
        ferry__alloc_init(&pool->alloc, pool->data_size, FERRY_DATA_ALIGN, pool->max_inflight);
    if (st != FERRY_OK)
        return st;
    pool->slots = calloc(pool->max_inflight, sizeof(*pool->slots));
    pool->ring = calloc(pool->max_inflight, sizeof(*pool->ring));
    pool->inflight = calloc(pool->max_inflight, sizeof(*pool->inflight));
    pool->ranks = calloc(pool->consumers, sizeof(*pool->ranks));
    if (!pool->slots || !pool->ring || !pool->inflight || !pool->ranks)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory for bookkeeping",
                           pool->ops->name);
    for (uint32_t s = 0; s < pool->max_inflight; s++) {
        pool->slots[s].generation = pool->config.initial_generation;
        pool->slots[s].inflight_pos = FERRY_NIL;
        pool->ring[s] = s;
    }
    pool->ring_count = pool->max_inflight;
    return FERRY_OK;
}

static void free_tables(ferry_pool *pool)
{
    ferry__alloc_fini(&pool->alloc);
    free(pool->slots);
    free(pool->ring);
    free(pool->inflight);
    free(pool->ranks);
}

static ferry_status init_sync(ferry_pool *pool)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->reclaimer_cv, &attr);
    pthread_cond_init(&pool->idle_cv, &attr);
    pthread_condattr_destroy(&attr);
    return FERRY_OK;
}

static void fini_sync(ferry_pool *pool)
{
    pthread_cond_destroy(&pool->idle_cv);
    pthread_cond_destroy(&pool->reclaimer_cv);
    pthread_mutex_destroy(&pool->lock);
}

static ferry_status start_broker(ferry_pool *pool)
{
    ferry__broker_config bc = {
        .pool_id = pool->pool_id,
        .shared_fd = pool->mem.shared_fd,
        .shared_size = pool->mem.shared_size,
        .consumer_count = pool->consumers,
        .label = "host pool broker",
        .on_attach = ferry__rank_attached,
        .user = pool,
    };
    return ferry__broker_start(&bc, &pool->broker, pool->broker_name);
}

static ferry_status pool_setup(ferry_pool *pool, const ferry_pool_config *config)
{
    ferry_status st = ferry__transport_select(config->backend, &pool->ops);
    if (st == FERRY_OK)
        st = ferry__config_validate(config, pool->ops->name, &pool->data_start);
    if (st != FERRY_OK)
        return st;
    pool->config = *config;
    pool->consumers = (uint32_t)config->consumer_count;
    pool->max_inflight = (uint32_t)config->max_inflight_slices;
    pool->row_words = 1 + pool->consumers;
    pool->data_size =
        ((uint64_t)config->memory_size - pool->data_start) & ~(uint64_t)(FERRY_DATA_ALIGN - 1);
    pool->pid = getpid();
    pool->mem.shared_fd = -1;
    return random_bytes(pool->pool_id, sizeof(pool->pool_id));
}

ferry_status ferry_pool_create(const ferry_pool_config *config, ferry_pool **out)
{
    if (!out || !config)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool config or output pointer is NULL");
    ferry_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for the pool");
    ferry_status st = pool_setup(pool, config);
    if (st != FERRY_OK)
        goto free_pool;
    init_sync(pool);
    st = init_tables(pool);
    if (st != FERRY_OK)
        goto free_tables;
    st = pool->ops->create(&pool->config, pool->data_start, &pool->mem);
    if (st != FERRY_OK)
        goto free_tables;
    init_shared(pool);
    st = start_broker(pool);
    if (st != FERRY_OK)
        goto destroy_memory;
    st = ferry__reclaimer_start(pool);
    if (st != FERRY_OK)
        goto stop_broker;
    *out = pool;
    ferry__clear_error();
    return FERRY_OK;
stop_broker:
    ferry__broker_stop(pool->broker);
destroy_memory:
    pool->ops->destroy(&pool->mem);
free_tables:
    free_tables(pool);
    fini_sync(pool);
free_pool:
    free(pool);
    return st;
}

/* Wakes every consumer that might sleep on a ready word, so it sees the pool closing. */
static void wake_all_ready(ferry_pool *pool)
{
    if (!ferry__load_seqcst32(&pool->mem.header->consumer_waiters))
        return;
    for (uint32_t s = 0; s < pool->max_inflight; s++)
        ferry__futex_wake_all(ferry__row(pool->mem.control, pool->row_words, s));
}

void ferry_pool_destroy(ferry_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->closing = 1;
    while (pool->active)
        pthread_cond_wait(&pool->idle_cv, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    ferry__store_seqcst32(&pool->mem.header->closing, 1);
    wake_all_ready(pool);
    ferry__signal_space(pool);
    ferry__reclaimer_stop(pool);
    ferry__broker_stop(pool->broker);
    pool->ops->destroy(&pool->mem);
    free_tables(pool);
    fini_sync(pool);
    free(pool);
}

/* ---- leases ------------------------------------------------------------------------- */

static ferry_status try_lease_locked(ferry_pool *pool, uint64_t bytes, lease *out)
{
    if (!pool->ring_count)
        return FERRY_POOL_FULL;
    uint32_t slot = pool->ring[pool->ring_head];
    ferry__slot *s = &pool->slots[slot];
    if (s->generation >= FERRY_GENERATION_MAX) {
        /* Retire the slot so that the pool keeps serving with the others. */
        pool->ring_head = (pool->ring_head + 1) % pool->max_inflight;
        pool->ring_count--;
        return ferry__fail(FERRY_GENERATION_EXHAUSTED,
                           "%s pool slot generation exhausted (slot=%u, generation=%u)",
                           pool->ops->name, slot, s->generation);
    }
    uint64_t offset;
    uint32_t handle;
    ferry_status st = ferry__alloc_alloc(&pool->alloc, bytes ? bytes : 1, &offset, &handle);
    if (st != FERRY_OK)
        return st;
    pool->ring_head = (pool->ring_head + 1) % pool->max_inflight;
    pool->ring_count--;
    s->offset = offset;
    s->handle = handle;
    s->generation++;
    s->leased_ns = ferry__now_ns();
    s->inflight_pos = pool->inflight_count;
    pool->inflight[pool->inflight_count++] = slot;
    /* The generation word goes first: from here on a consumer holding an older descriptor
     * for this slot sees that it is stale. */
    ferry__store_release32(&pool->mem.generations[slot], s->generation);
    out->slot = slot;
    out->generation = s->generation;
    out->offset = offset;
    return FERRY_OK;
}

static void note_lease_locked(ferry_pool *pool)
{
    ferry_pool_stats *st = &pool->stats;
    st->publishes++;
    if (pool->alloc.used_bytes > st->high_water_bytes)
        st->high_water_bytes = pool->alloc.used_bytes;
    if (pool->inflight_count > st->high_water_leases)
        st->high_water_leases = pool->inflight_count;
}

/* One attempt: allocate, and on a miss reclaim what consumers released and retry. */
static ferry_status lease_once_locked(ferry_pool *pool, uint64_t bytes, lease *out)
{
    ferry_status st = try_lease_locked(pool, bytes, out);
    if (st == FERRY_POOL_FULL && ferry__reclaim_locked(pool))
        st = try_lease_locked(pool, bytes, out);
    if (st == FERRY_POOL_FULL && ferry__reap_dead_locked(pool) && ferry__reclaim_locked(pool))
        st = try_lease_locked(pool, bytes, out);
    if (st == FERRY_OK)
        note_lease_locked(pool);
    return st;
}

static ferry_status lease_wait(ferry_pool *pool, uint64_t bytes, uint64_t deadline, lease *out)
{
    ferry__shm_header *h = pool->mem.header;
    ferry_status st = FERRY_POOL_FULL;
    ferry__fetch_add_seqcst32(&h->producer_waiters, 1);
    for (;;) {
        uint32_t seq = ferry__load_seqcst32(&h->ack_seq);
        pthread_mutex_lock(&pool->lock);
        st = pool->closing ? FERRY_CLOSING : lease_once_locked(pool, bytes, out);
        pthread_mutex_unlock(&pool->lock);
        uint64_t now = ferry__now_ns();
        if (st != FERRY_POOL_FULL || now >= deadline)
            break;
        uint64_t left = deadline - now;
        ferry__futex_wait(&h->ack_seq, seq,
                          left < FERRY_SPACE_WAIT_SLICE_NS ? left : FERRY_SPACE_WAIT_SLICE_NS);
    }
    ferry__fetch_add_seqcst32(&h->producer_waiters, (uint32_t)-1);
    return st;
}

static ferry_status report_full_locked(ferry_pool *pool, uint64_t bytes)
{
    char backlog[256];
    ferry__describe_backlog_locked(pool, backlog, sizeof(backlog));
    return ferry__fail(FERRY_POOL_FULL,
                       "%s pool is full: %llu bytes requested, largest free extent %llu of "
                       "%llu usable, %u leases in flight (max %u); %s",
                       pool->ops->name, (unsigned long long)bytes,
                       (unsigned long long)ferry__alloc_largest_free(&pool->alloc),
                       (unsigned long long)pool->data_size, pool->inflight_count,
                       pool->max_inflight, backlog);
}

static ferry_status closing_error(ferry_pool *pool)
{
    return ferry__fail(FERRY_CLOSING, "%s pool is closing", pool->ops->name);
}

/* Creates a lease of bytes, waiting up to timeout_ns for space. On success the caller is
 * an active publisher and must call lease_done. */
static ferry_status lease_acquire(ferry_pool *pool, uint64_t bytes, uint64_t timeout_ns, lease *out)
{
    uint64_t deadline = ferry__deadline(timeout_ns);
    pthread_mutex_lock(&pool->lock);
    ferry_status st = pool->closing ? FERRY_CLOSING : lease_once_locked(pool, bytes, out);
    if (st == FERRY_POOL_FULL) {
        pool->stats.pool_full_events++;
        if (!pool->warned_full) {
            pool->warned_full = 1;
            report_full_locked(pool, bytes);
            ferry__log(FERRY_LOG_WARN, "%s (publishers get POOL_FULL or wait; warned once)",
                       ferry_last_error());
        }
        if (timeout_ns) {
            pthread_mutex_unlock(&pool->lock);
            st = lease_wait(pool, bytes, deadline, out);
            pthread_mutex_lock(&pool->lock);
        }
        if (st == FERRY_POOL_FULL)
            report_full_locked(pool, bytes);
    }
    if (st == FERRY_CLOSING)
        closing_error(pool);
    if (st == FERRY_OK)
        pool->active++;
    pthread_mutex_unlock(&pool->lock);
    return st;
}

static void lease_done(ferry_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    if (--pool->active == 0 && pool->closing)
        pthread_cond_broadcast(&pool->idle_cv);
    pthread_mutex_unlock(&pool->lock);
}

static void fill_descriptor(const ferry_pool *pool, const lease *l, uint64_t offset,
                            uint64_t length, const ferry_tensor *t, uint8_t flags,
                            ferry_descriptor *d)
{
    memset(d, 0, sizeof(*d));
    d->backend = (uint8_t)pool->ops->backend;
    d->flags = flags;
    d->consumer_count = (uint16_t)pool->consumers;
    d->max_inflight = pool->max_inflight;
    d->slot = l->slot;
    d->generation = l->generation;
    d->offset = offset;
    d->length = length;
    d->pool_size = (uint64_t)pool->config.memory_size;
    memcpy(d->pool_id, pool->pool_id, 16);
    memcpy(d->broker, pool->broker_name, 16);
    d->producer_pid = (uint32_t)pool->pid;
    d->device = -1;
    d->tensor = *t;
}

static void mark_ready(ferry_pool *pool, const lease *l)
{
    uint32_t *row = ferry__row(pool->mem.control, pool->row_words, l->slot);
    ferry__store_seqcst32(&row[0], l->generation);
    ferry__signal_ready(pool, l->slot);
}

/* Returns a lease that was never marked ready (a failed copy). */
static void lease_abort(ferry_pool *pool, const lease *l)
{
    pthread_mutex_lock(&pool->lock);
    uint32_t *row = ferry__row(pool->mem.control, pool->row_words, l->slot);
    for (uint32_t w = 0; w < pool->row_words; w++)
        ferry__store_release32(&row[w], l->generation);
    ferry__slot_release_locked(pool, l->slot);
    pthread_mutex_unlock(&pool->lock);
}

static ferry_status check_pool_arg(ferry_pool *pool, const void *ptr, const char *what)
{
    if (!pool)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool is NULL");
    if (!ptr)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "%s is NULL", what);
    return FERRY_OK;
}

ferry_status ferry_pool_publish(ferry_pool *pool, const ferry_tensor *tensor, const void *src,
                                uint64_t timeout_ns, ferry_descriptor *desc)
{
    return ferry_pool_publish_many(pool, tensor, &src, 1, timeout_ns, desc);
}

/* Byte layout of a multi-tensor lease: offsets[i] relative to the slice. */
static ferry_status pack_layout(const ferry_tensor *tensors, const void *const *srcs, size_t count,
                                uint64_t *offsets, uint64_t *lengths, uint64_t *total)
{
    uint64_t cursor = 0;
    for (size_t i = 0; i < count; i++) {
        ferry_status st = ferry_tensor_nbytes(&tensors[i], &lengths[i]);
        if (st != FERRY_OK)
            return st;
        if (lengths[i] && !srcs[i])
            return ferry__fail(FERRY_INVALID_ARGUMENT, "source of tensor %zu is NULL", i);
        uint64_t elem = (uint64_t)tensors[i].dtype_bits * tensors[i].dtype_lanes / 8;
        uint64_t align = elem > 1 ? elem : 1;
        uint64_t off = (cursor + align - 1) / align * align;
        if (off < cursor || off + lengths[i] < off)
            return ferry__fail(FERRY_INVALID_ARGUMENT, "tensors are too large");
        offsets[i] = off;
        cursor = off + lengths[i];
    }
    *total = cursor;
    return FERRY_OK;
}

static ferry_status check_fits(ferry_pool *pool, uint64_t total)
{
    if (total > pool->data_size)
        return ferry__fail(
            FERRY_INVALID_ARGUMENT, "%llu bytes can never fit in the %s pool's %llu usable bytes",
            (unsigned long long)total, pool->ops->name, (unsigned long long)pool->data_size);
    return FERRY_OK;
}

#define FERRY_PACK_STACK 16

static ferry_status publish_packed(ferry_pool *pool, const ferry_tensor *tensors,
                                   const void *const *srcs, size_t count, uint64_t timeout_ns,
                                   ferry_descriptor *descs, uint64_t *offsets, uint64_t *lengths)
{
    uint64_t total = 0;
    lease l;
    ferry_status st = pack_layout(tensors, srcs, count, offsets, lengths, &total);
    if (st == FERRY_OK)
        st = check_fits(pool, total);
    if (st == FERRY_OK)
        st = lease_acquire(pool, total, timeout_ns, &l);
    if (st != FERRY_OK)
        return st;
    for (size_t i = 0; i < count && st == FERRY_OK; i++)
        st = pool->ops->copy_in(&pool->mem, l.offset + offsets[i], srcs[i], lengths[i]);
    if (st != FERRY_OK) {
        lease_abort(pool, &l);
        lease_done(pool);
        return st;
    }
    uint8_t flags = count > 1 ? FERRY_DESC_FLAG_MULTI : 0;
    for (size_t i = 0; i < count; i++)
        fill_descriptor(pool, &l, l.offset + offsets[i], lengths[i], &tensors[i], flags, &descs[i]);
    mark_ready(pool, &l);
    lease_done(pool);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_publish_many(ferry_pool *pool, const ferry_tensor *tensors,
                                     const void *const *srcs, size_t count, uint64_t timeout_ns,
                                     ferry_descriptor *descs)
{
    ferry_status st = check_pool_arg(pool, tensors, "tensors");
    if (st == FERRY_OK)
        st = check_pool_arg(pool, srcs, "sources");
    if (st == FERRY_OK)
        st = check_pool_arg(pool, descs, "descriptor output");
    if (st == FERRY_OK && count == 0)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "publish_many needs at least one tensor");
    if (st != FERRY_OK)
        return st;
    uint64_t stack_off[FERRY_PACK_STACK], stack_len[FERRY_PACK_STACK];
    uint64_t *offsets = stack_off, *lengths = stack_len;
    if (count > FERRY_PACK_STACK) {
        offsets = calloc(count, sizeof(*offsets));
        lengths = calloc(count, sizeof(*lengths));
        if (!offsets || !lengths) {
            st = ferry__fail(FERRY_NO_MEMORY, "out of memory for %zu tensors", count);
            goto free_layout;
        }
    }
    st = publish_packed(pool, tensors, srcs, count, timeout_ns, descs, offsets, lengths);
free_layout:
    if (offsets != stack_off) {
        free(offsets);
        free(lengths);
    }
    return st;
}

ferry_status ferry_pool_reserve(ferry_pool *pool, const ferry_tensor *tensor, uint64_t timeout_ns,
                                void **data, ferry_descriptor *desc)
{
    uint64_t length;
    lease l;
    void *ptr;
    ferry_status st = check_pool_arg(pool, tensor, "tensor");
    if (st == FERRY_OK)
        st = check_pool_arg(pool, data, "data output");
    if (st == FERRY_OK)
        st = check_pool_arg(pool, desc, "descriptor output");
    if (st == FERRY_OK)
        st = ferry_tensor_nbytes(tensor, &length);
    if (st == FERRY_OK)
        st = check_fits(pool, length);
    if (st == FERRY_OK)
        st = lease_acquire(pool, length, timeout_ns, &l);
    if (st != FERRY_OK)
        return st;
    st = pool->ops->slice_ptr(&pool->mem, l.offset, &ptr);
    if (st != FERRY_OK) {
        lease_abort(pool, &l);
        lease_done(pool);
        return st;
    }
    fill_descriptor(pool, &l, l.offset, length, tensor, 0, desc);
    lease_done(pool);
    *data = ptr;
    ferry__clear_error();
    return FERRY_OK;
}

/* The lease a descriptor names, if it is this pool's current lease of its slot. */
static ferry_status find_lease_locked(ferry_pool *pool, const ferry_descriptor *d, const char *verb)
{
    if (memcmp(d->pool_id, pool->pool_id, 16) != 0)
        return ferry__fail(FERRY_MISMATCH, "descriptor names another pool");
    if (d->slot >= pool->max_inflight || pool->slots[d->slot].inflight_pos == FERRY_NIL ||
        pool->slots[d->slot].generation != d->generation)
        return ferry__fail(FERRY_INACTIVE_LEASE,
                           "Cannot %s inactive %s pool lease (slot=%u, generation=%u)", verb,
                           pool->ops->name, d->slot, d->generation);
    return FERRY_OK;
}

ferry_status ferry_pool_commit(ferry_pool *pool, const ferry_descriptor *desc)
{
    ferry_status st = check_pool_arg(pool, desc, "descriptor");
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&pool->lock);
    st = find_lease_locked(pool, desc, "commit");
    if (st == FERRY_OK) {
        uint32_t *row = ferry__row(pool->mem.control, pool->row_words, desc->slot);
        if (ferry__load_acquire32(&row[0]) == desc->generation)
            st = ferry__fail(FERRY_INACTIVE_LEASE,
                             "%s pool lease (slot=%u, generation=%u) is already committed",
                             pool->ops->name, desc->slot, desc->generation);
        else
            ferry__store_seqcst32(&row[0], desc->generation);
    }
    pthread_mutex_unlock(&pool->lock);
    if (st != FERRY_OK)
        return st;
    ferry__signal_ready(pool, desc->slot);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_cancel(ferry_pool *pool, const ferry_descriptor *desc)
{
    ferry_status st = check_pool_arg(pool, desc, "descriptor");
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&pool->lock);
    st = find_lease_locked(pool, desc, "release");
    if (st == FERRY_OK) {
        uint32_t *row = ferry__row(pool->mem.control, pool->row_words, desc->slot);
        for (uint32_t w = 1; w < pool->row_words; w++)
            ferry__store_release32(&row[w], desc->generation);
        ferry__store_seqcst32(&row[0], desc->generation);
        ferry__slot_release_locked(pool, desc->slot);
        pool->stats.cancelled++;
    }
    pthread_mutex_unlock(&pool->lock);
    if (st != FERRY_OK)
        return st;
    ferry__signal_ready(pool, desc->slot);
    ferry__signal_space(pool);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_reclaim(ferry_pool *pool, uint64_t *reclaimed)
{
    if (!pool)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool is NULL");
    pthread_mutex_lock(&pool->lock);
    uint64_t acked = ferry__reap_dead_locked(pool);
    uint64_t n = ferry__reclaim_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    if (acked || n)
        ferry__signal_space(pool);
    if (reclaimed)
        *reclaimed = n;
    ferry__clear_error();
    return FERRY_OK;
}

/* ---- observation -------------------------------------------------------------------- */

static uint64_t alive_ranks_locked(ferry_pool *pool, uint64_t *attached)
{
    uint64_t alive = 0;
    *attached = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        const ferry__rank *rk = &pool->ranks[r];
        if (!rk->pid)
            continue;
        (*attached)++;
        alive += !rk->dead && ferry__proc_alive(rk->pid, rk->starttime);
    }
    return alive;
}

ferry_status ferry_pool_stats_get(ferry_pool *pool, ferry_pool_stats *stats)
{
    ferry_status st = check_pool_arg(pool, stats, "stats");
    if (st != FERRY_OK)
        return st;
    if (stats->struct_size < sizeof(*stats) || stats->version != FERRY_POOL_STATS_VERSION)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "stats has struct_size=%u version=%u; set them to "
                           "sizeof(ferry_pool_stats) and FERRY_POOL_STATS_VERSION",
                           stats->struct_size, stats->version);
    pthread_mutex_lock(&pool->lock);
    ferry_pool_stats s = pool->stats;
    s.struct_size = stats->struct_size;
    s.version = stats->version;
    s.capacity = (uint64_t)pool->config.memory_size;
    s.usable_bytes = pool->data_size;
    s.bytes_in_use = pool->alloc.used_bytes;
    s.largest_free = ferry__alloc_largest_free(&pool->alloc);
    s.leases_in_flight = pool->inflight_count;
    s.broker_refused = ferry__broker_refused(pool->broker);
    s.consumers_alive = alive_ranks_locked(pool, &s.consumers_attached);
    pthread_mutex_unlock(&pool->lock);
    *stats = s;
    ferry__clear_error();
    return FERRY_OK;
}

static void rank_backlog_locked(ferry_pool *pool, uint32_t rank, ferry_consumer_info *info)
{
    uint64_t now = ferry__now_ns();
    for (uint32_t i = 0; i < pool->inflight_count; i++) {
        uint32_t slot = pool->inflight[i];
        const uint32_t *row = ferry__row(pool->mem.control, pool->row_words, slot);
        uint32_t gen = pool->slots[slot].generation;
        if (ferry__load_acquire32(&row[0]) != gen || ferry__load_acquire32(&row[1 + rank]) == gen)
            continue;
        info->outstanding++;
        uint64_t age = now - pool->slots[slot].leased_ns;
        if (age > info->oldest_age_ns)
            info->oldest_age_ns = age;
    }
}

ferry_status ferry_pool_consumer_info(ferry_pool *pool, uint32_t rank, ferry_consumer_info *info)
{
    ferry_status st = check_pool_arg(pool, info, "info");
    if (st != FERRY_OK)
        return st;
    if (rank >= pool->consumers)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank %u is out of range (consumers=%u)", rank,
                           pool->consumers);
    ferry_consumer_info ci = {0};
    pthread_mutex_lock(&pool->lock);
    const ferry__rank *rk = &pool->ranks[rank];
    ci.attached = rk->pid != 0;
    ci.pid = rk->pid;
    ci.alive = ci.attached && !rk->dead && ferry__proc_alive(rk->pid, rk->starttime);
    rank_backlog_locked(pool, rank, &ci);
    pthread_mutex_unlock(&pool->lock);
    *info = ci;
    ferry__clear_error();
    return FERRY_OK;
}
