/* The pool engine and the consumer API in one process (the broker serves this process too).
 * Every test checks the allocator's invariants after each operation. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/atomic.h"
#include "consumer/consumer.h"
#include "ferry.h"
#include "helpers.h"
#include "procs.h"
#include "pool/pool.h"

#define MS 1000000ull

static ferry_pool_config config_of(int64_t size, int64_t consumers, int64_t inflight)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = size;
    c.consumer_count = consumers;
    c.max_inflight_slices = inflight;
    return c;
}

static ferry_pool *make_pool(int64_t size, int64_t consumers, int64_t inflight)
{
    ferry_pool_config c = config_of(size, consumers, inflight);
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_OK);
    return pool;
}

/* For tests that count what ferry_pool_reclaim frees: a background reclaimer that runs once
 * an hour cannot get there first. */
static ferry_pool *make_manual_pool(int64_t size, int64_t consumers, int64_t inflight)
{
    ferry_pool_config c = config_of(size, consumers, inflight);
    c.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_OK);
    return pool;
}

static void check_invariants(ferry_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    int rc = ferry__alloc_check(&pool->alloc);
    uint32_t inflight = pool->inflight_count, free_slots = pool->free_count;
    pthread_mutex_unlock(&pool->lock);
    if (rc != 0)
        fail_msg("allocator invariant broken: %s", ferry_last_error());
    assert_true(inflight + free_slots <= pool->max_inflight);
}

static ferry_descriptor publish_bytes(ferry_pool *pool, size_t n, uint64_t seed)
{
    uint8_t *buf = malloc(n ? n : 1);
    th_fill(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    ferry_descriptor d;
    assert_int_equal(ferry_pool_publish(pool, &t, buf, FERRY_NO_WAIT, &d), FERRY_OK);
    free(buf);
    check_invariants(pool);
    return d;
}

/* Sends the descriptor through its wire form, as a real producer would. */
static ferry_descriptor over_wire(const ferry_descriptor *d)
{
    uint8_t wire[FERRY_DESCRIPTOR_SIZE];
    ferry_descriptor out;
    assert_int_equal(ferry_descriptor_encode(d, wire), FERRY_OK);
    assert_int_equal(ferry_descriptor_decode(wire, sizeof(wire), &out), FERRY_OK);
    return out;
}

static void read_and_check(ferry_consumer *c, const ferry_descriptor *d, uint64_t seed)
{
    uint8_t *buf = malloc(d->length + 1);
    assert_int_equal(ferry_consumer_read(c, d, buf, d->length, 100 * MS), FERRY_OK);
    assert_true(th_check(buf, d->length, seed));
    free(buf);
}

static void test_round_trip_and_recycle(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 1, 64);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    size_t sizes[] = {0, 1, 255, 256, 257, 4096, 100000};
    for (int round = 0; round < 50; round++) {
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            uint64_t seed = (uint64_t)round * 100 + i;
            ferry_descriptor d = publish_bytes(pool, sizes[i], seed);
            assert_int_equal(d.offset % 256, 0);
            d = over_wire(&d);
            read_and_check(c, &d, seed);
            assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
        }
        uint64_t n = 0;
        assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
        check_invariants(pool);
    }
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.leases_in_flight, 0);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.publishes, 350);
    assert_int_equal(s.reclaimed, 350);
    assert_int_equal(s.largest_free, s.usable_bytes);
    assert_int_equal(s.capacity, 1 << 20);
    assert_true(s.high_water_bytes >= 100000);
    assert_int_equal(s.consumers_attached, 1);
    assert_int_equal(s.consumers_alive, 1);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_acks_by_rank_range_all(void **state)
{
    (void)state;
    ferry_pool *pool = make_manual_pool(1 << 20, 4, 16);
    ferry_consumer *c[4];
    for (uint32_t r = 0; r < 4; r++)
        assert_int_equal(ferry_consumer_create(r, &c[r]), FERRY_OK);
    uint64_t n;
    /* One rank at a time: the lease stays until the last rank. */
    ferry_descriptor d = publish_bytes(pool, 1000, 1);
    for (uint32_t r = 0; r < 4; r++) {
        read_and_check(c[r], &d, 1);
        assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
        assert_int_equal(n, 0);
        assert_int_equal(ferry_consumer_ack(c[r], &d), FERRY_OK);
    }
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 1);
    /* A range [1, 3) acknowledged by rank 1 for its subgroup, then 0 and 3. */
    d = publish_bytes(pool, 1000, 2);
    assert_int_equal(ferry_consumer_ack_range(c[1], &d, 1, 2), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c[2], &d), FERRY_STALE); /* already done for 2 */
    assert_int_equal(ferry_consumer_ack(c[0], &d), FERRY_OK);
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ferry_consumer_ack(c[3], &d), FERRY_OK);
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 1);
    /* Bad ranges change nothing. */
    d = publish_bytes(pool, 10, 3);
    assert_int_equal(ferry_consumer_ack_range(c[0], &d, 3, 2), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack_range(c[0], &d, 0, 0), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack_range(c[0], &d, UINT32_MAX, 2), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 0);
    /* All ranks at once, without reading. */
    assert_int_equal(ferry_consumer_ack_all(c[2], &d), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_all(c[2], &d), FERRY_STALE);
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 1);
    check_invariants(pool);
    for (uint32_t r = 0; r < 4; r++)
        ferry_consumer_destroy(c[r]);
    ferry_pool_destroy(pool);
}

static void test_stale_refused(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 1, 1);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    uint8_t buf[512];
    ferry_descriptor d1 = publish_bytes(pool, 512, 1);
    read_and_check(c, &d1, 1);
    assert_int_equal(ferry_consumer_ack(c, &d1), FERRY_OK);
    /* Acknowledged by this rank: reading or acknowledging again is refused. */
    assert_int_equal(ferry_consumer_read(c, &d1, buf, sizeof(buf), 0), FERRY_STALE);
    assert_non_null(strstr(ferry_last_error(), "already acknowledged"));
    assert_int_equal(ferry_consumer_ack(c, &d1), FERRY_STALE);
    /* The single slot is reused: the old descriptor names another lease now. */
    ferry_descriptor d2 = publish_bytes(pool, 512, 2);
    assert_int_equal(d2.slot, d1.slot);
    assert_int_equal(d2.generation, d1.generation + 1);
    assert_int_equal(ferry_consumer_read(c, &d1, buf, sizeof(buf), 0), FERRY_STALE);
    assert_non_null(strstr(ferry_last_error(), "now holds generation"));
    const void *view;
    assert_int_equal(ferry_consumer_view(c, &d1, &view, 0), FERRY_STALE);
    assert_int_equal(ferry_consumer_ack_all(c, &d1), FERRY_STALE);
    /* The new lease is intact: the stale ack did not touch it. */
    read_and_check(c, &d2, 2);
    assert_int_equal(ferry_consumer_view(c, &d2, &view, 0), FERRY_OK);
    assert_true(th_check(view, 512, 2));
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_cancel(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 2, 8);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(1, &c), FERRY_OK);
    ferry_descriptor d = publish_bytes(pool, 3000, 9);
    assert_int_equal(ferry_consumer_open(c, &d), FERRY_OK);
    assert_int_equal(th_stats(pool).bytes_in_use, 3072);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_OK);
    check_invariants(pool);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.cancelled, 1);
    assert_int_equal(s.leases_in_flight, 0);
    uint8_t buf[3000];
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 0), FERRY_STALE);
    char expect[128];
    snprintf(expect, sizeof(expect),
             "Cannot release inactive host pool lease (slot=%u, generation=%u)", d.slot,
             d.generation);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_INACTIVE_LEASE);
    assert_string_equal(ferry_last_error(), expect);
    ferry_descriptor bad = d;
    bad.slot = 1000;
    assert_int_equal(ferry_pool_cancel(pool, &bad), FERRY_INACTIVE_LEASE);
    bad = d;
    bad.pool_id[0] ^= 1;
    assert_int_equal(ferry_pool_cancel(pool, &bad), FERRY_MISMATCH);
    assert_int_equal(th_stats(pool).cancelled, 1);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static char log_lines[8][512];
static int log_count;

static void capture_log(int level, const char *message, void *user)
{
    (void)user;
    if (level == FERRY_LOG_WARN && log_count < 8)
        snprintf(log_lines[log_count++], sizeof(log_lines[0]), "%s", message);
}

typedef struct delayed_ack {
    ferry_consumer *consumer;
    ferry_descriptor desc;
    unsigned delay_ms;
} delayed_ack;

static void *ack_later(void *arg)
{
    delayed_ack *a = arg;
    struct timespec ts = {0, (long)a->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    ferry_consumer_ack(a->consumer, &a->desc);
    return NULL;
}

static void test_pool_full_then_recovery(void **state)
{
    (void)state;
    log_count = 0;
    ferry_set_log(capture_log, NULL);
    ferry_pool *pool = make_pool(32768 + 256 * 4, 1, 4096); /* 4 slices of 256 bytes */
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_descriptor d[4];
    for (int i = 0; i < 4; i++)
        d[i] = publish_bytes(pool, 200, (uint64_t)i);
    assert_int_equal(ferry_consumer_open(c, &d[0]), FERRY_OK);
    ferry_tensor t = ferry_tensor_bytes(100);
    uint8_t src[100] = {0};
    ferry_descriptor out;
    memset(&out, 0x5a, sizeof(out));
    ferry_descriptor before = out;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out), FERRY_POOL_FULL);
        assert_non_null(strstr(ferry_last_error(), "host pool is full"));
        assert_non_null(strstr(ferry_last_error(), "slowest consumer: rank 0"));
    }
    assert_memory_equal(&out, &before, sizeof(out));
    assert_int_equal(log_count, 1); /* warned once per pool */
    assert_non_null(strstr(log_lines[0], "host pool is full"));
    /* Waiting with a timeout that expires. */
    assert_int_equal(ferry_pool_publish(pool, &t, src, 20 * MS, &out), FERRY_POOL_FULL);
    assert_int_equal(th_stats(pool).pool_full_events, 4);
    /* Waiting while a consumer acknowledges: publish returns once the slice is free. */
    delayed_ack a = {c, d[2], 30};
    pthread_t th;
    pthread_create(&th, NULL, ack_later, &a);
    assert_int_equal(ferry_pool_publish(pool, &t, src, 5000 * MS, &out), FERRY_OK);
    pthread_join(th, NULL);
    assert_int_equal(out.offset, d[2].offset);
    check_invariants(pool);
    /* Recovery without waiting after an acknowledgement. */
    assert_int_equal(ferry_consumer_ack(c, &d[0]), FERRY_OK);
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out), FERRY_OK);
    assert_int_equal(log_count, 1);
    ferry_set_log(NULL, NULL);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_max_inflight_bounds_leases(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 1, 2);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_descriptor a = publish_bytes(pool, 10, 1);
    publish_bytes(pool, 10, 2);
    ferry_tensor t = ferry_tensor_bytes(10);
    uint8_t src[10] = {0};
    ferry_descriptor out;
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out), FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), "2 leases in flight (max 2)"));
    assert_int_equal(ferry_consumer_ack(c, &a), FERRY_OK);
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out), FERRY_OK);
    assert_int_equal(out.slot, a.slot);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_reserve_commit(void **state)
{
    (void)state;
    ferry_pool *pool = make_manual_pool(1 << 20, 1, 8);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_tensor t = {.dtype_code = FERRY_DTYPE_FLOAT,
                      .dtype_bits = 32,
                      .dtype_lanes = 1,
                      .ndim = 2,
                      .shape = {16, 32}};
    void *data;
    ferry_descriptor d;
    assert_int_equal(ferry_pool_reserve(pool, &t, FERRY_NO_WAIT, &data, &d), FERRY_OK);
    assert_int_equal(d.length, 16 * 32 * 4);
    /* Not ready before the commit. */
    assert_int_equal(ferry_consumer_wait(c, &d, 5 * MS), FERRY_TIMEOUT);
    assert_non_null(strstr(ferry_last_error(), "not ready"));
    th_fill(data, d.length, 77);
    uint64_t n;
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_OK);
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_INACTIVE_LEASE);
    assert_non_null(strstr(ferry_last_error(), "already committed"));
    read_and_check(c, &d, 77);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_INACTIVE_LEASE);
    /* A reserved lease can be cancelled. */
    assert_int_equal(ferry_pool_reserve(pool, &t, FERRY_NO_WAIT, &data, &d), FERRY_OK);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_OK);
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_INACTIVE_LEASE);
    assert_int_equal(ferry_consumer_wait(c, &d, 0), FERRY_STALE);
    check_invariants(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ferry_pool_copied reads *done = 1 or 0; on a failure it leaves *done alone. */
static int copied(ferry_pool *pool, const ferry_descriptor *d)
{
    int done = 7;
    assert_int_equal(ferry_pool_copied(pool, d, &done), FERRY_OK);
    assert_true(done == 0 || done == 1);
    return done;
}

static void copied_fails(ferry_pool *pool, const ferry_descriptor *d, int *out, ferry_status status,
                         const char *message)
{
    int done = 7;
    assert_int_equal(ferry_pool_copied(pool, d, out ? &done : NULL), status);
    assert_string_equal(ferry_last_error(), message);
    assert_int_equal(done, 7);
}

static void test_copied(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 1, 1); /* one slot: every lease reuses it */
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    /* A publish copies before it returns. */
    ferry_descriptor old = publish_bytes(pool, 100, 1);
    assert_int_equal(copied(pool, &old), 1);
    /* Acknowledged and reclaimed, then the slot reused by a new publish: the ready word holds
     * the new generation, and the old descriptor still reads as copied. */
    read_and_check(c, &old, 1);
    assert_int_equal(ferry_consumer_ack(c, &old), FERRY_OK);
    th_wait_drained(pool); /* the background reclaimer may get there first */
    assert_int_equal(copied(pool, &old), 1);
    ferry_descriptor pub = publish_bytes(pool, 100, 2);
    assert_int_equal(pub.slot, old.slot);
    assert_int_equal(pub.generation, old.generation + 1);
    assert_int_equal(copied(pool, &old), 1);
    assert_int_equal(copied(pool, &pub), 1);
    read_and_check(c, &pub, 2);
    assert_int_equal(ferry_consumer_ack(c, &pub), FERRY_OK);
    /* A reservation counts once committed; the slot's ready word still holds the previous
     * lease's generation meanwhile. */
    ferry_tensor t = ferry_tensor_bytes(64);
    void *data;
    ferry_descriptor res;
    assert_int_equal(ferry_pool_reserve(pool, &t, FERRY_NO_WAIT, &data, &res), FERRY_OK);
    assert_int_equal(res.slot, pub.slot);
    assert_int_equal(copied(pool, &res), 0);
    assert_int_equal(copied(pool, &res), 0);
    assert_int_equal(copied(pool, &pub), 1); /* the earlier lease of the slot */
    th_fill(data, 64, 3);
    assert_int_equal(ferry_pool_commit(pool, &res), FERRY_OK);
    assert_int_equal(copied(pool, &res), 1);
    read_and_check(c, &res, 3);
    assert_int_equal(ferry_consumer_ack(c, &res), FERRY_OK);
    check_invariants(pool);
    /* Failures leave *done alone. */
    assert_int_equal(ferry_pool_reserve(pool, &t, FERRY_NO_WAIT, &data, &res), FERRY_OK);
    int done = 7;
    copied_fails(NULL, &res, &done, FERRY_INVALID_ARGUMENT, "pool is NULL");
    copied_fails(pool, NULL, &done, FERRY_INVALID_ARGUMENT, "descriptor is NULL");
    copied_fails(pool, &res, NULL, FERRY_INVALID_ARGUMENT, "done output is NULL");
    ferry_descriptor bad = res;
    bad.pool_id[0] ^= 1;
    copied_fails(pool, &bad, &done, FERRY_MISMATCH, "descriptor names another pool");
    bad.slot = 5; /* the pool is checked first */
    copied_fails(pool, &bad, &done, FERRY_MISMATCH, "descriptor names another pool");
    ferry_pool *other = make_pool(1 << 16, 1, 8);
    ferry_descriptor theirs = publish_bytes(other, 10, 4);
    copied_fails(pool, &theirs, &done, FERRY_MISMATCH, "descriptor names another pool");
    assert_int_equal(copied(other, &theirs), 1);
    ferry_pool_destroy(other);
    bad = res;
    bad.slot = 1;
    copied_fails(pool, &bad, &done, FERRY_INVALID_ARGUMENT, "slot 1 is outside the pool's 1 rows");
    bad.slot = UINT32_MAX;
    copied_fails(pool, &bad, &done, FERRY_INVALID_ARGUMENT,
                 "slot 4294967295 is outside the pool's 1 rows");
    assert_int_equal(done, 7);
    /* Once the pool is closed, even a reservation never committed reads as copied. */
    assert_int_equal(copied(pool, &res), 0);
    ferry_pool_close(pool);
    assert_int_equal(copied(pool, &res), 1);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_publish_many(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 2, 8);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_tensor t[3] = {
        {.dtype_code = FERRY_DTYPE_UINT,
         .dtype_bits = 8,
         .dtype_lanes = 1,
         .ndim = 1,
         .shape = {3}},
        {.dtype_code = FERRY_DTYPE_FLOAT,
         .dtype_bits = 64,
         .dtype_lanes = 1,
         .ndim = 2,
         .shape = {5, 7}},
        {.dtype_code = FERRY_DTYPE_BFLOAT,
         .dtype_bits = 16,
         .dtype_lanes = 1,
         .ndim = 1,
         .shape = {9}},
    };
    uint8_t a[3], b[280], cc[18];
    th_fill(a, sizeof(a), 1);
    th_fill(b, sizeof(b), 2);
    th_fill(cc, sizeof(cc), 3);
    const void *srcs[3] = {a, b, cc};
    ferry_descriptor d[3];
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 3, FERRY_NO_WAIT, d), FERRY_OK);
    check_invariants(pool);
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    assert_int_equal(d[0].offset % 256, 0);
    assert_int_equal(d[1].offset - d[0].offset, 8); /* 3 bytes, aligned up to 8 */
    assert_int_equal(d[2].offset - d[1].offset, 280);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(d[i].slot, d[0].slot);
        assert_int_equal(d[i].generation, d[0].generation);
        assert_true(d[i].flags & FERRY_DESC_FLAG_MULTI);
        ferry_descriptor w = over_wire(&d[i]);
        read_and_check(c, &w, (uint64_t)i + 1);
    }
    /* One lease, cancelled through any of its descriptors; cancelling a sibling part after
     * that is harmless. */
    assert_int_equal(ferry_pool_cancel(pool, &d[2]), FERRY_OK);
    assert_int_equal(ferry_pool_cancel(pool, &d[0]), FERRY_OK);
    assert_int_equal(th_stats(pool).leases_in_flight, 0);
    assert_int_equal(th_stats(pool).cancelled, 1);
    /* Bad input changes nothing. */
    srcs[1] = NULL;
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 3, FERRY_NO_WAIT, d),
                     FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 0, FERRY_NO_WAIT, d),
                     FERRY_INVALID_ARGUMENT);
    t[0].ndim = 9;
    srcs[1] = b;
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 3, FERRY_NO_WAIT, d),
                     FERRY_INVALID_ARGUMENT);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.leases_in_flight, 0);
    assert_int_equal(s.publishes, 1);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_generation_exhausted(void **state)
{
    (void)state;
    ferry_pool_config cfg = config_of(1 << 16, 1, 2);
    cfg.initial_generation = 0x7ffffffe;
    ferry_pool *pool;
    assert_int_equal(ferry_pool_create(&cfg, &pool), FERRY_OK);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_descriptor d0 = publish_bytes(pool, 64, 1);
    ferry_descriptor d1 = publish_bytes(pool, 64, 2);
    assert_int_equal(d0.generation, 0x7fffffff);
    assert_int_equal(d1.generation, 0x7fffffff);
    read_and_check(c, &d0, 1);
    assert_int_equal(ferry_consumer_ack(c, &d0), FERRY_OK);
    ferry_tensor t = ferry_tensor_bytes(64);
    uint8_t src[64] = {0};
    ferry_descriptor out;
    char expect[128];
    snprintf(expect, sizeof(expect),
             "host pool slot generation exhausted (slot=%u, generation=2147483647)", d0.slot);
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out),
                     FERRY_GENERATION_EXHAUSTED);
    assert_string_equal(ferry_last_error(), expect);
    check_invariants(pool);
    /* The exhausted slot is retired; the lease of the other slot is untouched. */
    read_and_check(c, &d1, 2);
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out), FERRY_POOL_FULL);
    assert_int_equal(ferry_consumer_ack(c, &d1), FERRY_OK);
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &out),
                     FERRY_GENERATION_EXHAUSTED);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.leases_in_flight, 0);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.publishes, 2);
    check_invariants(pool);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_descriptor_checked_against_pool(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 2, 8);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_descriptor d = publish_bytes(pool, 100, 1);
    uint8_t buf[4096];
    ferry_descriptor bad = d;
    bad.consumer_count = 3;
    assert_int_equal(ferry_consumer_read(c, &bad, buf, sizeof(buf), 0), FERRY_MISMATCH);
    bad = d;
    bad.offset = (1 << 16);
    assert_int_equal(ferry_consumer_read(c, &bad, buf, sizeof(buf), 0), FERRY_MISMATCH);
    bad = d;
    bad.pool_size = 1 << 17;
    assert_int_equal(ferry_consumer_read(c, &bad, buf, sizeof(buf), 0), FERRY_MISMATCH);
    bad = d;
    bad.slot = 8;
    assert_int_equal(ferry_consumer_read(c, &bad, buf, sizeof(buf), 0), FERRY_MISMATCH);
    assert_int_equal(ferry_consumer_read(c, &d, buf, 10, 0), FERRY_INVALID_ARGUMENT);
    /* A pool identity the broker does not serve. */
    ferry_consumer *other;
    assert_int_equal(ferry_consumer_create(1, &other), FERRY_OK);
    bad = d;
    bad.pool_id[3] ^= 0x40;
    assert_int_equal(ferry_consumer_open(other, &bad), FERRY_MISMATCH);
    assert_true(th_stats(pool).broker_refused >= 1);
    /* A rank the pool does not have. */
    ferry_consumer *far;
    assert_int_equal(ferry_consumer_create(5, &far), FERRY_OK);
    assert_int_equal(ferry_consumer_open(far, &d), FERRY_INVALID_ARGUMENT);
    /* The good descriptor still works after all that. */
    read_and_check(c, &d, 1);
    ferry_consumer_destroy(far);
    ferry_consumer_destroy(other);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* A pool-only descriptor opens the pool before any tensor; it names no lease. */
static void test_pre_open(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 1, 8);
    ferry_descriptor d;
    assert_int_equal(ferry_pool_describe(pool, &d), FERRY_OK);
    d = over_wire(&d);
    assert_true(d.flags & FERRY_DESC_FLAG_POOL_ONLY);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_open(c, &d), FERRY_OK);
    assert_int_equal(th_stats(pool).consumers_attached, 1);
    uint8_t buf[8];
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 0), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_INVALID_ARGUMENT);
    ferry_descriptor e = publish_bytes(pool, 8, 3);
    read_and_check(c, &e, 3);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

static void test_background_reclaim_and_info(void **state)
{
    (void)state;
    ferry_pool_config cfg = config_of(1 << 20, 2, 32);
    cfg.reclaim_interval_us = 500;
    ferry_pool *pool;
    assert_int_equal(ferry_pool_create(&cfg, &pool), FERRY_OK);
    ferry_consumer *c0, *c1;
    assert_int_equal(ferry_consumer_create(0, &c0), FERRY_OK);
    assert_int_equal(ferry_consumer_create(1, &c1), FERRY_OK);
    ferry_descriptor d = publish_bytes(pool, 5000, 4);
    assert_int_equal(ferry_consumer_open(c0, &d), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c0, &d), FERRY_OK);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 1, &info), FERRY_OK);
    assert_int_equal(info.attached, 0);
    assert_int_equal(info.outstanding, 1);
    assert_true(info.oldest_age_ns > 0);
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_int_equal(info.attached, 1);
    assert_int_equal(info.alive, 1);
    assert_int_equal(info.pid, getpid());
    assert_int_equal(info.outstanding, 0);
    assert_int_equal(ferry_pool_consumer_info(pool, 2, &info), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack(c1, &d), FERRY_OK);
    /* No explicit reclaim: the background reclaimer frees the lease. */
    for (int i = 0; i < 2000 && th_stats(pool).leases_in_flight; i++)
        usleep(1000);
    assert_int_equal(th_stats(pool).leases_in_flight, 0);
    ferry_consumer_destroy(c0);
    ferry_consumer_destroy(c1);
    ferry_pool_destroy(pool);
}

static void test_destroy_wakes_waiters(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 1, 8);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_tensor t = ferry_tensor_bytes(64);
    void *data;
    ferry_descriptor d;
    assert_int_equal(ferry_pool_reserve(pool, &t, FERRY_NO_WAIT, &data, &d), FERRY_OK);
    assert_int_equal(ferry_consumer_open(c, &d), FERRY_OK);
    ferry_pool_destroy(pool);
    assert_int_equal(ferry_consumer_wait(c, &d, 5000 * MS), FERRY_PRODUCER_GONE);
    assert_non_null(strstr(ferry_last_error(), "gone or closed"));
    ferry_consumer_destroy(c);
    /* Opening a new pool sweeps every pool whose producer is gone out of the cache. */
    pool = make_pool(1 << 16, 1, 8);
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    d = publish_bytes(pool, 10, 1);
    assert_int_equal(ferry_consumer_open(c, &d), FERRY_OK);
    assert_int_equal(ferry__cache_size(), 1);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
    ferry_pool_destroy(NULL);
    ferry_consumer_destroy(NULL);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 16, 1, 8);
    ferry_tensor t = ferry_tensor_bytes(1 << 20);
    uint8_t src[16];
    ferry_descriptor d;
    void *data;
    /* A tensor that can never fit is the fallback signal: POOL_FULL at once, even for a
     * publisher willing to wait, counted apart. */
    assert_int_equal(ferry_pool_publish(pool, &t, src, FERRY_WAIT_FOREVER, &d), FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), "can never fit"));
    assert_int_equal(ferry_pool_reserve(pool, &t, FERRY_NO_WAIT, &data, &d), FERRY_POOL_FULL);
    assert_int_equal(th_stats(pool).too_large, 2);
    assert_int_equal(th_stats(pool).pool_full_events, 0);
    t = ferry_tensor_bytes(16);
    assert_int_equal(ferry_pool_publish(NULL, &t, src, 0, &d), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_publish(pool, NULL, src, 0, &d), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_publish(pool, &t, NULL, 0, &d), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_publish(pool, &t, src, 0, NULL), FERRY_INVALID_ARGUMENT);
    ferry_pool_stats s = {.struct_size = 4, .version = 1};
    assert_int_equal(ferry_pool_stats_get(pool, &s), FERRY_INVALID_ARGUMENT);
    assert_int_equal(th_stats(pool).publishes, 0);
    assert_int_equal(ferry_pool_create(NULL, &pool), FERRY_INVALID_ARGUMENT);
    ferry_pool_destroy(pool);
}

/* Random publish / acknowledge / cancel sequences with the allocator checked after each. */
static void test_random_operations(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 2, 64);
    ferry_consumer *c[2];
    assert_int_equal(ferry_consumer_create(0, &c[0]), FERRY_OK);
    assert_int_equal(ferry_consumer_create(1, &c[1]), FERRY_OK);
    ferry_descriptor live[64];
    uint64_t seeds[64];
    int nlive = 0;
    uint8_t *src = malloc(65536), *dst = malloc(65536);
    srand(12345);
    for (int op = 0; op < 4000; op++) {
        int choice = rand() % 3;
        if (choice == 0 || nlive == 0) {
            size_t n = (size_t)(rand() % 65536);
            uint64_t seed = (uint64_t)op;
            th_fill(src, n, seed);
            ferry_tensor t = ferry_tensor_bytes(n);
            ferry_descriptor d;
            ferry_status st = ferry_pool_publish(pool, &t, src, FERRY_NO_WAIT, &d);
            assert_true(st == FERRY_OK || st == FERRY_POOL_FULL);
            if (st == FERRY_OK) {
                seeds[nlive] = seed;
                live[nlive++] = d;
            }
        } else {
            int i = rand() % nlive;
            if (choice == 1) {
                for (int r = 0; r < 2; r++) {
                    assert_int_equal(ferry_consumer_read(c[r], &live[i], dst, 65536, 0), FERRY_OK);
                    assert_true(th_check(dst, live[i].length, seeds[i]));
                    assert_int_equal(ferry_consumer_ack(c[r], &live[i]), FERRY_OK);
                }
            } else {
                assert_int_equal(ferry_pool_cancel(pool, &live[i]), FERRY_OK);
            }
            live[i] = live[nlive - 1];
            seeds[i] = seeds[--nlive];
        }
        check_invariants(pool);
    }
    free(src);
    free(dst);
    ferry_consumer_destroy(c[0]);
    ferry_consumer_destroy(c[1]);
    ferry_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_recycle),
        cmocka_unit_test(test_acks_by_rank_range_all),
        cmocka_unit_test(test_stale_refused),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_pool_full_then_recovery),
        cmocka_unit_test(test_max_inflight_bounds_leases),
        cmocka_unit_test(test_reserve_commit),
        cmocka_unit_test(test_copied),
        cmocka_unit_test(test_publish_many),
        cmocka_unit_test(test_generation_exhausted),
        cmocka_unit_test(test_descriptor_checked_against_pool),
        cmocka_unit_test(test_pre_open),
        cmocka_unit_test(test_background_reclaim_and_info),
        cmocka_unit_test(test_destroy_wakes_waiters),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_random_operations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
