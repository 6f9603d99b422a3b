/* The GPU transports (CUDA IPC, then CUDA VMM) across real processes. Runs against the real
 * driver on a GPU machine, and in CI against the fake driver (FERRY_CUDA_DRIVER); exits 77
 * (skipped) where there is no driver or no device. The test binary re-runs itself as
 * consumers and producers that talk to it over a SOCK_SEQPACKET pair on fd 3; they learn the
 * backend under test from FERRY_TEST_BACKEND. */
#include <dlfcn.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "consumer/consumer.h"
#include "driver/driver.h"
#include "ferry.h"
#include "helpers.h"
#include "procs.h"
#include "transport/transport.h"

#define MS       1000000ull
#define MAX_ITEM (1 << 20)

static const ferry__cuda *cu;
static ferry_backend backend = FERRY_BACKEND_CUDA_IPC; /* under test */

static const char *transport_name(void)
{
    return backend == FERRY_BACKEND_CUDA_VMM ? "CUDA VMM" : "CUDA IPC";
}

/* ---- device memory ---------------------------------------------------------------------- */

static CUdeviceptr dev_alloc(size_t n)
{
    CUdeviceptr p = 0;
    if (cu->cuMemAlloc(&p, n) != CUDA_SUCCESS)
        return 0;
    return p;
}

static int device_count(void)
{
    return cu ? cu->device_count : 0;
}

/* A stream held back by a cuStreamWaitValue32 (>= 1) on a word of page-aligned host memory
 * registered with CUDA, until the CPU opens the gate: the work queued behind it stays
 * pending meanwhile. */
typedef struct gate {
    uint32_t *word;
    CUstream stream;
} gate;

static gate gate_stream(CUstream stream)
{
    gate g = {.stream = stream};
    void *page = NULL;
    assert_int_equal(posix_memalign(&page, 4096, 4096), 0);
    memset(page, 0, 4096);
    g.word = page;
    assert_int_equal(cu->cuMemHostRegister(page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
    CUdeviceptr dev;
    assert_int_equal(cu->cuMemHostGetDevicePointer(&dev, page, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(stream, dev, 1, CU_STREAM_WAIT_VALUE_GEQ),
                     CUDA_SUCCESS);
    return g;
}

static void gate_open(gate *g)
{
    __atomic_store_n(g->word, 1, __ATOMIC_RELEASE);
}

/* Releases the word of a gate that is open and whose stream has drained. CUDA's
 * cuMemHostUnregister waits for the device's pending work: while another gate is closed, it
 * would wait for that gate. */
static void gate_unpin(gate *g)
{
    assert_int_equal(cu->cuMemHostUnregister(g->word), CUDA_SUCCESS);
    free(g->word);
}

/* Opens the gate (if still closed), lets the stream drain and releases the word. */
static void gate_free(gate *g)
{
    gate_open(g);
    assert_int_equal(cu->cuStreamSynchronize(g->stream), CUDA_SUCCESS);
    gate_unpin(g);
}

/* ---- consumer helper -------------------------------------------------------------------- */

/* Modes: "async" (stream-ordered read + ack, checked after a stream sync), "sync" (CPU wait
 * and read, CPU ack), "view" (zero-copy view, copied out on the stream, ack on the stream),
 * "hold" (read, never ack; reports each item), "reread" (async read, then a second read
 * must be STALE). */
static ferry_status consume_one(ferry_consumer *c, const char *mode, const ferry_descriptor *d,
                                uint32_t flags, CUdeviceptr dbuf, uint8_t *host, CUstream s)
{
    ferry_status st = FERRY_OK;
    if (strcmp(mode, "sync") == 0 || strcmp(mode, "hold") == 0) {
        st = ferry_consumer_read(c, d, host, MAX_ITEM, 10000 * MS);
        if (st == FERRY_OK && strcmp(mode, "sync") == 0 && !(flags & TH_ITEM_NOACK))
            st = ferry_consumer_ack(c, d);
        return st;
    }
    if (strcmp(mode, "view") == 0) {
        const void *view;
        st = ferry_consumer_view_async(c, d, s, &view);
        if (st == FERRY_OK && d->length &&
            cu->cuMemcpyAsync(dbuf, (CUdeviceptr)(uintptr_t)view, d->length, s) != CUDA_SUCCESS)
            st = FERRY_DRIVER;
        if (st == FERRY_OK)
            st = ferry_consumer_ack_async(c, d, s);
    } else {
        st = ferry_consumer_read_async(c, d, (void *)(uintptr_t)dbuf, MAX_ITEM, s);
    }
    if (st == FERRY_OK && cu->cuStreamSynchronize(s) != CUDA_SUCCESS)
        st = FERRY_DRIVER;
    if (st == FERRY_OK && d->length &&
        cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, dbuf, d->length) != CUDA_SUCCESS)
        st = FERRY_DRIVER;
    if (st == FERRY_OK && strcmp(mode, "reread") == 0) {
        st = ferry_consumer_read_async(c, d, (void *)(uintptr_t)dbuf, MAX_ITEM, s);
        st = st == FERRY_STALE ? FERRY_OK : 0xbad;
    }
    return st;
}

static int consumer_main(uint32_t rank, int device, const char *mode)
{
    ferry_consumer *c;
    CUstream s;
    if (ferry__cuda_get(&cu) != FERRY_OK ||
        ferry_consumer_create_on(rank, device, &c) != FERRY_OK ||
        ferry__cuda_use_device(cu, device) != FERRY_OK ||
        cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return 1;
    CUdeviceptr dbuf = dev_alloc(MAX_ITEM);
    uint8_t *host = malloc(MAX_ITEM);
    uint64_t verified = 0;
    uint32_t st = FERRY_OK;
    th_msg m;
    while (st == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &m, 60000) == 0 && m.type == TH_MSG_ITEM) {
        ferry_descriptor d;
        st = ferry_descriptor_decode(m.desc, sizeof(m.desc), &d);
        if (st == FERRY_OK)
            st = consume_one(c, mode, &d, m.status, dbuf, host, s);
        if (st == FERRY_OK && !th_check(host, d.length, m.seed))
            st = 0xbad;
        if (st == FERRY_OK)
            verified++;
        if (st == FERRY_OK && strcmp(mode, "hold") == 0)
            th_report(FERRY_OK, verified);
    }
    /* The stream goes first: releasing the pool's mapping must not touch it (CUDA may crash
     * on a destroyed stream's handle), and the result comes after that release. */
    cu->cuStreamDestroy(s);
    ferry_consumer_destroy(c);
    th_report(st, verified);
    cu->cuMemFree(dbuf);
    free(host);
    return st == FERRY_OK ? 0 : 1;
}

/* Producer helper: a pool with one reserved lease never committed; sleeps until killed. */
static int producer_main(const char *placement)
{
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = backend;
    cfg.memory_size = 4 << 20;
    cfg.consumer_count = 1;
    cfg.control_placement = atoi(placement);
    return th_stuck_producer(&cfg);
}

/* Without a driver, a CUDA IPC pool fails plainly and the host backend still works. */
static int nodriver_main(void)
{
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = backend;
    cfg.memory_size = 4 << 20;
    ferry_pool *pool;
    ferry_status st = ferry_pool_create(&cfg, &pool);
    th_report(st, 0);
    cfg.backend = FERRY_BACKEND_HOST;
    if (ferry_pool_create(&cfg, &pool) != FERRY_OK)
        return 1;
    ferry_pool_destroy(pool);
    return 0;
}

/* A consumer that makes no CUDA call of its own: ferry must set up every context it needs
 * (a thread with no current context, as in a freshly started worker). */
static int fresh_main(void)
{
    th_msg m;
    ferry_consumer *c;
    static uint8_t host[MAX_ITEM];
    ferry_descriptor d;
    if (th_recv_msg(TH_CHANNEL_FD, &m, 60000) != 0 ||
        ferry_consumer_create_on(0, 0, &c) != FERRY_OK)
        return 1;
    ferry_status st = ferry_descriptor_decode(m.desc, sizeof(m.desc), &d);
    if (st == FERRY_OK)
        st = ferry_consumer_read(c, &d, host, sizeof(host), 10000 * MS);
    if (st == FERRY_OK && !th_check(host, d.length, m.seed))
        st = 0xbad;
    if (st == FERRY_OK)
        st = ferry_consumer_ack(c, &d);
    th_report(st, st == FERRY_OK);
    ferry_consumer_destroy(c);
    return st == FERRY_OK ? 0 : 1;
}

/* The fake driver's count of a process's calls of an entry point; NULL on the real driver. */
typedef unsigned long (*call_counter)(const char *);

static call_counter fake_calls(void)
{
    void *sym = dlsym(cu->library, "ferry_fake_cuda_calls");
    call_counter calls;
    memcpy(&calls, &sym, sizeof(sym));
    return calls;
}

/* An ITEM flag of the "waits" helper: ferry_consumer_wait for the lease (CPU) first. */
#define ITEM_WAIT_FIRST 0x100u
/* The cuStreamWaitValue32 calls that view_async and read_async made, as "waits" reports them. */
#define WAITS(view, read) (((uint64_t)(view) << 32) | (uint64_t)(read))

/* Fake driver only, rank 0 on device 0: for each item, view_async then read_async on one
 * stream, reporting the cuStreamWaitValue32 calls each made (RESULT, seed WAITS); then, after
 * a stream sync, checks what both copied out and reports the items verified so far. */
static int waits_main(void)
{
    ferry_consumer *c;
    CUstream s;
    call_counter calls;
    if (ferry__cuda_get(&cu) != FERRY_OK || !(calls = fake_calls()) ||
        ferry_consumer_create_on(0, 0, &c) != FERRY_OK ||
        ferry__cuda_use_device(cu, 0) != FERRY_OK ||
        cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return 1;
    CUdeviceptr read_buf = dev_alloc(MAX_ITEM), view_buf = dev_alloc(MAX_ITEM);
    uint8_t *host = malloc(MAX_ITEM);
    uint64_t verified = 0;
    uint32_t st = FERRY_OK;
    th_msg m;
    while (st == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &m, 60000) == 0 && m.type == TH_MSG_ITEM) {
        ferry_descriptor d;
        const void *view = NULL;
        st = ferry_descriptor_decode(m.desc, sizeof(m.desc), &d);
        if (st == FERRY_OK && (m.status & ITEM_WAIT_FIRST))
            st = ferry_consumer_wait(c, &d, 10000 * MS);
        unsigned long before = calls("cuStreamWaitValue32");
        if (st == FERRY_OK)
            st = ferry_consumer_view_async(c, &d, s, &view);
        unsigned long mid = calls("cuStreamWaitValue32");
        if (st == FERRY_OK &&
            cu->cuMemcpyAsync(view_buf, (CUdeviceptr)(uintptr_t)view, d.length, s) != CUDA_SUCCESS)
            st = FERRY_DRIVER;
        if (st == FERRY_OK)
            st = ferry_consumer_read_async(c, &d, (void *)(uintptr_t)read_buf, MAX_ITEM, s);
        th_report(st, WAITS(mid - before, calls("cuStreamWaitValue32") - mid));
        if (st == FERRY_OK && cu->cuStreamSynchronize(s) != CUDA_SUCCESS)
            st = FERRY_DRIVER;
        CUdeviceptr bufs[2] = {view_buf, read_buf};
        for (int i = 0; i < 2 && st == FERRY_OK; i++)
            if (cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, bufs[i], d.length) != CUDA_SUCCESS ||
                !th_check(host, d.length, m.seed))
                st = 0xbad;
        verified += st == FERRY_OK;
        th_report(st, verified);
    }
    th_report(st, verified);
    ferry_consumer_destroy(c);
    cu->cuMemFree(read_buf);
    cu->cuMemFree(view_buf);
    cu->cuStreamDestroy(s);
    free(host);
    return st == FERRY_OK ? 0 : 1;
}

/* Logged lines, for the helpers that check a warning. */
static char logged[1024];

static void log_to_buffer(int level, const char *message, void *user)
{
    (void)level;
    (void)user;
    size_t used = strlen(logged);
    snprintf(logged + used, sizeof(logged) - used, "%s\n", message);
}

/* A round trip through ferry_gpu_alloc_async on device 0: a pattern copied in on s, out again
 * after a sync, then the memory freed on s. FERRY_OK, or the first failure. */
static ferry_status async_round_trip(CUstream s, size_t n, uint64_t seed)
{
    uint8_t *host = malloc(n);
    void *p = NULL;
    ferry_status st = host ? ferry_gpu_alloc_async(0, n, s, &p) : FERRY_NO_MEMORY;
    if (st == FERRY_OK) {
        th_fill(host, n, seed);
        st = ferry_gpu_copy_async(0, p, host, n, s);
    }
    if (st == FERRY_OK) {
        memset(host, 0, n);
        st = ferry_gpu_copy_async(0, host, p, n, s);
    }
    if (st == FERRY_OK)
        st = ferry_gpu_stream_synchronize(0, s);
    if (st == FERRY_OK && !th_check(host, n, seed))
        st = 0xbad;
    ferry_status freed = ferry_gpu_free_async(0, p, s);
    free(host);
    return st == FERRY_OK ? freed : st;
}

/* Run with FERRY_FAKE_CUDA_HIDE naming the stream-ordered allocator: ferry_gpu_alloc_async
 * falls back to cuMemAlloc, says so once, and still works. Reports the cuMemAlloc calls made
 * by two round trips and whether the warning was logged once. */
static int plain_alloc_main(void)
{
    call_counter calls;
    CUstream s;
    ferry_set_log(log_to_buffer, NULL);
    if (ferry__cuda_get(&cu) != FERRY_OK || !(calls = fake_calls()) ||
        ferry__cuda_use_device(cu, 0) != FERRY_OK ||
        cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return 1;
    unsigned long before = calls("cuMemAlloc");
    ferry_status st = async_round_trip(s, 5000, 3);
    if (st == FERRY_OK)
        st = async_round_trip(s, 5000, 4);
    const char *warning = strstr(logged, "the driver has no stream-ordered allocator");
    int once = warning && !strstr(warning + 1, "the driver has no stream-ordered allocator");
    th_report(st, (calls("cuMemAlloc") - before) * 10 + (uint64_t)once);
    cu->cuStreamDestroy(s);
    return st == FERRY_OK ? 0 : 1;
}

static int helper_main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[2], "plainalloc") == 0)
        return plain_alloc_main();
    if (argc >= 5 && strcmp(argv[2], "consumer") == 0) {
        int device = 0;
        char mode[32] = "async";
        sscanf(argv[4], "%d:%31s", &device, mode);
        return consumer_main((uint32_t)atoi(argv[3]), device, mode);
    }
    if (argc >= 4 && strcmp(argv[2], "producer") == 0)
        return producer_main(argv[3]);
    if (argc >= 3 && strcmp(argv[2], "nodriver") == 0)
        return nodriver_main();
    if (argc >= 3 && strcmp(argv[2], "fresh") == 0)
        return fresh_main();
    if (argc >= 3 && strcmp(argv[2], "waits") == 0)
        return waits_main();
    return 2;
}

/* ---- the tests ------------------------------------------------------------------------- */

static ferry_pool_config pool_config(int64_t size, int64_t consumers, int placement)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = backend;
    c.memory_size = size;
    c.consumer_count = consumers;
    c.max_inflight_slices = 256;
    c.reclaim_interval_us = 500;
    c.control_placement = placement;
    return c;
}

static ferry_pool *create_pool(const ferry_pool_config *c)
{
    ferry_pool *pool = NULL;
    if (ferry_pool_create(c, &pool) != FERRY_OK)
        fail_msg("pool: %s", ferry_last_error());
    return pool;
}

static ferry_pool *make_pool(int64_t size, int64_t consumers, int placement)
{
    ferry_pool_config c = pool_config(size, consumers, placement);
    return create_pool(&c);
}

/* The producer's items: filled on the host, moved to device memory, then published from
 * there on a stream, without synchronising the host with it. */
typedef struct source {
    CUdeviceptr dev[4];
    uint8_t *host[4]; /* the same patterns in pageable host memory */
    CUstream stream;
} source;

static source make_source(void)
{
    source s;
    assert_int_equal(cu->cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++) {
        s.dev[i] = dev_alloc(MAX_ITEM);
        assert_true(s.dev[i] != 0);
        s.host[i] = malloc(MAX_ITEM);
        th_fill(s.host[i], MAX_ITEM, (uint64_t)i + 100);
        assert_int_equal(cu->cuMemcpy(s.dev[i], (CUdeviceptr)(uintptr_t)s.host[i], MAX_ITEM), 0);
    }
    return s;
}

static void free_source(source *s)
{
    cu->cuStreamSynchronize(s->stream);
    for (int i = 0; i < 4; i++) {
        cu->cuMemFree(s->dev[i]);
        free(s->host[i]);
    }
    cu->cuStreamDestroy(s->stream);
}

/* Items reuse 4 sources, each a prefix of a seeded pattern: item i has seed 100 + i % 4
 * and a length that varies; every fifth item comes from pageable host memory. */
static ferry_descriptor publish_item(ferry_pool *pool, source *src, int i, size_t n,
                                     uint64_t timeout)
{
    ferry_tensor t = ferry_tensor_bytes(n);
    ferry_descriptor d;
    const void *from =
        i % 5 == 4 ? (const void *)src->host[i % 4] : (const void *)(uintptr_t)src->dev[i % 4];
    ferry_status st = ferry_pool_publish_async(pool, &t, from, src->stream, timeout, &d);
    if (st != FERRY_OK)
        fail_msg("publish: %s", ferry_last_error());
    return d;
}

static void stream_test(int placement, const char *const *modes, int nconsumers, int items)
{
    ferry_pool *pool = make_pool(8 << 20, nconsumers, placement);
    source src = make_source();
    th_helper h[4];
    for (int r = 0; r < nconsumers; r++) {
        char rank[16];
        snprintf(rank, sizeof(rank), "%d", r);
        h[r] = th_spawn_helper("consumer", rank, modes[r]);
    }
    srand(11);
    for (int i = 0; i < items; i++) {
        size_t n = 1 + (size_t)rand() % MAX_ITEM;
        ferry_descriptor d = publish_item(pool, &src, i, n, 20000 * MS);
        for (int r = 0; r < nconsumers; r++)
            th_send_item(h[r].fd, &d, (uint64_t)(100 + i % 4), 0);
    }
    for (int r = 0; r < nconsumers; r++) {
        th_send_type(h[r].fd, TH_MSG_DONE);
        th_assert_result(th_finish_helper(&h[r], 60000), (uint64_t)items);
    }
    th_wait_drained(pool);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.publishes, (uint64_t)items);
    assert_int_equal(s.reclaimed, (uint64_t)items);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_round_trip_host_control(void **state)
{
    (void)state;
    const char *modes[] = {"0:async", "0:sync", "0:view"};
    stream_test(FERRY_CONTROL_HOST, modes, 3, 60);
}

static void test_round_trip_device_control(void **state)
{
    (void)state;
    const char *modes[] = {"0:async", "0:sync", "0:view"};
    stream_test(FERRY_CONTROL_DEVICE, modes, 3, 60);
}

static void test_second_gpu(void **state)
{
    (void)state;
    if (device_count() < 2)
        skip();
    const char *modes[] = {"1:async", "1:view"};
    stream_test(FERRY_CONTROL_HOST, modes, 2, 40);
    stream_test(FERRY_CONTROL_DEVICE, modes, 2, 40);
}

static void stale_test(int placement)
{
    ferry_pool *pool = make_pool(8 << 20, 1, placement);
    source src = make_source();
    th_helper h = th_spawn_helper("consumer", "0", "0:reread");
    ferry_descriptor d = publish_item(pool, &src, 0, 5000, 0);
    th_send_item(h.fd, &d, 100, 0);
    d = publish_item(pool, &src, 1, 5000, 0);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_OK);
    assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_INACTIVE_LEASE);
    char want[64];
    snprintf(want, sizeof(want), "Cannot release inactive %s pool lease", transport_name());
    assert_non_null(strstr(ferry_last_error(), want));
    th_send_item(h.fd, &d, 101, 0);
    th_msg m = th_finish_helper(&h, 60000);
    assert_int_equal(m.status, FERRY_STALE);
    assert_int_equal(m.seed, 1);
    th_wait_drained(pool);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_stale_and_cancelled(void **state)
{
    (void)state;
    stale_test(FERRY_CONTROL_HOST);
    stale_test(FERRY_CONTROL_DEVICE);
}

static void full_test(int placement)
{
    /* A few 1 MiB slices; the consumer acknowledges from its stream. */
    ferry_pool *pool = make_pool(6 << 20, 1, placement);
    source src = make_source();
    ferry_descriptor d[8];
    int held = 0;
    ferry_tensor t = ferry_tensor_bytes(MAX_ITEM);
    while (held < 8 && ferry_pool_publish_async(pool, &t, (void *)(uintptr_t)src.dev[held % 4],
                                                src.stream, 0, &d[held]) == FERRY_OK)
        held++;
    assert_true(held >= 2 && held < 8);
    char want[64];
    snprintf(want, sizeof(want), "%s pool is full", transport_name());
    ferry_descriptor out;
    assert_int_equal(
        ferry_pool_publish_async(pool, &t, (void *)(uintptr_t)src.dev[0], src.stream, 0, &out),
        FERRY_POOL_FULL);
    assert_non_null(strstr(ferry_last_error(), want));
    th_helper h = th_spawn_helper("consumer", "0", "0:async");
    for (int i = 0; i < held; i++)
        th_send_item(h.fd, &d[i], (uint64_t)(100 + i % 4), 0);
    for (int i = held; i < held + 16; i++) {
        ferry_descriptor e = publish_item(pool, &src, i, MAX_ITEM, 20000 * MS);
        th_send_item(h.fd, &e, (uint64_t)(100 + i % 4), 0);
    }
    th_send_type(h.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&h, 60000), (uint64_t)held + 16);
    th_wait_drained(pool);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_pool_full_then_recovery(void **state)
{
    (void)state;
    full_test(FERRY_CONTROL_HOST);
    full_test(FERRY_CONTROL_DEVICE);
}

/* Zero-copy publish (reserve, fill on the stream, commit on the stream) and two tensors of
 * one request in one lease, acknowledged once. */
static void reserve_many_test(int placement)
{
    ferry_pool *pool = make_pool(8 << 20, 1, placement);
    source src = make_source();
    th_helper h = th_spawn_helper("consumer", "0", "0:sync");
    ferry_tensor t = ferry_tensor_bytes(300000);
    void *slice;
    ferry_descriptor d;
    assert_int_equal(ferry_pool_reserve(pool, &t, 0, &slice, &d), FERRY_OK);
    th_send_item(h.fd, &d, 101, 0); /* sent before the commit: the consumer waits for it */
    assert_int_equal(
        cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)slice, src.dev[1], 300000, src.stream),
        CUDA_SUCCESS);
    assert_int_equal(ferry_pool_commit_async(pool, &d, src.stream), FERRY_OK);
    assert_int_equal(ferry_pool_commit_async(pool, &d, src.stream), FERRY_INACTIVE_LEASE);
    ferry_tensor two[2] = {ferry_tensor_bytes(1000), ferry_tensor_bytes(70000)};
    const void *srcs[2] = {(void *)(uintptr_t)src.dev[2], (void *)(uintptr_t)src.dev[3]};
    ferry_descriptor dd[2];
    assert_int_equal(ferry_pool_publish_many_async(pool, two, srcs, 2, src.stream, 0, dd),
                     FERRY_OK);
    assert_int_equal(dd[0].slot, dd[1].slot);
    th_send_item(h.fd, &dd[0], 102, TH_ITEM_NOACK);
    th_send_item(h.fd, &dd[1], 103, 0);
    th_send_type(h.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&h, 60000), 3);
    th_wait_drained(pool);
    assert_int_equal(th_stats(pool).publishes, 2);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_reserve_commit_and_many(void **state)
{
    (void)state;
    reserve_many_test(FERRY_CONTROL_HOST);
    reserve_many_test(FERRY_CONTROL_DEVICE);
}

/* ferry_pool_copied follows the producer's stream: 0 while the publish's copy waits behind a
 * gate, 1 once the stream ran it; the source may be overwritten then and consumers still get
 * what was published. */
static void copied_test(int placement)
{
    /* No background reclaim meanwhile: with control words on the device, nothing but
     * ferry_pool_copied itself refreshes the producer's view of them. */
    ferry_pool_config cfg = pool_config(4 << 20, 1, placement);
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = create_pool(&cfg);
    source src = make_source();
    gate g = gate_stream(src.stream);
    ferry_tensor t = ferry_tensor_bytes(70000);
    ferry_descriptor d;
    int first = 7, second = 7;
    ferry_status published =
        ferry_pool_publish_async(pool, &t, (void *)(uintptr_t)src.dev[0], src.stream, 0, &d);
    ferry_status st1 = published, st2 = published;
    if (published == FERRY_OK) {
        st1 = ferry_pool_copied(pool, &d, &first);
        usleep(5000);
        st2 = ferry_pool_copied(pool, &d, &second);
    }
    gate_open(&g); /* before any check: a failed one must not leave the stream blocked */
    if (published != FERRY_OK)
        fail_msg("publish: %s", ferry_last_error());
    assert_int_equal(st1, FERRY_OK);
    assert_int_equal(st2, FERRY_OK);
    assert_int_equal(first, 0);
    assert_int_equal(second, 0);
    int done = 7;
    ferry_status st;
    uint64_t deadline = ferry__now_ns() + 10000 * MS;
    while ((st = ferry_pool_copied(pool, &d, &done)) == FERRY_OK && done == 0 &&
           ferry__now_ns() < deadline)
        usleep(1000);
    assert_int_equal(st, FERRY_OK);
    assert_int_equal(done, 1);
    /* Copied means copied: the source is overwritten before any consumer reads the lease. */
    assert_int_equal(cu->cuMemsetD32(src.dev[0], 0, MAX_ITEM / 4), CUDA_SUCCESS);
    th_helper h = th_spawn_helper("consumer", "0", "0:sync");
    th_send_item(h.fd, &d, 100, 0);
    th_send_type(h.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&h, 60000), 1);
    th_wait_drained(pool);
    gate_free(&g);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_copied_follows_stream(void **state)
{
    (void)state;
    copied_test(FERRY_CONTROL_HOST);
    copied_test(FERRY_CONTROL_DEVICE); /* ferry_pool_copied reads the device's table */
}

/* A consumer in the producer's own process (a single-process server, a producer that
 * acknowledges on behalf of its ranks): CUDA refuses to open a process's own IPC handle, so
 * it must read the producer's own mapping. Stream-ordered and CPU reads, a view, and acks on
 * behalf, all in this process. */
static void same_process_test(int placement)
{
    ferry_pool *pool = make_pool(8 << 20, 2, placement);
    source src = make_source();
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create_on(0, 0, &c), FERRY_OK);
    CUdeviceptr dst = dev_alloc(MAX_ITEM);
    uint8_t *host = malloc(MAX_ITEM);
    for (int i = 0; i < 3; i++) {
        size_t n = 1000 + (size_t)i * 7777;
        ferry_descriptor d = publish_item(pool, &src, i, n, 0);
        assert_int_equal(ferry_consumer_wait(c, &d, 10000 * MS), FERRY_OK);
        if (i == 0) {
            if (ferry_consumer_read_async(c, &d, (void *)(uintptr_t)dst, MAX_ITEM, NULL) !=
                FERRY_OK)
                fail_msg("read_async: %s", ferry_last_error());
            assert_int_equal(cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, dst, n), CUDA_SUCCESS);
        } else if (i == 1) {
            const void *view;
            if (ferry_consumer_view(c, &d, &view, 10000 * MS) != FERRY_OK)
                fail_msg("view: %s", ferry_last_error());
            assert_int_equal(
                cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, (CUdeviceptr)(uintptr_t)view, n),
                CUDA_SUCCESS);
            assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
        } else {
            if (ferry_consumer_read(c, &d, host, MAX_ITEM, 10000 * MS) != FERRY_OK)
                fail_msg("read: %s", ferry_last_error());
            assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
        }
        assert_true(th_check(host, n, (uint64_t)(100 + i % 4)));
        /* rank 1 is acknowledged on its behalf by this process, which claims nothing */
        assert_int_equal(ferry_consumer_ack_range(c, &d, 1, 1), FERRY_OK);
    }
    assert_int_equal(cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
    th_wait_drained(pool);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 1, &info), FERRY_OK);
    assert_int_equal(info.attached, 0);
    ferry_consumer_destroy(c);
    cu->cuMemFree(dst);
    free(host);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_same_process_consumer(void **state)
{
    (void)state;
    same_process_test(FERRY_CONTROL_HOST);
    same_process_test(FERRY_CONTROL_DEVICE);
}

/* A group leader (here, the producer's process) acknowledges rank 0 on its behalf; the slice
 * is reused by the next lease; rank 0's process, which keeps no record of that ack (control
 * words on the device), then views or reads the old descriptor: STALE, never the next
 * lease's bytes. */
static void ack_on_behalf_test(int placement, const char *mode)
{
    ferry_pool_config cfg = pool_config(4 << 20, 2, placement);
    cfg.max_inflight_slices = 4;
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = create_pool(&cfg);
    source src = make_source();
    ferry_consumer *leader;
    assert_int_equal(ferry_consumer_create_on(1, 0, &leader), FERRY_OK);
    ferry_descriptor old = publish_item(pool, &src, 0, 256 * 1024, 0);
    assert_int_equal(ferry_consumer_wait(leader, &old, 10000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_all(leader, &old), FERRY_OK);
    uint64_t freed = 0;
    for (int i = 0; i < 1000 && !freed; i++) /* device words: once the leader's writes land */
        assert_int_equal(ferry_pool_reclaim(pool, &freed), FERRY_OK);
    assert_int_equal(freed, 1);
    ferry_descriptor next = publish_item(pool, &src, 1, 256 * 1024, 20000 * MS);
    assert_int_equal(next.offset, old.offset); /* the freed slice, under another slot */
    assert_int_equal(ferry_consumer_wait(leader, &next, 10000 * MS), FERRY_OK);
    th_helper h = th_spawn_helper("consumer", "0", mode);
    th_send_item(h.fd, &old, 100, 0);
    th_msg m = th_finish_helper(&h, 60000);
    if (m.status != FERRY_STALE)
        fail_msg("%s of a lease acknowledged on its behalf: status %u (%s)", mode, m.status,
                 m.text);
    ferry_consumer_destroy(leader);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_view_after_ack_on_behalf(void **state)
{
    (void)state;
    const char *modes[] = {"0:view", "0:sync"};
    for (int i = 0; i < 2; i++) {
        ack_on_behalf_test(FERRY_CONTROL_DEVICE, modes[i]);
        ack_on_behalf_test(FERRY_CONTROL_HOST, modes[i]);
    }
}

typedef struct fake_control {
    void (*inject)(const char *, int, int);
    int (*live)(void);
} fake_control;

static int fake_of(fake_control *f)
{
    void *fail = dlsym(cu->library, "ferry_fake_cuda_fail");
    void *live = dlsym(cu->library, "ferry_fake_cuda_live_allocations");
    memcpy(&f->inject, &fail, sizeof(fail));
    memcpy(&f->live, &live, sizeof(live));
    return fail && live;
}

/* A view in the producer's own process outlives the pool: its device memory stays until the
 * view is acknowledged (as CUDA keeps an exported allocation for the processes that opened
 * it), and a new pool never shows through it. */
static void test_same_process_view_outlives_pool(void **state)
{
    (void)state;
    fake_control f;
    int fake = fake_of(&f);
    source src = make_source();
    int base = fake ? f.live() : 0;
    ferry_pool *pool = make_pool(4 << 20, 1, FERRY_CONTROL_HOST);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create_on(0, 0, &c), FERRY_OK);
    const size_t n = 70000;
    ferry_descriptor d = publish_item(pool, &src, 0, n, 0);
    const void *view;
    if (ferry_consumer_view(c, &d, &view, 10000 * MS) != FERRY_OK)
        fail_msg("view: %s", ferry_last_error());
    ferry_pool_destroy(pool);
    ferry_pool *next = make_pool(4 << 20, 1, FERRY_CONTROL_HOST);
    ferry_descriptor e = publish_item(next, &src, 1, n, 0);
    assert_int_equal(ferry_consumer_wait(c, &e, 10000 * MS), FERRY_OK);
    uint8_t *host = malloc(n);
    assert_int_equal(cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, (CUdeviceptr)(uintptr_t)view, n),
                     CUDA_SUCCESS);
    assert_true(th_check(host, n, 100)); /* its own bytes, not the next pool's */
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_PRODUCER_GONE);
    assert_int_equal(ferry_consumer_ack(c, &e), FERRY_OK);
    ferry_pool_destroy(next);
    ferry_consumer_destroy(c);
    free(host);
    free_source(&src);
    if (fake) /* the left pool's memory went with the view's acknowledgement */
        assert_int_equal(f.live(), base - 4);
}

/* How many mappings of pool segments this process has. */
static int pool_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, "/memfd:ferry-pool") != NULL;
    fclose(f);
    return n;
}

typedef struct gates {
    gate *g;
    int n;
} gates;

/* Opens the gates after 3 s: a release that wrongly waits for the gated work in the fake
 * driver (whose unmaps wait for queued work that uses the memory) ends then. */
static void *open_gates_later(void *arg)
{
    gates *gs = arg;
    struct timespec pause = {3, 0};
    nanosleep(&pause, NULL);
    for (int i = 0; i < gs->n; i++)
        gate_open(&gs->g[i]);
    return NULL;
}

/* A consumer's reads queued on more streams than the view's table holds (70 behind gates;
 * the first 64 let run, the last 6 held back), or one whose event could not be recorded:
 * destroying the consumer and the pool, then sweeping, keeps the pool's mapping while that
 * work is pending (the kept view of the second case stays in the process). Once it has run,
 * a later release takes the mapping; where no event stands behind the work it stays for
 * good. Fake driver only (a real driver's frees wait for every pending stream). */
static void release_keeps_mapping(fake_control *f, int record_fails)
{
    enum { STREAMS = 70, N = 4096 };
    static CUstream s[STREAMS];
    static gate g[STREAMS];
    static CUdeviceptr dst[STREAMS];
    int ns = record_fails ? 1 : STREAMS;
    source src = make_source();
    ferry_pool *pool = make_pool(4 << 20, 1, FERRY_CONTROL_HOST);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create_on(0, 0, &c), FERRY_OK);
    ferry_descriptor d = publish_item(pool, &src, 0, N, 0);
    assert_int_equal(ferry_consumer_wait(c, &d, 10000 * MS), FERRY_OK);
    for (int i = 0; i < ns; i++) {
        assert_int_equal(cu->cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        dst[i] = dev_alloc(N);
        g[i] = gate_stream(s[i]);
    }
    if (record_fails)
        f->inject("cuEventRecord", 1, 999);
    for (int i = 0; i < ns; i++)
        assert_int_equal(ferry_consumer_read_async(c, &d, (void *)(uintptr_t)dst[i], N, s[i]),
                         FERRY_OK);
    f->inject("cuEventRecord", 0, 0);
    /* The streams tracked first run; those that joined their entries still wait. */
    int held_back = record_fails ? 0 : STREAMS - 64;
    for (int i = 0; i < ns - held_back; i++) {
        gate_open(&g[i]);
        assert_int_equal(cu->cuStreamSynchronize(s[i]), CUDA_SUCCESS);
    }
    if (held_back) { /* a stream whose entry the others joined reads on: they still count */
        ferry_descriptor d2 = publish_item(pool, &src, 2, N, 0);
        assert_int_equal(ferry_consumer_wait(c, &d2, 10000 * MS), FERRY_OK);
        assert_int_equal(ferry_consumer_read_async(c, &d2, (void *)(uintptr_t)dst[0], N, s[0]),
                         FERRY_OK);
        assert_int_equal(cu->cuStreamSynchronize(s[0]), CUDA_SUCCESS);
    }
    int before = pool_mappings();
    gates gs = {g, ns};
    pthread_t opener;
    assert_int_equal(pthread_create(&opener, NULL, open_gates_later, &gs), 0);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
    ferry__cache_sweep();
    int kept = pool_mappings(); /* the producer's mapping went, the consumer's stays */
    assert_int_equal(pthread_join(opener, NULL), 0);
    for (int i = 0; i < ns; i++) {
        assert_int_equal(cu->cuStreamSynchronize(s[i]), CUDA_SUCCESS);
        gate_unpin(&g[i]);
        assert_int_equal(cu->cuStreamDestroy(s[i]), CUDA_SUCCESS);
        cu->cuMemFree(dst[i]);
    }
    /* Another pool's mapping released: that release looks at the deferred ones. */
    ferry_pool *other = make_pool(4 << 20, 1, FERRY_CONTROL_HOST);
    assert_int_equal(ferry_consumer_create_on(0, 0, &c), FERRY_OK);
    ferry_descriptor e = publish_item(other, &src, 1, N, 0);
    assert_int_equal(ferry_consumer_wait(c, &e, 10000 * MS), FERRY_OK);
    ferry_consumer_destroy(c);
    ferry_pool_destroy(other);
    ferry__cache_sweep();
    int after = pool_mappings();
    free_source(&src);
    assert_int_equal(kept, before - 1);
    assert_int_equal(after, record_fails ? kept : kept - 1);
}

static void test_release_waits_for_stream_work(void **state)
{
    (void)state;
    fake_control f;
    if (!fake_of(&f))
        skip();
    ferry__cache_sweep(); /* pools of earlier tests whose producers are gone */
    release_keeps_mapping(&f, 0);
    release_keeps_mapping(&f, 1);
}

/* A GPU pool of one slice with a remote address (4 KiB items), consumers ranks, and that
 * address; NULL where the pool cannot listen here. */
static ferry_pool *listening_pool(int placement, int consumers,
                                  char raddr[FERRY_REMOTE_ADDRESS_SIZE])
{
    ferry_pool_config cfg = pool_config(4 << 20, consumers, placement);
    cfg.max_inflight_slices = 1;
    cfg.listen = "127.0.0.1:0";
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&cfg, &pool) != FERRY_OK) {
        fprintf(stderr, "test_gpu: no remote address (%s)\n", ferry_last_error());
        return NULL;
    }
    assert_int_equal(ferry_pool_remote_address(pool, raddr, FERRY_REMOTE_ADDRESS_SIZE), FERRY_OK);
    return pool;
}

enum { GIVEN_BACK_ITEM = 4096 };
#define PER_THREAD_STREAM ((CUstream)(uintptr_t)0x2) /* CU_STREAM_PER_THREAD */

/* The thread that queues rank 0's read behind a closed gate, on its own per-thread default
 * stream or on a stream of its own, and keeps it queued until the test says (stage 2). */
typedef struct given_back {
    ferry_consumer *c;
    ferry_descriptor d;
    CUdeviceptr dst;
    gate g; /* the enqueuer's, unpinned by the test once no gate is closed */
    int per_thread;
    int stage; /* 1: queued; 2: open the gate; 3: destroyed */
    pthread_mutex_t lock;
    pthread_cond_t cond;
} given_back;

static void stage_set(given_back *gb, int stage)
{
    pthread_mutex_lock(&gb->lock);
    gb->stage = stage;
    pthread_cond_broadcast(&gb->cond);
    pthread_mutex_unlock(&gb->lock);
}

static int stage_of(given_back *gb)
{
    pthread_mutex_lock(&gb->lock);
    int stage = gb->stage;
    pthread_mutex_unlock(&gb->lock);
    return stage;
}

static void stage_wait(given_back *gb, int stage)
{
    pthread_mutex_lock(&gb->lock);
    while (gb->stage < stage)
        pthread_cond_wait(&gb->cond, &gb->lock);
    pthread_mutex_unlock(&gb->lock);
}

static void *enqueuer(void *arg)
{
    given_back *gb = arg;
    CUstream s = PER_THREAD_STREAM;
    assert_int_equal(ferry__cuda_use_device(cu, 0), FERRY_OK);
    if (!gb->per_thread)
        assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    gb->g = gate_stream(s);
    assert_int_equal(
        ferry_consumer_read_async(gb->c, &gb->d, (void *)(uintptr_t)gb->dst, GIVEN_BACK_ITEM, s),
        FERRY_OK);
    stage_set(gb, 1);
    stage_wait(gb, 2);
    gate_open(&gb->g); /* rank 1's gate is still closed: no gate_free (see gate_unpin) */
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    if (!gb->per_thread)
        assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    return NULL;
}

/* Destroys rank 0's consumer from a thread whose current context is another device's (where
 * there is one): the context it had is its own again afterwards. */
static void *destroyer(void *arg)
{
    given_back *gb = arg;
    CUcontext before = NULL, after = NULL;
    if (device_count() > 1)
        assert_int_equal(ferry__cuda_use_device(cu, 1), FERRY_OK);
    assert_int_equal(cu->cuCtxGetCurrent(&before), CUDA_SUCCESS);
    ferry_consumer_destroy(gb->c);
    assert_int_equal(cu->cuCtxGetCurrent(&after), CUDA_SUCCESS);
    assert_ptr_equal(before, after);
    stage_set(gb, 3);
    return NULL;
}

/* A consumer by remote address on the pool's host (it opens the pool through the broker)
 * gives its rank back when destroyed, and the producer then settles what it took. Its
 * stream-ordered read, queued by another thread behind a closed gate (on that thread's
 * per-thread default stream, or on a stream of its own), must have run by then: destroy
 * waits for it, so the slice (the pool's only one) is recycled only after the copy and the
 * read's acknowledgement does not land on a successor's. Another rank's stream work, still
 * held back, is not waited for, and another rank's first claim goes through meanwhile. */
static void given_back_stream_test(int placement, int per_thread)
{
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    ferry_pool *pool = listening_pool(placement, 3, raddr);
    if (!pool)
        skip();
    enum { N = GIVEN_BACK_ITEM };
    static uint8_t first[N], second[N], out[N];
    memset(first, 0xaa, N);
    memset(second, 0xbb, N);
    ferry_tensor t = ferry_tensor_bytes(N);
    given_back gb = {.per_thread = per_thread};
    pthread_mutex_init(&gb.lock, NULL);
    pthread_cond_init(&gb.cond, NULL);
    assert_int_equal(ferry_pool_publish(pool, &t, first, 1000 * MS, &gb.d), FERRY_OK);
    /* Rank 1, lent as well: its read held back too. */
    ferry_consumer *other = NULL;
    assert_int_equal(ferry_consumer_connect(raddr, 1, 0, &other), FERRY_OK);
    CUstream s1;
    assert_int_equal(cu->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr dst1 = dev_alloc(N);
    gate g1 = gate_stream(s1);
    assert_int_equal(ferry_consumer_read_async(other, &gb.d, (void *)(uintptr_t)dst1, N, s1),
                     FERRY_OK);
    assert_int_equal(ferry_consumer_connect(raddr, 0, 0, &gb.c), FERRY_OK);
    gb.dst = dev_alloc(N);
    assert_int_equal(cu->cuMemsetD32(gb.dst, 0, N / 4), CUDA_SUCCESS);
    pthread_t queue_thread, destroy_thread;
    assert_int_equal(pthread_create(&queue_thread, NULL, enqueuer, &gb), 0);
    stage_wait(&gb, 1);
    assert_int_equal(pthread_create(&destroy_thread, NULL, destroyer, &gb), 0);
    struct timespec settle = {0, 100 * 1000 * 1000}; /* the destroyer is in its wait by then */
    nanosleep(&settle, NULL);
    ferry_consumer *third = NULL; /* rank 2, claimed by its first wait (a read would copy on
                                   * the legacy stream, which waits for per-thread ones) */
    assert_int_equal(ferry_consumer_create_on(2, 0, &third), FERRY_OK);
    assert_int_equal(ferry_consumer_wait(third, &gb.d, 1000 * MS), FERRY_OK);
    assert_int_equal(stage_of(&gb), 1); /* rank 2 served while rank 0 is being given back */
    stage_set(&gb, 2);
    assert_int_equal(pthread_join(destroy_thread, NULL), 0);
    assert_int_equal(pthread_join(queue_thread, NULL), 0);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_false(info.alive); /* given back, rank 1's work still held back */
    assert_int_equal(cu->cuMemcpy((CUdeviceptr)(uintptr_t)out, gb.dst, N), CUDA_SUCCESS);
    for (int i = 0; i < N; i++)
        if (out[i] != 0xaa)
            fail_msg("the read queued before destroy copied byte %d as %02x", i, out[i]);
    gate_free(&g1);
    gate_unpin(&gb.g);
    assert_int_equal(cu->cuMemcpy((CUdeviceptr)(uintptr_t)out, dst1, N), CUDA_SUCCESS);
    assert_int_equal(out[0], 0xaa);
    assert_int_equal(ferry_consumer_read(third, &gb.d, out, N, 1000 * MS), FERRY_OK);
    assert_int_equal(out[0], 0xaa);
    assert_int_equal(ferry_consumer_ack(third, &gb.d), FERRY_OK);
    ferry_consumer *c = NULL;
    ferry_descriptor d2;
    assert_int_equal(ferry_consumer_connect(raddr, 0, 0, &c), FERRY_OK);
    assert_int_equal(ferry_pool_publish(pool, &t, second, 1000 * MS, &d2), FERRY_OK);
    assert_int_equal(d2.slot, gb.d.slot);
    ferry_consumer *all[3] = {c, other, third};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(ferry_consumer_read(all[r], &d2, out, N, 1000 * MS), FERRY_OK);
        assert_int_equal(out[0], 0xbb);
        assert_int_equal(ferry_consumer_ack(all[r], &d2), FERRY_OK);
    }
    if (ferry_pool_drain(pool, 1000 * MS) != FERRY_OK)
        fail_msg("drain: %s", ferry_last_error());
    for (int r = 0; r < 3; r++)
        ferry_consumer_destroy(all[r]);
    ferry_pool_destroy(pool);
    ferry__cache_sweep();
    cu->cuMemFree(gb.dst);
    cu->cuMemFree(dst1);
    cu->cuStreamDestroy(s1);
    pthread_cond_destroy(&gb.cond);
    pthread_mutex_destroy(&gb.lock);
}

/* A view such a consumer handed out, never acknowledged, ends with it (its lease is
 * acknowledged for it): once the producer is gone the pool's mapping goes with the consumer
 * (a view's reference would keep it), and the calling thread's CUDA context is what it was
 * (unmapping works on the pool's device). */
static void given_back_view_test(int placement)
{
    ferry__cache_sweep(); /* pools of earlier tests whose producers are gone */
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    ferry_pool *pool = listening_pool(placement, 1, raddr);
    if (!pool)
        skip();
    static uint8_t bytes[GIVEN_BACK_ITEM];
    ferry_tensor t = ferry_tensor_bytes(sizeof(bytes));
    ferry_descriptor d;
    assert_int_equal(ferry_pool_publish(pool, &t, bytes, 1000 * MS, &d), FERRY_OK);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(raddr, 0, 0, &c), FERRY_OK);
    const void *view = NULL;
    assert_int_equal(ferry_consumer_view(c, &d, &view, 1000 * MS), FERRY_OK);
    ferry_pool_destroy(pool);
    ferry_descriptor next;
    size_t got = 0;
    assert_int_equal(ferry_consumer_recv(c, 1000 * MS, &next, 1, &got), FERRY_PRODUCER_GONE);
    int mapped = pool_mappings();
    CUcontext before = NULL, after = NULL;
    if (device_count() > 1)
        assert_int_equal(ferry__cuda_use_device(cu, 1), FERRY_OK);
    assert_int_equal(cu->cuCtxGetCurrent(&before), CUDA_SUCCESS);
    ferry_consumer_destroy(c);
    assert_int_equal(cu->cuCtxGetCurrent(&after), CUDA_SUCCESS);
    assert_ptr_equal(before, after);
    assert_int_equal(ferry__cuda_use_device(cu, 0), FERRY_OK);
    assert_true(pool_mappings() < mapped);
}

/* A part of a packed lease acknowledged on a stream by a thread that never made a CUDA
 * context current (the first part: nothing is queued, the lease is not whole yet). */
static void *ack_first_part(void *arg)
{
    ferry_consumer *c = ((ferry_consumer **)arg)[0];
    const ferry_descriptor *d = ((ferry_descriptor **)arg)[1];
    assert_int_equal(ferry_consumer_ack_async(c, d, NULL), FERRY_OK);
    return NULL;
}

/* The tracking of a lent rank's stream work makes the pool's context current itself: a
 * stream-ordered acknowledgement from a thread without one does not keep the rank from
 * being given back. */
static void given_back_contextless_test(int placement)
{
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    ferry_pool *pool = listening_pool(placement, 1, raddr);
    if (!pool)
        skip();
    static uint8_t a[GIVEN_BACK_ITEM], b[GIVEN_BACK_ITEM];
    ferry_tensor t[2] = {ferry_tensor_bytes(sizeof(a)), ferry_tensor_bytes(sizeof(b))};
    const void *srcs[2] = {a, b};
    ferry_descriptor d[2];
    assert_int_equal(ferry_pool_publish_many(pool, t, srcs, 2, 1000 * MS, d), FERRY_OK);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(raddr, 0, 0, &c), FERRY_OK);
    void *arg[2] = {c, &d[0]};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, ack_first_part, arg), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    ferry_consumer_destroy(c);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_false(info.alive); /* given back */
    if (ferry_pool_drain(pool, 1000 * MS) != FERRY_OK)
        fail_msg("drain: %s", ferry_last_error());
    ferry_pool_destroy(pool);
    ferry__cache_sweep();
}

static void *destroy_consumer(void *c)
{
    ferry_consumer_destroy(c);
    return NULL;
}

/* Two give-backs of one rank in flight: A's, waiting for its read, and that of B, a consumer
 * of the rank connected meanwhile (which keeps the rank from A's give-back) and destroyed
 * while its own read waits. Only the latest ends: A's, timed out on B's read (5 s), neither
 * releases the rank nor drops it; B's releases it once its read has run. */
static void given_back_overlap_test(int placement)
{
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    ferry_pool *pool = listening_pool(placement, 1, raddr);
    if (!pool)
        skip();
    enum { N = GIVEN_BACK_ITEM };
    static uint8_t first[N], out[N];
    memset(first, 0xaa, N);
    ferry_tensor t = ferry_tensor_bytes(N);
    ferry_descriptor d;
    assert_int_equal(ferry_pool_publish(pool, &t, first, 1000 * MS, &d), FERRY_OK);
    ferry_consumer *c[2];
    CUstream s[2];
    CUdeviceptr dst[2];
    gate g[2];
    pthread_t destroying[2];
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ferry_consumer_connect(raddr, 0, 0, &c[i]), FERRY_OK);
        assert_int_equal(cu->cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        dst[i] = dev_alloc(N);
        g[i] = gate_stream(s[i]);
        assert_int_equal(ferry_consumer_read_async(c[i], &d, (void *)(uintptr_t)dst[i], N, s[i]),
                         FERRY_OK);
        assert_int_equal(pthread_create(&destroying[i], NULL, destroy_consumer, c[i]), 0);
        /* In its wait by then; B's wait ends 2 s after A's (its margin once A's is out). */
        struct timespec settle = {i == 0 ? 2 : 0, 100 * 1000 * 1000};
        nanosleep(&settle, NULL);
    }
    gate_open(&g[0]);
    assert_int_equal(pthread_join(destroying[0], NULL), 0);
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_true(info.alive && info.pid == getpid());
    gate_open(&g[1]);
    assert_int_equal(pthread_join(destroying[1], NULL), 0);
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_false(info.alive);
    for (int i = 0; i < 2; i++) {
        gate_free(&g[i]);
        assert_int_equal(cu->cuMemcpy((CUdeviceptr)(uintptr_t)out, dst[i], N), CUDA_SUCCESS);
        assert_int_equal(out[0], 0xaa);
        cu->cuMemFree(dst[i]);
        cu->cuStreamDestroy(s[i]);
    }
    if (ferry_pool_drain(pool, 1000 * MS) != FERRY_OK)
        fail_msg("drain: %s", ferry_last_error());
    ferry_pool_destroy(pool);
    ferry__cache_sweep();
}

static void test_given_back_rank(void **state)
{
    (void)state;
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    for (int placement = FERRY_CONTROL_HOST; placement <= FERRY_CONTROL_DEVICE; placement++) {
        given_back_stream_test(placement, 0);
        given_back_stream_test(placement, 1);
        given_back_view_test(placement);
    }
    given_back_contextless_test(FERRY_CONTROL_HOST);
    given_back_contextless_test(FERRY_CONTROL_DEVICE);
    given_back_overlap_test(FERRY_CONTROL_HOST); /* 5 s: one placement */
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
}

static void test_consumer_without_context(void **state)
{
    (void)state;
    for (int placement = FERRY_CONTROL_HOST; placement <= FERRY_CONTROL_DEVICE; placement++) {
        ferry_pool *pool = make_pool(4 << 20, 1, placement);
        source src = make_source();
        th_helper h = th_spawn_helper("fresh", "", "");
        ferry_descriptor d = publish_item(pool, &src, 2, 70000, 0);
        th_send_item(h.fd, &d, 102, 0);
        th_assert_result(th_finish_helper(&h, 60000), 1);
        th_wait_drained(pool);
        free_source(&src);
        ferry_pool_destroy(pool);
    }
}

static void test_consumer_killed(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(8 << 20, 2, FERRY_CONTROL_HOST);
    source src = make_source();
    th_helper good = th_spawn_helper("consumer", "0", "0:async");
    th_helper bad = th_spawn_helper("consumer", "1", "0:hold");
    th_msg m;
    for (int i = 0; i < 4; i++) {
        ferry_descriptor d = publish_item(pool, &src, i, MAX_ITEM, 20000 * MS);
        th_send_item(good.fd, &d, (uint64_t)(100 + i % 4), 0);
        th_send_item(bad.fd, &d, (uint64_t)(100 + i % 4), 0);
        assert_int_equal(th_recv_msg(bad.fd, &m, 20000), 0);
        assert_int_equal(m.status, FERRY_OK);
    }
    kill(bad.pid, SIGKILL);
    int status;
    waitpid(bad.pid, &status, 0);
    close(bad.fd);
    /* 8 MiB of pool: 30 more 1 MiB items fit only if the dead rank's leases come back. */
    for (int i = 4; i < 34; i++) {
        ferry_descriptor d = publish_item(pool, &src, i, MAX_ITEM, 20000 * MS);
        th_send_item(good.fd, &d, (uint64_t)(100 + i % 4), 0);
    }
    th_send_type(good.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&good, 60000), 34);
    th_wait_drained(pool);
    assert_true(th_stats(pool).acked_for_dead >= 4);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void producer_killed(const char *placement)
{
    th_helper prod = th_spawn_helper("producer", placement, "");
    th_msg m;
    assert_int_equal(th_recv_msg(prod.fd, &m, 60000), 0);
    ferry_descriptor d;
    assert_int_equal(ferry_descriptor_decode(m.desc, sizeof(m.desc), &d), FERRY_OK);
    ferry_consumer *c;
    assert_int_equal(ferry_consumer_create_on(0, 0, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_wait(c, &d, 20 * MS), FERRY_TIMEOUT);
    kill(prod.pid, SIGKILL);
    uint64_t t0 = ferry__now_ns();
    assert_int_equal(ferry_consumer_wait(c, &d, 30000 * MS), FERRY_PRODUCER_GONE);
    assert_true(ferry__now_ns() - t0 < 2000 * MS);
    ferry_consumer_destroy(c);
    int status;
    waitpid(prod.pid, &status, 0);
    close(prod.fd);
}

static void test_producer_killed(void **state)
{
    (void)state;
    producer_killed("0");
    producer_killed("1");
}

/* ---- fault injection (fake driver only) ------------------------------------------------ */

/* Each construction step failing in turn: the first cause is reported with the driver's
 * error name, and nothing is left behind. */
typedef struct step {
    const char *call;
    int placement;
    int code;
    ferry_status status;
} step;

static const step ipc_steps[] = {
    {"cuMemAlloc", FERRY_CONTROL_HOST, 2, FERRY_NO_MEMORY},
    {"cuMemHostRegister", FERRY_CONTROL_HOST, 1, FERRY_DRIVER},
    {"cuMemHostGetDevicePointer", FERRY_CONTROL_HOST, 1, FERRY_DRIVER},
    {"cuIpcGetMemHandle", FERRY_CONTROL_HOST, 801, FERRY_DRIVER},
    {"cuMemsetD32", FERRY_CONTROL_DEVICE, 1, FERRY_DRIVER},
    {"cuIpcGetMemHandle", FERRY_CONTROL_DEVICE, 801, FERRY_DRIVER},
    {NULL, 0, 0, 0},
};

static const step vmm_steps[] = {
    {"cuMemCreate", FERRY_CONTROL_HOST, 2, FERRY_NO_MEMORY},
    {"cuMemAddressReserve", FERRY_CONTROL_HOST, 2, FERRY_NO_MEMORY},
    {"cuMemMap", FERRY_CONTROL_HOST, 1, FERRY_DRIVER},
    {"cuMemSetAccess", FERRY_CONTROL_HOST, 1, FERRY_DRIVER},
    {"cuMemHostRegister", FERRY_CONTROL_HOST, 1, FERRY_DRIVER},
    {"cuMemExportToShareableHandle", FERRY_CONTROL_HOST, 801, FERRY_DRIVER},
    {"cuMemsetD32", FERRY_CONTROL_DEVICE, 1, FERRY_DRIVER},
    {"cuMemExportToShareableHandle", FERRY_CONTROL_DEVICE, 801, FERRY_DRIVER},
    {NULL, 0, 0, 0},
};

/* Each construction step failing in turn: the first cause is reported with the driver's
 * error name, and every step done before it is undone exactly once. */
static void test_create_rollback(void **state)
{
    (void)state;
    fake_control f;
    if (!fake_of(&f))
        skip();
    /* One pool first, so that the handle-type probes (cached) are behind us. */
    ferry_pool_destroy(make_pool(4 << 20, 1, FERRY_CONTROL_HOST));
    int base = f.live();
    const step *steps = backend == FERRY_BACKEND_CUDA_VMM ? vmm_steps : ipc_steps;
    for (const step *st = steps; st->call; st++) {
        ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
        c.backend = backend;
        c.memory_size = 4 << 20;
        c.control_placement = st->placement;
        ferry_pool *pool = (ferry_pool *)0x1;
        f.inject(st->call, 1, st->code);
        assert_int_equal(ferry_pool_create(&c, &pool), st->status);
        f.inject(st->call, 0, 0);
        char want[64];
        snprintf(want, sizeof(want), "%s failed: CUDA_ERROR_", st->call);
        if (!strstr(ferry_last_error(), want))
            fail_msg("step %s: %s", st->call, ferry_last_error());
        assert_ptr_equal(pool, (ferry_pool *)0x1);
        assert_int_equal(f.live(), base);
    }
    /* And a pool made afterwards works and releases everything. */
    ferry_pool_destroy(make_pool(4 << 20, 1, FERRY_CONTROL_DEVICE));
    assert_int_equal(f.live(), base);
}

/* A publish whose copy fails gives its slice back; when the cleanup fails too (control words
 * on the device, written on ferry's own stream: cuStreamWriteValue32 refused), the pool is
 * failed from then on, with both causes. */
static void test_publish_failures(void **state)
{
    (void)state;
    fake_control f;
    if (!fake_of(&f))
        skip();
    /* No background reclaim: it reads the device's control words with cuMemcpyAsync on
     * ferry's own stream, and would take the failure injected for the publish's copy. */
    ferry_pool_config cfg = pool_config(4 << 20, 1, FERRY_CONTROL_DEVICE);
    cfg.reclaim_interval_us = 3600ll * 1000000;
    ferry_pool *pool = create_pool(&cfg);
    source src = make_source();
    ferry_tensor t = ferry_tensor_bytes(4096);
    ferry_descriptor d;
    const void *from = (const void *)(uintptr_t)src.dev[0];
    f.inject("cuMemcpyAsync", 1, 1);
    assert_int_equal(ferry_pool_publish_async(pool, &t, from, src.stream, 0, &d), FERRY_DRIVER);
    assert_non_null(strstr(ferry_last_error(), "cuMemcpyAsync failed: CUDA_ERROR_INVALID_VALUE"));
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.leases_in_flight, 0);
    assert_int_equal(ferry_pool_error(pool, NULL, 0), FERRY_OK);
    f.inject("cuMemcpyAsync", 1, 1);
    f.inject("cuStreamWriteValue32", 1, 1);
    assert_int_equal(ferry_pool_publish_async(pool, &t, from, src.stream, 0, &d), FERRY_DRIVER);
    assert_non_null(strstr(ferry_last_error(), "cuMemcpyAsync failed"));
    char cause[512];
    assert_int_equal(ferry_pool_error(pool, cause, sizeof(cause)), FERRY_POOL_FAILED);
    assert_non_null(strstr(cause, "its cleanup failed too: cuStreamWriteValue32 failed"));
    char want[64];
    snprintf(want, sizeof(want), "%s pool failed",
             backend == FERRY_BACKEND_CUDA_VMM ? "CUDA VMM multimodal" : "CUDA IPC");
    assert_int_equal(ferry_pool_publish_async(pool, &t, from, src.stream, 0, &d),
                     FERRY_POOL_FAILED);
    assert_string_equal(ferry_last_error(), want);
    free_source(&src);
    ferry_pool_destroy(pool);
}

/* A consumer whose first cuIpcOpenMemHandle fails tries once more, and reports a second
 * failure with the driver's error name. */
static void test_open_retry(void **state)
{
    (void)state;
    fake_control f;
    if (!fake_of(&f) || backend != FERRY_BACKEND_CUDA_IPC)
        skip();
    setenv("FERRY_FAKE_CUDA_FAIL", "cuIpcOpenMemHandle:1:400", 1);
    ferry_pool *pool = make_pool(8 << 20, 2, FERRY_CONTROL_HOST);
    source src = make_source();
    th_helper once = th_spawn_helper("consumer", "0", "0:async");
    setenv("FERRY_FAKE_CUDA_FAIL", "cuIpcOpenMemHandle:0:400", 1);
    th_helper never = th_spawn_helper("consumer", "1", "0:async");
    unsetenv("FERRY_FAKE_CUDA_FAIL");
    ferry_descriptor d = publish_item(pool, &src, 0, 4096, 0);
    th_send_item(once.fd, &d, 100, 0);
    th_send_item(never.fd, &d, 100, 0);
    th_send_type(once.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&once, 60000), 1);
    th_msg m = th_finish_helper(&never, 60000);
    assert_int_equal(m.status, FERRY_DRIVER);
    assert_non_null(strstr(m.text, "cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_HANDLE"));
    th_wait_drained(pool); /* rank 1's process is gone: its acknowledgement is written for it */
    free_source(&src);
    ferry_pool_destroy(pool);
}

/* The next RESULT of a helper that keeps running (status 0xdead if none came). */
static th_msg next_result(th_helper *h)
{
    th_msg m = {0};
    if (th_recv_msg(h->fd, &m, 60000) != 0 || m.type != TH_MSG_RESULT)
        m.status = 0xdead;
    return m;
}

/* Stream-ordered reads in a consumer process, counted by the fake driver: a lease whose ready
 * word the consumer already saw (ferry_consumer_wait) costs no cuStreamWaitValue32 when the
 * control words are in host memory, one per call when they are on the device; a lease still
 * pending (the producer's stream held back) costs one per call either way. */
static void ready_wait_test(int placement)
{
    int host = placement == FERRY_CONTROL_HOST;
    ferry_pool *pool = make_pool(8 << 20, 1, placement);
    source src = make_source();
    th_helper h = th_spawn_helper("waits", "", "");
    ferry_descriptor d = publish_item(pool, &src, 0, 70000, 0);
    th_send_item(h.fd, &d, 100, ITEM_WAIT_FIRST);
    th_msg m = next_result(&h);
    if (m.status != FERRY_OK)
        fail_msg("consumer failed with %u: %s", m.status, m.text);
    assert_int_equal(m.seed, host ? WAITS(0, 0) : WAITS(1, 1));
    th_assert_result(next_result(&h), 1);
    /* Not ready: the gate holds the copy and the ready write back until the consumer has
     * made its calls. */
    gate g = gate_stream(src.stream);
    d = publish_item(pool, &src, 1, 70000, 0);
    th_send_item(h.fd, &d, 101, 0);
    m = next_result(&h);
    int done = 7;
    ferry_status st = ferry_pool_copied(pool, &d, &done);
    gate_open(&g);
    if (m.status != FERRY_OK)
        fail_msg("consumer failed with %u: %s", m.status, m.text);
    assert_int_equal(st, FERRY_OK);
    assert_int_equal(done, 0); /* it was still pending when the consumer reported */
    assert_int_equal(m.seed, WAITS(1, 1));
    th_assert_result(next_result(&h), 2);
    gate_free(&g);
    th_send_type(h.fd, TH_MSG_DONE);
    th_assert_result(th_finish_helper(&h, 60000), 2);
    th_wait_drained(pool);
    free_source(&src);
    ferry_pool_destroy(pool);
}

static void test_ready_wait_skipped(void **state)
{
    (void)state;
    if (!fake_calls())
        skip();
    ready_wait_test(FERRY_CONTROL_HOST);
    ready_wait_test(FERRY_CONTROL_DEVICE);
}

/* ---- CUDA VMM only ------------------------------------------------------------------------ */

static ferry_pool_config vmm_config(int64_t size, int handle)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_CUDA_VMM;
    c.memory_size = size;
    c.vmm_handle = handle;
    return c;
}

/* On these machines (and in the fake) cuMemCreate refuses FABRIC: a pool that requires it
 * fails with the documented message, one that allows the fallback uses POSIX_FD. */
static void test_vmm_handle_types(void **state)
{
    (void)state;
    if (backend != FERRY_BACKEND_CUDA_VMM)
        skip();
    ferry_pool_config c = vmm_config(4 << 20, FERRY_VMM_HANDLE_FABRIC);
    ferry_pool *pool = (ferry_pool *)0x1;
    ferry_status st = ferry_pool_create(&c, &pool);
    if (st == FERRY_OK) { /* a machine with an IMEX channel grants FABRIC */
        ferry_descriptor d;
        assert_int_equal(ferry_pool_describe(pool, &d), FERRY_OK);
        assert_true(d.flags & FERRY_DESC_FLAG_FABRIC);
        ferry_pool_destroy(pool);
        return;
    }
    assert_int_equal(st, FERRY_NOT_SUPPORTED);
    assert_non_null(strstr(ferry_last_error(), "CUDA VMM multimodal transport selected POSIX_FD, "
                                               "but this pool requires FABRIC"));
    assert_ptr_equal(pool, (ferry_pool *)0x1);
    c.vmm_handle = FERRY_VMM_HANDLE_AUTO;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_OK);
    ferry_descriptor d;
    assert_int_equal(ferry_pool_describe(pool, &d), FERRY_OK);
    assert_false(d.flags & FERRY_DESC_FLAG_FABRIC);
    ferry_pool_destroy(pool);
}

/* The size is rounded down to the granularity; below one granule the pool is refused. */
static void test_vmm_granularity(void **state)
{
    (void)state;
    if (backend != FERRY_BACKEND_CUDA_VMM)
        skip();
    ferry_pool_config c = vmm_config(1 << 20, FERRY_VMM_HANDLE_AUTO);
    ferry_pool *pool = (ferry_pool *)0x1;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(),
                        "memory_size=1048576 is smaller than CUDA VMM granularity=2097152");
    /* Below one granule with the default control table: the granularity is reported, as the
     * reference does, not the control metadata. */
    c = vmm_config(4096, FERRY_VMM_HANDLE_AUTO);
    c.max_inflight_slices = 4096;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(),
                        "memory_size=4096 is smaller than CUDA VMM granularity=2097152");
    c.memory_size = (3 << 20) + 12345;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_OK);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.capacity, 2 << 20);
    ferry_descriptor d;
    assert_int_equal(ferry_pool_describe(pool, &d), FERRY_OK);
    assert_int_equal(d.pool_size, 2 << 20);
    ferry_pool_destroy(pool);
}

/* A failure of the POSIX FD broker is latched: every later publish fails, and the first
 * cause stays retrievable. */
static void test_vmm_broker_failure_latched(void **state)
{
    (void)state;
    if (backend != FERRY_BACKEND_CUDA_VMM)
        skip();
    ferry_pool *pool = make_pool(4 << 20, 1, FERRY_CONTROL_HOST);
    source src = make_source();
    ferry_descriptor d = publish_item(pool, &src, 0, 4096, 0);
    assert_int_equal(ferry_pool_error(pool, NULL, 0), FERRY_OK);
    /* Break the fd broker's listening socket: its thread latches the failure. */
    assert_int_equal(ferry__vmm_break_broker_for_tests(pool), 0);
    ferry_tensor t = ferry_tensor_bytes(4096);
    ferry_status st = FERRY_OK;
    for (int i = 0; i < 2000 && st == FERRY_OK; i++) {
        st = ferry_pool_publish_async(pool, &t, (void *)(uintptr_t)src.dev[0], src.stream, 0, &d);
        if (st == FERRY_OK)
            assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_OK);
        usleep(1000);
    }
    assert_int_equal(st, FERRY_POOL_FAILED);
    assert_string_equal(ferry_last_error(), "CUDA VMM multimodal pool failed");
    char cause[256];
    assert_int_equal(ferry_pool_error(pool, cause, sizeof(cause)), FERRY_POOL_FAILED);
    assert_non_null(strstr(cause, "CUDA VMM POSIX FD broker failed"));
    assert_int_equal(
        ferry_pool_publish_async(pool, &t, (void *)(uintptr_t)src.dev[0], src.stream, 0, &d),
        FERRY_POOL_FAILED);
    free_source(&src);
    ferry_pool_destroy(pool);
}

typedef struct copy_job {
    ferry_pool *pool;
    const void *src;
    size_t n;
    ferry_status status;
    uint64_t done_ns;
} copy_job;

static void *publish_big(void *arg)
{
    copy_job *j = arg;
    ferry_tensor t = ferry_tensor_bytes(j->n);
    ferry_descriptor d;
    j->status = ferry_pool_publish(j->pool, &t, j->src, 0, &d);
    j->done_ns = ferry__now_ns();
    return NULL;
}

/* Shutdown refuses new publishers, waits for the one inside its copy, then releases; closing
 * twice is harmless. */
static void test_shutdown_during_copy(void **state)
{
    (void)state;
    size_t n = 64 << 20;
    ferry_pool *pool = make_pool(80 << 20, 1, FERRY_CONTROL_HOST);
    uint8_t *big = malloc(n);
    memset(big, 0x5a, n);
    copy_job job = {.pool = pool, .src = big, .n = n, .status = 0xdead};
    pthread_t th;
    pthread_create(&th, NULL, publish_big, &job);
    usleep(200);
    ferry_pool_close(pool);
    uint64_t closed_ns = ferry__now_ns();
    pthread_join(th, NULL);
    /* The publisher either got in first (and close waited for it) or was refused. */
    if (job.status == FERRY_OK)
        assert_true(job.done_ns <= closed_ns);
    else
        assert_int_equal(job.status, FERRY_CLOSING);
    ferry_tensor t = ferry_tensor_bytes(16);
    ferry_descriptor d;
    char want[64];
    snprintf(want, sizeof(want), "%s pool is closing",
             backend == FERRY_BACKEND_CUDA_VMM ? "CUDA VMM multimodal" : "CUDA IPC");
    assert_int_equal(ferry_pool_publish(pool, &t, big, 0, &d), FERRY_CLOSING);
    assert_string_equal(ferry_last_error(), want);
    assert_int_equal(ferry_pool_reclaim(pool, NULL), FERRY_CLOSING);
    ferry_pool_close(pool);
    ferry_pool_destroy(pool);
    free(big);
}

static void test_no_driver(void **state)
{
    (void)state;
    const char *saved = getenv("FERRY_CUDA_DRIVER");
    char *copy = saved ? strdup(saved) : NULL;
    setenv("FERRY_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    th_helper h = th_spawn_helper("nodriver", "", "");
    if (copy) {
        setenv("FERRY_CUDA_DRIVER", copy, 1);
        free(copy);
    } else {
        unsetenv("FERRY_CUDA_DRIVER");
    }
    th_msg m = th_finish_helper(&h, 60000);
    assert_int_equal(m.status, FERRY_NOT_SUPPORTED);
    char want[64];
    snprintf(want, sizeof(want), "%s pool needs the CUDA driver: no CUDA driver", transport_name());
    assert_non_null(strstr(m.text, want));
}

/* The fake driver's control functions for stream-ordered memory; 0 on the real driver. */
typedef unsigned long long (*pool_bytes_fn)(void);

static pool_bytes_fn fake_pool_bytes(void)
{
    void *sym = dlsym(cu->library, "ferry_fake_cuda_pool_bytes");
    pool_bytes_fn fn;
    memcpy(&fn, &sym, sizeof(sym));
    return fn;
}

/* ferry_gpu_alloc_async: memory usable in stream order on its stream, and on another stream
 * ordered after it by an event; once freed, handed out again without the driver's allocator
 * (the fake counts its calls and the pool's bytes: flat over many items); a free waits in its
 * stream's order, so a block freed behind unfinished work is not handed out meanwhile; trimmed
 * on request. */
static void test_alloc_async(void **state)
{
    (void)state;
    CUstream a, b;
    assert_int_equal(cu->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    const size_t n = 3 << 20;
    uint8_t *host = malloc(n);
    th_fill(host, n, 21);
    void *p = NULL;
    assert_int_equal(ferry_gpu_alloc_async(0, n, a, NULL), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_gpu_alloc_async(99, n, a, &p), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_gpu_alloc_async(0, n, a, &p), FERRY_OK);
    CUdeviceptr src = dev_alloc(n), out = dev_alloc(n);
    assert_int_equal(cu->cuMemcpy(src, (CUdeviceptr)(uintptr_t)host, n), CUDA_SUCCESS);
    gate g = gate_stream(a); /* the copy in waits behind it: b must wait for the copy */
    assert_int_equal(ferry_gpu_copy_async(0, p, (void *)(uintptr_t)src, n, a), FERRY_OK);
    void *ev = NULL;
    assert_int_equal(ferry_gpu_event_record(0, a, &ev), FERRY_OK);
    assert_int_equal(ferry_gpu_stream_wait_event(0, b, ev), FERRY_OK);
    assert_int_equal(ferry_gpu_stream_wait_event(0, b, NULL), FERRY_OK);
    assert_int_equal(ferry_gpu_copy_async(0, (void *)(uintptr_t)out, p, n, b), FERRY_OK);
    memset(host, 0, n);
    assert_int_equal(cu->cuStreamQuery(b), CUDA_ERROR_NOT_READY); /* behind a's gate */
    gate_open(&g);
    assert_int_equal(ferry_gpu_stream_synchronize(0, b), FERRY_OK);
    assert_int_equal(cu->cuMemcpy((CUdeviceptr)(uintptr_t)host, out, n), CUDA_SUCCESS);
    assert_true(th_check(host, n, 21));
    ferry_gpu_event_destroy(0, ev);
    assert_int_equal(ferry_gpu_free_async(0, p, b), FERRY_OK); /* on the stream that used it */
    assert_int_equal(ferry_gpu_free_async(0, NULL, b), FERRY_OK);

    call_counter calls = fake_calls();
    pool_bytes_fn held = fake_pool_bytes();
    unsigned long allocs = calls ? calls("cuMemAlloc") : 0;
    assert_int_equal(ferry_gpu_stream_synchronize(0, b), FERRY_OK);
    unsigned long long base = held ? held() : 0;
    for (int i = 0; i < 100; i++)
        assert_int_equal(async_round_trip(a, n - (size_t)i * 4096, (uint64_t)i), FERRY_OK);
    if (calls) {
        assert_int_equal(calls("cuMemAlloc"), allocs);
        assert_true(held() == base); /* the first block, again and again */
    }
    if (held) { /* a free behind unfinished work does not hand the block out early */
        void *q = NULL, *r = NULL;
        assert_int_equal(ferry_gpu_alloc_async(0, n, a, &q), FERRY_OK);
        gate h = gate_stream(b);
        assert_int_equal(ferry_gpu_free_async(0, q, b), FERRY_OK);
        assert_int_equal(ferry_gpu_alloc_async(0, n, a, &r), FERRY_OK);
        assert_ptr_not_equal(r, q);
        gate_free(&h);
        assert_int_equal(ferry_gpu_free_async(0, r, a), FERRY_OK);
        assert_int_equal(ferry_gpu_stream_synchronize(0, a), FERRY_OK);
        assert_int_equal(ferry_gpu_trim(0, 0), FERRY_OK);
        assert_true(held() == 0);
    }
    assert_int_equal(ferry_gpu_trim(0, 0), FERRY_OK);
    assert_int_equal(ferry_gpu_trim(99, 0), FERRY_INVALID_ARGUMENT);
    gate_free(&g);
    cu->cuMemFree(src);
    cu->cuMemFree(out);
    free(host);
    assert_int_equal(cu->cuStreamDestroy(a), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(b), CUDA_SUCCESS);
}

/* A driver without the stream-ordered allocator (the fake, hiding it): ferry_gpu_alloc_async
 * takes cuMemAlloc instead and says so once. */
static void test_alloc_async_without_pools(void **state)
{
    (void)state;
    if (!fake_calls())
        skip(); /* the real driver has them */
    setenv("FERRY_FAKE_CUDA_HIDE", "cuMemAllocFromPoolAsync", 1);
    th_helper h = th_spawn_helper("plainalloc", "", "");
    unsetenv("FERRY_FAKE_CUDA_HIDE");
    th_assert_result(th_finish_helper(&h, 60000), 2 * 10 + 1);
}

/* ferry_gpu_driver_symbol hands out the loaded driver's own entry points, and refuses names
 * the driver does not have. */
static void test_driver_symbol(void **state)
{
    (void)state;
    typedef int (*count_fn)(int *);
    void *fn = NULL;
    int count = -1;
    assert_int_equal(ferry_gpu_driver_symbol("cuDeviceGetCount", 2000, &fn), FERRY_OK);
    count_fn get_count;
    memcpy(&get_count, &fn, sizeof(fn));
    assert_int_equal(get_count(&count), 0);
    assert_int_equal(count, cu->device_count);
    fn = (void *)0x1;
    assert_int_equal(ferry_gpu_driver_symbol("cuNoSuchCall", 12000, &fn), FERRY_NOT_SUPPORTED);
    assert_non_null(strstr(ferry_last_error(), "has no cuNoSuchCall for CUDA 12000"));
    assert_ptr_equal(fn, (void *)0x1);
    assert_int_equal(ferry_gpu_driver_symbol(NULL, 12000, &fn), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_gpu_driver_symbol("cuInit", 2000, NULL), FERRY_INVALID_ARGUMENT);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0) {
        const char *b = getenv("FERRY_TEST_BACKEND");
        if (b && ferry_backend_parse(b, &backend) != FERRY_OK)
            return 2;
        return helper_main(argc, argv);
    }
    signal(SIGPIPE, SIG_IGN);
    if (ferry__cuda_get(&cu) != FERRY_OK || cu->device_count < 1 ||
        ferry__cuda_use_device(cu, 0) != FERRY_OK) {
        printf("skipped: %s\n", cu ? "no CUDA device" : ferry_last_error());
        return 77;
    }
    printf("driver %s, %d device(s)\n", cu->path, cu->device_count);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_host_control),
        cmocka_unit_test(test_round_trip_device_control),
        cmocka_unit_test(test_second_gpu),
        cmocka_unit_test(test_stale_and_cancelled),
        cmocka_unit_test(test_pool_full_then_recovery),
        cmocka_unit_test(test_reserve_commit_and_many),
        cmocka_unit_test(test_copied_follows_stream),
        cmocka_unit_test(test_same_process_consumer),
        cmocka_unit_test(test_given_back_rank),
        cmocka_unit_test(test_view_after_ack_on_behalf),
        cmocka_unit_test(test_same_process_view_outlives_pool),
        cmocka_unit_test(test_release_waits_for_stream_work),
        cmocka_unit_test(test_consumer_without_context),
        cmocka_unit_test(test_consumer_killed),
        cmocka_unit_test(test_producer_killed),
        cmocka_unit_test(test_no_driver),
        cmocka_unit_test(test_driver_symbol),
        cmocka_unit_test(test_alloc_async),
        cmocka_unit_test(test_alloc_async_without_pools),
        cmocka_unit_test(test_create_rollback),
        cmocka_unit_test(test_open_retry),
        cmocka_unit_test(test_ready_wait_skipped),
        cmocka_unit_test(test_publish_failures),
        cmocka_unit_test(test_vmm_handle_types),
        cmocka_unit_test(test_vmm_granularity),
        cmocka_unit_test(test_vmm_broker_failure_latched),
        cmocka_unit_test(test_shutdown_during_copy),
    };
    int failed = 0;
    const ferry_backend backends[] = {FERRY_BACKEND_CUDA_IPC, FERRY_BACKEND_CUDA_VMM};
    for (size_t i = 0; i < 2; i++) {
        backend = backends[i];
        setenv("FERRY_TEST_BACKEND", ferry_backend_name(backend), 1);
        failed += _cmocka_run_group_tests(ferry_backend_name(backend), tests,
                                          sizeof(tests) / sizeof(tests[0]), NULL, NULL);
    }
    return failed ? 1 : 0;
}
