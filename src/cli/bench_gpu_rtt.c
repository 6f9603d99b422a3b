/* --mode rtt: the round trip of one item through the CUDA IPC pool, against a floor with no
 * pool logic in the same processes over the same channel.
 *
 * ferry: the producer publishes from a pre-filled device buffer (ferry_pool_publish_async on
 * its stream, no host synchronisation), encodes the descriptor and sends it; the consumer
 * enqueues ferry_consumer_read_async (wait ready, copy, ack) on its stream; the producer calls
 * ferry_pool_reclaim until it reports the lease reclaimed. Round trip = start of the publish
 * to that moment.
 *
 * floor: the producer enqueues cuMemcpyAsync into a fixed device buffer (which the consumer
 * opened once through CUDA IPC) and cuStreamWriteValue32(ready = n), and sends a message of
 * the same size; the consumer enqueues cuStreamWaitValue32(ready >= n), cuMemcpyAsync into its
 * own buffer, cuStreamWriteValue32(ack = n); the producer spins on the ack word (plain acquire
 * loads; both words live in a shared page registered with CUDA by both processes).
 *
 * Every --verify-every-th iteration (counting the warm-up) the consumer checks its copy
 * against the pattern the message names, after the producer has stopped the clock and before
 * the next iteration starts. */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_gpu.h"

#define LOOK_PERIOD_NS 1000000ull /* checks while spinning: workers, timeout, background */

typedef int (*iteration_fn)(gb_run *run, uint64_t size, uint64_t iter, uint64_t *ns);

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

static int ferry_once(gb_run *run, uint64_t size, uint64_t iter, uint64_t *ns)
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
    if (gb_send(run, 1, &m) != 0 || await_reclaim(run, iter, &background) != 0)
        return -1;
    *ns = background ? 0 : cli_now_ns() - t0;
    return m.flags & GB_F_VERIFY ? gb_wait_progress(run, 1, m.seq) : 0;
}

static int await_floor_ack(gb_run *run, uint64_t iter, uint32_t value)
{
    uint32_t *ack = &run->region.flags[GB_WORD_ACK];
    uint64_t start = cli_now_ns(), next_look = start + LOOK_PERIOD_NS;
    while ((int32_t)(__atomic_load_n(ack, __ATOMIC_ACQUIRE) - value) < 0) {
        sched_yield();
        uint64_t now = cli_now_ns();
        if (now < next_look)
            continue;
        next_look = now + LOOK_PERIOD_NS;
        if (gb_check_workers(run) != 0)
            return -1;
        if (now - start >= run->region.params->timeout_ns)
            return gb_fail(run, "rtt floor iteration %llu: no acknowledgement within %llu ms",
                           (unsigned long long)iter,
                           (unsigned long long)(run->region.params->timeout_ns / 1000000));
    }
    return 0;
}

static int floor_once(gb_run *run, uint64_t size, uint64_t iter, uint64_t *ns)
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
    if (gb_send(run, 1, &m) != 0 || await_floor_ack(run, iter, value) != 0)
        return -1;
    *ns = cli_now_ns() - t0;
    return m.flags & GB_F_VERIFY ? gb_wait_progress(run, 1, m.seq) : 0;
}

/* Runs iterations [first, first + n) of one side; lat (may be NULL) gets their times. */
static int iterations(gb_run *run, iteration_fn fn, uint64_t size, uint64_t first, uint64_t n,
                      uint64_t *lat)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t ns = 0;
        if (fn(run, size, first + i, &ns) != 0 || gb_check_workers_often(run) != 0)
            return -1;
        if (lat)
            lat[i] = ns;
    }
    return 0;
}

/* Mean, p50 and p99 of the counted samples (zeros are iterations not counted). */
static void summarize(uint64_t *lat, uint64_t n, gb_lat *out)
{
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
}

static int measure(gb_run *run, gb_row *row, uint64_t *lat_ferry, uint64_t *lat_floor)
{
    const gb_options *o = run->opt;
    uint64_t n = (uint64_t)o->iterations, warm = (uint64_t)o->warmup;
    if (iterations(run, ferry_once, row->size, 0, warm, NULL) != 0 ||
        iterations(run, floor_once, row->size, 0, warm, NULL) != 0)
        return -1;
    for (uint64_t c = 0; c < (uint64_t)o->rounds; c++) {
        uint64_t begin = n * c / (uint64_t)o->rounds, end = n * (c + 1) / (uint64_t)o->rounds;
        if (iterations(run, ferry_once, row->size, warm + begin, end - begin, lat_ferry + begin) !=
                0 ||
            iterations(run, floor_once, row->size, warm + begin, end - begin, lat_floor + begin) !=
                0)
            return -1;
    }
    summarize(lat_ferry, n, &row->ferry);
    summarize(lat_floor, n, &row->floor);
    return 0;
}

int gb_rtt_row(gb_run *run, gb_row *row)
{
    uint64_t n = (uint64_t)run->opt->iterations;
    uint64_t *lat_ferry = calloc(n, sizeof(uint64_t)), *lat_floor = calloc(n, sizeof(uint64_t));
    int rc = -1;
    if (!lat_ferry || !lat_floor)
        gb_fail(run, "out of memory for %llu samples", (unsigned long long)n);
    else if (gb_phase_begin(run, 1) == 0 && measure(run, row, lat_ferry, lat_floor) == 0)
        rc = gb_phase_end(run, 1);
    free(lat_ferry);
    free(lat_floor);
    return rc;
}
