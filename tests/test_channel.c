/* Channels: consumers that connect by address, descriptor rings in the pool, the poll fd,
 * drain. Real processes where processes are in the story (the test binary re-runs itself as
 * helpers): receivers that connect before and after the first send, slow and dead receivers,
 * a producer killed while receivers wait, a restarted rank. */
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker/broker.h"
#include "common/clock.h"
#include "consumer/consumer.h"
#include "ferry.h"
#include "shm/segment.h"
#include "pool/pool.h"
#include "helpers.h"
#include "procs.h"

#define MS       (1000000ull)
#define END_SEED 0xe4du /* the last item a receiver helper reads */

static ferry_pool *make_pool(int64_t consumers, int64_t depth)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 1 << 20;
    c.consumer_count = consumers;
    c.max_inflight_slices = 64;
    c.channel_depth = depth;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool: %s", ferry_last_error());
    return pool;
}

static void address_of(ferry_pool *pool, char addr[FERRY_ADDRESS_SIZE])
{
    assert_int_equal(ferry_pool_address(pool, addr, FERRY_ADDRESS_SIZE), FERRY_OK);
}

/* Sends one stamped item of n bytes to ranks (NULL: all). */
static ferry_status send_stamped(ferry_pool *pool, size_t n, uint64_t seed,
                                 const ferry_ranks *ranks, uint64_t timeout_ns, ferry_descriptor *d)
{
    uint8_t *buf = malloc(n);
    th_stamp(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    const void *src = buf;
    ferry_status st = ferry_pool_send(pool, &t, &src, 1, ranks, NULL, timeout_ns, d);
    free(buf);
    return st;
}

static ferry_consumer *connect_rank(const char *addr, uint32_t rank)
{
    ferry_consumer *c = NULL;
    if (ferry_consumer_connect(addr, rank, -1, &c) != FERRY_OK)
        fail_msg("connect as rank %u: %s", rank, ferry_last_error());
    return c;
}

/* Receives one single-tensor lease, checks its bytes carry seed, acknowledges it. */
static void recv_check(ferry_consumer *c, uint64_t seed)
{
    ferry_descriptor d;
    size_t k = 0;
    uint8_t buf[4096];
    if (ferry_consumer_recv(c, 2000 * MS, &d, 1, &k) != FERRY_OK)
        fail_msg("recv: %s", ferry_last_error());
    assert_int_equal(k, 1);
    assert_true(d.length <= sizeof(buf));
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS), FERRY_OK);
    uint64_t found = 0;
    if (!th_check_stamp(buf, d.length, seed, &found))
        fail_msg("received the bytes of item %llu, expected %llu", (unsigned long long)found,
                 (unsigned long long)seed);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
}

static void expect_empty(ferry_consumer *c)
{
    ferry_descriptor d;
    size_t k = 0;
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_TIMEOUT);
}

/* ---- helper processes ------------------------------------------------------------------ */

/* "receiver ADDR RANK": connects, reports ready, then reads and acknowledges every lease it
 * is sent (checking each one's bytes against the seed stamped in them) until the END item,
 * or until the producer is gone; reports OK and how many items it verified (END excluded).
 * "slow ADDR RANK": the same, 100 ms per item. "hold ADDR RANK": connects, reports ready and
 * sleeps until killed. */
static int receiver_main(const char *role, const char *addr, uint32_t rank)
{
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    th_report(st, 0);
    if (st != FERRY_OK)
        return 1;
    if (strcmp(role, "hold") == 0)
        for (;;)
            pause();
    if (strcmp(role, "sleep") == 0) { /* asleep in recv until killed */
        ferry_descriptor d;
        size_t k;
        for (;;)
            ferry_consumer_recv(c, 60000 * MS, &d, 1, &k);
    }
    uint64_t verified = 0;
    static uint8_t buf[1 << 16];
    for (;;) {
        ferry_descriptor d;
        size_t k = 0;
        st = ferry_consumer_recv(c, 5000 * MS, &d, 1, &k);
        if (st == FERRY_PRODUCER_GONE)
            break;
        if (st == FERRY_OK)
            st = ferry_consumer_read(c, &d, buf, sizeof(buf), 2000 * MS);
        if (st != FERRY_OK)
            break;
        uint64_t seed = 0;
        th_check_stamp(buf, d.length, 0, &seed);
        if (!th_check_stamp(buf, d.length, seed, NULL)) {
            th_report(FERRY_MISMATCH, verified);
            return 1;
        }
        if (strcmp(role, "slow") == 0) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        st = ferry_consumer_ack(c, &d);
        if (st != FERRY_OK || seed == END_SEED)
            break;
        verified++;
    }
    th_report(st == FERRY_PRODUCER_GONE ? FERRY_OK : st, verified);
    ferry_consumer_destroy(c);
    return 0;
}

/* "producer": creates a pool of 2 ranks, reports its address (in the text), sleeps until
 * killed. */
static _Noreturn void producer_main(void)
{
    ferry_pool *pool = make_pool(2, 16);
    th_msg m = {.type = TH_MSG_RESULT, .status = FERRY_OK};
    ferry_pool_address(pool, m.text, sizeof(m.text));
    th_send_msg(TH_CHANNEL_FD, &m);
    for (;;)
        pause();
}

/* Lowers this process's RLIMIT_NOFILE so that exactly one descriptor is free (the lowest
 * one not in use); *saved gets the limit to put back. */
static void leave_one_fd(struct rlimit *saved)
{
    int fd = dup(0);
    close(fd);
    getrlimit(RLIMIT_NOFILE, saved);
    struct rlimit low = *saved;
    low.rlim_cur = (rlim_t)fd + 1;
    setrlimit(RLIMIT_NOFILE, &low);
}

/* "starved ADDR RANK": connects with one descriptor free and reports what that gave; then,
 * told DONE, connects again with its limit put back and reports that, and sleeps until
 * killed. */
static _Noreturn void starved_main(const char *addr, uint32_t rank)
{
    struct rlimit saved;
    ferry_consumer *c = NULL;
    leave_one_fd(&saved);
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    setrlimit(RLIMIT_NOFILE, &saved);
    th_report(st, c != NULL);
    th_msg m;
    if (th_recv_msg(TH_CHANNEL_FD, &m, 60000) != 0 || m.type != TH_MSG_DONE)
        _exit(1); /* the test is gone */
    st = ferry_consumer_connect(addr, rank, -1, &c);
    th_report(st, 0);
    for (;;)
        pause();
}

static int helper_main(int argc, char **argv)
{
    if (strcmp(argv[2], "producer") == 0)
        producer_main();
    if (argc < 5)
        return 2;
    if (strcmp(argv[2], "starved") == 0)
        starved_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    return receiver_main(argv[2], argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
}

/* Spawns a receiver-style helper and waits until it has connected. */
static th_helper spawn_receiver(const char *role, const char *addr, uint32_t rank)
{
    char r[16];
    snprintf(r, sizeof(r), "%u", rank);
    th_helper h = th_spawn_helper(role, addr, r);
    th_msg m;
    assert_int_equal(th_recv_msg(h.fd, &m, 5000), 0);
    if (m.status != FERRY_OK)
        fail_msg("%s helper could not connect: %s", role, m.text);
    return h;
}

/* ---- tests ------------------------------------------------------------------------------- */

/* Connect before and after the first send: what was queued before a rank connected reaches
 * it, in order, byte for byte; every lease is recycled. */
static void test_connect_before_and_after_send(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 8);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    assert_int_equal(strncmp(addr, "ferry:", 6), 0);
    assert_int_equal(strlen(addr), 38);
    th_helper early = spawn_receiver("receiver", addr, 0);
    for (uint64_t i = 1; i <= 3; i++)
        assert_int_equal(send_stamped(pool, 1000 + i, i, NULL, 0, NULL), FERRY_OK);
    th_helper late = spawn_receiver("receiver", addr, 1); /* three leases already queued */
    for (uint64_t i = 4; i <= 6; i++)
        assert_int_equal(send_stamped(pool, 3000, i, NULL, 1000 * MS, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, END_SEED, NULL, 1000 * MS, NULL), FERRY_OK);
    th_assert_result(th_finish_helper(&early, 5000), 6);
    th_assert_result(th_finish_helper(&late, 5000), 6);
    assert_int_equal(ferry_pool_drain(pool, 2000 * MS), FERRY_OK);
    th_wait_drained(pool);
    ferry_pool_destroy(pool);
}

/* A send to a list or a range reaches those ranks only; the others are acknowledged for at
 * once, so the lease is recycled once the chosen ranks acknowledged it. */
static void test_ranks_and_ranges(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(4, 8);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c[4];
    for (uint32_t r = 0; r < 4; r++)
        c[r] = connect_rank(addr, r);
    uint32_t list[] = {3, 1};
    ferry_ranks to_list = {list, 0, 2}, to_range = {NULL, 1, 2};
    assert_int_equal(send_stamped(pool, 500, 11, &to_list, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 500, 12, &to_range, 0, NULL), FERRY_OK);
    expect_empty(c[0]);
    recv_check(c[1], 11);
    recv_check(c[1], 12);
    recv_check(c[2], 12);
    recv_check(c[3], 11);
    for (uint32_t r = 0; r < 4; r++)
        expect_empty(c[r]);
    th_wait_drained(pool); /* nobody else had to acknowledge */
    ferry_ranks bad = {NULL, 3, 2};
    assert_int_equal(send_stamped(pool, 10, 1, &bad, 0, NULL), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "rank 4"));
    ferry_ranks none = {NULL, 0, 0};
    assert_int_equal(send_stamped(pool, 10, 1, &none, 0, NULL), FERRY_INVALID_ARGUMENT);
    assert_int_equal(th_stats(pool).publishes, 2); /* refused sends leased nothing */
    for (uint32_t r = 0; r < 4; r++)
        ferry_consumer_destroy(c[r]);
    ferry_pool_destroy(pool);
}

/* A packed send arrives as its parts; an output too small for them leaves them queued. */
static void test_packed_send(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c = connect_rank(addr, 0);
    uint8_t a[100], b[300];
    th_stamp(a, sizeof(a), 1);
    th_stamp(b, sizeof(b), 2);
    ferry_tensor t[2] = {ferry_tensor_bytes(sizeof(a)), ferry_tensor_bytes(sizeof(b))};
    const void *srcs[2] = {a, b};
    assert_int_equal(ferry_pool_send(pool, t, srcs, 2, NULL, NULL, 0, NULL), FERRY_OK);
    ferry_descriptor d[2];
    size_t k = 0;
    assert_int_equal(ferry_consumer_recv(c, 0, d, 1, &k), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "has 2 tensors"));
    assert_int_equal(k, 2); /* the room it needs */
    assert_int_equal(ferry_consumer_recv(c, 0, d, 2, &k), FERRY_OK);
    assert_int_equal(k, 2);
    uint8_t out[300];
    assert_int_equal(ferry_consumer_read(c, &d[1], out, sizeof(out), 0), FERRY_OK);
    assert_true(th_check_stamp(out, sizeof(b), 2, NULL));
    assert_int_equal(ferry_consumer_ack(c, &d[0]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c, &d[1]), FERRY_OK);
    th_wait_drained(pool);
    /* More tensors than a ring holds can never be sent. */
    ferry_tensor five[5];
    const void *src5[5];
    for (int i = 0; i < 5; i++) {
        five[i] = ferry_tensor_bytes(8);
        src5[i] = a;
    }
    assert_int_equal(ferry_pool_send(pool, five, src5, 5, NULL, NULL, 0, NULL),
                     FERRY_INVALID_ARGUMENT);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

typedef struct later_recv {
    ferry_consumer *c;
    uint64_t delay_ms;
    int got;
} later_recv;

static void *recv_later(void *arg)
{
    later_recv *l = arg;
    struct timespec ts = {0, (long)(l->delay_ms * MS)};
    nanosleep(&ts, NULL);
    ferry_descriptor d;
    size_t k;
    if (ferry_consumer_recv(l->c, 1000 * MS, &d, 1, &k) == FERRY_OK &&
        ferry_consumer_ack(l->c, &d) == FERRY_OK)
        l->got = 1;
    return NULL;
}

/* A full ring follows the full policy: at once POOL_FULL naming the rank behind (and nothing
 * leased), a wait that ends when the rank catches up, a wait that times out. A rank that
 * never connected is named as such. */
static void test_full_ring_policies(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 2);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c0 = connect_rank(addr, 0);
    ferry_ranks only1 = {NULL, 1, 1}, only0 = {NULL, 0, 1};
    assert_int_equal(send_stamped(pool, 64, 1, &only1, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, 2, &only1, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, 3, &only1, 0, NULL), FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), "ring of rank 1 is full"));
    assert_non_null(strstr(ferry_last_error(), "not attached yet"));
    assert_int_equal(send_stamped(pool, 64, 1, &only0, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, 2, &only0, 0, NULL), FERRY_OK);
    uint64_t leased = th_stats(pool).publishes;
    assert_int_equal(send_stamped(pool, 64, 3, NULL, 0, NULL), FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), "rank 0 is behind"));
    assert_int_equal(th_stats(pool).publishes, leased);
    /* wait: rank 0 catches up after 50 ms */
    later_recv l = {c0, 50, 0};
    pthread_t t;
    pthread_create(&t, NULL, recv_later, &l);
    assert_int_equal(send_stamped(pool, 64, 3, &only0, 2000 * MS, NULL), FERRY_OK);
    pthread_join(t, NULL);
    assert_true(l.got);
    /* a wait that times out */
    uint64_t start = ferry__now_ns();
    ferry_pool_stats before = th_stats(pool);
    assert_int_equal(send_stamped(pool, 64, 4, &only0, 30 * MS, NULL), FERRY_POOL_FULL);
    assert_true(ferry__now_ns() - start >= 30 * MS);
    ferry_pool_stats after = th_stats(pool); /* counted as a full pool's wait is */
    assert_int_equal(after.pool_full_events, before.pool_full_events + 1);
    assert_int_equal(after.pool_full_waits, before.pool_full_waits + 1);
    assert_int_equal(after.pool_full_timeouts, before.pool_full_timeouts + 1);
    recv_check(c0, 2);
    recv_check(c0, 3);
    ferry_consumer_destroy(c0);
    ferry_pool_destroy(pool);
}

/* A send waiting in another thread (for room in a stuck rank's ring, or for pool space) in
 * the background, while this thread sends. */
typedef struct bg_send {
    ferry_pool *pool;
    size_t n;
    const ferry_ranks *ranks;
    uint64_t timeout_ns;
    ferry_status st;
} bg_send;

static void *send_in_background(void *arg)
{
    bg_send *b = arg;
    b->st = send_stamped(b->pool, b->n, 7, b->ranks, b->timeout_ns, NULL);
    return NULL;
}

/* A send to ranks with room and space returns within its own timeout whatever other sends
 * wait for: one waiting for room in a stuck rank's ring, one waiting for pool space. */
static void test_send_waits_alone(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 1);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_ranks only0 = {NULL, 0, 1}, only1 = {NULL, 1, 1};
    assert_int_equal(send_stamped(pool, 64, 1, &only1, 0, NULL), FERRY_OK); /* rank 1 full */
    bg_send b = {pool, 64, &only1, 3000 * MS, FERRY_SYSTEM};
    pthread_t t;
    pthread_create(&t, NULL, send_in_background, &b);
    struct timespec settle = {0, 50 * 1000 * 1000};
    nanosleep(&settle, NULL); /* b waits for room in rank 1's ring */
    uint64_t start = ferry__now_ns();
    assert_int_equal(send_stamped(pool, 64, 2, &only0, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, 3, &only0, 100 * MS, NULL), FERRY_POOL_FULL);
    assert_true(ferry__now_ns() - start < 1000 * MS);
    ferry_consumer *c1 = connect_rank(addr, 1);
    recv_check(c1, 1); /* room: b's send goes in */
    pthread_join(t, NULL);
    assert_int_equal(b.st, FERRY_OK);
    recv_check(c1, 7);
    ferry_consumer *c0 = connect_rank(addr, 0);
    recv_check(c0, 2);
    /* b waits for pool space, held by a lease nobody acknowledges */
    uint8_t *big = calloc(1, 600 << 10);
    ferry_tensor t600 = ferry_tensor_bytes(600 << 10);
    ferry_descriptor held;
    assert_int_equal(ferry_pool_publish(pool, &t600, big, 0, &held), FERRY_OK);
    b = (bg_send){pool, 600 << 10, &only1, 3000 * MS, FERRY_SYSTEM};
    pthread_create(&t, NULL, send_in_background, &b);
    nanosleep(&settle, NULL);
    start = ferry__now_ns();
    assert_int_equal(send_stamped(pool, 64, 4, &only0, 0, NULL), FERRY_OK);
    assert_true(ferry__now_ns() - start < 1000 * MS);
    assert_int_equal(ferry_consumer_ack_all(c0, &held), FERRY_OK); /* space: b goes on */
    pthread_join(t, NULL);
    assert_int_equal(b.st, FERRY_OK);
    recv_check(c0, 4);
    ferry_descriptor d;
    size_t k;
    assert_int_equal(ferry_consumer_recv(c1, 1000 * MS, &d, 1, &k), FERRY_OK);
    assert_int_equal(d.length, 600 << 10);
    assert_int_equal(ferry_consumer_ack(c1, &d), FERRY_OK);
    free(big);
    ferry_consumer_destroy(c0);
    ferry_consumer_destroy(c1);
    ferry_pool_destroy(pool);
}

/* One process waits on several pools at once through their poll fds (one pool per tokenizer
 * worker), with poll(2); a TIMEOUT re-arms the fd. */
static void test_poll_several_pools(void **state)
{
    (void)state;
    ferry_pool *pools[3];
    ferry_consumer *cs[3];
    struct pollfd fds[3];
    for (int i = 0; i < 3; i++) {
        char addr[FERRY_ADDRESS_SIZE];
        pools[i] = make_pool(1, 8);
        address_of(pools[i], addr);
        cs[i] = connect_rank(addr, 0);
        assert_int_equal(ferry_consumer_fd(cs[i], &fds[i].fd), FERRY_OK);
        fds[i].events = POLLIN;
        expect_empty(cs[i]); /* arms it */
    }
    assert_int_equal(poll(fds, 3, 0), 0);
    assert_int_equal(send_stamped(pools[1], 128, 21, NULL, 0, NULL), FERRY_OK);
    assert_int_equal(poll(fds, 3, 1000), 1);
    assert_true(fds[1].revents & POLLIN);
    recv_check(cs[1], 21);
    expect_empty(cs[1]); /* drains and re-arms */
    assert_int_equal(poll(fds, 3, 0), 0);
    assert_int_equal(send_stamped(pools[2], 128, 22, NULL, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pools[0], 128, 23, NULL, 0, NULL), FERRY_OK);
    assert_int_equal(poll(fds, 3, 1000), 2);
    recv_check(cs[0], 23);
    recv_check(cs[2], 22);
    /* closing a pool wakes its fd; recv then says the producer is gone */
    expect_empty(cs[0]);
    ferry_pool_destroy(pools[0]);
    assert_int_equal(poll(fds, 1, 1000), 1);
    ferry_descriptor d;
    size_t k;
    assert_int_equal(ferry_consumer_recv(cs[0], 0, &d, 1, &k), FERRY_PRODUCER_GONE);
    for (int i = 0; i < 3; i++) {
        ferry_consumer_destroy(cs[i]);
        if (i)
            ferry_pool_destroy(pools[i]);
    }
}

/* Drain waits for a slow receiver, and for a dead one only until its leases are acknowledged
 * on its behalf; a rank that never connected makes it time out, naming the rank. */
static void test_drain(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 16);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    th_helper slow = spawn_receiver("slow", addr, 0);
    th_helper dead = spawn_receiver("hold", addr, 1);
    for (uint64_t i = 1; i <= 3; i++)
        assert_int_equal(send_stamped(pool, 256, i, NULL, 0, NULL), FERRY_OK);
    kill(dead.pid, SIGKILL);
    th_reap_helper(&dead);
    uint64_t start = ferry__now_ns();
    assert_int_equal(ferry_pool_drain(pool, 5000 * MS), FERRY_OK);
    assert_true(ferry__now_ns() - start >= 250 * MS); /* three slow acknowledgements */
    assert_int_equal(th_stats(pool).leases_in_flight, 0);
    assert_true(th_stats(pool).acked_for_dead >= 3);
    /* sends to the dead rank are acknowledged for it at once */
    assert_int_equal(send_stamped(pool, 256, END_SEED, NULL, 0, NULL), FERRY_OK);
    th_assert_result(th_finish_helper(&slow, 5000), 3);
    assert_int_equal(ferry_pool_drain(pool, 2000 * MS), FERRY_OK);
    ferry_pool_destroy(pool);

    pool = make_pool(2, 16);
    address_of(pool, addr);
    ferry_consumer *c0 = connect_rank(addr, 0);
    assert_int_equal(send_stamped(pool, 256, 5, NULL, 0, NULL), FERRY_OK);
    recv_check(c0, 5);
    assert_int_equal(ferry_pool_drain(pool, 20 * MS), FERRY_TIMEOUT);
    assert_non_null(strstr(ferry_last_error(), "did not drain"));
    assert_non_null(strstr(ferry_last_error(), "rank 1"));
    ferry_consumer_destroy(c0);
    ferry_pool_destroy(pool);
}

/* A producer killed while receivers wait: recv and the poll fd say PRODUCER_GONE within the
 * bounded time. */
static void test_producer_killed(void **state)
{
    (void)state;
    th_helper prod = th_spawn_helper("producer", "-", "-");
    th_msg m;
    assert_int_equal(th_recv_msg(prod.fd, &m, 5000), 0);
    ferry_consumer *c = connect_rank(m.text, 0);
    ferry_consumer *c1 = connect_rank(m.text, 1);
    int fd;
    assert_int_equal(ferry_consumer_fd(c1, &fd), FERRY_OK);
    expect_empty(c1);
    kill(prod.pid, SIGKILL);
    th_reap_helper(&prod);
    uint64_t start = ferry__now_ns();
    ferry_descriptor d;
    size_t k;
    assert_int_equal(ferry_consumer_recv(c, 10000 * MS, &d, 1, &k), FERRY_PRODUCER_GONE);
    assert_true(ferry__now_ns() - start < 1000 * MS);
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_PRODUCER_GONE); /* and stays so */
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 1000), 1); /* the producer's pidfd */
    assert_int_equal(ferry_consumer_recv(c1, 0, &d, 1, &k), FERRY_PRODUCER_GONE);
    ferry_consumer_destroy(c);
    ferry_consumer_destroy(c1);
    /* nobody serves the address any more */
    ferry_consumer *none = NULL;
    assert_int_equal(ferry_consumer_connect(m.text, 0, -1, &none), FERRY_PRODUCER_GONE);
    assert_null(none);
}

/* A receiver killed with descriptors queued: its leases are acknowledged on its behalf, the
 * rank is restarted by a new process, which gets the leases sent after it started and none
 * of the dead one's; a second live process on the rank is refused. */
static void test_receiver_killed_and_restarted(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    th_helper first = spawn_receiver("hold", addr, 0);
    ferry_consumer *again = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 0, -1, &again), FERRY_RANK_IN_USE);
    for (uint64_t i = 1; i <= 4; i++)
        assert_int_equal(send_stamped(pool, 512, i, NULL, 0, NULL), FERRY_OK);
    kill(first.pid, SIGKILL);
    th_reap_helper(&first);
    assert_int_equal(ferry_pool_drain(pool, 5000 * MS), FERRY_OK);
    th_helper second = spawn_receiver("receiver", addr, 0);
    assert_int_equal(send_stamped(pool, 512, 9, NULL, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, END_SEED, NULL, 0, NULL), FERRY_OK);
    th_assert_result(th_finish_helper(&second, 5000), 1);
    ferry_pool_destroy(pool);
}

/* A receiver killed in its sleep leaves the ring's count of sleepers raised (every send would
 * then pay a wake-up); the process that takes the rank over starts with it cleared. */
static void test_takeover_clears_sleepers(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry__ring *ring = ferry__shm_ring(&pool->mem.shm, 0);
    th_helper first = spawn_receiver("sleep", addr, 0);
    for (int i = 0; i < 200 && !__atomic_load_n(&ring->receivers, __ATOMIC_ACQUIRE); i++) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(__atomic_load_n(&ring->receivers, __ATOMIC_ACQUIRE), 1);
    kill(first.pid, SIGKILL);
    th_reap_helper(&first);
    assert_int_equal(__atomic_load_n(&ring->receivers, __ATOMIC_ACQUIRE), 1);
    th_helper second = spawn_receiver("hold", addr, 0);
    assert_int_equal(__atomic_load_n(&ring->receivers, __ATOMIC_ACQUIRE), 0);
    kill(second.pid, SIGKILL);
    th_reap_helper(&second);
    ferry_pool_destroy(pool);
}

/* A process out of descriptors (one free: the broker's reply cannot bring the pool's)
 * fails to connect with the cause named, EMFILE, and holds no claim: another process takes
 * the rank and gets every item; with its limit back, the first connects (taking the rank
 * over from the second, which has exited). */
static void test_connect_out_of_fds_claims_nothing(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16);
    char addr[FERRY_ADDRESS_SIZE], r[] = "0";
    address_of(pool, addr);
    th_helper starved = th_spawn_helper("starved", addr, r);
    th_msg m;
    assert_int_equal(th_recv_msg(starved.fd, &m, 5000), 0);
    assert_int_equal(m.status, FERRY_SYSTEM);
    assert_int_equal(m.seed, 0); /* no consumer came out */
    assert_non_null(strstr(m.text, "could not take it (EMFILE"));
    assert_non_null(strstr(m.text, strerror(EMFILE)));
    th_helper other = spawn_receiver("receiver", addr, 0); /* RANK_IN_USE if claimed */
    for (uint64_t i = 1; i <= 3; i++)
        assert_int_equal(send_stamped(pool, 512, i, NULL, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 64, END_SEED, NULL, 0, NULL), FERRY_OK);
    th_assert_result(th_finish_helper(&other, 5000), 3);
    th_send_type(starved.fd, TH_MSG_DONE);
    assert_int_equal(th_recv_msg(starved.fd, &m, 5000), 0);
    if (m.status != FERRY_OK)
        fail_msg("the starved helper could not connect with its limit back: %s", m.text);
    kill(starved.pid, SIGKILL);
    th_reap_helper(&starved);
    ferry_pool_destroy(pool);
}

typedef struct recv_worker {
    ferry_consumer *c;
    uint64_t got;
    uint64_t bad;
} recv_worker;

static void *recv_worker_main(void *arg)
{
    recv_worker *w = arg;
    for (;;) {
        ferry_descriptor d;
        size_t k;
        uint8_t buf[256];
        ferry_status st = ferry_consumer_recv(w->c, 2000 * MS, &d, 1, &k);
        if (st != FERRY_OK)
            return NULL;
        uint64_t seed = 0;
        if (ferry_consumer_read(w->c, &d, buf, sizeof(buf), 1000 * MS) != FERRY_OK)
            w->bad++;
        th_check_stamp(buf, d.length, 0, &seed);
        if (ferry_consumer_ack(w->c, &d) != FERRY_OK)
            w->bad++;
        if (seed == END_SEED)
            return NULL;
        w->got++;
    }
}

/* Several threads of one process receive on one rank (and on one consumer): every lease goes
 * to exactly one of them; senders on several threads; closing wakes a blocked receiver. */
static void test_threads_share_a_rank(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 8);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c = connect_rank(addr, 0);
    enum { WORKERS = 3 };
    recv_worker w[WORKERS];
    pthread_t t[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        w[i] = (recv_worker){c, 0, 0};
        pthread_create(&t[i], NULL, recv_worker_main, &w[i]);
    }
    uint64_t n = th_scaled(2000, 200);
    for (uint64_t i = 1; i <= n; i++)
        assert_int_equal(send_stamped(pool, 200, i, NULL, 2000 * MS, NULL), FERRY_OK);
    for (int i = 0; i < WORKERS; i++)
        assert_int_equal(send_stamped(pool, 200, END_SEED, NULL, 2000 * MS, NULL), FERRY_OK);
    uint64_t total = 0;
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(t[i], NULL);
        total += w[i].got;
        assert_int_equal(w[i].bad, 0);
    }
    assert_int_equal(total, n);
    /* a receiver blocked in recv when the pool closes */
    later_recv l = {c, 0, 0};
    pthread_t blocked;
    pthread_create(&blocked, NULL, recv_later, &l);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ferry_pool_close(pool);
    pthread_join(blocked, NULL);
    assert_false(l.got);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* close drains first when the config asks for it: the README's first example. */
static void test_close_drains(void **state)
{
    (void)state;
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = 1 << 20;
    cfg.max_inflight_slices = 16;
    cfg.drain_timeout_us = 5000000;
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&cfg, &pool), FERRY_OK);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    th_helper rx = spawn_receiver("slow", addr, 0);
    assert_int_equal(send_stamped(pool, 1000, 7, NULL, 0, NULL), FERRY_OK);
    assert_int_equal(send_stamped(pool, 1000, 8, NULL, 0, NULL), FERRY_OK);
    ferry_pool_destroy(pool); /* returns once the slow receiver acknowledged both */
    th_assert_result(th_finish_helper(&rx, 5000), 2);
}

/* Bad input: a clear error and no change. */
static void test_bad_input(void **state)
{
    (void)state;
    ferry_consumer *c = NULL;
    const char *bad[] = {"",
                         "ferry:",
                         "ferry:0123",
                         "ferry:0123456789abcdef0123456789abcdeg",
                         "ferry:0123456789abcdef0123456789abcdef0",
                         "pool:0123456789abcdef0123456789abcdef"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(ferry_consumer_connect(bad[i], 0, -1, &c), FERRY_INVALID_ARGUMENT);
        assert_non_null(strstr(ferry_last_error(), "is not a ferry address"));
    }
    assert_int_equal(ferry_consumer_connect(NULL, 0, -1, &c), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_connect("ferry:0123456789abcdef0123456789abcdef", 0, -1, &c),
                     FERRY_PRODUCER_GONE);
    assert_null(c);
    /* the cause once, after the address (it was formatted over itself) */
    const char *want = "no pool serves ferry:0123456789abcdef0123456789abcdef (its producer "
                       "closed it or exited): ";
    const char *gone = ferry_last_error();
    assert_memory_equal(gone, want, strlen(want));
    assert_null(strstr(gone + strlen(want), "no pool serves"));
    ferry_pool *pool = make_pool(2, 4);
    char addr[FERRY_ADDRESS_SIZE];
    char small[8];
    assert_int_equal(ferry_pool_address(pool, small, sizeof(small)), FERRY_INVALID_ARGUMENT);
    address_of(pool, addr);
    /* only the printed form: not with its hex digits in upper case, nor its prefix */
    char other[FERRY_ADDRESS_SIZE];
    memcpy(other, addr, sizeof(other));
    for (char *p = other + 6; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    if (strcmp(other, addr) != 0) { /* a letter among the digits: all but 1 in 3 million */
        assert_int_equal(ferry_consumer_connect(other, 0, -1, &c), FERRY_INVALID_ARGUMENT);
        assert_non_null(strstr(ferry_last_error(), "is not a ferry address"));
    }
    memcpy(other, addr, sizeof(other));
    memcpy(other, "FERRY", 5);
    assert_int_equal(ferry_consumer_connect(other, 0, -1, &c), FERRY_INVALID_ARGUMENT);
    assert_null(c);
    assert_int_equal(ferry_consumer_connect(addr, 2, -1, &c), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "ranks 0 to 1"));
    assert_null(c);
    /* a consumer made without connect has no ring */
    assert_int_equal(ferry_consumer_create(0, &c), FERRY_OK);
    ferry_descriptor d;
    size_t k;
    int fd;
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "ferry_consumer_connect"));
    assert_int_equal(ferry_consumer_fd(c, &fd), FERRY_INVALID_ARGUMENT);
    ferry_consumer_destroy(c);
    c = connect_rank(addr, 0);
    assert_int_equal(ferry_consumer_recv(c, 0, NULL, 1, &k), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_recv(NULL, 0, &d, 1, &k), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_send(NULL, NULL, NULL, 1, NULL, NULL, 0, NULL),
                     FERRY_INVALID_ARGUMENT);
    /* the descriptor API mixes with the channel: a published lease is not queued */
    uint8_t byte = 1;
    ferry_tensor t = ferry_tensor_bytes(1);
    assert_int_equal(ferry_pool_publish(pool, &t, &byte, 0, &d), FERRY_OK);
    expect_empty(c);
    assert_int_equal(ferry_consumer_ack_all(c, &d), FERRY_OK);
    ferry_consumer_destroy(c);
    ferry_pool_close(pool);
    char same[FERRY_ADDRESS_SIZE];
    assert_int_equal(ferry_pool_address(pool, same, sizeof(same)), FERRY_OK); /* it never changes */
    assert_string_equal(same, addr);
    assert_int_equal(send_stamped(pool, 8, 1, NULL, 0, NULL), FERRY_CLOSING);
    assert_int_equal(ferry_pool_drain(pool, 0), FERRY_CLOSING);
    ferry_pool_destroy(pool);
}

/* A poll fd is readable as soon as it is made (whatever happened while the producer was being
 * handed it: a close, or entries another thread took), and a TIMEOUT re-arms it. */
static void test_fd_readable_when_made(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c = connect_rank(addr, 0);
    int fd;
    assert_int_equal(ferry_consumer_fd(c, &fd), FERRY_OK);
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 1000), 1);
    expect_empty(c);
    assert_int_equal(poll(&p, 1, 0), 0);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* A ring entry that is not what the producer wrote (here: a lease of 4 parts of which one is
 * queued) is refused MALFORMED and dropped alone; the ring goes on working, and a receive
 * with timeout 0 after it returns at once. */
static void test_corrupt_entry_dropped(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c = connect_rank(addr, 0);
    ferry_descriptor d;
    assert_int_equal(send_stamped(pool, 64, 1, NULL, 0, &d), FERRY_OK);
    d.flags |= FERRY_DESC_FLAG_MULTI;
    d.part_count = 4;
    uint8_t forged[FERRY_DESCRIPTOR_SIZE];
    assert_int_equal(ferry_descriptor_encode(&d, forged), FERRY_OK);
    ferry__ring *ring = ferry__shm_ring(&c->bound->shm, 0);
    memcpy(ferry__ring_entry(ring, 4, ring->head), forged, sizeof(forged));
    size_t k;
    ferry_descriptor got[4];
    assert_int_equal(ferry_consumer_recv(c, 0, got, 4, &k), FERRY_MALFORMED);
    uint64_t start = ferry__now_ns();
    assert_int_equal(ferry_consumer_recv(c, 0, got, 4, &k), FERRY_TIMEOUT);
    assert_true(ferry__now_ns() - start < 100 * MS);
    assert_int_equal(ferry_consumer_ack_all(c, &d), FERRY_OK); /* the lease the entry named */
    assert_int_equal(send_stamped(pool, 64, 2, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 2);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* The producer signals the poll fds it is handed from its senders and its broker: a fd that
 * is not an eventfd (a pipe, whose writes may block) is refused, and nothing hangs. */
static void test_notify_takes_only_eventfds(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 4);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    ferry_consumer *c = connect_rank(addr, 0);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    ferry__mapped_pool *p = c->bound;
    assert_int_equal(
        ferry__broker_notify(p->broker, p->pool_id, 0, "pool broker", 2000 * MS, pipefd[1]),
        FERRY_INVALID_ARGUMENT);
    assert_int_equal(send_stamped(pool, 64, 3, NULL, 0, NULL), FERRY_OK);
    recv_check(c, 3);
    close(pipefd[0]);
    close(pipefd[1]);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connect_before_and_after_send),
        cmocka_unit_test(test_ranks_and_ranges),
        cmocka_unit_test(test_packed_send),
        cmocka_unit_test(test_full_ring_policies),
        cmocka_unit_test(test_send_waits_alone),
        cmocka_unit_test(test_poll_several_pools),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_producer_killed),
        cmocka_unit_test(test_receiver_killed_and_restarted),
        cmocka_unit_test(test_takeover_clears_sleepers),
        cmocka_unit_test(test_threads_share_a_rank),
        cmocka_unit_test(test_close_drains),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_connect_out_of_fds_claims_nothing),
        cmocka_unit_test(test_fd_readable_when_made),
        cmocka_unit_test(test_corrupt_entry_dropped),
        cmocka_unit_test(test_notify_takes_only_eventfds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
