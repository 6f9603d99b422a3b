/* The pool engine: leases, publishing, commit, cancel and the pool's life cycle. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "driver/driver.h"
#include "policy/policy.h"
#include "pool/pool.h"
#include "remote/remote.h"
#include "shm/signal.h"
#include "shm/wait.h"

/* How a lease is created: its publisher writes the ready word itself (publish; a reservation
 * is committed later), and its descriptors go out through the rings (ferry_pool_send). */
enum { LEASE_COMMITTED = 1, LEASE_SENT = 2 };

/* A lease being created: where its slice is and which generation it carries. */
typedef struct lease {
    uint32_t slot;
    uint32_t generation;
    uint64_t offset;
} lease;

/* ---- creation and destruction ------------------------------------------------------- */

static ferry_status random_bytes(uint8_t *buf, size_t n)
{
    if (ferry__random_bytes(buf, n) != 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "getrandom failed");
    return FERRY_OK;
}

static void init_shared(ferry_pool *pool)
{
    ferry__shm_header_write(&pool->mem.shm, (uint32_t)pool->ops->backend, pool->memory_size,
                            pool->data_start, pool->data_size, pool->mem.flags, pool->mem.device,
                            pool->pool_id, pool->config.initial_generation);
}

static ferry_status init_tables(ferry_pool *pool)
{
    ferry_status st =
        ferry__alloc_init(&pool->alloc, pool->data_size, FERRY_DATA_ALIGN, pool->max_inflight);
    if (st != FERRY_OK)
        return st;
    pool->slots = calloc(pool->max_inflight, sizeof(*pool->slots));
    pool->free_slots = calloc(pool->max_inflight, sizeof(*pool->free_slots));
    pool->inflight = calloc(pool->max_inflight, sizeof(*pool->inflight));
    if (!pool->slots || !pool->free_slots || !pool->inflight)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory for bookkeeping",
                           pool->ops->name);
    for (uint32_t s = 0; s < pool->max_inflight; s++) {
        pool->slots[s].generation = pool->config.initial_generation;
        pool->slots[s].inflight_pos = FERRY_NIL;
        pool->free_slots[s] = s;
    }
    pool->free_count = pool->max_inflight;
    return ferry__ranks_init(pool);
}

static void free_tables(ferry_pool *pool)
{
    ferry__alloc_fini(&pool->alloc);
    free(pool->slots);
    free(pool->free_slots);
    free(pool->inflight);
    ferry__ranks_fini(pool);
    ferry__holds_fini(pool);
}

static ferry_status init_sync(ferry_pool *pool)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_mutex_init(&pool->notify_lock, NULL);
    pthread_cond_init(&pool->reclaimer_cv, &attr);
    pthread_cond_init(&pool->idle_cv, &attr);
    pthread_condattr_destroy(&attr);
    return FERRY_OK;
}

static void fini_sync(ferry_pool *pool)
{
    pthread_cond_destroy(&pool->idle_cv);
    pthread_cond_destroy(&pool->reclaimer_cv);
    pthread_mutex_destroy(&pool->notify_lock);
    pthread_mutex_destroy(&pool->lock);
}

static ferry_status start_broker(ferry_pool *pool)
{
    snprintf(pool->broker_label, sizeof(pool->broker_label), "%s pool broker", pool->ops->name);
    ferry__broker_config bc = {
        .pool_id = pool->pool_id,
        .shared_fd = pool->mem.shared_fd,
        .shared_size = pool->mem.shared_size,
        .consumer_count = pool->consumers,
        .label = pool->broker_label,
        .on_attach = ferry__ranks_attach,
        .on_describe = ferry__channel_describe,
        .on_notify = ferry__channel_notify,
        .on_release = ferry__ranks_release,
        .user = pool,
    };
    return ferry__broker_start(&bc, &pool->broker, pool->broker_name);
}

static ferry_status pool_setup(ferry_pool *pool, const ferry_pool_config *caller)
{
    ferry_pool_config full;
    ferry_status st = ferry_pool_config_check(caller); /* the struct first, then its fields */
    if (st != FERRY_OK)
        return st;
    ferry__config_normalize(caller, &full);
    st = ferry__policy_resolve_config(&full, &full); /* AUTO, FERRY_DEVICE_DEFAULT */
    if (st != FERRY_OK)
        return st;
    const ferry_pool_config *config = &full;
    st = ferry__transport_select(config->backend, &pool->ops);
    if (st == FERRY_OK)
        st = ferry__config_validate(config, pool->ops, &pool->data_start);
    if (st != FERRY_OK)
        return st;
    pool->config = *config;
    pool->consumers = (uint32_t)config->consumer_count;
    pool->max_inflight = (uint32_t)config->max_inflight_slices;
    pool->row_words = 1 + pool->consumers;
    pool->pid = ferry__proc_self();
    pool->mem.shared_fd = -1;
    st = random_bytes(pool->pool_id, sizeof(pool->pool_id));
    memcpy(pool->mem.pool_id, pool->pool_id, sizeof(pool->pool_id));
    return st;
}

/* The data region of the memory the transport really allocated (CUDA VMM rounds the pool
 * down to its granularity, which can leave too little after the control table). */
static ferry_status size_data(ferry_pool *pool)
{
    pool->memory_size = pool->mem.memory_size;
    if (pool->memory_size < pool->data_start + FERRY_DATA_ALIGN)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "%s pool is too small after control metadata: pool=%llu, control=%llu",
                           pool->ops->name, (unsigned long long)pool->memory_size,
                           (unsigned long long)pool->data_start);
    pool->data_size = (pool->memory_size - pool->data_start) & ~(uint64_t)(FERRY_DATA_ALIGN - 1);
    return FERRY_OK;
}

ferry_status ferry_pool_create(const ferry_pool_config *config, ferry_pool **out)
{
    FERRY_CUDA_BOUNDARY;
    if (!out || !config)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool config or output pointer is NULL");
    ferry_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for the pool");
    ferry_status st = pool_setup(pool, config);
    if (st != FERRY_OK)
        goto free_pool;
    init_sync(pool);
    st = pool->ops->create(&pool->config, pool->data_start, &pool->mem);
    if (st != FERRY_OK)
        goto fini_sync;
    st = size_data(pool);
    if (st == FERRY_OK)
        st = init_tables(pool);
    if (st != FERRY_OK)
        goto destroy_memory;
    init_shared(pool);
    st = ferry__channel_init(pool);
    if (st == FERRY_OK)
        st = start_broker(pool);
    if (st != FERRY_OK)
        goto destroy_memory;
    st = ferry__pool_remote_start(pool);
    if (st != FERRY_OK)
        goto stop_broker;
    st = ferry__reclaimer_start(pool);
    if (st != FERRY_OK)
        goto stop_remote;
    *out = pool;
    ferry__clear_error();
    return FERRY_OK;
stop_remote:
    ferry__remote_stop(pool->remote);
stop_broker:
    ferry__broker_stop(pool->broker);
destroy_memory:
    pool->ops->destroy(&pool->mem);
    ferry__channel_fini(pool);
    free_tables(pool);
fini_sync:
    fini_sync(pool);
free_pool:
    free(pool);
    return st;
}

static void check_health_locked(ferry_pool *pool);
static ferry_status closing_error(ferry_pool *pool);

static int forked(const ferry_pool *pool)
{
    return pool->pid != ferry__proc_self();
}

static ferry_status forked_error(const ferry_pool *pool)
{
    return ferry__fail(FERRY_FORKED,
                       "%s pool was created by process %d; this forked child (pid %d) cannot "
                       "use it: create a pool in the child",
                       pool->ops->name, (int)pool->pid, (int)ferry__proc_self());
}

/* 1 if a reservation is neither committed nor cancelled: a zero-copy writer may still be
 * filling it, so the memory stays mapped until ferry_pool_destroy. */
static int reservations_out_locked(const ferry_pool *pool)
{
    for (uint32_t i = 0; i < pool->inflight_count; i++) {
        const ferry__slot *s = &pool->slots[pool->inflight[i]];
        if (!s->committed && !s->cancelled)
            return 1;
    }
    return 0;
}

/* The pool's life: open -> closing (set under the lock: every entry point refuses from
 * here, the counted ones in flight finish) -> closed (memory released, or kept until destroy
 * while a reservation is outstanding). A second close waits for the first to finish. */
void ferry_pool_close(ferry_pool *pool)
{
    FERRY_CUDA_BOUNDARY;
    if (!pool || forked(pool))
        return;
    if (pool->config.drain_timeout_us > 0 &&
        ferry_pool_drain(pool, (uint64_t)pool->config.drain_timeout_us * 1000u) == FERRY_TIMEOUT)
        ferry__log(FERRY_LOG_WARN, "%s; closing anyway", ferry_last_error());
    pthread_mutex_lock(&pool->lock);
    if (pool->closing) {
        while (!pool->closed)
            pthread_cond_wait(&pool->idle_cv, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
        return;
    }
    pool->closing = 1;
    pthread_mutex_unlock(&pool->lock);
    ferry__shm_acked(&pool->mem.shm); /* publishers waiting for space see the pool closing */
    ferry__channel_wake(pool);        /* and so do senders waiting for room in a ring */
    pthread_mutex_lock(&pool->lock);
    while (pool->active)
        pthread_cond_wait(&pool->idle_cv, &pool->lock);
    pool->release_at_destroy = reservations_out_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    ferry__shm_close(&pool->mem.shm);
    /* every consumer that might sleep on a ready word sees it */
    ferry__shm_ready_wake_all(&pool->mem.shm, pool->mem.control, pool->max_inflight,
                              pool->row_words);
    ferry__channel_wake(pool);        /* receivers, and their poll fds, see it */
    ferry__remote_stop(pool->remote); /* remote consumers see their connections end */
    pool->remote = NULL;
    ferry__reclaimer_stop(pool);
    ferry__broker_stop(pool->broker);
    pool->broker = NULL;
    if (!pool->release_at_destroy)
        pool->ops->destroy(&pool->mem);
    pthread_mutex_lock(&pool->lock);
    pool->closed = 1;
    pthread_cond_broadcast(&pool->idle_cv);
    pthread_mutex_unlock(&pool->lock);
}

/* In a forked child: the pool's threads, device memory and shared words are the parent's.
 * Only the child's copies of the mappings, fds and heap are released; the locks are not
 * touched (a parent thread may have held them at the fork). */
static void forget_in_child(ferry_pool *pool)
{
    ferry__broker_forget(pool->broker);
    ferry__remote_forget(pool->remote);
    pool->ops->forget(&pool->mem);
    ferry__channel_fini(pool);
    free_tables(pool);
    free(pool);
}

void ferry_pool_destroy(ferry_pool *pool)
{
    FERRY_CUDA_BOUNDARY;
    if (!pool)
        return;
    if (forked(pool)) {
        forget_in_child(pool);
        return;
    }
    ferry_pool_close(pool);
    if (pool->release_at_destroy)
        pool->ops->destroy(&pool->mem);
    ferry__channel_fini(pool);
    free_tables(pool);
    fini_sync(pool);
    free(pool);
}

ferry_status ferry_pool_error(ferry_pool *pool, char *cause, size_t size)
{
    FERRY_CUDA_BOUNDARY;
    if (!pool)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool is NULL");
    if (forked(pool))
        return forked_error(pool);
    pthread_mutex_lock(&pool->lock);
    if (!pool->closing)
        check_health_locked(pool);
    ferry_status st = pool->failed != FERRY_OK ? FERRY_POOL_FAILED : FERRY_OK;
    int closing = pool->closing;
    if (cause && size)
        snprintf(cause, size, "%s", st == FERRY_OK ? "" : pool->failure);
    pthread_mutex_unlock(&pool->lock);
    if (st != FERRY_OK)
        return ferry__fail(st, "%s pool failed: %s", pool->ops->pool_name, pool->failure);
    if (closing) /* a latched failure stays retrievable after close; health does not */
        return closing_error(pool);
    ferry__clear_error();
    return FERRY_OK;
}

/* ---- leases ------------------------------------------------------------------------- */

static ferry_status try_lease_locked(ferry_pool *pool, uint64_t bytes, int how, lease *out)
{
    if (!pool->free_count)
        return FERRY_POOL_FULL;
    uint32_t slot = pool->free_slots[pool->free_head];
    ferry__slot *s = &pool->slots[slot];
    if (s->generation >= FERRY_GENERATION_MAX) {
        /* Retire the slot so that the pool keeps serving with the others. */
        pool->free_head = (pool->free_head + 1) % pool->max_inflight;
        pool->free_count--;
        return ferry__fail(FERRY_GENERATION_EXHAUSTED,
                           "%s pool slot generation exhausted (slot=%u, generation=%u)",
                           pool->ops->name, slot, s->generation);
    }
    uint64_t offset;
    uint32_t handle;
    ferry_status st = ferry__alloc_alloc(&pool->alloc, bytes ? bytes : 1, &offset, &handle);
    if (st != FERRY_OK)
        return st;
    pool->free_head = (pool->free_head + 1) % pool->max_inflight;
    pool->free_count--;
    s->offset = offset;
    s->length = bytes;
    s->handle = handle;
    s->committed = (how & LEASE_COMMITTED) != 0;
    s->sent = (how & LEASE_SENT) != 0;
    s->pushed = 0;
    s->cancelled = 0;
    s->generation++;
    s->leased_ns = ferry__now_ns();
    s->inflight_pos = pool->inflight_count;
    pool->inflight[pool->inflight_count++] = slot;
    ferry__shm_lease_begin(&pool->mem.shm, slot, s->generation, offset, bytes);
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
static ferry_status lease_once_locked(ferry_pool *pool, uint64_t bytes, int how, lease *out)
{
    ferry_status st = try_lease_locked(pool, bytes, how, out);
    if (st == FERRY_POOL_FULL && ferry__reclaim_locked(pool))
        st = try_lease_locked(pool, bytes, how, out);
    if (st == FERRY_POOL_FULL && ferry__reap_dead_locked(pool) && ferry__reclaim_locked(pool))
        st = try_lease_locked(pool, bytes, how, out);
    if (st == FERRY_OK)
        note_lease_locked(pool);
    return st;
}

/* A publisher's wait for space (ferry__wait_run): every acknowledgement bumps the header's
 * sequence and wakes it. */
typedef struct space_wait {
    ferry_pool *pool;
    uint64_t bytes;
    int how;
    lease *out;
    uint32_t seq; /* the acknowledgement sequence before the last look */
} space_wait;

static int space_look(void *arg)
{
    space_wait *w = arg;
    ferry_pool *pool = w->pool;
    w->seq = ferry__shm_ack_seq(&pool->mem.shm);
    pthread_mutex_lock(&pool->lock);
    ferry_status st =
        pool->closing ? FERRY_CLOSING : lease_once_locked(pool, w->bytes, w->how, w->out);
    pthread_mutex_unlock(&pool->lock);
    return st == FERRY_POOL_FULL ? FERRY__WAIT_AGAIN : (int)st;
}

static void space_sleep(void *arg, uint64_t ns)
{
    space_wait *w = arg;
    ferry__shm_sleep_on_acks(&w->pool->mem.shm, w->seq, ns);
}

static int space_expired(void *arg)
{
    (void)arg;
    return FERRY_POOL_FULL;
}

static ferry_status lease_wait(ferry_pool *pool, uint64_t bytes, int how, uint64_t deadline,
                               lease *out)
{
    space_wait sw = {.pool = pool, .bytes = bytes, .how = how, .out = out};
    ferry__wait w = {
        .look = space_look,
        .sleep = space_sleep,
        .expired = space_expired,
        .ctx = &sw,
        .slice_ns = pool->ops->space_poll_ns, /* GPU streams' acks wake nobody */
    };
    ferry__shm_space_wait_begin(&pool->mem.shm);
    ferry_status st = ferry__wait_run(&w, 0, deadline);
    ferry__shm_space_wait_end(&pool->mem.shm);
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
    return ferry__fail(FERRY_CLOSING, "%s pool is closing", pool->ops->pool_name);
}

void ferry__latch_locked(ferry_pool *pool, ferry_status status, const char *cause)
{
    if (pool->failed != FERRY_OK)
        return;
    pool->failed = status;
    size_t n = strnlen(cause, sizeof(pool->failure) - 1);
    memcpy(pool->failure, cause, n);
    pool->failure[n] = '\0';
    ferry__log(FERRY_LOG_ERROR, "%s pool failed: %s", pool->ops->pool_name, pool->failure);
}

/* Latches the first failure of the pool's background parts (its broker, the transport's). */
static void check_health_locked(ferry_pool *pool)
{
    char cause[256];
    ferry_status st = ferry__broker_error(pool->broker, cause, sizeof(cause));
    if (st == FERRY_OK)
        st = pool->ops->check(&pool->mem, cause, sizeof(cause));
    if (st != FERRY_OK)
        ferry__latch_locked(pool, st, cause);
}

/* FERRY_OK if the pool takes new work: not closing, not failed. */
static ferry_status usable_locked(ferry_pool *pool)
{
    if (pool->closing)
        return closing_error(pool);
    check_health_locked(pool);
    if (pool->failed != FERRY_OK)
        return ferry__fail(FERRY_POOL_FAILED, "%s pool failed", pool->ops->pool_name);
    return FERRY_OK;
}

static void lease_done_locked(ferry_pool *pool)
{
    if (--pool->active == 0 && pool->closing)
        pthread_cond_broadcast(&pool->idle_cv);
}

static ferry_status wait_for_space_locked(ferry_pool *pool, uint64_t bytes, int how,
                                          uint64_t timeout_ns, uint64_t deadline, lease *out)
{
    ferry_status st = FERRY_POOL_FULL;
    pool->stats.pool_full_events++;
    if (!pool->warned_full) {
        pool->warned_full = 1;
        report_full_locked(pool, bytes);
        ferry__log(FERRY_LOG_WARN, "%s (publishers get POOL_FULL or wait; warned once)",
                   ferry_last_error());
    }
    if (timeout_ns) {
        pool->stats.pool_full_waits++;
        pthread_mutex_unlock(&pool->lock);
        st = lease_wait(pool, bytes, how, deadline, out);
        pthread_mutex_lock(&pool->lock);
        if (st == FERRY_POOL_FULL)
            pool->stats.pool_full_timeouts++;
    }
    if (st == FERRY_POOL_FULL)
        report_full_locked(pool, bytes);
    if (st == FERRY_CLOSING)
        closing_error(pool);
    return st;
}

/* A lease that can never fit is the caller's signal to take its fallback path: POOL_FULL at
 * once, whatever the timeout, counted apart from the pool being full for now. */
static ferry_status too_large_locked(ferry_pool *pool, uint64_t bytes)
{
    pool->stats.too_large++;
    return ferry__fail(FERRY_POOL_FULL,
                       "%s pool: %llu bytes can never fit in its %llu usable bytes (take the "
                       "fallback path)",
                       pool->ops->name, (unsigned long long)bytes,
                       (unsigned long long)pool->data_size);
}

/* Creates a lease of bytes, waiting up to timeout_ns for space, made as how says.
 * The caller is an active publisher from here (close waits for it) and, on success, must
 * call lease_done. */
static ferry_status lease_acquire(ferry_pool *pool, uint64_t bytes, int how, uint64_t timeout_ns,
                                  lease *out)
{
    /* The wait for space starts counting when the pool is found full (microseconds later):
     * a publish that finds room reads no clock for it. */
    pthread_mutex_lock(&pool->lock);
    ferry_status st = usable_locked(pool);
    if (st == FERRY_OK && bytes > pool->data_size)
        st = too_large_locked(pool, bytes);
    if (st == FERRY_OK) {
        pool->active++;
        st = lease_once_locked(pool, bytes, how, out);
        if (st == FERRY_POOL_FULL)
            st = wait_for_space_locked(pool, bytes, how, timeout_ns, ferry__deadline(timeout_ns),
                                       out);
        if (st != FERRY_OK)
            lease_done_locked(pool);
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

static void lease_done(ferry_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    lease_done_locked(pool);
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
    d->pool_size = pool->memory_size;
    memcpy(d->pool_id, pool->pool_id, 16);
    memcpy(d->broker, pool->broker_name, 16);
    d->producer_pid = (uint32_t)pool->pid;
    d->device = pool->mem.device;
    d->flags |= pool->mem.flags;
    memcpy(d->handle, pool->mem.handle, sizeof(d->handle));
    d->tensor = *t;
}

/* Returns a lease that was never marked ready (a failed copy): its row is completed so
 * that its descriptor, if any escaped, reads as cancelled. */
static void lease_abort(ferry_pool *pool, const lease *l)
{
    char cause[256];
    snprintf(cause, sizeof(cause), "%s", ferry_last_error());
    pthread_mutex_lock(&pool->lock);
    if (pool->ops->write_words(&pool->mem, ferry__shm_ready_word(&pool->mem.shm.layout, l->slot),
                               pool->row_words, l->generation) == FERRY_OK) {
        ferry__slot_release_locked(pool, l->slot);
    } else {
        /* The slice cannot be handed back safely: the pool is failed from here on. */
        char both[512];
        snprintf(both, sizeof(both), "%.240s; its cleanup failed too: %.240s", cause,
                 ferry_last_error());
        ferry__latch_locked(pool, FERRY_POOL_FAILED, both);
        ferry__fail(FERRY_OK, "%s", cause); /* the caller reports the first cause */
    }
    pthread_mutex_unlock(&pool->lock);
}

static ferry_status check_pool_arg(ferry_pool *pool, const void *ptr, const char *what)
{
    if (!pool)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool is NULL");
    if (forked(pool))
        return forked_error(pool);
    if (!ptr)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "%s is NULL", what);
    return FERRY_OK;
}

ferry_status ferry__pool_check(ferry_pool *pool, const void *ptr, const char *what)
{
    return check_pool_arg(pool, ptr, what);
}

ferry_status ferry__pool_closing_error(ferry_pool *pool)
{
    return closing_error(pool);
}

ferry_status ferry__pool_enter(ferry_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    ferry_status st = usable_locked(pool);
    if (st == FERRY_OK)
        pool->active++;
    pthread_mutex_unlock(&pool->lock);
    return st;
}

void ferry__pool_leave(ferry_pool *pool)
{
    lease_done(pool);
}

ferry_status ferry_pool_publish(ferry_pool *pool, const ferry_tensor *tensor, const void *src,
                                uint64_t timeout_ns, ferry_descriptor *desc)
{
    return ferry_pool_publish_many_async(pool, tensor, &src, 1, NULL, timeout_ns, desc);
}

ferry_status ferry_pool_publish_async(ferry_pool *pool, const ferry_tensor *tensor, const void *src,
                                      void *stream, uint64_t timeout_ns, ferry_descriptor *desc)
{
    return ferry_pool_publish_many_async(pool, tensor, &src, 1, stream, timeout_ns, desc);
}

ferry_status ferry_pool_publish_many(ferry_pool *pool, const ferry_tensor *tensors,
                                     const void *const *srcs, size_t count, uint64_t timeout_ns,
                                     ferry_descriptor *descs)
{
    return ferry_pool_publish_many_async(pool, tensors, srcs, count, NULL, timeout_ns, descs);
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

#define FERRY_PACK_STACK 16

/* Acknowledges the lease for the ranks r with preack[r] set, run by run. */
static ferry_status preack_ranks(ferry_pool *pool, const lease *l, const uint8_t *preack)
{
    ferry_status st = FERRY_OK;
    for (uint32_t r = 0; r < pool->consumers && st == FERRY_OK;) {
        uint32_t end = r;
        while (end < pool->consumers && preack[end])
            end++;
        if (end > r)
            st = pool->ops->write_words(&pool->mem,
                                        ferry__shm_ack_word(&pool->mem.shm.layout, l->slot, r),
                                        end - r, l->generation);
        r = end + 1;
    }
    return st;
}

static ferry_status publish_packed(ferry_pool *pool, const ferry_tensor *tensors,
                                   const void *const *srcs, size_t count, void *stream,
                                   uint64_t timeout_ns, ferry_descriptor *descs, uint64_t *offsets,
                                   uint64_t *lengths, const uint8_t *preack)
{
    uint64_t total = 0;
    lease l;
    ferry_status st = pack_layout(tensors, srcs, count, offsets, lengths, &total);
    if (st == FERRY_OK)
        st =
            lease_acquire(pool, total, LEASE_COMMITTED | (preack ? LEASE_SENT : 0), timeout_ns, &l);
    if (st != FERRY_OK)
        return st;
    for (size_t i = 0; i < count && st == FERRY_OK; i++)
        if (lengths[i])
            st = pool->ops->copy_in(&pool->mem, l.offset + offsets[i], srcs[i], lengths[i], stream);
    if (st == FERRY_OK && preack)
        st = preack_ranks(pool, &l, preack);
    if (st == FERRY_OK)
        st = pool->ops->mark_ready(&pool->mem, ferry__shm_ready_word(&pool->mem.shm.layout, l.slot),
                                   l.generation, stream);
    if (st != FERRY_OK) {
        lease_abort(pool, &l);
        lease_done(pool);
        return st;
    }
    uint8_t flags = count > 1 ? FERRY_DESC_FLAG_MULTI : 0;
    for (size_t i = 0; i < count; i++) {
        fill_descriptor(pool, &l, l.offset + offsets[i], lengths[i], &tensors[i], flags, &descs[i]);
        if (count > 1) {
            descs[i].part_index = (uint32_t)i;
            descs[i].part_count = (uint32_t)count;
        }
    }
    lease_done(pool);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_publish_many_async(ferry_pool *pool, const ferry_tensor *tensors,
                                           const void *const *srcs, size_t count, void *stream,
                                           uint64_t timeout_ns, ferry_descriptor *descs)
{
    FERRY_CUDA_BOUNDARY;
    return ferry__publish(pool, tensors, srcs, count, stream, timeout_ns, descs, NULL);
}

ferry_status ferry__publish(ferry_pool *pool, const ferry_tensor *tensors, const void *const *srcs,
                            size_t count, void *stream, uint64_t timeout_ns,
                            ferry_descriptor *descs, const uint8_t *preack)
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
    if (count > UINT32_MAX)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "publish_many takes at most %u tensors",
                           UINT32_MAX);
    if (count > FERRY_PACK_STACK) {
        offsets = calloc(count, sizeof(*offsets));
        lengths = calloc(count, sizeof(*lengths));
        if (!offsets || !lengths) {
            st = ferry__fail(FERRY_NO_MEMORY, "out of memory for %zu tensors", count);
            goto free_layout;
        }
    }
    st = publish_packed(pool, tensors, srcs, count, stream, timeout_ns, descs, offsets, lengths,
                        preack);
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
    FERRY_CUDA_BOUNDARY;
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
        st = lease_acquire(pool, length, 0, timeout_ns, &l); /* committed later */
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
        pool->slots[d->slot].generation != d->generation || pool->slots[d->slot].cancelled)
        return ferry__fail(FERRY_INACTIVE_LEASE,
                           "Cannot %s inactive %s pool lease (slot=%u, generation=%u)", verb,
                           pool->ops->name, d->slot, d->generation);
    return FERRY_OK;
}

ferry_status ferry_pool_commit(ferry_pool *pool, const ferry_descriptor *desc)
{
    return ferry_pool_commit_async(pool, desc, NULL);
}

ferry_status ferry_pool_commit_async(ferry_pool *pool, const ferry_descriptor *desc, void *stream)
{
    FERRY_CUDA_BOUNDARY;
    ferry_status st = check_pool_arg(pool, desc, "descriptor");
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&pool->lock);
    st = pool->closing ? closing_error(pool) : find_lease_locked(pool, desc, "commit");
    if (st == FERRY_OK && pool->slots[desc->slot].committed)
        st = ferry__fail(FERRY_INACTIVE_LEASE,
                         "%s pool lease (slot=%u, generation=%u) is already committed",
                         pool->ops->name, desc->slot, desc->generation);
    if (st == FERRY_OK)
        st = pool->ops->mark_ready(&pool->mem,
                                   ferry__shm_ready_word(&pool->mem.shm.layout, desc->slot),
                                   desc->generation, stream);
    if (st == FERRY_OK)
        pool->slots[desc->slot].committed = 1;
    pthread_mutex_unlock(&pool->lock);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* Completes a lease's row for every rank (and its ready word if it was never committed).
 * A GPU copy may still be running into the slice: the slot is freed here only if its row is
 * complete already, otherwise by the reclaimer once the producer's stream has written ready. */
static ferry_status cancel_locked(ferry_pool *pool, uint32_t slot)
{
    ferry__slot *s = &pool->slots[slot];
    uint64_t first = ferry__shm_ready_word(&pool->mem.shm.layout, slot) + (s->committed ? 1 : 0);
    uint32_t count = pool->consumers + (s->committed ? 0 : 1);
    /* The lease is marked dead before any word that lets a reader in (the ready word, a
     * rank's acknowledgement): a reader that sees one of them sees the mark when it checks
     * the generation again after its copy, and ends STALE. */
    ferry__shm_lease_cancel(&pool->mem.shm, slot, s->generation);
    ferry_status st = pool->ops->write_words(&pool->mem, first, count, s->generation);
    if (st != FERRY_OK) {
        ferry__shm_lease_uncancel(&pool->mem.shm, slot, s->generation); /* it lives on */
        return st;
    }
    s->cancelled = 1;
    pool->stats.cancelled++;
    if (pool->ops->sync_control(&pool->mem) == FERRY_OK && ferry__row_released_locked(pool, slot))
        ferry__slot_release_locked(pool, slot);
    return FERRY_OK;
}

/* A part of a packed lease whose lease another part already cancelled: nothing to do. */
static int sibling_cancelled_locked(const ferry_pool *pool, const ferry_descriptor *d)
{
    return (d->flags & FERRY_DESC_FLAG_MULTI) && memcmp(d->pool_id, pool->pool_id, 16) == 0 &&
           d->slot < pool->max_inflight && pool->slots[d->slot].generation == d->generation &&
           pool->slots[d->slot].cancelled;
}

ferry_status ferry_pool_cancel(ferry_pool *pool, const ferry_descriptor *desc)
{
    FERRY_CUDA_BOUNDARY;
    ferry_status st = check_pool_arg(pool, desc, "descriptor");
    if (st != FERRY_OK)
        return st;
    pthread_mutex_lock(&pool->lock);
    if (!pool->closing && sibling_cancelled_locked(pool, desc)) {
        pthread_mutex_unlock(&pool->lock);
        ferry__clear_error();
        return FERRY_OK;
    }
    st = pool->closing ? closing_error(pool) : find_lease_locked(pool, desc, "release");
    if (st == FERRY_OK)
        st = cancel_locked(pool, desc->slot);
    if (st == FERRY_OK)
        pool->active++; /* the wake-ups below touch shared memory: close waits for them */
    pthread_mutex_unlock(&pool->lock);
    if (st != FERRY_OK)
        return st;
    ferry__shm_acked(&pool->mem.shm);
    ferry__shm_ready_wake(
        &pool->mem.shm,
        &pool->mem.control[ferry__shm_ready_word(&pool->mem.shm.layout, desc->slot)]);
    lease_done(pool);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_copied(ferry_pool *pool, const ferry_descriptor *desc, int *done)
{
    FERRY_CUDA_BOUNDARY;
    ferry_status st = check_pool_arg(pool, desc, "descriptor");
    if (st == FERRY_OK)
        st = check_pool_arg(pool, done, "done output");
    if (st == FERRY_OK && memcmp(desc->pool_id, pool->pool_id, 16) != 0)
        st = ferry__fail(FERRY_MISMATCH, "descriptor names another pool");
    if (st == FERRY_OK && desc->slot >= pool->max_inflight)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "slot %u is outside the pool's %u rows",
                         desc->slot, pool->max_inflight);
    if (st != FERRY_OK)
        return st;
    /* A slot is recycled only after its ready word held the lease's generation, so a lease
     * that is no longer current was copied; so was everything once the pool is closed. */
    int copied = 1;
    pthread_mutex_lock(&pool->lock);
    const ferry__slot *s = &pool->slots[desc->slot];
    if (pool->closing && !pool->closed)
        st = closing_error(pool);
    else if (!pool->closed && s->inflight_pos != FERRY_NIL && s->generation == desc->generation) {
        st = pool->ops->sync_control(&pool->mem);
        if (st == FERRY_OK)
            copied =
                ferry__load_acquire32(
                    &pool->mem.control[ferry__shm_ready_word(&pool->mem.shm.layout, desc->slot)]) ==
                desc->generation;
    }
    pthread_mutex_unlock(&pool->lock);
    if (st != FERRY_OK)
        return st;
    *done = copied;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_describe(ferry_pool *pool, ferry_descriptor *desc)
{
    ferry_status st = check_pool_arg(pool, desc, "descriptor output");
    if (st != FERRY_OK)
        return st;
    lease none = {0};
    ferry_tensor t = ferry_tensor_bytes(0);
    ferry_descriptor d;
    pthread_mutex_lock(&pool->lock);
    if (pool->closing)
        st = closing_error(pool);
    else
        fill_descriptor(pool, &none, 0, 0, &t, FERRY_DESC_FLAG_POOL_ONLY, &d);
    pthread_mutex_unlock(&pool->lock);
    if (st != FERRY_OK)
        return st;
    *desc = d;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_pool_reclaim(ferry_pool *pool, uint64_t *reclaimed)
{
    FERRY_CUDA_BOUNDARY;
    if (!pool)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool is NULL");
    if (forked(pool))
        return forked_error(pool);
    pthread_mutex_lock(&pool->lock);
    if (pool->closing) {
        pthread_mutex_unlock(&pool->lock);
        return closing_error(pool);
    }
    uint64_t acked = ferry__reap_dead_locked(pool);
    uint64_t n = ferry__reclaim_locked(pool);
    pool->active++; /* the wake-up below touches shared memory: close waits for it */
    pthread_mutex_unlock(&pool->lock);
    if (acked || n)
        ferry__shm_acked(&pool->mem.shm);
    lease_done(pool);
    if (reclaimed)
        *reclaimed = n;
    ferry__clear_error();
    return FERRY_OK;
}

/* ---- observation -------------------------------------------------------------------- */

/* Bytes of each version of ferry_pool_stats; 0 for an unknown version. */
static size_t stats_size(uint32_t version)
{
    switch (version) {
    case 1:
        return offsetof(ferry_pool_stats, too_large);
    case 2:
        return offsetof(ferry_pool_stats, pool_full_waits);
    case 3:
        return offsetof(ferry_pool_stats, remote_connected);
    case FERRY_POOL_STATS_VERSION:
        return sizeof(ferry_pool_stats);
    default:
        return 0;
    }
}

/* Every field of the current version but struct_size and version. */
static void stats_fill_locked(ferry_pool *pool, ferry_pool_stats *s)
{
    *s = pool->stats;
    s->capacity = pool->memory_size;
    s->usable_bytes = pool->data_size;
    s->bytes_in_use = pool->alloc.used_bytes;
    s->largest_free = ferry__alloc_largest_free(&pool->alloc);
    s->leases_in_flight = pool->inflight_count;
    s->broker_refused = ferry__broker_refused(pool->broker);
    ferry__ranks_count_locked(pool, &s->consumers_attached, &s->consumers_alive);
    if (pool->remote) {
        ferry__remote_counts rc;
        ferry__remote_server_counts(pool->remote, &rc);
        s->remote_connected = rc.connected;
        s->remote_admitted = rc.admitted;
        s->remote_refused = rc.refused;
        uint64_t *by[FERRY_REMOTE_REFUSED_REASONS] = {
            &s->remote_refused_malformed, &s->remote_refused_secret, &s->remote_refused_rank,
            &s->remote_refused_silent,    &s->remote_refused_flood,  &s->remote_refused_error};
        for (int i = 0; i < FERRY_REMOTE_REFUSED_REASONS; i++)
            *by[i] = rc.refused_by[i];
        s->remote_emulated = rc.emulated;
        s->remote_forwarded = rc.forwarded;
        s->remote_bad_messages = rc.bad_messages;
    }
}

ferry_status ferry_pool_stats_get(ferry_pool *pool, ferry_pool_stats *stats)
{
    ferry_status st = check_pool_arg(pool, stats, "stats");
    if (st != FERRY_OK)
        return st;
    size_t size = stats_size(stats->version);
    if (!size || stats->struct_size < size)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "stats has struct_size=%u version=%u; set them to "
                           "sizeof(ferry_pool_stats) and FERRY_POOL_STATS_VERSION",
                           stats->struct_size, stats->version);
    pthread_mutex_lock(&pool->lock);
    if (pool->closing) {
        pthread_mutex_unlock(&pool->lock);
        return closing_error(pool);
    }
    ferry_pool_stats s;
    stats_fill_locked(pool, &s);
    s.struct_size = stats->struct_size;
    s.version = stats->version;
    pthread_mutex_unlock(&pool->lock);
    memcpy(stats, &s, size); /* a caller built against an older header gets its fields */
    ferry__clear_error();
    return FERRY_OK;
}

static void rank_backlog_locked(ferry_pool *pool, uint32_t rank, ferry_consumer_info *info)
{
    uint64_t now = ferry__now_ns();
    pool->ops->sync_control(&pool->mem);
    for (uint32_t i = 0; i < pool->inflight_count; i++) {
        uint32_t slot = pool->inflight[i];
        const ferry__shm_layout *l = &pool->mem.shm.layout;
        const uint32_t *words = pool->mem.control;
        uint32_t gen = pool->slots[slot].generation;
        if (ferry__load_acquire32(&words[ferry__shm_ready_word(l, slot)]) != gen ||
            ferry__load_acquire32(&words[ferry__shm_ack_word(l, slot, rank)]) == gen)
            continue;
        info->outstanding++;
        info->partly_acknowledged +=
            ferry__load_acquire32(&words[ferry__shm_ack_word(l, slot, rank)]) ==
            (gen | FERRY_ACK_PARTIAL);
        uint64_t age = now - pool->slots[slot].leased_ns;
        if (age > info->oldest_age_ns)
            info->oldest_age_ns = age;
    }
}

/* Fills a rank's fields of *info (whose counts the caller zeroed). */
static void rank_info_locked(ferry_pool *pool, uint32_t rank, ferry_consumer_info *info)
{
    ferry__rank_info_locked(pool, rank, info);
    rank_backlog_locked(pool, rank, info);
}

/* The bytes of ferry_consumer_info a caller of version knows (0: an unknown version). */
static size_t info_size(uint32_t version)
{
    switch (version) {
    case 1:
        return offsetof(ferry_consumer_info, partly_acknowledged);
    case FERRY_CONSUMER_INFO_VERSION:
        return sizeof(ferry_consumer_info);
    default:
        return 0;
    }
}

ferry_status ferry_pool_consumer_info(ferry_pool *pool, uint32_t rank, ferry_consumer_info *info)
{
    FERRY_CUDA_BOUNDARY;
    ferry_status st = check_pool_arg(pool, info, "info");
    if (st != FERRY_OK)
        return st;
    if (rank >= pool->consumers)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank %u is out of range (consumers=%u)", rank,
                           pool->consumers);
    size_t size = info_size(info->version);
    if (!size || info->struct_size < size)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "consumer info has struct_size=%u version=%u; initialise it with "
                           "FERRY_CONSUMER_INFO_INIT",
                           info->struct_size, info->version);
    ferry_consumer_info ci = FERRY_CONSUMER_INFO_INIT;
    pthread_mutex_lock(&pool->lock);
    if (pool->closing) {
        pthread_mutex_unlock(&pool->lock);
        return closing_error(pool);
    }
    rank_info_locked(pool, rank, &ci);
    pthread_mutex_unlock(&pool->lock);
    ci.struct_size = info->struct_size;
    ci.version = info->version;
    memcpy(info, &ci, size); /* a caller built against an older header gets its fields */
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry__pool_snapshot_take(ferry_pool *pool, ferry__pool_snapshot *snap)
{
    ferry_status st = check_pool_arg(pool, snap, "snapshot");
    if (st != FERRY_OK)
        return st;
    ferry_consumer_info *ranks = calloc(pool->consumers ? pool->consumers : 1, sizeof(*ranks));
    if (!ranks)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for %u ranks' info", pool->consumers);
    pthread_mutex_lock(&pool->lock);
    if (pool->closing) {
        pthread_mutex_unlock(&pool->lock);
        free(ranks);
        return closing_error(pool);
    }
    stats_fill_locked(pool, &snap->stats);
    snap->stats.struct_size = sizeof(snap->stats);
    snap->stats.version = FERRY_POOL_STATS_VERSION;
    for (uint32_t r = 0; r < pool->consumers; r++)
        rank_info_locked(pool, r, &ranks[r]);
    pthread_mutex_unlock(&pool->lock);
    memcpy(snap->pool_id, pool->pool_id, sizeof(snap->pool_id));
    snap->backend = pool->ops->backend;
    snap->consumers = pool->consumers;
    snap->ranks = ranks;
    return FERRY_OK;
}
