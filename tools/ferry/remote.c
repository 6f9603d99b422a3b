/* --mode remote: consumers of a pool made with cfg.listen, connected by its remote address
 * (UCX), against a floor of bare UCX between the same processes, in the same run
 * (docs/cli.md): (a) the hand-over latency of a small item, (b) the throughput of large ones.
 *
 * ferry: ferry_pool_send to every consumer; each consumer's ferry_consumer_recv, _read (into
 * host or GPU memory) and _ack. The floor: the producer copies the same bytes into a ring in
 * memory it registered with UCX once and queues the item's place for a thread of its own,
 * the only caller of its UCX worker as the pool's server thread is of the pool's, which sends
 * each consumer an active message with the place; the consumer gets the bytes (ucp_get_nbx)
 * into the same buffer and answers with an active message, after which the producer may reuse
 * the place. An item is handed over when every consumer's progress word says so, for both.
 * That is the latency rows. The throughput rows time reads alone: a pool's worth of items is
 * put in first (ferry: sent; floor: copied into the ring), then each consumer times each of
 * its reads: ferry_consumer_read + _ack of a lease it received, against one ucp_get_nbx of
 * the item's place into its buffer (registered once) with nothing else: a bare get. */
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gpu.h"
#include "ucx.h"

enum { K_FERRY = 0, K_FLOOR = 1, KINDS = 2, PH_CONTROL = 2 };
/* A consumer's counters (stat[]): items checked in full, then the read time of each kind,
 * then ferry's reads alone (without their acknowledgements). */
enum { STAT_FERRY_READ_ALONE = 1 + KINDS };
enum { MSG_CONNECT = 10, MSG_LOOP = 11 }; /* gpu.h numbers 8 and 9 */
enum { MEM_HOST = 0, MEM_DEVICE = 1 };
/* A LOOP message's flags: the memory read into, and whether the items are already in the pool
 * (a throughput row's reads) or come one by one (a latency row's hand-overs). */
#define LOOP_MEMORY 0x1u
#define LOOP_READS  0x2u

#define AM_ITEM       0x51     /* producer to consumer: the floor's item (floor_item) */
#define AM_ACK        0x52     /* consumer to producer: done with it (floor_ack) */
#define SPIN_NS       50000ull /* as long as ferry's remote receiver spins before it sleeps */
#define SLICE_NS      10000000ull
#define SLOT_ALIGN    256u
#define PRODUCER_AREA 16384u /* the region's tables: the producer's worker address and key */
#define RANK_AREA     8192u  /* then each consumer's worker address and read path */
#define PATH_SIZE     256u

static const char *const kind_names[KINDS] = {"ferry", "floor"};
static const char *const mem_names[2] = {"host", "device"};

/* How long a get of n bytes is waited for spinning before the wait sleeps: as ferry's reads
 * (SPIN_NS, and as long again as n bytes take at 16 GB/s). */
static uint64_t read_spin_ns(uint64_t n)
{
    return SPIN_NS + n / 16;
}

typedef struct floor_item {
    uint64_t item, offset, size;
} floor_item;

typedef struct floor_ack {
    uint32_t rank, reserved;
    uint64_t item;
} floor_ack;

/* The region's tables: the producer's part, then one per consumer. */
typedef struct producer_area {
    uint32_t worker_len, rkey_len;
    uint64_t base, bytes; /* the floor's ring, as the producer addresses it */
    uint8_t blob[];       /* worker address, then packed remote key */
} producer_area;

typedef struct rank_area {
    uint32_t worker_len, reserved;
    char path[PATH_SIZE]; /* how the floor's reads go, as the consumer's endpoint says */
    uint8_t worker[];
} rank_area;

/* ---- options ---------------------------------------------------------------------------- */

static const bench_opts defaults = {
    BENCH_DEFAULTS,       .consumers = 1,
    .items = 16,          .sizes = {1 << 20, 4 << 20, 16 << 20, 64 << 20},
    .nsizes = 4,          .pool_size = 256ll << 20,
    .max_inflight = 64,   .reclaim_interval_us = 1000,
    .iterations = 1000,   .warmup = 100,
    .verify_every = 10,   .producer_device = 0,
    .consumer_device = 0, .latency_size = 4096,
};

static int memories(const bench_opts *o, int *first, int *last)
{
    const char *m = o->memory_name                       ? o->memory_name
                    : ferry_backend_uses_gpu(o->backend) ? "both"
                                                         : "host";
    *first = strcmp(m, "device") == 0 ? MEM_DEVICE : MEM_HOST;
    *last = strcmp(m, "host") == 0 ? MEM_HOST : MEM_DEVICE;
    return strcmp(m, "host") == 0 || strcmp(m, "device") == 0 || strcmp(m, "both") == 0 ? 0 : -1;
}

static uint64_t max_size(const bench_opts *o)
{
    uint64_t m = (uint64_t)o->latency_size;
    for (uint32_t i = 0; i < o->nsizes; i++)
        m = o->sizes[i] > m ? o->sizes[i] : m;
    return m;
}

static const char *check_text(const bench_opts *o)
{
    int gpu = ferry_backend_uses_gpu(o->backend), first, last;
    if (memories(o, &first, &last) != 0)
        return "--consumer-memory must be host, device or both";
    if (!gpu && last == MEM_DEVICE)
        return "--consumer-memory device needs a GPU backend (--backend cuda_ipc or cuda_vmm)";
    if (!gpu && (o->producer_device != 0 || o->consumer_device != 0))
        return "--producer-device and --consumer-device need a GPU backend";
    if (o->producer_device < 0 || o->producer_device >= BENCH_MAX_RANKS || o->consumer_device < 0 ||
        o->consumer_device >= BENCH_MAX_RANKS)
        return "--producer-device and --consumer-device must be between 0 and 63";
    if (o->iterations < 1 || o->iterations > 100000000 || o->warmup < 0 || o->warmup > 100000000)
        return "--iterations must be between 1 and 100000000, --warmup between 0 and 100000000";
    if (o->items > 100000000 || o->rounds < 1 || o->rounds > o->iterations || o->rounds > o->items)
        return "--items must be at most 100000000, --rounds between 1 and --iterations and "
               "--items";
    if (o->verify_every < 1)
        return "--verify-every must be positive";
    if (o->latency_size < 16)
        return "--latency-size must be 16 bytes or more (items carry their number at both ends)";
    for (uint32_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] < 16)
            return "--item-size must be 16 bytes or more (items carry their number at both ends)";
    if (o->worker_netns && (!o->worker_netns[0] || strlen(o->worker_netns) >= 64))
        return "--worker-netns must name a namespace (63 characters at most)";
    if (o->net_devices && (!o->net_devices[0] || strlen(o->net_devices) >= 192))
        return "--worker-net-devices must list devices (191 characters at most)";
    return NULL;
}

static int check(const bench_opts *o)
{
    const char *bad = check_text(o);
    if (bad)
        fprintf(stderr, "ferry bench: %s\n", bad);
    return bad ? -1 : 0;
}

/* ---- the producer -------------------------------------------------------------------- */

typedef struct lat_row {
    int mem;
    uint64_t size, iterations;
    lat_stats lat[KINDS];
} lat_row;

typedef struct tp_row {
    int mem;
    uint64_t size, items;
    double seconds[KINDS], gbps[KINDS];
    double read_gbps; /* ferry's reads alone, without their acknowledgements */
} tp_row;

typedef struct remote_run {
    ferry_pool *pool;
    int gpu;
    uint8_t *src;        /* host: the items' bytes */
    CUdeviceptr src_dev; /* GPU: the same in device memory */
    uint64_t tail_at;    /* where the last item's tail stamp is in the source */
    /* the floor */
    ucx_node node;
    void *ring; /* pool_size bytes, registered: host memory, or device memory (GPU) */
    uint64_t ring_bytes;
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
    ucp_ep_h eps[BENCH_MAX_RANKS];
    pthread_t thread;
    int thread_running, wake_fd, stop;
    /* items the thread is to announce, [queued_head, queued_tail) (atomic; it alone sends, as
     * the pool's server thread alone forwards descriptors), and whether it may be asleep */
    floor_item *queue;
    uint64_t queued_head, queued_tail, queue_cap;
    uint32_t sleeping, send_failed;
    uint64_t sync, synced; /* floor_sync's request, and the last one the thread answered */
    uint32_t acked[BENCH_MAX_RANKS]; /* floor items each consumer answered (atomic) */
    uint32_t ack_seq, ack_waiting;   /* futex word: bumped by every answer */
    /* the row being measured */
    int mem;
    uint64_t size, window, done[KINDS], *lat[KINDS], busy_ns[KINDS];
    uint64_t read_alone_ns; /* a throughput row's: ferry's reads alone, mean over consumers */
    uint64_t floor_announced; /* 1 + the last floor item announced (answers count to it) */
    /* results */
    lat_row lrows[2];
    tp_row trows[2 * BENCH_MAX_SIZES];
    uint32_t nlrows, ntrows;
    char path[PATH_SIZE];
    uint64_t emulated; /* the pool's remote consumers whose reads are emulated */
    uint64_t admitted; /* ferry's consumers the pool's server admitted (the rest: on this host,
                        * through the pool's own mapping) */
} remote_run;

#define RS(run) ((remote_run *)(run)->state)

static uint64_t stamp_of(int k, uint64_t item)
{
    return ((uint64_t)(k + 1) << 56) | item;
}

static producer_area *producer_area_of(const bench_region *r)
{
    return (producer_area *)r->tables;
}

static rank_area *rank_area_of(const bench_region *r, uint32_t rank)
{
    return (rank_area *)((uint8_t *)r->tables + PRODUCER_AREA + (size_t)rank * RANK_AREA);
}

/* An answer from a consumer: it is done with the floor's item (answers come in order). */
static ucs_status_t on_ack(void *arg, const void *header, size_t header_len, void *data, size_t len,
                           const ucp_am_recv_param_t *param)
{
    remote_run *s = arg;
    floor_ack a;
    (void)data;
    (void)len;
    (void)param;
    if (header_len != sizeof(a))
        return UCS_OK;
    memcpy(&a, header, sizeof(a));
    if (a.rank >= BENCH_MAX_RANKS)
        return UCS_OK;
    __atomic_store_n(&s->acked[a.rank], (uint32_t)(a.item + 1), __ATOMIC_RELEASE);
    __atomic_fetch_add(&s->ack_seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->ack_waiting, __ATOMIC_SEQ_CST))
        ferry_futex_wake(&s->ack_seq);
    return UCS_OK;
}

/* Announces the queued items to every consumer, without waiting for the sends (UCX frees
 * what it is done with while the thread progresses). */
static void announce_queued(bench_run *run)
{
    remote_run *s = RS(run);
    uint64_t tail = __atomic_load_n(&s->queued_tail, __ATOMIC_ACQUIRE);
    for (uint64_t h = s->queued_head; h != tail; h++) {
        const floor_item *it = &s->queue[h % s->queue_cap];
        for (uint32_t r = 0; r < run->consumers; r++)
            if (ucx_am_post(s->eps[r], AM_ITEM, it, sizeof(*it)))
                __atomic_store_n(&s->send_failed, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&s->queued_head, tail, __ATOMIC_RELEASE);
}

/* The floor's thread, the only caller of its worker (SERIALIZED), as the pool's server thread
 * is of the pool's: progress (the gets emulated over active messages are served here), the
 * queued announcements, then a sleep until the worker or the producer has something. */
static void *floor_main(void *arg)
{
    bench_run *run = arg;
    remote_run *s = RS(run);
    if (s->gpu)
        gpu_use_device((int)run->opt->producer_device); /* gets of device memory are served here */
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        uint64_t sync = __atomic_load_n(&s->sync, __ATOMIC_ACQUIRE);
        while (ucx.ucp_worker_progress(s->node.worker)) {
        }
        announce_queued(run);
        __atomic_store_n(&s->synced, sync, __ATOMIC_RELEASE); /* floor_sync */
        if (ucx.ucp_worker_arm(s->node.worker) == UCS_ERR_BUSY)
            continue;
        /* Dekker with floor_announce: its tail store, then its look at sleeping. */
        __atomic_store_n(&s->sleeping, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->queued_tail, __ATOMIC_SEQ_CST) == s->queued_head) {
            struct pollfd p[2] = {{.fd = s->node.efd, .events = POLLIN},
                                  {.fd = s->wake_fd, .events = POLLIN}};
            uint64_t v;
            poll(p, 2, 100);
            if (read(s->wake_fd, &v, sizeof(v)) < 0) {
                /* nothing was written: the worker woke it */
            }
        }
        __atomic_store_n(&s->sleeping, 0, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* Queues the floor's item for the thread to announce, waking it if it may be asleep (as
 * ferry_pool_send queues a descriptor and signals the server thread's notify fd). */
static int floor_announce(bench_run *run, const floor_item *it)
{
    remote_run *s = RS(run);
    uint64_t tail = s->queued_tail, one = 1;
    if (__atomic_load_n(&s->send_failed, __ATOMIC_ACQUIRE))
        return run_fail(run, "the floor's thread could not send an active message");
    s->queue[tail % s->queue_cap] = *it;
    __atomic_store_n(&s->queued_tail, tail + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->sleeping, __ATOMIC_SEQ_CST) && write(s->wake_fd, &one, sizeof(one)) < 0)
        return run_fail(run, "waking the floor's thread: %s", strerror(errno));
    return 0;
}

/* Waits until every consumer answered need floor items. */
static int wait_acked(bench_run *run, uint64_t need)
{
    remote_run *s = RS(run);
    uint64_t start = ferry_now_ns();
    for (;;) {
        uint32_t seq = __atomic_load_n(&s->ack_seq, __ATOMIC_SEQ_CST), r = 0;
        while (r < run->consumers && __atomic_load_n(&s->acked[r], __ATOMIC_ACQUIRE) >= need)
            r++;
        if (r == run->consumers)
            return 0;
        uint64_t now = ferry_now_ns();
        if (run_check_often(run) != 0)
            return -1;
        if (now - start >= run->params.timeout_ns)
            return run_fail(run, "consumer rank %u did not answer floor item %llu within %llu ms",
                            r, (unsigned long long)need - 1,
                            (unsigned long long)(run->params.timeout_ns / 1000000));
        if (now - start < SPIN_NS) {
            sched_yield();
            continue;
        }
        __atomic_store_n(&s->ack_waiting, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->ack_seq, __ATOMIC_SEQ_CST) == seq)
            ferry_futex_wait(&s->ack_seq, seq, SLICE_NS);
        __atomic_store_n(&s->ack_waiting, 0, __ATOMIC_SEQ_CST);
    }
}

static int copy_to(bench_run *run, uint64_t dst_off, const void *host, uint64_t n)
{
    remote_run *s = RS(run);
    if (!s->gpu) {
        memcpy(s->src + dst_off, host, n);
        return 0;
    }
    return RUN_CU(run, "stamping an item", cuMemcpy, s->src_dev + dst_off,
                  (CUdeviceptr)(uintptr_t)host, n);
}

/* Item `item` of kind k carries its stamp in its first and last 8 bytes; the rest is the
 * seed's pattern, which the previous row's tail stamp is given back first. */
static int stamp(bench_run *run, int k, uint64_t item)
{
    remote_run *s = RS(run);
    uint64_t v = stamp_of(k, item), tail = s->size - 8;
    if (s->tail_at != tail) {
        uint8_t pattern[8];
        cli_pattern_fill(pattern, s->tail_at, 8, run->opt->seed, 0);
        if (copy_to(run, s->tail_at, pattern, 8) != 0)
            return -1;
        s->tail_at = tail;
    }
    return copy_to(run, 0, &v, 8) || copy_to(run, tail, &v, 8) ? -1 : 0;
}

static int send_ferry(bench_run *run, uint64_t item)
{
    remote_run *s = RS(run);
    ferry_tensor t = ferry_tensor_bytes(s->size);
    const void *src = s->gpu ? (const void *)(uintptr_t)s->src_dev : s->src;
    if (ferry_pool_send(s->pool, &t, &src, 1, NULL, NULL, run->params.timeout_ns, NULL) != FERRY_OK)
        return run_fail(run, "ferry_pool_send of item %llu (%llu bytes): %s",
                        (unsigned long long)item, (unsigned long long)s->size, ferry_last_error());
    return 0;
}

/* Waits until the floor's thread ends a round of its loop that began after this call: what it
 * did before (the gets of the ring it served) is ordered before what the producer does next,
 * and what the producer did before (its copies into the ring) before the gets it serves
 * after. The consumers' word says as much, but across processes, where nothing in this one
 * can see it (ThreadSanitizer). */
static int floor_sync(bench_run *run)
{
    remote_run *s = RS(run);
    uint64_t want = __atomic_add_fetch(&s->sync, 1, __ATOMIC_RELEASE), one = 1,
             start = ferry_now_ns();
    if (write(s->wake_fd, &one, sizeof(one)) < 0)
        return run_fail(run, "waking the floor's thread: %s", strerror(errno));
    while (__atomic_load_n(&s->synced, __ATOMIC_ACQUIRE) < want) {
        if (ferry_now_ns() - start >= run->params.timeout_ns)
            return run_fail(run, "the floor's thread did not answer within %llu ms",
                            (unsigned long long)(run->params.timeout_ns / 1000000));
        sched_yield();
    }
    return 0;
}

/* The source (the current item) copied into the floor's ring at offset. */
static int floor_copy(bench_run *run, uint64_t offset)
{
    remote_run *s = RS(run);
    if (!s->gpu) {
        memcpy((uint8_t *)s->ring + offset, s->src, s->size);
        return 0;
    }
    return RUN_CU(run, "the floor's copy", cuMemcpy, (CUdeviceptr)(uintptr_t)s->ring + offset,
                  s->src_dev, s->size);
}

/* The floor's item `item`, the nth of its chunk: into its place in the ring once every
 * consumer answered the one that was there, then announced. */
static int send_floor(bench_run *run, uint64_t item, uint64_t nth)
{
    remote_run *s = RS(run);
    uint64_t slot = (s->size + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    floor_item it = {item, (nth % s->window) * slot, s->size};
    if ((nth >= s->window && wait_acked(run, item + 1 - s->window) != 0) ||
        floor_copy(run, it.offset) != 0 || floor_announce(run, &it) != 0)
        return -1;
    s->floor_announced = item + 1;
    return 0;
}

/* Spins (yielding) until every consumer's progress word of kind k reaches need: the latency
 * rows time the hand-over, not how soon a sleeping producer is woken. */
static int spin_done(bench_run *run, int k, uint64_t need)
{
    uint64_t start = ferry_now_ns();
    for (;;) {
        uint32_t r = 0;
        while (r < run->consumers &&
               __atomic_load_n(&run->region.ranks[r].progress[k], __ATOMIC_ACQUIRE) >= need)
            r++;
        if (r == run->consumers)
            return 0;
        if (run_check_often(run) != 0)
            return -1;
        if (ferry_now_ns() - start >= run->params.timeout_ns)
            return run_fail(run, "consumer rank %u was not done with %s item %llu within %llu ms",
                            r, kind_names[k], (unsigned long long)need - 1,
                            (unsigned long long)(run->params.timeout_ns / 1000000));
        sched_yield();
    }
}

/* n items of kind k of the current row, each one's round trip in lat: the next is sent only
 * once every consumer is done with it; the consumers loop over them (one LOOP message). *ns
 * gets the time from the first send to the last consumer done. */
static int hand(bench_run *run, int k, uint64_t n, uint64_t *lat, uint64_t *ns)
{
    remote_run *s = RS(run);
    uint64_t first = s->done[k];
    bench_msg loop = {.type = MSG_LOOP,
                      .phase = (uint32_t)k,
                      .flags = (uint32_t)s->mem,
                      .item = n,
                      .size = s->size};
    /* Each chunk starts with the floor's ring free. */
    if ((k == K_FLOOR && wait_acked(run, s->floor_announced) != 0) ||
        run_send(run, run->consumers, &loop) != 0)
        return -1;
    uint64_t t0 = ferry_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        uint64_t item = first + i;
        if (stamp(run, k, item) != 0)
            return -1;
        uint64_t t1 = ferry_now_ns();
        if ((k == K_FERRY ? send_ferry(run, item) : send_floor(run, item, i)) != 0)
            return -1;
        s->done[k] = item + 1;
        if (spin_done(run, k, item + 1) != 0)
            return -1;
        lat[i] = ferry_now_ns() - t1;
    }
    *ns = ferry_now_ns() - t0;
    return 0;
}

static int lat_chunk(bench_run *run, int k, uint64_t begin, uint64_t end)
{
    remote_run *s = RS(run);
    uint64_t ns;
    if (hand(run, k, end - begin, s->lat[k] + begin, &ns) != 0)
        return -1;
    s->busy_ns[k] += ns;
    return 0;
}

/* The consumers' time of stat[at] so far (1 + k: kind k's reads; STAT_FERRY_READ_ALONE),
 * summed over them. */
static uint64_t read_ns(const bench_run *run, int at)
{
    uint64_t ns = 0;
    for (uint32_t r = 0; r < run->consumers; r++)
        ns += __atomic_load_n(&run->region.ranks[r].stat[at], __ATOMIC_ACQUIRE);
    return ns;
}

/* n items of kind k read by every consumer, a pool's worth at a time: each batch is put in
 * the pool first (ferry: sent; floor: copied into the ring), then read by the consumers,
 * who time their reads alone (loop's LOOP_READS): *ns gets their mean time. */
static int read_items(bench_run *run, int k, uint64_t n, uint64_t *ns)
{
    remote_run *s = RS(run);
    uint64_t before = read_ns(run, 1 + k), alone = read_ns(run, STAT_FERRY_READ_ALONE);
    uint64_t slot = (s->size + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    for (uint64_t at = 0; at < n;) {
        uint64_t batch = n - at < s->window ? n - at : s->window, first = s->done[k];
        if (k == K_FLOOR && floor_sync(run) != 0)
            return -1;
        for (uint64_t i = 0; i < batch; i++) {
            if (stamp(run, k, first + i) != 0 ||
                (k == K_FERRY ? send_ferry(run, first + i) : floor_copy(run, i * slot)) != 0)
                return -1;
        }
        if (k == K_FLOOR && floor_sync(run) != 0)
            return -1;
        bench_msg loop = {.type = MSG_LOOP,
                          .phase = (uint32_t)k,
                          .flags = (uint32_t)s->mem | LOOP_READS,
                          .item = batch,
                          .size = s->size,
                          .key = slot,
                          .seed = s->window};
        if (run_send(run, run->consumers, &loop) != 0 ||
            run_wait(run, k, run->consumers, first + batch, NULL) != 0)
            return -1;
        s->done[k] = first + batch;
        at += batch;
    }
    *ns = (read_ns(run, 1 + k) - before) / run->consumers;
    s->read_alone_ns += (read_ns(run, STAT_FERRY_READ_ALONE) - alone) / run->consumers;
    return 0;
}

static int tp_chunk(bench_run *run, int k, uint64_t begin, uint64_t end)
{
    remote_run *s = RS(run);
    uint64_t ns;
    if (read_items(run, k, end - begin, &ns) != 0)
        return -1;
    s->busy_ns[k] += ns;
    return 0;
}

/* How many items of the row's size the pool holds at once: the floor's ring holds as many. */
static int set_row(bench_run *run, int mem, uint64_t size)
{
    remote_run *s = RS(run);
    ferry_pool_stats st;
    uint64_t slot = (size + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    if (run_pool_stats(s->pool, &st) != FERRY_OK)
        return run_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
    s->mem = mem;
    s->size = size;
    s->window = st.usable_bytes / slot;
    if (s->window > (uint64_t)run->opt->max_inflight)
        s->window = (uint64_t)run->opt->max_inflight;
    if (s->window * slot > s->ring_bytes)
        s->window = s->ring_bytes / slot;
    s->busy_ns[0] = s->busy_ns[1] = 0;
    return s->window ? 0
                     : run_fail(run, "items of %llu bytes do not fit", (unsigned long long)size);
}

static int latency_row(bench_run *run, int mem)
{
    remote_run *s = RS(run);
    const bench_opts *o = run->opt;
    uint64_t n = (uint64_t)o->iterations, warm = (uint64_t)o->warmup, ns;
    lat_row *row = &s->lrows[s->nlrows];
    int rc = -1;
    if (set_row(run, mem, (uint64_t)o->latency_size) != 0)
        return -1;
    s->lat[0] = calloc(n, sizeof(uint64_t));
    s->lat[1] = calloc(n, sizeof(uint64_t));
    uint64_t *scratch = calloc(warm ? warm : 1, sizeof(uint64_t));
    if (!s->lat[0] || !s->lat[1] || !scratch)
        run_fail(run, "out of memory for %llu samples", (unsigned long long)n);
    else if ((!warm || (hand(run, K_FERRY, warm, scratch, &ns) == 0 &&
                        hand(run, K_FLOOR, warm, scratch, &ns) == 0)) &&
             run_rounds(run, n, (uint64_t)o->rounds, KINDS, lat_chunk) == 0) {
        *row = (lat_row){.mem = mem, .size = s->size, .iterations = n};
        for (int k = 0; k < KINDS; k++)
            lat_summarize(s->lat[k], n, s->busy_ns[k], &row->lat[k]);
        s->nlrows++;
        rc = 0;
    }
    for (int k = 0; k < KINDS; k++) {
        free(s->lat[k]);
        s->lat[k] = NULL;
    }
    free(scratch);
    return rc;
}

/* --items of the largest size, as many bytes of a smaller one (at least --rounds items). */
static uint64_t tp_items(const bench_opts *o, uint64_t size)
{
    uint64_t largest = 0;
    for (uint32_t i = 0; i < o->nsizes; i++)
        largest = o->sizes[i] > largest ? o->sizes[i] : largest;
    uint64_t n = (uint64_t)o->items * (largest / size);
    return n < (uint64_t)o->rounds ? (uint64_t)o->rounds : n;
}

static int throughput_row(bench_run *run, int mem, uint64_t size)
{
    remote_run *s = RS(run);
    const bench_opts *o = run->opt;
    uint64_t n = tp_items(o, size), ns;
    tp_row *row = &s->trows[s->ntrows];
    if (set_row(run, mem, size) != 0 || read_items(run, K_FERRY, 1, &ns) != 0 ||
        read_items(run, K_FLOOR, 1, &ns) != 0)
        return -1;
    s->busy_ns[0] = s->busy_ns[1] = 0;
    s->read_alone_ns = 0;
    if (run_rounds(run, n, (uint64_t)o->rounds, KINDS, tp_chunk) != 0)
        return -1;
    *row = (tp_row){.mem = mem, .size = size, .items = n};
    row->read_gbps =
        s->read_alone_ns ? (double)(n * size) / 1e9 / ((double)s->read_alone_ns / 1e9) : NAN;
    for (int k = 0; k < KINDS; k++) {
        row->seconds[k] = (double)s->busy_ns[k] / 1e9;
        row->gbps[k] = row->seconds[k] > 0 ? (double)(n * size) / 1e9 / row->seconds[k] : NAN;
    }
    s->ntrows++;
    if (!o->quiet && !o->json)
        fprintf(stderr, "ferry bench: remote, %s memory, %llu-byte items: done\n", mem_names[mem],
                (unsigned long long)size);
    return 0;
}

/* The source of every item: the seed's pattern (stamped per item), host or device memory. */
static int make_source(bench_run *run, uint64_t bytes)
{
    remote_run *s = RS(run);
    s->tail_at = 0;
    if (!s->gpu) {
        if (!(s->src = aligned_alloc(64, (bytes + 63) & ~63ull)))
            return run_fail(run, "out of memory for the items' source");
        cli_pattern_fill(s->src, 0, bytes, run->opt->seed, 0);
        return 0;
    }
    const char *why = gpu_driver_load();
    if (why)
        return run_fail(run, "%s", why);
    if (gpu_cu(run, "making the producer's device current", "cuCtxSetCurrent",
               gpu_use_device((int)run->opt->producer_device)) ||
        RUN_CU(run, "the items' source", cuMemAlloc, &s->src_dev, bytes) ||
        gpu_cu(run, "the items' source", "cuMemcpy",
               gpu_fill_device(s->src_dev, bytes, run->opt->seed, 0)))
        return -1;
    return 0;
}

/* The floor's ring, registered with UCX once (device memory for a GPU pool), its key packed. */
static int make_ring(bench_run *run)
{
    remote_run *s = RS(run);
    CUdeviceptr dev = 0;
    s->ring_bytes = (uint64_t)run->opt->pool_size;
    if (s->gpu) {
        if (RUN_CU(run, "the floor's ring", cuMemAlloc, &dev, s->ring_bytes))
            return -1;
        s->ring = (void *)(uintptr_t)dev;
    } else if ((s->ring = aligned_alloc(4096, (s->ring_bytes + 4095) & ~4095ull))) {
        memset(s->ring, 0, s->ring_bytes);
    } else {
        return run_fail(run, "out of memory for the floor's ring");
    }
    const char *why = ucx_node_open(&s->node, UCS_THREAD_MODE_SERIALIZED, AM_ACK, on_ack, s);
    if (!why && s->gpu && !ucx_node_cuda(&s->node))
        why = "a GPU pool's remote reads need a UCX with CUDA support (pip's libucx-cu12 or "
              "libucx-cu13, UCX_TLS with cuda_copy): this one has none (ferry doctor says which "
              "UCX is loaded)";
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = s->ring,
        .length = s->ring_bytes,
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_READ,
        .memory_type = s->gpu ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST};
    ucs_status_t st;
    if (!why && (st = ucx.ucp_mem_map(s->node.context, &mp, &s->memh)) != UCS_OK)
        why = ucx_error("ucp_mem_map", st);
    if (!why &&
        (st = ucx.ucp_rkey_pack(s->node.context, s->memh, &s->rkey, &s->rkey_len)) != UCS_OK)
        why = ucx_error("ucp_rkey_pack", st);
    if (!why && sizeof(producer_area) + s->node.address_len + s->rkey_len > PRODUCER_AREA)
        why = "UCX's worker address and remote key are too large for the results region";
    return why ? run_fail(run, "the floor's UCX: %s", why) : 0;
}

static int prepare(bench_run *run)
{
    const bench_opts *o = run->opt;
    bench_params *p = &run->params;
    remote_run *s = calloc(1, sizeof(*s));
    if (!(run->state = s))
        return run_fail(run, "out of memory");
    s->wake_fd = -1;
    s->gpu = ferry_backend_uses_gpu(o->backend);
    run->log_muted = o->quiet || o->json; /* before the pool's threads may log */
    ferry_pool_config cfg = run_pool_config(o);
    cfg.device = s->gpu ? (int32_t)o->producer_device : cfg.device;
    cfg.listen = o->listen ? o->listen : "127.0.0.1:0";
    if (ferry_pool_create(&cfg, &s->pool) != FERRY_OK ||
        ferry_pool_remote_address(s->pool, p->remote_address, sizeof(p->remote_address)) !=
            FERRY_OK)
        return run_fail(run, "%s", ferry_last_error());
    if (run_check_fits(run, s->pool, max_size(o)) != 0 || make_source(run, max_size(o)) != 0 ||
        make_ring(run) != 0)
        return -1;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0)
        return run_fail(run, "eventfd: %s", strerror(errno));
    s->queue_cap = (uint64_t)o->max_inflight; /* the ring never holds more unanswered items */
    if (!(s->queue = calloc(s->queue_cap, sizeof(*s->queue))))
        return run_fail(run, "out of memory");
    p->max_item = max_size(o);
    p->floor_bytes = s->ring_bytes;
    p->items = (uint64_t)o->max_inflight; /* the most floor items a consumer has queued */
    p->verify_every = (uint64_t)o->verify_every;
    p->consumer_device = s->gpu ? (int32_t)o->consumer_device : -1;
    snprintf(p->netns, sizeof(p->netns), "%s", o->worker_netns ? o->worker_netns : "");
    snprintf(p->net_devices, sizeof(p->net_devices), "%s", o->net_devices ? o->net_devices : "");
    p->table_bytes = PRODUCER_AREA + (uint64_t)run->consumers * RANK_AREA;
    return 0;
}

/* The floor's endpoints: the producer's worker address and key to the consumers, theirs
 * (written when they started) to the producer; then the thread. */
static int connect_floor(bench_run *run)
{
    remote_run *s = RS(run);
    producer_area *pa = producer_area_of(&run->region);
    pa->worker_len = (uint32_t)s->node.address_len;
    pa->rkey_len = (uint32_t)s->rkey_len;
    pa->base = (uint64_t)(uintptr_t)s->ring;
    pa->bytes = s->ring_bytes;
    memcpy(pa->blob, s->node.address, s->node.address_len);
    memcpy(pa->blob + s->node.address_len, s->rkey, s->rkey_len);
    for (uint32_t r = 0; r < run->consumers; r++) {
        const rank_area *ra = rank_area_of(&run->region, r);
        const char *why;
        if (ra->worker_len == 0 || ra->worker_len > RANK_AREA - sizeof(rank_area))
            return run_fail(run, "consumer rank %u left no worker address", r);
        if ((why = ucx_ep_open(&s->node, ra->worker, &s->eps[r])))
            return run_fail(run, "the floor's endpoint to rank %u: %s", r, why);
    }
    int err = pthread_create(&s->thread, NULL, floor_main, run);
    if (err)
        return run_fail(run, "starting the floor's thread: %s", strerror(err));
    s->thread_running = 1;
    bench_msg m = {.type = MSG_CONNECT};
    if (run_send(run, run->consumers, &m) != 0 ||
        run_wait(run, PH_CONTROL, run->consumers, run->seq, NULL) != 0)
        return -1;
    const rank_area *ra = rank_area_of(&run->region, 0);
    memcpy(s->path, ra->path, sizeof(s->path));
    s->path[sizeof(s->path) - 1] = '\0';
    return 0;
}

static int measure(bench_run *run)
{
    remote_run *s = RS(run);
    const bench_opts *o = run->opt;
    int first, last;
    ferry_pool_stats st;
    memories(o, &first, &last);
    if (connect_floor(run) != 0)
        return -1;
    for (int mem = first; mem <= last; mem++)
        if (latency_row(run, mem) != 0)
            return -1;
    for (int mem = first; mem <= last; mem++)
        for (uint32_t i = 0; i < o->nsizes; i++)
            if (throughput_row(run, mem, o->sizes[i]) != 0)
                return -1;
    if (run_pool_stats(s->pool, &st) != FERRY_OK)
        return run_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
    s->emulated = st.remote_emulated;
    s->admitted = st.remote_admitted;
    return 0;
}

static void release(bench_run *run, int failed)
{
    remote_run *s = RS(run);
    (void)failed;
    if (!s)
        return;
    if (s->thread_running) {
        uint64_t one = 1;
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
        if (write(s->wake_fd, &one, sizeof(one)) < 0) {
            /* the thread looks at stop every 100 ms anyway */
        }
        pthread_join(s->thread, NULL);
    }
    for (uint32_t r = 0; r < BENCH_MAX_RANKS; r++)
        ucx_ep_close(&s->node, s->eps[r]);
    if (s->rkey)
        ucx.ucp_rkey_buffer_release(s->rkey);
    if (s->memh)
        ucx.ucp_mem_unmap(s->node.context, s->memh);
    ucx_node_close(&s->node);
    ferry_pool_destroy(s->pool);
    if (s->gpu && cu && gpu_use_device((int)run->opt->producer_device) == CUDA_SUCCESS) {
        if (s->src_dev)
            cu->cuMemFree(s->src_dev);
        if (s->ring)
            cu->cuMemFree((CUdeviceptr)(uintptr_t)s->ring);
    } else if (!s->gpu) {
        free(s->ring);
    }
    free(s->src);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    free(s->queue);
    free(s);
    run->state = NULL;
}

/* ---- the report ---------------------------------------------------------------------- */

static void counts(const bench_run *run, uint64_t *received, uint64_t *in_full)
{
    *received = *in_full = 0;
    for (uint32_t r = 0; r < run->consumers; r++) {
        const bench_rank *k = &run->region.ranks[r];
        *received += (uint64_t)__atomic_load_n(&k->progress[K_FERRY], __ATOMIC_ACQUIRE) +
                     __atomic_load_n(&k->progress[K_FLOOR], __ATOMIC_ACQUIRE);
        *in_full += __atomic_load_n(&k->stat[0], __ATOMIC_ACQUIRE);
    }
}

static void report_text(const bench_run *run)
{
    const remote_run *s = RS(run);
    const bench_opts *o = run->opt;
    uint64_t verified, errors, received, in_full;
    char size[32], pool[32];
    cli_format_size((uint64_t)o->pool_size, pool, sizeof(pool));
    printf("ferry bench: remote, backend %s, %u consumer%s%s%s, pool %s, max-inflight %lld, "
           "seed %llu\n",
           ferry_backend_name(o->backend), run->consumers, run->consumers > 1 ? "s" : "",
           o->worker_netns ? " in network namespace " : "", o->worker_netns ? o->worker_netns : "",
           pool, (long long)o->max_inflight, (unsigned long long)o->seed);
    printf("reads: %s (the floor's endpoint, rank 0); ferry: %llu of %u consumers over UCX "
           "(%llu emulated), the rest through the pool's own mapping\n",
           s->path, (unsigned long long)s->admitted, run->consumers,
           (unsigned long long)s->emulated);
    printf("\nlatency: send -> every consumer's recv + read + ack done; %lld round trips of each "
           "after %lld warm-up, %lld rounds\n",
           (long long)o->iterations, (long long)o->warmup, (long long)o->rounds);
    printf("%-7s %9s %6s %10s %10s %10s %10s\n", "memory", "size", "run", "mean us", "p50 us",
           "p99 us", "items/s");
    for (uint32_t i = 0; i < s->nlrows; i++) {
        const lat_row *r = &s->lrows[i];
        cli_format_size(r->size, size, sizeof(size));
        for (int k = 0; k < KINDS; k++)
            printf("%-7s %9s %6s %10.1f %10.1f %10.1f %10.1f\n", mem_names[r->mem], size,
                   kind_names[k], r->lat[k].mean_us, r->lat[k].p50_us, r->lat[k].p99_us,
                   r->lat[k].items_per_s);
        printf("%-7s %9s ferry/floor p50: %.3f, p99: %.3f (target: at most 1.2)\n", "", "",
               cli_ratio(r->lat[0].p50_us, r->lat[1].p50_us),
               cli_ratio(r->lat[0].p99_us, r->lat[1].p99_us));
    }
    printf("\nthroughput: GB/s of each consumer's reads of items already in the pool (ferry: "
           "read + ack, and the read alone; floor: a bare get), %lld rounds\n",
           (long long)o->rounds);
    printf("%-7s %9s %7s %11s %11s %12s %11s %11s\n", "memory", "size", "items", "ferry GB/s",
           "floor GB/s", "ferry/floor", "read GB/s", "read/floor");
    for (uint32_t i = 0; i < s->ntrows; i++) {
        const tp_row *r = &s->trows[i];
        cli_format_size(r->size, size, sizeof(size));
        printf("%-7s %9s %7llu %11.3f %11.3f %12.3f %11.3f %11.3f\n", mem_names[r->mem], size,
               (unsigned long long)r->items, r->gbps[0], r->gbps[1],
               cli_ratio(r->gbps[0], r->gbps[1]), r->read_gbps, cli_ratio(r->read_gbps, r->gbps[1]));
    }
    printf("(target: at least 0.9)\n");
    run_counters(run, &verified, &errors);
    counts(run, &received, &in_full);
    printf("\nreceived: %llu items, verified: %llu (%llu byte for byte), errors: %llu\n",
           (unsigned long long)received, (unsigned long long)verified, (unsigned long long)in_full,
           (unsigned long long)errors);
}

static void json_string(const char *key, const char *v, const char *after)
{
    printf("\"%s\": ", key);
    if (!v) {
        printf("null%s", after);
        return;
    }
    putchar('"');
    for (; *v; v++) {
        if (*v == '"' || *v == '\\')
            putchar('\\');
        putchar((unsigned char)*v < 0x20 ? '?' : *v);
    }
    printf("\"%s", after);
}

static void report_json(const bench_run *run)
{
    const remote_run *s = RS(run);
    const bench_opts *o = run->opt;
    uint64_t verified, errors, received, in_full;
    printf("{\"mode\": \"remote\", \"backend\": \"%s\", \"consumers\": %u, ",
           ferry_backend_name(o->backend), run->consumers);
    json_string("listen", o->listen ? o->listen : "127.0.0.1:0", ", ");
    json_string("worker_netns", o->worker_netns, ", ");
    json_string("read_path", s->path, ", ");
    printf("\"ferry_over_ucx\": %llu, \"ferry_emulated\": %llu, \"pool_size\": %lld, "
           "\"max_inflight\": %lld, \"seed\": "
           "%llu, \"rounds\": %lld, \"verify_every\": %lld, \"latency\": [",
           (unsigned long long)s->admitted, (unsigned long long)s->emulated,
           (long long)o->pool_size, (long long)o->max_inflight, (unsigned long long)o->seed,
           (long long)o->rounds, (long long)o->verify_every);
    for (uint32_t i = 0; i < s->nlrows; i++) {
        const lat_row *r = &s->lrows[i];
        printf("%s{\"memory\": \"%s\", \"item_size\": %llu, \"iterations\": %llu, ", i ? ", " : "",
               mem_names[r->mem], (unsigned long long)r->size, (unsigned long long)r->iterations);
        for (int k = 0; k < KINDS; k++)
            lat_json(kind_names[k], &r->lat[k], 0);
        cli_json_num("ratio_p50", cli_ratio(r->lat[0].p50_us, r->lat[1].p50_us), ", ");
        cli_json_num("ratio_p99", cli_ratio(r->lat[0].p99_us, r->lat[1].p99_us), "}");
    }
    printf("], \"throughput\": [");
    for (uint32_t i = 0; i < s->ntrows; i++) {
        const tp_row *r = &s->trows[i];
        printf("%s{\"memory\": \"%s\", \"item_size\": %llu, \"items\": %llu, ", i ? ", " : "",
               mem_names[r->mem], (unsigned long long)r->size, (unsigned long long)r->items);
        cli_json_num("ferry_seconds", r->seconds[0], ", ");
        cli_json_num("floor_seconds", r->seconds[1], ", ");
        cli_json_num("ferry_gbytes_per_s", r->gbps[0], ", ");
        cli_json_num("floor_gbytes_per_s", r->gbps[1], ", ");
        cli_json_num("ratio_vs_floor", cli_ratio(r->gbps[0], r->gbps[1]), ", ");
        cli_json_num("ferry_read_gbytes_per_s", r->read_gbps, ", ");
        cli_json_num("read_ratio_vs_floor", cli_ratio(r->read_gbps, r->gbps[1]), "}");
    }
    run_counters(run, &verified, &errors);
    counts(run, &received, &in_full);
    printf("], \"received\": %llu, \"verified\": %llu, \"verified_in_full\": %llu, \"errors\": "
           "%llu}\n",
           (unsigned long long)received, (unsigned long long)verified, (unsigned long long)in_full,
           (unsigned long long)errors);
}

/* ---- consumers ----------------------------------------------------------------------- */

typedef struct remote_worker {
    ferry_consumer *consumer;
    uint8_t *buf, *want; /* host: where reads land (and GPU reads are checked); the pattern */
    CUdeviceptr dev;     /* GPU: where device reads land */
    ucp_mem_h dev_memh;  /* dev registered with UCX once: the floor's gets name it */
    uint64_t done[KINDS];
    ucx_node node;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base, bytes; /* the producer's ring */
    floor_item *queue;    /* the floor's items announced and not taken: [head, tail) */
    uint64_t head, tail, cap;
    ferry_descriptor *descs; /* a throughput row's batch (cap) */
    int overflow;
} remote_worker;

/* The floor's item from the producer: queued until the loop takes it. */
static ucs_status_t on_item(void *arg, const void *header, size_t header_len, void *data,
                            size_t len, const ucp_am_recv_param_t *param)
{
    remote_worker *s = arg;
    (void)data;
    (void)len;
    (void)param;
    if (header_len != sizeof(floor_item) || s->tail - s->head >= s->cap)
        s->overflow = 1;
    else
        memcpy(&s->queue[s->tail++ % s->cap], header, sizeof(floor_item));
    return UCS_OK;
}

/* In a network namespace of its own, UCX is told to use the namespace's devices (a loopback
 * would look reachable from the other side, which shares this host's identity). */
static int net_devices(bench_worker *w)
{
    char list[192] = "";
    struct ifaddrs *ifs = NULL;
    if (w->p.net_devices[0])
        return setenv("UCX_NET_DEVICES", w->p.net_devices, 1);
    if (!w->p.netns[0])
        return 0;
    if (getifaddrs(&ifs) != 0)
        return worker_fail(w, "getifaddrs in network namespace %s: %s", w->p.netns,
                           strerror(errno));
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        size_t used = strlen(list);
        if ((i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK) && !strstr(list, i->ifa_name))
            snprintf(list + used, sizeof(list) - used, "%s%s", used ? "," : "", i->ifa_name);
    }
    freeifaddrs(ifs);
    if (!list[0])
        return worker_fail(w, "network namespace %s has no device up but loopback", w->p.netns);
    return setenv("UCX_NET_DEVICES", list, 1);
}

static int worker_init(bench_worker *w)
{
    remote_worker *s = calloc(1, sizeof(*s));
    uint64_t max = w->p.max_item;
    const char *why;
    if (!(w->state = s))
        return worker_fail(w, "out of memory");
    if (net_devices(w) != 0)
        return -1;
    s->cap = w->p.items;
    s->buf = aligned_alloc(64, (max + 63) & ~63ull);
    s->want = malloc(max);
    s->queue = calloc(s->cap, sizeof(*s->queue));
    s->descs = calloc(s->cap, sizeof(*s->descs));
    if (!s->buf || !s->want || !s->queue || !s->descs)
        return worker_fail(w, "out of memory for the item buffers");
    cli_pattern_fill(s->want, 0, max, w->p.seed, 0);
    if (w->p.consumer_device >= 0) {
        if ((why = gpu_driver_load()))
            return worker_fail(w, "device %d: %s", w->p.consumer_device, why);
        if (gpu_worker_cu(w, "cuCtxSetCurrent", gpu_use_device(w->p.consumer_device)) ||
            WORKER_CU(w, cuMemAlloc, &s->dev, max))
            return -1;
    }
    if (ferry_consumer_connect(w->p.remote_address, w->rank, w->p.consumer_device, &s->consumer) !=
        FERRY_OK)
        return worker_fail(w, "ferry_consumer_connect: %s", ferry_last_error());
    if ((why = ucx_node_open(&s->node, UCS_THREAD_MODE_SERIALIZED, AM_ITEM, on_item, s)))
        return worker_fail(w, "the floor's UCX: %s", why);
    const char *unreg = getenv("FERRY_BENCH_FLOOR_UNREGISTERED");
    if (s->dev && ucx_node_cuda(&s->node) && !(unreg && strcmp(unreg, "1") == 0)) {
        /* A bare get's best: the destination registered once (cuda_ipc then copies straight
         * into it); without UCX's CUDA support it stays unregistered (the run says why).
         * FERRY_BENCH_FLOOR_UNREGISTERED=1 leaves it unregistered (a diagnostic: the floor's
         * gets then go as ferry's do). */
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                                 UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
                                   .address = (void *)(uintptr_t)s->dev,
                                   .length = max,
                                   .memory_type = UCS_MEMORY_TYPE_CUDA};
        ucs_status_t st = ucx.ucp_mem_map(s->node.context, &mp, &s->dev_memh);
        if (st != UCS_OK)
            return worker_fail(w, "the floor's destination: %s", ucx_error("ucp_mem_map", st));
    }
    rank_area *ra = rank_area_of(&w->region, w->rank);
    if (s->node.address_len > RANK_AREA - sizeof(rank_area))
        return worker_fail(w, "UCX's worker address of %zu bytes is too large",
                           s->node.address_len);
    memcpy(ra->worker, s->node.address, s->node.address_len);
    ra->worker_len = (uint32_t)s->node.address_len;
    return 0;
}

/* The producer's worker address and ring: the floor's endpoint and key. */
static int floor_connect(bench_worker *w)
{
    remote_worker *s = w->state;
    const producer_area *pa = producer_area_of(&w->region);
    uint64_t wl = pa->worker_len, kl = pa->rkey_len;
    ucs_status_t st;
    if (!wl || !kl || wl + kl > PRODUCER_AREA - sizeof(producer_area) ||
        pa->bytes != w->p.floor_bytes)
        return worker_fail(w, "the producer's floor endpoint is not in the results region");
    const char *why = ucx_ep_open(&s->node, pa->blob, &s->ep);
    if (why)
        return worker_fail(w, "the floor's endpoint: %s", why);
    if ((st = ucx.ucp_ep_rkey_unpack(s->ep, pa->blob + wl, &s->rkey)) != UCS_OK) {
        s->rkey = NULL;
        return worker_fail(w, "the floor's key: %s", ucx_error("ucp_ep_rkey_unpack", st));
    }
    s->base = pa->base;
    s->bytes = pa->bytes;
    ucx_read_path(s->ep, rank_area_of(&w->region, w->rank)->path, PATH_SIZE);
    return 0;
}

/* The next floor item, waited for as ferry's remote receiver waits for a descriptor: spins
 * SPIN_NS, then sleeps on the worker's event fd. */
static int floor_take(bench_worker *w, floor_item *it)
{
    remote_worker *s = w->state;
    uint64_t start = ferry_now_ns();
    for (;;) {
        while (ucx.ucp_worker_progress(s->node.worker)) {
        }
        if (s->overflow)
            return worker_fail(w, "the producer announced more floor items than agreed");
        if (s->head != s->tail) {
            *it = s->queue[s->head++ % s->cap];
            return 0;
        }
        uint64_t now = ferry_now_ns();
        if (now - start >= w->p.timeout_ns)
            return worker_fail(w, "floor item %llu never came",
                               (unsigned long long)s->done[K_FLOOR]);
        if (now - start < SPIN_NS) {
            sched_yield();
            continue;
        }
        if (ucx.ucp_worker_arm(s->node.worker) != UCS_OK)
            continue;
        struct pollfd p = {.fd = s->node.efd, .events = POLLIN};
        poll(&p, 1, (int)(SLICE_NS / 1000000));
    }
}

/* One get of [offset, +size) of the producer's ring (checked inside by the caller) into dst,
 * naming the destination's registration for device memory, waited for as ferry's reads
 * wait: NULL, or why not. */
static const char *ring_get(bench_worker *w, void *dst, uint64_t offset, uint64_t size, int mem)
{
    remote_worker *s = w->state;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                             .memory_type =
                                 mem == MEM_DEVICE ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST};
    if (mem == MEM_DEVICE && s->dev_memh) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = s->dev_memh;
    }
    return ucx_wait(&s->node, ucx.ucp_get_nbx(s->ep, dst, size, s->base + offset, s->rkey, &p),
                    read_spin_ns(size), w->p.timeout_ns, "ucp_get_nbx");
}

static int floor_read(bench_worker *w, void *dst, uint64_t size, int mem)
{
    remote_worker *s = w->state;
    floor_item it = {0, 0, 0};
    if (floor_take(w, &it) != 0)
        return -1;
    if (it.item != s->done[K_FLOOR] || it.size != size || it.offset > s->bytes ||
        it.size > s->bytes - it.offset)
        return worker_fail(w, "floor item %llu: announced as item %llu, [%llu, +%llu)",
                           (unsigned long long)s->done[K_FLOOR], (unsigned long long)it.item,
                           (unsigned long long)it.offset, (unsigned long long)it.size);
    floor_ack a = {.rank = w->rank, .item = it.item};
    const char *why = ring_get(w, dst, it.offset, size, mem);
    if (!why)
        why = ucx_wait(&s->node, ucx_am_send(s->ep, AM_ACK, &a, sizeof(a)), SPIN_NS,
                       w->p.timeout_ns, "ucp_am_send_nbx");
    return why ? worker_fail(w, "floor item %llu: %s", (unsigned long long)it.item, why) : 0;
}

static int ferry_failed(bench_worker *w, const char *call)
{
    remote_worker *s = w->state;
    return worker_fail(w, "item %llu: %s: %s", (unsigned long long)s->done[K_FERRY], call,
                       ferry_last_error());
}

/* The next lease sent to this rank, of size bytes. */
static int ferry_take(bench_worker *w, uint64_t size, ferry_descriptor *d)
{
    remote_worker *s = w->state;
    size_t got = 0;
    if (ferry_consumer_recv(s->consumer, w->p.timeout_ns, d, 1, &got) != FERRY_OK)
        return ferry_failed(w, "ferry_consumer_recv");
    if (d->length != size)
        return worker_fail(w, "item %llu: a lease of %llu bytes, expected %llu",
                           (unsigned long long)s->done[K_FERRY], (unsigned long long)d->length,
                           (unsigned long long)size);
    return 0;
}

/* A lease read into dst, then acknowledged. */
static int ferry_use(bench_worker *w, const ferry_descriptor *d, void *dst)
{
    remote_worker *s = w->state;
    if (ferry_consumer_read(s->consumer, d, dst, d->length, w->p.timeout_ns) != FERRY_OK)
        return ferry_failed(w, "ferry_consumer_read");
    if (ferry_consumer_ack(s->consumer, d) != FERRY_OK)
        return ferry_failed(w, "ferry_consumer_ack");
    return 0;
}

static int ferry_read(bench_worker *w, void *dst, uint64_t size)
{
    ferry_descriptor d;
    return ferry_take(w, size, &d) || ferry_use(w, &d, dst) ? -1 : 0;
}

/* Item `item` of kind k, read into dst: its stamps at both ends always (device memory: only
 * the items checked in full, every --verify-every'th, copied to the host first), the rest
 * against the pattern for those. */
static void check_item(bench_worker *w, int k, uint64_t item, const void *dst, uint64_t size,
                       int mem)
{
    remote_worker *s = w->state;
    int full = item % w->p.verify_every == 0;
    const uint8_t *b = dst;
    uint64_t head, tail, want = stamp_of(k, item);
    if (mem == MEM_DEVICE && !full)
        return;
    if (mem == MEM_DEVICE) {
        CUresult rc = cu->cuMemcpy((CUdeviceptr)(uintptr_t)s->buf, s->dev, size);
        if (rc != CUDA_SUCCESS) {
            worker_error(w, k, "%s item %llu: %s", kind_names[k], (unsigned long long)item,
                         cu_error("cuMemcpy", rc));
            return;
        }
        b = s->buf;
    }
    memcpy(&head, b, 8);
    memcpy(&tail, b + size - 8, 8);
    if (head != want || tail != want)
        worker_error(w, k, "%s item %llu: stamps %#llx and %#llx, expected %#llx", kind_names[k],
                     (unsigned long long)item, (unsigned long long)head, (unsigned long long)tail,
                     (unsigned long long)want);
    else if (full && memcmp(b + 8, s->want + 8, size - 16) != 0)
        worker_error(w, k, "%s item %llu (%llu bytes) has wrong bytes", kind_names[k],
                     (unsigned long long)item, (unsigned long long)size);
    else {
        __atomic_add_fetch(&w->me->verified[k], 1, __ATOMIC_RELEASE);
        if (full)
            __atomic_add_fetch(&w->me->stat[0], 1, __ATOMIC_RELEASE);
    }
}

/* The floor of a read: one get of the item's place in the producer's ring into dst (the
 * destination registered once, for device memory), waited for as ferry's reads wait.
 * Nothing else. */
static int bare_get(bench_worker *w, void *dst, uint64_t offset, uint64_t size, int mem)
{
    remote_worker *s = w->state;
    if (offset > s->bytes || size > s->bytes - offset)
        return worker_fail(w, "floor read [%llu, +%llu) outside the producer's ring",
                           (unsigned long long)offset, (unsigned long long)size);
    const char *why = ring_get(w, dst, offset, size, mem);
    return why ? worker_fail(w, "floor item %llu: %s", (unsigned long long)s->done[K_FLOOR], why)
               : 0;
}

/* The reads of a throughput row: m->item items of kind k already in the pool (ferry: sent to
 * this rank, their descriptors taken first; floor: in the producer's ring, the nth at
 * (nth % m->seed) * m->key), each read into dst and timed alone (ferry: the read and the
 * acknowledgement, and the read alone in stat[STAT_FERRY_READ_ALONE]; floor: the get), the
 * time added to stat[1 + k], then said done and checked outside the time. */
static int reads(bench_worker *w, const bench_msg *m, int k, int mem, void *dst)
{
    remote_worker *s = w->state;
    if (m->item > s->cap || (k == K_FLOOR && (!m->seed || !m->key || m->key < m->size)))
        return worker_fail(w, "a throughput row's reads the run did not prepare for");
    for (uint64_t i = 0; k == K_FERRY && i < m->item; i++)
        if (ferry_take(w, m->size, &s->descs[i]) != 0)
            return -1;
    for (uint64_t i = 0; i < m->item; i++) {
        uint64_t item = s->done[k], t0 = ferry_now_ns();
        if (k == K_FERRY) { /* the read alone is timed too */
            if (ferry_consumer_read(s->consumer, &s->descs[i], dst, m->size, w->p.timeout_ns) !=
                FERRY_OK)
                return ferry_failed(w, "ferry_consumer_read");
            __atomic_add_fetch(&w->me->stat[STAT_FERRY_READ_ALONE], ferry_now_ns() - t0,
                               __ATOMIC_RELEASE);
            if (ferry_consumer_ack(s->consumer, &s->descs[i]) != FERRY_OK)
                return ferry_failed(w, "ferry_consumer_ack");
        } else if (bare_get(w, dst, (i % m->seed) * m->key, m->size, mem) != 0) {
            return -1;
        }
        /* the time before the progress word: the producer reads it once every rank is done */
        __atomic_add_fetch(&w->me->stat[1 + k], ferry_now_ns() - t0, __ATOMIC_RELEASE);
        worker_progress(w, k, (uint32_t)++s->done[k]);
        check_item(w, k, item, dst, m->size, mem);
    }
    return 0;
}

/* n items of kind k: each read, acknowledged (ferry) or answered (floor), then said done,
 * then checked (the bytes are this process's by then). */
static int loop(bench_worker *w, const bench_msg *m)
{
    remote_worker *s = w->state;
    int k = (int)m->phase, mem = (int)(m->flags & LOOP_MEMORY);
    void *dst = mem == MEM_DEVICE ? (void *)(uintptr_t)s->dev : (void *)s->buf;
    if (k >= KINDS || mem > MEM_DEVICE || m->size < 16 || m->size > w->p.max_item ||
        (mem == MEM_DEVICE && !s->dev))
        return worker_fail(w, "a loop the run did not prepare for");
    if (m->flags & LOOP_READS)
        return reads(w, m, k, mem, dst);
    for (uint64_t i = 0; i < m->item; i++) {
        uint64_t item = s->done[k];
        if ((k == K_FERRY ? ferry_read(w, dst, m->size) : floor_read(w, dst, m->size, mem)) != 0)
            return -1;
        worker_progress(w, k, (uint32_t)++s->done[k]);
        check_item(w, k, item, dst, m->size, mem);
    }
    return 0;
}

static int worker_handle(bench_worker *w, const bench_msg *m)
{
    if (m->type == MSG_LOOP)
        return loop(w, m);
    if (m->type == MSG_CONNECT) {
        if (floor_connect(w) != 0)
            return -1;
        worker_progress(w, PH_CONTROL, (uint32_t)m->seq);
        return 0;
    }
    return worker_fail(w, "a message the run did not prepare for (type %u)", m->type);
}

static void worker_release(bench_worker *w, int clean)
{
    remote_worker *s = w->state;
    (void)clean;
    if (!s)
        return;
    ferry_consumer_destroy(s->consumer);
    if (s->rkey)
        ucx.ucp_rkey_destroy(s->rkey);
    ucx_ep_close(&s->node, s->ep);
    if (s->dev_memh)
        ucx.ucp_mem_unmap(s->node.context, s->dev_memh);
    ucx_node_close(&s->node);
    if (s->dev && cu)
        cu->cuMemFree(s->dev);
    free(s->buf);
    free(s->want);
    free(s->queue);
    free(s->descs);
    free(s);
}

const bench_mode remote_mode = {
    .name = "remote",
    .family = FAMILY_REMOTE,
    .progress_by_seq = 0,
    .defaults = &defaults,
    .check = check,
    .prepare = prepare,
    .measure = measure,
    .report_text = report_text,
    .report_json = report_json,
    .release = release,
    .worker_init = worker_init,
    .worker_handle = worker_handle,
    .worker_release = worker_release,
};
