/* A GPU bench consumer's stream and cpu modes.
 *
 * stream: each item is read with ferry_consumer_read_async into the consumer's buffer; for an
 * item to verify, the spans gb_sample_spans names are then copied, on the same stream, into
 * a device sample ring. Nothing waits per item: the stream orders the next read after those
 * copies. When the ring is full, and at the end of the phase, the stream is drained, the ring
 * comes to the host in one copy and every pending item is checked.
 *
 * cpu: the descriptors of a batch are collected, then decoded, read (ferry) and the raw driver
 * calls made, each side timed as one block of thread CPU time; the stream drains (every lease
 * acknowledged) and the last item read is checked. */
#include <stdlib.h>
#include <string.h>

#include "cli/bench_gpu.h"

#define RING_MAX (64ull << 20) /* device (and host) bytes of the sample ring */

int gw_stream_init(gb_ws *w)
{
    uint64_t per = w->p.sample_bytes ? w->p.sample_bytes : 1;
    uint64_t want = per * (w->p.items ? w->p.items : 1);
    w->ring_bytes = want < RING_MAX ? want : RING_MAX;
    if (w->ring_bytes < per)
        w->ring_bytes = per;
    w->max_pending = (uint32_t)(w->ring_bytes / per);
    w->host_bytes = w->ring_bytes;
    w->host = malloc(w->host_bytes);
    w->pending = calloc(w->max_pending, sizeof(*w->pending));
    if (!w->host || !w->pending)
        return gw_fail(w, "out of memory for the sample ring");
    CUresult rc = w->cu->cuMemAlloc(&w->ring, w->ring_bytes);
    if (rc != CUDA_SUCCESS) {
        w->ring = 0;
        ferry__cuda_fail(w->cu, "cuMemAlloc", rc);
        return gw_fail(w, "the sample ring: %s", ferry_last_error());
    }
    return 0;
}

static void check_pending(gb_ws *w, const gb_pending *e)
{
    gb_span spans[GB_MAX_SPANS];
    uint32_t n = gb_sample_spans(w->p.seed, e->iter, e->size, spans);
    const uint8_t *at = w->host + e->at;
    uint8_t got, want;
    for (uint32_t i = 0; i < n; at += spans[i].len, i++) {
        int64_t off =
            gb_pattern_check(at, spans[i].off, spans[i].len, w->p.seed, e->key, &got, &want);
        if (off >= 0) {
            gw_error(w,
                     "stream item %llu (%llu bytes, pattern %llu): byte %lld is 0x%02x, "
                     "expected 0x%02x",
                     (unsigned long long)e->iter, (unsigned long long)e->size,
                     (unsigned long long)e->key, (long long)off, got, want);
            return;
        }
    }
    __atomic_add_fetch(&w->me->verified, 1, __ATOMIC_RELEASE);
}

int gw_flush(gb_ws *w)
{
    if (!w->npending)
        return 0;
    if (gw_sync(w, "the consumer's stream before checking samples") != 0)
        return -1;
    CUresult rc = w->cu->cuMemcpy((CUdeviceptr)(uintptr_t)w->host, w->ring, w->ring_used);
    if (rc != CUDA_SUCCESS) {
        ferry__cuda_fail(w->cu, "cuMemcpy", rc);
        return gw_fail(w, "copying the sample ring: %s", ferry_last_error());
    }
    for (uint32_t i = 0; i < w->npending; i++)
        check_pending(w, &w->pending[i]);
    w->npending = 0;
    w->ring_used = 0;
    return 0;
}

/* Enqueues the copies of m's sampled spans into the ring (after the read, on its stream). */
static int keep_samples(gb_ws *w, const gb_msg *m)
{
    gb_span spans[GB_MAX_SPANS];
    uint32_t n = gb_sample_spans(w->p.seed, m->iter, m->size, spans);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        bytes += spans[i].len;
    if (bytes > w->ring_bytes)
        return gw_fail(w, "stream item %llu: %llu sampled bytes exceed the ring's %llu",
                       (unsigned long long)m->iter, (unsigned long long)bytes,
                       (unsigned long long)w->ring_bytes);
    if ((w->ring_used + bytes > w->ring_bytes || w->npending == w->max_pending) && gw_flush(w) != 0)
        return -1;
    w->pending[w->npending++] = (gb_pending){m->iter, m->key, m->size, w->ring_used};
    for (uint32_t i = 0; i < n; i++) {
        CUresult rc = w->cu->cuMemcpyAsync(w->ring + w->ring_used, w->dst + spans[i].off,
                                           spans[i].len, w->stream);
        if (rc != CUDA_SUCCESS) {
            ferry__cuda_fail(w->cu, "cuMemcpyAsync", rc);
            return gw_fail(w, "sampling stream item %llu: %s", (unsigned long long)m->iter,
                           ferry_last_error());
        }
        w->ring_used += spans[i].len;
    }
    return 0;
}

int gw_on_stream(gb_ws *w, const gb_msg *m)
{
    ferry_descriptor d;
    if (gw_decode(w, m, &d) != 0)
        return -1;
    if (ferry_consumer_read_async(w->consumer, &d, (void *)(uintptr_t)w->dst, w->p.max_item,
                                  w->stream) != FERRY_OK)
        return gw_fail(w, "stream item %llu: ferry_consumer_read_async: %s",
                       (unsigned long long)m->iter, ferry_last_error());
    return m->flags & GB_F_VERIFY ? keep_samples(w, m) : 0;
}

/* ---- cpu ------------------------------------------------------------------------------------- */

/* The words the raw calls wait on (always satisfied: 0 >= 0) and write, of the kind the
 * pool's control words are. */
static void raw_words(const gb_ws *w, const ferry_descriptor *d, CUdeviceptr *wait,
                      CUdeviceptr *write)
{
    if (d->flags & FERRY_DESC_FLAG_DEVICE_CONTROL) {
        *wait = w->word;
        *write = w->word + 64;
    } else {
        *wait = w->flags_dev + GB_WORD_RAW_WAIT * sizeof(uint32_t);
        *write = w->flags_dev + GB_WORD_RAW_C * sizeof(uint32_t);
    }
}

static int ferry_reads(gb_ws *w, const ferry_descriptor *d, uint32_t first, uint32_t n,
                       uint64_t *ns)
{
    uint64_t t0 = gb_thread_cpu_ns();
    for (uint32_t j = first; j < n; j++)
        if (ferry_consumer_read_async(w->consumer, &d[j], (void *)(uintptr_t)w->dst, w->p.max_item,
                                      w->stream) != FERRY_OK)
            return gw_fail(w, "cpu: ferry_consumer_read_async: %s", ferry_last_error());
    *ns = gb_thread_cpu_ns() - t0;
    return 0;
}

static int raw_calls(gb_ws *w, const ferry_descriptor *d, uint32_t n, uint64_t *ns)
{
    const ferry__cuda *cu = w->cu;
    CUdeviceptr wait, write;
    CUresult rc = CUDA_SUCCESS;
    raw_words(w, d, &wait, &write);
    uint64_t t0 = gb_thread_cpu_ns();
    for (uint32_t j = 0; j < n && rc == CUDA_SUCCESS; j++) {
        rc = cu->cuStreamWaitValue32(w->stream, wait, 0, CU_STREAM_WAIT_VALUE_GEQ);
        if (rc == CUDA_SUCCESS)
            rc = cu->cuMemcpyAsync(w->raw_dst, w->raw_src, d->length, w->stream);
        if (rc == CUDA_SUCCESS)
            rc = cu->cuStreamWriteValue32(w->stream, write, 0, 0);
    }
    *ns = gb_thread_cpu_ns() - t0;
    if (rc == CUDA_SUCCESS)
        return 0;
    ferry__cuda_fail(cu, "a raw stream call", rc);
    return gw_fail(w, "cpu: %s", ferry_last_error());
}

/* The pool's address as this consumer maps it, from the first descriptor it sees (a view of
 * that lease, acknowledged at once). Returns how many descriptors that used. */
static int raw_source(gb_ws *w, const ferry_descriptor *d, uint32_t *used)
{
    const void *data = NULL;
    *used = 0;
    if (w->raw_src)
        return 0;
    if (ferry_consumer_view_async(w->consumer, d, w->stream, &data) != FERRY_OK ||
        ferry_consumer_ack_async(w->consumer, d, w->stream) != FERRY_OK)
        return gw_fail(w, "cpu: viewing the first lease: %s", ferry_last_error());
    w->raw_src = (CUdeviceptr)(uintptr_t)data;
    *used = 1;
    return 0;
}

static int decode_batch(gb_ws *w, ferry_descriptor *d, uint64_t *ns)
{
    uint64_t t0 = gb_thread_cpu_ns();
    for (uint32_t j = 0; j < w->nbatch; j++)
        if (ferry_descriptor_decode(w->batch[j].desc, FERRY_DESCRIPTOR_SIZE, &d[j]) != FERRY_OK)
            return gw_fail(w, "cpu: ferry_descriptor_decode: %s", ferry_last_error());
    *ns = gb_thread_cpu_ns() - t0;
    for (uint32_t j = 0; j < w->nbatch; j++)
        if (gw_decode(w, &w->batch[j], &d[j]) != 0)
            return -1;
    return 0;
}

static int run_batch(gb_ws *w)
{
    ferry_descriptor d[GB_CPU_BATCH];
    uint64_t decode_ns = 0, ns[2] = {0, 0};
    uint32_t n = w->nbatch, first;
    const gb_msg *last = &w->batch[n - 1];
    if (decode_batch(w, d, &decode_ns) != 0 || raw_source(w, &d[0], &first) != 0)
        return -1;
    int ferry_first = w->batches++ % 2 == 0;
    for (int side = 0; side < 2; side++) {
        int rc = (side == 0) == ferry_first ? ferry_reads(w, d, first, n, &ns[0])
                                            : raw_calls(w, &d[0], n, &ns[1]);
        if (rc != 0)
            return -1;
    }
    if (gw_sync(w, "the consumer's stream after a batch") != 0)
        return -1;
    if (!(last->flags & GB_F_WARMUP)) {
        w->me->read_ns += ns[0];
        w->me->raw_ns += ns[1];
        w->me->decode_ns += decode_ns;
        w->me->calls += n;
    }
    return first < n ? gw_check_item(w, w->dst, last->size, last->key, last->iter, "cpu") : 0;
}

int gw_on_cpu(gb_ws *w, const gb_msg *m)
{
    if (w->nbatch == GB_CPU_BATCH)
        return gw_fail(w, "cpu: a batch of more than %d descriptors", GB_CPU_BATCH);
    w->batch[w->nbatch++] = *m;
    if (!(m->flags & GB_F_BATCH_END))
        return 0;
    int rc = run_batch(w);
    w->nbatch = 0;
    return rc;
}
