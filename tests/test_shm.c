/* The shared segment trusts nothing another process of the pool can write: stray writes into
 * the header and the rings' counters, forged and torn ring entries, forged parts of a packed
 * lease, a cancel racing a reader, and random bytes written into every word a peer can write
 * while a producer and its consumers run (helper processes: the binary re-runs itself). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "consumer/consumer.h"
#include "ferry.h"
#include "pool/pool.h"
#include "shm/segment.h"
#include "helpers.h"
#include "procs.h"

#define MS (1000000ull)

static ferry_pool *make_pool(int64_t consumers, int64_t depth, int64_t inflight)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 1 << 20;
    c.consumer_count = consumers;
    c.max_inflight_slices = inflight;
    c.channel_depth = depth;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool: %s", ferry_last_error());
    return pool;
}

/* The producer's mapping of its segment: what a stray write from any process reaches. */
static ferry__shm_header *header_of(ferry_pool *pool)
{
    return pool->mem.shm.header;
}

static ferry__ring *ring_of(ferry_pool *pool, uint32_t rank)
{
    return ferry__shm_ring(&pool->mem.shm, rank);
}

/* Another process's write into a word this one's threads touch with atomics (TSan sees it
 * as one). */
static void stray_write(uint32_t *word, uint32_t value)
{
    __atomic_store_n(word, value, __ATOMIC_RELAXED);
}

static ferry_consumer *connect_rank(ferry_pool *pool, uint32_t rank)
{
    char addr[FERRY_ADDRESS_SIZE];
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_pool_address(pool, addr, sizeof(addr)), FERRY_OK);
    if (ferry_consumer_connect(addr, rank, -1, &c) != FERRY_OK)
        fail_msg("connect as rank %u: %s", rank, ferry_last_error());
    return c;
}

/* Sends count stamped tensors of n bytes (seeds seed, seed + 1, ...) as one lease to ranks
 * (NULL: all). */
static ferry_status send_stamped(ferry_pool *pool, size_t n, uint64_t seed, uint32_t count,
                                 const ferry_ranks *ranks, uint64_t timeout_ns, ferry_descriptor *d)
{
    uint8_t *buf = malloc(n * count);
    const void *srcs[8];
    ferry_tensor t[8];
    for (uint32_t i = 0; i < count; i++) {
        th_stamp(buf + i * n, n, seed + i);
        srcs[i] = buf + i * n;
        t[i] = ferry_tensor_bytes(n);
    }
    ferry_status st = ferry_pool_send(pool, t, srcs, count, ranks, NULL, timeout_ns, d);
    free(buf);
    return st;
}

/* Reads a received tensor and checks that its bytes carry seed. */
static void read_check(ferry_consumer *c, const ferry_descriptor *d, uint64_t seed)
{
    uint8_t buf[4096];
    assert_true(d->length <= sizeof(buf));
    if (ferry_consumer_read(c, d, buf, sizeof(buf), 1000 * MS) != FERRY_OK)
        fail_msg("read: %s", ferry_last_error());
    uint64_t found = 0;
    if (!th_check_stamp(buf, d->length, seed, &found))
        fail_msg("read the bytes of item %llu, expected %llu", (unsigned long long)found,
                 (unsigned long long)seed);
}

/* Receives one single-tensor lease, checks its bytes, acknowledges it. */
static void recv_check(ferry_consumer *c, uint64_t seed)
{
    ferry_descriptor d;
    size_t k = 0;
    if (ferry_consumer_recv(c, 1000 * MS, &d, 1, &k) != FERRY_OK)
        fail_msg("recv: %s", ferry_last_error());
    assert_int_equal(k, 1);
    read_check(c, &d, seed);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
}

/* ---- defect 1: layout words and ring counters written by anybody ---------------------- */

/* Every layout word of the header overwritten after the pool was opened: neither the
 * producer nor a consumer that opened it reads them again (both keep the layout they read
 * once), so sends and receives go on; a process that opens the pool now is refused. */
static void test_stray_header_write(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 4, 16);
    ferry_consumer *c = connect_rank(pool, 0);
    ferry_ranks to0 = {.first = 0, .count = 1};
    assert_int_equal(send_stamped(pool, 64, 1, 1, &to0, 0, NULL), FERRY_OK);
    recv_check(c, 1);
    ferry__shm_header *h = header_of(pool);
    h->header_bytes = h->memory_size = h->data_start = h->data_size = UINT64_MAX / 3;
    h->gen_offset = h->extent_offset = h->ring_offset = 0x7ffffffffff0ull;
    h->consumer_count = h->max_inflight = h->row_words = h->ring_depth = 0xfffffff0u;
    h->magic = h->version = 0;
    for (uint64_t seed = 2; seed < 12; seed++) {
        assert_int_equal(send_stamped(pool, 64, seed, 1, &to0, 0, NULL), FERRY_OK);
        recv_check(c, seed);
    }
    char addr[FERRY_ADDRESS_SIZE];
    assert_int_equal(ferry_pool_address(pool, addr, sizeof(addr)), FERRY_OK);
    th_helper late = th_spawn_helper("connect", addr, "1");
    th_msg m = th_finish_helper(&late, 5000);
    assert_int_equal(m.status, FERRY_MISMATCH);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* A ring's head moved out of its bounds by a stray write: the receiver refuses the ring
 * (MALFORMED) instead of reading past it, the producer's next send empties the ring and
 * acknowledges for the rank what it may have held, and the ring works again. A stray write
 * into tail is mended by the producer's next send (it keeps its own tail). */
static void test_ring_counters_checked(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4, 16);
    ferry_consumer *c = connect_rank(pool, 0);
    ferry__ring *ring = ring_of(pool, 0);
    ferry_descriptor d;
    size_t k;
    assert_int_equal(send_stamped(pool, 64, 1, 1, NULL, 0, NULL), FERRY_OK);
    stray_write(&ring->head, ring->tail + 3); /* ahead of tail */
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_MALFORMED);
    assert_int_equal(send_stamped(pool, 64, 2, 1, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 2);
    th_wait_drained(pool);                       /* lease 1 was acknowledged for the rank */
    stray_write(&ring->head, ring->tail - 1000); /* too far behind */
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_MALFORMED);
    assert_int_equal(send_stamped(pool, 64, 3, 1, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 3);
    stray_write(&ring->tail, ring->tail + 0x40000000u); /* the producer's own word */
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_MALFORMED);
    assert_int_equal(send_stamped(pool, 64, 4, 1, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 4);
    /* sleeper counts and the poll request are only ever compared with zero */
    uint32_t *counts[] = {&ring->receivers, &ring->senders, &ring->armed,
                          &header_of(pool)->consumer_waiters, &header_of(pool)->producer_waiters};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        stray_write(counts[i], 0xdeadbeefu);
    assert_int_equal(send_stamped(pool, 64, 5, 1, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 5);
    th_wait_drained(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- defects 6 and 7: the entries of one lease, checked before anything is returned ---- */

/* Overwrites rank's ring entry at position at with the encoded descriptor d (a process of the
 * pool writing a well-formed, CRC-valid entry where it does not belong). */
static void forge_entry(ferry_pool *pool, uint32_t rank, uint32_t at, const ferry_descriptor *d)
{
    uint8_t bytes[FERRY_DESCRIPTOR_SIZE];
    assert_int_equal(ferry_descriptor_encode(d, bytes), FERRY_OK);
    ferry__ring *ring = ring_of(pool, rank);
    memcpy(ferry__ring_entry(ring, pool->mem.shm.layout.ring_depth, at), bytes, sizeof(bytes));
}

/* The second entry of a packed lease replaced by another lease's descriptor: the receive
 * refuses the ring (MALFORMED) instead of returning parts of two leases as one. */
static void test_torn_packed_lease_refused(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 8, 16);
    ferry_consumer *c = connect_rank(pool, 0);
    ferry_ranks to0 = {.first = 0, .count = 1}, to1 = {.first = 1, .count = 1};
    ferry_descriptor a[2], b;
    uint32_t head = ring_of(pool, 0)->head;
    assert_int_equal(send_stamped(pool, 64, 10, 2, &to0, 0, a), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, 20, 1, &to1, 0, &b), FERRY_OK);
    forge_entry(pool, 0, head + 1, &b);
    ferry_descriptor got[2];
    size_t k = 0;
    assert_int_equal(ferry_consumer_recv(c, 0, got, 2, &k), FERRY_MALFORMED);
    assert_non_null(strstr(ferry_last_error(), "torn packed lease"));
    /* b is not rank 0's (acknowledged for it when sent): skipped */
    assert_int_equal(ferry_consumer_recv(c, 0, got, 2, &k), FERRY_TIMEOUT);
    assert_int_equal(send_stamped(pool, 64, 30, 2, &to0, 0, NULL), FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 1000 * MS, got, 2, &k), FERRY_OK);
    assert_int_equal(k, 2);
    read_check(c, &got[0], 30);
    read_check(c, &got[1], 31);
    assert_int_equal(ferry_consumer_ack(c, &got[0]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c, &got[1]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_all(c, &a[0]), FERRY_OK); /* the torn lease */
    assert_int_equal(ferry_consumer_ack_all(c, &a[1]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_all(c, &b), FERRY_OK);
    th_wait_drained(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* A cancelled packed lease at the head of the ring is skipped before its parts are counted
 * against the caller's room: a receive of one tensor gets the live lease behind it. */
static void test_cancelled_packed_lease_skipped(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 8, 16);
    ferry_consumer *c = connect_rank(pool, 0);
    ferry_descriptor p[3];
    assert_int_equal(send_stamped(pool, 64, 10, 3, NULL, 0, p), FERRY_OK);
    assert_int_equal(ferry_pool_cancel(pool, &p[0]), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, 20, 1, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 20);
    th_wait_drained(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- defect 11: a forged part index ------------------------------------------------------ */

/* A well-formed, CRC-valid descriptor of a packed lease whose part fields disagree with the
 * parts this process already acknowledged (part 0xFFFFFFFE of 0xFFFFFFFF, or 130 of 200, of a
 * lease of 2) is refused MISMATCH: it never indexes past what was allocated for the lease. */
static void test_forged_part_index_refused(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4, 16);
    uint8_t bytes[128];
    th_fill(bytes, sizeof(bytes), 3);
    ferry_tensor t[2] = {ferry_tensor_bytes(64), ferry_tensor_bytes(64)};
    const void *srcs[2] = {bytes, bytes + 64};
    ferry_descriptor d[2];
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 2, 0, d), FERRY_OK);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c, &d[0]), FERRY_OK);
    const uint32_t forged[][2] = {{0xfffffffeu, 0xffffffffu}, {130, 200}, {1, 3}};
    for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
        ferry_descriptor f = d[1];
        f.part_index = forged[i][0];
        f.part_count = forged[i][1];
        uint8_t wire[FERRY_DESCRIPTOR_SIZE];
        assert_int_equal(ferry_descriptor_encode(&f, wire), FERRY_OK);
        assert_int_equal(ferry_descriptor_decode(wire, sizeof(wire), &f), FERRY_OK);
        assert_int_equal(ferry_consumer_ack(c, &f), FERRY_MISMATCH);
        assert_non_null(strstr(ferry_last_error(), "does not fit its lease"));
    }
    assert_int_equal(ferry_consumer_ack(c, &d[1]), FERRY_OK); /* the lease completes */
    th_wait_drained(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- defect 14: a cancel marks the lease dead before it lets a reader in ------------------- */

typedef struct cancel_reader {
    ferry_consumer *c;
    ferry_descriptor d;
    ferry_status st;
} cancel_reader;

/* Reads the lease with timeout 0 until the answer is anything but TIMEOUT. */
static void *read_until_answer(void *arg)
{
    cancel_reader *r = arg;
    uint8_t buf[64];
    do
        r->st = ferry_consumer_read(r->c, &r->d, buf, sizeof(buf), 0);
    while (r->st == FERRY_TIMEOUT);
    return NULL;
}

/* A reservation whose descriptor a consumer polls (ferry.h allows sending it before the
 * commit) is cancelled: the cancel's ready word and acknowledgements let the reader in, but
 * the lease is already marked cancelled, so the read ends STALE, never OK with bytes that
 * were never committed. The reader is the last of 4096 ranks: its acknowledgement is the
 * last word the cancel writes. */
static void test_cancel_marks_before_it_lets_in(void **state)
{
    (void)state;
    const uint32_t ranks = 4096;
    ferry_pool *pool = make_pool(ranks, 1, 4);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_create(ranks - 1, &c), FERRY_OK);
    ferry_tensor t = ferry_tensor_bytes(64);
    uint64_t rounds = th_scaled(200, 50), ok = 0;
    for (uint64_t i = 0; i < rounds; i++) {
        void *data;
        cancel_reader r = {.c = c};
        assert_int_equal(ferry_pool_reserve(pool, &t, 0, &data, &r.d), FERRY_OK);
        memset(data, 0xee, 64); /* never committed */
        pthread_t th;
        pthread_create(&th, NULL, read_until_answer, &r);
        assert_int_equal(ferry_pool_cancel(pool, &r.d), FERRY_OK);
        pthread_join(th, NULL);
        ok += r.st == FERRY_OK;
        if (r.st != FERRY_OK && r.st != FERRY_STALE)
            fail_msg("read of a cancelled reservation: %u %s", r.st, ferry_last_error());
    }
    if (ok)
        fail_msg("%llu of %llu reads of a cancelled reservation returned OK",
                 (unsigned long long)ok, (unsigned long long)rounds);
    th_wait_drained(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- a freed slice seen without the reader's own acknowledgement ---------------------------- */

/* Rank 0 copies a large lease while a group leader acknowledges it for every rank, the pool
 * frees its slice, a peer writes rank 0's acknowledgement word back to another value (an
 * acknowledgement word is anybody's to write), and the next lease takes the slice under
 * another slot. The reader's own acknowledgement word says nothing any more: the slot's
 * generation word, which only the producer writes, says the lease is over, and the read
 * ends STALE instead of returning another lease's bytes as its own. */
static void test_freed_slice_seen_without_own_ack(void **state)
{
    (void)state;
    const size_t n = 32 << 20; /* a copy of milliseconds */
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = (int64_t)n + (1 << 20); /* one such lease at a time */
    cfg.consumer_count = 2;
    cfg.max_inflight_slices = 8;
    cfg.reclaim_interval_us = 3600ll * 1000000; /* only the test reclaims */
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&cfg, &pool), FERRY_OK);
    ferry_consumer *c0 = NULL, *leader = NULL;
    assert_int_equal(ferry_consumer_create(0, &c0), FERRY_OK);
    assert_int_equal(ferry_consumer_create(1, &leader), FERRY_OK);
    th_reader r = {.c = c0, .buf = malloc(n), .n = n};
    uint8_t *next = malloc(n);
    unsigned rounds = (unsigned)th_scaled(50, 10), torn = 0, stale = 0;
    th_stamp(next, n, 1);
    ferry_descriptor d = th_reserve_backwards(pool, next, n, 0);
    for (unsigned k = 1; k <= rounds; k++) {
        th_stamp(next, n, k + 1);
        r.d = d;
        r.started = 0;
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, th_read_main, &r), 0);
        while (!__atomic_load_n(&r.started, __ATOMIC_ACQUIRE))
            ;
        usleep((useconds_t)(rand() % 500));
        assert_int_equal(ferry_consumer_ack_all(leader, &d), FERRY_OK);
        assert_int_equal(ferry_pool_reclaim(pool, NULL), FERRY_OK);
        uint32_t *ack0 = &pool->mem.control[ferry__shm_ack_word(&pool->mem.shm.layout, d.slot, 0)];
        __atomic_store_n(ack0, d.generation - 1, __ATOMIC_RELAXED); /* a peer's write */
        d = th_reserve_backwards(pool, next, n, 0);
        pthread_join(t, NULL);
        if (r.st == FERRY_OK)
            torn += !th_check_stamp(r.buf, n, k, NULL);
        else
            stale += r.st == FERRY_STALE;
    }
    print_message("reads: %u stale, %u returned another lease's bytes\n", stale, torn);
    assert_int_equal(torn, 0);
    free(next);
    free(r.buf);
    ferry_consumer_destroy(c0);
    ferry_consumer_destroy(leader);
    ferry_pool_destroy(pool);
}

/* ---- helper processes ------------------------------------------------------------------ */

/* "connect ADDR RANK": connects and reports the status. */
static int connect_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    th_report(st, 0);
    ferry_consumer_destroy(c);
    return 0;
}

/* The longest any call may take beyond its own timeout before it counts as a hang: half a
 * second, more under a sanitizer (TSan runs ten times slower, on a machine shared with other
 * builds). */
#define SLACK_NS ((uint64_t)(500 * MS / (th_stress_scale() < 1 ? th_stress_scale() : 1)))

/* 1 if the DONE message arrived (without waiting). */
static int told_to_stop(void)
{
    th_msg m;
    return recv(TH_CHANNEL_FD, &m, sizeof(m), MSG_DONTWAIT) == (ssize_t)sizeof(m) &&
           m.type == TH_MSG_DONE;
}

/* One consumer call's answer: FERRY_OK, a refusal (any other status), or a failure of the
 * test (a call that took longer than its timeout allows): *hung set. */
static ferry_status timed(ferry_status st, uint64_t start, uint64_t timeout_ns, int *hung)
{
    if (ferry__now_ns() - start > timeout_ns + SLACK_NS)
        *hung = 1;
    return st;
}

/* "chaos ADDR RANK": connects, reports, then receives, reads and acknowledges whatever comes
 * while another process writes random bytes into the words it shares with it, until DONE.
 * Every lease read OK must carry the bytes it was stamped with; every call must return within
 * its timeout; refusals are counted. Reports OK with the leases verified (the refusals in the
 * text), or MISMATCH on a wrong byte, TIMEOUT on a hang. */
static int chaos_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    th_report(st, 0);
    if (st != FERRY_OK)
        return 1;
    static uint8_t buf[8 * 4096];
    uint64_t verified = 0, refused = 0;
    int hung = 0, wrong = 0;
    while (!told_to_stop() && !hung && !wrong) {
        ferry_descriptor d[4];
        size_t k = 0;
        uint64_t t = ferry__now_ns();
        st = timed(ferry_consumer_recv(c, 100 * MS, d, 4, &k), t, 100 * MS, &hung);
        if (st == FERRY_PRODUCER_GONE)
            break;
        refused += st != FERRY_OK && st != FERRY_TIMEOUT;
        for (size_t i = 0; st == FERRY_OK && i < k; i++) {
            uint64_t seed = 0;
            t = ferry__now_ns();
            ferry_status rd = timed(ferry_consumer_read(c, &d[i], buf, sizeof(buf), 100 * MS), t,
                                    100 * MS, &hung);
            th_check_stamp(buf, d[i].length, 0, &seed);
            if (rd == FERRY_OK && !th_check_stamp(buf, d[i].length, seed, NULL))
                wrong = 1;
            verified += rd == FERRY_OK;
            refused += rd != FERRY_OK;
            t = ferry__now_ns();
            timed(ferry_consumer_ack(c, &d[i]), t, 0, &hung);
        }
    }
    th_msg r = {.type = TH_MSG_RESULT,
                .status = wrong  ? FERRY_MISMATCH
                          : hung ? FERRY_TIMEOUT
                                 : FERRY_OK,
                .seed = verified};
    snprintf(r.text, sizeof(r.text), "%llu refused; %s", (unsigned long long)refused,
             ferry_last_error());
    th_send_msg(TH_CHANNEL_FD, &r);
    ferry_consumer_destroy(c);
    return 0;
}

static int helper_main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[2], "connect") == 0)
        return connect_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    if (argc >= 5 && strcmp(argv[2], "chaos") == 0)
        return chaos_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    return 2;
}

/* ---- random bytes in every word a peer can write ---------------------------------------------
 *
 * What a process of the pool other than the producer can write, as the protocol has it or by
 * a stray write: the header's layout words (read once, at open) and its counters and futex
 * words (consumer_waiters, producer_waiters, ack_seq); every ring's counters (head, tail,
 * receivers, senders, armed) and entries; the acknowledgement words of the control table.
 * Left out: the producer's own statements, which consumers believe by design and which no
 * consumer writes (the slots' generations and extents, the ready words, the closing flag): a
 * write into them can make a consumer refuse a live lease, or wait, or stop, but never read
 * outside the pool. */

typedef struct chaos {
    ferry_pool *pool;
    uint64_t until_ns;
    uint64_t writes; /* done */
} chaos;

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One random write into a random peer-writable word. */
static void chaos_write(ferry_pool *pool, uint64_t *rng)
{
    const ferry__shm_layout *l = &pool->mem.shm.layout;
    uint64_t r = xorshift(rng), v = xorshift(rng);
    ferry__shm_header *h = header_of(pool);
    uint32_t *hw = (uint32_t *)h;
    ferry__ring *ring = ring_of(pool, (uint32_t)(r % l->consumers));
    uint32_t *counters[] = {&ring->head, &ring->tail, &ring->receivers, &ring->senders,
                            &ring->armed};
    switch ((r >> 16) % 4) {
    case 0: { /* a header word, the closing flag aside */
        size_t i = (r >> 20) % (sizeof(*h) / 4);
        if (&hw[i] != &h->closing)
            __atomic_store_n(&hw[i], (uint32_t)v, __ATOMIC_RELAXED);
        break;
    }
    case 1: /* a ring counter: mostly near its value, sometimes anywhere */
        if ((r >> 20) % 2)
            v = __atomic_load_n(counters[(r >> 24) % 5], __ATOMIC_RELAXED) + (v % 17) - 8;
        __atomic_store_n(counters[(r >> 24) % 5], (uint32_t)v, __ATOMIC_RELAXED);
        break;
    case 2: { /* 8 bytes of a ring entry */
        uint64_t at = (r >> 20) % ((uint64_t)l->ring_depth * FERRY_DESCRIPTOR_SIZE / 8);
        __atomic_store_n((uint64_t *)(ring + 1) + at, v, __ATOMIC_RELAXED);
        break;
    }
    default: { /* an acknowledgement word */
        uint32_t slot = (uint32_t)((r >> 20) % l->max_inflight);
        uint32_t rank = (uint32_t)((r >> 40) % l->consumers);
        __atomic_store_n(&pool->mem.control[ferry__shm_ack_word(l, slot, rank)], (uint32_t)v,
                         __ATOMIC_RELAXED);
    }
    }
}

static void *chaos_main_thread(void *arg)
{
    chaos *ch = arg;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    while (ferry__now_ns() < ch->until_ns) {
        chaos_write(ch->pool, &rng);
        ch->writes++;
        struct timespec ts = {0, (long)(50000 + xorshift(&rng) % 200000)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Random bytes written into every word a peer can write while a producer sends packed and
 * single leases to three consumer processes, for a few seconds: nothing crashes, no call
 * outlasts its timeout, no consumer reads a wrong byte, and once the consumers are gone every
 * lease was delivered, refused or reclaimed (none is left in flight). */
static void test_random_writes_into_peer_words(void **state)
{
    (void)state;
    enum { RANKS = 3 };
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = 1 << 20;
    cfg.consumer_count = RANKS;
    cfg.max_inflight_slices = 32;
    cfg.channel_depth = 8;
    cfg.reclaim_interval_us = 1000;
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&cfg, &pool), FERRY_OK);
    char addr[FERRY_ADDRESS_SIZE];
    assert_int_equal(ferry_pool_address(pool, addr, sizeof(addr)), FERRY_OK);
    th_helper h[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        char rank[8];
        snprintf(rank, sizeof(rank), "%u", r);
        h[r] = th_spawn_helper("chaos", addr, rank);
        th_msg m;
        assert_int_equal(th_recv_msg(h[r].fd, &m, 5000), 0);
        assert_int_equal(m.status, FERRY_OK);
    }
    chaos ch = {.pool = pool, .until_ns = ferry__now_ns() + th_scaled(3000, 500) * MS};
    pthread_t writer;
    pthread_create(&writer, NULL, chaos_main_thread, &ch);
    uint64_t rng = 42, sent = 0, refused = 0, seed = 1;
    while (ferry__now_ns() < ch.until_ns) {
        uint32_t parts = 1 + (uint32_t)(xorshift(&rng) % 3);
        ferry_ranks some = {.first = (uint32_t)(xorshift(&rng) % RANKS), .count = 1};
        uint64_t t = ferry__now_ns();
        ferry_status st = send_stamped(pool, 16 + xorshift(&rng) % 4000, seed, parts,
                                       xorshift(&rng) % 2 ? NULL : &some, 20 * MS, NULL);
        if (ferry__now_ns() - t > 20 * MS + SLACK_NS)
            fail_msg("a send with a 20 ms timeout took %.1f ms",
                     (double)(ferry__now_ns() - t) / 1e6);
        sent += st == FERRY_OK;
        refused += st != FERRY_OK;
        seed += parts;
    }
    pthread_join(writer, NULL);
    uint64_t verified = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        th_msg done = {.type = TH_MSG_DONE};
        th_send_msg(h[r].fd, &done); /* a helper that failed has stopped already */
        th_msg m = th_finish_helper(&h[r], 10000);
        if (m.status != FERRY_OK)
            fail_msg("rank %u: %s (status %u): %s", r,
                     m.status == FERRY_MISMATCH ? "a wrong byte was read" : "a call hung", m.status,
                     m.text);
        verified += m.seed;
    }
    print_message("chaos: %llu random writes; %llu leases sent, %llu sends refused; %llu "
                  "tensors read and verified\n",
                  (unsigned long long)ch.writes, (unsigned long long)sent,
                  (unsigned long long)refused, (unsigned long long)verified);
    assert_true(sent > 0 && verified > 0);
    th_wait_drained(pool); /* the consumers' leases were acknowledged for them once gone */
    ferry_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stray_header_write),
        cmocka_unit_test(test_ring_counters_checked),
        cmocka_unit_test(test_torn_packed_lease_refused),
        cmocka_unit_test(test_cancelled_packed_lease_skipped),
        cmocka_unit_test(test_forged_part_index_refused),
        cmocka_unit_test(test_cancel_marks_before_it_lets_in),
        cmocka_unit_test(test_freed_slice_seen_without_own_ack),
        cmocka_unit_test(test_random_writes_into_peer_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
