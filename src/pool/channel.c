/* Descriptor channels, producer side: the pool's address, ferry_pool_send into the ranks'
 * rings in the shared segment (shm/ring.c), the poll fds consumers hand over, and drain.
 *
 * The producer's state of the rings (pool->rings: tails, records, reservations) is guarded
 * by the pool lock, which no send holds while it waits. A send first reserves room in every
 * chosen ring (waiting for it as the full policy says, without any lock), then publishes the
 * lease (waiting for space, without any lock), acknowledging it at once for the ranks it is
 * not sent to and for dead ones, then pushes its descriptors into the room it reserved and
 * wakes the receivers: a send that fails leases and queues nothing (it may have emptied dead
 * ranks' rings). Every wait of a send is bounded by its own timeout. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "driver/driver.h"
#include "pool/pool.h"
#include "shm/ring.h"
#include "shm/signal.h"
#include "shm/wait.h"
#include "wire/wire.h"

/* The longest a sender waiting for room sleeps between looks (a dead receiver is noticed by
 * the liveness checks, which no wake-up announces). */
#define FERRY_SEND_SLICE_NS 2000000ull
/* How long a drain yields before it sleeps between looks: acknowledgements are usually
 * microseconds away, and GPU streams write theirs without waking anybody. */
#define FERRY_DRAIN_SPIN_NS 200000ull

ferry_status ferry__channel_init(ferry_pool *pool)
{
    uint32_t depth = (uint32_t)pool->config.channel_depth;
    pool->channel_depth = depth;
    pool->notify_fds = malloc(pool->consumers * sizeof(int));
    pool->rings = calloc(pool->consumers, sizeof(*pool->rings));
    pool->ring_sent = calloc((size_t)pool->consumers * depth, sizeof(*pool->ring_sent));
    if (!pool->notify_fds || !pool->rings || !pool->ring_sent)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory for the channels",
                           pool->ops->name);
    for (uint32_t r = 0; r < pool->consumers; r++) {
        pool->notify_fds[r] = -1;
        pool->rings[r] = (ferry__ring_tx){
            .ring = ferry__shm_ring(&pool->mem.shm, r),
            .sent = pool->ring_sent + (size_t)r * depth,
            .depth = depth,
        };
    }
    return FERRY_OK;
}

void ferry__channel_fini(ferry_pool *pool)
{
    for (uint32_t r = 0; pool->notify_fds && r < pool->consumers; r++)
        if (pool->notify_fds[r] >= 0)
            close(pool->notify_fds[r]);
    free(pool->notify_fds);
    free(pool->rings);
    free(pool->ring_sent);
    pool->notify_fds = NULL;
    pool->rings = NULL;
    pool->ring_sent = NULL;
}

static ferry__ring *ring_of(ferry_pool *pool, uint32_t rank)
{
    return pool->rings[rank].ring;
}

static void signal_fd(int fd)
{
    uint64_t one = 1;
    ssize_t n;
    do
        n = write(fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
}

/* Wakes rank's receivers: those asleep on the tail, and its poll fd if it asked for it. */
static void wake_receivers(ferry_pool *pool, uint32_t rank, int force_fd)
{
    if (!ferry__ring_wake_receivers(ring_of(pool, rank), force_fd))
        return;
    pthread_mutex_lock(&pool->notify_lock);
    if (pool->notify_fds[rank] >= 0)
        signal_fd(pool->notify_fds[rank]);
    pthread_mutex_unlock(&pool->notify_lock);
}

void ferry__channel_poke(ferry_pool *pool, uint32_t rank)
{
    pthread_mutex_lock(&pool->notify_lock);
    if (pool->notify_fds[rank] >= 0)
        signal_fd(pool->notify_fds[rank]);
    pthread_mutex_unlock(&pool->notify_lock);
}

void ferry__channel_wake(ferry_pool *pool)
{
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__ring_wake_senders(ring_of(pool, r));
        if (ferry__shm_closing(&pool->mem.shm))
            wake_receivers(pool, r, 1);
    }
}

/* ---- the address ---------------------------------------------------------------------- */

ferry_status ferry_pool_address(ferry_pool *pool, char *buf, size_t size)
{
    ferry_status st = ferry__pool_check(pool, buf, "address buffer");
    if (st != FERRY_OK)
        return st;
    if (size < FERRY_ADDRESS_SIZE)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "address buffer of %zu bytes is too small (FERRY_ADDRESS_SIZE is %d)",
                           size, FERRY_ADDRESS_SIZE);
    char hex[33];
    ferry__hex_put(pool->broker_name, sizeof(pool->broker_name), hex);
    snprintf(buf, size, FERRY__ADDRESS_PREFIX "%s", hex);
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry__channel_describe(void *arg, uint8_t out[FERRY_DESCRIPTOR_SIZE])
{
    ferry_pool *pool = arg;
    ferry_descriptor d;
    ferry_status st = ferry_pool_describe(pool, &d);
    if (st == FERRY_OK)
        st = ferry_descriptor_encode(&d, out);
    return st;
}

/* 1 if fd is an eventfd, made non-blocking: a write to it can then never block the thread
 * that signals it (a sender, or the broker). */
static int eventfd_checked(int fd)
{
    char path[64], target[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    int flags = fcntl(fd, F_GETFL);
    return strcmp(target, "anon_inode:[eventfd]") == 0 && flags >= 0 &&
           fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

void ferry__channel_forget_rank_locked(ferry_pool *pool, uint32_t rank)
{
    ferry__ring_forget_receivers(ring_of(pool, rank));
    pthread_mutex_lock(&pool->notify_lock);
    int old = pool->notify_fds[rank];
    pool->notify_fds[rank] = -1;
    pthread_mutex_unlock(&pool->notify_lock);
    if (old >= 0)
        close(old);
}

ferry_status ferry__channel_notify(void *arg, uint32_t rank, pid_t pid, int fd)
{
    ferry_pool *pool = arg;
    pthread_mutex_lock(&pool->lock);
    /* Only the live process holding the rank may be signalled for it. */
    int holds = ferry__rank_held_by_locked(pool, rank, pid);
    pthread_mutex_unlock(&pool->lock);
    if (!holds || !eventfd_checked(fd)) {
        close(fd);
        return holds ? FERRY_INVALID_ARGUMENT : FERRY_PERMISSION;
    }
    ferry__channel_set_notify(pool, rank, fd);
    return FERRY_OK;
}

void ferry__channel_set_notify(ferry_pool *pool, uint32_t rank, int fd)
{
    pthread_mutex_lock(&pool->notify_lock);
    int old = pool->notify_fds[rank];
    pool->notify_fds[rank] = fd;
    /* Signalled once whatever happened before it arrived: entries queued (or taken by
     * another thread of the rank) while it was on its way, or a close that already woke
     * the fds (the fd may wake without a lease). */
    if (fd >= 0)
        signal_fd(fd);
    pthread_mutex_unlock(&pool->notify_lock);
    if (old >= 0)
        close(old);
}

/* ---- send ------------------------------------------------------------------------------- */

/* The chosen ranks as one byte each (1 = send to it). */
static ferry_status pick_ranks(ferry_pool *pool, const ferry_ranks *ranks, uint8_t *chosen)
{
    if (!ranks) {
        memset(chosen, 1, pool->consumers);
        return FERRY_OK;
    }
    memset(chosen, 0, pool->consumers);
    if (ranks->count == 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "send to no rank: ranks.count is 0");
    for (uint32_t i = 0; i < ranks->count; i++) {
        uint64_t r = ranks->list ? ranks->list[i] : (uint64_t)ranks->first + i;
        if (r >= pool->consumers)
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "send to rank %llu: the pool has ranks 0 to %u",
                               (unsigned long long)r, pool->consumers - 1);
        chosen[r] = 1;
    }
    return FERRY_OK;
}

static ferry_status ring_full(ferry_pool *pool, uint32_t rank, uint32_t need)
{
    char who[FERRY__HOLDER_TEXT];
    ferry__rank_describe_locked(pool, rank, who, sizeof(who));
    return ferry__fail(FERRY_POOL_FULL,
                       "%s pool: the descriptor ring of rank %u is full (%u of %u queued, %u "
                       "more needed): rank %u is behind (%s)",
                       pool->ops->name, rank, ferry__ring_queued(&pool->rings[rank]),
                       pool->channel_depth, need, rank, who);
}

static void mark_sent(void *arg, uint32_t slot, uint32_t generation)
{
    ferry_pool *pool = arg;
    ferry__slot *s = &pool->slots[slot];
    if (s->inflight_pos != FERRY_NIL && s->generation == generation)
        s->mark = 1;
}

static int marked(const ferry_pool *pool, uint32_t slot, void *arg)
{
    (void)arg;
    return pool->slots[slot].mark;
}

/* A ring whose head another process of the pool wrote out of its bounds (tail - depth <= head
 * <= tail): which entries its receiver still has to take is unknown, so the ring is emptied
 * and every lease it may still hold (those of its last depth positions) is acknowledged for
 * the rank. A receiver reading one of them gets STALE. */
static void mend_locked(ferry_pool *pool, uint32_t rank)
{
    ferry__ring_tx *tx = &pool->rings[rank];
    uint32_t head = ferry__load_relaxed32(&tx->ring->head), acked = 0;
    ferry__ring_drop(tx);
    if (pool->ops->sync_control(&pool->mem) == FERRY_OK) {
        ferry__ring_each_sent(tx, tx->tail - tx->depth, mark_sent, pool);
        acked = (uint32_t)ferry__ack_for_rank_locked(pool, rank, marked, NULL);
        for (uint32_t i = 0; i < pool->inflight_count; i++)
            pool->slots[pool->inflight[i]].mark = 0;
    }
    if (tx->mended++ == 0) /* once per rank: a peer that keeps writing would flood the log */
        ferry__log(FERRY_LOG_WARN,
                   "%s pool: the descriptor ring of rank %u was corrupt (head %u, tail %u, depth "
                   "%u): emptied, %u leases it may have held acknowledged for the rank (warned "
                   "once)",
                   pool->ops->name, rank, head, tx->tail, tx->depth, acked);
}

void ferry__channel_mark_queued_locked(ferry_pool *pool, uint32_t rank)
{
    uint32_t head;
    if (ferry__ring_head(&pool->rings[rank], &head) == 0)
        ferry__ring_each_sent(&pool->rings[rank], head, mark_sent, pool);
}

/* One look under the pool lock: dead chosen ranks (as last found) get their rings emptied
 * and are marked in preack; returns the first chosen live rank without room for need
 * entries (and its head, as read, in *head), or -1. */
static int64_t look_locked(ferry_pool *pool, const uint8_t *chosen, uint8_t *preack, uint32_t need,
                           uint32_t *head)
{
    for (uint32_t r = 0; r < pool->consumers; r++) {
        if (!chosen[r])
            continue;
        /* A dead rank's queued entries are dropped (their leases are acknowledged on its
         * behalf) and the lease being sent is acknowledged for it at once; a successor's
         * claim clears dead under the pool lock, which the caller holds. */
        if (ferry__rank_dead_locked(pool, r)) {
            ferry__ring_drop(&pool->rings[r]);
            preack[r] = 1;
            continue;
        }
        preack[r] = 0;
        ferry__ring_tx *tx = &pool->rings[r];
        if (ferry__ring_head(tx, head) != 0) {
            mend_locked(pool, r);
            *head = tx->tail;
        }
        /* queued + reserved may pass depth when a peer moved head back within bounds */
        uint64_t used = (uint64_t)(tx->tail - *head) + tx->reserved;
        if (used + need > pool->channel_depth)
            return r;
    }
    return -1;
}

/* As look_locked; a rank without room may have died since the reclaimer last looked: the
 * processes are looked at (when a look at /proc is due) before it counts as behind. */
static int64_t find_full_locked(ferry_pool *pool, const uint8_t *chosen, uint8_t *preack,
                                uint32_t need, uint32_t *head)
{
    int64_t full = look_locked(pool, chosen, preack, need, head);
    if (full < 0)
        return full;
    ferry__reap_dead_locked(pool);
    return look_locked(pool, chosen, preack, need, head);
}

/* Promises need entries of room in the rings of the chosen live ranks (release: -need). */
static void reserve_locked(ferry_pool *pool, const uint8_t *chosen, const uint8_t *preack,
                           uint32_t need)
{
    for (uint32_t r = 0; r < pool->consumers; r++)
        if (chosen[r] && !preack[r])
            pool->rings[r].reserved += need;
}

/* A sender's wait for room in the chosen rings (ferry__wait_run). */
typedef struct room_wait {
    ferry_pool *pool;
    const uint8_t *chosen;
    uint8_t *preack;
    uint32_t need;
    uint64_t timeout_ns;
    int64_t full;  /* the rank without room the last look found */
    uint32_t head; /* its head as that look found it */
    int waited;    /* a look found one before */
} room_wait;

/* Counted as a full pool is: an event, a wait, a wait that gave up. */
static int room_look(void *arg)
{
    room_wait *w = arg;
    ferry_pool *pool = w->pool;
    pthread_mutex_lock(&pool->lock);
    if (pool->closing) {
        pthread_mutex_unlock(&pool->lock);
        return ferry__pool_closing_error(pool);
    }
    w->full = find_full_locked(pool, w->chosen, w->preack, w->need, &w->head);
    if (w->full < 0)
        reserve_locked(pool, w->chosen, w->preack, w->need);
    if (w->full >= 0 && !w->waited) {
        w->waited = 1;
        pool->stats.pool_full_events++;
        pool->stats.pool_full_waits += w->timeout_ns != 0;
        if (!pool->warned_full) {
            pool->warned_full = 1;
            ring_full(pool, (uint32_t)w->full, w->need);
            ferry__log(FERRY_LOG_WARN, "%s (senders get POOL_FULL or wait; warned once)",
                       ferry_last_error());
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return w->full < 0 ? FERRY_OK : FERRY__WAIT_AGAIN;
}

static void room_sleep(void *arg, uint64_t ns)
{
    room_wait *w = arg;
    ferry__ring_sleep_on_head(ring_of(w->pool, (uint32_t)w->full), w->head, ns);
}

/* POOL_FULL naming the rank behind. */
static int room_expired(void *arg)
{
    room_wait *w = arg;
    pthread_mutex_lock(&w->pool->lock);
    w->pool->stats.pool_full_timeouts += w->timeout_ns != 0;
    ferry_status st = ring_full(w->pool, (uint32_t)w->full, w->need);
    pthread_mutex_unlock(&w->pool->lock);
    return st;
}

/* Waits until every chosen live rank's ring has room for need entries, and reserves it:
 * POOL_FULL naming the rank behind at once when timeout_ns is 0, or at the deadline. A dead
 * receiver is noticed by the liveness checks, which no wake-up announces: the sleeps are
 * short. */
static ferry_status make_room(ferry_pool *pool, const uint8_t *chosen, uint8_t *preack,
                              uint32_t need, uint64_t timeout_ns, uint64_t deadline)
{
    room_wait rw = {
        .pool = pool, .chosen = chosen, .preack = preack, .need = need, .timeout_ns = timeout_ns};
    ferry__wait w = {
        .look = room_look,
        .sleep = room_sleep,
        .expired = room_expired,
        .ctx = &rw,
        .slice_ns = FERRY_SEND_SLICE_NS,
    };
    return ferry__wait_run(&w, 0, deadline);
}

/* Pushes the encoded descriptors into the room reserved in every chosen live rank's ring,
 * then wakes their receivers. dead counts the chosen ranks acknowledged for as dead. */
static void enqueue(ferry_pool *pool, const uint8_t *chosen, const uint8_t *preack,
                    const uint8_t *encoded, const ferry_descriptor *d, uint32_t count,
                    uint64_t dead)
{
    pthread_mutex_lock(&pool->lock);
    for (uint32_t r = 0; r < pool->consumers; r++) {
        if (!chosen[r] || preack[r])
            continue;
        ferry__ring_push(&pool->rings[r], encoded, count, d->slot, d->generation);
        pool->rings[r].reserved -= count;
    }
    if (pool->slots[d->slot].generation == d->generation)
        pool->slots[d->slot].pushed = 1;
    pool->stats.acked_for_dead += dead;
    pthread_mutex_unlock(&pool->lock);
    for (uint32_t r = 0; r < pool->consumers; r++)
        if (chosen[r] && !preack[r])
            wake_receivers(pool, r, 0);
}

/* What is left of a deadline (0: the call never waits). */
static uint64_t time_left(uint64_t deadline)
{
    if (deadline == UINT64_MAX)
        return UINT64_MAX;
    uint64_t now = ferry__now_ns();
    return deadline > now ? deadline - now : 0;
}

static ferry_status send_checked(ferry_pool *pool, const ferry_tensor *tensors,
                                 const void *const *srcs, uint32_t count, uint8_t *chosen,
                                 uint8_t *preack, void *stream, uint64_t timeout_ns,
                                 ferry_descriptor *descs, uint8_t *encoded)
{
    uint64_t deadline = timeout_ns ? ferry__deadline(timeout_ns) : 0; /* 0: never waits */
    ferry_status st = make_room(pool, chosen, preack, count, timeout_ns, deadline);
    if (st != FERRY_OK)
        return st;
    uint64_t dead = 0;
    for (uint32_t r = 0; r < pool->consumers; r++)
        dead += chosen[r] && preack[r];
    /* The lease is acknowledged at once for the ranks it does not go to, dead ones too. */
    for (uint32_t r = 0; r < pool->consumers; r++)
        preack[r] = preack[r] || !chosen[r];
    st = ferry__publish(pool, tensors, srcs, count, stream, deadline ? time_left(deadline) : 0,
                        descs, preack);
    if (st != FERRY_OK) {
        pthread_mutex_lock(&pool->lock);
        reserve_locked(pool, chosen, preack, (uint32_t)-count); /* released */
        pthread_mutex_unlock(&pool->lock);
        return st;
    }
    for (uint32_t i = 0; i < count; i++)
        ferry_descriptor_encode(&descs[i], encoded + (size_t)i * FERRY_DESCRIPTOR_SIZE);
    enqueue(pool, chosen, preack, encoded, descs, count, dead);
    return FERRY_OK;
}

#define FERRY_SEND_STACK       4
#define FERRY_SEND_STACK_RANKS 256

ferry_status ferry_pool_send(ferry_pool *pool, const ferry_tensor *tensors, const void *const *srcs,
                             size_t count, const ferry_ranks *ranks, void *stream,
                             uint64_t timeout_ns, ferry_descriptor *descs)
{
    FERRY_CUDA_BOUNDARY;
    ferry_status st = ferry__pool_check(pool, tensors, "tensors");
    if (st == FERRY_OK)
        st = ferry__pool_check(pool, srcs, "sources");
    if (st == FERRY_OK && count == 0)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "send needs at least one tensor");
    if (st == FERRY_OK && count > pool->channel_depth)
        st = ferry__fail(FERRY_INVALID_ARGUMENT,
                         "a send of %zu tensors needs rings of at least %zu entries "
                         "(channel_depth=%u)",
                         count, count, pool->channel_depth);
    if (st != FERRY_OK)
        return st;
    ferry_descriptor stack_descs[FERRY_SEND_STACK];
    uint8_t stack_enc[FERRY_SEND_STACK * FERRY_DESCRIPTOR_SIZE];
    ferry_descriptor *out = descs ? descs : count <= FERRY_SEND_STACK ? stack_descs : NULL;
    uint8_t *encoded = count <= FERRY_SEND_STACK ? stack_enc : NULL;
    uint8_t stack_chosen[2 * FERRY_SEND_STACK_RANKS];
    uint8_t *chosen =
        pool->consumers <= FERRY_SEND_STACK_RANKS ? stack_chosen : calloc(2, pool->consumers);
    if (!out)
        out = malloc(count * sizeof(*out));
    if (!encoded)
        encoded = malloc(count * FERRY_DESCRIPTOR_SIZE);
    if (!out || !encoded || !chosen) {
        st = ferry__fail(FERRY_NO_MEMORY, "out of memory for a send of %zu tensors", count);
        goto done;
    }
    st = pick_ranks(pool, ranks, chosen);
    if (st == FERRY_OK)
        st = ferry__pool_enter(pool); /* close waits for the send to leave the rings */
    if (st != FERRY_OK)
        goto done;
    st = send_checked(pool, tensors, srcs, (uint32_t)count, chosen, chosen + pool->consumers,
                      stream, timeout_ns, out, encoded);
    ferry__pool_leave(pool);
    if (st == FERRY_OK)
        ferry__clear_error();
done:
    if (out != descs && out != stack_descs)
        free(out);
    if (encoded != stack_enc)
        free(encoded);
    if (chosen != stack_chosen)
        free(chosen);
    return st;
}

/* ---- drain ------------------------------------------------------------------------------ */

/* Leases published (committed, not cancelled) and still in flight after a reclaim. */
static uint32_t unsettled_locked(ferry_pool *pool)
{
    ferry__reap_dead_locked(pool);
    ferry__reclaim_locked(pool);
    uint32_t n = 0;
    for (uint32_t i = 0; i < pool->inflight_count; i++) {
        const ferry__slot *s = &pool->slots[pool->inflight[i]];
        n += s->committed && !s->cancelled;
    }
    return n;
}

/* A drain's wait for acknowledgements (ferry__wait_run). */
typedef struct drain_wait {
    ferry_pool *pool;
    uint64_t timeout_ns;
    uint32_t seq;  /* the acknowledgement sequence before the last look */
    uint32_t left; /* leases the last look found unsettled */
} drain_wait;

static int drain_look(void *arg)
{
    drain_wait *w = arg;
    ferry_pool *pool = w->pool;
    w->seq = ferry__shm_ack_seq(&pool->mem.shm);
    pthread_mutex_lock(&pool->lock);
    int closing = pool->closing;
    w->left = closing ? 0 : unsettled_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    if (closing)
        return ferry__pool_closing_error(pool);
    return w->left ? FERRY__WAIT_AGAIN : FERRY_OK;
}

static void drain_sleep(void *arg, uint64_t ns)
{
    drain_wait *w = arg;
    ferry__shm_sleep_on_acks(&w->pool->mem.shm, w->seq, ns);
}

/* TIMEOUT naming the slowest rank. */
static int drain_expired(void *arg)
{
    drain_wait *w = arg;
    ferry_pool *pool = w->pool;
    char backlog[256];
    pthread_mutex_lock(&pool->lock);
    ferry__describe_backlog_locked(pool, backlog, sizeof(backlog));
    pthread_mutex_unlock(&pool->lock);
    return ferry__fail(FERRY_TIMEOUT,
                       "%s pool did not drain within %.3f ms: %u published leases are not "
                       "acknowledged; %s",
                       pool->ops->name, (double)w->timeout_ns / 1e6, w->left, backlog);
}

ferry_status ferry_pool_drain(ferry_pool *pool, uint64_t timeout_ns)
{
    FERRY_CUDA_BOUNDARY;
    ferry_status st = ferry__pool_check(pool, pool, "pool");
    if (st == FERRY_OK)
        st = ferry__pool_enter(pool);
    if (st != FERRY_OK)
        return st;
    drain_wait dw = {.pool = pool, .timeout_ns = timeout_ns};
    ferry__wait w = {
        .look = drain_look,
        .sleep = drain_sleep,
        .expired = drain_expired,
        .ctx = &dw,
        .spin_ns = FERRY_DRAIN_SPIN_NS, /* GPU streams' acks wake nobody */
        .slice_ns = pool->ops->space_poll_ns,
    };
    ferry__shm_space_wait_begin(&pool->mem.shm);
    st = ferry__wait_run(&w, 0, ferry__deadline(timeout_ns));
    ferry__shm_space_wait_end(&pool->mem.shm);
    ferry__pool_leave(pool);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}
