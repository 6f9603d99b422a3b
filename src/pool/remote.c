/* The pool's side of remote consumers (remote/remote.h): starting its remote server, the
 * hooks through which the server asks the pool (rank claims, leases, acknowledgements, holds,
 * notify fds), and the pool's remote address.
 *
 * Held leases (docs/design.md, "Held leases"): before a lease's DESC goes to a remote rank,
 * the rank holds the lease's slice. The pool frees the slot only once every hold of it is
 * gone: ended by the rank's own whole acknowledgement or its RELEASED, or, for a hold the pool
 * asked back (the lease was acknowledged for the rank by another, or cancelled) and the rank
 * did not give back, a keepalive bound after the asking. The consumer reads a held lease
 * without the check round trip: its slice cannot be another lease's while the consumer has
 * not let it go. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "pool/pool.h"
#include "remote/remote.h"
#include "shm/segment.h"
#include "shm/signal.h"
#include "wire/remote.h"

static ferry_status hook_attach(void *user, uint32_t rank, uint32_t conn, pid_t pid,
                                const char *host, pid_t *holder)
{
    ferry_pool *pool = user;
    return ferry__ranks_attach_remote(pool, rank, conn, pid, host, holder);
}

/* 1 if the slot has the lease (slot, generation), not cancelled, in a pool still open, and
 * (sync) the control words are in view (a GPU pool's device table copied to its mirror).
 * Under the pool's lock. */
static int current_locked(ferry_pool *pool, uint32_t slot, uint32_t generation, int sync)
{
    const ferry__slot *s = &pool->slots[slot];
    return !pool->closing && s->inflight_pos != FERRY_NIL && s->generation == generation &&
           !s->cancelled && (!sync || pool->ops->sync_control(&pool->mem) == FERRY_OK);
}

/* ---- holds --------------------------------------------------------------------------------- */

static ferry__hold *hold_at(ferry_pool *pool, uint32_t slot, uint32_t rank)
{
    return &pool->holds[(uint64_t)slot * pool->consumers + rank];
}

int ferry__holds_keep_locked(ferry_pool *pool, uint32_t slot)
{
    if (!pool->holds)
        return 0;
    uint32_t gen = pool->slots[slot].generation;
    uint64_t now = ferry__now_ns();
    int keep = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__hold *h = hold_at(pool, slot, r);
        if (!h->generation)
            continue;
        if (h->generation != gen) { /* not this lease's (never set so): nothing to keep */
            *h = (ferry__hold){0};
            continue;
        }
        if (h->state == FERRY_HOLD_HELD) {
            h->state = FERRY_HOLD_ASKED;
            __atomic_store_n(&pool->revoking[r], 1, __ATOMIC_RELEASE);
            ferry__channel_poke(pool, r); /* the server sends the REVOKE */
        } else if (h->state == FERRY_HOLD_GONE && now - h->revoked >= pool->hold_lapse_ns) {
            ferry__log(FERRY_LOG_WARN,
                       "%s pool: remote rank %u did not let lease (slot=%u, generation=%u) go "
                       "within %.0f ms of being asked; its hold lapsed",
                       pool->ops->name, r, slot, gen, (double)pool->hold_lapse_ns / 1e6);
            *h = (ferry__hold){0};
            continue;
        }
        keep = 1;
    }
    return keep;
}

int ferry__holds_describe_locked(ferry_pool *pool, char *buf, size_t size)
{
    uint64_t now = ferry__now_ns();
    for (uint32_t i = 0; pool->holds && i < pool->inflight_count; i++) {
        uint32_t slot = pool->inflight[i];
        for (uint32_t r = 0; r < pool->consumers; r++) {
            const ferry__hold *h = hold_at(pool, slot, r);
            if (h->generation != pool->slots[slot].generation || !h->generation)
                continue;
            if (h->state == FERRY_HOLD_GONE)
                snprintf(buf, size,
                         "remote rank %u has not let lease (slot=%u, generation=%u) go, asked "
                         "%.3f ms ago (its hold lapses after %.0f ms; its process answers in "
                         "its next ferry call)",
                         r, slot, h->generation, (double)(now - h->revoked) / 1e6,
                         (double)pool->hold_lapse_ns / 1e6);
            else
                snprintf(buf, size, "remote rank %u holds lease (slot=%u, generation=%u)", r,
                         slot, h->generation);
            return 1;
        }
    }
    return 0;
}

void ferry__holds_clear_locked(ferry_pool *pool, uint32_t slot)
{
    if (pool->holds)
        memset(hold_at(pool, slot, 0), 0, pool->consumers * sizeof(ferry__hold));
}

void ferry__holds_fini(ferry_pool *pool)
{
    free(pool->holds);
    free(pool->revoking);
    pool->holds = NULL;
    pool->revoking = NULL;
}

/* Ends rank's hold of the lease (slot, generation) if connection conn holds it; publishers
 * waiting for room look again when the slot may be free now. Under the pool's lock. */
static int unhold_locked(ferry_pool *pool, uint32_t slot, uint32_t generation, uint32_t rank,
                         uint32_t conn)
{
    ferry__hold *h = hold_at(pool, slot, rank);
    if (h->generation != generation || h->conn != conn)
        return 0;
    *h = (ferry__hold){0};
    return 1;
}

static int hook_hold(void *user, uint32_t slot, uint32_t generation, uint32_t rank, uint32_t conn)
{
    ferry_pool *pool = user;
    int held = 0;
    pthread_mutex_lock(&pool->lock);
    const ferry__shm_layout *l = &pool->mem.shm.layout;
    /* The mirror of a GPU pool's device words is not synced here (hook_lease just did): one
     * that lags shows the rank's acknowledgement later, never sooner, and a lease held past
     * it is asked back as any other. */
    if (pool->holds && current_locked(pool, slot, generation, 0) &&
        ferry__load_acquire32(&pool->mem.control[ferry__shm_ack_word(l, slot, rank)]) !=
            generation) {
        *hold_at(pool, slot, rank) = (ferry__hold){generation, conn, 0, FERRY_HOLD_HELD};
        held = 1;
    }
    pthread_mutex_unlock(&pool->lock);
    return held;
}

static void hook_release(void *user, uint32_t slot, uint32_t generation, uint32_t rank,
                         uint32_t conn)
{
    ferry_pool *pool = user;
    pthread_mutex_lock(&pool->lock);
    int ended = unhold_locked(pool, slot, generation, rank, conn);
    pthread_mutex_unlock(&pool->lock);
    if (ended)
        ferry__shm_acked(&pool->mem.shm); /* publishers waiting for space look again */
}

static uint32_t hook_revokes(void *user, uint32_t rank, uint32_t conn, uint32_t (*out)[2],
                             uint32_t max)
{
    ferry_pool *pool = user;
    uint32_t n = 0;
    if (!__atomic_load_n(&pool->revoking[rank], __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&pool->lock);
    __atomic_store_n(&pool->revoking[rank], 0, __ATOMIC_RELAXED);
    for (uint32_t slot = 0; slot < pool->max_inflight; slot++) {
        ferry__hold *h = hold_at(pool, slot, rank);
        if (h->state != FERRY_HOLD_ASKED || h->conn != conn)
            continue;
        if (n == max) { /* the rest in the next call */
            __atomic_store_n(&pool->revoking[rank], 1, __ATOMIC_RELAXED);
            break;
        }
        /* The lapse counts from here: the server sends it now. */
        h->state = FERRY_HOLD_GONE;
        h->revoked = ferry__now_ns();
        out[n][0] = slot;
        out[n][1] = h->generation;
        n++;
    }
    pthread_mutex_unlock(&pool->lock);
    return n;
}

static void hook_detach(void *user, uint32_t rank, uint32_t conn, int lapse)
{
    ferry_pool *pool = user;
    pthread_mutex_lock(&pool->lock);
    uint64_t now = ferry__now_ns();
    int ended = 0;
    for (uint32_t slot = 0; pool->holds && slot < pool->max_inflight; slot++) {
        ferry__hold *h = hold_at(pool, slot, rank);
        if (!h->generation || h->conn != conn)
            continue;
        if (lapse) { /* asked back now (or before), with no one left to tell */
            if (h->state != FERRY_HOLD_GONE)
                h->revoked = now;
            h->state = FERRY_HOLD_GONE;
        } else {
            *h = (ferry__hold){0};
            ended = 1;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    ferry__ranks_detach_remote(pool, rank, conn);
    if (ended)
        ferry__shm_acked(&pool->mem.shm);
}


/* A lease is the rank's to read while its slot holds it (not cancelled) and the rank's
 * acknowledgement is not written. Under the pool's lock, from the producer's own records:
 * nothing here comes from memory another process can write, but the control words. A
 * closing pool holds no lease: CLOSING. */
static ferry_status hook_lease(void *user, uint32_t slot, uint32_t generation, uint32_t rank,
                               int *ready, uint64_t *offset, uint64_t *length)
{
    ferry_pool *pool = user;
    ferry_status st = FERRY_STALE;
    pthread_mutex_lock(&pool->lock);
    if (pool->closing)
        st = FERRY_CLOSING;
    const ferry__slot *s = &pool->slots[slot];
    const ferry__shm_layout *l = &pool->mem.shm.layout;
    if (current_locked(pool, slot, generation, 1) &&
        ferry__load_acquire32(&pool->mem.control[ferry__shm_ack_word(l, slot, rank)]) !=
            generation) {
        *ready =
            s->committed &&
            ferry__load_acquire32(&pool->mem.control[ferry__shm_ready_word(l, slot)]) == generation;
        *offset = s->offset;
        *length = s->length;
        st = FERRY_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* Called between a partial mark's read of a word and its compare-and-swap (tests only: they
 * write the word there, as another process may). */
void (*ferry__pool_test_before_mark)(ferry_pool *pool, uint32_t slot, uint32_t rank);

/* Marks the rank's word partly acknowledged (generation | FERRY_ACK_PARTIAL) as a local
 * consumer does: by compare-and-swap from the value read, so that the mark never replaces an
 * acknowledgement another process wrote meanwhile (a local leader acknowledges remote ranks
 * without the pool's lock). Words on the device are not marked, as a local consumer's are
 * not. Under the pool's lock. */
static void mark_partial_locked(ferry_pool *pool, uint32_t slot, uint32_t generation, uint32_t rank)
{
    if (pool->mem.flags & FERRY_DESC_FLAG_DEVICE_CONTROL)
        return;
    uint64_t w = ferry__shm_ack_word(&pool->mem.shm.layout, slot, rank);
    uint32_t seen = ferry__load_acquire32(&pool->mem.control[w]);
    uint32_t mark = generation | FERRY_ACK_PARTIAL;
    if (seen == generation || seen == mark)
        return;
    void (*hook)(ferry_pool *, uint32_t, uint32_t) =
        __atomic_load_n(&ferry__pool_test_before_mark, __ATOMIC_ACQUIRE);
    if (hook)
        hook(pool, slot, rank);
    ferry__cas_acqrel32(&pool->mem.control[w], &seen, mark);
}

/* A remote consumer's acknowledgement, written as a local one would be: each rank's word
 * from what it held, for the current lease only; or, partial (some parts of a packed lease),
 * its mark. The two may come in either order: the mark never goes over an acknowledgement. */
static void hook_ack(void *user, uint32_t slot, uint32_t generation, uint32_t first, uint32_t count,
                     int partial, uint32_t rank, uint32_t conn)
{
    ferry_pool *pool = user;
    const ferry__shm_layout *l = &pool->mem.shm.layout;
    uint64_t written = 0;
    pthread_mutex_lock(&pool->lock);
    /* The sender's own whole acknowledgement: it reads the lease no more. */
    if (!partial && pool->holds && rank >= first && rank - first < count)
        written += (uint64_t)unhold_locked(pool, slot, generation, rank, conn);
    if (current_locked(pool, slot, generation, 1)) {
        for (uint32_t r = first; r < first + count; r++) {
            if (partial) {
                mark_partial_locked(pool, slot, generation, r);
                continue;
            }
            uint64_t w = ferry__shm_ack_word(l, slot, r);
            if (ferry__load_acquire32(&pool->mem.control[w]) != generation &&
                pool->ops->write_words(&pool->mem, w, 1, generation) == FERRY_OK)
                written++;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    if (written)
        ferry__shm_acked(&pool->mem.shm); /* publishers waiting for space look again */
}

static void hook_notify(void *user, uint32_t rank, int fd)
{
    ferry__channel_set_notify(user, rank, fd);
}

ferry_status ferry__pool_remote_start(ferry_pool *pool)
{
    if (!pool->config.listen)
        return FERRY_OK;
    ferry__remote_config rc = {
        .listen = pool->config.listen,
        .timeout_ns = (uint64_t)pool->config.remote_timeout_us * 1000ull,
        .device = pool->mem.device,
        .consumers = pool->consumers,
        .max_inflight = pool->max_inflight,
        .ring_depth = pool->channel_depth,
        .rings = pool->mem.shm.rings,
        .ring_stride = pool->mem.shm.layout.ring_stride,
        .gen_offset = FERRY_GEN_TABLE_OFFSET,
        .extent_offset =
            (uint64_t)((uint8_t *)pool->mem.shm.extents - (uint8_t *)pool->mem.shm.header),
        .hooks = {pool, hook_attach, hook_detach, hook_lease, hook_ack, hook_hold, hook_release,
                  hook_revokes, hook_notify},
    };
    pool->holds = calloc((size_t)pool->max_inflight * pool->consumers, sizeof(ferry__hold));
    pool->revoking = calloc(pool->consumers, sizeof(uint32_t));
    pool->hold_lapse_ns = rc.timeout_ns;
    if (!pool->holds || !pool->revoking) {
        ferry__holds_fini(pool);
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for the remote ranks' holds");
    }
    char label[64];
    snprintf(label, sizeof(label), "%s pool", pool->ops->name);
    rc.label = label;
    ferry__memory_map map;
    pool->ops->memory_map(&pool->mem, &map);
    for (int i = 0; i < 2; i++)
        rc.region[i] = (ferry__remote_region){map.base[i], map.size[i], map.gpu[i]};
    rc.control_offset = map.control_offset;
    rc.data_offset = map.data_offset;
    rc.welcome_flags = (map.control_region ? FERRY_WELCOME_CONTROL_IN_POOL : 0u) |
                       (map.data_region ? FERRY_WELCOME_DATA_IN_POOL : 0u);
    memcpy(rc.pool_id, pool->pool_id, 16);
    ferry_descriptor d;
    ferry_status st = ferry_pool_describe(pool, &d);
    if (st == FERRY_OK)
        st = ferry_descriptor_encode(&d, rc.pool_desc);
    if (st == FERRY_OK)
        st = ferry__remote_start(&rc, &pool->remote);
    if (st == FERRY_OK) /* kept here: the server goes at close, the address stays valid */
        snprintf(pool->remote_address, sizeof(pool->remote_address), "%s",
                 ferry__remote_server_address(pool->remote));
    pool->config.listen = NULL; /* the caller's string is not kept */
    return st;
}

ferry_status ferry_pool_remote_address(ferry_pool *pool, char *buf, size_t size)
{
    ferry_status st = ferry__pool_check(pool, buf, "address buffer");
    if (st != FERRY_OK)
        return st;
    const char *address = pool->remote_address;
    if (!address[0])
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "%s pool serves no remote consumers (create it with cfg.listen)",
                           pool->ops->name);
    if (size <= strlen(address))
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "address buffer of %zu bytes is too small (FERRY_REMOTE_ADDRESS_SIZE "
                           "is %d)",
                           size, FERRY_REMOTE_ADDRESS_SIZE);
    snprintf(buf, size, "%s", address);
    ferry__clear_error();
    return FERRY_OK;
}
