/* --mode stream: items through the pool to N consumers as fast as they go, against a
 * device copy floor and, for consumers on other GPUs, a peer copy floor (docs/cli.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define FLOOR_BYTES  (4ull << 30) /* bytes copied by a floor, between FLOOR_MIN and MAX copies */
#define FLOOR_MIN    8ull
#define FLOOR_MAX    1000ull
#define FLOOR_WARMUP 2 /* untimed copies before a floor's timed ones */
#define SAMPLE       4096ull
#define SAMPLE_CHUNK (8ull << 20)
#define WHOLE_MAX    (1ull << 20)
#define MAX_SPANS    258
#define RING_MAX     (64ull << 20) /* device (and host) bytes of the sample ring */
enum { MSG_PEER = MSG_OWN };
enum { STAT_PEER_NS = 0, STAT_PEER_COPIES = 1 };

/* The spans of an item a consumer checks (*count of them), and their bytes: the whole item up to
 * 1 MiB; else the first and last 4 KiB and one 4 KiB block per 8 MiB at a seeded offset. */
static uint64_t sample_spans(uint64_t seed, uint64_t item, uint64_t size, gpu_span *spans,
                             uint32_t *count)
{
    uint32_t n = 0, most = MAX_SPANS - 2;
    uint64_t chunk = SAMPLE_CHUNK;
    if (size <= WHOLE_MAX) {
        spans[0] = (gpu_span){0, size};
        *count = 1;
        return size;
    }
    if ((size + chunk - 1) / chunk > most)
        chunk = (size + most - 1) / most;
    spans[n++] = (gpu_span){0, SAMPLE};
    spans[n++] = (gpu_span){size - SAMPLE, SAMPLE};
    for (uint64_t c = 0; c * chunk < size; c++) {
        uint64_t start = c * chunk, room = size - start < chunk ? size - start : chunk;
        if (room < SAMPLE)
            break;
        uint64_t r =
            cli_mix64(seed ^ cli_mix64(item * 0x9e3779b97f4a7c15ull + c)) % (room - SAMPLE + 1);
        spans[n++] = (gpu_span){start + (r & ~7ull), SAMPLE};
    }
    *count = n;
    return n * SAMPLE;
}

static uint64_t floor_copies(const bench_opts *o, uint64_t size)
{
    uint64_t n = FLOOR_BYTES / size;
    if (o->floor_copies > 0)
        return (uint64_t)o->floor_copies;
    return n < FLOOR_MIN ? FLOOR_MIN : n > FLOOR_MAX ? FLOOR_MAX : n;
}

/* n copies in ns, each counted as `bytes`. */
static gpu_copies copy_rate(int device, uint64_t n, uint64_t ns, double bytes)
{
    return (gpu_copies){device, n, (double)ns / 1e9, ns ? bytes * (double)n / (double)ns : 0};
}

static int copies(bench_run *run, uint64_t size, uint64_t n)
{
    gpu_run *g = GPU(run);
    for (uint64_t i = 0; i < n; i++)
        if (RUN_CU(run, "the copy floor", cuMemcpyAsync, g->aux, g->src[0], size, g->stream))
            return -1;
    return gpu_stream_drained(run, "the copy floor");
}

/* Its bytes count twice: read and written. */
static int copy_floor(bench_run *run, gpu_row *row)
{
    uint64_t n = floor_copies(run->opt, row->size);
    if (copies(run, row->size, FLOOR_WARMUP) != 0)
        return -1;
    uint64_t t0 = ferry_now_ns();
    if (copies(run, row->size, n) != 0)
        return -1;
    row->stream.floor = copy_rate(0, n, ferry_now_ns() - t0, 2.0 * (double)row->size);
    return 0;
}

/* Whether rank is the first one on a GPU other than the producer's. */
static int times_peer_floor(const bench_opts *o, uint32_t rank)
{
    for (uint32_t r = 0; r < rank; r++)
        if (o->devices[r] == o->devices[rank])
            return 0;
    return o->devices[rank] != o->producer_device;
}

static int peer_floors(bench_run *run, gpu_row *row)
{
    for (uint32_t r = 0; r < run->consumers; r++) {
        bench_msg m = {.type = MSG_PEER,
                       .key = r,
                       .item = floor_copies(run->opt, row->size),
                       .size = row->size};
        if (!times_peer_floor(run->opt, r))
            continue;
        if (run_send(run, run->consumers, &m) != 0 ||
            run_wait(run, 0, run->consumers, m.seq, NULL) != 0)
            return -1;
        const uint64_t *stat = run->region.ranks[r].stat;
        row->stream.peers[row->stream.npeers++] =
            copy_rate((int)run->opt->devices[r], stat[STAT_PEER_COPIES], stat[STAT_PEER_NS],
                      (double)row->size);
    }
    return 0;
}

static int publish_range(bench_run *run, uint64_t size, uint64_t first, uint64_t n)
{
    for (uint64_t i = first; i < first + n; i++) {
        bench_msg m = gpu_item(run, MSG_ITEM, i, size);
        if (gpu_publish(run, &m, "stream item") != 0 || run_send(run, run->consumers, &m) != 0 ||
            run_check_often(run) != 0)
            return -1;
    }
    return gpu_drain_pool(run);
}

/* --warmup items first (the consumers open the pool then), not timed. */
static int handoff(bench_run *run, gpu_row *row)
{
    struct stream_row *s = &row->stream;
    uint64_t items = (uint64_t)run->opt->items, warm = (uint64_t)run->opt->warmup, full0, full1;
    if (publish_range(run, row->size, 0, warm) != 0 ||
        run_full_events(run, GPU(run)->pool, &full0) != 0)
        return -1;
    uint64_t t0 = ferry_now_ns();
    if (publish_range(run, row->size, warm, items) != 0)
        return -1;
    s->seconds = (double)(ferry_now_ns() - t0) / 1e9;
    if (run_full_events(run, GPU(run)->pool, &full1) != 0)
        return -1;
    s->items_per_s = (double)items / s->seconds;
    s->payload_gbps = (double)items * (double)row->size / s->seconds / 1e9;
    s->effective_gbps = s->payload_gbps * 2.0 * (1.0 + (double)run->consumers);
    s->read_gbps = s->payload_gbps * (double)run->consumers;
    s->pool_full = full1 - full0;
    return 0;
}

static int stream_row(bench_run *run, gpu_row *row)
{
    if (copy_floor(run, row) != 0 || peer_floors(run, row) != 0 ||
        run_send_type(run, run->consumers, MSG_BEGIN) != 0 || handoff(run, row) != 0 ||
        gpu_stream_drained(run, "the producer's stream") != 0)
        return -1;
    return run_phase_end(run, run->consumers);
}

/* The consumers' sample ring holds the samples of at least one item of every size. */
static void stream_prepare(bench_run *run)
{
    gpu_span spans[MAX_SPANS];
    uint32_t n;
    for (uint32_t i = 0; i < run->opt->nsizes; i++) {
        uint64_t bytes = sample_spans(0, 0, run->opt->sizes[i], spans, &n);
        if (bytes > run->params.sample_bytes)
            run->params.sample_bytes = bytes;
    }
}

/* Consumer read GB/s / the peer floor when every consumer is on one GPU other than the
 * producer's; NAN otherwise. */
static double peer_ratio(const bench_run *run, const gpu_row *r)
{
    for (uint32_t c = 1; c < run->consumers; c++)
        if (run->opt->devices[c] != run->opt->devices[0])
            return NAN;
    return r->stream.npeers == 1 ? cli_ratio(r->stream.read_gbps, r->stream.peers[0].gbps) : NAN;
}

static void stream_text(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const gpu_run *g = GPU(run);
    printf("%u consumer%s, %lld items after %lld warm-up, verify every %lld\n", run->consumers,
           run->consumers > 1 ? "s" : "", (long long)o->items, (long long)o->warmup,
           (long long)o->verify_every);
    printf("\n%-8s %9s %9s %10s %11s %13s %11s %7s %9s %10s\n", "control", "size", "seconds",
           "items/s", "payload GB/s", "effective GB/s", "floor GB/s", "ratio", "pool-full",
           "read GB/s");
    for (uint32_t i = 0; i < g->nrows; i++) {
        const struct stream_row *s = &g->rows[i].stream;
        char size[32];
        cli_format_size(g->rows[i].size, size, sizeof(size));
        printf("%-8s %9s %9.4f %10.1f %11.2f %13.2f %11.2f %7.3f %9llu %10.2f\n",
               gpu_placement(g->rows[i].placement), size, s->seconds, s->items_per_s,
               s->payload_gbps, s->effective_gbps, s->floor.gbps,
               cli_ratio(s->effective_gbps, s->floor.gbps), (unsigned long long)s->pool_full,
               s->read_gbps);
        for (uint32_t p = 0; p < s->npeers; p++)
            printf("%-8s %9s peer floor GPU %d: %.2f GB/s read (%llu copies)\n", "", "",
                   s->peers[p].device, s->peers[p].gbps, (unsigned long long)s->peers[p].copies);
        double pr = peer_ratio(run, &g->rows[i]);
        if (isfinite(pr))
            printf("%-8s %9s consumer read / peer floor: %.3f\n", "", "", pr);
    }
    printf("\neffective = (producer copy + every consumer's copy), each byte read and written;\n"
           "floor = device-to-device cuMemcpyAsync of the same size on the producer's GPU, read "
           "+ written;\nratio = ferry effective copy bandwidth / device copy bandwidth;\n"
           "read = bytes the consumers read (items * size * consumers) / s\n");
    if (gpu_has_remote(o))
        printf("peer floor = copies of the same size from the producer's GPU into that GPU "
               "(consumer side,\nCUDA IPC mapping), bytes read; consumer read / peer floor "
               "when every consumer is on that GPU\n");
}

static void copies_json(const gpu_copies *c, const char *after)
{
    printf("\"copies\": %llu, ", (unsigned long long)c->copies);
    cli_json_num("seconds", c->seconds, ", ");
    cli_json_num("gbytes_per_s", c->gbps, after);
}

static void stream_json_row(const bench_run *run, const gpu_row *r)
{
    const struct stream_row *s = &r->stream;
    cli_json_num("seconds", s->seconds, ", ");
    cli_json_num("items_per_s", s->items_per_s, ", ");
    cli_json_num("gbytes_per_s", s->payload_gbps, ", ");
    cli_json_num("effective_gbytes_per_s", s->effective_gbps, ", ");
    printf("\"pool_full\": %llu, \"floor\": {", (unsigned long long)s->pool_full);
    copies_json(&s->floor, "}, ");
    cli_json_num("ratio_vs_floor", cli_ratio(s->effective_gbps, s->floor.gbps), ", ");
    cli_json_num("consumer_read_gbytes_per_s", s->read_gbps, ", ");
    printf("\"peer_floor\": [");
    for (uint32_t p = 0; p < s->npeers; p++) {
        printf("%s{\"device\": %d, ", p ? ", " : "", s->peers[p].device);
        copies_json(&s->peers[p], "}");
    }
    printf("], ");
    cli_json_num("ratio_vs_peer_floor", peer_ratio(run, r), ", ");
}

/* The sample ring: room for the samples of every item of a phase, up to RING_MAX; the host
 * staging buffer is its size. */
static int stream_init(bench_worker *w)
{
    gpu_worker *g = GW(w);
    uint64_t per = w->p.sample_bytes ? w->p.sample_bytes : 1;
    uint64_t want = per * (w->p.items ? w->p.items : 1);
    g->ring_bytes = want < RING_MAX ? want : RING_MAX;
    g->ring_bytes = g->ring_bytes < per ? per : g->ring_bytes;
    g->max_pending = (uint32_t)(g->ring_bytes / per);
    free(g->host);
    g->host = malloc(g->ring_bytes);
    g->pending = calloc(g->max_pending, sizeof(*g->pending));
    if (!g->host || !g->pending)
        return worker_fail(w, "out of memory for the sample ring");
    return WORKER_CU(w, cuMemAlloc, &g->ring, g->ring_bytes);
}

/* Checks every item whose samples wait in the ring. */
static int flush(bench_worker *w)
{
    gpu_worker *g = GW(w);
    gpu_span spans[MAX_SPANS];
    uint32_t n;
    if (!g->npending)
        return 0;
    if (gpu_worker_sync(w, "the consumer's stream before checking samples") != 0 ||
        WORKER_CU(w, cuMemcpy, (CUdeviceptr)(uintptr_t)g->host, g->ring, g->ring_used))
        return -1;
    for (uint32_t i = 0; i < g->npending; i++) {
        const gpu_pending *e = &g->pending[i];
        sample_spans(w->p.seed, e->iter, e->size, spans, &n);
        gpu_worker_verify(w, "stream", e, g->host + e->at, spans, n);
    }
    g->npending = 0;
    g->ring_used = 0;
    return 0;
}

/* Enqueues the copies of m's sampled spans into the ring (after the read, on its stream). */
static int keep_samples(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    gpu_span spans[MAX_SPANS];
    uint32_t n;
    uint64_t bytes = sample_spans(w->p.seed, m->item, m->size, spans, &n);
    if (bytes > g->ring_bytes)
        return worker_fail(w, "stream item %llu: %llu sampled bytes exceed the ring's %llu",
                           (unsigned long long)m->item, (unsigned long long)bytes,
                           (unsigned long long)g->ring_bytes);
    if ((g->ring_used + bytes > g->ring_bytes || g->npending == g->max_pending) && flush(w) != 0)
        return -1;
    g->pending[g->npending++] = (gpu_pending){m->item, m->key, m->size, g->ring_used};
    for (uint32_t i = 0; i < n; i++) {
        if (WORKER_CU(w, cuMemcpyAsync, g->ring + g->ring_used, g->dst + spans[i].off, spans[i].len,
                      g->stream))
            return -1;
        g->ring_used += spans[i].len;
    }
    return 0;
}

static int peer_copies(bench_worker *w, uint64_t size, uint64_t n)
{
    gpu_worker *g = GW(w);
    for (uint64_t i = 0; i < n; i++)
        if (WORKER_CU(w, cuMemcpyAsync, g->dst, g->peer, size, g->stream))
            return -1;
    return gpu_worker_sync(w, "the peer floor");
}

/* The peer floor, timed by the rank the message names. */
static int on_peer(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    if (m->key != w->rank)
        return 0;
    if (!w->p.has_floor || g->consumer || m->size > w->p.max_item || m->item == 0)
        return worker_fail(w, "a peer floor the run did not prepare for");
    if ((!g->peer && gpu_worker_open_floor(w) != 0) || peer_copies(w, m->size, FLOOR_WARMUP) != 0)
        return -1;
    uint64_t t0 = ferry_now_ns();
    if (peer_copies(w, m->size, m->item) != 0)
        return -1;
    w->me->stat[STAT_PEER_NS] = ferry_now_ns() - t0;
    w->me->stat[STAT_PEER_COPIES] = m->item;
    return 0;
}

static int stream_handle(bench_worker *w, const bench_msg *m)
{
    if (m->type == MSG_PEER)
        return on_peer(w, m);
    if (gpu_worker_read(w, m) != 0)
        return -1;
    return m->flags & MSG_F_VERIFY ? keep_samples(w, m) : 0;
}

const gpu_mode_ops stream_ops = {
    .needs = NEED_AUX | NEED_EXPORT_REMOTE | NEED_QUIET_LIBRARY,
    .own_msg = 1,
    .defaults =
        {
            GPU_DEFAULTS,
            .pool_size = 1ll << 30,
            .sizes = {64ull << 20},
            .nsizes = 1,
            .max_inflight = 64,
            .verify_every = 1,
            .iterations = 1000,
            .warmup = 8,
            .floor_copies = 0, /* about 4 GiB worth, 8 to 1000 copies */
            .reclaim_interval_us = 1000,
        },
    .prepare = stream_prepare,
    .row = stream_row,
    .text = stream_text,
    .json_row = stream_json_row,
    .init = stream_init,
    .handle = stream_handle,
    .flush = flush,
};
