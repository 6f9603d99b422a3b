/* Many threads on one host pool in one process, the way a server uses ferry.
 *
 * test_server_threads: publisher threads (publish, publish_many, reserve + write + commit,
 * reserve + cancel, publish + cancel), one consumer thread per rank fed through an in-process
 * queue (read or view, every byte checked, then acknowledge), a group leader that acknowledges
 * ranks on their behalf while they may be reading, and observers calling stats_get,
 * consumer_info, reclaim, copied, describe and pool_error, all at once. A read that overlaps an
 * acknowledgement on the reader's behalf may give STALE, never FERRY_OK with other bytes.
 *
 * test_close_races_every_call: threads call every producer entry point in a loop while two
 * threads close the pool at once; every call answers OK or CLOSING (CLOSING once the closes
 * returned) and nothing crashes. Each of the 20 rounds runs in a helper process, so that a
 * crash or a sanitizer report is one failed round, not a lost test binary.
 *
 * test_close_while_a_reservation_is_written: a thread still filling a reservation when the
 * pool is closed must not crash (close waits for it, or its slice stays mapped until destroy).
 *
 * Iteration counts scale with th_stress_scale() (FERRY_STRESS_SCALE; less under sanitizers). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "helpers.h"
#include "procs.h"

#define MS       1000000ull
#define KIB      1024u
#define MIB      (1024u * 1024u)
#define RANKS    4u
#define PACK_MAX 4u
#define ITEM_MAX (1u * MIB) /* largest tensor or pack */
#define BUF_SIZE (2u * MIB) /* buffers: ITEM_MAX plus a shape's rounding */

/* ---- small tools ---------------------------------------------------------------------- */

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* Waits ns: spinning when that is shorter than a sleep would be (2 cores: not for long). */
static void delay_ns(uint64_t ns)
{
    if (ns > 100000) {
        sleep_ns(ns);
        return;
    }
    uint64_t end = now_ns() + ns;
    while (now_ns() < end)
        sched_yield();
}

/* What went wrong in the threads, kept for the main thread to report (cmocka's asserts only
 * work there): the first FAIL_KEPT distinct messages, each with how often it came. */
#define FAIL_KEPT 8

typedef struct failures {
    pthread_mutex_t lock;
    unsigned count;
    unsigned kept;
    unsigned times[FAIL_KEPT];
    char text[FAIL_KEPT][384];
} failures;

static failures fails = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void failures_reset(void)
{
    pthread_mutex_lock(&fails.lock);
    fails.count = fails.kept = 0;
    pthread_mutex_unlock(&fails.lock);
}

/* Counts a failure times times under its message. */
static void record_failure(const char *msg, unsigned times)
{
    pthread_mutex_lock(&fails.lock);
    fails.count += times;
    unsigned i = 0;
    while (i < fails.kept && strcmp(fails.text[i], msg) != 0)
        i++;
    if (i < fails.kept) {
        fails.times[i] += times;
    } else if (fails.kept < FAIL_KEPT) {
        snprintf(fails.text[i], sizeof(fails.text[i]), "%s", msg);
        fails.times[fails.kept++] = times;
    }
    pthread_mutex_unlock(&fails.lock);
}

__attribute__((format(printf, 1, 2))) static void note_failure(const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    record_failure(msg, 1);
}

/* Prints every kept failure and fails the test if there was any. */
static void assert_no_failures(const char *what)
{
    pthread_mutex_lock(&fails.lock);
    unsigned n = fails.count;
    for (unsigned i = 0; i < fails.kept; i++)
        print_message("%s: failure (%u times): %s\n", what, fails.times[i], fails.text[i]);
    pthread_mutex_unlock(&fails.lock);
    if (n)
        fail_msg("%s: %u failures (first: %s)", what, n, fails.text[0]);
}

static const char *name(ferry_status st)
{
    return ferry_status_name(st);
}

/* ---- an in-process queue of hand-overs (mutex + condvar ring, grows) -------------------- */

/* One hand-over: the wire form of a lease's descriptors (one, or a publish_many pack) and,
 * when the group leader acknowledges for ranks [first, first + covered), which ones. */
typedef struct item {
    uint32_t count;
    uint32_t first;
    uint32_t covered;    /* 0: the leader leaves this item alone */
    uint64_t pos[RANKS]; /* its place in each rank's queue (the leader's copy) */
    uint64_t seed[PACK_MAX];
    uint8_t wire[PACK_MAX][FERRY_DESCRIPTOR_SIZE];
} item;

typedef struct queue {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    item *ring;
    size_t cap, head, count;
    uint64_t pushed, popped;
    int closed;
} queue;

static void queue_init(queue *q)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->cap = 64;
    q->ring = malloc(q->cap * sizeof(item));
    assert_non_null(q->ring);
}

static void queue_fini(queue *q)
{
    free(q->ring);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->lock);
}

/* Never blocks: a blocked push could deadlock with a consumer waiting for a commit. Returns
 * the item's place in the queue (0 for the first item ever pushed). */
static uint64_t queue_push(queue *q, const item *it)
{
    pthread_mutex_lock(&q->lock);
    if (q->count == q->cap) {
        item *bigger = malloc(2 * q->cap * sizeof(item));
        if (!bigger)
            abort();
        for (size_t i = 0; i < q->count; i++)
            bigger[i] = q->ring[(q->head + i) % q->cap];
        free(q->ring);
        q->ring = bigger;
        q->head = 0;
        q->cap *= 2;
    }
    q->ring[(q->head + q->count++) % q->cap] = *it;
    uint64_t pos = q->pushed++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->lock);
    return pos;
}

/* 1 with the next item (and its place in *pos); 0 once the queue is closed and empty. */
static int queue_pop(queue *q, item *out, uint64_t *pos)
{
    pthread_mutex_lock(&q->lock);
    while (!q->count && !q->closed)
        pthread_cond_wait(&q->cv, &q->lock);
    int got = q->count > 0;
    if (got) {
        *out = q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
        *pos = q->popped++;
    }
    pthread_mutex_unlock(&q->lock);
    return got;
}

static void queue_close(queue *q)
{
    pthread_mutex_lock(&q->lock);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lock);
}

/* The latest descriptor some thread handed out, for observers that take one (copied). */
typedef struct mailbox {
    pthread_mutex_t lock;
    ferry_descriptor desc;
    int full;
} mailbox;

static void mailbox_put(mailbox *m, const ferry_descriptor *d)
{
    pthread_mutex_lock(&m->lock);
    m->desc = *d;
    m->full = 1;
    pthread_mutex_unlock(&m->lock);
}

static int mailbox_get(mailbox *m, ferry_descriptor *d)
{
    pthread_mutex_lock(&m->lock);
    int full = m->full;
    if (full)
        *d = m->desc;
    pthread_mutex_unlock(&m->lock);
    return full;
}

/* ---- test_server_threads: shared state ------------------------------------------------- */

enum { PUBLISHERS = 3, ITEMS_PER_PUBLISHER = 2000 };

typedef struct server {
    ferry_pool *pool;
    uint64_t items_per_publisher;
    queue rank_q[RANKS];
    queue leader_q;
    mailbox recent;
    atomic_int stop_observers;
    atomic_int abort; /* the pool is stuck: publishers stop, consumers only acknowledge */
    /* what the publishers did */
    atomic_ullong leases, cancels, dispatched, packs, reserved, pool_full_retries;
    /* what the consumers saw */
    atomic_ullong reads, views, covered_reads, stale_reads, stale_views, stale_acks;
    atomic_ullong views_released, torn;
    atomic_ullong leader_acks, leader_stale;
    atomic_ullong processed[RANKS];
    atomic_ullong reading[RANKS]; /* seed of the tensor each rank is reading now, 0 if none */
    atomic_ullong started[RANKS]; /* queue place of the item each rank is at, plus one */
    atomic_ullong read_ns;        /* running mean of a large read's duration */
    atomic_ullong observed;       /* observer calls */
} server;

/* Whether rank reads (0) or views (1) tensor seed: a mix, different per rank. */
static int uses_view(uint64_t seed, uint32_t rank)
{
    uint64_t h = (seed + rank) * 0x9E3779B97F4A7C15ull;
    return (int)((h >> 61) & 1);
}

static int covers(const item *it, uint32_t rank)
{
    return it->covered && rank >= it->first && rank < it->first + it->covered;
}

/* ---- publishers ------------------------------------------------------------------------ */

typedef struct publisher {
    server *s;
    uint32_t id;
    uint64_t rng;
    uint8_t *buf[PACK_MAX];
    ferry_consumer *check; /* rank 0, to see cancelled leases refused */
    pthread_t thread;
} publisher;

/* Tensor sizes as servers see them: mostly small, some large; the leader's items large, so
 * that reads last long enough to overlap its acknowledgements. */
static size_t item_size(uint64_t *rng, int large)
{
    if (large)
        return 32 * KIB + (size_t)(rnd(rng) % (ITEM_MAX - 32 * KIB));
    unsigned r = (unsigned)(rnd(rng) % 100);
    if (r < 75)
        return 1 + (size_t)(rnd(rng) % (16 * KIB));
    if (r < 98)
        return 16 * KIB + (size_t)(rnd(rng) % (240 * KIB));
    return 256 * KIB + (size_t)(rnd(rng) % (ITEM_MAX - 256 * KIB));
}

/* A tensor of at most about approx bytes, of one of several dtypes and ranks. */
static ferry_tensor make_tensor(uint64_t *rng, size_t approx)
{
    ferry_tensor t = ferry_tensor_bytes(approx);
    uint64_t rows = 1 + rnd(rng) % 16;
    switch (rnd(rng) % 5) {
    case 0:
        return t;
    case 1: /* float32 [rows, cols] */
        t = (ferry_tensor){.dtype_code = FERRY_DTYPE_FLOAT, .dtype_bits = 32, .dtype_lanes = 1};
        t.ndim = 2;
        t.shape[0] = (int64_t)rows;
        t.shape[1] = (int64_t)(approx / 4 / rows);
        return t;
    case 2: /* bfloat16 [n] */
        t = (ferry_tensor){.dtype_code = FERRY_DTYPE_BFLOAT, .dtype_bits = 16, .dtype_lanes = 1};
        t.ndim = 1;
        t.shape[0] = (int64_t)(approx / 2);
        return t;
    case 3: /* float64 [2, rows, n] */
        t = (ferry_tensor){.dtype_code = FERRY_DTYPE_FLOAT, .dtype_bits = 64, .dtype_lanes = 1};
        t.ndim = 3;
        t.shape[0] = 2;
        t.shape[1] = (int64_t)rows;
        t.shape[2] = (int64_t)(approx / 16 / rows);
        return t;
    default: /* complex64 [n] */
        t = (ferry_tensor){.dtype_code = FERRY_DTYPE_COMPLEX, .dtype_bits = 64, .dtype_lanes = 1};
        t.ndim = 1;
        t.shape[0] = (int64_t)(approx / 8);
        return t;
    }
}

static uint64_t nbytes_of(const ferry_tensor *t)
{
    uint64_t n = 0;
    if (ferry_tensor_nbytes(t, &n) != FERRY_OK)
        abort();
    return n;
}

/* A pool full for this long is stuck (acknowledgements lost): the run stops there. */
#define STUCK_NS (20000 * MS)

/* Records why the pool is stuck (who holds what) and stops the publishers; the consumers
 * then acknowledge what is left without reading it. */
static void give_up(server *s, const char *what)
{
    char cause[256], who[160] = "";
    snprintf(cause, sizeof(cause), "%s", ferry_last_error());
    ferry_pool_stats st = {.struct_size = sizeof(st), .version = FERRY_POOL_STATS_VERSION};
    ferry_pool_stats_get(s->pool, &st);
    size_t used = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
        ferry_pool_consumer_info(s->pool, r, &info);
        used += (size_t)snprintf(who + used, sizeof(who) - used, " %llu",
                                 (unsigned long long)info.outstanding);
    }
    note_failure("%s: pool still full after %.0f s, giving up: %llu leases (%llu bytes) in "
                 "flight; outstanding by rank:%s; %.150s",
                 what, (double)STUCK_NS / 1e9, (unsigned long long)st.leases_in_flight,
                 (unsigned long long)st.bytes_in_use, who, cause);
    s->abort = 1;
}

/* Publishes (publish for one tensor, publish_many for a pack), retrying while the pool is
 * full, for up to STUCK_NS. */
static ferry_status publish_retry(publisher *p, const ferry_tensor *t, const void *const *srcs,
                                  uint32_t count, ferry_descriptor *d)
{
    uint64_t deadline = now_ns() + STUCK_NS;
    for (;;) {
        ferry_status st = count == 1
                              ? ferry_pool_publish(p->s->pool, t, srcs[0], 1000 * MS, d)
                              : ferry_pool_publish_many(p->s->pool, t, srcs, count, 1000 * MS, d);
        if (st != FERRY_POOL_FULL || p->s->abort)
            return st;
        if (now_ns() > deadline) {
            give_up(p->s, count == 1 ? "publish" : "publish_many");
            return st;
        }
        p->s->pool_full_retries++;
    }
}

static ferry_status reserve_retry(publisher *p, const ferry_tensor *t, void **data,
                                  ferry_descriptor *d)
{
    uint64_t deadline = now_ns() + STUCK_NS;
    for (;;) {
        ferry_status st = ferry_pool_reserve(p->s->pool, t, 1000 * MS, data, d);
        if (st != FERRY_POOL_FULL || p->s->abort)
            return st;
        if (now_ns() > deadline) {
            give_up(p->s, "reserve");
            return st;
        }
        p->s->pool_full_retries++;
    }
}

/* The group leader acknowledges one item in four: for all ranks, or for a range. */
static void plan_leader(item *it, uint64_t *rng)
{
    unsigned r = (unsigned)(rnd(rng) % 100);
    if (r < 12) {
        it->first = 0;
        it->covered = RANKS;
    } else if (r < 25) {
        it->first = (uint32_t)(rnd(rng) % RANKS);
        it->covered = 1 + (uint32_t)(rnd(rng) % (RANKS - it->first));
    }
}

static void dispatch(publisher *p, item *it, const ferry_descriptor *d)
{
    for (uint32_t k = 0; k < it->count; k++)
        if (ferry_descriptor_encode(&d[k], it->wire[k]) != FERRY_OK)
            note_failure("encode of a published descriptor: %s", ferry_last_error());
    for (uint32_t r = 0; r < RANKS; r++)
        it->pos[r] = queue_push(&p->s->rank_q[r], it);
    if (it->covered)
        queue_push(&p->s->leader_q, it);
    mailbox_put(&p->s->recent, &d[0]);
    p->s->dispatched++;
}

static void publish_one(publisher *p, item *it, uint64_t seed)
{
    size_t n = item_size(&p->rng, it->covered != 0);
    th_stamp(p->buf[0], n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    const void *src = p->buf[0];
    ferry_descriptor d;
    ferry_status st = publish_retry(p, &t, &src, 1, &d);
    if (st != FERRY_OK) {
        if (!p->s->abort) /* else give_up said why */
            note_failure("publish of %zu bytes: %s: %s", n, name(st), ferry_last_error());
        return;
    }
    p->s->leases++;
    it->count = 1;
    it->seed[0] = seed;
    dispatch(p, it, &d);
}

static void publish_pack(publisher *p, item *it, uint64_t seed)
{
    uint32_t count = 2 + (uint32_t)(rnd(&p->rng) % (PACK_MAX - 1));
    size_t total = item_size(&p->rng, it->covered != 0);
    ferry_tensor t[PACK_MAX];
    const void *srcs[PACK_MAX];
    ferry_descriptor d[PACK_MAX];
    for (uint32_t k = 0; k < count; k++) {
        t[k] = make_tensor(&p->rng, total / count);
        th_stamp(p->buf[k], nbytes_of(&t[k]), seed | k);
        srcs[k] = p->buf[k];
        it->seed[k] = seed | k;
    }
    ferry_status st = publish_retry(p, t, srcs, count, d);
    if (st != FERRY_OK) {
        if (!p->s->abort) /* else give_up said why */
            note_failure("publish_many of %u tensors: %s: %s", count, name(st), ferry_last_error());
        return;
    }
    p->s->leases++;
    p->s->packs++;
    it->count = count;
    dispatch(p, it, d);
}

/* Reserve, write in place, commit; half of them dispatched before the write (consumers
 * wait for the commit). */
static void reserve_commit(publisher *p, item *it, uint64_t seed)
{
    ferry_tensor t = make_tensor(&p->rng, item_size(&p->rng, it->covered != 0));
    int early = (int)(rnd(&p->rng) & 1);
    void *data;
    ferry_descriptor d;
    ferry_status st = reserve_retry(p, &t, &data, &d);
    if (st != FERRY_OK) {
        if (!p->s->abort) /* else give_up said why */
            note_failure("reserve of %llu bytes: %s: %s", (unsigned long long)nbytes_of(&t),
                         name(st), ferry_last_error());
        return;
    }
    p->s->leases++;
    p->s->reserved++;
    it->count = 1;
    it->seed[0] = seed;
    if (early)
        dispatch(p, it, &d);
    th_stamp(data, d.length, seed);
    st = ferry_pool_commit(p->s->pool, &d);
    if (st != FERRY_OK)
        note_failure("commit of a reserved lease (slot=%u, generation=%u): %s: %s", d.slot,
                     d.generation, name(st), ferry_last_error());
    if (!early)
        dispatch(p, it, &d);
    /* A second commit is refused, whether the lease is still current or already recycled. */
    st = ferry_pool_commit(p->s->pool, &d);
    if (st != FERRY_INACTIVE_LEASE)
        note_failure("second commit (slot=%u, generation=%u) gave %s, not INACTIVE_LEASE: %s",
                     d.slot, d.generation, name(st), ferry_last_error());
}

/* A lease cancelled before anyone saw it: refused by consumers, and by a second cancel and
 * a commit. */
static void check_cancelled(publisher *p, const ferry_descriptor *d)
{
    uint8_t small[64];
    ferry_status st = ferry_consumer_wait(p->check, d, 0);
    if (st != FERRY_STALE)
        note_failure("wait on a cancelled lease (slot=%u, generation=%u) gave %s: %s", d->slot,
                     d->generation, name(st), ferry_last_error());
    if (d->length <= sizeof(small) &&
        (st = ferry_consumer_read(p->check, d, small, sizeof(small), 0)) != FERRY_STALE)
        note_failure("read of a cancelled lease gave %s: %s", name(st), ferry_last_error());
    if ((st = ferry_pool_cancel(p->s->pool, d)) != FERRY_INACTIVE_LEASE)
        note_failure("second cancel (slot=%u, generation=%u) gave %s: %s", d->slot, d->generation,
                     name(st), ferry_last_error());
    if ((st = ferry_pool_commit(p->s->pool, d)) != FERRY_INACTIVE_LEASE)
        note_failure("commit after cancel (slot=%u, generation=%u) gave %s: %s", d->slot,
                     d->generation, name(st), ferry_last_error());
}

static void reserve_cancel(publisher *p, uint64_t seed)
{
    ferry_tensor t = make_tensor(&p->rng, item_size(&p->rng, 0));
    void *data;
    ferry_descriptor d;
    ferry_status st = reserve_retry(p, &t, &data, &d);
    if (st != FERRY_OK) {
        if (!p->s->abort) /* else give_up said why */
            note_failure("reserve to cancel: %s: %s", name(st), ferry_last_error());
        return;
    }
    p->s->leases++;
    p->s->reserved++;
    th_stamp(data, d.length / 2, seed); /* half written, then given up */
    if ((st = ferry_pool_cancel(p->s->pool, &d)) != FERRY_OK) {
        note_failure("cancel of a reserved lease: %s: %s", name(st), ferry_last_error());
        return;
    }
    p->s->cancels++;
    check_cancelled(p, &d);
}

static void publish_cancel(publisher *p, uint64_t seed)
{
    size_t n = item_size(&p->rng, 0);
    th_stamp(p->buf[0], n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    const void *src = p->buf[0];
    ferry_descriptor d;
    ferry_status st = publish_retry(p, &t, &src, 1, &d);
    if (st != FERRY_OK) {
        if (!p->s->abort) /* else give_up said why */
            note_failure("publish to cancel: %s: %s", name(st), ferry_last_error());
        return;
    }
    p->s->leases++;
    if ((st = ferry_pool_cancel(p->s->pool, &d)) != FERRY_OK) {
        note_failure("cancel of a published lease: %s: %s", name(st), ferry_last_error());
        return;
    }
    p->s->cancels++;
    check_cancelled(p, &d);
}

static void *publisher_main(void *arg)
{
    publisher *p = arg;
    for (uint64_t i = 0; i < p->s->items_per_publisher && !p->s->abort; i++) {
        /* Unique per tensor: publisher, item, tensor of the pack in the low 2 bits. */
        uint64_t seed = ((uint64_t)(p->id + 1) << 40) | (i << 2);
        item it = {0};
        plan_leader(&it, &p->rng);
        unsigned op = (unsigned)(rnd(&p->rng) % 100);
        if (op < 45)
            publish_one(p, &it, seed);
        else if (op < 60)
            publish_pack(p, &it, seed);
        else if (op < 80)
            reserve_commit(p, &it, seed);
        else if (op < 90)
            reserve_cancel(p, seed);
        else
            publish_cancel(p, seed);
    }
    return NULL;
}

/* ---- consumers (one thread per rank) and the group leader ------------------------------- */

typedef struct rank_ctx {
    server *s;
    uint32_t rank;
    pthread_t thread;
} rank_ctx;

/* Where bytes that fail th_check_stamp first differ from the pattern (a diagnosis). */
static size_t first_wrong_byte(const uint8_t *got, size_t n, uint64_t seed)
{
    uint8_t *want = malloc(n ? n : 1);
    size_t i = 0;
    if (!want)
        return SIZE_MAX;
    th_stamp(want, n, seed);
    while (i < n && got[i] == want[i])
        i++;
    free(want);
    return i;
}

static void check_read(server *s, ferry_consumer *c, uint32_t rank, const ferry_descriptor *d,
                       uint64_t seed, int covered, uint8_t *buf)
{
    s->reading[rank] = seed;
    uint64_t t0 = now_ns();
    ferry_status st = ferry_consumer_read(c, d, buf, BUF_SIZE, 10000 * MS);
    s->reading[rank] = 0;
    if (st == FERRY_OK && d->length >= 64 * KIB)
        s->read_ns = (7 * s->read_ns + (now_ns() - t0)) / 8;
    uint64_t found;
    if (st == FERRY_STALE && covered) {
        s->stale_reads++;
        return;
    }
    if (st != FERRY_OK) {
        note_failure("rank %u: read of item %#llx (slot=%u, generation=%u)%s gave %s: %s", rank,
                     (unsigned long long)seed, d->slot, d->generation,
                     covered ? " (acknowledged for it by the leader)" : "", name(st),
                     ferry_last_error());
        return;
    }
    s->reads++;
    s->covered_reads += covered;
    if (th_check_stamp(buf, d->length, seed, &found))
        return;
    if (covered)
        s->torn++;
    note_failure("rank %u: read of item %#llx (slot=%u, generation=%u, offset %llu, %llu bytes) "
                 "returned FERRY_OK with wrong bytes (first 8 hold %#llx, first wrong byte at "
                 "%zu)%s",
                 rank, (unsigned long long)seed, d->slot, d->generation,
                 (unsigned long long)d->offset, (unsigned long long)d->length,
                 (unsigned long long)found, first_wrong_byte(buf, d->length, seed),
                 covered ? " while the leader acknowledged it for this rank" : "");
}

/* A view is valid until the lease is acknowledged for this rank: bytes that changed under it
 * are allowed only if the lease was acknowledged for it meanwhile (by the leader). */
static void check_view(server *s, ferry_consumer *c, uint32_t rank, const ferry_descriptor *d,
                       uint64_t seed, int covered)
{
    const void *data = NULL;
    uint64_t found;
    s->reading[rank] = seed; /* until the bytes are checked */
    ferry_status st = ferry_consumer_view(c, d, &data, 10000 * MS);
    int good = st == FERRY_OK && th_check_stamp(data, d->length, seed, &found);
    s->reading[rank] = 0;
    if (st == FERRY_STALE && covered) {
        s->stale_views++;
        return;
    }
    if (st != FERRY_OK) {
        note_failure("rank %u: view of item %#llx%s gave %s: %s", rank, (unsigned long long)seed,
                     covered ? " (acknowledged for it by the leader)" : "", name(st),
                     ferry_last_error());
        return;
    }
    s->views++;
    if (good)
        return;
    if (covered && ferry_consumer_wait(c, d, 0) == FERRY_STALE) {
        s->views_released++;
        return;
    }
    note_failure("rank %u: view of item %#llx (slot=%u, generation=%u, %llu bytes) shows wrong "
                 "bytes (first 8 hold %#llx) while the lease is still this rank's",
                 rank, (unsigned long long)seed, d->slot, d->generation,
                 (unsigned long long)d->length, (unsigned long long)found);
}

static void consume_item(server *s, ferry_consumer *c, uint32_t rank, const item *it, uint8_t *buf)
{
    int covered = covers(it, rank);
    ferry_descriptor d[PACK_MAX];
    for (uint32_t k = 0; k < it->count; k++) {
        ferry_status st = ferry_descriptor_decode(it->wire[k], FERRY_DESCRIPTOR_SIZE, &d[k]);
        if (st != FERRY_OK) {
            note_failure("rank %u: decode: %s", rank, ferry_last_error());
            return;
        }
        if (s->abort)
            continue; /* the run is over: only acknowledge */
        if (uses_view(it->seed[k], rank))
            check_view(s, c, rank, &d[k], it->seed[k], covered);
        else
            check_read(s, c, rank, &d[k], it->seed[k], covered, buf);
    }
    /* Every part of a pack is acknowledged (the lease is the rank's until its last part is). */
    for (uint32_t k = 0; k < it->count; k++) {
        ferry_status st = ferry_consumer_ack(c, &d[k]);
        if (st == FERRY_STALE && (covered || s->abort))
            s->stale_acks++;
        else if (st != FERRY_OK)
            note_failure("rank %u: ack of item %#llx (part %u of %u)%s gave %s: %s", rank,
                         (unsigned long long)it->seed[k], k, it->count,
                         covered ? " (leader's too)" : "", name(st), ferry_last_error());
    }
}

static void *rank_main(void *arg)
{
    rank_ctx *rc = arg;
    ferry_consumer *c = NULL;
    if (ferry_consumer_create(rc->rank, &c) != FERRY_OK) {
        note_failure("rank %u: consumer_create: %s", rc->rank, ferry_last_error());
        return NULL;
    }
    uint8_t *buf = malloc(BUF_SIZE);
    item it;
    uint64_t pos;
    while (queue_pop(&rc->s->rank_q[rc->rank], &it, &pos)) {
        rc->s->started[rc->rank] = pos + 1;
        consume_item(rc->s, c, rc->rank, &it, buf);
        rc->s->processed[rc->rank]++;
    }
    free(buf);
    ferry_consumer_destroy(c);
    return NULL;
}

/* Waits (up to timeout_ns) until a rank the item covers is reading its first tensor, or every
 * one of them has gone past it. */
static void wait_for_reader(server *s, const item *it, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    while (now_ns() < end) {
        int ahead = 1;
        for (uint32_t r = it->first; r < it->first + it->covered; r++) {
            if (s->reading[r] == it->seed[0])
                return;
            ahead &= s->started[r] > it->pos[r] + 1;
        }
        if (ahead)
            return;
        sleep_ns(10000);
    }
}

/* Acknowledges part k of an item for the ranks it covers. */
static void leader_ack(server *s, ferry_consumer *c, const item *it, uint32_t k)
{
    ferry_descriptor d;
    if (ferry_descriptor_decode(it->wire[k], FERRY_DESCRIPTOR_SIZE, &d) != FERRY_OK) {
        note_failure("leader: decode: %s", ferry_last_error());
        return;
    }
    ferry_status st = it->covered == RANKS
                          ? ferry_consumer_ack_all(c, &d)
                          : ferry_consumer_ack_range(c, &d, it->first, it->covered);
    if (st == FERRY_OK)
        s->leader_acks++;
    else if (st == FERRY_STALE) /* every rank of the range had acknowledged already */
        s->leader_stale++;
    else
        note_failure("leader: ack of ranks [%u, %u) for item %#llx (part %u of %u) gave %s: %s",
                     it->first, it->first + it->covered, (unsigned long long)it->seed[k], k,
                     it->count, name(st), ferry_last_error());
}

/* Acknowledges items (every part) for a range of ranks or for all: while those ranks are
 * reading, or before, or after. */
static void *leader_main(void *arg)
{
    server *s = arg;
    ferry_consumer *c = NULL;
    if (ferry_consumer_create(0, &c) != FERRY_OK) {
        note_failure("leader: consumer_create: %s", ferry_last_error());
        return NULL;
    }
    uint64_t rng = 0x1eade7ull;
    item it;
    uint64_t pos;
    while (queue_pop(&s->leader_q, &it, &pos)) {
        /* Half of the time right after a covered rank began reading it, else at any time. */
        uint64_t read_ns = s->read_ns + 1000;
        if (rnd(&rng) & 1) {
            wait_for_reader(s, &it, 50 * MS);
            delay_ns(rnd(&rng) % read_ns);
        } else {
            delay_ns(rnd(&rng) % (4 * read_ns));
        }
        for (uint32_t k = 0; k < it.count; k++)
            leader_ack(s, c, &it, k);
    }
    ferry_consumer_destroy(c);
    return NULL;
}

/* ---- observers --------------------------------------------------------------------------- */

static void check_stats(const ferry_pool_stats *st)
{
    /* One snapshot under the pool's lock: its numbers agree with each other. */
    if (st->bytes_in_use > st->usable_bytes ||
        st->largest_free > st->usable_bytes - st->bytes_in_use)
        note_failure("stats: bytes_in_use %llu + largest_free %llu exceed usable %llu",
                     (unsigned long long)st->bytes_in_use, (unsigned long long)st->largest_free,
                     (unsigned long long)st->usable_bytes);
    if (st->leases_in_flight > 256 || st->high_water_leases < st->leases_in_flight ||
        st->high_water_bytes < st->bytes_in_use)
        note_failure(
            "stats: leases %llu (high water %llu), bytes %llu (high water %llu)",
            (unsigned long long)st->leases_in_flight, (unsigned long long)st->high_water_leases,
            (unsigned long long)st->bytes_in_use, (unsigned long long)st->high_water_bytes);
    if (st->publishes != st->leases_in_flight + st->reclaimed + st->cancelled)
        note_failure("stats: publishes %llu != in flight %llu + reclaimed %llu + cancelled %llu",
                     (unsigned long long)st->publishes, (unsigned long long)st->leases_in_flight,
                     (unsigned long long)st->reclaimed, (unsigned long long)st->cancelled);
    if (st->consumers_attached > RANKS || st->consumers_alive != st->consumers_attached)
        note_failure("stats: %llu ranks attached, %llu alive (all live in this process)",
                     (unsigned long long)st->consumers_attached,
                     (unsigned long long)st->consumers_alive);
}

static void *stats_main(void *arg)
{
    server *s = arg;
    while (!s->stop_observers) {
        ferry_pool_stats st = {.struct_size = sizeof(st), .version = FERRY_POOL_STATS_VERSION};
        ferry_status rc = ferry_pool_stats_get(s->pool, &st);
        if (rc != FERRY_OK)
            note_failure("stats_get: %s: %s", name(rc), ferry_last_error());
        else
            check_stats(&st);
        s->observed++;
        usleep(20);
    }
    return NULL;
}

static void *info_main(void *arg)
{
    server *s = arg;
    for (uint32_t r = 0; !s->stop_observers; r = (r + 1) % RANKS) {
        ferry_consumer_info info;
        memset(&info, 0x5a, sizeof(info)); /* what the call leaves unwritten shows */
        info.struct_size = sizeof(info);
        info.version = FERRY_CONSUMER_INFO_VERSION;
        ferry_status rc = ferry_pool_consumer_info(s->pool, r, &info);
        if (rc != FERRY_OK)
            note_failure("consumer_info(%u): %s: %s", r, name(rc), ferry_last_error());
        else if (info.outstanding > 256 || (info.attached && !info.alive) ||
                 (info.attached && info.pid != getpid()) || (!info.attached && info.pid != 0))
            note_failure("consumer_info(%u): attached %d alive %d pid %lld outstanding %llu", r,
                         info.attached, info.alive, (long long)info.pid,
                         (unsigned long long)info.outstanding);
        s->observed++;
        usleep(20);
    }
    return NULL;
}

/* reclaim, copied, describe and pool_error. */
static void *reclaim_main(void *arg)
{
    server *s = arg;
    while (!s->stop_observers) {
        uint64_t n;
        ferry_descriptor d;
        int done = 7;
        char cause[128];
        ferry_status rc = ferry_pool_reclaim(s->pool, &n);
        if (rc != FERRY_OK)
            note_failure("reclaim: %s: %s", name(rc), ferry_last_error());
        if (mailbox_get(&s->recent, &d) && (rc = ferry_pool_copied(s->pool, &d, &done)) != FERRY_OK)
            note_failure("copied: %s: %s", name(rc), ferry_last_error());
        else if (done != 7 && done != 0 && done != 1)
            note_failure("copied gave done=%d", done);
        if ((rc = ferry_pool_describe(s->pool, &d)) != FERRY_OK ||
            !(d.flags & FERRY_DESC_FLAG_POOL_ONLY))
            note_failure("describe: %s: %s", name(rc), ferry_last_error());
        if ((rc = ferry_pool_error(s->pool, cause, sizeof(cause))) != FERRY_OK)
            note_failure("pool_error: %s: %s", name(rc), cause);
        s->observed++;
        usleep(50);
    }
    return NULL;
}

/* ---- test_server_threads ---------------------------------------------------------------- */

static ferry_pool *make_pool(int64_t size, int64_t consumers, int64_t inflight, int64_t interval)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = size;
    c.consumer_count = consumers;
    c.max_inflight_slices = inflight;
    c.reclaim_interval_us = interval;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool_create: %s", ferry_last_error());
    return pool;
}

/* Reclaims until nothing is in flight (at most 5 s); names who holds what if that fails. */
static void drain_or_explain(ferry_pool *pool)
{
    ferry_pool_stats st = th_stats(pool);
    for (int i = 0; i < 5000 && st.leases_in_flight; i++) {
        ferry_pool_reclaim(pool, NULL);
        usleep(1000);
        st = th_stats(pool);
    }
    if (!st.leases_in_flight)
        return;
    char who[256] = "";
    size_t used = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
        ferry_pool_consumer_info(pool, r, &info);
        used += (size_t)snprintf(who + used, sizeof(who) - used, " rank %u: %llu outstanding;", r,
                                 (unsigned long long)info.outstanding);
    }
    note_failure("after draining 5 s: %llu leases (%llu bytes) still in flight;%s",
                 (unsigned long long)st.leases_in_flight, (unsigned long long)st.bytes_in_use, who);
}

static void start_observers(server *s, pthread_t *obs)
{
    pthread_create(&obs[0], NULL, stats_main, s);
    pthread_create(&obs[1], NULL, info_main, s);
    pthread_create(&obs[2], NULL, reclaim_main, s);
}

static void check_final_stats(server *s)
{
    ferry_pool_stats st = th_stats(s->pool);
    unsigned long long leases = s->leases, cancels = s->cancels;
    if (st.leases_in_flight || st.bytes_in_use || st.largest_free != st.usable_bytes)
        note_failure("at the end: %llu leases, %llu bytes in use, largest free %llu of %llu",
                     (unsigned long long)st.leases_in_flight, (unsigned long long)st.bytes_in_use,
                     (unsigned long long)st.largest_free, (unsigned long long)st.usable_bytes);
    if (st.publishes != leases || st.cancelled != cancels || st.reclaimed != leases - cancels)
        note_failure("at the end: stats say %llu leases, %llu cancelled, %llu reclaimed; the "
                     "publishers made %llu leases and cancelled %llu",
                     (unsigned long long)st.publishes, (unsigned long long)st.cancelled,
                     (unsigned long long)st.reclaimed, leases, cancels);
    if (st.consumers_attached != RANKS)
        note_failure("at the end: %llu ranks attached, not %u",
                     (unsigned long long)st.consumers_attached, RANKS);
    for (uint32_t r = 0; r < RANKS; r++)
        if (s->processed[r] != s->dispatched)
            note_failure("rank %u processed %llu of %llu items", r,
                         (unsigned long long)s->processed[r], (unsigned long long)s->dispatched);
}

static void test_server_threads(void **state)
{
    (void)state;
    failures_reset();
    static server s;
    memset(&s, 0, sizeof(s));
    s.pool = make_pool(8 * MIB, RANKS, 256, 1000);
    s.items_per_publisher = th_scaled(ITEMS_PER_PUBLISHER, 100);
    pthread_mutex_init(&s.recent.lock, NULL);
    for (uint32_t r = 0; r < RANKS; r++)
        queue_init(&s.rank_q[r]);
    queue_init(&s.leader_q);
    uint64_t t0 = now_ns();

    rank_ctx ranks[RANKS];
    pthread_t leader, obs[3];
    for (uint32_t r = 0; r < RANKS; r++) {
        ranks[r] = (rank_ctx){.s = &s, .rank = r};
        pthread_create(&ranks[r].thread, NULL, rank_main, &ranks[r]);
    }
    pthread_create(&leader, NULL, leader_main, &s);
    start_observers(&s, obs);
    publisher pubs[PUBLISHERS];
    for (uint32_t i = 0; i < PUBLISHERS; i++) {
        pubs[i] = (publisher){.s = &s, .id = i, .rng = 0x9e3779b9ull * (i + 1)};
        for (uint32_t k = 0; k < PACK_MAX; k++)
            assert_non_null(pubs[i].buf[k] = malloc(BUF_SIZE));
        assert_int_equal(ferry_consumer_create(0, &pubs[i].check), FERRY_OK);
        pthread_create(&pubs[i].thread, NULL, publisher_main, &pubs[i]);
    }

    for (uint32_t i = 0; i < PUBLISHERS; i++)
        pthread_join(pubs[i].thread, NULL);
    uint64_t t_pub = now_ns();
    for (uint32_t r = 0; r < RANKS; r++)
        queue_close(&s.rank_q[r]);
    queue_close(&s.leader_q);
    for (uint32_t r = 0; r < RANKS; r++)
        pthread_join(ranks[r].thread, NULL);
    uint64_t t_ranks = now_ns();
    pthread_join(leader, NULL);
    uint64_t t_leader = now_ns();
    /* Observers keep hammering while the pool drains. */
    drain_or_explain(s.pool);
    s.stop_observers = 1;
    for (int i = 0; i < 3; i++)
        pthread_join(obs[i], NULL);
    check_final_stats(&s);

    print_message("threads: %llu items (%llu packs, %llu reserved) + %llu cancelled, %.2f s "
                  "(publishers %.2f, ranks +%.2f, leader +%.2f), %llu pool-full retries, %llu "
                  "observer calls\n",
                  (unsigned long long)s.dispatched, (unsigned long long)s.packs,
                  (unsigned long long)s.reserved, (unsigned long long)s.cancels,
                  (double)(now_ns() - t0) / 1e9, (double)(t_pub - t0) / 1e9,
                  (double)(t_ranks - t_pub) / 1e9, (double)(t_leader - t_ranks) / 1e9,
                  (unsigned long long)s.pool_full_retries, (unsigned long long)s.observed);
    print_message("threads: reads %llu (%llu while covered by the leader), views %llu; STALE: "
                  "reads %llu, views %llu, acks %llu; views released under the reader %llu; "
                  "leader acks %llu ok, %llu stale; torn reads (OK with wrong bytes) %llu\n",
                  (unsigned long long)s.reads, (unsigned long long)s.covered_reads,
                  (unsigned long long)s.views, (unsigned long long)s.stale_reads,
                  (unsigned long long)s.stale_views, (unsigned long long)s.stale_acks,
                  (unsigned long long)s.views_released, (unsigned long long)s.leader_acks,
                  (unsigned long long)s.leader_stale, (unsigned long long)s.torn);
    for (uint32_t i = 0; i < PUBLISHERS; i++) {
        ferry_consumer_destroy(pubs[i].check);
        for (uint32_t k = 0; k < PACK_MAX; k++)
            free(pubs[i].buf[k]);
    }
    for (uint32_t r = 0; r < RANKS; r++)
        queue_fini(&s.rank_q[r]);
    queue_fini(&s.leader_q);
    pthread_mutex_destroy(&s.recent.lock);
    ferry_pool_destroy(s.pool);
    assert_no_failures("threads");
}

/* ---- test_close_races_every_call (one round per helper process) ------------------------ */

enum {
    CR_PUBLISH,
    CR_PUBLISH_MANY,
    CR_RESERVE,
    CR_COPIED,
    CR_STATS,
    CR_INFO,
    CR_RECLAIM,
    CR_DESCRIBE,
    CR_ERROR,
    CR_WAITER,
    CR_KINDS
};

static const char *const cr_names[CR_KINDS] = {
    "publish",
    "publish_many",
    "reserve/commit/cancel",
    "copied",
    "stats_get",
    "consumer_info",
    "reclaim",
    "describe",
    "pool_error",
    "publish waiting for space",
};

enum { CR_RUNNING = 0, CR_CLOSED = 1 };
#define CR_AFTER_CALLS 20 /* calls each thread makes once both closes returned */
#define CR_ROUNDS      20

typedef struct race {
    ferry_pool *pool;
    atomic_int phase;
    atomic_int started;
    atomic_ullong closing_seen;
    atomic_ullong ok_calls, closing_during, closing_after; /* what the calls answered */
    mailbox recent;
    atomic_ullong close_started_ns;
} race;

typedef struct race_worker {
    race *r;
    int kind;
    pthread_t thread;
} race_worker;

/* OK or CLOSING while the pool closes; only CLOSING once both closes returned. */
static int race_check(race *r, int after, int kind, const char *call, ferry_status st)
{
    if (st == FERRY_CLOSING) {
        r->closing_seen++;
        if (after)
            r->closing_after++;
        else
            r->closing_during++;
        return 0;
    }
    if (st == FERRY_OK && !after) {
        r->ok_calls++;
        return 1;
    }
    note_failure("%s thread: %s gave %s %s%s%s", cr_names[kind], call, name(st),
                 after ? "after both closes returned" : "while the pool closed",
                 st == FERRY_OK ? "" : ": ", st == FERRY_OK ? "" : ferry_last_error());
    return 0;
}

static void race_publish(race *r, int after, int kind, uint64_t *rng)
{
    uint8_t src[2][4096];
    size_t n = 1 + (size_t)(rnd(rng) % sizeof(src[0]));
    ferry_tensor t[2] = {ferry_tensor_bytes(n), ferry_tensor_bytes(sizeof(src[1]) - n)};
    const void *srcs[2] = {src[0], src[1]};
    ferry_descriptor d[2];
    th_stamp(src[0], n, n);
    th_stamp(src[1], sizeof(src[1]) - n, n);
    int many = kind == CR_PUBLISH_MANY;
    ferry_status st = many ? ferry_pool_publish_many(r->pool, t, srcs, 2, 50 * MS, d)
                           : ferry_pool_publish(r->pool, t, src[0], 50 * MS, d);
    if (!race_check(r, after, kind, many ? "publish_many" : "publish", st))
        return;
    mailbox_put(&r->recent, &d[0]);
    /* A pack is cancelled through any of its descriptors. */
    race_check(r, after, kind, "cancel", ferry_pool_cancel(r->pool, &d[many ? 1 : 0]));
}

static void race_reserve(race *r, int after, uint64_t *rng)
{
    ferry_tensor t = ferry_tensor_bytes(1 + rnd(rng) % 4096);
    void *data;
    ferry_descriptor d;
    if (!race_check(r, after, CR_RESERVE, "reserve",
                    ferry_pool_reserve(r->pool, &t, 50 * MS, &data, &d)))
        return;
    mailbox_put(&r->recent, &d);
    /* Not written: a writer racing close is test_close_while_a_reservation_is_written's. */
    race_check(r, after, CR_RESERVE, "commit", ferry_pool_commit(r->pool, &d));
    race_check(r, after, CR_RESERVE, "cancel", ferry_pool_cancel(r->pool, &d));
}

/* copied is documented to give done = 1 once the pool is closed, so OK stays an answer. */
static void race_copied(race *r, int after)
{
    ferry_descriptor d;
    int done = 7;
    if (!mailbox_get(&r->recent, &d))
        return;
    ferry_status st = ferry_pool_copied(r->pool, &d, &done);
    if (st == FERRY_CLOSING)
        r->closing_seen++;
    else if (st != FERRY_OK || done < 0 || done > 1 || (after && done != 1))
        note_failure("copied thread: copied gave %s, done=%d %s: %s", name(st), done,
                     after ? "after both closes returned" : "while the pool closed",
                     ferry_last_error());
}

static void race_observe(race *r, int after, int kind, uint64_t *rng)
{
    ferry_pool_stats st = {.struct_size = sizeof(st), .version = FERRY_POOL_STATS_VERSION};
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    ferry_descriptor d;
    uint64_t n;
    char cause[64];
    switch (kind) {
    case CR_STATS:
        race_check(r, after, kind, "stats_get", ferry_pool_stats_get(r->pool, &st));
        break;
    case CR_INFO:
        race_check(r, after, kind, "consumer_info",
                   ferry_pool_consumer_info(r->pool, (uint32_t)(rnd(rng) & 1), &info));
        break;
    case CR_RECLAIM:
        race_check(r, after, kind, "reclaim", ferry_pool_reclaim(r->pool, &n));
        break;
    case CR_DESCRIBE:
        race_check(r, after, kind, "describe", ferry_pool_describe(r->pool, &d));
        break;
    default:
        race_check(r, after, kind, "pool_error", ferry_pool_error(r->pool, cause, sizeof(cause)));
        break;
    }
}

/* Holds most of the pool, then publishes what cannot fit with a long timeout: close must
 * wake it with CLOSING, promptly. */
static void race_waiter(race *r, int after)
{
    static const size_t big = 600 * KIB;
    static uint8_t src[512 * KIB];
    ferry_tensor hold = ferry_tensor_bytes(big), t = ferry_tensor_bytes(sizeof(src));
    void *data;
    ferry_descriptor held, d;
    if (!race_check(r, after, CR_WAITER, "reserve of 600 KiB",
                    ferry_pool_reserve(r->pool, &hold, 0, &data, &held)))
        return;
    ferry_status st = ferry_pool_publish(r->pool, &t, src, 30000 * MS, &d);
    uint64_t at = now_ns(), closed_at = r->close_started_ns;
    if (st != FERRY_CLOSING)
        note_failure("waiting publisher: publish gave %s, not CLOSING: %s", name(st),
                     ferry_last_error());
    else if (closed_at && at > closed_at + 5000 * MS)
        note_failure("waiting publisher: CLOSING came %.1f ms after close began",
                     (double)(at - closed_at) / 1e6);
    r->closing_seen++;
    race_check(r, r->phase == CR_CLOSED, CR_WAITER, "cancel of the held lease",
               ferry_pool_cancel(r->pool, &held));
}

static void *race_worker_main(void *arg)
{
    race_worker *w = arg;
    race *r = w->r;
    uint64_t rng = 0xc105e000ull + (uint64_t)w->kind;
    int after_calls = 0, first = 1;
    while (after_calls < CR_AFTER_CALLS) {
        int after = r->phase == CR_CLOSED;
        switch (w->kind) {
        case CR_PUBLISH:
        case CR_PUBLISH_MANY:
            race_publish(r, after, w->kind, &rng);
            break;
        case CR_RESERVE:
            race_reserve(r, after, &rng);
            break;
        case CR_COPIED:
            race_copied(r, after);
            break;
        case CR_WAITER:
            if (first) {
                r->started++; /* it blocks in there until the close */
                first = 0;
            }
            race_waiter(r, after);
            break;
        default:
            race_observe(r, after, w->kind, &rng);
            break;
        }
        if (first && w->kind != CR_WAITER) {
            r->started++;
            first = 0;
        }
        after_calls += after;
    }
    return NULL;
}

typedef struct closer {
    ferry_pool *pool;
    pthread_barrier_t *go;
} closer;

static void *closer_main(void *arg)
{
    closer *c = arg;
    pthread_barrier_wait(c->go);
    ferry_pool_close(c->pool);
    return NULL;
}

/* One round: workers on every entry point, then two closes at once. */
static void close_round(race *r, int round)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->recent.lock, NULL);
    r->pool = make_pool(1 * MIB, 2, 64, 200);
    race_worker w[CR_KINDS];
    for (int k = 0; k < CR_KINDS; k++) {
        w[k] = (race_worker){.r = r, .kind = k};
        pthread_create(&w[k].thread, NULL, race_worker_main, &w[k]);
    }
    for (int i = 0; i < 100000 && r->started < CR_KINDS; i++)
        usleep(100);
    usleep((useconds_t)(round * 211 % 3000)); /* closes land at different points of the calls */
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    closer second = {r->pool, &go};
    pthread_t th;
    pthread_create(&th, NULL, closer_main, &second);
    pthread_barrier_wait(&go);
    r->close_started_ns = now_ns();
    ferry_pool_close(r->pool);
    pthread_join(th, NULL);
    r->phase = CR_CLOSED;
    for (int k = 0; k < CR_KINDS; k++)
        pthread_join(w[k].thread, NULL);
    pthread_barrier_destroy(&go);
    ferry_pool_destroy(r->pool);
    pthread_mutex_destroy(&r->recent.lock);
}

/* Helper side: sends each distinct failure (status: how often) as an ITEM, then the RESULT
 * (text: how many calls answered OK, CLOSING while closing, CLOSING after). */
static int close_round_main(int round)
{
    static race r;
    failures_reset();
    close_round(&r, round);
    pthread_mutex_lock(&fails.lock);
    for (unsigned i = 0; i < fails.kept; i++) {
        th_msg note = {.type = TH_MSG_ITEM, .status = fails.times[i]};
        snprintf(note.text, sizeof(note.text), "%.250s", fails.text[i]);
        th_send_msg(TH_CHANNEL_FD, &note);
    }
    th_msg m = {
        .type = TH_MSG_RESULT, .status = fails.count ? 0xbad : FERRY_OK, .seed = fails.count};
    pthread_mutex_unlock(&fails.lock);
    snprintf(m.text, sizeof(m.text), "%llu %llu %llu", (unsigned long long)r.ok_calls,
             (unsigned long long)r.closing_during, (unsigned long long)r.closing_after);
    th_send_msg(TH_CHANNEL_FD, &m);
    return 0;
}

/* Waits for a helper's RESULT (up to timeout_ms; a helper that has none is killed), noting
 * the failures it sent on the way, then describes how the helper ended into how (empty if
 * it exited 0 with an OK result). */
static th_msg finish_round(th_helper *h, int timeout_ms, char *how, size_t size)
{
    th_msg m = {0};
    int got = 0;
    while (th_recv_msg(h->fd, &m, timeout_ms) == 0) {
        if (m.type == TH_MSG_RESULT) {
            got = 1;
            break;
        }
        record_failure(m.text, m.status);
    }
    if (!got)
        kill(h->pid, SIGKILL);
    int status = 0;
    while (waitpid(h->pid, &status, 0) < 0 && errno == EINTR)
        ;
    close(h->fd);
    how[0] = '\0';
    if (!got && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        snprintf(how, size, "hung: no result in %d ms, killed", timeout_ms);
    else if (WIFSIGNALED(status))
        snprintf(how, size, "died by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else if (!got)
        snprintf(how, size, "exited %d without a result%s", WEXITSTATUS(status),
                 WEXITSTATUS(status) == 66 ? " (66: ThreadSanitizer's exit code)" : "");
    else if (m.status != FERRY_OK)
        snprintf(how, size, "%llu failed calls", (unsigned long long)m.seed);
    else if (WEXITSTATUS(status) != 0)
        snprintf(how, size, "calls fine, but exited %d (a sanitizer report?)", WEXITSTATUS(status));
    return m;
}

/* Rounds are counted by how they ended; the failed calls of every round are gathered into
 * the distinct failures that assert_no_failures prints (with how many calls gave each). */
static void test_close_races_every_call(void **state)
{
    (void)state;
    failures_reset();
    int bad = 0;
    unsigned long long ok = 0, during = 0, after = 0;
    uint64_t t0 = now_ns();
    for (int round = 0; round < CR_ROUNDS; round++) {
        char arg[16], how[256];
        unsigned long long a = 0, b = 0, c = 0;
        snprintf(arg, sizeof(arg), "%d", round);
        th_helper h = th_spawn_helper("close-race", arg, "");
        th_msg m = finish_round(&h, 30000, how, sizeof(how));
        if (m.type == TH_MSG_RESULT && sscanf(m.text, "%llu %llu %llu", &a, &b, &c) == 3) {
            ok += a;
            during += b;
            after += c;
        }
        if (!how[0])
            continue;
        bad++;
        print_message("close race round %d: %s\n", round, how);
        if (strstr(how, "failed calls") == NULL)
            note_failure("a round %s", how);
        if (strncmp(how, "hung", 4) == 0) /* the next rounds would hang too */
            break;
    }
    print_message("close race: %d of %d rounds failed, %.2f s; calls answered OK %llu, CLOSING "
                  "while closing %llu, CLOSING after both closes returned %llu\n",
                  bad, CR_ROUNDS, (double)(now_ns() - t0) / 1e9, ok, during, after);
    assert_no_failures("close race");
}

/* ---- test_close_while_a_reservation_is_written (a helper process) ------------------------- */

typedef struct writer {
    ferry_pool *pool;
    uint8_t *data;
    ferry_descriptor desc;
    atomic_int close_began;
    atomic_ullong passes;
} writer;

/* Fills the reservation over and over, and for 20 ms more once close began (by then the close
 * has usually finished), then commits it: OK or CLOSING. */
static void *writer_main(void *arg)
{
    writer *w = arg;
    uint64_t until = 0;
    for (uint64_t i = 1;; i++) {
        th_stamp(w->data, w->desc.length, i);
        w->passes++;
        if (w->close_began && !until)
            until = now_ns() + 20 * MS;
        if (until && now_ns() > until)
            break;
    }
    ferry_status st = ferry_pool_commit(w->pool, &w->desc);
    if (st != FERRY_OK && st != FERRY_CLOSING)
        note_failure("commit after the close gave %s: %s", name(st), ferry_last_error());
    return NULL;
}

static int reservation_close_main(void)
{
    failures_reset();
    static writer w;
    w.pool = make_pool(1 * MIB, 1, 16, 1000);
    ferry_tensor t = ferry_tensor_bytes(256 * KIB);
    void *data;
    if (ferry_pool_reserve(w.pool, &t, 0, &data, &w.desc) != FERRY_OK)
        return 1;
    w.data = data;
    pthread_t th;
    pthread_create(&th, NULL, writer_main, &w);
    while (w.passes < 2)
        usleep(100);
    w.close_began = 1;
    ferry_pool_close(w.pool);
    pthread_join(th, NULL);
    ferry_pool_destroy(w.pool);
    pthread_mutex_lock(&fails.lock);
    th_msg m = {.type = TH_MSG_RESULT, .status = fails.count ? 0xbad : FERRY_OK};
    if (fails.kept)
        snprintf(m.text, sizeof(m.text), "%.250s", fails.text[0]);
    pthread_mutex_unlock(&fails.lock);
    th_send_msg(TH_CHANNEL_FD, &m);
    return 0;
}

/* A zero-copy publisher still writing its reservation when another thread closes the pool (a
 * server shutting down mid-request) must not crash: either close waits for the reservation,
 * or the slice stays mapped until destroy. Three rounds, each in a helper process. */
static void test_close_while_a_reservation_is_written(void **state)
{
    (void)state;
    failures_reset();
    for (int round = 0; round < 3; round++) {
        char how[256];
        th_helper h = th_spawn_helper("reservation-close", "", "");
        th_msg m = finish_round(&h, 30000, how, sizeof(how));
        if (how[0])
            note_failure("a writer racing close: %s%s%s", how, m.text[0] ? ": " : "", m.text);
    }
    assert_no_failures("reservation close");
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--helper") == 0 && strcmp(argv[2], "close-race") == 0)
        return close_round_main(atoi(argv[3]));
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0 && strcmp(argv[2], "reservation-close") == 0)
        return reservation_close_main();
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_threads),
        cmocka_unit_test(test_close_races_every_call),
        cmocka_unit_test(test_close_while_a_reservation_is_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
