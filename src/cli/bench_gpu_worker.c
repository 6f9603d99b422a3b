/* A consumer process of `ferry bench --backend cuda_ipc` (the hidden `ferry bench-gpu-worker`
 * command): maps the results region, makes its device current, allocates its buffers, opens
 * the round-trip floor's buffer once (rtt; in stream, a rank that times a peer floor opens it
 * then), then serves the producer's messages until DONE. It
 * exits 1 on any failure (noted in the region) or verification error, and dies with the
 * producer (PR_SET_PDEATHSIG): it never outlives it waiting. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/bench_gpu.h"

#define DEVICE_WORDS 256 /* bytes of w->word */

static void note(gb_ws *w, const char *fmt, va_list ap)
{
    char text[GB_MESSAGE_MAX];
    vsnprintf(text, sizeof(text), fmt, ap);
    if (!w->me) {
        fprintf(stderr, "ferry bench-gpu-worker rank %u: %s\n", w->rank, text);
        return;
    }
    if (!w->me->message[0])
        memcpy(w->me->message, text, sizeof(text));
}

int gw_fail(gb_ws *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(w, fmt, ap);
    va_end(ap);
    if (w->me)
        __atomic_store_n(&w->me->state, GB_FAILED, __ATOMIC_RELEASE);
    return -1;
}

void gw_error(gb_ws *w, const char *fmt, ...)
{
    va_list ap;
    __atomic_add_fetch(&w->me->errors, 1, __ATOMIC_RELEASE);
    va_start(ap, fmt);
    note(w, fmt, ap);
    va_end(ap);
}

static int cu_check(gb_ws *w, CUresult rc, const char *call)
{
    if (rc == CUDA_SUCCESS)
        return 0;
    ferry__cuda_fail(w->cu, call, rc);
    return gw_fail(w, "%s", ferry_last_error());
}

int gw_sync(gb_ws *w, const char *what)
{
    if (gb_stream_wait(w->cu, w->stream, w->p.timeout_ns, what) != FERRY_OK)
        return gw_fail(w, "%s", ferry_last_error());
    return 0;
}

int gw_decode(gb_ws *w, const gb_msg *m, ferry_descriptor *d)
{
    if (ferry_descriptor_decode(m->desc, FERRY_DESCRIPTOR_SIZE, d) != FERRY_OK)
        return gw_fail(w, "item %llu: ferry_descriptor_decode: %s", (unsigned long long)m->iter,
                       ferry_last_error());
    if (d->length != m->size || m->size > w->p.max_item || m->key >= GB_KEYS)
        return gw_fail(w,
                       "item %llu: descriptor of %llu bytes, message of %llu bytes with key "
                       "%llu (buffers hold %llu bytes, %d keys)",
                       (unsigned long long)m->iter, (unsigned long long)d->length,
                       (unsigned long long)m->size, (unsigned long long)m->key,
                       (unsigned long long)w->p.max_item, GB_KEYS);
    return 0;
}

int gw_check_item(gb_ws *w, CUdeviceptr dev, uint64_t n, uint64_t key, uint64_t iter,
                  const char *what)
{
    uint8_t got, want;
    if (gw_sync(w, "the consumer's stream") != 0 ||
        cu_check(w, w->cu->cuMemcpy((CUdeviceptr)(uintptr_t)w->host, dev, n), "cuMemcpy") != 0)
        return -1;
    int64_t off = gb_pattern_check(w->host, 0, n, w->p.seed, key, &got, &want);
    if (off < 0)
        __atomic_add_fetch(&w->me->verified, 1, __ATOMIC_RELEASE);
    else
        gw_error(w, "%s item %llu (%llu bytes, pattern %llu): byte %lld is 0x%02x, expected 0x%02x",
                 what, (unsigned long long)iter, (unsigned long long)n, (unsigned long long)key,
                 (long long)off, got, want);
    return 0;
}

/* ---- messages ---------------------------------------------------------------------------------
 */

static int on_begin(gb_ws *w)
{
    if (w->consumer)
        return gw_fail(w, "BEGIN inside a phase");
    w->me->read_ns = w->me->raw_ns = w->me->decode_ns = w->me->calls = 0;
    w->batches = 0;
    w->nbatch = 0;
    w->raw_src = 0;
    if (ferry_consumer_create_on(w->rank, w->device, &w->consumer) != FERRY_OK)
        return gw_fail(w, "ferry_consumer_create_on(%u, %d): %s", w->rank, w->device,
                       ferry_last_error());
    return 0;
}

static int on_end(gb_ws *w)
{
    if (gw_sync(w, "the consumer's stream at the end of a phase") != 0 || gw_flush(w) != 0)
        return -1;
    ferry_consumer_destroy(w->consumer);
    w->consumer = NULL;
    return 0;
}

static int on_ferry(gb_ws *w, const gb_msg *m)
{
    ferry_descriptor d;
    if (!w->consumer)
        return gw_fail(w, "a descriptor outside a phase");
    if (gw_decode(w, m, &d) != 0)
        return -1;
    if (ferry_consumer_read_async(w->consumer, &d, (void *)(uintptr_t)w->dst, w->p.max_item,
                                  w->stream) != FERRY_OK)
        return gw_fail(w, "rtt item %llu: ferry_consumer_read_async: %s",
                       (unsigned long long)m->iter, ferry_last_error());
    if (m->flags & GB_F_VERIFY)
        return gw_check_item(w, w->dst, m->size, m->key, m->iter, "rtt");
    return 0;
}

static int on_floor(gb_ws *w, const gb_msg *m)
{
    const ferry__cuda *cu = w->cu;
    uint32_t value = (uint32_t)m->seq;
    CUdeviceptr ready = w->flags_dev + GB_WORD_READY * sizeof(uint32_t);
    CUdeviceptr ack = w->flags_dev + GB_WORD_ACK(w->rank) * sizeof(uint32_t);
    if (!w->peer || m->size > w->p.max_item || m->key >= GB_KEYS)
        return gw_fail(w, "a floor message the run did not prepare for");
    if (cu_check(w, cu->cuStreamWaitValue32(w->stream, ready, value, CU_STREAM_WAIT_VALUE_GEQ),
                 "cuStreamWaitValue32") != 0 ||
        cu_check(w, cu->cuMemcpyAsync(w->dst, w->peer, m->size, w->stream), "cuMemcpyAsync") != 0 ||
        cu_check(w, cu->cuStreamWriteValue32(w->stream, ack, value, 0), "cuStreamWriteValue32") !=
            0)
        return -1;
    if (m->flags & GB_F_VERIFY)
        return gw_check_item(w, w->dst, m->size, m->key, m->iter, "rtt floor");
    return 0;
}

static int handle(gb_ws *w, const gb_msg *m)
{
    switch (m->type) {
    case GB_MSG_BEGIN:
        return on_begin(w);
    case GB_MSG_END:
        return on_end(w);
    case GB_MSG_FERRY:
        return on_ferry(w, m);
    case GB_MSG_FLOOR:
        return on_floor(w, m);
    case GB_MSG_STREAM:
        return w->consumer ? gw_on_stream(w, m) : gw_fail(w, "a descriptor outside a phase");
    case GB_MSG_CPU:
        return w->consumer ? gw_on_cpu(w, m) : gw_fail(w, "a descriptor outside a phase");
    case GB_MSG_PEER:
        return gw_on_peer(w, m);
    }
    return gw_fail(w, "unknown message type %u", m->type);
}

static int receive(gb_ws *w, gb_msg *m)
{
    char why[160];
    return cli_recv_record(w->sock, m, sizeof(*m), why, sizeof(why)) ? gw_fail(w, "%s", why) : 0;
}

static int serve(gb_ws *w)
{
    gb_msg m;
    for (;;) {
        if (receive(w, &m) != 0)
            return CLI_EXIT_FAIL;
        if (m.type == GB_MSG_DONE) {
            __atomic_store_n(&w->me->state, GB_DONE, __ATOMIC_RELEASE);
            return w->me->errors ? CLI_EXIT_FAIL : CLI_EXIT_OK;
        }
        if (handle(w, &m) != 0)
            return CLI_EXIT_FAIL;
        __atomic_store_n(&w->me->progress, m.seq, __ATOMIC_RELEASE);
    }
}

/* ---- setting up ------------------------------------------------------------------------------ */

static int parse_args(int argc, char **argv, int64_t v[3])
{
    static const char *const names[] = {"--rank", "--fd", "--results-fd"};
    if (argc != 7)
        return -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(argv[1 + 2 * i], names[i]) != 0 ||
            cli_parse_int("bench-gpu-worker", names[i], argv[2 + 2 * i], &v[i]) != 0)
            return -1;
    return v[0] >= 0 && v[0] < GB_MAX_RANKS ? 0 : -1;
}

int gw_open_floor(gb_ws *w)
{
    CUipcMemHandle h;
    memcpy(&h, w->p.floor_handle, sizeof(h));
    return cu_check(w, w->cu->cuIpcOpenMemHandle(&w->peer, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                    "cuIpcOpenMemHandle");
}

static int device_buffers(gb_ws *w)
{
    const ferry__cuda *cu = w->cu;
    if (cu_check(w, cu->cuStreamCreate(&w->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
        cu_check(w, cu->cuMemAlloc(&w->dst, w->p.max_item), "cuMemAlloc"))
        return -1;
    if (w->p.mode == GB_MODE_STREAM)
        return gw_stream_init(w);
    if (gb_register_flags(cu, &w->region, &w->flags_dev) != FERRY_OK) {
        w->flags_dev = 0;
        return gw_fail(w, "registering the flag pages: %s", ferry_last_error());
    }
    if (w->p.mode == GB_MODE_RTT)
        return w->p.has_floor ? gw_open_floor(w) : 0;
    if (cu_check(w, cu->cuMemAlloc(&w->raw_dst, w->p.max_item), "cuMemAlloc") ||
        cu_check(w, cu->cuMemAlloc(&w->word, DEVICE_WORDS), "cuMemAlloc") ||
        cu_check(w, cu->cuMemsetD32(w->word, 0, DEVICE_WORDS / 4), "cuMemsetD32"))
        return -1;
    w->batch = calloc(GB_CPU_BATCH, sizeof(*w->batch));
    return w->batch ? 0 : gw_fail(w, "out of memory for a batch");
}

static int worker_init(gb_ws *w, int64_t fds[2])
{
    w->sock = (int)fds[0];
    if (gb_region_map((int)fds[1], &w->region) != 0)
        return gw_fail(w, "mapping the results region failed: %s", strerror(errno));
    w->p = *w->region.params;
    if (w->rank >= w->p.consumers)
        return gw_fail(w, "rank %u is outside the run's %u consumers", w->rank, w->p.consumers);
    w->me = &w->region.ranks[w->rank];
    if (getppid() != (pid_t)w->p.producer_pid) /* it died before PR_SET_PDEATHSIG took */
        return gw_fail(w, "the producer (pid %d) is gone", (int)w->p.producer_pid);
    w->device = w->p.devices[w->rank];
    if (ferry__cuda_get(&w->cu) != FERRY_OK || ferry__cuda_use_device(w->cu, w->device) != FERRY_OK)
        return gw_fail(w, "device %d: %s", w->device, ferry_last_error());
    w->host_bytes = w->p.mode == GB_MODE_STREAM ? 0 : w->p.max_item;
    if (w->host_bytes && !(w->host = malloc(w->host_bytes)))
        return gw_fail(w, "out of memory for the host staging buffer");
    return device_buffers(w);
}

/* After a clean run only: a failed one may leave a stream waiting on a word nobody writes,
 * and freeing what it uses could block; the exit releases everything anyway. */
static void release(gb_ws *w)
{
    const ferry__cuda *cu = w->cu;
    ferry_consumer_destroy(w->consumer);
    if (w->peer)
        cu->cuIpcCloseMemHandle(w->peer);
    if (w->flags_dev)
        cu->cuMemHostUnregister(w->region.flags);
    CUdeviceptr *bufs[] = {&w->dst, &w->raw_dst, &w->word, &w->ring};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        gb_free(cu, bufs[i]);
    if (w->stream)
        cu->cuStreamDestroy(w->stream);
}

int cmd_bench_gpu_worker(int argc, char **argv)
{
    gb_ws w;
    int64_t v[3];
    memset(&w, 0, sizeof(w));
    w.region.fd = -1;
    if (parse_args(argc, argv, v) != 0) {
        fprintf(stderr, "ferry bench-gpu-worker: internal command of 'ferry bench'\n");
        return CLI_EXIT_USAGE;
    }
    w.rank = (uint32_t)v[0];
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    int rc = CLI_EXIT_FAIL;
    if (worker_init(&w, &v[1]) == 0) {
        __atomic_store_n(&w.me->state, GB_READY, __ATOMIC_RELEASE);
        rc = serve(&w);
    }
    if (rc == CLI_EXIT_OK || (w.me && w.me->state == GB_DONE))
        release(&w);
    free(w.host);
    free(w.pending);
    free(w.batch);
    return rc;
}
