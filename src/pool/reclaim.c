/* Reclaiming acknowledged leases, consumers that died, and the background reclaimer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "pool/pool.h"
#include "shm/signal.h"

int ferry__row_released_locked(ferry_pool *pool, uint32_t slot)
{
    const uint32_t *row = &pool->mem.control[ferry__shm_ready_word(&pool->mem.shm.layout, slot)];
    uint32_t gen = pool->slots[slot].generation;
    for (uint32_t w = 0; w < pool->row_words; w++)
        if (ferry__load_acquire32(&row[w]) != gen)
            return 0;
    return !ferry__holds_keep_locked(pool, slot);
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
    ferry__shm_lease_end(&pool->mem.shm, slot, pool->slots[slot].generation);
    ferry__holds_clear_locked(pool, slot);
    ferry__alloc_free(&pool->alloc, pool->slots[slot].handle);
    inflight_remove(pool, slot);
    pool->free_slots[(pool->free_head + pool->free_count) % pool->max_inflight] = slot;
    pool->free_count++;
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

uint64_t ferry__ack_for_rank_locked(ferry_pool *pool, uint32_t rank,
                                    int (*which)(const ferry_pool *pool, uint32_t slot, void *arg),
                                    void *arg)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < pool->inflight_count; i++) {
        uint32_t slot = pool->inflight[i];
        if (which && !which(pool, slot, arg))
            continue;
        uint64_t word = ferry__shm_ack_word(&pool->mem.shm.layout, slot, rank);
        uint32_t gen = pool->slots[slot].generation;
        if (ferry__load_acquire32(&pool->mem.control[word]) != gen &&
            pool->ops->write_words(&pool->mem, word, 1, gen) == FERRY_OK)
            n++;
    }
    return n;
}

uint64_t ferry__reap_dead_locked(ferry_pool *pool)
{
    uint64_t n = 0;
    if (!ferry__ranks_look_locked(pool) || pool->ops->sync_control(&pool->mem) != FERRY_OK)
        return 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        if (!ferry__rank_dead_locked(pool, r))
            continue;
        uint64_t acked = ferry__ack_for_rank_locked(pool, r, NULL, NULL);
        ferry__rank_note_reaped_locked(pool, r, acked);
        n += acked;
    }
    pool->stats.acked_for_dead += n;
    return n;
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
            const ferry__shm_layout *l = &pool->mem.shm.layout;
            uint32_t gen = pool->slots[slot].generation;
            uint32_t ack =
                ferry__load_acquire32(&pool->mem.control[ferry__shm_ack_word(l, slot, r)]);
            if (ferry__load_acquire32(&pool->mem.control[ferry__shm_ready_word(l, slot)]) == gen &&
                ack != gen) {
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
        if (!ferry__holds_describe_locked(pool, buf, size))
            snprintf(buf, size, "no consumer holds a published lease");
        return;
    }
    char who[FERRY__HOLDER_TEXT], parts[160] = "";
    ferry__rank_describe_locked(pool, (uint32_t)r, who, sizeof(who));
    if (partly)
        snprintf(parts, sizeof(parts),
                 " (%llu partly acknowledged: packed leases with parts left, which "
                 "ferry_consumer_ack_lease acknowledges whole)",
                 (unsigned long long)partly);
    snprintf(buf, size, "slowest consumer: rank %d (%s) holds %llu leases%s, oldest %.3f ms", r,
             who, (unsigned long long)held, parts, (double)(ferry__now_ns() - oldest) / 1e6);
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
            ferry__shm_acked(&pool->mem.shm);
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
