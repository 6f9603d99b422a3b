/* The process-wide cache of opened pools: each pool is mapped once per process, and stays
 * mapped while its producer lives or while a call or a view still uses it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "consumer/consumer.h"
#include "shm/signal.h"
#include "transport/transport.h"

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry__mapped_pool *cache_head;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

/* A forked child holds none of its parent's claims, and CUDA state does not survive a fork:
 * the child starts with an empty cache. The parent's mappings stay mapped in the child (a
 * view the child inherited must not fault); their bookkeeping is left behind. */
static void cache_after_fork(void)
{
    pthread_mutex_init(&cache_lock, NULL);
    cache_head = NULL;
}

static void cache_init(void)
{
    pthread_atfork(NULL, NULL, cache_after_fork);
}

/* A pool whose producer is gone stays listed while calls or views hold it, so that their
 * acknowledgements still find it; only callers that can use such a pool ask for it. */
static ferry__mapped_pool *find_locked(const uint8_t id[16], int allow_gone)
{
    for (ferry__mapped_pool *p = cache_head; p; p = p->next)
        if (memcmp(p->pool_id, id, 16) == 0 && (allow_gone || !ferry__load_acquire32(&p->gone)))
            return p;
    return NULL;
}

static void unlink_locked(ferry__mapped_pool *pool)
{
    for (ferry__mapped_pool **pp = &cache_head; *pp; pp = &(*pp)->next) {
        if (*pp == pool) {
            *pp = pool->next;
            return;
        }
    }
}

static void unmap_pool(ferry__mapped_pool *pool)
{
    if (pool->ops)
        pool->ops->view_detach(pool);
    if (pool->place)
        pool->place->close(pool);
    ferry__parts_clear(&pool->parts);
    pthread_mutex_destroy(&pool->parts_lock);
    free(pool->viewed);
    free(pool->lent);
    free(pool->giving);
    if (pool->base)
        munmap(pool->base, pool->size);
    if (pool->producer_fd >= 0)
        close(pool->producer_fd);
    pthread_mutex_destroy(&pool->claim_lock);
    free(pool->attached);
    free(pool);
}

/* The transport's checks of a layout the segment module validated: its placement, and the
 * segment's bytes after the header. */
static ferry_status check_transport(const ferry__shm_layout *l, uint64_t size,
                                    const ferry__transport_ops **out)
{
    const char *why = NULL;
    const ferry__transport_ops *ops = NULL;
    uint64_t tail = 0;
    if (ferry__transport_of(l->backend, &ops) != FERRY_OK)
        why = "backend differs";
    else if (ops->view_check(l, &tail) != NULL)
        why = "placement differs";
    else if (l->header_bytes + tail != size)
        why = "segment size differs from the layout";
    if (why)
        return ferry__fail(FERRY_MISMATCH, "pool header does not match the descriptor: %s", why);
    *out = ops;
    return FERRY_OK;
}

static ferry_status map_segment(int fd, uint64_t sent_size, ferry__mapped_pool *pool)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "fstat of the pool fd failed");
    if ((uint64_t)st.st_size != sent_size || sent_size < FERRY_GEN_TABLE_OFFSET)
        return ferry__fail(FERRY_MISMATCH, "pool fd has %lld bytes, broker announced %llu",
                           (long long)st.st_size, (unsigned long long)sent_size);
    void *p = mmap(NULL, sent_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "mapping the pool failed");
    pool->base = p;
    pool->size = sent_size;
    return FERRY_OK;
}

static void fill_view(ferry__mapped_pool *pool, const ferry_descriptor *d)
{
    const ferry__shm_layout *l = &pool->shm.layout;
    pool->backend = l->backend;
    pool->flags = (uint8_t)l->desc_flags;
    memcpy(pool->handle, d->handle, sizeof(pool->handle));
    pool->consumers = l->consumers;
    pool->max_inflight = l->max_inflight;
    pool->row_words = l->row_words;
    pool->memory_size = l->memory_size;
    pool->data_size = l->data_size;
}

/* Nanoseconds left until deadline (0 once passed). */
static uint64_t remaining(uint64_t deadline)
{
    uint64_t now = ferry__now_ns();
    return deadline > now ? deadline - now : 0;
}

/* Asks the pool's broker for its fd (a broker whose table is full is asked again). */
static ferry_status broker_ask(const uint8_t broker[16], const uint8_t pool_id[16],
                               uint64_t deadline, int *fd, uint64_t *size, pid_t *ppid)
{
    return ferry__broker_request_patient(broker, pool_id, "pool broker", remaining(deadline), fd,
                                         size, ppid);
}

/* Maps the segment the broker sent and checks it; the fd is closed either way. */
static ferry_status map_checked(ferry__mapped_pool *pool, const ferry_descriptor *d, int fd,
                                uint64_t size)
{
    ferry_status st = map_segment(fd, size, pool);
    close(fd);
    if (st == FERRY_OK)
        st = ferry__shm_open(&pool->shm, pool->base, size, d);
    if (st == FERRY_OK)
        st = check_transport(&pool->shm.layout, size, &pool->ops);
    if (st == FERRY_OK && (!(pool->attached = calloc(d->consumer_count, 1)) ||
                           !(pool->lent = calloc(d->consumer_count, sizeof(*pool->lent))) ||
                           !(pool->giving = calloc(d->consumer_count, sizeof(*pool->giving)))))
        st = ferry__fail(FERRY_NO_MEMORY, "out of memory opening a pool");
    if (st != FERRY_OK)
        return st;
    fill_view(pool, d);
    const ferry__placement *place = pool->ops->view_placement(&pool->shm.layout);
    st = place->open(pool);
    if (st == FERRY_OK)
        pool->place = place; /* closed by unmap_pool from here */
    return st;
}

/* Opens a pool through its broker (claiming no rank: ferry__cache_claim does, once the
 * pool is open). claim is the rank the caller will claim, or none. */
static ferry_status open_pool(const ferry_descriptor *d, uint32_t claim, int device,
                              uint64_t deadline, ferry__mapped_pool **out)
{
    int fd = -1;
    uint64_t size;
    pid_t ppid;
    ferry__mapped_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory opening a pool");
    pool->producer_fd = -1;
    pthread_mutex_init(&pool->parts_lock, NULL);
    pthread_mutex_init(&pool->claim_lock, NULL);
    ferry_status st = broker_ask(d->broker, d->pool_id, deadline, &fd, &size, &ppid);
    if (st == FERRY_OK)
        st = map_checked(pool, d, fd, size);
    if (st == FERRY_OK)
        st = pool->ops->view_attach(pool, device);
    if (st != FERRY_OK) {
        unmap_pool(pool);
        return st;
    }
    memcpy(pool->pool_id, d->pool_id, 16);
    memcpy(pool->broker, d->broker, 16);
    /* Watched from now on, so that a look at it cannot fail for want of descriptors. */
    pool->producer_pid = ppid;
    pool->producer_start = ferry__proc_starttime(ppid);
    pool->producer_fd = ferry__proc_watch(ppid);
    pool->open_rank = claim;
    *out = pool;
    return FERRY_OK;
}

/* What this process holds of a rank (attached[rank]); RANK_RELEASING: its last lent consumer
 * is giving it back (a claim meanwhile keeps it). */
enum { RANK_NOT_HELD = 0, RANK_HELD = 1, RANK_LENT = 2, RANK_RELEASING = 3 };

/* Claims rank for this process unless it holds it; then held for the process's life
 * (RANK_HELD), or only while lent[rank] counts consumers that give it back (RANK_LENT).
 * Called with claim_lock held. */
static ferry_status claim_locked(ferry__mapped_pool *pool, uint32_t rank, int lend,
                                 uint64_t deadline)
{
    if (rank >= pool->consumers)
        return ferry__fail(FERRY_MISMATCH, "rank %u is out of range for the pool (consumers=%u)",
                           rank, pool->consumers);
    pthread_mutex_lock(&cache_lock);
    uint8_t held = pool->attached[rank];
    pthread_mutex_unlock(&cache_lock);
    if (held == RANK_NOT_HELD) {
        ferry_status st = ferry__broker_claim(pool->broker, pool->pool_id, rank, "pool broker",
                                              remaining(deadline));
        if (st != FERRY_OK)
            return st;
    }
    /* As it is now: a give-back may have begun since (RELEASING), and this claim keeps the
     * rank (only the claim lock, held here, ends a give-back). */
    pthread_mutex_lock(&cache_lock);
    if (lend)
        __atomic_add_fetch(&pool->lent[rank], 1, __ATOMIC_ACQ_REL);
    if (!lend || pool->attached[rank] != RANK_HELD)
        pool->attached[rank] = lend ? RANK_LENT : RANK_HELD;
    pthread_mutex_unlock(&cache_lock);
    return FERRY_OK;
}

static ferry_status claim(ferry__mapped_pool *pool, uint32_t rank, int lend, uint64_t deadline)
{
    pthread_mutex_lock(&pool->claim_lock);
    ferry_status st = claim_locked(pool, rank, lend, deadline);
    pthread_mutex_unlock(&pool->claim_lock);
    return st;
}

ferry_status ferry__cache_claim(ferry__mapped_pool *pool, uint32_t rank, uint64_t deadline)
{
    /* A rank this process holds already is held for its life from now on, without the
     * claim lock (a give-back may hold it for seconds): a give-back that comes later then
     * finds the rank held and keeps it. */
    if (rank < pool->consumers) {
        pthread_mutex_lock(&cache_lock);
        int held = pool->attached[rank] != RANK_NOT_HELD;
        if (held)
            pool->attached[rank] = RANK_HELD;
        pthread_mutex_unlock(&cache_lock);
        if (held)
            return FERRY_OK;
    }
    return claim(pool, rank, 0, deadline);
}

ferry_status ferry__cache_lend(ferry__mapped_pool *pool, uint32_t rank, uint64_t deadline)
{
    return claim(pool, rank, 1, deadline);
}

/* The views of a rank given back end: the producer acknowledged their leases for it. Their
 * records go, with the references they hold (never the last: the caller holds one). */
static void end_views_of_rank(ferry__mapped_pool *p, uint32_t rank)
{
    uint32_t *t = __atomic_load_n(&p->viewed, __ATOMIC_ACQUIRE);
    int dropped = 0;
    for (uint64_t slot = 0; t && slot < p->max_inflight; slot++)
        dropped += __atomic_exchange_n(&t[slot * p->consumers + rank], 0, __ATOMIC_ACQ_REL) != 0;
    pthread_mutex_lock(&cache_lock);
    p->refs -= dropped;
    pthread_mutex_unlock(&cache_lock);
}

int ferry__cache_held_for_life(ferry__mapped_pool *pool, uint32_t rank)
{
    pthread_mutex_lock(&cache_lock);
    int held = pool->attached[rank] == RANK_HELD;
    pthread_mutex_unlock(&cache_lock);
    return held;
}

void ferry__cache_give_back(ferry__mapped_pool *pool, uint32_t rank)
{
    pthread_mutex_lock(&cache_lock);
    int last = pool->lent[rank] > 0 &&
               __atomic_sub_fetch(&pool->lent[rank], 1, __ATOMIC_ACQ_REL) == 0 &&
               pool->attached[rank] == RANK_LENT;
    uint32_t mine = 0;
    if (last) {
        pool->attached[rank] = RANK_RELEASING;
        mine = ++pool->giving[rank];
    }
    pthread_mutex_unlock(&cache_lock);
    if (!last)
        return;
    /* The producer settles the rank when it is given back, so the copies and
     * acknowledgements queued for it on streams must have run first: one still queued would
     * read a recycled slice, or land on a successor's acknowledgement. Waited for outside
     * the claim lock (other ranks' claims go on); a claim of this rank meanwhile keeps it. */
    int gone = ferry__load_acquire32(&pool->gone);
    ferry_status st =
        gone ? FERRY_PRODUCER_GONE
             : pool->ops->view_quiesce(pool, rank, ferry__deadline(FERRY_GIVE_BACK_STREAMS_NS));
    pthread_mutex_lock(&pool->claim_lock);
    pthread_mutex_lock(&cache_lock);
    /* Still this give-back's: a claim meanwhile cancels it, and a lend that came and went
     * meanwhile began a give-back of its own, whose wait covers its work. */
    int releasing = pool->attached[rank] == RANK_RELEASING && pool->giving[rank] == mine;
    if (releasing)
        pool->attached[rank] = RANK_NOT_HELD;
    pthread_mutex_unlock(&cache_lock);
    /* Where the wait or the release fails, the rank stays this process's at the producer, as
     * any local claim does, and is settled when the process exits (its views live on until
     * then); this process may claim it again meanwhile. */
    if (releasing && st == FERRY_OK)
        st = ferry__broker_release(pool->broker, pool->pool_id, rank, "pool broker",
                                   FERRY_GIVE_BACK_TIMEOUT_NS);
    if (releasing && st != FERRY_OK && ferry__producer_gone(pool) == 1)
        st = FERRY_PRODUCER_GONE; /* nothing to settle (and the cache lets the pool go) */
    if (releasing && (st == FERRY_OK || st == FERRY_PRODUCER_GONE))
        end_views_of_rank(pool, rank);
    else if (releasing)
        ferry__log(FERRY_LOG_WARN,
                   "%s; rank %u stays this process's until it exits (its leases in flight are "
                   "then acknowledged on its behalf)",
                   ferry_last_error(), rank);
    pthread_mutex_unlock(&pool->claim_lock);
}

/* Only a producer known gone: one whose liveness cannot be told now stays. */
static int producer_gone_now(const ferry__mapped_pool *p)
{
    return ferry__shm_closing(&p->shm) ||
           ferry__proc_check(p->producer_pid, p->producer_start, p->producer_fd) == 0;
}

/* Views whose lease every process can see acknowledged for their rank have ended (the
 * contract: a view is valid until its rank's acknowledgement): their references go. Only
 * for control words the CPU can read; other views end with this process's own ack. */
static int drop_ended_views_locked(ferry__mapped_pool *p)
{
    int dropped = 0;
    if (!p->viewed)
        return 0;
    for (uint64_t i = 0; i < (uint64_t)p->max_inflight * p->consumers; i++) {
        uint32_t gen = ferry__load_acquire32(&p->viewed[i]);
        uint64_t slot = i / p->consumers, rank = i % p->consumers;
        if (gen &&
            p->place->seen(p, ferry__shm_ack_word(&p->shm.layout, (uint32_t)slot, (uint32_t)rank),
                           gen) &&
            __atomic_compare_exchange_n(&p->viewed[i], &gen, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            dropped++;
    }
    return dropped;
}

/* Marks a pool gone and drops the cache's reference (and those of views that ended); 1 if
 * no reference is left. */
static int drop_gone_locked(ferry__mapped_pool *p)
{
    ferry__store_release32(&p->gone, 1);
    p->refs -= 1 + drop_ended_views_locked(p);
    return p->refs == 0;
}

/* Drops the cache's reference to pools whose producer closed them or died, so that a
 * long-lived consumer does not keep every pool it ever opened mapped; those no call or view
 * holds any more are unlinked into *unmap. */
static void sweep_gone_locked(ferry__mapped_pool **unmap)
{
    ferry__mapped_pool **pp = &cache_head;
    while (*pp) {
        ferry__mapped_pool *p = *pp;
        if (!ferry__load_acquire32(&p->gone) && producer_gone_now(p) && drop_gone_locked(p)) {
            *pp = p->next;
            p->next = *unmap;
            *unmap = p;
        } else {
            pp = &p->next;
        }
    }
}

static void unmap_all(ferry__mapped_pool *list)
{
    while (list) {
        ferry__mapped_pool *next = list->next;
        unmap_pool(list);
        list = next;
    }
}

void ferry__cache_sweep(void)
{
    ferry__mapped_pool *unmap = NULL;
    pthread_once(&cache_once, cache_init);
    pthread_mutex_lock(&cache_lock);
    sweep_gone_locked(&unmap);
    pthread_mutex_unlock(&cache_lock);
    unmap_all(unmap);
}

static ferry_status insert_or_reuse(ferry__mapped_pool *fresh, ferry__mapped_pool **out)
{
    ferry__mapped_pool *unmap = NULL;
    pthread_mutex_lock(&cache_lock);
    sweep_gone_locked(&unmap);
    ferry__mapped_pool *have = find_locked(fresh->pool_id, 0);
    if (have) {
        /* Another thread opened it meanwhile: keep theirs. */
        have->refs++;
        fresh->next = unmap;
        unmap = fresh;
        *out = have;
    } else {
        fresh->refs = 2; /* the cache's and the caller's */
        fresh->next = cache_head;
        cache_head = fresh;
        *out = fresh;
    }
    pthread_mutex_unlock(&cache_lock);
    unmap_all(unmap);
    return FERRY_OK;
}

ferry_status ferry__cache_acquire(const ferry_descriptor *desc, uint32_t claim, int device,
                                  uint64_t deadline, int allow_gone, ferry__mapped_pool **out)
{
    if (claim != FERRY__RANK_NONE && claim >= desc->consumer_count)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank %u is out of range (consumers=%u)", claim,
                           desc->consumer_count);
    pthread_once(&cache_once, cache_init);
    pthread_mutex_lock(&cache_lock);
    ferry__mapped_pool *pool = find_locked(desc->pool_id, allow_gone);
    if (pool)
        pool->refs++;
    pthread_mutex_unlock(&cache_lock);
    ferry_status st = FERRY_OK;
    if (!pool) {
        ferry__mapped_pool *fresh = NULL;
        st = open_pool(desc, claim, device, deadline, &fresh);
        if (st != FERRY_OK)
            return st;
        insert_or_reuse(fresh, &pool);
    }
    /* The claim comes last, once the pool is open: a call that fails on the way holds none. */
    if (claim != FERRY__RANK_NONE)
        st = ferry__cache_claim(pool, claim, deadline);
    if (st != FERRY_OK) {
        ferry__cache_release(pool);
        return st;
    }
    *out = pool;
    return FERRY_OK;
}

void ferry__cache_retain(ferry__mapped_pool *pool)
{
    pthread_mutex_lock(&cache_lock);
    pool->refs++;
    pthread_mutex_unlock(&cache_lock);
}

void ferry__cache_release(ferry__mapped_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&cache_lock);
    int last = --pool->refs == 0;
    if (last)
        unlink_locked(pool);
    pthread_mutex_unlock(&cache_lock);
    if (last)
        unmap_pool(pool);
}

void ferry__cache_evict(ferry__mapped_pool *pool)
{
    pthread_mutex_lock(&cache_lock);
    if (!ferry__load_acquire32(&pool->gone))
        drop_gone_locked(pool); /* never the last reference: the caller holds one */
    pthread_mutex_unlock(&cache_lock);
}

unsigned ferry__cache_size(void)
{
    unsigned n = 0;
    pthread_mutex_lock(&cache_lock);
    for (ferry__mapped_pool *p = cache_head; p; p = p->next)
        n += !ferry__load_acquire32(&p->gone);
    pthread_mutex_unlock(&cache_lock);
    return n;
}
