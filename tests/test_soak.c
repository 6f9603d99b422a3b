/* Soak tests with real processes, the way a long-running server uses ferry: the test is the
 * producer, the test binary re-run as a helper is the consumer (procs.h).
 *
 * test_soak_handovers: 10^5 hand-overs of small tensors through one pool (publish, reserve +
 * commit, two-tensor packs), every byte checked by the consumer.
 *
 * test_soak_many_pools: one long-lived consumer that opens 1000 pools one after another, each
 * created and destroyed by the producer with a few hand-overs in between, as a model worker
 * sees tokenizer workers come and go.
 *
 * Both measure the consumer's footprint (open fds, mappings, RSS) after a warm-up and at the
 * end, print it, and require it flat: fds exactly, mappings within +4, RSS within 4 MiB.
 * Counts scale with th_stress_scale() (FERRY_STRESS_SCALE; less under sanitizers). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "consumer/consumer.h"
#include "ferry.h"
#include "helpers.h"
#include "procs.h"

#define MS       1000000ull
#define MIB      (1024.0 * 1024.0)
#define MAX_ITEM (16 * 1024)

/* ITEM flags, beside TH_ITEM_NOACK (read but do not acknowledge). */
#define SOAK_ITEM_SYNC 2u /* answer SOAK_MSG_SYNC once this item is acknowledged */
enum { SOAK_MSG_SYNC = 10 };

/* Tolerances of a flat footprint. Under the sanitizers the runtime's own memory grows with
 * the program's history (ASan's quarantine keeps freed memory resident, 5 MiB over 250
 * pools; TSan's shadow and history, 4.3 MiB over the hand-overs once in CI), so RSS is
 * printed but not checked there; LeakSanitizer checks for leaks instead. Nor under a
 * user-mode emulator (FERRY_TEST_EMULATOR: the aarch64 check), whose translated code counts
 * in the process's RSS; the fds and the mappings are still checked there. */
#define SOAK_MAPS_SLACK 4
#define SOAK_RSS_SLACK  (4 * 1024 * 1024ull)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SOAK_CHECK_RSS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SOAK_CHECK_RSS 0
#endif
#endif
#ifndef SOAK_CHECK_RSS
#define SOAK_CHECK_RSS 1
#endif

/* ---- footprint of a process -------------------------------------------------------------- */

typedef struct footprint {
    long fds;
    long maps;
    unsigned long long rss; /* bytes */
} footprint;

/* ferry's own threads open fds for a moment (the reclaimer reads /proc/<pid>/stat, the
 * broker accepts a connection): the fewest of a few looks is what the process holds. */
static long count_fds(void)
{
    long least = th_count_fds();
    for (int i = 0; i < 8; i++) {
        usleep(1000);
        long n = th_count_fds();
        if (n < least)
            least = n;
    }
    return least;
}

static long count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    long n = 0;
    int ch;
    if (!f)
        return -1;
    while ((ch = getc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}

static unsigned long long resident_bytes(void)
{
    unsigned long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return resident * (unsigned long long)sysconf(_SC_PAGESIZE);
}

static footprint footprint_now(void)
{
    footprint fp = {.fds = count_fds(), .maps = count_lines("/proc/self/maps")};
    fp.rss = resident_bytes();
    return fp;
}

static int rss_checked(void)
{
    const char *emulator = getenv("FERRY_TEST_EMULATOR");
    return SOAK_CHECK_RSS && !(emulator && *emulator);
}

static int footprint_flat(const footprint *a, const footprint *b)
{
    return b->fds == a->fds && b->maps <= a->maps + SOAK_MAPS_SLACK &&
           (!rss_checked() || b->rss <= a->rss + SOAK_RSS_SLACK);
}

static void print_footprint(const char *who, const char *what, const footprint *a,
                            const footprint *b)
{
    print_message("soak: %s %s fds %ld->%ld maps %ld->%ld rss %.1f->%.1f MiB%s\n", who, what,
                  a->fds, b->fds, a->maps, b->maps, (double)a->rss / MIB, (double)b->rss / MIB,
                  footprint_flat(a, b) ? (rss_checked() ? "" : " (RSS not checked here)")
                                       : "  (NOT FLAT)");
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- the consumer helper ------------------------------------------------------------------ */

typedef struct consumer_run {
    ferry_consumer *c;
    uint8_t *buf;
    uint64_t items;
    uint64_t pools; /* distinct pools seen, in order */
    uint8_t pool_id[16];
    footprint warm;
    char why[200]; /* the first failure */
} consumer_run;

/* Reads (or views, every other item: seeds go in steps of 4) one tensor and checks every
 * byte. */
static ferry_status consume_one(consumer_run *run, const ferry_descriptor *d, uint64_t seed)
{
    const void *data = run->buf;
    int view = (seed >> 2) & 1;
    ferry_status st = view ? ferry_consumer_view(run->c, d, &data, 10000 * MS)
                           : ferry_consumer_read(run->c, d, run->buf, MAX_ITEM, 10000 * MS);
    if (st != FERRY_OK) {
        snprintf(run->why, sizeof(run->why), "%s of seed %llu: %s: %.120s", view ? "view" : "read",
                 (unsigned long long)seed, ferry_status_name(st), ferry_last_error());
        return st;
    }
    if (!th_check_stamp(data, d->length, seed, NULL)) {
        snprintf(run->why, sizeof(run->why), "%s of seed %llu (%llu bytes): wrong bytes",
                 view ? "view" : "read", (unsigned long long)seed, (unsigned long long)d->length);
        return (ferry_status)0xbad;
    }
    return FERRY_OK;
}

/* mode "stream": the warm-up ends after `warm` items; mode "pools": when the first item of
 * pool warm + 1 arrives (pool `warm` is destroyed by then, the next not opened yet). */
static int consumer_main(const char *mode, uint64_t warm)
{
    consumer_run run = {0};
    int pools = strcmp(mode, "pools") == 0;
    if (ferry_consumer_create(0, &run.c) != FERRY_OK || !(run.buf = malloc(MAX_ITEM)))
        return 1;
    uint32_t status = FERRY_OK;
    th_msg m;
    while (status == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &m, 60000) == 0 &&
           m.type == TH_MSG_ITEM) {
        ferry_descriptor d;
        if ((status = ferry_descriptor_decode(m.desc, sizeof(m.desc), &d)) != FERRY_OK)
            break;
        if (memcmp(d.pool_id, run.pool_id, 16) != 0) {
            memcpy(run.pool_id, d.pool_id, 16);
            if (pools && run.pools++ == warm)
                run.warm = footprint_now();
        }
        if (!pools && run.items == warm)
            run.warm = footprint_now();
        if ((status = consume_one(&run, &d, m.seed)) != FERRY_OK)
            break;
        if (!(m.status & TH_ITEM_NOACK) && (status = ferry_consumer_ack(run.c, &d)) != FERRY_OK) {
            snprintf(run.why, sizeof(run.why), "ack: %.150s", ferry_last_error());
            break;
        }
        th_msg sync = {.type = SOAK_MSG_SYNC};
        if ((m.status & SOAK_ITEM_SYNC) && th_send_msg(TH_CHANNEL_FD, &sync) != 0)
            status = FERRY_SYSTEM;
        run.items++;
    }
    footprint end = footprint_now();
    th_msg r = {.type = TH_MSG_RESULT, .status = status, .seed = run.items};
    if (status != FERRY_OK)
        snprintf(r.text, sizeof(r.text), "%s", run.why);
    else
        snprintf(r.text, sizeof(r.text), "%ld %ld %llu %ld %ld %llu %llu %u", run.warm.fds,
                 run.warm.maps, run.warm.rss, end.fds, end.maps, end.rss,
                 (unsigned long long)run.pools, ferry__cache_size());
    th_send_msg(TH_CHANNEL_FD, &r);
    free(run.buf);
    ferry_consumer_destroy(run.c);
    return status == FERRY_OK ? 0 : 1;
}

/* ---- the producer side ------------------------------------------------------------------- */

static ferry_pool *make_pool(int64_t size, int64_t inflight)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = size;
    c.consumer_count = 1;
    c.max_inflight_slices = inflight;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool_create: %s", ferry_last_error());
    return pool;
}

static void send_item(th_helper *h, const ferry_descriptor *d, uint64_t seed, uint32_t flags)
{
    th_msg m = {.type = TH_MSG_ITEM, .seed = seed, .status = flags};
    assert_int_equal(ferry_descriptor_encode(d, m.desc), FERRY_OK);
    if (th_send_msg(h->fd, &m) != 0)
        fail_msg("the consumer is gone (send: %s)", strerror(errno));
}

static void publish_one(ferry_pool *pool, th_helper *h, size_t n, uint64_t seed, uint32_t flags)
{
    static uint8_t buf[MAX_ITEM];
    th_stamp(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    ferry_descriptor d;
    ferry_status st = ferry_pool_publish(pool, &t, buf, 10000 * MS, &d);
    if (st != FERRY_OK)
        fail_msg("publish of seed %llu: %s", (unsigned long long)seed, ferry_last_error());
    send_item(h, &d, seed, flags);
}

static void reserve_one(ferry_pool *pool, th_helper *h, size_t n, uint64_t seed)
{
    ferry_tensor t = {.dtype_code = FERRY_DTYPE_FLOAT,
                      .dtype_bits = 32,
                      .dtype_lanes = 1,
                      .ndim = 2,
                      .shape = {4, (int64_t)(n / 16)}};
    void *data;
    ferry_descriptor d;
    ferry_status st = ferry_pool_reserve(pool, &t, 10000 * MS, &data, &d);
    if (st != FERRY_OK)
        fail_msg("reserve of seed %llu: %s", (unsigned long long)seed, ferry_last_error());
    th_stamp(data, d.length, seed);
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_OK);
    send_item(h, &d, seed, 0);
}

/* Two tensors in one lease: the consumer reads and acknowledges each part (the lease is its
 * own until the last part is acknowledged). */
static void publish_pack(ferry_pool *pool, th_helper *h, size_t n, uint64_t seed)
{
    static uint8_t a[MAX_ITEM], b[MAX_ITEM];
    ferry_tensor t[2] = {ferry_tensor_bytes(n / 3),
                         {.dtype_code = FERRY_DTYPE_BFLOAT,
                          .dtype_bits = 16,
                          .dtype_lanes = 1,
                          .ndim = 1,
                          .shape = {(int64_t)(n / 3)}}};
    th_stamp(a, n / 3, seed);
    th_stamp(b, 2 * (n / 3), seed + 2);
    const void *srcs[2] = {a, b};
    ferry_descriptor d[2];
    ferry_status st = ferry_pool_publish_many(pool, t, srcs, 2, 10000 * MS, d);
    if (st != FERRY_OK)
        fail_msg("publish_many of seed %llu: %s", (unsigned long long)seed, ferry_last_error());
    send_item(h, &d[0], seed, 0);
    send_item(h, &d[1], seed + 2, 0);
}

/* The consumer's RESULT; fails the test on anything but OK after count items. */
static th_msg finish_consumer(th_helper *h, uint64_t count, int timeout_ms)
{
    th_msg m = {0};
    int got = th_recv_msg(h->fd, &m, timeout_ms) == 0 && m.type == TH_MSG_RESULT;
    if (!got)
        kill(h->pid, SIGKILL);
    int status = 0;
    while (waitpid(h->pid, &status, 0) < 0 && errno == EINTR)
        ;
    close(h->fd);
    if (!got)
        fail_msg("the consumer gave no result (wait status %#x)", status);
    if (m.status != FERRY_OK)
        fail_msg("the consumer failed after %llu items: %s", (unsigned long long)m.seed, m.text);
    assert_int_equal(m.seed, count);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the consumer exited with wait status %#x (a sanitizer report?)", status);
    return m;
}

/* Parses the consumer's footprints (and the pools it saw, and its cache's size). */
static void parse_result(const th_msg *m, footprint *warm, footprint *end,
                         unsigned long long *pools, unsigned *cached)
{
    if (sscanf(m->text, "%ld %ld %llu %ld %ld %llu %llu %u", &warm->fds, &warm->maps, &warm->rss,
               &end->fds, &end->maps, &end->rss, pools, cached) != 8)
        fail_msg("unreadable consumer result: %s", m->text);
}

static void assert_flat(const char *who, const footprint *a, const footprint *b)
{
    if (b->fds != a->fds)
        fail_msg("%s: open fds went from %ld to %ld", who, a->fds, b->fds);
    if (b->maps > a->maps + SOAK_MAPS_SLACK)
        fail_msg("%s: mappings went from %ld to %ld (more than +%d)", who, a->maps, b->maps,
                 SOAK_MAPS_SLACK);
    if (rss_checked() && b->rss > a->rss + SOAK_RSS_SLACK)
        fail_msg("%s: RSS went from %.1f to %.1f MiB (more than +%.0f MiB)", who,
                 (double)a->rss / MIB, (double)b->rss / MIB, (double)SOAK_RSS_SLACK / MIB);
}

/* ---- test_soak_handovers ------------------------------------------------------------------ */

static void test_soak_handovers(void **state)
{
    (void)state;
    uint64_t leases = th_scaled(100000, 2000), warm = leases / 10, sent = 0, rng = 42;
    /* 1 MiB: all of it is touched long before the warm-up ends, so that the consumer's RSS
     * measures what it keeps, not how much of the pool it has seen; publishers wait for space
     * often. */
    ferry_pool *pool = make_pool(1 << 20, 1024);
    char arg[32];
    snprintf(arg, sizeof(arg), "%llu", (unsigned long long)warm);
    th_helper h = th_spawn_helper("consumer", "stream", arg);
    footprint pwarm = {0};
    int warmed = 0;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < leases; i++) {
        size_t n = 16 + (size_t)(rnd(&rng) % (MAX_ITEM - 16));
        uint64_t seed = 4 * i;
        if (!warmed && sent >= warm) {
            pwarm = footprint_now();
            warmed = 1;
        }
        switch (i % 16) {
        case 12:
        case 13:
            reserve_one(pool, &h, n, seed);
            sent++;
            break;
        case 14:
            publish_pack(pool, &h, n, seed);
            sent += 2;
            break;
        default:
            publish_one(pool, &h, n, seed, 0);
            sent++;
            break;
        }
    }
    footprint pend = footprint_now(), cwarm, cend; /* as at the warm-up: the channel open */
    th_send_type(h.fd, TH_MSG_DONE);
    th_msg m = finish_consumer(&h, sent, 120000);
    double secs = (double)(now_ns() - t0) / 1e9;
    th_wait_drained(pool);
    unsigned long long pools;
    unsigned cached;
    parse_result(&m, &cwarm, &cend, &pools, &cached);
    print_message("soak: handovers=%llu (%llu tensors) in %.2f s, %.1f us each\n",
                  (unsigned long long)leases, (unsigned long long)sent, secs, secs * 1e6 / leases);
    print_footprint("consumer", "handovers", &cwarm, &cend);
    print_footprint("producer", "handovers", &pwarm, &pend);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.publishes, leases);
    assert_int_equal(s.reclaimed, leases);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.consumers_attached, 1);
    ferry_pool_destroy(pool);
    assert_flat("consumer", &cwarm, &cend);
    assert_flat("producer", &pwarm, &pend);
}

/* ---- test_soak_many_pools ----------------------------------------------------------------- */

/* One pool's life: created, three hand-overs (the last answered once acknowledged), every
 * lease reclaimed, destroyed. */
static void one_pool(th_helper *h, uint64_t k, uint64_t *rng)
{
    ferry_pool *pool = make_pool(256 * 1024, 64);
    for (uint32_t j = 0; j < 3; j++) {
        size_t n = 1 + (size_t)(rnd(rng) % 8192);
        publish_one(pool, h, n, 4 * (3 * k + j), j == 2 ? SOAK_ITEM_SYNC : 0);
    }
    th_msg m;
    if (th_recv_msg(h->fd, &m, 30000) != 0 || m.type != SOAK_MSG_SYNC)
        fail_msg("pool %llu: the consumer did not answer", (unsigned long long)k);
    uint64_t n = 0;
    assert_int_equal(ferry_pool_reclaim(pool, &n), FERRY_OK);
    ferry_pool_stats s = th_stats(pool);
    if (s.leases_in_flight != 0 || s.publishes != 3)
        fail_msg("pool %llu: %llu of %llu leases still in flight after the consumer acknowledged",
                 (unsigned long long)k, (unsigned long long)s.leases_in_flight,
                 (unsigned long long)s.publishes);
    ferry_pool_destroy(pool);
}

static void test_soak_many_pools(void **state)
{
    (void)state;
    uint64_t count = th_scaled(1000, 250), warm = count / 10, rng = 7; /* cheap: >= 250 */
    char arg[32];
    snprintf(arg, sizeof(arg), "%llu", (unsigned long long)warm);
    th_helper h = th_spawn_helper("consumer", "pools", arg);
    footprint pwarm = {0};
    uint64_t t0 = now_ns();
    for (uint64_t k = 0; k < count; k++) {
        if (k == warm)
            pwarm = footprint_now();
        one_pool(&h, k, &rng);
    }
    footprint pend = footprint_now(), cwarm, cend;
    th_send_type(h.fd, TH_MSG_DONE);
    th_msg m = finish_consumer(&h, 3 * count, 60000);
    unsigned long long pools;
    unsigned cached;
    parse_result(&m, &cwarm, &cend, &pools, &cached);
    assert_int_equal(pools, count);
    char what[64];
    snprintf(what, sizeof(what), "pools=%llu", (unsigned long long)count);
    print_message("soak: pools=%llu in %.2f s (warm-up %llu pools); the consumer's cache holds "
                  "%u at the end\n",
                  (unsigned long long)count, (double)(now_ns() - t0) / 1e9,
                  (unsigned long long)warm, cached);
    print_footprint("consumer", what, &cwarm, &cend);
    print_footprint("producer", what, &pwarm, &pend);
    assert_flat("consumer", &cwarm, &cend);
    assert_flat("producer", &pwarm, &pend);
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "--helper") == 0 && strcmp(argv[2], "consumer") == 0)
        return consumer_main(argv[3], strtoull(argv[4], NULL, 10));
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak_handovers),
        cmocka_unit_test(test_soak_many_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
