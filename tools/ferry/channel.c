/* --mode channel (host): the round trip of one item sent through the pool's descriptor
 * rings (ferry_pool_send, ferry_consumer_recv, read, ack) to every consumer, against two
 * others in the same run: the floor, the same bytes copied through a flag word in shared
 * memory (the same yield-then-futex wait as a receiver's), and the hand-over with descriptors
 * sent over the harness's Unix socket (ferry_pool_publish, ferry_consumer_read). Every
 * round trip ends when every consumer's progress word says it is done (docs/cli.md). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { PH_CHANNEL = 0, PH_FLOOR = 1, PH_SOCKET = 2, KINDS = 3 };
enum { MSG_LOOP = 8, MSG_ITEM = 9 };
#define WORD_FLOOR     0u     /* the floor's ready word: items written so far */
#define WORD_WAITERS   16u    /* consumers asleep on it */
#define SPIN_NS        50000u /* as long as a receiver of the library yields before it sleeps */
#define FULL_CHECK     10u    /* every tenth item's bytes are compared in full */
#define SLEEP_SLICE_NS 10000000ull

static const char *const kind_names[KINDS] = {"channel", "floor", "socket"};

typedef struct channel_run {
    ferry_pool *pool;
    uint8_t *src;
    uint64_t *lat[KINDS];
    uint64_t busy_ns[KINDS];
    uint64_t done[KINDS]; /* items handed over so far, warm-up included */
    lat_stats result[KINDS];
} channel_run;

#define CH(run) ((channel_run *)(run)->state)

static const bench_opts defaults = {
    BENCH_DEFAULTS,      .consumers = 1,
    .items = 2000,       .sizes = {4096, 4096}, /* [lo, hi]: one size */
    .nsizes = 2,         .pool_size = 64ll << 20,
    .max_inflight = 256, .reclaim_interval_us = 1000,
};

static int check(const bench_opts *o)
{
    const char *bad = o->items > (int64_t)UINT32_MAX / 2 ? "--items must be at most 2147483647"
                      : o->rounds <= 0 || o->rounds > o->items
                          ? "--rounds must be between 1 and --items"
                      : o->sizes[0] != o->sizes[1] ? "--mode channel takes one --item-size"
                      : o->sizes[0] < 8            ? "--mode channel needs items of 8 bytes or more"
                                                   : NULL;
    if (bad)
        fprintf(stderr, "ferry bench: %s\n", bad);
    return bad ? -1 : 0;
}

static int prepare(bench_run *run)
{
    channel_run *c = calloc(1, sizeof(*c));
    uint64_t size = run->opt->sizes[0], n = (uint64_t)run->opt->items;
    if (!(run->state = c))
        return run_fail(run, "out of memory");
    ferry_pool_config cfg = run_pool_config(run->opt);
    if (ferry_pool_create(&cfg, &c->pool) != FERRY_OK ||
        ferry_pool_address(c->pool, run->params.address, sizeof(run->params.address)) != FERRY_OK)
        return run_fail(run, "%s", ferry_last_error());
    if (run_check_fits(run, c->pool, size) != 0)
        return -1;
    c->src = aligned_alloc(64, (size + 63) & ~63ull);
    for (int k = 0; k < KINDS; k++)
        c->lat[k] = calloc(n, sizeof(uint64_t));
    if (!c->src || !c->lat[0] || !c->lat[1] || !c->lat[2])
        return run_fail(run, "out of memory for %llu items", (unsigned long long)n);
    cli_pattern_fill(c->src, 0, size, run->opt->seed, 0); /* word 0 becomes the item number */
    run->params.size_lo = run->params.size_hi = size;
    run->params.items = n;
    run->params.table_bytes = (size + 63) & ~63ull; /* the floor's slot */
    return 0;
}

static void release(bench_run *run, int failed)
{
    channel_run *c = CH(run);
    (void)failed;
    if (!c)
        return;
    ferry_pool_destroy(c->pool);
    free(c->src);
    for (int k = 0; k < KINDS; k++)
        free(c->lat[k]);
    free(c);
    run->state = NULL;
}

/* One round trip of kind k: the item numbered c->done[k] to every consumer and back. */
static int hand_one(bench_run *run, int k, uint64_t *ns)
{
    channel_run *c = CH(run);
    uint64_t size = run->params.size_hi, item = c->done[k];
    memcpy(c->src, &item, 8);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *src = c->src;
    uint64_t t0 = ferry_now_ns();
    if (k == PH_CHANNEL) {
        if (ferry_pool_send(c->pool, &t, &src, 1, NULL, NULL, run->params.timeout_ns, NULL) !=
            FERRY_OK)
            return run_fail(run, "ferry_pool_send of item %llu: %s", (unsigned long long)item,
                            ferry_last_error());
    } else if (k == PH_FLOOR) {
        uint32_t *flags = run->region.flags;
        memcpy(run->region.tables, c->src, size);
        __atomic_store_n(&flags[WORD_FLOOR], (uint32_t)(item + 1), __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&flags[WORD_WAITERS], __ATOMIC_SEQ_CST))
            ferry_futex_wake(&flags[WORD_FLOOR]);
    } else {
        ferry_descriptor d;
        bench_msg m = {.type = MSG_ITEM, .phase = PH_SOCKET, .item = item, .size = size};
        if (ferry_pool_publish(c->pool, &t, src, run->params.timeout_ns, &d) != FERRY_OK ||
            ferry_descriptor_encode(&d, m.desc) != FERRY_OK)
            return run_fail(run, "publishing item %llu: %s", (unsigned long long)item,
                            ferry_last_error());
        if (run_send(run, run->consumers, &m) != 0)
            return -1;
    }
    if (run_wait(run, k, run->consumers, item + 1, NULL) != 0)
        return -1;
    *ns = ferry_now_ns() - t0;
    c->done[k]++;
    return 0;
}

/* n round trips of kind k; lat (NULL: the warm-up) gets them. The receivers of the channel
 * and the floor run their own loop of n items (one LOOP message); the socket's get one
 * message per item. */
static int hand_many(bench_run *run, int k, uint64_t n, uint64_t *lat)
{
    channel_run *c = CH(run);
    bench_msg loop = {.type = MSG_LOOP, .phase = (uint32_t)k, .item = n};
    if (k != PH_SOCKET && run_send(run, run->consumers, &loop) != 0)
        return -1;
    uint64_t t0 = ferry_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        uint64_t ns = 0;
        if (hand_one(run, k, &ns) != 0 || run_check_often(run) != 0)
            return -1;
        if (lat)
            lat[i] = ns;
    }
    if (lat)
        c->busy_ns[k] += ferry_now_ns() - t0;
    return 0;
}

static int timed(bench_run *run, int k, uint64_t begin, uint64_t end)
{
    return hand_many(run, k, end - begin, CH(run)->lat[k] + begin);
}

static int measure(bench_run *run)
{
    channel_run *c = CH(run);
    uint64_t n = (uint64_t)run->opt->items, warm = n / 10 ? n / 10 : 1;
    for (int k = 0; k < KINDS; k++)
        if (hand_many(run, k, warm, NULL) != 0)
            return -1;
    if (run_rounds(run, n, (uint64_t)run->opt->rounds, KINDS, timed) != 0)
        return -1;
    for (int k = 0; k < KINDS; k++)
        lat_summarize(c->lat[k], n, c->busy_ns[k], &c->result[k]);
    return run_send_type(run, run->consumers, MSG_END);
}

static void report_text(const bench_run *run)
{
    const channel_run *c = CH(run);
    char size[32];
    cli_format_size(run->params.size_hi, size, sizeof(size));
    printf("channel: %u consumer%s, %s items, %llu round trips of each kind after %llu warm-up, "
           "%lld rounds\n\n",
           run->consumers, run->consumers > 1 ? "s" : "", size,
           (unsigned long long)run->params.items,
           (unsigned long long)(run->params.items / 10 ? run->params.items / 10 : 1),
           (long long)run->opt->rounds);
    printf("%-8s %10s %10s %10s %10s\n", "run", "mean us", "p50 us", "p99 us", "items/s");
    for (int k = 0; k < KINDS; k++)
        printf("%-8s %10.2f %10.2f %10.2f %10.1f\n", kind_names[k], c->result[k].mean_us,
               c->result[k].p50_us, c->result[k].p99_us, c->result[k].items_per_s);
    printf("\nchannel/floor p50: %.3f    channel/socket p50: %.3f\n",
           cli_ratio(c->result[PH_CHANNEL].p50_us, c->result[PH_FLOOR].p50_us),
           cli_ratio(c->result[PH_CHANNEL].p50_us, c->result[PH_SOCKET].p50_us));
    printf("channel: ferry_pool_send to the rings, recv + read + ack; floor: the same copies "
           "through a flag word; socket: publish, descriptor over a Unix socket, read + ack\n");
}

static void report_json(const bench_run *run)
{
    const channel_run *c = CH(run);
    uint64_t verified, errors;
    run_counters(run, &verified, &errors);
    printf("{\"mode\": \"channel\", \"backend\": \"host\", \"consumers\": %u, \"item_size\": %llu, "
           "\"items\": %llu, ",
           run->consumers, (unsigned long long)run->params.size_hi,
           (unsigned long long)run->params.items);
    for (int k = 0; k < KINDS; k++)
        lat_json(kind_names[k], &c->result[k], 0);
    cli_json_num("ratio_vs_floor",
                 cli_ratio(c->result[PH_CHANNEL].p50_us, c->result[PH_FLOOR].p50_us), ", ");
    cli_json_num("ratio_vs_socket",
                 cli_ratio(c->result[PH_CHANNEL].p50_us, c->result[PH_SOCKET].p50_us), ", ");
    printf("\"verified\": %llu, \"errors\": %llu}\n", (unsigned long long)verified,
           (unsigned long long)errors);
}

/* ---- consumers ---------------------------------------------------------------------- */

typedef struct channel_worker {
    ferry_consumer *consumer;
    uint8_t *buf, *want;
    uint64_t done[KINDS];
} channel_worker;

static int worker_init(bench_worker *w)
{
    channel_worker *s = calloc(1, sizeof(*s));
    uint64_t size = w->p.size_hi;
    if (!(w->state = s))
        return worker_fail(w, "out of memory");
    s->buf = aligned_alloc(64, (size + 63) & ~63ull);
    s->want = malloc(size);
    if (!s->buf || !s->want)
        return worker_fail(w, "out of memory for the item buffers");
    cli_pattern_fill(s->want, 0, size, w->p.seed, 0);
    if (ferry_consumer_connect(w->p.address, w->rank, -1, &s->consumer) != FERRY_OK)
        return worker_fail(w, "ferry_consumer_connect %s: %s", w->p.address, ferry_last_error());
    return 0;
}

/* Item s->done[k] of kind k is in s->buf: its number, and every tenth one's bytes. */
static void verify(bench_worker *w, int k)
{
    channel_worker *s = w->state;
    uint64_t item, size = w->p.size_hi;
    memcpy(&item, s->buf, 8);
    if (item != s->done[k])
        worker_error(w, k, "%s: item %llu holds the bytes of item %llu", kind_names[k],
                     (unsigned long long)s->done[k], (unsigned long long)item);
    else if (item % FULL_CHECK == 0 && memcmp(s->buf + 8, s->want + 8, size - 8) != 0)
        worker_error(w, k, "%s: item %llu has wrong bytes", kind_names[k],
                     (unsigned long long)item);
    else
        w->me->verified[k]++;
}

static int read_ack(bench_worker *w, int k, const ferry_descriptor *d)
{
    channel_worker *s = w->state;
    if (ferry_consumer_read(s->consumer, d, s->buf, w->p.size_hi, w->p.timeout_ns) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_read: %s", kind_names[k],
                           (unsigned long long)s->done[k], ferry_last_error());
    verify(w, k); /* before the ack: the slice is the producer's again after it */
    if (ferry_consumer_ack(s->consumer, d) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_ack: %s", kind_names[k],
                           (unsigned long long)s->done[k], ferry_last_error());
    worker_progress(w, k, (uint32_t)++s->done[k]); /* the round trip ends when all say so */
    return 0;
}

/* Waits until the floor's word says item s->done[PH_FLOOR] was written. */
static int floor_wait(bench_worker *w)
{
    channel_worker *s = w->state;
    uint32_t *word = &w->region.flags[WORD_FLOOR], *waiters = &w->region.flags[WORD_WAITERS];
    uint32_t need = (uint32_t)(s->done[PH_FLOOR] + 1);
    uint64_t start = ferry_now_ns();
    for (;;) {
        uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if ((int32_t)(seen - need) >= 0)
            return 0;
        uint64_t now = ferry_now_ns();
        if (now - start >= w->p.timeout_ns)
            return worker_fail(w, "floor item %u never came", need - 1);
        if (now - start < SPIN_NS) {
            sched_yield();
            continue;
        }
        __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == seen)
            ferry_futex_wait(word, seen, SLEEP_SLICE_NS);
        __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
    }
}

static int loop(bench_worker *w, int k, uint64_t n)
{
    channel_worker *s = w->state;
    for (uint64_t i = 0; i < n; i++) {
        ferry_descriptor d;
        size_t got = 0;
        if (k == PH_FLOOR) {
            if (floor_wait(w) != 0)
                return -1;
            memcpy(s->buf, w->region.tables, w->p.size_hi);
            verify(w, k);
            worker_progress(w, k, (uint32_t)++s->done[k]);
        } else if (ferry_consumer_recv(s->consumer, w->p.timeout_ns, &d, 1, &got) != FERRY_OK) {
            return worker_fail(w, "channel item %llu: ferry_consumer_recv: %s",
                               (unsigned long long)s->done[k], ferry_last_error());
        } else if (read_ack(w, k, &d) != 0) {
            return -1;
        }
    }
    return 0;
}

static int worker_handle(bench_worker *w, const bench_msg *m)
{
    channel_worker *s = w->state;
    if (m->type == MSG_LOOP && m->phase < PH_SOCKET)
        return loop(w, (int)m->phase, m->item);
    if (m->type == MSG_ITEM && m->item == s->done[PH_SOCKET]) {
        ferry_descriptor d;
        return worker_decode(w, m, w->p.size_hi, &d) != 0 ? -1 : read_ack(w, PH_SOCKET, &d);
    }
    if (m->type == MSG_END)
        return 0;
    return worker_fail(w, "a message the run did not prepare for (type %u, item %llu)", m->type,
                       (unsigned long long)m->item);
}

static void worker_release(bench_worker *w, int clean)
{
    channel_worker *s = w->state;
    (void)clean;
    if (!s)
        return;
    ferry_consumer_destroy(s->consumer);
    free(s->buf);
    free(s->want);
    free(s);
}

const bench_mode channel_mode = {
    .name = "channel",
    .family = FAMILY_HOST,
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
