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
        s4 += 4;
    return s4 >= lo && s4 <= hi ? s4 : s;
}

static uint64_t stamp_word(uint64_t seed, uint64_t item, uint64_t block)
{
    return cli_mix64(cli_mix64(seed ^ 0x57a3bull) ^ (item * GOLDEN) ^ (block << 40) ^ block);
}

/* Bytes of the stamp at off: 8, or fewer in a last block shorter than that. */
static uint64_t stamp_len(uint64_t off, uint64_t size)
{
    return size - off < 8 ? size - off : 8;
}

static void stamp(uint8_t *buf, uint64_t size, uint64_t seed, uint64_t item)
{
    for (uint64_t off = 0; off < size; off += STAMP_STRIDE) {
        uint64_t w = stamp_word(seed, item, off / STAMP_STRIDE);
        memcpy(buf + off, &w, stamp_len(off, size));
    }
}

/* The first byte of got[0, n) that differs from want, as an offset of the item. */
static int64_t mismatch(const uint8_t *got, const uint8_t *want, uint64_t at, uint64_t n,
                        uint8_t *got_byte, uint8_t *want_byte)
{
    uint64_t i = 0;
    while (i < n && got[i] == want[i])
        i++;
    *got_byte = got[i];
    *want_byte = want[i];
    return (int64_t)(at + i);
}

/* -1 when every byte of got is base + item's stamps, else the first offset that differs. */
static int64_t verify_bytes(const uint8_t *got, const uint8_t *base, uint64_t size, uint64_t seed,
                            uint64_t item, uint8_t *got_byte, uint8_t *want_byte)
{
    for (uint64_t off = 0; off < size; off += STAMP_STRIDE) {
        uint64_t end = size - off < STAMP_STRIDE ? size : off + STAMP_STRIDE;
        uint64_t n = stamp_len(off, size), from = off + n,
                 v = stamp_word(seed, item, off / STAMP_STRIDE);
        uint8_t w[8];
        memcpy(w, &v, 8);
        if (memcmp(got + off, w, n) != 0)
            return mismatch(got + off, w, off, n, got_byte, want_byte);
        if (from < end && memcmp(got + from, base + from, end - from) != 0)
            return mismatch(got + from, base + from, from, end - from, got_byte, want_byte);
    }
    return -1;
}

/* The ring of base patterns (count, each bytes long), keyed by (seed, k). */
static uint8_t **patterns_create(uint32_t count, uint64_t bytes, uint64_t seed)
{
    uint8_t **ring = calloc(count + 1, sizeof(*ring)); /* NULL-terminated */
    for (uint32_t k = 0; ring && k < count; k++) {
        if (!(ring[k] = aligned_alloc(64, (bytes + 63) & ~63ull))) {
            for (uint32_t j = 0; j < k; j++)
                free(ring[j]);
            free(ring);
            return NULL;
        }
        uint64_t state = cli_mix64(seed ^ cli_mix64(k + 0xba5eull));
        for (uint64_t off = 0; off < bytes; off += 8) {
            uint64_t w = cli_mix64(state += GOLDEN);
            memcpy(ring[k] + off, &w, bytes - off < 8 ? bytes - off : 8);
        }
    }
    return ring;
}

static void patterns_destroy(uint8_t **ring)
{
    for (uint8_t **p = ring; p && *p; p++)
        free(*p);
    free(ring);
}

typedef struct phase_result {
    int ran;
    uint64_t items, bytes, full_events, verified_items, errors;
    double seconds, items_per_s, gbytes_per_s, p50_us, p99_us;
} phase_result;

typedef struct handover {
    ferry_pool *pool;
    ferry_backend backend; /* what the pool resolved to */
    uint8_t **patterns;    /* the staging ring, stamped in place */
    uint8_t *floor_ring;
    uint64_t *publish_ns[2]; /* ferry, floor: when each item's handoff began */
    uint64_t run_start_ns, chunk_start_ns, last_progress_ns;
    uint64_t tally_items[2], tally_bytes[2], tally_ns[2]; /* for the progress lines */
    uint64_t floor_waits;
    phase_result ferry, floor;
    int reclaim_ran;
    uint64_t reclaim_rounds, reclaim_errors;
    double reclaim_p50_us, reclaim_p99_us;
} handover;

/* ack_ns of (item, rank) in phase PH_FERRY or PH_FLOOR; the reclaim phase's ack times. */
static uint64_t *ack_slot(const bench_region *r, int phase, uint64_t item, uint32_t rank)
{
    uint64_t *t = r->tables;
    return &t[((uint64_t)phase * r->p->items + item) * r->p->consumers + rank];
}

static uint64_t *reclaim_acks(const bench_region *r)
{
    return (uint64_t *)r->tables + 2 * r->p->items * r->p->consumers;
}

static uint64_t chunk_begin(const bench_run *run, uint64_t c)
{
    return run->params.items * c / (uint64_t)run->opt->rounds;
}

static void handover_defaults(const bench_mode *mode, bench_opts *o)
{
    (void)mode;
    bench_default(&o->consumers, 4);
    bench_default(&o->items, 2000);
    bench_default(&o->pool_size, 256ll << 20);
    bench_default(&o->max_inflight, 4096);
    bench_default(&o->reclaim_interval_us, 1000);
    bench_default(&o->timeout_ms, 10000);
    bench_default(&o->reclaim_rounds, 300);
    bench_default(&o->rounds, 4);
    if (!o->nsizes) {
        o->sizes[0] = 256ull << 10;
        o->sizes[1] = 4ull << 20;
    }
}

static int handover_check(const bench_opts *o)
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

/* The library's checks and the pool, before any worker exists. */
static int create_pool(bench_run *run, handover *h)
{
    ferry_pool_config c = run_pool_config(run->opt);
    ferry_descriptor d;
    if (ferry_pool_config_check(&c) != FERRY_OK || ferry_pool_create(&c, &h->pool) != FERRY_OK ||
        ferry_pool_describe(h->pool, &d) != FERRY_OK)
        return run_fail(run, "%s", ferry_last_error());
    h->backend = (ferry_backend)d.backend;
    return run_check_fits(run, h->pool, run->opt->sizes[1]);
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
    p->floor_slot_bytes = (o->sizes[1] + 63) & ~63ull;
    k = (uint64_t)o->pool_size / p->floor_slot_bytes;
    k = k > (uint64_t)o->max_inflight ? (uint64_t)o->max_inflight : k;
    p->floor_slots = o->no_floor ? 0 : k < 2 ? 2 : k;
    p->floor_bytes = p->floor_slots * p->floor_slot_bytes;
    p->reclaim_rounds = (uint64_t)o->reclaim_rounds;
    p->reclaim_item = o->sizes[1] < RECLAIM_ITEM_BYTES ? o->sizes[1] : RECLAIM_ITEM_BYTES;
    p->table_bytes = (2 * p->items * (uint64_t)o->consumers + p->reclaim_rounds + 1) * 8;
}

static int create_floor(bench_run *run, handover *h)
{
    size_t bytes = (size_t)run->params.floor_bytes;
    int fd = memfd_create("ferry-bench-floor", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        if (fd >= 0)
            close(fd);
        return run_fail(run, "the floor ring of %zu bytes: %s", bytes, strerror(errno));
    }
    run->extra_fd = fd;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return run_fail(run, "mapping the floor ring failed: %s", strerror(errno));
    h->floor_ring = p;
    return 0;
}

static int handover_prepare(bench_run *run)
{
    handover *h = calloc(1, sizeof(*h));
    if (!(run->state = h))
        return run_fail(run, "out of memory");
    if (create_pool(run, h) != 0)
        return -1;
    fill_params(run);
    h->publish_ns[0] = calloc(run->params.items, sizeof(uint64_t));
    h->publish_ns[1] = calloc(run->params.items, sizeof(uint64_t));
    h->patterns = patterns_create((uint32_t)run->params.ring, run->params.size_hi, run->opt->seed);
    if (!h->publish_ns[0] || !h->publish_ns[1] || !h->patterns)
        return run_fail(run, "out of memory for %llu items", (unsigned long long)run->params.items);
    return run->params.floor_slots ? create_floor(run, h) : 0;
}

static void handover_release(bench_run *run, int failed)
{
    handover *h = run->state;
    (void)failed;
    if (!h)
        return;
    ferry_pool_destroy(h->pool);
    if (h->floor_ring)
        munmap(h->floor_ring, (size_t)run->params.floor_bytes);
    if (run->extra_fd >= 0)
        close(run->extra_fd);
    patterns_destroy(h->patterns);
    free(h->publish_ns[0]);
    free(h->publish_ns[1]);
    free(h);
    run->state = NULL;
}

/* Counts one item and prints a progress line about once a second on long runs. */
static void progress(bench_run *run, int phase, uint64_t bytes)
{
    handover *h = run->state;
    h->tally_items[phase]++;
    h->tally_bytes[phase] += bytes;
    uint64_t t = cli_now_ns();
    if (run->opt->quiet || run->opt->json || t - h->run_start_ns < 2000000000ull ||
        t - h->last_progress_ns < 1000000000ull)
        return;
    h->last_progress_ns = t;
    fprintf(stderr, "ferry bench:");
    for (int ph = 0; ph < 2; ph++) {
        uint64_t ns = h->tally_ns[ph] + (ph == phase ? t - h->chunk_start_ns : 0);
        if (h->tally_items[ph])
            fprintf(stderr, "%s %s %llu/%llu items, %.2f GB/s", ph ? "," : "", phase_names[ph],
                    (unsigned long long)h->tally_items[ph], (unsigned long long)run->params.items,
                    ns ? (double)h->tally_bytes[ph] / (double)ns : 0.0);
    }
    fprintf(stderr, "\n");
}

/* Stamps item in its base pattern: the producer's staging buffer. */
static const uint8_t *stage(bench_run *run, uint64_t item, bench_msg *m, uint32_t type)
{
    handover *h = run->state;
    uint8_t *buf = h->patterns[item % run->params.ring];
    *m = (bench_msg){.type = type,
                     .phase = type - MSG_FERRY,
                     .item = item,
                     .seed = run->params.seed,
                     .size = type == MSG_RECLAIM ? run->params.reclaim_item
                                                 : item_size(&run->params, item)};
    stamp(buf, m->size, m->seed, item);
    return buf;
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
        *t_ret = cli_now_ns();
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
    uint64_t t0 = cli_now_ns(); /* the item's bytes are ready: the handoff starts here */
    if (phase == PH_FERRY && publish(run, h->pool, src, &m, NULL) != 0)
        return -1;
    if (phase == PH_FLOOR) {
        m.key = item % p->floor_slots;
        if (item >= p->floor_slots &&
            run_wait(run, PH_FLOOR, run->consumers, item - p->floor_slots + 1, &waited) != 0)
            return -1;
        memcpy(h->floor_ring + m.key * p->floor_slot_bytes, src, m.size);
    }
    h->publish_ns[phase][item] = t0;
    h->floor_waits += (uint64_t)waited;
    if (run_send(run, run->consumers, &m) != 0)
        return -1;
    progress(run, phase, m.size);
    return 0;
}

static int chunk(bench_run *run, int phase, uint64_t begin, uint64_t end)
{
    handover *h = run->state;
    h->chunk_start_ns = cli_now_ns();
    for (uint64_t i = begin; i < end; i++) {
        if (hand_item(run, phase, i) != 0 || run_check_often(run) != 0)
            return -1;
    }
    if (run_wait(run, phase, run->consumers, end, NULL) != 0)
        return -1;
    h->tally_ns[phase] += cli_now_ns() - h->chunk_start_ns;
    return 0;
}

/* Latest ack of item over all ranks; 0 if some rank has none. */
static uint64_t last_ack(const bench_run *run, int phase, uint64_t item)
{
    uint64_t last = 0;
    for (uint32_t r = 0; r < run->consumers; r++) {
        uint64_t t = *ack_slot(&run->region, phase, item, r);
        if (!t)
            return 0;
        last = t > last ? t : last;
    }
    return last;
}

/* seconds: the sum over the chunks of (last ack of the chunk - first publish of the chunk). */
static void phase_metrics(bench_run *run, int phase, phase_result *out)
{
    handover *h = run->state;
    uint64_t *lat = malloc(run->params.items * sizeof(*lat)), wall = 0, verified = UINT64_MAX;
    size_t n = 0;
    *out = (phase_result){.ran = 1, .items = run->params.items};
    for (uint64_t c = 0; c < (uint64_t)run->opt->rounds; c++) {
        uint64_t begin = chunk_begin(run, c), end = chunk_begin(run, c + 1), last = 0;
        for (uint64_t i = begin; i < end; i++) {
            uint64_t t = last_ack(run, phase, i);
            out->bytes += item_size(&run->params, i);
            last = t > last ? t : last;
            if (t && lat)
                lat[n++] = t - h->publish_ns[phase][i];
        }
        if (last > h->publish_ns[phase][begin])
            wall += last - h->publish_ns[phase][begin];
    }
    out->seconds = wall ? (double)wall / 1e9 : NAN;
    cli_p50_p99_us(lat, lat ? n : 0, &out->p50_us, &out->p99_us);
    free(lat);
    for (uint32_t r = 0; r < run->consumers; r++) {
        const bench_rank *rk = &run->region.ranks[r];
        verified = rk->verified[phase] < verified ? rk->verified[phase] : verified;
        out->errors += rk->errors[phase];
    }
    out->verified_items = verified;
    out->items_per_s = (double)out->items / out->seconds;
    out->gbytes_per_s = (double)out->bytes / out->seconds / 1e9;
    run->incomplete |= verified < run->params.items;
}

/* Ferry and floor alternate chunk by chunk, so that both see the same machine. */
static int handoff_phases(bench_run *run)
{
    handover *h = run->state;
    uint64_t before, after;
    if (run_full_events(run, h->pool, &before) != 0)
        return -1;
    h->run_start_ns = h->last_progress_ns = cli_now_ns();
    for (uint64_t c = 0; c < (uint64_t)run->opt->rounds; c++) {
        uint64_t begin = chunk_begin(run, c), end = chunk_begin(run, c + 1);
        if (chunk(run, PH_FERRY, begin, end) != 0 ||
            (run->params.floor_slots && chunk(run, PH_FLOOR, begin, end) != 0))
            return -1;
    }
    if (run_full_events(run, h->pool, &after) != 0)
        return -1;
    phase_metrics(run, PH_FERRY, &h->ferry);
    h->ferry.full_events = after - before;
    if (run->params.floor_slots) {
        phase_metrics(run, PH_FLOOR, &h->floor);
        h->floor.full_events = h->floor_waits;
    }
    return 0;
}

/* The reclaim delay:
 * A pool of one slot and one consumer (rank 0): the producer publishes round k, sends it and
 * at once publishes round k + 1, which must wait for the ack of k. Rank 0 reads k, sleeps
 * 0-200 us, notes t_ack and acknowledges. Delay = the blocked publish's return - t_ack;
 * rounds whose publish found the slot free (no pool-full event) are not counted. */

/* Publishes one round and sends it to rank 0; *full holds the pool's pool_full_events (read
 * after the previous publish, so that nothing slow runs between a send and the next publish). */
static int reclaim_round(bench_run *run, ferry_pool *pool, uint64_t round, uint64_t *full,
                         int *blocked, uint64_t *t_ret)
{
    bench_msg m;
    uint64_t after = 0;
    const uint8_t *src = stage(run, round, &m, MSG_RECLAIM);
    if (publish(run, pool, src, &m, t_ret) != 0 || run_full_events(run, pool, &after) != 0)
        return -1;
    *blocked = after > *full;
    *full = after;
    return run_send(run, 1, &m);
}

static int reclaim_rounds(bench_run *run, ferry_pool *pool, uint64_t *delays, size_t *n)
{
    uint64_t rounds = run->params.reclaim_rounds, full = 0;
    if (run_full_events(run, pool, &full) != 0)
        return -1;
    for (uint64_t r = 0; r <= rounds; r++) {
        int blocked = 0;
        uint64_t t_ret = 0;
        if (reclaim_round(run, pool, r, &full, &blocked, &t_ret) != 0)
            return -1;
        /* Round r's lease could only exist after rank 0 acknowledged round r - 1 (t_ack is
         * 0 only if the pool acknowledged for a dead rank 0). */
        uint64_t t_ack =
            r > 0 ? __atomic_load_n(&reclaim_acks(&run->region)[r - 1], __ATOMIC_ACQUIRE) : 0;
        if (blocked && t_ack && t_ret > t_ack)
            delays[(*n)++] = t_ret - t_ack;
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
    size_t n = 0;
    uint64_t *delays = calloc(run->params.reclaim_rounds + 1, sizeof(*delays));
    if (!delays)
        return run_fail(run, "out of memory for the reclaim phase");
    c.memory_size = RECLAIM_POOL_BYTES;
    c.consumer_count = 1;
    c.max_inflight_slices = 1;
    run->log_muted = 1; /* this pool is full by design at every round */
    int rc = ferry_pool_create(&c, &pool) != FERRY_OK
                 ? run_fail(run, "creating the reclaim pool failed: %s", ferry_last_error())
                 : reclaim_rounds(run, pool, delays, &n);
    ferry_pool_destroy(pool);
    run->log_muted = run->opt->quiet;
    if (rc == 0) {
        h->reclaim_ran = 1;
        h->reclaim_rounds = n;
        h->reclaim_errors = run->region.ranks[0].errors[PH_RECLAIM];
        cli_p50_p99_us(delays, n, &h->reclaim_p50_us, &h->reclaim_p99_us);
    }
    free(delays);
    return rc;
}

static int handover_measure(bench_run *run)
{
    if (handoff_phases(run) != 0)
        return -1;
    return run->params.reclaim_rounds ? reclaim_phase(run) : 0;
}

static double ratio(const handover *h)
{
    return h->floor.ran && h->floor.gbytes_per_s > 0 ? h->ferry.gbytes_per_s / h->floor.gbytes_per_s
                                                     : NAN;
}

static void table_row(const char *name, const phase_result *r)
{
    printf("%-6s %8llu %10.1f %9.3f %10.1f %8.3f %10.1f %10.1f %10llu\n", name,
           (unsigned long long)r->items, (double)r->bytes / 1048576.0, r->seconds, r->items_per_s,
           r->gbytes_per_s, r->p50_us, r->p99_us, (unsigned long long)r->full_events);
}

static void handover_text(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const handover *h = run->state;
    char lo[32], hi[32], pool[32];
    int range = o->sizes[0] != o->sizes[1];
    cli_format_size(o->sizes[0], lo, sizeof(lo));
    cli_format_size(o->sizes[1], hi, sizeof(hi));
    cli_format_size((uint64_t)o->pool_size, pool, sizeof(pool));
    printf("ferry bench: backend %s, %u consumers, %llu items of %s%s%s (seed %llu), pool %s, "
           "max-inflight %lld, reclaim interval %lld us, %lld round%s\n",
           ferry_backend_name(h->backend), run->consumers, (unsigned long long)o->items, lo,
           range ? "-" : "", range ? hi : "", (unsigned long long)o->seed, pool,
           (long long)o->max_inflight, (long long)o->reclaim_interval_us, (long long)o->rounds,
           o->rounds == 1 ? "" : "s");
    if (h->floor.ran)
        printf("floor: %llu slots of %llu bytes in one shared ring\n",
               (unsigned long long)run->params.floor_slots,
               (unsigned long long)run->params.floor_slot_bytes);
    printf("\n%-6s %8s %10s %9s %10s %8s %10s %10s %10s\n", "run", "items", "MiB", "seconds",
           "items/s", "GB/s", "p50 us", "p99 us", "pool-full");
    table_row("ferry", &h->ferry);
    if (h->floor.ran)
        table_row("floor", &h->floor);
    printf("\n");
    if (h->floor.ran)
        printf("ferry/floor GB/s ratio: %.3f\n", ratio(h));
    if (h->reclaim_ran)
        printf("reclaim delay p50/p99: %.1f/%.1f us (%llu blocked rounds of %llu)\n",
               h->reclaim_p50_us, h->reclaim_p99_us, (unsigned long long)h->reclaim_rounds,
               (unsigned long long)run->params.reclaim_rounds);
    printf("verified: %llu/%llu items in every consumer",
           (unsigned long long)h->ferry.verified_items, (unsigned long long)run->params.items);
    if (h->floor.ran)
        printf(" (floor %llu/%llu)", (unsigned long long)h->floor.verified_items,
               (unsigned long long)run->params.items);
    printf(", errors: %llu\n",
           (unsigned long long)(h->ferry.errors + h->floor.errors + h->reclaim_errors));
}

static void json_phase(const phase_result *r, uint64_t errors)
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
           (unsigned long long)errors);
}

static void handover_json(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const handover *h = run->state;
    printf("{\"backend\": \"%s\", \"consumers\": %u, ", ferry_backend_name(h->backend),
           run->consumers);
    json_phase(&h->ferry, h->ferry.errors + h->reclaim_errors);
    printf(", \"floor\": %s", h->floor.ran ? "{" : "null, ");
    if (h->floor.ran) {
        json_phase(&h->floor, h->floor.errors);
        printf("}, ");
    }
    cli_json_num("ratio_vs_floor", ratio(h), ", ");
    cli_json_num("reclaim_delay_p50_us", h->reclaim_ran ? h->reclaim_p50_us : NAN, ", ");
    cli_json_num("reclaim_delay_p99_us", h->reclaim_ran ? h->reclaim_p99_us : NAN, ", ");
    printf("\"reclaim_rounds\": %llu, \"rounds\": %lld, \"seed\": %llu, ",
           (unsigned long long)h->reclaim_rounds, (long long)o->rounds,
           (unsigned long long)o->seed);
    printf("\"item_size\": {\"min\": %llu, \"max\": %llu}, \"pool_size\": %lld, "
           "\"max_inflight\": %lld}\n",
           (unsigned long long)o->sizes[0], (unsigned long long)o->sizes[1],
           (long long)o->pool_size, (long long)o->max_inflight);
}

typedef struct hworker {
    const uint8_t *floor;
    uint8_t **patterns;
    uint8_t *buf;
    ferry_consumer *consumer;
} hworker;

static int handover_worker_init(bench_worker *w)
{
    hworker *s = calloc(1, sizeof(*s));
    if (!(w->state = s))
        return worker_fail(w, "out of memory");
    if (w->extra_fd >= 0) {
        void *p = mmap(NULL, (size_t)w->p.floor_bytes, PROT_READ, MAP_SHARED, w->extra_fd, 0);
        close(w->extra_fd);
        if (p == MAP_FAILED)
            return worker_fail(w, "mapping the floor ring failed: %s", strerror(errno));
        s->floor = p;
    }
    s->buf = aligned_alloc(64, (w->p.size_hi + 63) & ~63ull);
    s->patterns = patterns_create((uint32_t)w->p.ring, w->p.size_hi, w->p.seed);
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
    if (m->type >= MSG_FERRY && m->type <= MSG_RECLAIM && m->phase == m->type - MSG_FERRY &&
        m->item < limit && m->seed == w->p.seed && m->size == want)
        return 0;
    return worker_fail(w,
                       "%s message for item %llu (seed %llu, %llu bytes) does not match the run "
                       "(%llu items, seed %llu, %llu bytes)",
                       m->phase <= PH_RECLAIM ? phase_names[m->phase] : "?",
                       (unsigned long long)m->item, (unsigned long long)m->seed,
                       (unsigned long long)m->size, (unsigned long long)limit,
                       (unsigned long long)w->p.seed, (unsigned long long)want);
}

static void verify(bench_worker *w, const bench_msg *m)
{
    hworker *s = w->state;
    uint8_t got, want;
    int64_t off = verify_bytes(s->buf, s->patterns[m->item % w->p.ring], m->size, w->p.seed,
                               m->item, &got, &want);
    if (off < 0)
        w->me->verified[m->phase]++;
    else
        worker_error(w, (int)m->phase,
                     "%s item %llu (%llu bytes): byte %lld is 0x%02x, expected 0x%02x",
                     phase_names[m->phase], (unsigned long long)m->item,
                     (unsigned long long)m->size, (long long)off, got, want);
}

static int handover_worker_handle(bench_worker *w, const bench_msg *m)
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
    uint64_t *t_ack = m->type == MSG_RECLAIM
                          ? &reclaim_acks(&w->region)[m->item]
                          : ack_slot(&w->region, (int)m->phase, m->item, w->rank);
    if (m->type == MSG_RECLAIM) {
        cli_sleep_ns(cli_mix64(w->p.seed ^ (m->item << 17) ^ 0x51ee9ull) % (RECLAIM_SLEEP_MAX + 1));
        /* Before the ack (a release store): the producer sees it once it sees the ack. */
        *t_ack = cli_now_ns();
    }
    if (m->type != MSG_FLOOR && ferry_consumer_ack(s->consumer, &d) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_ack: %s", phase,
                           (unsigned long long)m->item, ferry_last_error());
    if (m->type != MSG_RECLAIM) /* the floor's "ack" is its progress word */
        *t_ack = cli_now_ns();
    worker_progress(w, (int)m->phase, (uint32_t)(m->item + 1));
    return 0;
}

static void handover_worker_release(bench_worker *w, int clean)
{
    hworker *s = w->state;
    (void)clean;
    if (!s)
        return;
    ferry_consumer_destroy(s->consumer);
    patterns_destroy(s->patterns);
    free(s->buf);
    free(s);
}

const bench_mode handover_mode = {
    .name = "handover",
    .family = FAMILY_HOST,
    .progress_by_seq = 0,
    .defaults = handover_defaults,
    .check = handover_check,
    .prepare = handover_prepare,
    .measure = handover_measure,
    .report_text = handover_text,
    .report_json = handover_json,
    .release = handover_release,
    .worker_init = handover_worker_init,
    .worker_handle = handover_worker_handle,
    .worker_release = handover_worker_release,
};
