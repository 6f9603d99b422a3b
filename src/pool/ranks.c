/* Rank liveness (ranks.h): attach, takeover, the death verdict and its reversal. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "pool/pool.h"
#include "shm/signal.h"

/* ---- holders: the only code that knows their kinds ------------------------------------ */

/* A look at the holder now; *err is errno when it failed (UNKNOWN). */
static ferry__liveness holder_check(const ferry__holder *h, int *err)
{
    switch (h->kind) {
    case FERRY__HOLDER_PROCESS: {
        int alive = ferry__proc_check(h->pid, h->starttime, h->pidfd);
        if (alive < 0)
            *err = errno;
        return alive > 0 ? FERRY__RANK_ALIVE : alive == 0 ? FERRY__RANK_DEAD : FERRY__RANK_UNKNOWN;
    }
    case FERRY__HOLDER_REMOTE:
        return h->gone ? FERRY__RANK_DEAD : FERRY__RANK_ALIVE;
    case FERRY__HOLDER_NONE:
        break;
    }
    return FERRY__RANK_FREE;
}

/* A process that claims a rank, as the producer watches it: its pidfd (a look at it needs no
 * descriptor), and its start time where it can be read. SYSTEM if neither can be had. */
static ferry_status holder_watch(ferry__holder *h, pid_t pid)
{
    int fd = ferry__proc_watch(pid);
    int err = errno;
    uint64_t start = ferry__proc_starttime(pid);
    if (fd < 0 && !start && (err == EMFILE || err == ENFILE || err == ENOMEM))
        return ferry__fail_errno(FERRY_SYSTEM, err, "cannot watch process %d", (int)pid);
    *h =
        (ferry__holder){.kind = FERRY__HOLDER_PROCESS, .pid = pid, .starttime = start, .pidfd = fd};
    return FERRY_OK;
}

/* 1 if the holder is the process pid, 0 if not, -1 (errno set) where the look failed. A
 * holder's pid is nobody else's while its pidfd says it lives (a pid is reused only once its
 * process is gone); without a pidfd, start times tell. */
static int holder_look(const ferry__holder *h, pid_t pid)
{
    if (h->kind != FERRY__HOLDER_PROCESS || h->pid != pid)
        return 0;
    if (h->pidfd < 0 && !h->starttime)
        return 0; /* neither a pidfd nor a start time: nothing tells it from a successor */
    return ferry__proc_check(pid, h->starttime, h->pidfd);
}

/* 1 if the holder is the process pid (a failed look: not known to be). */
static int holder_is(const ferry__holder *h, pid_t pid)
{
    return holder_look(h, pid) == 1;
}

static void holder_describe(const ferry__holder *h, const char *state, char *buf, size_t size)
{
    if (h->kind == FERRY__HOLDER_REMOTE)
        snprintf(buf, size, "pid %d on host %s, remote, %s", (int)h->pid, h->host, state);
    else if (h->kind == FERRY__HOLDER_PROCESS && h->gone)
        snprintf(buf, size, "pid %d, gave it back", (int)h->pid);
    else
        snprintf(buf, size, "pid %d, %s", h->kind == FERRY__HOLDER_PROCESS ? (int)h->pid : 0,
                 state);
}

static void holder_release(ferry__holder *h)
{
    if (h->kind == FERRY__HOLDER_PROCESS && h->pidfd >= 0)
        close(h->pidfd);
    h->kind = FERRY__HOLDER_NONE;
    h->pidfd = -1;
}

static const char *liveness_name(ferry__liveness l)
{
    switch (l) {
    case FERRY__RANK_ALIVE:
        return "alive";
    case FERRY__RANK_DEAD:
        return "dead";
    case FERRY__RANK_UNKNOWN:
        return "liveness unknown";
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
    for (uint32_t r = 0; r < pool->consumers; r++)
        pool->ranks[r].holder.pidfd = -1;
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

/* The verdict, or a look now; *err is errno when the look failed. */
static ferry__liveness liveness_locked(const ferry_pool *pool, uint32_t rank, int *err)
{
    const ferry__rank *rk = &pool->ranks[rank];
    if (rk->holder.kind == FERRY__HOLDER_NONE)
        return FERRY__RANK_FREE;
    return rk->dead ? FERRY__RANK_DEAD : holder_check(&rk->holder, err);
}

ferry__liveness ferry__rank_liveness_locked(const ferry_pool *pool, uint32_t rank)
{
    int err;
    return liveness_locked(pool, rank, &err);
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

/* Only a look that found the holder gone gives the verdict: one that failed (out of file
 * descriptors) says nothing, and the rank keeps its holder and its messages. */
int ferry__ranks_look_locked(ferry_pool *pool)
{
    int look = look_due_locked(pool), any = 0, err = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__rank *rk = &pool->ranks[r];
        if (look && rk->holder.kind != FERRY__HOLDER_NONE && !rk->dead &&
            holder_check(&rk->holder, &err) == FERRY__RANK_DEAD)
            rk->dead = 1;
        any |= rk->dead;
    }
    return any;
}

int ferry__rank_held_by_locked(const ferry_pool *pool, uint32_t rank, pid_t pid)
{
    const ferry__rank *rk = &pool->ranks[rank];
    return holder_is(&rk->holder, pid) && !rk->dead;
}

void ferry__rank_describe_locked(const ferry_pool *pool, uint32_t rank, char *buf, size_t size)
{
    int err = 0;
    char state[96];
    ferry__liveness l = liveness_locked(pool, rank, &err);
    if (l == FERRY__RANK_UNKNOWN)
        snprintf(state, sizeof(state), "%s: %s", liveness_name(l), strerror(err));
    else
        snprintf(state, sizeof(state), "%s", liveness_name(l));
    holder_describe(&pool->ranks[rank].holder, state, buf, size);
}

void ferry__rank_note_reaped_locked(ferry_pool *pool, uint32_t rank, uint64_t acked)
{
    ferry__rank *rk = &pool->ranks[rank];
    if (!acked || rk->warned)
        return;
    char who[FERRY__HOLDER_TEXT];
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
    info->pid = h->kind != FERRY__HOLDER_NONE ? h->pid : 0;
    info->alive = info->attached && ferry__rank_liveness_locked(pool, rank) != FERRY__RANK_DEAD;
}

void ferry__ranks_count_locked(const ferry_pool *pool, uint64_t *attached, uint64_t *alive)
{
    *attached = *alive = 0;
    for (uint32_t r = 0; r < pool->consumers; r++) {
        ferry__liveness l = ferry__rank_liveness_locked(pool, r);
        *attached += l != FERRY__RANK_FREE;
        *alive += l == FERRY__RANK_ALIVE || l == FERRY__RANK_UNKNOWN;
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

/* A rank whose holder died is taken over, or one its holder gave back: what the holder took
 * is acknowledged on its behalf, in the same critical section as the takeover or the giving
 * back (a lease it took and never acknowledged would otherwise wait forever for an
 * acknowledgement the next process knows nothing of); what is still queued in the rank's
 * ring, or on its way there, is left to the successor, which receives it. born: when the
 * successor started (CLOCK_MONOTONIC ns; UINT64_MAX where unknown, or for a remote one, whose
 * clock is another host's), or when the rank was given back. event: what happens, for the
 * warning. */
static uint64_t settle_rank_locked(ferry_pool *pool, uint32_t rank, uint64_t born,
                                   const char *event)
{
    if (pool->ops->sync_control(&pool->mem) != FERRY_OK)
        return 0;
    ferry__channel_mark_queued_locked(pool, rank);
    uint64_t n = ferry__ack_for_rank_locked(pool, rank, taken_by_dead, &born);
    for (uint32_t i = 0; i < pool->inflight_count; i++)
        pool->slots[pool->inflight[i]].mark = 0;
    pool->stats.acked_for_dead += n;
    if (n) {
        char who[FERRY__HOLDER_TEXT];
        holder_describe(&pool->ranks[rank].holder, "dead", who, sizeof(who));
        ferry__log(FERRY_LOG_WARN,
                   "%s pool: consumer rank %u (%s) %s; its %llu leases in flight were "
                   "acknowledged on its behalf",
                   pool->ops->name, rank, who, event, (unsigned long long)n);
    }
    return n;
}

/* Whether pid may take rank over from its holder: FERRY_OK if the holder is gone, else the
 * refusal (RANK_IN_USE while it lives, SYSTEM while nobody can tell). */
static ferry_status may_take_over_locked(ferry_pool *pool, uint32_t rank, pid_t *holder)
{
    int err = 0;
    switch (liveness_locked(pool, rank, &err)) {
    case FERRY__RANK_ALIVE:
        *holder = pool->ranks[rank].holder.pid;
        return FERRY_RANK_IN_USE;
    case FERRY__RANK_UNKNOWN:
        return ferry__fail_errno(FERRY_SYSTEM, err,
                                 "%s pool: cannot tell whether the holder of rank %u lives",
                                 pool->ops->name, rank);
    case FERRY__RANK_FREE:
    case FERRY__RANK_DEAD:
        break;
    }
    return FERRY_OK;
}

ferry_status ferry__ranks_attach(void *arg, uint32_t rank, pid_t pid, pid_t *holder)
{
    ferry_pool *pool = arg;
    ferry__holder fresh;
    uint64_t settled = 0;
    pthread_mutex_lock(&pool->lock);
    ferry__rank *rk = &pool->ranks[rank];
    ferry_status st = FERRY_OK;
    if (!rk->dead && holder_is(&rk->holder, pid)) { /* the holder again */
        pthread_mutex_unlock(&pool->lock);
        return FERRY_OK;
    }
    if (rk->holder.kind != FERRY__HOLDER_NONE)
        st = may_take_over_locked(pool, rank, holder);
    if (st == FERRY_OK)
        st = holder_watch(&fresh, pid);
    if (st != FERRY_OK) {
        pthread_mutex_unlock(&pool->lock);
        if (st != FERRY_RANK_IN_USE)
            ferry__log(FERRY_LOG_WARN, "%s; rank %u is not given to process %d", ferry_last_error(),
                       rank, (int)pid);
        return st;
    }
    if (rk->holder.kind != FERRY__HOLDER_NONE) {
        uint64_t born = ferry__proc_start_ns(pid);
        settled = settle_rank_locked(pool, rank, born ? born : UINT64_MAX,
                                     "is gone and a new process takes it over");
        ferry__channel_forget_rank_locked(pool, rank);
    }
    holder_release(&rk->holder);
    rk->holder = fresh;
    rk->dead = 0;
    rk->warned = 0;
    pthread_mutex_unlock(&pool->lock);
    if (settled)
        ferry__shm_acked(&pool->mem.shm);
    return FERRY_OK;
}

ferry_status ferry__ranks_release(void *arg, uint32_t rank, pid_t pid)
{
    ferry_pool *pool = arg;
    uint64_t settled = 0;
    pthread_mutex_lock(&pool->lock);
    ferry__rank *rk = &pool->ranks[rank];
    int is = rk->dead ? 0 : holder_look(&rk->holder, pid);
    if (is < 0) {
        int err = errno;
        pthread_mutex_unlock(&pool->lock);
        return ferry__fail_errno(FERRY_SYSTEM, err,
                                 "%s pool: cannot tell whether process %d holds rank %u",
                                 pool->ops->name, (int)pid, rank);
    }
    if (is) {
        /* Settled now, by the time it is given back: a successor may be this same process,
         * born before the leases it gave back. */
        rk->holder.gone = 1;
        rk->dead = 1; /* reaped, or taken over, as a death is */
        settled = settle_rank_locked(pool, rank, ferry__now_ns(), "was given back");
    }
    pthread_mutex_unlock(&pool->lock);
    if (settled)
        ferry__shm_acked(&pool->mem.shm);
    if (is)
        ferry__log(FERRY_LOG_INFO, "%s pool: process %d gave consumer rank %u back",
                   pool->ops->name, (int)pid, rank);
    return FERRY_OK;
}

/* ---- remote holders -------------------------------------------------------------------- */

ferry_status ferry__ranks_attach_remote(ferry_pool *pool, uint32_t rank, uint32_t conn, pid_t pid,
                                        const char *host, pid_t *holder)
{
    uint64_t settled = 0;
    pthread_mutex_lock(&pool->lock);
    ferry__rank *rk = &pool->ranks[rank];
    if (rk->holder.kind != FERRY__HOLDER_NONE) {
        if (ferry__rank_liveness_locked(pool, rank) == FERRY__RANK_ALIVE) {
            *holder = rk->holder.pid;
            pthread_mutex_unlock(&pool->lock);
            return FERRY_RANK_IN_USE;
        }
        /* As for a local successor: what the server forwarded to the dead holder (moving
         * the ring's head) is settled, what is still queued is the successor's. */
        settled = settle_rank_locked(pool, rank, UINT64_MAX,
                                     "is gone and a remote consumer takes it over");
        ferry__channel_forget_rank_locked(pool, rank);
    }
    holder_release(&rk->holder);
    rk->holder =
        (ferry__holder){.kind = FERRY__HOLDER_REMOTE, .pid = pid, .pidfd = -1, .conn = conn};
    snprintf(rk->holder.host, sizeof(rk->holder.host), "%s", host);
    rk->dead = 0;
    rk->warned = 0;
    pthread_mutex_unlock(&pool->lock);
    if (settled)
        ferry__shm_acked(&pool->mem.shm);
    return FERRY_OK;
}

void ferry__ranks_detach_remote(ferry_pool *pool, uint32_t rank, uint32_t conn)
{
    pthread_mutex_lock(&pool->lock);
    ferry__rank *rk = &pool->ranks[rank];
    if (rk->holder.kind == FERRY__HOLDER_REMOTE && rk->holder.conn == conn) {
        rk->holder.gone = 1;
        rk->dead = 1; /* a connection that ended does not come back: the verdict is now */
    }
    pthread_mutex_unlock(&pool->lock);
}
