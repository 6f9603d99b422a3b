/* --mode stream: items through the CUDA IPC pool to N consumers as fast as they go.
 *
 * The producer publishes each item from one of its pre-filled device buffers
 * (ferry_pool_publish_async, waiting up to --timeout-ms for space) and sends the descriptor
 * to every consumer, which enqueues ferry_consumer_read_async into its own device buffer and
 * copies the item's sampled spans into a device sample ring (checked on the host when the
 * ring fills and at the end). Time: first publish to the last lease reclaimed, after
 * --warmup items that are not timed.
 *
 * Bytes moved = the producer's copy plus every consumer's copy, each byte read and written:
 * items * size * (1 + consumers) * 2. The floor, in the same run: cuMemcpyAsync of the same
 * size between two buffers of the producer's device, timed over many copies with
 * CLOCK_MONOTONIC around one bounded wait for the stream, also counted read + written.
 *
 * Consumers read items * size * consumers bytes. Those on another GPU read them over the link
 * between the GPUs: for each such GPU the peer floor (bench_gpu_peer.c) times copies of the
 * same size from the producer's GPU into it, counted as bytes read. */
#include <string.h>

#include "cli/bench_gpu.h"

#define FLOOR_BYTES (4ull << 30) /* bytes copied by a floor, between FLOOR_MIN and MAX copies */
#define FLOOR_MIN   8ull
#define FLOOR_MAX   1000ull

uint64_t gb_floor_copies(const gb_options *o, uint64_t size)
{
    uint64_t n = FLOOR_BYTES / size;
    if (o->floor_copies > 0)
        return (uint64_t)o->floor_copies;
    return n < FLOOR_MIN ? FLOOR_MIN : n > FLOOR_MAX ? FLOOR_MAX : n;
}

static int copies(gb_run *run, uint64_t size, uint64_t n)
{
    const ferry__cuda *cu = run->cu;
    for (uint64_t i = 0; i < n; i++) {
        CUresult rc = cu->cuMemcpyAsync(run->aux, run->src[0], size, run->stream);
        if (rc != CUDA_SUCCESS) {
            ferry__cuda_fail(cu, "cuMemcpyAsync", rc);
            return gb_fail(run, "the copy floor: %s", ferry_last_error());
        }
    }
    if (gb_stream_wait(cu, run->stream, run->region.params->timeout_ns, "the copy floor") !=
        FERRY_OK)
        return gb_fail(run, "%s", ferry_last_error());
    return 0;
}

static int copy_floor(gb_run *run, gb_row *row)
{
    uint64_t n = gb_floor_copies(run->opt, row->size);
    if (copies(run, row->size, GB_FLOOR_WARMUP) != 0)
        return -1;
    uint64_t t0 = cli_now_ns();
    if (copies(run, row->size, n) != 0)
        return -1;
    uint64_t ns = cli_now_ns() - t0;
    row->floor_copies = n;
    row->floor_seconds = (double)ns / 1e9;
    row->floor_gbps = ns ? 2.0 * (double)row->size * (double)n / (double)ns : 0;
    return 0;
}

static int publish_one(gb_run *run, uint64_t size, uint64_t item)
{
    uint64_t key = gb_take_key(run, item);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *src = (const void *)(uintptr_t)run->src[key];
    ferry_descriptor d;
    gb_msg m;
    memset(&m, 0, sizeof(m));
    m.type = GB_MSG_STREAM;
    m.iter = item;
    m.key = key;
    m.size = size;
    m.flags = item % (uint64_t)run->opt->verify_every == 0 ? GB_F_VERIFY : 0;
    if (ferry_pool_publish_async(run->pool, &t, src, run->stream, run->region.params->timeout_ns,
                                 &d) != FERRY_OK)
        return gb_fail(run, "stream item %llu: ferry_pool_publish_async failed: %s",
                       (unsigned long long)item, ferry_last_error());
    if (ferry_descriptor_encode(&d, m.desc) != FERRY_OK)
        return gb_fail(run, "encoding a descriptor failed: %s", ferry_last_error());
    return gb_send(run, run->consumers, &m);
}

static int full_events(gb_run *run, uint64_t *events)
{
    ferry_pool_stats s;
    if (gb_pool_stats(run->pool, &s) != FERRY_OK)
        return gb_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
    *events = s.pool_full_events;
    return 0;
}

static int publish_range(gb_run *run, uint64_t size, uint64_t first, uint64_t n)
{
    for (uint64_t i = first; i < first + n; i++)
        if (publish_one(run, size, i) != 0 || gb_check_workers_often(run) != 0)
            return -1;
    return gb_drain_pool(run);
}

/* --warmup items first (the consumers open the pool then), not timed. */
static int handoff(gb_run *run, gb_row *row)
{
    uint64_t items = (uint64_t)run->opt->items, warm = (uint64_t)run->opt->warmup, full0, full1;
    if (publish_range(run, row->size, 0, warm) != 0 || full_events(run, &full0) != 0)
        return -1;
    uint64_t t0 = cli_now_ns();
    if (publish_range(run, row->size, warm, items) != 0)
        return -1;
    double seconds = (double)(cli_now_ns() - t0) / 1e9;
    if (full_events(run, &full1) != 0)
        return -1;
    double payload = (double)items * (double)row->size;
    row->seconds = seconds;
    row->items_per_s = (double)items / seconds;
    row->payload_gbps = payload / seconds / 1e9;
    row->effective_gbps = row->payload_gbps * 2.0 * (1.0 + (double)run->consumers);
    row->read_gbps = row->payload_gbps * (double)run->consumers;
    row->pool_full = full1 - full0;
    return 0;
}

int gb_stream_row(gb_run *run, gb_row *row)
{
    if (copy_floor(run, row) != 0 || gb_peer_floors(run, row) != 0 ||
        gb_phase_begin(run, run->consumers) != 0 || handoff(run, row) != 0)
        return -1;
    if (gb_stream_wait(run->cu, run->stream, run->region.params->timeout_ns,
                       "the producer's stream") != FERRY_OK)
        return gb_fail(run, "%s", ferry_last_error());
    return gb_phase_end(run, run->consumers);
}
