/* Rank liveness (src/pool/ranks.c) with real processes (the binary re-runs itself as
 * helpers): a takeover settles by what the dead process took off its ring, and running out
 * of file descriptors on either side is never taken for a death. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/proc.h"
#include "ferry.h"
#include "helpers.h"
#include "procs.h"

#define MS       (1000000ull)
#define END_SEED 0xe4du /* the last item a receiver helper reads */

/* ---- holding a process at its file descriptor limit --------------------------------------- */

typedef struct fd_jam {
    struct rlimit saved;
    int fds[4096];
    int n;
} fd_jam;

/* The highest descriptor open in this process. */
static int highest_fd(void)
{
    int top = 2;
    DIR *dir = opendir("/proc/self/fd");
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));)
        if (atoi(e->d_name) > top)
            top = atoi(e->d_name);
    closedir(dir);
    return top;
}

/* Lowers the soft limit to just above the descriptors in use and takes every one left:
 * nothing in this process can open a file, a socket or /proc until jam_release. */
static void jam_fds(fd_jam *j)
{
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &j->saved), 0);
    struct rlimit low = {(rlim_t)highest_fd() + 16, j->saved.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    j->n = 0;
    int fd;
    while (j->n < 4096 && (fd = dup(2)) >= 0)
        j->fds[j->n++] = fd;
    assert_int_equal(errno, EMFILE);
    assert_true(open("/proc/self/stat", O_RDONLY) < 0);
}

static void jam_release(fd_jam *j)
{
    while (j->n)
        close(j->fds[--j->n]);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &j->saved), 0);
}

static ferry_pool *make_pool(int64_t consumers, int64_t reclaim_interval_us)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 1 << 20;
    c.consumer_count = consumers;
    c.max_inflight_slices = 64;
    c.channel_depth = 8;
    c.reclaim_interval_us = reclaim_interval_us;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool: %s", ferry_last_error());
    return pool;
}

static void address_of(ferry_pool *pool, char addr[FERRY_ADDRESS_SIZE])
{
    assert_int_equal(ferry_pool_address(pool, addr, FERRY_ADDRESS_SIZE), FERRY_OK);
}

/* Sends one stamped item of n bytes to every rank. */
static ferry_status send_stamped(ferry_pool *pool, size_t n, uint64_t seed, uint64_t timeout_ns)
{
    uint8_t *buf = malloc(n);
    th_stamp(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    const void *src = buf;
    ferry_status st = ferry_pool_send(pool, &t, &src, 1, NULL, NULL, timeout_ns, NULL);
    free(buf);
    return st;
}

/* Receives, reads and checks one lease, and acknowledges it unless noack. */
static ferry_status take_one(ferry_consumer *c, uint64_t timeout_ns, int noack, uint64_t *seed)
{
    static uint8_t buf[1 << 16];
    ferry_descriptor d;
    size_t k = 0;
    ferry_status st = ferry_consumer_recv(c, timeout_ns, &d, 1, &k);
    if (st == FERRY_OK)
        st = ferry_consumer_read(c, &d, buf, sizeof(buf), 2000 * MS);
    if (st != FERRY_OK)
        return st;
    th_check_stamp(buf, d.length, 0, seed);
    if (!th_check_stamp(buf, d.length, *seed, NULL))
        return FERRY_MISMATCH;
    return noack ? FERRY_OK : ferry_consumer_ack(c, &d);
}

/* ---- helper processes ------------------------------------------------------------------ */

/* "taker ADDR RANK": connects, reports, takes one lease off the ring without acknowledging
 * it, reports its seed, then sleeps until killed. "late ADDR RANK": waits for a DONE message
 * first (it starts before the leases it will be handed are published), then connects and
 * receives until the ring stays empty for 300 ms, reporting how many leases it verified and
 * the sum of their seeds in the text; it lives on until a second DONE. */
static _Noreturn void taker_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    th_report(st, 0);
    uint64_t seed = 0;
    if (st == FERRY_OK)
        st = take_one(c, 5000 * MS, 1, &seed);
    th_report(st, seed);
    for (;;)
        pause();
}

static int late_main(const char *addr, uint32_t rank)
{
    th_msg m;
    if (th_recv_msg(TH_CHANNEL_FD, &m, 30000) != 0)
        return 1;
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    uint64_t n = 0, sum = 0, seed;
    while (st == FERRY_OK && (st = take_one(c, 300 * MS, 0, &seed)) == FERRY_OK) {
        n++;
        sum += seed;
    }
    th_msg r = {.type = TH_MSG_RESULT, .status = st == FERRY_TIMEOUT ? FERRY_OK : st, .seed = n};
    snprintf(r.text, sizeof(r.text), "%llu %s", (unsigned long long)sum, ferry_last_error());
    th_send_msg(TH_CHANNEL_FD, &r);
    th_recv_msg(TH_CHANNEL_FD, &m, 30000);
    ferry_consumer_destroy(c);
    return 0;
}

/* "jammed ADDR RANK": connects and reports, then holds itself at its file descriptor limit:
 * a receive that finds nothing within 50 ms (the producer's liveness is looked at meanwhile)
 * is reported, then it receives, reads and acknowledges the leases it is sent, the first
 * ones still at its limit (it lets go of it when it sees the seed 1000), until the END item;
 * reports how many it verified (END excluded). */
static int jammed_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, -1, &c);
    th_report(st, 0);
    if (st != FERRY_OK)
        return 1;
    fd_jam jam;
    jam_fds(&jam);
    ferry_descriptor d;
    size_t k;
    st = ferry_consumer_recv(c, 50 * MS, &d, 1, &k);
    th_report(st == FERRY_TIMEOUT ? FERRY_OK : st == FERRY_OK ? FERRY_SYSTEM : st, 0);
    uint64_t verified = 0, seed = 0;
    while ((st = take_one(c, 5000 * MS, 0, &seed)) == FERRY_OK && seed != END_SEED) {
        verified++;
        if (seed == 1000)
            jam_release(&jam);
    }
    th_report(st, verified);
    ferry_consumer_destroy(c);
    return 0;
}

static int helper_main(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    uint32_t rank = (uint32_t)strtoul(argv[4], NULL, 10);
    if (strcmp(argv[2], "taker") == 0)
        taker_main(argv[3], rank);
    if (strcmp(argv[2], "late") == 0)
        return late_main(argv[3], rank);
    if (strcmp(argv[2], "jammed") == 0)
        return jammed_main(argv[3], rank);
    return 2;
}

static th_msg expect_msg(th_helper *h, const char *what)
{
    th_msg m;
    if (th_recv_msg(h->fd, &m, 10000) != 0)
        fail_msg("no word from the %s helper", what);
    if (m.status != FERRY_OK)
        fail_msg("%s helper failed with %u: %s", what, m.status, m.text);
    return m;
}

/* ---- defect 2: a takeover settles by the ring's head -------------------------------------- */

/* Rank 0's process takes lease 1 off its ring and dies without acknowledging it; lease 2 is
 * still queued. Its successor started before either was published (no background look at
 * liveness meanwhile). Taking the rank over acknowledges lease 1 on the dead process's
 * behalf (it took it: the ring's head says so) and leaves lease 2 to the successor, which
 * receives it: nothing is left in flight. */
static void test_takeover_settles_by_head(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 3600ll * 1000000);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    th_helper late = th_spawn_helper("late", addr, "0");
    th_helper taker = th_spawn_helper("taker", addr, "0");
    expect_msg(&taker, "taker");
    usleep(100000); /* clear of /proc's ticks: both leases are younger than the successor */
    assert_int_equal(send_stamped(pool, 100, 1, 0), FERRY_OK);
    assert_int_equal(expect_msg(&taker, "taker").seed, 1); /* taken, not acknowledged */
    assert_int_equal(send_stamped(pool, 100, 2, 0), FERRY_OK);
    kill(taker.pid, SIGKILL);
    th_reap_helper(&taker);
    th_send_type(late.fd, TH_MSG_DONE);
    th_msg m = expect_msg(&late, "successor");
    assert_int_equal(m.seed, 1);
    assert_int_equal(strtoull(m.text, NULL, 10), 2); /* lease 2 reached the successor */
    th_wait_drained(pool); /* lease 1 was settled (the successor still lives) */
    th_send_type(late.fd, TH_MSG_DONE);
    th_reap_helper(&late);
    ferry_pool_destroy(pool);
}

/* ---- defect 3: out of file descriptors is not dead ----------------------------------------- */

/* A liveness check that cannot read /proc says so (an error), never "dead"; a pidfd taken
 * beforehand answers without a descriptor. */
static void test_check_error_is_no_verdict(void **state)
{
    (void)state;
    int pidfd = ferry__proc_watch(getpid());
    assert_true(pidfd >= 0);
    fd_jam jam;
    jam_fds(&jam);
    errno = 0;
    assert_int_equal(ferry__proc_check(getpid(), 0, -1), -1);
    assert_int_equal(errno, EMFILE);
    assert_int_equal(ferry__proc_check(getpid(), 0, pidfd), 1);
    jam_release(&jam);
    assert_int_equal(ferry__proc_check(getpid(), ferry__proc_starttime(getpid()), -1), 1);
    close(pidfd);
}

/* The producer and a consumer both held at their file descriptor limit for a while (the
 * producer looks at its ranks' liveness every millisecond meanwhile, the consumer at the
 * producer's), then released: the rank is never taken for dead, no lease is acknowledged on
 * its behalf, every message arrives; a receive with nothing to take says TIMEOUT, not
 * PRODUCER_GONE. */
static void test_fd_limit_loses_nothing(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 1000);
    char addr[FERRY_ADDRESS_SIZE];
    address_of(pool, addr);
    th_helper rx = th_spawn_helper("jammed", addr, "0");
    expect_msg(&rx, "jammed receiver"); /* connected */
    expect_msg(&rx, "jammed receiver"); /* at its limit, and its receive timed out */
    fd_jam jam;
    jam_fds(&jam);
    usleep(50000);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.consumers_alive, 1);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        assert_int_equal(send_stamped(pool, 100, seed, 1000 * MS), FERRY_OK);
        usleep(5000);
    }
    assert_int_equal(th_stats(pool).consumers_alive, 1);
    jam_release(&jam);
    assert_int_equal(send_stamped(pool, 100, 1000, 1000 * MS), FERRY_OK);
    assert_int_equal(send_stamped(pool, 100, 1001, 1000 * MS), FERRY_OK);
    assert_int_equal(send_stamped(pool, 100, END_SEED, 1000 * MS), FERRY_OK);
    th_assert_result(th_finish_helper(&rx, 10000), 22);
    s = th_stats(pool);
    assert_int_equal(s.acked_for_dead, 0);
    th_wait_drained(pool);
    ferry_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takeover_settles_by_head),
        cmocka_unit_test(test_check_error_is_no_verdict),
        cmocka_unit_test(test_fd_limit_loses_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
