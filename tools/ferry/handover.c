/* The host mode of `ferry bench`: items through the pool, or through a plain shared ring
 * (the floor), to every consumer, every byte checked; the reclaim delay (docs/cli.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"

#define RING_MAX           8u
#define RING_BYTES         (128ull << 20) /* the pattern ring's budget per process */
#define STAMP_STRIDE       4096u
#define RECLAIM_ITEM_BYTES 4096ull
#define RECLAIM_POOL_BYTES (1ll << 20)
#define RECLAIM_SLEEP_MAX  200000ull
#define GOLDEN             0x9e3779b97f4a7c15ull

enum { PH_FERRY = 0, PH_FLOOR = 1, PH_RECLAIM = 2 };
enum { MSG_FERRY = 8, MSG_FLOOR = 9, MSG_RECLAIM = 10 };

static const char *const phase_names[] = {"ferry", "floor", "reclaim"};

static uint64_t align64(uint64_t n)
{
    return (n + 63) & ~63ull;
}

static uint64_t item_size(const bench_params *p, uint64_t item)
{
    uint64_t lo = p->size_lo, hi = p->size_hi;
    if (lo >= hi)
        return lo;
    uint64_t r = cli_mix64(cli_mix64(p->seed ^ 0x51ee5eedull) ^ (item * GOLDEN));
    double u = (double)(r >> 11) / (double)((1ull << 53) - 1); /* [0, 1] */
    double v = exp(log((double)lo) + u * (log((double)hi) - log((double)lo)));
    uint64_t s = (uint64_t)llround(v);
    s = s < lo ? lo : s > hi ? hi : s;
    uint64_t s4 = s & ~3ull;
    if (s4 < lo)
        s4 += 4; /* now at least lo */
    return s4 <= hi ? s4 : s;
}

/* The payload: item i is base pattern i % ring (a splitmix64 stream of (seed, k) that every
 * process makes on its own) with an 8-byte stamp of (seed, i) at the start of every 4 KiB, so
 * that the bytes of another item, or of a stale slice, never pass verification. */

/* Writes w at off, cut short at the end of an item of size bytes. */
static void put_word(uint8_t *buf, uint64_t off, uint64_t size, uint64_t w)
{
    memcpy(buf + off, &w, size - off < 8 ? size - off : 8);
}

/* The ring of base patterns, one after another, each of the largest item's size. */
static uint8_t *patterns_create(const bench_params *p)
{
    uint64_t stride = align64(p->size_hi);
    uint8_t *ring = aligned_alloc(64, p->ring * stride);
    for (uint64_t k = 0; ring && k < p->ring; k++)
        cli_pattern_fill(ring + k * stride, 0, p->size_hi, p->seed, k);
    return ring;
}

/* Stamps item into its base pattern in place and returns it: the item's size bytes, as the
 * producer sends them and as a consumer expects them. Every item has its stamps at the same
 * offsets, so those of an earlier item on this pattern are all overwritten within size. */
static uint8_t *stamp(uint8_t *ring, const bench_params *p, uint64_t item, uint64_t size)
{
    uint8_t *buf = ring + item % p->ring * align64(p->size_hi);
    uint64_t key = cli_mix64(p->seed ^ 0x57a3bull) ^ (item * GOLDEN);
    for (uint64_t b = 0; b * STAMP_STRIDE < size; b++)
        put_word(buf, b * STAMP_STRIDE, size, cli_mix64(key ^ (b << 40) ^ b));
    return buf;
}

/* Phase PH_FERRY or PH_FLOOR: what it has done so far (the progress lines), then its results. */
typedef struct phase_result {
    uint64_t *start_ns; /* when each item's handoff began; after the run, the latencies */
    uint64_t items, bytes, busy_ns, wall_ns;
    uint64_t full_events, verified_items, errors;
    double seconds, items_per_s, gbytes_per_s, p50_us, p99_us;
} phase_result;

typedef struct handover {
    ferry_pool *pool;
    ferry_backend backend; /* what the pool resolved to */
    uint8_t *patterns;     /* the staging ring, stamped in place */
    uint64_t run_start_ns, chunk_start_ns, last_progress_ns;
    phase_result ph[2];
    uint64_t reclaim_rounds; /* counted */
    double reclaim_p50_us, reclaim_p99_us;
} handover;

/* ack_ns of (item, rank) in phase PH_FERRY or PH_FLOOR, or of rank 0's reclaim round item. */
static uint64_t *ack_slot(const bench_region *r, int phase, uint64_t item, uint32_t rank)
{
    uint64_t *t = r->tables, n = r->p->items * r->p->consumers;
    return phase == PH_RECLAIM
               ? &t[2 * n + item]
               : &t[((uint64_t)phase * r->p->items + item) * r->p->consumers + rank];
}

/* The floor's ring of floor_slots slots, at the end of the mode's tables, on a page of its
 * own (the tables start on one). */
static uint8_t *floor_ring(const bench_region *r)
{
    return (uint8_t *)r->tables + r->p->table_bytes - r->p->floor_bytes;
}

static const bench_opts defaults = {
    BENCH_DEFAULTS,        .consumers = 4,
    .items = 2000,         .sizes = {256ull << 10, 4ull << 20}, /* [lo, hi] */
    .nsizes = 2,           .pool_size = 256ll << 20,
    .max_inflight = 4096,  .reclaim_interval_us = 1000,
    .reclaim_rounds = 300,
};

static int check(const bench_opts *o)
{
    const char *bad = o->items > (int64_t)UINT32_MAX - 1 ? "--items must be at most 4294967294"
                      : o->rounds <= 0 || o->rounds > o->items
                          ? "--rounds must be between 1 and --items"
                      : o->reclaim_rounds < 0 || o->reclaim_rounds > 1000000
                          ? "--reclaim-rounds must be between 0 and 1000000"
                          : NULL;
    if (bad)
        fprintf(stderr, "ferry bench: %s\n", bad);
    return bad ? -1 : 0;
}

static void fill_params(bench_run *run)
{
    const bench_opts *o = run->opt;
    bench_params *p = &run->params;
    uint64_t ring = RING_BYTES / o->sizes[1], k;
    p->size_lo = o->sizes[0];
    p->size_hi = o->sizes[1];
    p->items = (uint64_t)o->items;
    p->ring = ring > RING_MAX ? RING_MAX : ring < 2 ? 2 : ring;
    p->floor_slot_bytes = align64(o->sizes[1]);
    k = (uint64_t)o->pool_size / p->floor_slot_bytes;
    k = k > (uint64_t)o->max_inflight ? (uint64_t)o->max_inflight : k;
    p->floor_slots = o->no_floor ? 0 : k < 2 ? 2 : k;
    p->floor_bytes = p->floor_slots * p->floor_slot_bytes;
    p->reclaim_rounds = (uint64_t)o->reclaim_rounds;
    p->reclaim_item = o->sizes[1] < RECLAIM_ITEM_BYTES ? o->sizes[1] : RECLAIM_ITEM_BYTES;
    k = (2 * p->items * (uint64_t)o->consumers + p->reclaim_rounds + 1) * 8; /* the acks */
    p->table_bytes = ((k + BENCH_PAGE - 1) & ~(uint64_t)(BENCH_PAGE - 1)) + p->floor_bytes;
}

/* The library's checks and the pool before any worker exists, then the run's buffers. */
static int prepare(bench_run *run)
{
    handover *h = calloc(1, sizeof(*h));
    ferry_pool_config c = run_pool_config(run->opt);
    ferry_descriptor d;
    if (!(run->state = h))
        return run_fail(run, "out of memory");
    if (ferry_pool_config_check(&c) != FERRY_OK || ferry_pool_create(&c, &h->pool) != FERRY_OK ||
        ferry_pool_describe(h->pool, &d) != FERRY_OK)
        return run_fail(run, "%s", ferry_last_error());
    h->backend = (ferry_backend)d.backend;
    if (run_check_fits(run, h->pool, run->opt->sizes[1]) != 0)
        return -1;
    fill_params(run);
    for (int k = 0; k < 2; k++)
        h->ph[k].start_ns = calloc(run->params.items, sizeof(uint64_t));
    h->patterns = patterns_create(&run->params);
    if (!h->ph[0].start_ns || !h->ph[1].start_ns || !h->patterns)
        return run_fail(run, "out of memory for %llu items", (unsigned long long)run->params.items);
    return 0;
}

static void release(bench_run *run, int failed)
{
    handover *h = run->state;
    (void)failed;
    if (!h)
        return;
    ferry_pool_destroy(h->pool);
    free(h->patterns);
    free(h->ph[0].start_ns);
    free(h->ph[1].start_ns);
    free(h);
    run->state = NULL;
}

/* Counts one item and prints a progress line about once a second on long runs. */
static void progress(bench_run *run, int phase, uint64_t bytes)
{
    handover *h = run->state;
    uint64_t t = ferry_now_ns();
    h->ph[phase].items++;
    h->ph[phase].bytes += bytes;
    if (run->opt->quiet || run->opt->json || t - h->run_start_ns < 2000000000ull ||
        t - h->last_progress_ns < 1000000000ull)
        return;
    h->last_progress_ns = t;
    fprintf(stderr, "ferry bench:");
    for (int k = 0; k < 2 && h->ph[k].items; k++) { /* the floor has none before ferry */
        const phase_result *r = &h->ph[k];
        uint64_t ns = r->busy_ns + (k == phase ? t - h->chunk_start_ns : 0);
        fprintf(stderr, "%s %s %llu/%llu items, %.2f GB/s", k ? "," : "", phase_names[k],
                (unsigned long long)r->items, (unsigned long long)run->params.items,
                ns ? (double)r->bytes / (double)ns : 0.0);
    }
    fprintf(stderr, "\n");
}

/* The message of item (of the phase of message type), and its bytes in the staging ring. */
static const uint8_t *stage(bench_run *run, uint64_t item, bench_msg *m, uint32_t type)
{
    handover *h = run->state;
    *m = (bench_msg){.type = type,
                     .phase = type - MSG_FERRY,
                     .item = item,
                     .seed = run->params.seed,
                     .size = type == MSG_RECLAIM ? run->params.reclaim_item
                                                 : item_size(&run->params, item)};
    return stamp(h->patterns, &run->params, item, m->size);
}

/* Publishes m's bytes from src and encodes the descriptor; *t_ret (may be NULL) gets the
 * moment the publish returned. */
static int publish(bench_run *run, ferry_pool *pool, const uint8_t *src, bench_msg *m,
                   uint64_t *t_ret)
{
    ferry_tensor t = ferry_tensor_bytes(m->size);
    ferry_descriptor d;
    ferry_status st = ferry_pool_publish(pool, &t, src, run->params.timeout_ns, &d);
    if (t_ret)
        *t_ret = ferry_now_ns();
    if (st != FERRY_OK || ferry_descriptor_encode(&d, m->desc) != FERRY_OK)
        return run_fail(run, "%s item %llu (%llu bytes): publishing failed: %s",
                        phase_names[m->phase], (unsigned long long)m->item,
                        (unsigned long long)m->size, ferry_last_error());
    return 0;
}

/* One item of phase PH_FERRY (through the pool) or PH_FLOOR (into slot item % K of the ring,
 * once every consumer is done with item - K), sent to every consumer. */
static int hand_item(bench_run *run, int phase, uint64_t item)
{
    handover *h = run->state;
    const bench_params *p = &run->params;
    bench_msg m;
    int waited = 0;
    const uint8_t *src = stage(run, item, &m, MSG_FERRY + (uint32_t)phase);
    uint64_t t0 = ferry_now_ns(); /* the item's bytes are ready: the handoff starts here */
    if (phase == PH_FERRY && publish(run, h->pool, src, &m, NULL) != 0)
        return -1;
    if (phase == PH_FLOOR) {
        m.key = item % p->floor_slots;
        if (item >= p->floor_slots &&
            run_wait(run, PH_FLOOR, run->consumers, item - p->floor_slots + 1, &waited) != 0)
            return -1;
        memcpy(floor_ring(&run->region) + m.key * p->floor_slot_bytes, src, m.size);
    }
    h->ph[phase].start_ns[item] = t0;
    h->ph[phase].full_events += (uint64_t)waited; /* the floor's; ferry's are the pool's */
    if (run_send(run, run->consumers, &m) != 0)
        return -1;
    progress(run, phase, m.size);
    return 0;
}

static int chunk(bench_run *run, int phase, uint64_t begin, uint64_t end)
{
    handover *h = run->state;
    h->chunk_start_ns = ferry_now_ns();
    for (uint64_t i = begin; i < end; i++)
        if (hand_item(run, phase, i) != 0 || run_check_often(run) != 0)
            return -1;
    if (run_wait(run, phase, run->consumers, end, NULL) != 0)
        return -1;
    h->ph[phase].busy_ns += ferry_now_ns() - h->chunk_start_ns;
    return 0;
}

/* The reclaim delay:
 * A pool of one slot and one consumer (rank 0): the producer publishes round k, sends it and
 * at once publishes round k + 1, which must wait for the ack of k. Rank 0 reads k, sleeps
 * 0-200 us, notes t_ack and acknowledges. Delay = the blocked publish's return - t_ack;
 * rounds whose publish found the slot free (no pool-full event) are not counted. */

/* Publishes every round and sends it to rank 0. The pool's pool_full_events is read after
 * each publish, so that nothing slow runs between a send and the next publish. */
static int reclaim_rounds(bench_run *run, ferry_pool *pool, uint64_t *delays, uint64_t *n)
{
    uint64_t rounds = run->params.reclaim_rounds, full = 0, after = 0, t_ret = 0;
    if (run_full_events(run, pool, &full) != 0)
        return -1;
    for (uint64_t r = 0; r <= rounds; r++) {
        bench_msg m;
        const uint8_t *src = stage(run, r, &m, MSG_RECLAIM);
        if (publish(run, pool, src, &m, &t_ret) != 0 || run_full_events(run, pool, &after) != 0 ||
            run_send(run, 1, &m) != 0)
            return -1;
        /* Round r's lease could only exist after rank 0 acknowledged round r - 1 (t_ack is
         * 0 only if the pool acknowledged for a dead rank 0). */
        uint64_t t_ack =
            r > 0 ? __atomic_load_n(ack_slot(&run->region, PH_RECLAIM, r - 1, 0), __ATOMIC_ACQUIRE)
                  : 0;
        if (after > full && t_ack && t_ret > t_ack)
            delays[(*n)++] = t_ret - t_ack;
        full = after;
        if (run_check_often(run) != 0)
            return -1;
    }
    return run_wait(run, PH_RECLAIM, 1, rounds + 1, NULL);
}

static int reclaim_phase(bench_run *run)
{
    handover *h = run->state;
    ferry_pool_config c = run_pool_config(run->opt);
    ferry_pool *pool = NULL;
    uint64_t *delays = calloc(run->params.reclaim_rounds + 1, sizeof(*delays));
    if (!delays)
        return run_fail(run, "out of memory for the reclaim phase");
    c.memory_size = RECLAIM_POOL_BYTES;
    c.consumer_count = 1;
    c.max_inflight_slices = 1;
    run->log_muted = 1; /* this pool is full by design at every round */
    int rc = ferry_pool_create(&c, &pool) != FERRY_OK
                 ? run_fail(run, "creating the reclaim pool failed: %s", ferry_last_error())
                 : reclaim_rounds(run, pool, delays, &h->reclaim_rounds);
    ferry_pool_destroy(pool);
    run->log_muted = run->opt->quiet;
    if (rc == 0) {
        /* Reported with the errors of the pool's phase. */
        h->ph[PH_FERRY].errors += run->region.ranks[0].errors[PH_RECLAIM];
        cli_p50_p99_us(delays, h->reclaim_rounds, &h->reclaim_p50_us, &h->reclaim_p99_us);
    }
    free(delays);
    return rc;
}

/* After the run, one chunk: its wall time (the last ack of its items in any consumer - its
 * first start) and each item's latency (its last ack - its start), written over the start
 * times as they are read. Every ack is in: a consumer notes it before its progress word. */
static int chunk_metrics(bench_run *run, int phase, uint64_t begin, uint64_t end)
{
    phase_result *r = &((handover *)run->state)->ph[phase];
    uint64_t first = r->start_ns[begin], chunk_last = 0;
    for (uint64_t i = begin; i < end; i++) {
        uint64_t last = 0;
        for (uint32_t k = 0; k < run->consumers; k++) {
            uint64_t t = *ack_slot(&run->region, phase, i, k);
            last = t > last ? t : last;
        }
        chunk_last = last > chunk_last ? last : chunk_last;
        r->start_ns[i] = last - r->start_ns[i];
    }
    r->wall_ns += chunk_last > first ? chunk_last - first : 0;
    return 0;
}

/* seconds: the sum over the chunks of their wall time. */
static void phase_metrics(bench_run *run, int phase)
{
    phase_result *r = &((handover *)run->state)->ph[phase];
    r->verified_items = UINT64_MAX;
    for (uint32_t k = 0; k < run->consumers; k++) {
        const bench_rank *rk = &run->region.ranks[k];
        if (rk->verified[phase] < r->verified_items)
            r->verified_items = rk->verified[phase];
        r->errors += rk->errors[phase];
    }
    r->seconds = r->wall_ns ? (double)r->wall_ns / 1e9 : NAN;
    r->items_per_s = (double)r->items / r->seconds;
    r->gbytes_per_s = (double)r->bytes / r->seconds / 1e9;
    cli_p50_p99_us(r->start_ns, r->items, &r->p50_us, &r->p99_us);
    run->incomplete |= r->verified_items < run->params.items;
}

/* Ferry and floor alternate chunk by chunk, so that both see the same machine; then the
 * reclaim delay. */
static int measure(bench_run *run)
{
    handover *h = run->state;
    uint64_t before, after, n = run->params.items, rounds = (uint64_t)run->opt->rounds;
    int kinds = run->params.floor_slots ? 2 : 1;
    if (run_full_events(run, h->pool, &before) != 0)
        return -1;
    h->run_start_ns = h->last_progress_ns = ferry_now_ns();
    if (run_rounds(run, n, rounds, kinds, chunk) != 0 || run_full_events(run, h->pool, &after) != 0)
        return -1;
    run_rounds(run, n, rounds, kinds, chunk_metrics);
    for (int k = 0; k < kinds; k++)
        phase_metrics(run, k);
    h->ph[PH_FERRY].full_events = after - before;
    return run->params.reclaim_rounds ? reclaim_phase(run) : 0;
}

/* The reports (after a run that succeeded: the floor ran if it has slots, the reclaim phase
 * if it has rounds). */
static void report_text(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const bench_params *p = &run->params;
    const handover *h = run->state;
    const phase_result *fe = &h->ph[PH_FERRY], *fl = &h->ph[PH_FLOOR];
    char lo[32], hi[32], pool[32];
    int range = o->sizes[0] != o->sizes[1], kinds = p->floor_slots ? 2 : 1;
    cli_format_size(o->sizes[0], lo, sizeof(lo));
    cli_format_size(o->sizes[1], hi, sizeof(hi));
    cli_format_size((uint64_t)o->pool_size, pool, sizeof(pool));
    printf("ferry bench: backend %s, %u consumers, %llu items of %s%s%s (seed %llu), pool %s, "
           "max-inflight %lld, reclaim interval %lld us, %lld round%s\n",
           ferry_backend_name(h->backend), run->consumers, (unsigned long long)o->items, lo,
           range ? "-" : "", range ? hi : "", (unsigned long long)o->seed, pool,
           (long long)o->max_inflight, (long long)o->reclaim_interval_us, (long long)o->rounds,
           o->rounds == 1 ? "" : "s");
    if (p->floor_slots)
        printf("floor: %llu slots of %llu bytes in one shared ring\n",
               (unsigned long long)p->floor_slots, (unsigned long long)p->floor_slot_bytes);
    printf("\n%-6s %8s %10s %9s %10s %8s %10s %10s %10s\n", "run", "items", "MiB", "seconds",
           "items/s", "GB/s", "p50 us", "p99 us", "pool-full");
    for (int k = 0; k < kinds; k++) {
        const phase_result *r = &h->ph[k];
        printf("%-6s %8llu %10.1f %9.3f %10.1f %8.3f %10.1f %10.1f %10llu\n", phase_names[k],
               (unsigned long long)r->items, (double)r->bytes / 1048576.0, r->seconds,
               r->items_per_s, r->gbytes_per_s, r->p50_us, r->p99_us,
               (unsigned long long)r->full_events);
    }
    printf("\n");
    if (p->floor_slots)
        printf("ferry/floor GB/s ratio: %.3f\n", cli_ratio(fe->gbytes_per_s, fl->gbytes_per_s));
    if (p->reclaim_rounds)
        printf("reclaim delay p50/p99: %.1f/%.1f us (%llu blocked rounds of %llu)\n",
               h->reclaim_p50_us, h->reclaim_p99_us, (unsigned long long)h->reclaim_rounds,
               (unsigned long long)p->reclaim_rounds);
    printf("verified: %llu/%llu items in every consumer", (unsigned long long)fe->verified_items,
           (unsigned long long)p->items);
    if (p->floor_slots)
        printf(" (floor %llu/%llu)", (unsigned long long)fl->verified_items,
               (unsigned long long)p->items);
    printf(", errors: %llu\n", (unsigned long long)(fe->errors + fl->errors));
}

static void json_phase(const phase_result *r)
{
    printf("\"items\": %llu, \"bytes\": %llu, ", (unsigned long long)r->items,
           (unsigned long long)r->bytes);
    cli_json_num("seconds", r->seconds, ", ");
    cli_json_num("items_per_s", r->items_per_s, ", ");
    cli_json_num("gbytes_per_s", r->gbytes_per_s, ", ");
    cli_json_num("p50_us", r->p50_us, ", ");
    cli_json_num("p99_us", r->p99_us, ", ");
    printf("\"pool_full\": %llu, \"verified_items\": %llu, \"errors\": %llu",
           (unsigned long long)r->full_events, (unsigned long long)r->verified_items,
           (unsigned long long)r->errors);
}

static void report_json(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const handover *h = run->state;
    int floor = run->params.floor_slots != 0, reclaim = run->params.reclaim_rounds != 0;
    printf("{\"backend\": \"%s\", \"consumers\": %u, ", ferry_backend_name(h->backend),
           run->consumers);
    json_phase(&h->ph[PH_FERRY]);
    printf(", \"floor\": %s", floor ? "{" : "null, ");
    if (floor) {
        json_phase(&h->ph[PH_FLOOR]);
        printf("}, ");
    }
    cli_json_num("ratio_vs_floor",
                 cli_ratio(h->ph[PH_FERRY].gbytes_per_s, h->ph[PH_FLOOR].gbytes_per_s), ", ");
    cli_json_num("reclaim_delay_p50_us", reclaim ? h->reclaim_p50_us : NAN, ", ");
    cli_json_num("reclaim_delay_p99_us", reclaim ? h->reclaim_p99_us : NAN, ", ");
    printf("\"reclaim_rounds\": %llu, \"rounds\": %lld, \"seed\": %llu, \"item_size\": {\"min\": "
           "%llu, \"max\": %llu}, \"pool_size\": %lld, \"max_inflight\": %lld}\n",
           (unsigned long long)h->reclaim_rounds, (long long)o->rounds, (unsigned long long)o->seed,
           (unsigned long long)o->sizes[0], (unsigned long long)o->sizes[1],
           (long long)o->pool_size, (long long)o->max_inflight);
}

typedef struct hworker {
    const uint8_t *floor;
    uint8_t *patterns;
    uint8_t *buf;
    ferry_consumer *consumer;
} hworker;

static int worker_init(bench_worker *w)
{
    hworker *s = calloc(1, sizeof(*s));
    if (!(w->state = s))
        return worker_fail(w, "out of memory");
    /* The floor is read-only here: a stray write would otherwise pass for the producer's. */
    s->floor = w->p.floor_slots ? floor_ring(&w->region) : NULL;
    if (s->floor && mprotect((void *)s->floor, (size_t)w->p.floor_bytes, PROT_READ) != 0)
        return worker_fail(w, "protecting the floor ring failed: %s", strerror(errno));
    s->buf = aligned_alloc(64, align64(w->p.size_hi));
    s->patterns = patterns_create(&w->p);
    if (!s->buf || !s->patterns)
        return worker_fail(w, "out of memory for the item buffers");
    memset(s->buf, 0, w->p.size_hi);
    if (ferry_consumer_create(w->rank, &s->consumer) != FERRY_OK)
        return worker_fail(w, "ferry_consumer_create: %s", ferry_last_error());
    return 0;
}

/* The message must be what the run says item `item` of its phase is. */
static int check_header(bench_worker *w, const bench_msg *m)
{
    int reclaim = m->phase == PH_RECLAIM;
    uint64_t limit = reclaim ? w->p.reclaim_rounds + 1 : w->p.items;
    uint64_t want = reclaim ? w->p.reclaim_item : m->item < limit ? item_size(&w->p, m->item) : 0;
    if (m->phase <= PH_RECLAIM && m->type == MSG_FERRY + m->phase && m->item < limit &&
        m->seed == w->p.seed && m->size == want)
        return 0;
    return worker_fail(w,
                       "%s message for item %llu (seed %llu, %llu bytes) does not match the run "
                       "(%llu items, seed %llu, %llu bytes)",
                       m->phase <= PH_RECLAIM ? phase_names[m->phase] : "?",
                       (unsigned long long)m->item, (unsigned long long)m->seed,
                       (unsigned long long)m->size, (unsigned long long)limit,
                       (unsigned long long)w->p.seed, (unsigned long long)want);
}

/* Every byte of the item in s->buf against the item as the producer stamped it; the byte loop
 * runs only after a mismatch, to name the first byte that differs. */
static void verify(bench_worker *w, const bench_msg *m)
{
    hworker *s = w->state;
    const uint8_t *want = stamp(s->patterns, &w->p, m->item, m->size);
    uint64_t i = 0;
    if (memcmp(s->buf, want, m->size) == 0) {
        w->me->verified[m->phase]++;
        return;
    }
    while (s->buf[i] == want[i])
        i++;
    worker_error(w, (int)m->phase,
                 "%s item %llu (%llu bytes): byte %lld is 0x%02x, expected 0x%02x",
                 phase_names[m->phase], (unsigned long long)m->item, (unsigned long long)m->size,
                 (long long)i, s->buf[i], want[i]);
}

static int worker_handle(bench_worker *w, const bench_msg *m)
{
    hworker *s = w->state;
    ferry_descriptor d;
    if (check_header(w, m) != 0)
        return -1;
    const char *phase = phase_names[m->phase];
    if (m->type == MSG_FLOOR) {
        if (!s->floor || m->key >= w->p.floor_slots)
            return worker_fail(w, "floor item %llu names slot %llu of %llu",
                               (unsigned long long)m->item, (unsigned long long)m->key,
                               (unsigned long long)w->p.floor_slots);
        memcpy(s->buf, s->floor + m->key * w->p.floor_slot_bytes, m->size);
    } else if (worker_decode(w, m, w->p.size_hi, &d) != 0) {
        return -1;
    } else if (ferry_consumer_read(s->consumer, &d, s->buf, w->p.size_hi, w->p.timeout_ns) !=
               FERRY_OK) {
        return worker_fail(w, "%s item %llu: ferry_consumer_read: %s", phase,
                           (unsigned long long)m->item, ferry_last_error());
    }
    verify(w, m);
    uint64_t *t_ack = ack_slot(&w->region, (int)m->phase, m->item, w->rank);
    if (m->type == MSG_RECLAIM) {
        cli_sleep_ns(cli_mix64(w->p.seed ^ (m->item << 17) ^ 0x51ee9ull) % (RECLAIM_SLEEP_MAX + 1));
        /* Before the ack (a release store): the producer sees it once it sees the ack. */
        *t_ack = ferry_now_ns();
    }
    if (m->type != MSG_FLOOR && ferry_consumer_ack(s->consumer, &d) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_ack: %s", phase,
                           (unsigned long long)m->item, ferry_last_error());
    if (m->type != MSG_RECLAIM) /* the floor's "ack" is its progress word */
        *t_ack = ferry_now_ns();
    worker_progress(w, (int)m->phase, (uint32_t)(m->item + 1));
    return 0;
}

static void worker_release(bench_worker *w, int clean)
{
    hworker *s = w->state;
    (void)clean;
    if (!s)
        return;
    ferry_consumer_destroy(s->consumer);
    free(s->patterns);
    free(s->buf);
    free(s);
}

const bench_mode handover_mode = {
    .name = "handover",
    .family = FAMILY_HOST,
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
