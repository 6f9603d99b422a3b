/* --mode cpu: ferry's own CPU cost per stream-ordered call, without the driver's.
 *
 * Thread CPU time (CLOCK_THREAD_CPUTIME_ID) over --iterations ferry_pool_publish_async calls
 * of small items, minus the same count of the driver calls a publish makes (cuMemcpyAsync into
 * a slice of the pool + cuStreamWriteValue32 of a word of the same kind: registered host
 * memory, or device memory with --control device), made on the same thread and stream. The
 * consumer does the same for ferry_consumer_read_async against cuStreamWaitValue32 +
 * cuMemcpyAsync + cuStreamWriteValue32, and times ferry_descriptor_decode on its own.
 *
 * Calls run in batches that the pool holds at once; between batches, outside the timing, the
 * streams drain, the consumer acknowledges and the producer reclaims. The two sides of a batch
 * alternate which goes first. */
#include <string.h>

#include "cli/bench_gpu.h"

typedef struct raw_target {
    CUdeviceptr dst;  /* a slice of the pool */
    CUdeviceptr word; /* where the ready word would be */
} raw_target;

static int stream_drained(gb_run *run)
{
    if (gb_stream_wait(run->cu, run->stream, run->region.params->timeout_ns,
                       "the producer's stream") != FERRY_OK)
        return gb_fail(run, "%s", ferry_last_error());
    return 0;
}

static uint32_t batch_size(gb_run *run, uint64_t size)
{
    ferry_pool_stats s;
    uint64_t per = (size + 255) & ~255ull, n = GB_CPU_BATCH;
    if (gb_pool_stats(run->pool, &s) != FERRY_OK)
        return 0;
    if ((uint64_t)run->opt->max_inflight < n)
        n = (uint64_t)run->opt->max_inflight;
    if (s.usable_bytes / per < n)
        n = s.usable_bytes / per;
    return (uint32_t)n;
}

static int raw_target_of(gb_run *run, uint64_t size, raw_target *r)
{
    ferry_tensor t = ferry_tensor_bytes(size);
    ferry_descriptor d;
    void *data = NULL;
    if (ferry_pool_reserve(run->pool, &t, run->region.params->timeout_ns, &data, &d) != FERRY_OK ||
        ferry_pool_cancel(run->pool, &d) != FERRY_OK)
        return gb_fail(run, "reserving a slice for the raw calls failed: %s", ferry_last_error());
    r->dst = (CUdeviceptr)(uintptr_t)data;
    r->word = run->placement == FERRY_CONTROL_DEVICE
                  ? run->word
                  : run->flags_dev + GB_WORD_RAW_P * sizeof(uint32_t);
    return 0;
}

/* Hands the batch's descriptors to the consumer, waits until it has run its side of the
 * batch (its stream drained: every lease acknowledged), and reclaims them all. */
static int hand_over(gb_run *run, const ferry_descriptor *d, uint32_t n, uint64_t size,
                     uint32_t flags)
{
    gb_msg m;
    for (uint32_t j = 0; j < n; j++) {
        memset(&m, 0, sizeof(m));
        m.type = GB_MSG_CPU;
        m.iter = j;
        m.size = size;
        m.flags = flags | (j + 1 == n ? GB_F_BATCH_END : 0);
        if (ferry_descriptor_encode(&d[j], m.desc) != FERRY_OK)
            return gb_fail(run, "encoding a descriptor failed: %s", ferry_last_error());
        if (gb_send(run, 1, &m) != 0)
            return -1;
    }
    if (gb_wait_progress(run, 1, m.seq) != 0)
        return -1;
    return gb_drain_pool(run);
}

static int ferry_batch(gb_run *run, uint64_t size, uint32_t n, uint32_t flags, uint64_t *ns)
{
    ferry_descriptor d[GB_CPU_BATCH];
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *src = (const void *)(uintptr_t)run->src[0];
    uint64_t timeout = run->region.params->timeout_ns;
    uint64_t t0 = gb_thread_cpu_ns();
    for (uint32_t j = 0; j < n; j++)
        if (ferry_pool_publish_async(run->pool, &t, src, run->stream, timeout, &d[j]) != FERRY_OK)
            return gb_fail(run, "cpu: ferry_pool_publish_async failed: %s", ferry_last_error());
    *ns += gb_thread_cpu_ns() - t0;
    if (stream_drained(run) != 0)
        return -1;
    return hand_over(run, d, n, size, flags);
}

static int raw_batch(gb_run *run, const raw_target *r, uint64_t size, uint32_t n, uint64_t *ns)
{
    const ferry__cuda *cu = run->cu;
    CUresult rc = CUDA_SUCCESS;
    const char *call = "cuMemcpyAsync";
    uint64_t t0 = gb_thread_cpu_ns();
    for (uint32_t j = 0; j < n && rc == CUDA_SUCCESS; j++) {
        rc = cu->cuMemcpyAsync(r->dst, run->src[0], size, run->stream);
        if (rc == CUDA_SUCCESS) {
            call = "cuStreamWriteValue32";
            rc = cu->cuStreamWriteValue32(run->stream, r->word, j + 1, 0);
        }
    }
    *ns += gb_thread_cpu_ns() - t0;
    if (rc != CUDA_SUCCESS) {
        ferry__cuda_fail(cu, call, rc);
        return gb_fail(run, "cpu: raw calls: %s", ferry_last_error());
    }
    return stream_drained(run);
}

static int batches(gb_run *run, const raw_target *r, uint64_t size, uint32_t per, uint64_t ns[2])
{
    uint64_t total = (uint64_t)run->opt->iterations, scratch[2] = {0, 0};
    if (ferry_batch(run, size, per, GB_F_WARMUP, &scratch[0]) != 0 ||
        raw_batch(run, r, size, per, &scratch[1]) != 0)
        return -1;
    for (uint64_t done = 0, b = 0; done < total; b++) {
        uint32_t n = total - done < per ? (uint32_t)(total - done) : per;
        for (int side = 0; side < 2; side++) {
            int ferry_side = (side == 0) == (b % 2 == 0);
            int rc = ferry_side ? ferry_batch(run, size, n, 0, &ns[0])
                                : raw_batch(run, r, size, n, &ns[1]);
            if (rc != 0 || gb_check_workers_often(run) != 0)
                return -1;
        }
        done += n;
    }
    return 0;
}

/* What one cuCtxSetCurrent of the current context costs: ferry makes the pool's (or the
 * consumer's) device current in every call, and that is counted as ferry's time. */
static int context_cost(gb_run *run, gb_row *row)
{
    const ferry__cuda *cu = run->cu;
    CUcontext ctx = NULL;
    CUresult rc = cu->cuCtxGetCurrent(&ctx);
    uint64_t n = (uint64_t)run->opt->iterations, t0 = gb_thread_cpu_ns();
    for (uint64_t i = 0; i < n && rc == CUDA_SUCCESS; i++)
        rc = cu->cuCtxSetCurrent(ctx);
    row->context_ns = (double)(gb_thread_cpu_ns() - t0) / (double)n;
    if (rc == CUDA_SUCCESS)
        return 0;
    ferry__cuda_fail(cu, "cuCtxSetCurrent", rc);
    return gb_fail(run, "cpu: %s", ferry_last_error());
}

int gb_cpu_row(gb_run *run, gb_row *row)
{
    raw_target r;
    uint64_t ns[2] = {0, 0};
    uint32_t per = batch_size(run, row->size);
    if (per == 0)
        return gb_fail(run, "cpu: the pool holds no %llu-byte item (--pool-size, --max-inflight)",
                       (unsigned long long)row->size);
    if (raw_target_of(run, row->size, &r) != 0 || gb_phase_begin(run, 1) != 0 ||
        batches(run, &r, row->size, per, ns) != 0 || gb_phase_end(run, 1) != 0 ||
        context_cost(run, row) != 0)
        return -1;
    double calls = (double)run->opt->iterations;
    const gb_rank *c = &run->region.ranks[0];
    row->publish_ns = (double)ns[0] / calls;
    row->publish_raw_ns = (double)ns[1] / calls;
    if (c->calls) {
        row->read_ns = (double)c->read_ns / (double)c->calls;
        row->read_raw_ns = (double)c->raw_ns / (double)c->calls;
        row->decode_ns = (double)c->decode_ns / (double)c->calls;
    }
    return 0;
}
