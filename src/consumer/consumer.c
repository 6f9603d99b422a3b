/* Consumer operations: wait for a lease, read or view it, acknowledge it; on GPU pools also
 * stream-ordered.
 *
 * Every call takes a reference on the opened pool for its own duration (and a view keeps one
 * until its acknowledgement); consumer objects hold none. Only the calls that read a lease
 * (open, wait, read, view and their stream-ordered forms) claim the consumer's rank for this
 * process; acknowledgements never claim or displace a rank. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/broker.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "driver/driver.h"
#include "consumer/consumer.h"
#include "remote/remote.h"
#include "shm/signal.h"
#include "shm/wait.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* (How long each sleep of a waiting consumer lasts and whether it yields first is the
 * transport's: GPU streams write ready words without waking anybody, and usually within
 * microseconds.) The least time a call with a shorter timeout (0 included) gives the broker on
 * first use. */
#define FERRY_OPEN_MIN_NS 100000000ull

ferry_status ferry_consumer_create_on(uint32_t rank, int32_t device, ferry_consumer **out)
{
    if (!out)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer output pointer is NULL");
    if (device < -1)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "device %d is not a device", device);
    if (rank == FERRY__RANK_NONE)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank %u is not a rank", rank);
    ferry_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for a consumer");
    c->rank = rank;
    c->device = device;
    c->pid = ferry__proc_self();
    c->event_fd = c->poll_fd = c->pid_fd = -1;
    pthread_mutex_init(&c->fd_lock, NULL);
    *out = c;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_consumer_create(uint32_t rank, ferry_consumer **out)
{
    return ferry_consumer_create_on(rank, -1, out);
}

void ferry_consumer_destroy(ferry_consumer *c)
{
    FERRY_CUDA_BOUNDARY; /* giving a rank back may wait on the pool's device */
    if (!c)
        return;
    ferry__consumer_unbind(c);
    pthread_mutex_destroy(&c->fd_lock);
    free(c);
}

/* ---- finding the pool ------------------------------------------------------------------- */

ferry_status ferry__consumer_owned(const ferry_consumer *c)
{
    if (c->pid != ferry__proc_self())
        return ferry__fail(FERRY_FORKED,
                           "consumer of rank %u was created by process %d; this forked child "
                           "(pid %d) cannot use it: create (or connect) a consumer in the child",
                           c->rank, (int)c->pid, (int)ferry__proc_self());
    return FERRY_OK;
}

static ferry_status check_call(const ferry_consumer *c, const ferry_descriptor *d)
{
    if (!c || !d)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer or descriptor is NULL");
    return ferry__consumer_owned(c);
}

/* Checks a descriptor against the opened pool's own header. */
static ferry_status check_against_pool(const ferry__mapped_pool *p, const ferry_descriptor *d)
{
    if (d->backend != p->backend || (d->flags & FERRY_DESC_FLAG_DEVICE_CONTROL) != p->flags ||
        memcmp(d->handle, p->handle, sizeof(d->handle)) != 0)
        return ferry__fail(FERRY_MISMATCH, "descriptor backend, placement or handle differs "
                                           "from the opened pool");
    if (d->consumer_count != p->consumers || d->max_inflight != p->max_inflight ||
        d->pool_size != p->memory_size)
        return ferry__fail(FERRY_MISMATCH,
                           "descriptor disagrees with the pool (consumers %u/%u, max_inflight "
                           "%u/%u, size %llu/%llu)",
                           d->consumer_count, p->consumers, d->max_inflight, p->max_inflight,
                           (unsigned long long)d->pool_size, (unsigned long long)p->memory_size);
    if (d->flags & FERRY_DESC_FLAG_POOL_ONLY)
        return FERRY_OK;
    if (d->slot >= p->max_inflight || d->generation == 0 || d->generation > FERRY_GENERATION_MAX)
        return ferry__fail(FERRY_MISMATCH, "descriptor slot %u / generation %u out of range",
                           d->slot, d->generation);
    if (d->offset > p->data_size || d->length > p->data_size - d->offset)
        return ferry__fail(FERRY_MISMATCH,
                           "descriptor range [%llu, +%llu) exceeds the pool's %llu data bytes",
                           (unsigned long long)d->offset, (unsigned long long)d->length,
                           (unsigned long long)p->data_size);
    if (d->part_count && d->part_index >= d->part_count)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "descriptor part %u of %u is out of range",
                           d->part_index, d->part_count);
    return FERRY_OK;
}

/* The deadline a call gives the broker when it opens a pool: its own, or a short grace for a
 * call that may not wait at all. */
static uint64_t open_deadline(uint64_t deadline)
{
    uint64_t least = ferry__deadline(FERRY_OPEN_MIN_NS);
    return deadline > least ? deadline : least;
}

/* The opened pool for a descriptor (opening it on first use, claiming rank claim or none),
 * checked against it; the caller ends with call_release (or done). */
/* The pool a call works on is borrowed from a connected consumer (which holds a reference
 * until it is destroyed, after every call) or referenced for the call. */
static void call_release(ferry_consumer *c, ferry__mapped_pool *p)
{
    if (p != c->bound)
        ferry__cache_release(p);
}

static ferry_status pool_lookup(ferry_consumer *c, const ferry_descriptor *d, uint32_t claim,
                                uint64_t deadline, int open_only, ferry__mapped_pool **out)
{
    ferry__mapped_pool *p = NULL;
    int acking = claim == FERRY__RANK_NONE;
    ferry_status st = check_call(c, d);
    if (st != FERRY_OK)
        return st;
    /* A connected consumer's own pool: opened, its rank claimed at connect. */
    if (c->bound && memcmp(d->pool_id, c->bound->pool_id, 16) == 0 && (acking || claim == c->rank))
        p = c->bound;
    else
        st = ferry__cache_acquire(d, claim, c->device, open_deadline(deadline), acking, &p);
    if (st != FERRY_OK)
        return st;
    st = check_against_pool(p, d);
    if (st == FERRY_OK && (d->flags & FERRY_DESC_FLAG_POOL_ONLY) && !open_only)
        st = ferry__fail(FERRY_INVALID_ARGUMENT,
                         "a pool-only descriptor names no lease: it can only open the pool");
    if (st == FERRY_OK && !acking) /* acks reach the words through the placement alone */
        st = p->ops->view_map(p, c->device, open_deadline(deadline));
    if (st != FERRY_OK) {
        call_release(c, p);
        return st;
    }
    *out = p;
    return FERRY_OK;
}

/* What a call ends with: the pool's reference dropped, the error cleared on success. */
static ferry_status done(ferry_consumer *c, ferry__mapped_pool *p, ferry_status st)
{
    call_release(c, p);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* ---- pools on other hosts ----------------------------------------------------------------- */

/* The connection a call goes through when the descriptor names the pool this consumer
 * reaches over the network (ferry_consumer_connect to a remote address); NULL for every pool
 * of this host (and in a forked child, whose calls then fail FORKED on the local path). */
static ferry__remote_client *remote_of(const ferry_consumer *c, const ferry_descriptor *d)
{
    return c && d && c->remote && c->pid == ferry__proc_self() && ferry__remote_owns(c->remote, d)
               ? c->remote
               : NULL;
}

static ferry_status remote_unmapped(const char *what)
{
    return ferry__fail(FERRY_NOT_SUPPORTED,
                       "%s needs the pool mapped in this process, and this pool is on another "
                       "host: read the lease into memory of yours (ferry_consumer_read)",
                       what);
}

/* A stream-ordered read of a remote pool: the get lands before the call returns (so work
 * the caller enqueues afterwards sees the bytes), then the acknowledgement. */
static ferry_status remote_read_now(ferry_consumer *c, const ferry_descriptor *d, void *dst,
                                    size_t dst_size)
{
    ferry_status st = ferry__remote_read(c->remote, d, dst, dst_size, FERRY_OPEN_TIMEOUT_NS);
    return st == FERRY_OK ? ferry__remote_ack(c->remote, d, c->rank, 1, 1) : st;
}

ferry_status ferry_consumer_open(ferry_consumer *c, const ferry_descriptor *d)
{
    FERRY_CUDA_BOUNDARY;
    if (remote_of(c, d)) { /* connected, its rank claimed, at ferry_consumer_connect */
        ferry__clear_error();
        return FERRY_OK;
    }
    ferry__mapped_pool *p;
    ferry_status st =
        pool_lookup(c, d, c ? c->rank : 0, ferry__deadline(FERRY_OPEN_TIMEOUT_NS), 1, &p);
    return st == FERRY_OK ? done(c, p, st) : st;
}

/* ---- control words -------------------------------------------------------------------- */

static uint64_t rank_index(const ferry__mapped_pool *p, uint32_t slot, uint32_t rank)
{
    return (uint64_t)slot * p->consumers + rank;
}

static ferry_status load_word(ferry_consumer *c, ferry__mapped_pool *p, uint64_t word,
                              uint32_t *value)
{
    return p->place->load(p, c->device, word, value);
}

/* A rank's acknowledgement as this process can know it cheaply (the placement's). */
static ferry_status load_ack(ferry_consumer *c, ferry__mapped_pool *p, uint32_t slot, uint32_t rank,
                             uint32_t *value)
{
    return p->place->load_ack(p, c->device, slot, rank, value);
}

static int part_acked(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank);

static ferry_status stale(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank)
{
    uint32_t now = ferry__shm_generation(&p->shm, d->slot);
    if (now == (d->generation | FERRY_GEN_CANCELLED))
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: lease (slot=%u, generation=%u) was cancelled by "
                           "the producer",
                           d->slot, d->generation);
    if (now != d->generation && now != FERRY_GEN_OVER) /* over: every rank acknowledged it */
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: slot %u now holds generation %u, descriptor has %u",
                           d->slot, now, d->generation);
    if (d->part_count && part_acked(p, d, rank))
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: part %u of lease (slot=%u, generation=%u) was "
                           "already acknowledged for rank %u by this process",
                           d->part_index, d->slot, d->generation, rank);
    return ferry__fail(FERRY_STALE,
                       "stale descriptor: lease (slot=%u, generation=%u) was already "
                       "acknowledged for rank %u or cancelled",
                       d->slot, d->generation, rank);
}

/* *state: 1 ready, 0 not yet, -1 stale (slot reused, or already acknowledged for rank: the
 * lease, or this part of it by this process); *seen (may be NULL) the ready word as read. */
static ferry_status lease_state(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                                int check_ready, int *state, uint32_t *seen)
{
    uint32_t ack, ready = 0;
    *state = -1;
    if (ferry__shm_generation(&p->shm, d->slot) != d->generation)
        return FERRY_OK;
    ferry_status st = load_ack(c, p, d->slot, c->rank, &ack);
    int acked =
        st == FERRY_OK && (ack == d->generation || (d->part_count && part_acked(p, d, c->rank)));
    if (st == FERRY_OK && !acked && check_ready)
        st = load_word(c, p, ferry__shm_ready_word(&p->shm.layout, d->slot), &ready);
    if (st == FERRY_OK && !acked)
        *state = check_ready ? ready == d->generation : 1;
    if (seen)
        *seen = ready;
    return st;
}

/* The descriptor's range must lie inside the extent its lease recorded: a well-formed
 * descriptor cannot reach into another lease. Read once the lease is current (its
 * generation checked, or its ready word seen); the caller checks the generation again. */
static ferry_status check_extent(const ferry__mapped_pool *p, const ferry_descriptor *d)
{
    uint64_t off, len;
    ferry__shm_extent(&p->shm, d->slot, &off, &len);
    return ferry__desc_inside_lease(d, off, len);
}

int ferry__producer_gone(ferry__mapped_pool *p)
{
    int alive = 1;
    if (!ferry__load_acquire32(&p->gone) && !ferry__shm_closing(&p->shm))
        alive = ferry__proc_check(p->producer_pid, p->producer_start, p->producer_fd);
    else
        alive = 0;
    if (alive < 0) {
        ferry__fail_errno(FERRY_SYSTEM, errno,
                          "cannot tell whether the producer of the pool (pid %d) lives",
                          (int)p->producer_pid);
        return -1;
    }
    if (!alive)
        ferry__cache_evict(p);
    return !alive;
}

/* A wait for a lease to be ready (ferry__wait_run). */
typedef struct ready_wait {
    ferry_consumer *c;
    ferry__mapped_pool *p;
    const ferry_descriptor *d;
    uint64_t timeout_ns;
    uint32_t seen; /* the ready word as the last look read it */
} ready_wait;

static int ready_look(void *arg)
{
    ready_wait *w = arg;
    int state;
    ferry_status st = lease_state(w->c, w->p, w->d, 1, &state, &w->seen);
    if (st != FERRY_OK)
        return st;
    if (state < 0)
        return stale(w->p, w->d, w->c->rank);
    if (state == 0)
        return FERRY__WAIT_AGAIN;
    st = check_extent(w->p, w->d);
    if (st != FERRY_OK && ferry__shm_generation_recheck(&w->p->shm, w->d->slot) != w->d->generation)
        return stale(w->p, w->d, w->c->rank); /* the extent read was the next lease's */
    return st;
}

/* Sleeps until the ready word may have changed (a GPU stream writes it without waking
 * anybody: the transport's slice is short then). */
static void ready_sleep(void *arg, uint64_t ns)
{
    ready_wait *w = arg;
    w->p->place->sleep(w->p, ferry__shm_ready_word(&w->p->shm.layout, w->d->slot), w->seen, ns);
}

static ferry_status ready_check(void *arg)
{
    ready_wait *w = arg;
    int gone = ferry__producer_gone(w->p);
    if (gone <= 0)
        return gone ? FERRY_SYSTEM : FERRY_OK;
    return ferry__fail(FERRY_PRODUCER_GONE,
                       "producer of the pool (pid %d) is gone or closed the pool; lease "
                       "(slot=%u, generation=%u) will never be ready",
                       (int)w->p->producer_pid, w->d->slot, w->d->generation);
}

static int ready_expired(void *arg)
{
    ready_wait *w = arg;
    return ferry__fail(FERRY_TIMEOUT, "lease (slot=%u, generation=%u) not ready after %.3f ms",
                       w->d->slot, w->d->generation, (double)w->timeout_ns / 1e6);
}

/* Waits until the lease is ready (and its extent holds the descriptor's range). /proc is read
 * at most every FERRY_READY_WAIT_SLICE_NS, however short the sleeps. */
static ferry_status wait_ready(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                               uint64_t timeout_ns, uint64_t deadline)
{
    ready_wait rw = {.c = c, .p = p, .d = d, .timeout_ns = timeout_ns};
    ferry__wait w = {
        .look = ready_look,
        .sleep = ready_sleep,
        .check = ready_check,
        .expired = ready_expired,
        .ctx = &rw,
        .spin_ns = p->ops->ready_spin_ns, /* a GPU stream is about to write it */
        .slice_ns = p->ops->ready_poll_ns,
        .check_ns = FERRY_READY_WAIT_SLICE_NS,
    };
    return ferry__wait_run(&w, timeout_ns, deadline);
}

ferry_status ferry_consumer_wait(ferry_consumer *c, const ferry_descriptor *d, uint64_t timeout_ns)
{
    FERRY_CUDA_BOUNDARY;
    if (remote_of(c, d))
        return ferry__remote_wait(c->remote, d, timeout_ns);
    ferry__mapped_pool *p;
    uint64_t deadline = ferry__deadline(timeout_ns);
    ferry_status st = pool_lookup(c, d, c ? c->rank : 0, deadline, 0, &p);
    if (st != FERRY_OK)
        return st;
    return done(c, p, wait_ready(c, p, d, timeout_ns, deadline));
}

static ferry_status copy_out(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                             void *dst)
{
    return p->ops->view_copy_out(p, c->device, d->offset, dst, d->length);
}

static ferry_status check_dst(const ferry_descriptor *d, const void *dst, size_t dst_size)
{
    if (d->length && !dst)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "destination is NULL");
    if (dst_size < d->length)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "destination holds %zu bytes, tensor has %llu",
                           dst_size, (unsigned long long)d->length);
    return FERRY_OK;
}

/* After a CPU read: the lease was not recycled while it was read. A slot reused meanwhile
 * has a new generation; a lease whose slice was freed (and maybe leased again under another
 * slot) has this rank's acknowledgement word at its generation, written by whoever
 * acknowledged on its behalf. Both words are read after the copy's reads. */
static ferry_status check_intact(ferry_consumer *c, ferry__mapped_pool *p,
                                 const ferry_descriptor *d)
{
    if (ferry__shm_generation_recheck(&p->shm, d->slot) != d->generation)
        return stale(p, d, c->rank);
    uint32_t ack;
    ferry_status st = load_word(c, p, ferry__shm_ack_word(&p->shm.layout, d->slot, c->rank), &ack);
    if (st != FERRY_OK)
        return st;
    if (ack == d->generation)
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: lease (slot=%u, generation=%u) was acknowledged "
                           "for rank %u while it was being read; the bytes read may be another "
                           "lease's",
                           d->slot, d->generation, c->rank);
    return FERRY_OK;
}

ferry_status ferry_consumer_read(ferry_consumer *c, const ferry_descriptor *d, void *dst,
                                 size_t dst_size, uint64_t timeout_ns)
{
    FERRY_CUDA_BOUNDARY;
    if (remote_of(c, d))
        return ferry__remote_read(c->remote, d, dst, dst_size, timeout_ns);
    ferry__mapped_pool *p;
    uint64_t deadline = ferry__deadline(timeout_ns);
    ferry_status st = pool_lookup(c, d, c ? c->rank : 0, deadline, 0, &p);
    if (st != FERRY_OK)
        return st;
    st = check_dst(d, dst, dst_size);
    if (st == FERRY_OK)
        st = wait_ready(c, p, d, timeout_ns, deadline);
    if (st == FERRY_OK)
        st = copy_out(c, p, d, dst);
    if (st == FERRY_OK)
        st = check_intact(c, p, d);
    return done(c, p, st);
}

/* ---- views: each holds a reference on its pool until its rank acknowledges ---------------- */

static ferry_status viewed_table(ferry__mapped_pool *p, uint32_t **out)
{
    uint32_t *t = __atomic_load_n(&p->viewed, __ATOMIC_ACQUIRE);
    if (!t) {
        uint32_t *fresh = calloc((size_t)p->max_inflight * p->consumers, sizeof(uint32_t));
        if (!fresh)
            return ferry__fail(FERRY_NO_MEMORY, "out of memory for the pool's views");
        if (__atomic_compare_exchange_n(&p->viewed, &t, fresh, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            t = fresh;
        else
            free(fresh);
    }
    *out = t;
    return FERRY_OK;
}

/* Records a view of the lease for rank; a new record takes a reference on the pool (one that
 * replaces the record of an earlier lease of the slot keeps that one's). */
static ferry_status view_begin(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank)
{
    uint32_t *t = NULL;
    ferry_status st = viewed_table(p, &t);
    if (st != FERRY_OK)
        return st;
    uint32_t old =
        __atomic_exchange_n(&t[rank_index(p, d->slot, rank)], d->generation, __ATOMIC_ACQ_REL);
    if (old == 0)
        ferry__cache_retain(p);
    return FERRY_OK;
}

/* The rank's acknowledgement ends its view of the lease, if it had one. */
static void view_end(ferry__mapped_pool *p, uint32_t slot, uint32_t rank, uint32_t generation)
{
    uint32_t *t = __atomic_load_n(&p->viewed, __ATOMIC_ACQUIRE);
    uint32_t expected = generation;
    if (t && __atomic_compare_exchange_n(&t[rank_index(p, slot, rank)], &expected, 0, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        ferry__cache_release(p); /* never the last reference: the call holds one */
}

static ferry_status data_pointer(ferry_consumer *c, ferry__mapped_pool *p,
                                 const ferry_descriptor *d, const void **ptr)
{
    return p->ops->view_data(p, c->device, d->offset, ptr);
}

/* Hands out a view: recorded, then the lease checked current once more, its generation and
 * this rank's real acknowledgement word (a view of a lease recycled, or acknowledged on this
 * rank's behalf, meanwhile is refused and forgotten). */
static ferry_status view_out(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                             const void **data)
{
    const void *ptr = NULL;
    ferry_status st = data_pointer(c, p, d, &ptr);
    if (st == FERRY_OK)
        st = view_begin(p, d, c->rank);
    if (st != FERRY_OK)
        return st;
    st = check_intact(c, p, d);
    if (st != FERRY_OK) {
        view_end(p, d->slot, c->rank, d->generation);
        return st;
    }
    *data = ptr;
    return FERRY_OK;
}

ferry_status ferry_consumer_view(ferry_consumer *c, const ferry_descriptor *d, const void **data,
                                 uint64_t timeout_ns)
{
    FERRY_CUDA_BOUNDARY;
    if (remote_of(c, d))
        return remote_unmapped("a view");
    ferry__mapped_pool *p;
    uint64_t deadline = ferry__deadline(timeout_ns);
    ferry_status st = pool_lookup(c, d, c ? c->rank : 0, deadline, 0, &p);
    if (st != FERRY_OK)
        return st;
    if (!data)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "data output is NULL");
    if (st == FERRY_OK)
        st = wait_ready(c, p, d, timeout_ns, deadline);
    if (st == FERRY_OK)
        st = view_out(c, p, d, data);
    return done(c, p, st);
}

/* ---- packed leases acknowledged part by part ---------------------------------------------- */

/* Whether a set's lease is over: its slot moved on (ferry__parts_drop). */
static int lease_over(void *arg, uint32_t slot, uint32_t generation)
{
    const ferry__mapped_pool *p = arg;
    return ferry__shm_generation(&p->shm, slot) != generation;
}

/* Whether this process acknowledged part d->part_index of d's lease for rank (a part index
 * beyond the set's count was not: part_ack judges that descriptor). */
static int part_acked(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank)
{
    pthread_mutex_lock(&p->parts_lock);
    ferry__parts_drop(&p->parts, lease_over, p);
    int acked = ferry__parts_has(p->parts, d, rank);
    pthread_mutex_unlock(&p->parts_lock);
    return acked;
}

/* Records that rank acknowledged part d->part_index: *complete = 1 if that was the lease's
 * last part (its acknowledgement word must be written now), 0 if parts remain, -1 if this
 * part was acknowledged already. MISMATCH, with nothing recorded, if the part does not fit
 * its lease (ferry__parts_fit). */
static ferry_status part_ack(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t rank,
                             int *complete)
{
    pthread_mutex_lock(&p->parts_lock);
    ferry__parts_drop(&p->parts, lease_over, p);
    ferry_status st = ferry__parts_fit(p->parts, d);
    int found = st == FERRY_OK ? ferry__parts_record(&p->parts, d, rank) : FERRY__PART_AGAIN;
    pthread_mutex_unlock(&p->parts_lock);
    if (st != FERRY_OK)
        return st;
    if (found == FERRY__PART_NO_MEMORY)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for a packed lease's parts");
    *complete = found == FERRY__PART_LAST ? 1 : found == FERRY__PART_AGAIN ? -1 : 0;
    return FERRY_OK;
}

/* ---- acknowledgements --------------------------------------------------------------- */

static ferry_status check_range(const ferry__mapped_pool *p, uint32_t first, uint32_t count)
{
    if (count == 0 || first >= p->consumers || count > p->consumers - first)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank range [%u, %u) is outside [0, %u)", first,
                           first + count, p->consumers);
    return FERRY_OK;
}

/* After a part's acknowledgement that left others to acknowledge: the rank's word says so
 * (generation | FERRY_ACK_PARTIAL), for the producer's consumer_info and pool-full message.
 * Only where the word can be compared and swapped from the value read (ack), so that the mark
 * never replaces an acknowledgement written meanwhile; words on the device go without. */
static ferry_status mark_partial(ferry_consumer *c, ferry__mapped_pool *p,
                                 const ferry_descriptor *d, uint32_t rank, uint32_t ack)
{
    uint32_t mark = d->generation | FERRY_ACK_PARTIAL;
    int replaced;
    if (!p->place->replace_compares || ack == mark)
        return FERRY_OK;
    return p->place->replace(p, c->device, ferry__shm_ack_word(&p->shm.layout, d->slot, rank), &ack,
                             mark, &replaced);
}

/* Writes the lease's generation into the rank's word if it still holds *seen (what the caller
 * read), or this lease's partial mark, which another thread's part acknowledgement may have
 * written since. */
static ferry_status replace_ack(ferry_consumer *c, ferry__mapped_pool *p, uint64_t word,
                                uint32_t *seen, uint32_t generation, int *replaced)
{
    ferry_status st = p->place->replace(p, c->device, word, seen, generation, replaced);
    if (st == FERRY_OK && !*replaced && *seen == (generation | FERRY_ACK_PARTIAL))
        st = p->place->replace(p, c->device, word, seen, generation, replaced);
    return st;
}

/* One rank's acknowledgement, now or (stream != NULL or GPU) enqueued on stream: *wrote is
 * 1 if its word was written, 0 if only a part was recorded, -1 if it was acknowledged
 * already. */
static ferry_status ack_one(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                            uint32_t rank, int enqueue, void *stream, int *wrote)
{
    uint32_t ack;
    int complete = 1;
    *wrote = -1;
    ferry_status st = load_ack(c, p, d->slot, rank, &ack);
    if (st == FERRY_OK && ack == d->generation)
        view_end(p, d->slot, rank, d->generation); /* acknowledged already: the view ended */
    if (st != FERRY_OK || ack == d->generation)
        return st;
    if (d->part_count)
        st = part_ack(p, d, rank, &complete);
    if (st == FERRY_OK && complete == 0 && !enqueue)
        st = mark_partial(c, p, d, rank, ack);
    if (st != FERRY_OK || complete <= 0) {
        *wrote = complete;
        return st;
    }
    uint64_t word = ferry__shm_ack_word(&p->shm.layout, d->slot, rank);
    int replaced = 1;
    /* From the value read: a writer paused since its generation check must not replace the
     * acknowledgement of a newer lease of the slot (whose row would never complete). */
    st = enqueue ? p->ops->view_enqueue_store(p, c->device, word, d->generation, stream)
                 : replace_ack(c, p, word, &ack, d->generation, &replaced);
    if (st == FERRY_OK && !replaced)
        view_end(p, d->slot, rank, d->generation); /* acknowledged meanwhile, or moved on */
    if (st != FERRY_OK || !replaced)
        return st; /* *wrote stays -1 */
    p->place->note_ack(p, d->slot, rank, d->generation);
    view_end(p, d->slot, rank, d->generation);
    *wrote = 1;
    return FERRY_OK;
}

/* The producer is gone: nobody reads acknowledgements any more, but they still end this
 * process's views of the lease, so that the pool can be unmapped. */
static ferry_status ack_gone(ferry__mapped_pool *p, const ferry_descriptor *d, uint32_t first,
                             uint32_t count)
{
    for (uint32_t r = first; r < first + count; r++)
        view_end(p, d->slot, r, d->generation);
    return ferry__fail(FERRY_PRODUCER_GONE,
                       "producer of the pool (pid %d) is gone or closed the pool; the "
                       "acknowledgement of lease (slot=%u, generation=%u) only ended its views",
                       (int)p->producer_pid, d->slot, d->generation);
}

/* Acknowledges ranks [first, first + count). Fails STALE if the slot was reused, or
 * (strict) if any rank had already acknowledged. */
static ferry_status ack_ranks(ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d,
                              uint32_t first, uint32_t count, int strict, int enqueue, void *stream)
{
    ferry_status st = check_range(p, first, count);
    if (st != FERRY_OK)
        return st;
    if (ferry__load_acquire32(&p->gone))
        return ack_gone(p, d, first, count);
    if (ferry__shm_generation(&p->shm, d->slot) != d->generation) {
        for (uint32_t r = first; r < first + count; r++)
            view_end(p, d->slot, r, d->generation); /* the slot moved on: the views ended */
        return stale(p, d, first);
    }
    uint32_t written = 0, taken = 0;
    for (uint32_t r = first; r < first + count && st == FERRY_OK; r++) {
        int wrote;
        st = ack_one(c, p, d, r, enqueue, stream, &wrote);
        written += wrote == 1;
        taken += wrote >= 0;
    }
    if (written && !enqueue)
        ferry__shm_acked(&p->shm);
    if (st != FERRY_OK)
        return st;
    if ((strict && taken < count) || !taken)
        return stale(p, d, first);
    return FERRY_OK;
}

/* Acknowledgements open the pool without claiming any rank. */
static ferry_status ack_call(ferry_consumer *c, const ferry_descriptor *d, uint32_t first,
                             uint32_t count, int strict)
{
    ferry__mapped_pool *p;
    if (remote_of(c, d))
        return ferry__remote_ack(c->remote, d, first, count, strict);
    ferry_status st =
        pool_lookup(c, d, FERRY__RANK_NONE, ferry__deadline(FERRY_OPEN_TIMEOUT_NS), 0, &p);
    if (st != FERRY_OK)
        return st;
    return done(c, p, ack_ranks(c, p, d, first, count, strict, 0, NULL));
}

ferry_status ferry_consumer_ack(ferry_consumer *c, const ferry_descriptor *d)
{
    FERRY_CUDA_BOUNDARY;
    if (!c)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer is NULL");
    return ack_call(c, d, c->rank, 1, 1);
}

ferry_status ferry_consumer_ack_range(ferry_consumer *c, const ferry_descriptor *d, uint32_t first,
                                      uint32_t count)
{
    FERRY_CUDA_BOUNDARY;
    return ack_call(c, d, first, count, 0);
}

ferry_status ferry_consumer_ack_all(ferry_consumer *c, const ferry_descriptor *d)
{
    FERRY_CUDA_BOUNDARY;
    if (!d)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "descriptor is NULL");
    return ack_call(c, d, 0, d->consumer_count, 0);
}

/* ---- whole leases through any part ------------------------------------------------------- */

/* The lease a descriptor belongs to, whole: a packed lease's part stands for every part (its
 * part fields are checked first, as any acknowledgement checks them). The rank's word takes
 * the lease's generation at once, whatever parts this or another process acknowledged. */
static ferry_status ack_lease_call(ferry_consumer *c, const ferry_descriptor *d, int rank_only,
                                   uint32_t first, uint32_t count, int strict)
{
    if (!c || !d)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer or descriptor is NULL");
    if (d->part_count && d->part_index >= d->part_count)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "descriptor part %u of %u is out of range",
                           d->part_index, d->part_count);
    ferry_descriptor whole = *d;
    whole.part_index = 0;
    whole.part_count = 0;
    if (rank_only)
        first = c->rank;
    return ack_call(c, &whole, first, count, strict);
}

ferry_status ferry_consumer_ack_lease(ferry_consumer *c, const ferry_descriptor *d)
{
    FERRY_CUDA_BOUNDARY;
    return ack_lease_call(c, d, 1, 0, 1, 1);
}

ferry_status ferry_consumer_ack_lease_range(ferry_consumer *c, const ferry_descriptor *d,
                                            uint32_t first, uint32_t count)
{
    FERRY_CUDA_BOUNDARY;
    return ack_lease_call(c, d, 0, first, count, 0);
}

ferry_status ferry_consumer_ack_lease_all(ferry_consumer *c, const ferry_descriptor *d)
{
    FERRY_CUDA_BOUNDARY;
    return ack_lease_call(c, d, 0, 0, d ? d->consumer_count : 0, 0);
}

/* ---- stream-ordered (GPU pools) -------------------------------------------------------- */

/* The GPU pool of a descriptor, refusing a lease this rank can no longer read. */
static ferry_status gpu_pool_for(ferry_consumer *c, const ferry_descriptor *d, uint32_t claim,
                                 ferry__mapped_pool **out)
{
    ferry__mapped_pool *p;
    int state;
    ferry_status st = pool_lookup(c, d, claim, ferry__deadline(FERRY_OPEN_TIMEOUT_NS), 0, &p);
    if (st != FERRY_OK)
        return st;
    st = p->ops->view_streams(p);
    if (st == FERRY_OK)
        st = lease_state(c, p, d, 0, &state, NULL);
    if (st == FERRY_OK && state < 0)
        st = stale(p, d, c->rank);
    if (st == FERRY_OK && claim != FERRY__RANK_NONE)
        st = check_extent(p, d);
    if (st != FERRY_OK) {
        call_release(c, p);
        return st;
    }
    *out = p;
    return FERRY_OK;
}

/* Enqueues the stream's wait for the lease's ready word, unless the CPU sees it written
 * already (control words in host memory): the producer's stream fenced its copy before that
 * write, so the data is complete for every reader from then on. *queued: whether it did. */
static ferry_status enqueue_ready_wait(ferry_consumer *c, ferry__mapped_pool *p,
                                       const ferry_descriptor *d, void *stream, int *queued)
{
    *queued = 0;
    if (p->place->seen(p, ferry__shm_ready_word(&p->shm.layout, d->slot), d->generation))
        return FERRY_OK;
    ferry_status st = p->ops->view_enqueue_wait(
        p, c->device, ferry__shm_ready_word(&p->shm.layout, d->slot), d->generation, stream);
    *queued = st == FERRY_OK;
    return st;
}

/* Work queued on stream on the pool: releasing the pool's mapping waits for it, and so does
 * giving the consumer's rank back (ferry__cache_give_back) unless the process holds it for
 * its life (such work is tracked per stream only). */
static void track(ferry_consumer *c, ferry__mapped_pool *p, void *stream)
{
    int held = ferry__cache_held_for_life(p, c->rank);
    p->ops->view_track(p, c->device, held ? FERRY__TRACK_ANY : c->rank, stream);
}

ferry_status ferry_consumer_read_async(ferry_consumer *c, const ferry_descriptor *d, void *dst,
                                       size_t dst_size, void *stream)
{
    FERRY_CUDA_BOUNDARY;
    ferry__mapped_pool *p;
    if (remote_of(c, d)) /* gets are not stream-ordered: done before the call returns */
        return remote_read_now(c, d, dst, dst_size);
    ferry_status st = gpu_pool_for(c, d, c ? c->rank : 0, &p);
    if (st != FERRY_OK)
        return st;
    int queued = 0;
    st = check_dst(d, dst, dst_size);
    if (st == FERRY_OK)
        st = enqueue_ready_wait(c, p, d, stream, &queued);
    if (st == FERRY_OK)
        st = p->ops->view_enqueue_copy(p, c->device, d->offset, dst, d->length, stream);
    queued |= st == FERRY_OK;
    if (st == FERRY_OK)
        st = ack_ranks(c, p, d, c->rank, 1, 1, 1, stream);
    if (queued) /* also where a later step failed: what was queued reads the pool */
        track(c, p, stream);
    return done(c, p, st);
}

ferry_status ferry_consumer_view_async(ferry_consumer *c, const ferry_descriptor *d, void *stream,
                                       const void **data)
{
    FERRY_CUDA_BOUNDARY;
    ferry__mapped_pool *p;
    if (remote_of(c, d))
        return remote_unmapped("a view");
    ferry_status st = gpu_pool_for(c, d, c ? c->rank : 0, &p);
    if (st != FERRY_OK)
        return st;
    int queued = 0;
    if (!data)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "data output is NULL");
    if (st == FERRY_OK)
        st = enqueue_ready_wait(c, p, d, stream, &queued);
    if (queued)
        track(c, p, stream);
    if (st == FERRY_OK)
        st = view_out(c, p, d, data);
    return done(c, p, st);
}

ferry_status ferry_consumer_ack_async(ferry_consumer *c, const ferry_descriptor *d, void *stream)
{
    FERRY_CUDA_BOUNDARY;
    ferry__mapped_pool *p;
    if (remote_of(c, d)) /* its reads completed in their calls: nothing to order behind */
        return ferry__remote_ack(c->remote, d, c->rank, 1, 1);
    ferry_status st = gpu_pool_for(c, d, FERRY__RANK_NONE, &p);
    if (st != FERRY_OK)
        return st;
    st = ack_ranks(c, p, d, c->rank, 1, 1, 1, stream);
    if (st == FERRY_OK)
        track(c, p, stream);
    return done(c, p, st);
}
