/* --mode cpu: ferry's own CPU cost per stream-ordered call, without the driver calls it
 * makes (docs/cli.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define BATCH       256 /* calls per batch at most */
#define WORD_RAW_P  32  /* flag words: the producer's raw writes */
#define WORD_RAW_C  64  /* the consumer's raw writes */
#define DEVICE_WORD 256 /* bytes of a consumer's device words */
#define F_BATCH_END 0x2u
#define F_WARMUP    0x4u
enum { STAT_READ_NS = 0, STAT_RAW_NS = 1, STAT_DECODE_NS = 2, STAT_CALLS = 3 };
/* A row's numbers (gpu_row.cpu): ns per call. */
enum { PUBLISH, PUBLISH_RAW, PUBLISH_FERRY, READ, READ_RAW, READ_FERRY, DECODE, CONTEXT, VALUES };
static const char *const keys[VALUES] = {"publish_ns", "publish_driver_ns", "publish_ferry_ns",
                                         "read_ns",    "read_driver_ns",    "read_ferry_ns",
                                         "decode_ns",  "context_ns"};

static uint32_t batch_size(bench_run *run, uint64_t size)
{
    ferry_pool_stats s;
    uint64_t per = (size + 255) & ~255ull, n = BATCH;
    if (run_pool_stats(GPU(run)->pool, &s) != FERRY_OK)
        return 0;
    n = (uint64_t)run->opt->max_inflight < n ? (uint64_t)run->opt->max_inflight : n;
    return (uint32_t)(s.usable_bytes / per < n ? s.usable_bytes / per : n);
}

/* A slice of the pool and a word of the kind the ready words are, for the raw calls. */
static int raw_target(bench_run *run, uint64_t size, CUdeviceptr *dst, CUdeviceptr *word)
{
    gpu_run *g = GPU(run);
    ferry_tensor t = ferry_tensor_bytes(size);
    ferry_descriptor d;
    void *data = NULL;
    if (ferry_pool_reserve(g->pool, &t, run->params.timeout_ns, &data, &d) != FERRY_OK ||
        ferry_pool_cancel(g->pool, &d) != FERRY_OK)
        return run_fail(run, "reserving a slice for the raw calls failed: %s", ferry_last_error());
    *dst = (CUdeviceptr)(uintptr_t)data;
    *word = g->placement == FERRY_CONTROL_DEVICE ? g->word : g->flags_dev + WORD_RAW_P * 4;
    return 0;
}

/* Hands the batch's descriptors to the consumer, waits until it has run its side (its stream
 * drained: every lease acknowledged), and reclaims them all. */
static int hand_over(bench_run *run, const ferry_descriptor *d, uint32_t n, uint64_t size,
                     uint32_t flags)
{
    bench_msg m;
    for (uint32_t j = 0; j < n; j++) {
        m = (bench_msg){.type = MSG_ITEM,
                        .flags = flags | (j + 1 == n ? F_BATCH_END : 0),
                        .item = j,
                        .size = size};
        if (ferry_descriptor_encode(&d[j], m.desc) != FERRY_OK)
            return run_fail(run, "encoding a descriptor failed: %s", ferry_last_error());
        if (run_send(run, 1, &m) != 0)
            return -1;
    }
    if (run_wait(run, 0, 1, m.seq, NULL) != 0)
        return -1;
    return gpu_drain_pool(run);
}

static int ferry_batch(bench_run *run, uint64_t size, uint32_t n, uint32_t flags, uint64_t *ns)
{
    gpu_run *g = GPU(run);
    ferry_descriptor d[BATCH];
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *src = (const void *)(uintptr_t)g->src[0];
    uint64_t t0 = cli_thread_cpu_ns();
    for (uint32_t j = 0; j < n; j++)
        if (ferry_pool_publish_async(g->pool, &t, src, g->stream, run->params.timeout_ns, &d[j]) !=
            FERRY_OK)
            return run_fail(run, "cpu: ferry_pool_publish_async failed: %s", ferry_last_error());
    *ns += cli_thread_cpu_ns() - t0;
    if (gpu_stream_drained(run, "the producer's stream") != 0)
        return -1;
    return hand_over(run, d, n, size, flags);
}

static int raw_batch(bench_run *run, CUdeviceptr dst, CUdeviceptr word, uint64_t size, uint32_t n,
                     uint64_t *ns)
{
    gpu_run *g = GPU(run);
    CUresult rc = CUDA_SUCCESS;
    const char *call = "cuMemcpyAsync";
    uint64_t t0 = cli_thread_cpu_ns();
    for (uint32_t j = 0; j < n && rc == CUDA_SUCCESS; j++) {
        rc = cu->cuMemcpyAsync(dst, g->src[0], size, g->stream);
        if (rc == CUDA_SUCCESS) {
            call = "cuStreamWriteValue32";
            rc = cu->cuStreamWriteValue32(g->stream, word, j + 1, 0);
        }
    }
    *ns += cli_thread_cpu_ns() - t0;
    if (rc != CUDA_SUCCESS)
        return gpu_cu(run, "cpu: raw calls", call, rc);
    return gpu_stream_drained(run, "the producer's stream");
}

static int batches(bench_run *run, uint64_t size, uint32_t per, uint64_t ns[2])
{
    uint64_t total = (uint64_t)run->opt->iterations, scratch[2] = {0, 0};
    CUdeviceptr dst = 0, word = 0;
    if (raw_target(run, size, &dst, &word) != 0 || run_send_type(run, 1, MSG_BEGIN) != 0 ||
        ferry_batch(run, size, per, F_WARMUP, &scratch[0]) != 0 ||
        raw_batch(run, dst, word, size, per, &scratch[1]) != 0)
        return -1;
    for (uint64_t done = 0, b = 0; done < total; b++) {
        uint32_t n = total - done < per ? (uint32_t)(total - done) : per;
        for (int side = 0; side < 2; side++) {
            int rc = (side == 0) == (b % 2 == 0) ? ferry_batch(run, size, n, 0, &ns[0])
                                                 : raw_batch(run, dst, word, size, n, &ns[1]);
            if (rc != 0 || run_check_often(run) != 0)
                return -1;
        }
        done += n;
    }
    return run_phase_end(run, 1);
}

/* One cuCtxSetCurrent of the current context: ferry makes the pool's (or the consumer's)
 * device current in every call, and that is counted as ferry's time. */
static int context_cost(bench_run *run, gpu_row *row)
{
    CUcontext ctx = NULL;
    CUresult rc = cu->cuCtxGetCurrent(&ctx);
    uint64_t n = (uint64_t)run->opt->iterations, t0 = cli_thread_cpu_ns();
    for (uint64_t i = 0; i < n && rc == CUDA_SUCCESS; i++)
        rc = cu->cuCtxSetCurrent(ctx);
    row->cpu[CONTEXT] = (double)(cli_thread_cpu_ns() - t0) / (double)n;
    return gpu_cu(run, "cpu", "cuCtxSetCurrent", rc);
}

static int cpu_row(bench_run *run, gpu_row *row)
{
    uint64_t ns[2] = {0, 0};
    uint32_t per = batch_size(run, row->size);
    if (per == 0)
        return run_fail(run, "cpu: the pool holds no %llu-byte item (--pool-size, --max-inflight)",
                        (unsigned long long)row->size);
    if (batches(run, row->size, per, ns) != 0 || context_cost(run, row) != 0)
        return -1;
    double calls = (double)run->opt->iterations, *v = row->cpu;
    const uint64_t *c = run->region.ranks[0].stat;
    v[PUBLISH] = (double)ns[0] / calls;
    v[PUBLISH_RAW] = (double)ns[1] / calls;
    if (c[STAT_CALLS]) {
        v[READ] = (double)c[STAT_READ_NS] / (double)c[STAT_CALLS];
        v[READ_RAW] = (double)c[STAT_RAW_NS] / (double)c[STAT_CALLS];
        v[DECODE] = (double)c[STAT_DECODE_NS] / (double)c[STAT_CALLS];
    }
    v[PUBLISH_FERRY] = v[PUBLISH] - v[PUBLISH_RAW];
    v[READ_FERRY] = v[READ] - v[READ_RAW];
    return 0;
}

static void cpu_text(const bench_run *run)
{
    const gpu_run *g = GPU(run);
    printf("%lld calls of each kind, in batches of up to %d\n", (long long)run->opt->iterations,
           BATCH);
    printf("\n%-8s %9s %8s %11s %11s %11s %10s\n", "control", "size", "call", "total ns",
           "driver ns", "ferry ns", "decode ns");
    for (uint32_t i = 0; i < g->nrows; i++) {
        const double *v = g->rows[i].cpu;
        char size[32];
        cli_format_size(g->rows[i].size, size, sizeof(size));
        printf("%-8s %9s %8s %11.1f %11.1f %11.1f %10s\n", gpu_placement(g->rows[i].placement),
               size, "publish", v[PUBLISH], v[PUBLISH_RAW], v[PUBLISH_FERRY], "-");
        printf("%-8s %9s %8s %11.1f %11.1f %11.1f %10.1f\n", "", "", "read", v[READ], v[READ_RAW],
               v[READ_FERRY], v[DECODE]);
    }
    printf(
        "\nferry ns = ferry's own CPU time per call: the call's thread CPU time minus that of the\n"
        "driver calls it makes, measured on the same thread (target < 1000); decode ns =\n"
        "ferry_descriptor_decode, not part of the read\n");
    for (uint32_t i = 0; i < g->nrows; i++)
        printf("%s%.1f",
               i ? ", "
                 : "one cuCtxSetCurrent (counted as ferry's, which makes its device current in "
                   "every call): ns ",
               g->rows[i].cpu[CONTEXT]);
    printf("\n");
}

static void cpu_json_row(const bench_run *run, const gpu_row *r)
{
    (void)run;
    for (int k = 0; k < VALUES; k++)
        cli_json_num(keys[k], r->cpu[k], ", ");
}

/* The consumer:
 * --------------------------------------------------------------------------------- */

/* The raw calls' target and device words, and room for a batch of messages. */
static int cpu_init(bench_worker *w)
{
    gpu_worker *g = GW(w);
    if (WORKER_CU(w, cuMemAlloc, &g->raw_dst, w->p.max_item) ||
        WORKER_CU(w, cuMemAlloc, &g->word, DEVICE_WORD) ||
        WORKER_CU(w, cuMemsetD32, g->word, 0, DEVICE_WORD / 4))
        return -1;
    g->batch = calloc(BATCH, sizeof(*g->batch));
    return g->batch ? 0 : worker_fail(w, "out of memory for a batch");
}

static int ferry_reads(bench_worker *w, const ferry_descriptor *d, uint32_t first, uint32_t n,
                       uint64_t *ns)
{
    gpu_worker *g = GW(w);
    uint64_t t0 = cli_thread_cpu_ns();
    for (uint32_t j = first; j < n; j++)
        if (ferry_consumer_read_async(g->consumer, &d[j], (void *)(uintptr_t)g->dst, w->p.max_item,
                                      g->stream) != FERRY_OK)
            return worker_fail(w, "cpu: ferry_consumer_read_async: %s", ferry_last_error());
    *ns = cli_thread_cpu_ns() - t0;
    return 0;
}

/* The driver calls ferry's read makes, on words of the kind the pool's control words are: the
 * stream's wait for the ready word (always satisfied: 0 >= 0), the copy, the acknowledgement's
 * write. With control words in host memory ferry makes no wait: its CPU sees the ready word
 * written (the producer's stream drained before the hand-over). */
static int raw_calls(bench_worker *w, const ferry_descriptor *d, uint32_t n, uint64_t *ns)
{
    gpu_worker *g = GW(w);
    int device = d->flags & FERRY_DESC_FLAG_DEVICE_CONTROL;
    CUdeviceptr write = device ? g->word + 64 : g->flags_dev + WORD_RAW_C * 4;
    CUresult rc = CUDA_SUCCESS;
    uint64_t t0 = cli_thread_cpu_ns();
    for (uint32_t j = 0; j < n && rc == CUDA_SUCCESS; j++) {
        if (device)
            rc = cu->cuStreamWaitValue32(g->stream, g->word, 0, CU_STREAM_WAIT_VALUE_GEQ);
        if (rc == CUDA_SUCCESS)
            rc = cu->cuMemcpyAsync(g->raw_dst, g->raw_src, d->length, g->stream);
        if (rc == CUDA_SUCCESS)
            rc = cu->cuStreamWriteValue32(g->stream, write, 0, 0);
    }
    *ns = cli_thread_cpu_ns() - t0;
    return rc == CUDA_SUCCESS ? 0 : worker_fail(w, "cpu: %s", cu_error("a raw stream call", rc));
}

/* The batch: decoded (timed), the pool's address as this consumer maps it (from the first
 * descriptor ever: a view of that lease, acknowledged at once), then both sides. */
static int run_batch(bench_worker *w)
{
    gpu_worker *g = GW(w);
    ferry_descriptor d[BATCH];
    uint64_t decode_ns, ns[2] = {0, 0}, t0 = cli_thread_cpu_ns();
    uint32_t n = g->nbatch, first = 0;
    const bench_msg *last = &g->batch[n - 1];
    for (uint32_t j = 0; j < n; j++)
        if (ferry_descriptor_decode(g->batch[j].desc, FERRY_DESCRIPTOR_SIZE, &d[j]) != FERRY_OK)
            return worker_fail(w, "cpu: ferry_descriptor_decode: %s", ferry_last_error());
    decode_ns = cli_thread_cpu_ns() - t0;
    for (uint32_t j = 0; j < n; j++)
        if (worker_decode(w, &g->batch[j], w->p.max_item, &d[j]) != 0)
            return -1;
    if (!g->raw_src) {
        const void *data = NULL;
        if (ferry_consumer_view_async(g->consumer, &d[0], g->stream, &data) != FERRY_OK ||
            ferry_consumer_ack_async(g->consumer, &d[0], g->stream) != FERRY_OK)
            return worker_fail(w, "cpu: viewing the first lease: %s", ferry_last_error());
        g->raw_src = (CUdeviceptr)(uintptr_t)data;
        first = 1;
    }
    int ferry_first = g->batches++ % 2 == 0;
    for (int side = 0; side < 2; side++)
        if (((side == 0) == ferry_first ? ferry_reads(w, d, first, n, &ns[0])
                                        : raw_calls(w, &d[0], n, &ns[1])) != 0)
            return -1;
    if (gpu_worker_sync(w, "the consumer's stream after a batch") != 0)
        return -1;
    if (!(last->flags & F_WARMUP)) {
        w->me->stat[STAT_READ_NS] += ns[0];
        w->me->stat[STAT_RAW_NS] += ns[1];
        w->me->stat[STAT_DECODE_NS] += decode_ns;
        w->me->stat[STAT_CALLS] += n;
    }
    return first < n ? gpu_worker_check(w, g->dst, last->size, last->key, last->item, "cpu") : 0;
}

static int cpu_handle(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    if (g->nbatch == BATCH)
        return worker_fail(w, "cpu: a batch of more than %d descriptors", BATCH);
    g->batch[g->nbatch++] = *m;
    if (!(m->flags & F_BATCH_END))
        return 0;
    int rc = run_batch(w);
    g->nbatch = 0;
    return rc;
}

const gpu_mode_ops cpu_ops = {
    .needs = NEED_WORD | NEED_FLAGS,
    .defaults =
        {
            GPU_DEFAULTS,
            .pool_size = 64ll << 20,
            .sizes = {4096},
            .nsizes = 1,
            .max_inflight = 1024,
            .verify_every = 1,
            .iterations = 10000,
            .warmup = 100,
            .reclaim_interval_us = 1000,
        },
    .row = cpu_row,
    .text = cpu_text,
    .json_row = cpu_json_row,
    .init = cpu_init,
    .handle = cpu_handle,
};
