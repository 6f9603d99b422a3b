/* ferry's safety contract under the uses servers make of it: reads raced by acknowledgements
 * on behalf, one live process per rank, restarts, forks, packed leases received part by
 * part, forged ranges, a consumer that outlives its pools, timeouts. Real processes where
 * processes are in the story (the test binary re-runs itself as helpers). */
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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker/broker.h"
#include "common/clock.h"
#include "consumer/consumer.h"
#include "ferry.h"
#include "helpers.h"
#include "procs.h"

#define MS (1000000ull)

static ferry_pool_config host_config(int64_t size, int64_t consumers, int64_t inflight)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = size;
    c.consumer_count = consumers;
    c.max_inflight_slices = inflight;
    return c;
}

static ferry_pool *make_pool(ferry_pool_config c)
{
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool: %s", ferry_last_error());
    return pool;
}

static ferry_descriptor publish_stamped(ferry_pool *pool, size_t n, uint64_t seed)
{
    uint8_t *buf = malloc(n ? n : 1);
    th_stamp(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    ferry_descriptor d;
    ferry_status st = ferry_pool_publish(pool, &t, buf, FERRY_WAIT_FOREVER, &d);
    free(buf);
    if (st != FERRY_OK)
        fail_msg("publish: %s", ferry_last_error());
    return d;
}

static ferry_consumer *consumer(uint32_t rank)
{
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_create(rank, &c), FERRY_OK);
    return c;
}

/* ---- helper processes ------------------------------------------------------------------ */

/* "claim RANK": reads the first item as RANK (claiming it), reports, then holds on until DONE
 * or until killed. "open RANK": opens the item's pool as RANK (claiming it), reports, holds.
 * "ackall RANK": acknowledges the item for every rank (a group leader), reports, holds. */
static int claimer_main(const char *mode, uint32_t rank)
{
    ferry_consumer *c = NULL;
    th_msg m;
    ferry_descriptor d;
    uint8_t buf[4096];
    ferry_status st = ferry_consumer_create(rank, &c);
    if (st == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &m, 60000) != 0)
        st = FERRY_SYSTEM;
    if (st == FERRY_OK)
        st = ferry_descriptor_decode(m.desc, sizeof(m.desc), &d);
    if (st == FERRY_OK && strcmp(mode, "claim") == 0)
        st = ferry_consumer_read(c, &d, buf, sizeof(buf), 10000 * MS);
    else if (st == FERRY_OK && strcmp(mode, "ackall") == 0)
        st = ferry_consumer_ack_all(c, &d);
    else if (st == FERRY_OK)
        st = ferry_consumer_open(c, &d);
    th_report(st, 1);
    while (th_recv_msg(TH_CHANNEL_FD, &m, 60000) == 0 && m.type != TH_MSG_DONE)
        ;
    ferry_consumer_destroy(c);
    return 0;
}

static int helper_main(int argc, char **argv)
{
    if (argc >= 5)
        return claimer_main(argv[2], (uint32_t)atoi(argv[4]));
    return 2;
}

/* A helper that has claimed rank with the lease d (read or opened), alive until killed. */
static th_helper spawn_claimer(const char *mode, const char *rank, const ferry_descriptor *d)
{
    th_helper h = th_spawn_helper(mode, mode, rank);
    th_send_item(h.fd, d, 0, 0);
    th_msg m;
    assert_int_equal(th_recv_msg(h.fd, &m, 30000), 0);
    if (m.status != FERRY_OK)
        fail_msg("helper could not %s rank %s: %s", mode, rank, m.text);
    return h;
}

static void kill_helper(th_helper *h)
{
    kill(h->pid, SIGKILL);
    th_reap_helper(h);
}

/* ---- 1: a read torn by an acknowledgement on the reader's behalf ----------------------- */

/* Rank 0 reads a large lease while a group leader acknowledges every rank; the next lease
 * reuses the freed extent (the pool holds one such lease) under another slot, whose
 * generation the reader never sees change. A read may end OK only with its own lease's
 * bytes. */
static void test_read_not_torn_by_ack_on_behalf(void **state)
{
    (void)state;
    const size_t n = 4 << 20;
    ferry_pool_config cfg = host_config((int64_t)n + (1 << 20), 2, 8);
    cfg.reclaim_interval_us = 3600ll * 1000000; /* only publishes reclaim */
    ferry_pool *pool = make_pool(cfg);
    ferry_consumer *c0 = consumer(0), *leader = consumer(1);
    th_reader r = {.c = c0, .buf = malloc(n), .n = n};
    uint8_t *next = malloc(n);
    unsigned rounds = (unsigned)th_scaled(200, 20), torn = 0, stale = 0, ok = 0;
    ferry_descriptor d = publish_stamped(pool, n, 1);
    for (unsigned k = 1; k <= rounds; k++) {
        th_stamp(next, n, k + 1);
        r.d = d;
        r.started = 0;
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, th_read_main, &r), 0);
        while (!__atomic_load_n(&r.started, __ATOMIC_ACQUIRE))
            ;
        usleep((useconds_t)(rand() % 300));
        assert_int_equal(ferry_consumer_ack_all(leader, &d), FERRY_OK);
        d = th_reserve_backwards(pool, next, n, FERRY_WAIT_FOREVER);
        pthread_join(t, NULL);
        if (r.st == FERRY_OK) {
            uint64_t found;
            ok++;
            torn += !th_check_stamp(r.buf, n, k, &found);
        } else {
            assert_int_equal(r.st, FERRY_STALE);
            stale++;
        }
    }
    print_message("reads: %u ok, %u stale, %u torn\n", ok, stale, torn);
    assert_int_equal(torn, 0);
    free(next);
    free(r.buf);
    ferry_consumer_destroy(c0);
    ferry_consumer_destroy(leader);
    ferry_pool_destroy(pool);
}

/* ---- 2, 3, 14: one live process per rank; acks on behalf; restarts ------------------------ */

static void test_rank_held_by_one_live_process(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 2, 16);
    cfg.reclaim_interval_us = 3600ll * 1000000; /* the takeover alone decides, not the reaper */
    ferry_pool *pool = make_pool(cfg);
    ferry_descriptor d = publish_stamped(pool, 1000, 7);
    th_helper h = spawn_claimer("claim", "0", &d);
    ferry_consumer *c = consumer(0);
    uint8_t buf[1000];
    const void *view;
    char want[96];
    snprintf(want, sizeof(want), "rank 0 is held by live process %d", (int)h.pid);
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS), FERRY_RANK_IN_USE);
    assert_non_null(strstr(ferry_last_error(), want));
    assert_int_equal(ferry_consumer_view(c, &d, &view, 1000 * MS), FERRY_RANK_IN_USE);
    assert_int_equal(ferry_consumer_open(c, &d), FERRY_RANK_IN_USE);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_int_equal(info.pid, h.pid);
    /* Its process dies: the rank may be taken over (a restarted worker). This process is
     * older than the lease, which may have been sent to it: the lease is left to it. */
    kill_helper(&h);
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS), FERRY_OK);
    assert_true(th_check_stamp(buf, sizeof(buf), 7, NULL));
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_int_equal(info.pid, getpid());
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* A process acknowledging on behalf of other ranks claims none: neither the ranks it acks nor
 * the rank of the consumer object it acks with. Once the real rank-0 process dies, its leases
 * are still acknowledged for it. */
static void test_ack_on_behalf_claims_nothing(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 2, 16);
    cfg.reclaim_interval_us = 1000;
    ferry_pool *pool = make_pool(cfg);
    ferry_descriptor d = publish_stamped(pool, 1000, 1);
    th_helper h = spawn_claimer("claim", "0", &d);
    ferry_consumer *c = consumer(0); /* rank 0 in this process, never reading */
    assert_int_equal(ferry_consumer_ack_range(c, &d, 1, 1), FERRY_OK);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_int_equal(info.pid, h.pid);
    assert_int_equal(ferry_pool_consumer_info(pool, 1, &info), FERRY_OK);
    assert_int_equal(info.attached, 0);
    kill_helper(&h);
    ferry_descriptor e = publish_stamped(pool, 1000, 2);
    assert_int_equal(ferry_consumer_ack_range(c, &e, 1, 1), FERRY_OK);
    th_wait_drained(pool);
    assert_true(th_stats(pool).acked_for_dead >= 2);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* Leases published after rank 0's process died but before anybody noticed are settled when a
 * replacement takes the rank over: none is left waiting while the replacement lives. Leases
 * published after the replacement started (it may be sent them before it claims the rank)
 * are left to it. */
static void test_restarted_rank_settles_orphans(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 1, 64);
    cfg.reclaim_interval_us = 3600ll * 1000000; /* no background look at liveness */
    ferry_pool *pool = make_pool(cfg);
    ferry_descriptor first = publish_stamped(pool, 100, 1);
    th_helper h = spawn_claimer("claim", "0", &first);
    kill_helper(&h);
    ferry_descriptor last = first;
    for (int i = 0; i < 20; i++)
        last = publish_stamped(pool, 100, (uint64_t)i + 2);
    usleep(100000); /* clear of /proc's 10 ms ticks between the last lease and the new process */
    th_helper again = th_spawn_helper("open", "open", "0");
    usleep(100000);
    ferry_descriptor early[3];
    for (int i = 0; i < 3; i++)
        early[i] = publish_stamped(pool, 100, (uint64_t)i + 50);
    th_send_item(again.fd, &early[0], 0, 0); /* now it opens the pool, claiming rank 0 */
    th_msg m;
    assert_int_equal(th_recv_msg(again.fd, &m, 30000), 0);
    assert_int_equal(m.status, FERRY_OK);
    uint64_t n = 0;
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    assert_int_equal(n, 21);
    assert_int_equal(th_stats(pool).leases_in_flight, 3); /* the replacement's to read */
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_int_equal(info.pid, again.pid);
    assert_int_equal(info.alive, 1);
    assert_int_equal(info.outstanding, 3);
    (void)last;
    th_send_type(again.fd, TH_MSG_DONE);
    th_reap_helper(&again);
    ferry_pool_destroy(pool);
}

/* ---- 4: fork ------------------------------------------------------------------------- */

static int child_checks(ferry_pool *pool, ferry_consumer *parents, const ferry_descriptor *d)
{
    uint8_t buf[1000];
    ferry_descriptor out;
    ferry_tensor t = ferry_tensor_bytes(10);
    if (ferry_pool_publish(pool, &t, buf, 0, &out) != FERRY_FORKED ||
        !strstr(ferry_last_error(), "forked child"))
        return 10;
    if (ferry_pool_reclaim(pool, NULL) != FERRY_FORKED)
        return 11;
    if (ferry_consumer_read(parents, d, buf, sizeof(buf), 0) != FERRY_FORKED)
        return 12;
    ferry_consumer *mine = NULL;
    if (ferry_consumer_create(1, &mine) != FERRY_OK ||
        ferry_consumer_read(mine, d, buf, sizeof(buf), 5000 * MS) != FERRY_OK ||
        !th_check_stamp(buf, sizeof(buf), 5, NULL) || ferry_consumer_ack(mine, d) != FERRY_OK)
        return 13;
    ferry_consumer_destroy(mine);
    ferry_pool_destroy(pool); /* releases the child's copies only, and returns */
    return 0;
}

static void test_fork_child_refused_parent_unharmed(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 2, 16);
    ferry_pool *pool = make_pool(cfg);
    ferry_consumer *c = consumer(0);
    ferry_descriptor d = publish_stamped(pool, 1000, 5);
    assert_int_equal(ferry_consumer_open(c, &d), FERRY_OK);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(child_checks(pool, c, &d));
    int status = -1;
    for (int i = 0; i < 10000 && waitpid(child, &status, WNOHANG) == 0; i++)
        usleep(1000);
    if (status == -1) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        fail_msg("the forked child hung");
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The parent's pool, broker and slots are its own still. */
    ferry_descriptor e = publish_stamped(pool, 1000, 6);
    assert_true(e.slot != d.slot || e.generation != d.generation);
    uint8_t buf[1000];
    assert_int_equal(ferry_consumer_read(c, &e, buf, sizeof(buf), 5000 * MS), FERRY_OK);
    assert_true(th_check_stamp(buf, sizeof(buf), 6, NULL));
    th_helper h = spawn_claimer("open", "1", &e); /* the child's rank 1, taken over */
    kill_helper(&h);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- 5: a slot's committed flag belongs to its lease ------------------------------------ */

typedef struct committer {
    ferry_pool *pool;
    unsigned rounds;
    unsigned failed; /* commits refused */
} committer;

static void *publish_loop(void *arg)
{
    committer *k = arg;
    for (unsigned i = 0; i < k->rounds; i++)
        publish_stamped(k->pool, 64, i);
    return NULL;
}

/* The only rank is dead, so every lease is acknowledged for it as soon as it is ready, while
 * another thread reserves and commits the same slots. */
static void test_commit_flag_not_inherited(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 16, 1, 2);
    cfg.reclaim_interval_us = 100;
    ferry_pool *pool = make_pool(cfg);
    ferry_descriptor d = publish_stamped(pool, 64, 0);
    th_helper h = spawn_claimer("claim", "0", &d);
    kill_helper(&h);
    committer k = {.pool = pool, .rounds = (unsigned)th_scaled(3000, 300)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, publish_loop, &k), 0);
    ferry_tensor tensor = ferry_tensor_bytes(64);
    for (unsigned i = 0; i < k.rounds; i++) {
        void *data;
        ferry_descriptor r;
        assert_int_equal(ferry_pool_reserve(pool, &tensor, FERRY_WAIT_FOREVER, &data, &r),
                         FERRY_OK);
        th_stamp(data, 64, i);
        if (ferry_pool_commit(pool, &r) != FERRY_OK)
            k.failed++;
    }
    pthread_join(t, NULL);
    assert_int_equal(k.failed, 0);
    th_wait_drained(pool);
    ferry_pool_destroy(pool);
}

/* ---- 7: a consumer does not pin the pools it opened -------------------------------------- */

static int pool_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, "ferry-pool") != NULL;
    if (f)
        fclose(f);
    return n;
}

static void test_consumer_releases_gone_pools(void **state)
{
    (void)state;
    ferry_consumer *c = consumer(0);
    ferry__cache_sweep(); /* pools of the tests before */
    int before = pool_mappings();
    for (int i = 0; i < 20; i++) {
        ferry_pool *pool = make_pool(host_config(1 << 16, 1, 8));
        ferry_descriptor d = publish_stamped(pool, 100, (uint64_t)i);
        uint8_t buf[100];
        const void *view;
        assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS), FERRY_OK);
        assert_int_equal(ferry_consumer_view(c, &d, &view, 1000 * MS), FERRY_OK);
        assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK); /* ends the view */
        ferry_pool_destroy(pool);
    }
    ferry__cache_sweep();
    /* Only the views and calls in progress keep a gone pool: none here. */
    assert_int_equal(pool_mappings(), before);
    /* A view not acknowledged keeps its pool mapped until its acknowledgement. */
    ferry_pool *pool = make_pool(host_config(1 << 16, 1, 8));
    ferry_descriptor d = publish_stamped(pool, 100, 99);
    const void *view;
    assert_int_equal(ferry_consumer_view(c, &d, &view, 1000 * MS), FERRY_OK);
    ferry_pool_destroy(pool);
    ferry__cache_sweep();
    assert_int_equal(pool_mappings(), before + 1);
    assert_true(th_check_stamp(view, 100, 99, NULL));
    /* Nobody reads the acknowledgement of a gone pool, but it ends the view. */
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_PRODUCER_GONE);
    assert_non_null(strstr(ferry_last_error(), "only ended its views"));
    assert_int_equal(pool_mappings(), before);
    /* A view whose rank another process acknowledged, its slot reused since (and that lease
     * acknowledged by this rank): this process's own ack then answers STALE, and still ends
     * the view. */
    pool = make_pool(host_config(1 << 16, 1, 1));
    d = publish_stamped(pool, 100, 98);
    assert_int_equal(ferry_consumer_view(c, &d, &view, 1000 * MS), FERRY_OK);
    th_helper leader = spawn_claimer("ackall", "0", &d);
    ferry_descriptor again = publish_stamped(pool, 100, 97); /* the same slot, reclaimed */
    assert_int_equal(again.slot, d.slot);
    uint8_t buf[100];
    assert_int_equal(ferry_consumer_read(c, &again, buf, sizeof(buf), 1000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c, &again), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_STALE);
    th_send_type(leader.fd, TH_MSG_DONE);
    th_reap_helper(&leader);
    ferry_pool_destroy(pool);
    ferry__cache_sweep();
    assert_int_equal(pool_mappings(), before);
    ferry_consumer_destroy(c);
}

/* ---- 12: parts of a packed lease, one by one ---------------------------------------------- */

static void test_packed_parts_one_by_one(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 1, 16);
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = make_pool(cfg);
    uint8_t a[100], b[200], cc[300];
    th_stamp(a, sizeof(a), 1);
    th_stamp(b, sizeof(b), 2);
    th_stamp(cc, sizeof(cc), 3);
    ferry_tensor t[3] = {ferry_tensor_bytes(100), ferry_tensor_bytes(200), ferry_tensor_bytes(300)};
    const void *srcs[3] = {a, b, cc};
    ferry_descriptor d[3];
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 3, 0, d), FERRY_OK);
    ferry_consumer *c = consumer(0);
    uint8_t buf[300];
    uint64_t n;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(d[i].part_count, 3);
        assert_int_equal(d[i].part_index, (uint32_t)i);
    }
    /* Each part read and acknowledged on its own; the lease stays until the last. */
    int order[3] = {1, 2, 0};
    for (int k = 0; k < 3; k++) {
        int i = order[k];
        uint8_t wire[FERRY_DESCRIPTOR_SIZE];
        ferry_descriptor w;
        assert_int_equal(ferry_descriptor_encode(&d[i], wire), FERRY_OK);
        assert_int_equal(ferry_descriptor_decode(wire, sizeof(wire), &w), FERRY_OK);
        assert_int_equal(ferry_consumer_read(c, &w, buf, sizeof(buf), 1000 * MS), FERRY_OK);
        assert_true(th_check_stamp(buf, w.length, (uint64_t)i + 1, NULL));
        assert_int_equal(ferry_consumer_ack(c, &w), FERRY_OK);
        assert_int_equal(ferry_consumer_ack(c, &w), FERRY_STALE); /* that part, twice */
        /* and read again while the lease is current for the rank: STALE too, as a lease */
        assert_int_equal(ferry_consumer_read(c, &w, buf, sizeof(buf), 0), FERRY_STALE);
        if (k < 2)
            assert_non_null(strstr(ferry_last_error(), "part"));
        assert_int_equal(ferry_consumer_wait(c, &w, 0), FERRY_STALE);
        assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
        assert_int_equal(th_stats(pool).leases_in_flight, k < 2 ? 1 : 0);
    }
    assert_int_equal(ferry_consumer_read(c, &d[0], buf, sizeof(buf), 0), FERRY_STALE);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- a packed lease released whole through any one part --------------------------------- */

static void publish_three(ferry_pool *pool, ferry_descriptor d[3])
{
    uint8_t a[100], b[200], cc[300];
    th_stamp(a, sizeof(a), 1);
    th_stamp(b, sizeof(b), 2);
    th_stamp(cc, sizeof(cc), 3);
    ferry_tensor t[3] = {ferry_tensor_bytes(100), ferry_tensor_bytes(200), ferry_tensor_bytes(300)};
    const void *srcs[3] = {a, b, cc};
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 3, 0, d), FERRY_OK);
}

static uint64_t in_flight(ferry_pool *pool)
{
    uint64_t n;
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    return th_stats(pool).leases_in_flight;
}

/* A leader that acknowledges a packed lease through one part's descriptor for every rank
 * acknowledges that part only: the lease stays, and the pool says so (consumer_info, the
 * pool-full message). The whole-lease calls release it through any part, for a range, every
 * rank or one (the parts it read already included); for a lease of one tensor they are the
 * plain calls. */
static void test_whole_lease_through_any_part(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 4, 1);
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = make_pool(cfg);
    ferry_descriptor d[3];
    publish_three(pool, d);
    th_helper leader = spawn_claimer("ackall", "0", &d[1]); /* ack_all through part 1 */
    assert_int_equal(in_flight(pool), 1);
    for (uint32_t r = 0; r < 4; r++) {
        ferry_consumer_info info = th_consumer_info(pool, r);
        assert_int_equal(info.outstanding, 1);
        assert_int_equal(info.partly_acknowledged, 1);
    }
    ferry_descriptor full;
    ferry_tensor t = ferry_tensor_bytes(64);
    uint8_t src[64] = {0};
    assert_int_equal(ferry_pool_publish(pool, &t, src, 0, &full), FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), "holds 1 leases (1 partly acknowledged"));
    kill_helper(&leader);

    ferry_consumer *c = consumer(0);
    assert_int_equal(ferry_consumer_ack_lease_range(c, &d[2], 0, 2), FERRY_OK);
    assert_int_equal(th_consumer_info(pool, 1).outstanding, 0);
    assert_int_equal(th_consumer_info(pool, 2).partly_acknowledged, 1);
    assert_int_equal(ferry_consumer_ack_lease_all(c, &d[0]), FERRY_OK);
    assert_int_equal(in_flight(pool), 0);
    assert_int_equal(ferry_consumer_ack_lease_all(c, &d[0]), FERRY_STALE);
    assert_int_equal(ferry_consumer_ack_lease(c, &d[1]), FERRY_STALE);

    /* One rank: a part read and acknowledged, then the rest released through that part. */
    publish_three(pool, d);
    ferry_consumer *c1 = consumer(1);
    uint8_t buf[300];
    assert_int_equal(ferry_consumer_read(c1, &d[0], buf, sizeof(buf), 1000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c1, &d[0]), FERRY_OK);
    assert_int_equal(th_consumer_info(pool, 1).partly_acknowledged, 1);
    assert_int_equal(ferry_consumer_ack_lease(c1, &d[0]), FERRY_OK);
    ferry_consumer_info one = th_consumer_info(pool, 1);
    assert_int_equal(one.outstanding, 0);
    assert_int_equal(one.partly_acknowledged, 0);
    assert_int_equal(ferry_consumer_read(c1, &d[2], buf, sizeof(buf), 0), FERRY_STALE);
    assert_int_equal(ferry_consumer_ack_lease_all(c, &d[1]), FERRY_OK); /* the other ranks */
    assert_int_equal(in_flight(pool), 0);

    /* A lease of one tensor. */
    ferry_descriptor e = publish_stamped(pool, 64, 9);
    assert_int_equal(ferry_consumer_ack_lease(c, &e), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_lease(c, &e), FERRY_STALE);
    assert_int_equal(ferry_consumer_ack_lease_range(c, &e, 1, 3), FERRY_OK);
    assert_int_equal(in_flight(pool), 0);

    /* Bad input changes nothing. */
    e = publish_stamped(pool, 64, 10);
    ferry_descriptor bad = e;
    bad.part_count = 2;
    bad.part_index = 2;
    assert_int_equal(ferry_consumer_ack_lease(c, &bad), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack_lease(NULL, &e), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack_lease_all(c, NULL), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_consumer_ack_lease_range(c, &e, 3, 2), FERRY_INVALID_ARGUMENT);
    assert_int_equal(in_flight(pool), 1);
    assert_int_equal(th_consumer_info(pool, 0).outstanding, 1);
    assert_int_equal(ferry_consumer_ack_lease_all(c, &e), FERRY_OK);
    assert_int_equal(in_flight(pool), 0);

    /* A caller of consumer_info version 1 gets the fields it has, and nothing past them. */
    struct {
        ferry_consumer_info info;
        uint64_t guard;
    } v1;
    memset(&v1, 0xAB, sizeof(v1));
    v1.info.struct_size = (uint32_t)offsetof(ferry_consumer_info, partly_acknowledged);
    v1.info.version = 1;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &v1.info), FERRY_OK);
    assert_int_equal(v1.info.outstanding, 0);
    assert_int_equal(v1.info.partly_acknowledged, 0xABABABABABABABABull);
    ferry_consumer_destroy(c1);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* A copy of a part that claims another part count than its lease's, for a range whose
 * second rank this process acknowledged a part for (part 150 of 200 against 3): MISMATCH at
 * the first rank, before anything is recorded for it (no part set, no mark), and the real
 * parts still release the lease. */
static void test_forged_part_count_changes_nothing(void **state)
{
    (void)state;
    ferry_pool_config cfg = host_config(1 << 20, 2, 4);
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = make_pool(cfg);
    ferry_descriptor d[3];
    publish_three(pool, d);
    ferry_consumer *c = consumer(0);
    assert_int_equal(ferry_consumer_ack_range(c, &d[0], 1, 1), FERRY_OK);
    ferry_descriptor forged = d[1];
    forged.part_index = 150;
    forged.part_count = 200;
    assert_int_equal(ferry_consumer_ack_range(c, &forged, 0, 2), FERRY_MISMATCH);
    assert_non_null(strstr(ferry_last_error(), "part 150 of 200 does not fit its lease"));
    assert_int_equal(th_consumer_info(pool, 0).partly_acknowledged, 0);
    assert_int_equal(th_consumer_info(pool, 1).partly_acknowledged, 1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ferry_consumer_ack_range(c, &d[i], 0, 2), FERRY_OK);
    assert_int_equal(in_flight(pool), 0);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* Two threads acknowledging the two parts of a lease at once: the one that acknowledges the
 * first marks the lease partly acknowledged, possibly after the other read the word; the
 * lease is acknowledged all the same (the last part replaces the mark). */
typedef struct part_acker {
    ferry_consumer *c;
    ferry_descriptor *d; /* the lease being acknowledged now */
    pthread_barrier_t *go;
    int rounds, bad;
} part_acker;

static void *part_acker_main(void *arg)
{
    part_acker *a = arg;
    for (int i = 0; i < a->rounds; i++) {
        pthread_barrier_wait(a->go);
        a->bad += ferry_consumer_ack(a->c, a->d) != FERRY_OK;
        pthread_barrier_wait(a->go);
    }
    return NULL;
}

static void test_parts_acknowledged_at_once(void **state)
{
    (void)state;
    enum { ROUNDS = 20000 };
    ferry_pool_config cfg = host_config(8 << 20, 1, 32768); /* room for every lease: no wait */
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = make_pool(cfg);
    ferry_consumer *c = consumer(0);
    ferry_descriptor d[2];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 3);
    part_acker ackers[2] = {{c, &d[0], &go, ROUNDS, 0}, {c, &d[1], &go, ROUNDS, 0}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, part_acker_main, &ackers[i]), 0);
    int left = 0;
    for (int i = 0; i < ROUNDS; i++) {
        uint8_t a[64] = {0}, b[64] = {0};
        ferry_tensor t[2] = {ferry_tensor_bytes(64), ferry_tensor_bytes(64)};
        const void *srcs[2] = {a, b};
        assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 2, 0, d), FERRY_OK);
        pthread_barrier_wait(&go); /* both acknowledge */
        pthread_barrier_wait(&go);
        left += in_flight(pool) != (uint64_t)left; /* one more left behind */
    }
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(ackers[0].bad + ackers[1].bad, 0);
    assert_int_equal(left, 0);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- 13: a well-formed descriptor whose range is another lease's ------------------------- */

static void test_forged_range_refused(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(host_config(1 << 20, 1, 16));
    ferry_descriptor a = publish_stamped(pool, 4096, 1);
    ferry_descriptor b = publish_stamped(pool, 4096, 2);
    ferry_consumer *c = consumer(0);
    ferry_descriptor forged = a;
    forged.offset = b.offset; /* re-encoded: a valid checksum */
    uint8_t wire[FERRY_DESCRIPTOR_SIZE];
    assert_int_equal(ferry_descriptor_encode(&forged, wire), FERRY_OK);
    assert_int_equal(ferry_descriptor_decode(wire, sizeof(wire), &forged), FERRY_OK);
    uint8_t buf[4096];
    const void *view;
    assert_int_equal(ferry_consumer_read(c, &forged, buf, sizeof(buf), 1000 * MS), FERRY_MISMATCH);
    assert_non_null(strstr(ferry_last_error(), "is not inside its lease"));
    assert_int_equal(ferry_consumer_view(c, &forged, &view, 1000 * MS), FERRY_MISMATCH);
    assert_int_equal(ferry_consumer_wait(c, &forged, 1000 * MS), FERRY_MISMATCH);
    forged = a;
    forged.offset = a.offset + 256; /* half in, half past its end */
    assert_int_equal(ferry_consumer_read(c, &forged, buf, sizeof(buf), 1000 * MS), FERRY_MISMATCH);
    /* The real descriptors still read their own bytes. */
    assert_int_equal(ferry_consumer_read(c, &a, buf, sizeof(buf), 1000 * MS), FERRY_OK);
    assert_true(th_check_stamp(buf, sizeof(buf), 1, NULL));
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- 16: a call's timeout bounds its open of the pool ------------------------------------ */

static void test_timeout_bounds_open(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(host_config(1 << 20, 1, 16));
    ferry_descriptor d = publish_stamped(pool, 100, 1);
    /* A broker name that accepts connections (the backlog) and never answers. */
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    for (int i = 0; i < 16; i++)
        d.broker[i] ^= 0x5a;
    d.pool_id[0] ^= 0x5a; /* not in the cache */
    unsigned len = ferry__broker_address(d.broker, &addr);
    assert_int_equal(bind(sock, (struct sockaddr *)&addr, len), 0);
    assert_int_equal(listen(sock, 16), 0);
    ferry_consumer *c = consumer(0);
    uint8_t buf[100];
    uint64_t start = ferry__now_ns();
    assert_int_equal(ferry_consumer_read(c, &d, buf, sizeof(buf), 100 * MS), FERRY_TIMEOUT);
    uint64_t took = ferry__now_ns() - start;
    print_message("a read with a 100 ms timeout on a silent broker returned after %.1f ms\n",
                  (double)took / 1e6);
    assert_true(took < 1000 * MS);
    start = ferry__now_ns();
    assert_int_equal(ferry_consumer_wait(c, &d, 0), FERRY_TIMEOUT);
    assert_true(ferry__now_ns() - start < 1000 * MS);
    close(sock);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* ---- 6: close against every other call (short; tests/test_threads.c races them) ---------- */

static void test_calls_after_close(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(host_config(1 << 20, 1, 16));
    ferry_descriptor d = publish_stamped(pool, 100, 1);
    ferry_pool_close(pool);
    ferry_pool_close(pool);
    ferry_pool_stats s = {.struct_size = sizeof(s), .version = FERRY_POOL_STATS_VERSION};
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    uint64_t n;
    int done;
    assert_int_equal(ferry_pool_stats_get(pool, &s), FERRY_CLOSING);
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_CLOSING);
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_CLOSING);
    assert_int_equal(ferry_pool_describe(pool, &d), FERRY_CLOSING);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_CLOSING);
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_CLOSING);
    assert_int_equal(ferry_pool_copied(pool, &d, &done), FERRY_OK);
    assert_int_equal(done, 1);
    ferry_pool_destroy(pool);
}

/* A stats struct of version 1 (built against an older header) is still served. */
static void test_stats_version_1(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(host_config(1 << 20, 1, 16));
    publish_stamped(pool, 100, 1);
    ferry_pool_stats s;
    memset(&s, 0xee, sizeof(s));
    s.struct_size = (uint32_t)offsetof(ferry_pool_stats, too_large);
    s.version = 1;
    assert_int_equal(ferry_pool_stats_get(pool, &s), FERRY_OK);
    assert_int_equal(s.publishes, 1);
    uint64_t untouched;
    memset(&untouched, 0xee, sizeof(untouched));
    assert_memory_equal(&s.too_large, &untouched, sizeof(untouched));
    s.version = 3;
    assert_int_equal(ferry_pool_stats_get(pool, &s), FERRY_INVALID_ARGUMENT);
    ferry_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_not_torn_by_ack_on_behalf),
        cmocka_unit_test(test_rank_held_by_one_live_process),
        cmocka_unit_test(test_ack_on_behalf_claims_nothing),
        cmocka_unit_test(test_restarted_rank_settles_orphans),
        cmocka_unit_test(test_fork_child_refused_parent_unharmed),
        cmocka_unit_test(test_commit_flag_not_inherited),
        cmocka_unit_test(test_consumer_releases_gone_pools),
        cmocka_unit_test(test_packed_parts_one_by_one),
        cmocka_unit_test(test_whole_lease_through_any_part),
        cmocka_unit_test(test_forged_part_count_changes_nothing),
        cmocka_unit_test(test_parts_acknowledged_at_once),
        cmocka_unit_test(test_forged_range_refused),
        cmocka_unit_test(test_timeout_bounds_open),
        cmocka_unit_test(test_calls_after_close),
        cmocka_unit_test(test_stats_version_1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
