/* Reclaiming acknowledged leases, consumers that died, and the background reclaimer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/futex.h"
#include "common/proc.h"
#include "pool/pool.h"

int ferry__row_released_locked(const ferry_pool *pool, uint32_t slot)
{
    const uint32_t *row = ferry__row(pool->mem.control, pool->row_words, slot);
    uint32_t gen = pool->slots[slot].generation;
    for (uint32_t w = 0; w < pool->row_words; w++)
        if (ferry__load_acquire32(&row[w]) != gen)
            return 0;
    return 1;
}

static void inflight_remove(ferry_pool *pool, uint32_t slot)
{
    uint32_t pos = pool->slots[slot].inflight_pos;
    uint32_t last = pool->inflight[--pool->inflight_count];
    pool->inflight[pos] = last;
    pool->slots[last].inflight_pos = pos;
    pool->slots[slot].inflight_pos = FERRY_NIL;
}

void ferry__slot_release_locked(ferry_pool *pool, uint32_t slot)
{
    ferry__alloc_free(&pool->alloc, pool->slots[slot].handle);
    inflight_remove(pool, slot);
    pool->ring[(pool->ring_head + pool->ring_count) % pool->max_inflight] = slot;
    pool->ring_count++;
}

uint64_t ferry__reclaim_locked(ferry_pool *pool)
{
    uint64_t n = 0;
    if (pool->ops->sync_control(&pool->mem) != FERRY_OK) {
        ferry__latch_locked(pool, FERRY_POOL_FAILED, ferry_last_error());
        return 0;
    }
    uint32_t i = 0;
    while (i < pool->inflight_count) {
        uint32_t slot = pool->inflight[i];
        if (ferry__row_released_locked(pool, slot)) {
            ferry__slot_release_locked(pool, slot); /* moves another slot into i */
            n++;
        } else {
            i++;
        }
    }
    pool->stats.reclaimed += n;
    return n;
}

/* Acknowledges for rank every lease in flight leased before before_ns. */
static uint64_t ack_for_rank_locked(ferry_pool *pool, uint32_t rank, uint64_t before_ns)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < pool->inflight_count; i++) {
        uint32_t slot = pool->inflight[i];
        if (pool->slots[slot].leased_ns >= before_ns)
            continue;
        uint32_t *row = ferry__row(pool->mem.control, pool->row_words, slot);
        uint32_t gen = pool->slots[slot].generation;
        if (ferry__load_acquire32(&row[1 + rank]) != gen &&
            pool->ops->write_words(&pool->mem, (uint64_t)slot * pool->row_words + 1 + rank, 1,
                                   gen) == FERRY_OK)
            n++;
    }
    return n;
}

/* Reading /proc costs microseconds per consumer: processes are looked at no more often
 * than the reclaim interval (and at most every 10 ms), however often reclaim runs. */
static int liveness_due_locked(ferry_pool *pool)
{
    uint64_t every = (uint64_t)pool->config.reclaim_interval_us * 1000ull;
    if (every > 10000000ull)
        every = 10000000ull;
    uint64_t now = ferry__now_ns();
    if (now - pool->liveness_ns < every)
        return 0;
    pool->liveness_ns = now;
    return 1;
}

/* Marks attached ranks whose process is gone (when a look is due); 1 if any rank is dead. */
static int find_dead_locked(ferry_pool *pool)
{
    int look = liveness_due_locked(pool), any = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__rank *rk = &pool->ranks[r];
        if (look && rk->pid && !rk->dead && !ferry__proc_alive(rk->pid, rk->starttime))
            rk->dead = 1;
        any |= rk->dead;
    }
    return any;
}

uint64_t ferry__reap_dead_locked(ferry_pool *pool)
{
    uint64_t n = 0;
    if (!find_dead_locked(pool) || pool->ops->sync_control(&pool->mem) != FERRY_OK)
        return 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__rank *rk = &pool->ranks[r];
        if (!rk->dead)
            continue;
        uint64_t acked = ack_for_rank_locked(pool, r, UINT64_MAX);
        if (acked && !rk->warned) {
            rk->warned = 1;
            ferry__log(FERRY_LOG_WARN,
                       "%s pool: consumer rank %u (pid %d) is gone; acknowledging its leases "
                       "on its behalf (%llu so far)",
                       pool->ops->name, r, (int)rk->pid, (unsigned long long)acked);
        }
        n += acked;
    }
    pool->stats.acked_for_dead += n;
    return n;
}

void ferry__signal_space(ferry_pool *pool)
{
    ferry__shm_header *h = pool->mem.header;
    ferry__fetch_add_seqcst32(&h->ack_seq, 1);
    if (ferry__load_seqcst32(&h->producer_waiters))
        ferry__futex_wake_all(&h->ack_seq);
}

void ferry__signal_ready(ferry_pool *pool, uint32_t slot)
{
    if (ferry__load_seqcst32(&pool->mem.header->consumer_waiters))
        ferry__futex_wake_all(ferry__row(pool->mem.control, pool->row_words, slot));
}

/* A rank whose process died is taken over: its leases in flight were sent to that process,
 * so they are acknowledged on its behalf first, in the same critical section as the takeover
 * (a lease published between the death and the reclaimer's next look would otherwise wait
 * forever for an acknowledgement the new process knows nothing of). Leases published after
 * the new process started may already be on their way to it: those are left to it. */
static uint64_t settle_dead_rank_locked(ferry_pool *pool, uint32_t rank, pid_t successor)
{
    if (pool->ops->sync_control(&pool->mem) != FERRY_OK)
        return 0;
    uint64_t born = ferry__proc_start_ns(successor);
    uint64_t n = ack_for_rank_locked(pool, rank, born ? born : UINT64_MAX);
    pool->stats.acked_for_dead += n;
    if (n)
        ferry__log(FERRY_LOG_WARN,
                   "%s pool: consumer rank %u (pid %d) is gone and a new process takes it "
                   "over; its %llu leases in flight were acknowledged on its behalf",
                   pool->ops->name, rank, (int)pool->ranks[rank].pid, (unsigned long long)n);
    return n;
}

ferry_status ferry__rank_attached(void *arg, uint32_t rank, pid_t pid, pid_t *holder)
{
    ferry_pool *pool = arg;
    uint64_t start = ferry__proc_starttime(pid), settled = 0;
    pthread_mutex_lock(&pool->lock);
    ferry__rank *rk = &pool->ranks[rank];
    if (rk->pid && !(rk->pid == pid && rk->starttime == start)) {
        if (!rk->dead && ferry__proc_alive(rk->pid, rk->starttime)) {
            *holder = rk->pid;
            pthread_mutex_unlock(&pool->lock);
            return FERRY_RANK_IN_USE;
        }
        settled = settle_dead_rank_locked(pool, rank, pid);
        ferry__channel_forget_rank_locked(pool, rank);
    }
    rk->pid = pid;
    rk->starttime = start;
    rk->dead = 0;
    rk->warned = 0;
    pthread_mutex_unlock(&pool->lock);
    if (settled)
        ferry__signal_space(pool);
    return FERRY_OK;
}

/* The rank with the oldest published lease it has not acknowledged: how many it holds, and
 * how many of those are packed leases it acknowledged some parts of (FERRY_ACK_PARTIAL). */
static int slowest_rank_locked(ferry_pool *pool, uint64_t *oldest, uint64_t *held, uint64_t *partly)
{
    int worst = -1;
    pool->ops->sync_control(&pool->mem);
    for (uint32_t r = 0; r < pool->consumers; r++) {
        uint64_t old = UINT64_MAX, count = 0, partial = 0;
        for (uint32_t i = 0; i < pool->inflight_count; i++) {
            uint32_t slot = pool->inflight[i];
            const uint32_t *row = ferry__row(pool->mem.control, pool->row_words, slot);
            uint32_t gen = pool->slots[slot].generation, ack = ferry__load_acquire32(&row[1 + r]);
            if (ferry__load_acquire32(&row[0]) == gen && ack != gen) {
                count++;
                partial += ack == (gen | FERRY_ACK_PARTIAL);
                if (pool->slots[slot].leased_ns < old)
                    old = pool->slots[slot].leased_ns;
            }
        }
        if (count && (worst < 0 || old < *oldest)) {
            worst = (int)r;
            *oldest = old;
            *held = count;
            *partly = partial;
        }
    }
    return worst;
}

void ferry__describe_backlog_locked(ferry_pool *pool, char *buf, size_t size)
{
    uint64_t oldest = 0, held = 0, partly = 0;
    int r = slowest_rank_locked(pool, &oldest, &held, &partly);
    if (r < 0) {
        snprintf(buf, size, "no consumer holds a published lease");
        return;
    }
    const ferry__rank *rk = &pool->ranks[r];
    const char *state = !rk->pid                                    ? "not attached yet"
                        : ferry__proc_alive(rk->pid, rk->starttime) ? "alive"
                                                                    : "dead";
    char parts[160] = "";
    if (partly)
        snprintf(parts, sizeof(parts),
                 " (%llu partly acknowledged: packed leases with parts left, which "
                 "ferry_consumer_ack_lease acknowledges whole)",
                 (unsigned long long)partly);
    snprintf(buf, size,
             "slowest consumer: rank %d (pid %d, %s) holds %llu leases%s, oldest %.3f ms", r,
             (int)rk->pid, state, (unsigned long long)held, parts,
             (double)(ferry__now_ns() - oldest) / 1e6);
}

static void *reclaimer_main(void *arg)
{
    ferry_pool *pool = arg;
    uint64_t interval = (uint64_t)pool->config.reclaim_interval_us * 1000ull;
    pthread_mutex_lock(&pool->lock);
    while (!pool->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + interval % 1000000000ull;
        ts.tv_sec += (time_t)(interval / 1000000000ull + ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&pool->reclaimer_cv, &pool->lock, &ts);
        if (pool->stop)
            break;
        uint64_t changed = ferry__reap_dead_locked(pool);
        if (pool->inflight_count)
            changed += ferry__reclaim_locked(pool);
        if (changed) {
            pthread_mutex_unlock(&pool->lock);
            ferry__signal_space(pool);
            pthread_mutex_lock(&pool->lock);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

ferry_status ferry__reclaimer_start(ferry_pool *pool)
{
    int err = pthread_create(&pool->reclaimer, NULL, reclaimer_main, pool);
    if (err)
        return ferry__fail_errno(FERRY_SYSTEM, err, "%s pool: starting the reclaimer failed",
                                 pool->ops->name);
    pool->reclaimer_running = 1;
    return FERRY_OK;
}

void ferry__reclaimer_stop(ferry_pool *pool)
{
    if (!pool->reclaimer_running)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_signal(&pool->reclaimer_cv);
    pthread_mutex_unlock(&pool->lock);
    pthread_join(pool->reclaimer, NULL);
    pool->reclaimer_running = 0;
}
