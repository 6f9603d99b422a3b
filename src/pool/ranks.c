/* Rank liveness (ranks.h): attach, takeover, the death verdict and its reversal. */
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "pool/pool.h"
#include "shm/signal.h"

/* ---- holders: the only code that knows their kinds ------------------------------------ */

static ferry__liveness holder_check(const ferry__holder *h)
{
    switch (h->kind) {
    case FERRY__HOLDER_PROCESS:
        return ferry__proc_alive(h->pid, h->starttime) ? FERRY__RANK_ALIVE : FERRY__RANK_DEAD;
    case FERRY__HOLDER_NONE:
        break;
    }
    return FERRY__RANK_FREE;
}

/* 1 if h is process pid, which started at start. */
static int holder_same(const ferry__holder *h, pid_t pid, uint64_t start)
{
    return h->kind == FERRY__HOLDER_PROCESS && h->pid == pid && h->starttime == start;
}

static void holder_describe(const ferry__holder *h, const char *state, char *buf, size_t size)
{
    snprintf(buf, size, "pid %d, %s", h->kind == FERRY__HOLDER_PROCESS ? (int)h->pid : 0, state);
}

static void holder_release(ferry__holder *h)
{
    h->kind = FERRY__HOLDER_NONE;
}

static const char *liveness_name(ferry__liveness l)
{
    switch (l) {
    case FERRY__RANK_ALIVE:
        return "alive";
    case FERRY__RANK_DEAD:
        return "dead";
    case FERRY__RANK_FREE:
        break;
    }
    return "not attached yet";
}

/* ---- the table ------------------------------------------------------------------------- */

ferry_status ferry__ranks_init(ferry_pool *pool)
{
    pool->ranks = calloc(pool->consumers, sizeof(*pool->ranks));
    if (!pool->ranks)
        return ferry__fail(FERRY_NO_MEMORY, "%s pool: out of memory for its ranks",
                           pool->ops->name);
    return FERRY_OK;
}

void ferry__ranks_fini(ferry_pool *pool)
{
    if (!pool->ranks)
        return;
    for (uint32_t r = 0; r < pool->consumers; r++)
        holder_release(&pool->ranks[r].holder);
    free(pool->ranks);
    pool->ranks = NULL;
}

/* ---- verdicts -------------------------------------------------------------------------- */

int ferry__rank_dead_locked(const ferry_pool *pool, uint32_t rank)
{
    return pool->ranks[rank].dead;
}

ferry__liveness ferry__rank_liveness_locked(const ferry_pool *pool, uint32_t rank)
{
    const ferry__rank *rk = &pool->ranks[rank];
    if (rk->holder.kind == FERRY__HOLDER_NONE)
        return FERRY__RANK_FREE;
    return rk->dead ? FERRY__RANK_DEAD : holder_check(&rk->holder);
}

/* Reading /proc costs microseconds per consumer: holders are looked at no more often than
 * the reclaim interval (and at most every 10 ms), however often reclaim runs. */
static int look_due_locked(ferry_pool *pool)
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

int ferry__ranks_look_locked(ferry_pool *pool)
{
    int look = look_due_locked(pool), any = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__rank *rk = &pool->ranks[r];
        if (look && rk->holder.kind != FERRY__HOLDER_NONE && !rk->dead &&
            holder_check(&rk->holder) == FERRY__RANK_DEAD)
            rk->dead = 1;
        any |= rk->dead;
    }
    return any;
}

int ferry__rank_held_by_locked(const ferry_pool *pool, uint32_t rank, pid_t pid)
{
    const ferry__rank *rk = &pool->ranks[rank];
    return holder_same(&rk->holder, pid, ferry__proc_starttime(pid)) && !rk->dead;
}

void ferry__rank_describe_locked(const ferry_pool *pool, uint32_t rank, char *buf, size_t size)
{
    holder_describe(&pool->ranks[rank].holder,
                    liveness_name(ferry__rank_liveness_locked(pool, rank)), buf, size);
}

void ferry__rank_note_reaped_locked(ferry_pool *pool, uint32_t rank, uint64_t acked)
{
    ferry__rank *rk = &pool->ranks[rank];
    if (!acked || rk->warned)
        return;
    char who[64];
    holder_describe(&rk->holder, "dead", who, sizeof(who));
    rk->warned = 1;
    ferry__log(FERRY_LOG_WARN,
               "%s pool: consumer rank %u (%s) is gone; acknowledging its leases on its behalf "
               "(%llu so far)",
               pool->ops->name, rank, who, (unsigned long long)acked);
}

void ferry__rank_info_locked(const ferry_pool *pool, uint32_t rank, ferry_consumer_info *info)
{
    const ferry__holder *h = &pool->ranks[rank].holder;
    info->attached = h->kind != FERRY__HOLDER_NONE;
    info->pid = h->kind == FERRY__HOLDER_PROCESS ? h->pid : 0;
    info->alive = ferry__rank_liveness_locked(pool, rank) == FERRY__RANK_ALIVE;
}

void ferry__ranks_count_locked(const ferry_pool *pool, uint64_t *attached, uint64_t *alive)
{
    *attached = *alive = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__liveness l = ferry__rank_liveness_locked(pool, r);
        *attached += l != FERRY__RANK_FREE;
        *alive += l == FERRY__RANK_ALIVE;
    }
}

/* ---- attach and takeover --------------------------------------------------------------- */

/* Whether the dead holder of a rank took the lease in flight in slot (which the successor
 * will then never see): a lease sent through the rings was taken if it was pushed and is not
 * queued any more (mark: ferry__channel_mark_queued_locked); a lease whose descriptor went
 * out through the user's own channel was, as far as the pool can tell, if it is older than
 * the successor, which may already have been handed the newer ones. */
static int taken_by_dead(const ferry_pool *pool, uint32_t slot, void *arg)
{
    const ferry__slot *s = &pool->slots[slot];
    if (s->sent)
        return s->pushed && !s->mark;
    return s->leased_ns < *(const uint64_t *)arg;
}

/* A rank whose holder died is taken over: what the dead holder took is acknowledged on its
 * behalf, in the same critical section as the takeover (a lease it took and never
 * acknowledged would otherwise wait forever for an acknowledgement the new process knows
 * nothing of); what is still queued in the rank's ring, or on its way there, is left to the
 * successor, which receives it. */
static uint64_t settle_dead_rank_locked(ferry_pool *pool, uint32_t rank, pid_t successor)
{
    if (pool->ops->sync_control(&pool->mem) != FERRY_OK)
        return 0;
    uint64_t born = ferry__proc_start_ns(successor);
    if (!born)
        born = UINT64_MAX;
    ferry__channel_mark_queued_locked(pool, rank);
    uint64_t n = ferry__ack_for_rank_locked(pool, rank, taken_by_dead, &born);
    for (uint32_t i = 0; i < pool->inflight_count; i++)
        pool->slots[pool->inflight[i]].mark = 0;
    pool->stats.acked_for_dead += n;
    if (n) {
        char who[64];
        holder_describe(&pool->ranks[rank].holder, "dead", who, sizeof(who));
        ferry__log(FERRY_LOG_WARN,
                   "%s pool: consumer rank %u (%s) is gone and a new process takes it over; its "
                   "%llu leases in flight were acknowledged on its behalf",
                   pool->ops->name, rank, who, (unsigned long long)n);
    }
    return n;
}

ferry_status ferry__ranks_attach(void *arg, uint32_t rank, pid_t pid, pid_t *holder)
{
    ferry_pool *pool = arg;
    uint64_t start = ferry__proc_starttime(pid), settled = 0;
    pthread_mutex_lock(&pool->lock);
    ferry__rank *rk = &pool->ranks[rank];
    if (rk->holder.kind != FERRY__HOLDER_NONE && !holder_same(&rk->holder, pid, start)) {
        if (ferry__rank_liveness_locked(pool, rank) == FERRY__RANK_ALIVE) {
            *holder = rk->holder.pid;
            pthread_mutex_unlock(&pool->lock);
            return FERRY_RANK_IN_USE;
        }
        settled = settle_dead_rank_locked(pool, rank, pid);
        ferry__channel_forget_rank_locked(pool, rank);
    }
    holder_release(&rk->holder);
    rk->holder = (ferry__holder){.kind = FERRY__HOLDER_PROCESS, .pid = pid, .starttime = start};
    rk->dead = 0;
    rk->warned = 0;
    pthread_mutex_unlock(&pool->lock);
    if (settled)
        ferry__shm_acked(&pool->mem.shm);
    return FERRY_OK;
}
