/* --mode rtt: the round trip of one item through the CUDA IPC pool to every consumer (one per
 * GPU in a tensor-parallel run), against a floor with no pool logic in the same processes over
 * the same channels.
 *
 * ferry: the producer publishes from a pre-filled device buffer (ferry_pool_publish_async on
 * its stream, no host synchronisation), encodes the descriptor and sends it to every
 * consumer; each consumer enqueues ferry_consumer_read_async (wait ready, copy, ack) on its
 * stream; the producer calls ferry_pool_reclaim until it reports the lease reclaimed, which
 * takes every consumer's acknowledgement. Round trip = start of the publish to that moment.
 *
 * floor: the producer enqueues cuMemcpyAsync into a fixed device buffer (which every consumer
 * opened once through CUDA IPC) and cuStreamWriteValue32(ready = n), and sends a message of
 * the same size to every consumer; each enqueues cuStreamWaitValue32(ready >= n),
 * cuMemcpyAsync into its own buffer and cuStreamWriteValue32(its ack word = n); the producer
 * spins until every rank's ack word reached n (plain acquire loads; the words live in shared
 * pages registered with CUDA by every process, each on its own cache line).
 *
 * Every --verify-every-th iteration (counting the warm-up) every consumer checks its copy
 * against the pattern the message names, after the producer has stopped the clock and before
 * the next iteration starts. */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_gpu.h"

#define LOOK_PERIOD_NS 1000000ull /* checks while spinning: workers, timeout, background */

/* One iteration: *ns gets its round trip (0: not counted), *check the message whose
 * verification the consumers run before the next iteration (0: none). */
typedef int (*iteration_fn)(gb_run *run, uint64_t size, uint64_t iter, uint64_t *ns,
                            uint64_t *check);

/* One side of the comparison: ferry or the floor. */
typedef struct side {
    iteration_fn fn;
    uint64_t *lat;    /* round trips of the timed iterations */
    uint64_t busy_ns; /* time in the timed iterations, verification pauses not counted */
} side;

static int cu_check(gb_run *run, CUresult rc, const char *call)
{
    if (rc == CUDA_SUCCESS)
        return 0;
    ferry__cuda_fail(run->cu, call, rc);
    return gb_fail(run, "rtt floor: %s", ferry_last_error());
}

static void fill_msg(gb_msg *m, uint32_t type, uint64_t iter, uint64_t key, uint64_t size,
                     const gb_run *run)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->iter = iter;
    m->key = key;
    m->size = size;
    if (iter % (uint64_t)run->opt->verify_every == 0)
        m->flags = GB_F_VERIFY;
}

/* Spins on ferry_pool_reclaim until it frees the lease. Should the background reclaimer take
 * it first, *background says so (the iteration is then not counted). */
static int await_reclaim(gb_run *run, uint64_t iter, int *background)
{
    uint64_t start = cli_now_ns(), next_look = start + LOOK_PERIOD_NS;
    for (;;) {
        uint64_t n = 0;
        if (ferry_pool_reclaim(run->pool, &n) != FERRY_OK)
            return gb_fail(run, "ferry_pool_reclaim failed: %s", ferry_last_error());
        if (n)
            return 0;
        sched_yield();
        uint64_t now = cli_now_ns();
        if (now < next_look)
            continue;
        next_look = now + LOOK_PERIOD_NS;
        ferry_pool_stats s;
        if (gb_pool_stats(run->pool, &s) != FERRY_OK)
            return gb_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
        if (s.leases_in_flight == 0) {
            *background = 1;
            return 0;
        }
        if (gb_check_workers(run) != 0)
            return -1;
        if (now - start >= run->region.params->timeout_ns)
            return gb_fail(run, "rtt iteration %llu: no acknowledgement within %llu ms",
                           (unsigned long long)iter,
                           (unsigned long long)(run->region.params->timeout_ns / 1000000));
    }
}

static int ferry_once(gb_run *run, uint64_t size, uint64_t iter, uint64_t *ns, uint64_t *check)
{
    uint64_t key = gb_take_key(run, iter);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *src = (const void *)(uintptr_t)run->src[key];
    ferry_descriptor d;
    gb_msg m;
    int background = 0;
    fill_msg(&m, GB_MSG_FERRY, iter, key, size, run);
    uint64_t t0 = cli_now_ns();
    if (ferry_pool_publish_async(run->pool, &t, src, run->stream, run->region.params->timeout_ns,
                                 &d) != FERRY_OK)
        return gb_fail(run, "rtt iteration %llu: ferry_pool_publish_async failed: %s",
                       (unsigned long long)iter, ferry_last_error());
    if (ferry_descriptor_encode(&d, m.desc) != FERRY_OK)
        return gb_fail(run, "encoding a descriptor failed: %s", ferry_last_error());
    if (gb_send(run, run->consumers, &m) != 0 || await_reclaim(run, iter, &background) != 0)
        return -1;
    *ns = background ? 0 : cli_now_ns() - t0;
    *check = m.flags & GB_F_VERIFY ? m.seq : 0;
    return 0;
}

/* The first rank from `from` on whose ack word has not reached value; run->consumers if
 * none. */
static uint32_t ack_missing(const gb_run *run, uint32_t value, uint32_t from)
{
    for (uint32_t r = from; r < run->consumers; r++) {
        uint32_t *ack = &run->region.flags[GB_WORD_ACK(r)];
        if ((int32_t)(__atomic_load_n(ack, __ATOMIC_ACQUIRE) - value) < 0)
            return r;
    }
    return run->consumers;
}

static int await_floor_acks(gb_run *run, uint64_t iter, uint32_t value)
{
    uint64_t start = cli_now_ns(), next_look = start + LOOK_PERIOD_NS;
    uint32_t r = 0;
    while ((r = ack_missing(run, value, r)) < run->consumers) {
        sched_yield();
        uint64_t now = cli_now_ns();
        if (now < next_look)
            continue;
        next_look = now + LOOK_PERIOD_NS;
        if (gb_check_workers(run) != 0)
            return -1;
        if (now - start >= run->region.params->timeout_ns)
            return gb_fail(run,
                           "rtt floor iteration %llu: no acknowledgement from consumer rank %u "
                           "within %llu ms",
                           (unsigned long long)iter, r,
                           (unsigned long long)(run->region.params->timeout_ns / 1000000));
    }
    return 0;
}

static int floor_once(gb_run *run, uint64_t size, uint64_t iter, uint64_t *ns, uint64_t *check)
{
    const ferry__cuda *cu = run->cu;
    uint64_t key = gb_take_key(run, iter);
    gb_msg m;
    fill_msg(&m, GB_MSG_FLOOR, iter, key, size, run);
    /* gb_send numbers the message run->seq + 1: that is the value of the words. */
    uint32_t value = (uint32_t)(run->seq + 1);
    CUdeviceptr ready = run->flags_dev + GB_WORD_READY * sizeof(uint32_t);
    uint64_t t0 = cli_now_ns();
    if (cu_check(run, cu->cuMemcpyAsync(run->aux, run->src[key], size, run->stream),
                 "cuMemcpyAsync") != 0 ||
        cu_check(run, cu->cuStreamWriteValue32(run->stream, ready, value, 0),
                 "cuStreamWriteValue32") != 0)
        return -1;
    if (gb_send(run, run->consumers, &m) != 0 || await_floor_acks(run, iter, value) != 0)
        return -1;
    *ns = cli_now_ns() - t0;
    *check = m.flags & GB_F_VERIFY ? m.seq : 0;
    return 0;
}

/* Runs iterations [first, first + n) of one side; lat (NULL for the warm-up) gets their
 * round trips, and s->busy_ns their time. */
static int iterations(gb_run *run, side *s, uint64_t size, uint64_t first, uint64_t n,
                      uint64_t *lat)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t ns = 0, check = 0, t0 = cli_now_ns();
        if (s->fn(run, size, first + i, &ns, &check) != 0)
            return -1;
        if (lat) {
            s->busy_ns += cli_now_ns() - t0;
            lat[i] = ns;
        }
        if ((check && gb_wait_progress(run, run->consumers, check) != 0) ||
            gb_check_workers_often(run) != 0)
            return -1;
    }
    return 0;
}

/* Mean, p50 and p99 of the counted samples (zeros are iterations not counted), and the
 * rate of all n. */
static void summarize(side *s, uint64_t n, gb_lat *out)
{
    uint64_t *lat = s->lat;
    uint64_t kept = 0;
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        if (lat[i]) {
            lat[kept++] = lat[i];
            sum += (double)lat[i];
        }
    out->ran = 1;
    out->samples = kept;
    out->background = n - kept;
    out->mean_us = kept ? sum / (double)kept / 1e3 : NAN;
    cli_p50_p99_us(lat, kept, &out->p50_us, &out->p99_us);
    out->items_per_s = s->busy_ns ? (double)n * 1e9 / (double)s->busy_ns : NAN;
}

static int measure(gb_run *run, gb_row *row, side sides[2])
{
    const gb_options *o = run->opt;
    uint64_t n = (uint64_t)o->iterations, warm = (uint64_t)o->warmup;
    for (int k = 0; k < 2; k++)
        if (iterations(run, &sides[k], row->size, 0, warm, NULL) != 0)
            return -1;
    for (uint64_t c = 0; c < (uint64_t)o->rounds; c++) {
        uint64_t begin = n * c / (uint64_t)o->rounds, end = n * (c + 1) / (uint64_t)o->rounds;
        for (int k = 0; k < 2; k++)
            if (iterations(run, &sides[k], row->size, warm + begin, end - begin,
                           sides[k].lat + begin) != 0)
                return -1;
    }
    summarize(&sides[0], n, &row->ferry);
    summarize(&sides[1], n, &row->floor);
    return 0;
}

int gb_rtt_row(gb_run *run, gb_row *row)
{
    uint64_t n = (uint64_t)run->opt->iterations;
    side sides[2] = {{ferry_once, calloc(n, sizeof(uint64_t)), 0},
                     {floor_once, calloc(n, sizeof(uint64_t)), 0}};
    int rc = -1;
    if (!sides[0].lat || !sides[1].lat)
        gb_fail(run, "out of memory for %llu samples", (unsigned long long)n);
    else if (gb_phase_begin(run, run->consumers) == 0 && measure(run, row, sides) == 0)
        rc = gb_phase_end(run, run->consumers);
    free(sides[0].lat);
    free(sides[1].lat);
    return rc;
}
