/* Real processes: the test binary re-runs itself as consumer or producer helpers, which
 * talk to the test over a SOCK_SEQPACKET pair placed on fd 3. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
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
#include "ferry.h"
#include "helpers.h"
#include "procs.h"

#define MS       1000000ull
#define MAX_ITEM (256 * 1024)

/* ---- helper processes ------------------------------------------------------------------ */

/* Consumer helper. mode: "ack" (read, verify, ack), "range:F:N" (read, verify, ack ranks
 * [F, F+N)), "hold" (read, verify, never ack; report each item), "reread" (ack, then read
 * again and report what that returns). */
static int consumer_main(uint32_t rank, const char *mode)
{
    ferry_consumer *c;
    if (ferry_consumer_create(rank, &c) != FERRY_OK)
        return 1;
    uint8_t *buf = malloc(MAX_ITEM);
    uint64_t verified = 0;
    uint32_t status = FERRY_OK;
    unsigned first = 0, count = 0;
    int range = sscanf(mode, "range:%u:%u", &first, &count) == 2;
    th_msg m;
    while (status == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &m, 60000) == 0 &&
           m.type == TH_MSG_ITEM) {
        ferry_descriptor d;
        status = ferry_descriptor_decode(m.desc, sizeof(m.desc), &d);
        if (status == FERRY_OK)
            status = ferry_consumer_read(c, &d, buf, MAX_ITEM, 10000 * MS);
        if (status != FERRY_OK)
            break;
        if (!th_check(buf, d.length, m.seed)) {
            snprintf((char *)buf, 64, "item with seed %llu corrupted", (unsigned long long)m.seed);
            status = 0xbad;
            break;
        }
        verified++;
        if (strcmp(mode, "hold") == 0) {
            th_report(FERRY_OK, verified);
            continue;
        }
        status = range ? ferry_consumer_ack_range(c, &d, first, count) : ferry_consumer_ack(c, &d);
        if (status == FERRY_OK && strcmp(mode, "reread") == 0) {
            status = ferry_consumer_read(c, &d, buf, MAX_ITEM, 0);
            status = status == FERRY_STALE ? FERRY_OK : 0xbad;
        }
    }
    th_report(status, verified);
    free(buf);
    ferry_consumer_destroy(c);
    return status == FERRY_OK ? 0 : 1;
}

/* Producer helper: creates a pool, reserves a lease it never commits, sends its descriptor,
 * and sleeps until killed. */
static int producer_main(void)
{
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = 1 << 20;
    cfg.consumer_count = 1;
    return th_stuck_producer(&cfg);
}

/* A consumer that drops to another uid before asking the broker for the pool. */
static int foreign_main(void)
{
    th_msg m;
    if (th_recv_msg(TH_CHANNEL_FD, &m, 30000) != 0)
        return 1;
    ferry_descriptor d;
    ferry_descriptor_decode(m.desc, sizeof(m.desc), &d);
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) {
        th_report(0xbad, 0);
        return 1;
    }
    ferry_consumer *c;
    ferry_consumer_create(0, &c);
    ferry_status st = ferry_consumer_open(c, &d);
    th_report(st, 0);
    ferry_consumer_destroy(c);
    return 0;
}

static int helper_main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[2], "consumer") == 0)
        return consumer_main((uint32_t)atoi(argv[3]), argv[4]);
    if (argc >= 3 && strcmp(argv[2], "producer") == 0)
        return producer_main();
    if (argc >= 3 && strcmp(argv[2], "foreign") == 0)
        return foreign_main();
    return 2;
}

/* ---- the tests -------------------------------------------------------------------------- */

static ferry_pool *make_pool(int64_t size, int64_t consumers, int64_t interval_us)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = size;
    c.consumer_count = consumers;
    c.max_inflight_slices = 256;
    c.reclaim_interval_us = interval_us;
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_OK);
    return pool;
}

static ferry_descriptor publish_seeded(ferry_pool *pool, size_t n, uint64_t seed,
                                       uint64_t timeout_ns)
{
    static uint8_t buf[MAX_ITEM];
    th_fill(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    ferry_descriptor d;
    ferry_status st = ferry_pool_publish(pool, &t, buf, timeout_ns, &d);
    if (st != FERRY_OK)
        fail_msg("publish failed: %s", ferry_last_error());
    return d;
}

/* N consumers read every item byte for byte while the pool recycles its slices. */
static void test_stream_to_consumers(void **state)
{
    (void)state;
    enum { N = 3, ITEMS = 300 };
    ferry_pool *pool = make_pool(1 << 20, N, 1000); /* far less than the bytes moved */
    th_helper h[N];
    for (int r = 0; r < N; r++) {
        char rank[16];
        snprintf(rank, sizeof(rank), "%d", r);
        h[r] = th_spawn_helper("consumer", rank, "ack");
    }
    srand(7);
    uint64_t bytes = 0;
    for (int i = 0; i < ITEMS; i++) {
        size_t n = 1 + (size_t)rand() % MAX_ITEM;
        ferry_descriptor d = publish_seeded(pool, n, (uint64_t)i, 10000 * MS);
        bytes += n;
        for (int r = 0; r < N; r++)
            th_send_item(h[r].fd, &d, (uint64_t)i, 0);
    }
    for (int r = 0; r < N; r++) {
        th_send_type(h[r].fd, TH_MSG_DONE);
        th_assert_result(th_finish_helper(&h[r], 60000), ITEMS);
    }
    th_wait_drained(pool);
    ferry_pool_stats s = th_stats(pool);
    assert_true(bytes > 20ull * s.capacity);
    assert_int_equal(s.publishes, ITEMS);
    assert_int_equal(s.reclaimed, ITEMS);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.consumers_attached, N);
    ferry_pool_destroy(pool);
}

/* Rank 0 acknowledges for the subgroup [0, 2); rank 2 for itself; rank 1 never runs. */
static void test_ack_by_range_across_processes(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 3, 1000);
    th_helper a = th_spawn_helper("consumer", "0", "range:0:2");
    th_helper b = th_spawn_helper("consumer", "2", "ack");
    for (int i = 0; i < 50; i++) {
        ferry_descriptor d = publish_seeded(pool, 50000, (uint64_t)i + 1000, 10000 * MS);
        th_send_item(a.fd, &d, (uint64_t)i + 1000, 0);
        th_send_item(b.fd, &d, (uint64_t)i + 1000, 0);
    }
    th_send_type(a.fd, TH_MSG_DONE);
    th_send_type(b.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&a, 60000), 50);
    th_assert_result(th_finish_helper(&b, 60000), 50);
    th_wait_drained(pool);
    ferry_pool_destroy(pool);
}

/* A consumer that acknowledged a lease, or that gets a cancelled one, is refused. */
static void test_stale_and_cancelled_refused(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 1, 1000);
    th_helper h = th_spawn_helper("consumer", "0", "reread");
    ferry_descriptor d = publish_seeded(pool, 1000, 1, 0);
    th_send_item(h.fd, &d, 1, 0);
    d = publish_seeded(pool, 1000, 2, 0);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_OK);
    th_send_item(h.fd, &d, 2, 0);
    th_msg m = th_finish_helper(&h, 60000);
    assert_int_equal(m.status, FERRY_STALE);
    assert_int_equal(m.seed, 1);
    assert_non_null(strstr(m.text, "stale descriptor"));
    th_wait_drained(pool);
    ferry_pool_destroy(pool);
}

/* A full pool reports POOL_FULL at once, then serves again once the consumer catches up. */
static void test_pool_full_then_recovery(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(256 * 1024 + 16384, 1, 1000);
    th_helper h = th_spawn_helper("consumer", "0", "ack");
    ferry_descriptor d[4];
    for (int i = 0; i < 4; i++)
        d[i] = publish_seeded(pool, 60000, (uint64_t)i, 0);
    static uint8_t buf[60000];
    ferry_tensor t = ferry_tensor_bytes(sizeof(buf));
    ferry_descriptor out;
    assert_int_equal(ferry_pool_publish(pool, &t, buf, 0, &out), FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), "rank 0 (pid 0, not attached yet)"));
    for (int i = 0; i < 4; i++)
        th_send_item(h.fd, &d[i], (uint64_t)i, 0);
    /* Waits for the consumer's acknowledgements instead of failing. */
    for (int i = 4; i < 40; i++) {
        ferry_descriptor e = publish_seeded(pool, 60000, (uint64_t)i, 10000 * MS);
        th_send_item(h.fd, &e, (uint64_t)i, 0);
    }
    th_send_type(h.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&h, 60000), 40);
    assert_true(th_stats(pool).pool_full_events >= 1);
    th_wait_drained(pool);
    ferry_pool_destroy(pool);
}

/* A consumer killed with SIGKILL mid-stream: its leases are reclaimed for it and the other
 * consumer is unaffected. */
static void test_consumer_killed(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1 << 20, 2, 2000);
    th_helper good = th_spawn_helper("consumer", "0", "ack");
    th_helper bad = th_spawn_helper("consumer", "1", "hold");
    th_msg m;
    for (int i = 0; i < 8; i++) {
        ferry_descriptor d = publish_seeded(pool, 100000, (uint64_t)i, 10000 * MS);
        th_send_item(good.fd, &d, (uint64_t)i, 0);
        th_send_item(bad.fd, &d, (uint64_t)i, 0);
        assert_int_equal(th_recv_msg(bad.fd, &m, 10000), 0); /* read, not acknowledged */
    }
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 1, &info), FERRY_OK);
    assert_int_equal(info.alive, 1);
    assert_int_equal(info.outstanding, 8);
    kill(bad.pid, SIGKILL);
    th_reap_helper(&bad);
    /* The pool holds 1 MiB: 100 more items only fit if the dead rank's leases come back. */
    for (int i = 8; i < 108; i++) {
        ferry_descriptor d = publish_seeded(pool, 100000, (uint64_t)i, 10000 * MS);
        th_send_item(good.fd, &d, (uint64_t)i, 0);
    }
    ferry_pool_stats s = th_stats(pool);
    assert_true(s.acked_for_dead >= 8);
    assert_int_equal(s.consumers_attached, 2);
    assert_int_equal(s.consumers_alive, 1);
    th_send_type(good.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&good, 60000), 108);
    th_wait_drained(pool);
    assert_int_equal(ferry_pool_consumer_info(pool, 1, &info), FERRY_OK);
    assert_int_equal(info.alive, 0);
    assert_int_equal(info.outstanding, 0);
    ferry_pool_destroy(pool);
}

static void *kill_later(void *arg)
{
    th_helper *h = arg;
    usleep(100000);
    kill(h->pid, SIGKILL);
    return NULL;
}

/* A consumer waiting on a lease whose producer is killed gets PRODUCER_GONE, quickly. */
static void test_producer_killed(void **state)
{
    (void)state;
    th_helper prod = th_spawn_helper("producer", "", "");
    th_msg m;
    assert_int_equal(th_recv_msg(prod.fd, &m, 30000), 0);
    ferry_descriptor d;
    assert_int_equal(ferry_descriptor_decode(m.desc, sizeof(m.desc), &d), FERRY_OK);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_wait(c, &d, 20 * MS), FERRY_TIMEOUT);
    pthread_t th;
    pthread_create(&th, NULL, kill_later, &prod);
    uint64_t t0 = ferry__now_ns();
    assert_int_equal(ferry_consumer_wait(c, &d, 30000 * MS), FERRY_PRODUCER_GONE);
    uint64_t waited = ferry__now_ns() - t0;
    pthread_join(th, NULL);
    assert_true(waited < 2000 * MS);
    /* The pool stays mapped: nothing crashes, and later calls keep saying so. */
    uint8_t buf[4096];
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS), FERRY_PRODUCER_GONE);
    ferry_consumer_destroy(c);
    th_reap_helper(&prod);
}

/* A process of another uid is refused by the broker and counted. */
static void test_foreign_uid_refused(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    ferry_pool *pool = make_pool(1 << 20, 1, 1000);
    ferry_descriptor d = publish_seeded(pool, 100, 1, 0);
    th_helper h = th_spawn_helper("foreign", "", "");
    th_send_item(h.fd, &d, 1, 0);
    th_msg m = th_finish_helper(&h, 60000);
    assert_int_equal(m.status, FERRY_PERMISSION);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.broker_refused, 1);
    assert_int_equal(s.consumers_attached, 0);
    ferry_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_to_consumers),
        cmocka_unit_test(test_ack_by_range_across_processes),
        cmocka_unit_test(test_stale_and_cancelled_refused),
        cmocka_unit_test(test_pool_full_then_recovery),
        cmocka_unit_test(test_consumer_killed),
        cmocka_unit_test(test_producer_killed),
        cmocka_unit_test(test_foreign_uid_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
