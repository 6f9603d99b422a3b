/* What the GPU modes of `ferry bench` share: the CUDA driver, the payload patterns, the
 * producer's device buffers and its rows, a consumer's device setup, the report's frame. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define GOLDEN      0x9e3779b97f4a7c15ull
#define FILL_STAGE  (16ull << 20) /* host staging for filling device buffers */
#define QUERY_SPIN  64            /* cuStreamQuery polls before the first short sleep */
#define WORD_BYTES  256           /* the raw calls' device words */
#define CHECK_CHUNK 4096          /* bytes of the pattern made at a time for a check */

const cu_api *cu;

static cu_api api;
static char load_error[512];

static const struct {
    const char *name;
    int version;
    size_t offset;
} entries[] = {
#define CU_ENTRY_(name, version, params) {#name, version, offsetof(cu_api, name)},
    CU_FUNCTIONS(CU_ENTRY_)
#undef CU_ENTRY_
};

/* The entry points of the driver the library loaded (and initialised). */
static int load(void)
{
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        void *fn = NULL;
        if (ferry_gpu_driver_symbol(entries[i].name, entries[i].version, &fn) != FERRY_OK)
            return snprintf(load_error, sizeof(load_error), "%s", ferry_last_error()), -1;
        memcpy((char *)&api + entries[i].offset, &fn, sizeof(fn));
    }
    if (api.cuDeviceGetCount(&api.device_count) != CUDA_SUCCESS)
        return snprintf(load_error, sizeof(load_error), "the CUDA driver failed to initialise"), -1;
    return 0;
}

/* Loads the driver the first time: NULL, or why it could not be loaded. */
const char *gpu_driver_load(void)
{
    static int state; /* 0: not tried, 1: loaded, -1: failed */
    if (!state)
        state = load() == 0 ? 1 : -1;
    cu = state > 0 ? &api : NULL;
    return cu ? NULL : load_error;
}

const char *cu_error(const char *call, CUresult rc)
{
    static __thread char text[256];
    const char *name = NULL, *what = NULL;
    if (api.cuGetErrorName(rc, &name) != CUDA_SUCCESS || !name)
        name = "unknown CUresult";
    if (api.cuGetErrorString(rc, &what) != CUDA_SUCCESS || !what)
        what = "no description";
    snprintf(text, sizeof(text), "%s failed: %s (%s, %d)", call, name, what, rc);
    return text;
}

CUresult gpu_use_device(int device)
{
    static CUcontext primary[BENCH_MAX_RANKS];
    CUdevice dev;
    CUresult rc = CUDA_SUCCESS;
    if (device < 0 || device >= BENCH_MAX_RANKS)
        return 101; /* CUDA_ERROR_INVALID_DEVICE */
    if (!primary[device] && (rc = cu->cuDeviceGet(&dev, device)) == CUDA_SUCCESS)
        rc = cu->cuDevicePrimaryCtxRetain(&primary[device], dev);
    return rc == CUDA_SUCCESS ? cu->cuCtxSetCurrent(primary[device]) : rc;
}

/* Polls until the stream has run everything: NULL, or why not (in a thread-local buffer). */
static const char *cu_stream_wait(CUstream s, uint64_t timeout_ns, const char *what)
{
    static __thread char why[256];
    uint64_t start = ferry_now_ns();
    for (unsigned spins = 0;; spins++) {
        CUresult rc = cu->cuStreamQuery(s);
        if (rc == CUDA_SUCCESS)
            return NULL;
        if (rc != CUDA_ERROR_NOT_READY)
            return cu_error("cuStreamQuery", rc);
        if (ferry_now_ns() - start >= timeout_ns) {
            snprintf(why, sizeof(why), "%s did not finish within %llu ms", what,
                     (unsigned long long)(timeout_ns / 1000000));
            return why;
        }
        if (spins < QUERY_SPIN)
            sched_yield();
        else
            cli_sleep_ns(20000);
    }
}

static CUresult cu_register_flags(bench_region *r, CUdeviceptr *dev)
{
    CUresult rc = cu->cuMemHostRegister(r->flags, BENCH_FLAG_BYTES,
                                        CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (rc == CUDA_SUCCESS &&
        (rc = cu->cuMemHostGetDevicePointer(dev, r->flags, 0)) != CUDA_SUCCESS)
        cu->cuMemHostUnregister(r->flags);
    if (rc != CUDA_SUCCESS)
        *dev = 0;
    return rc;
}

/* -1 when buf matches bytes [off, off + len) of pattern key, else the first offset that
 * differs. */
static int64_t pattern_check(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed,
                             uint64_t key, uint8_t *got, uint8_t *want)
{
    uint8_t expect[CHECK_CHUNK];
    for (uint64_t i = 0; i < len; i += CHECK_CHUNK) {
        uint64_t n = len - i < CHECK_CHUNK ? len - i : CHECK_CHUNK, k = 0;
        cli_pattern_fill(expect, off + i, n, seed, key);
        if (memcmp(buf + i, expect, n) == 0)
            continue;
        while (buf[i + k] == expect[k])
            k++;
        *got = buf[i + k];
        *want = expect[k];
        return (int64_t)(off + i + k);
    }
    return -1;
}

/* The key after the last one for item `item`: seeded, never equal to the last. */
static uint64_t take_key(bench_run *run, uint64_t item)
{
    gpu_run *g = GPU(run);
    uint64_t step = 1 + cli_mix64(run->opt->seed ^ (item * GOLDEN) ^ 0x6b6579ull) % (GPU_KEYS - 1);
    g->key = (g->key + step) % GPU_KEYS;
    return g->key;
}

/* --consumer-devices with several GPUs implies one consumer each; --consumer-device D (default
 * 0) is the shorthand of --consumer-devices D. */
static void gpu_adjust(bench_opts *o)
{
    bench_default(&o->consumers, o->ndevices > 1 ? o->ndevices : 1);
    if (o->ndevices == 0)
        o->devices[o->ndevices++] = o->consumer_device;
    if (o->ndevices == 1)
        for (int64_t r = 1; r < o->consumers && r < BENCH_MAX_RANKS; r++)
            o->devices[r] = o->devices[0];
}

static int check_range(const char *name, int64_t v, int64_t lo, int64_t hi)
{
    if (v >= lo && v <= hi)
        return 0;
    fprintf(stderr, "ferry bench: %s must be between %lld and %lld\n", name, (long long)lo,
            (long long)hi);
    return -1;
}

static int gpu_check(const bench_opts *o)
{
    if (o->mode_name && strcmp(o->mode_name, "cpu") == 0 && o->consumers != 1) {
        fprintf(stderr, "ferry bench: --mode cpu runs one consumer (--consumers 1)\n");
        return -1;
    }
    if (check_range("--iterations", o->iterations, 1, 100000000) ||
        check_range("--warmup", o->warmup, 0, 100000000) ||
        check_range("--rounds", o->rounds, 1,
                    strcmp(o->mode_name ? o->mode_name : "rtt", "rtt") ? INT64_MAX
                                                                       : o->iterations) ||
        check_range("--items", o->items, 1, 100000000) ||
        check_range("--verify-every", o->verify_every, 1, INT64_MAX) ||
        check_range("--floor-copies", o->floor_copies, 0, 1000000) ||
        check_range("--timeout-ms", o->timeout_ms, 1, 86400000) ||
        check_range("--producer-device", o->producer_device, 0, BENCH_MAX_RANKS - 1) ||
        check_range("--consumer-device", o->consumer_device, 0, BENCH_MAX_RANKS - 1))
        return -1;
    if (o->ndevices != 1 && o->ndevices != (uint32_t)o->consumers) {
        fprintf(stderr, "ferry bench: --consumer-devices lists %u devices for %lld consumers\n",
                o->ndevices, (long long)o->consumers);
        return -1;
    }
    for (int64_t r = 0; r < o->consumers; r++)
        if (check_range("a consumer device", o->devices[r], 0, BENCH_MAX_RANKS - 1))
            return -1;
    return 0;
}

static const gpu_mode_ops *ops_of(const bench_run *run)
{
    return run->mode->family_ops;
}

int gpu_cu(bench_run *run, const char *what, const char *call, CUresult rc)
{
    return rc == CUDA_SUCCESS ? 0 : run_fail(run, "%s: %s", what, cu_error(call, rc));
}

int gpu_stream_drained(bench_run *run, const char *what)
{
    const char *why = cu_stream_wait(GPU(run)->stream, run->params.timeout_ns, what);
    return why ? run_fail(run, "%s", why) : 0;
}

const char *gpu_placement(int placement)
{
    return placement == FERRY_CONTROL_DEVICE ? "device" : "host";
}

int gpu_has_remote(const bench_opts *o)
{
    for (int64_t r = 0; r < o->consumers; r++)
        if (o->devices[r] != o->producer_device)
            return 1;
    return 0;
}

static uint64_t max_size(const bench_opts *o)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < o->nsizes; i++)
        m = o->sizes[i] > m ? o->sizes[i] : m;
    return m;
}

static ferry_pool_config pool_config(const bench_opts *o, int placement)
{
    ferry_pool_config c = run_pool_config(o);
    c.device = (int32_t)o->producer_device;
    c.control_placement = placement;
    return c;
}

static int create_pool(bench_run *run, int placement)
{
    gpu_run *g = GPU(run);
    ferry_pool_config c = pool_config(run->opt, placement);
    if (ferry_pool_create(&c, &g->pool) != FERRY_OK)
        return run_fail(run, "%s", ferry_last_error());
    g->placement = placement;
    return run_check_fits(run, g->pool, max_size(run->opt));
}

/* The library loads its driver with the first pool; the tool's own comes after. */
static int load_driver(bench_run *run)
{
    const bench_opts *o = run->opt;
    const char *why = gpu_driver_load();
    if (why)
        return run_fail(run, "%s", why);
    for (int64_t r = 0; r < o->consumers; r++)
        if (o->devices[r] >= cu->device_count)
            return run_fail(run, "consumer device %lld does not exist (%d devices)",
                            (long long)o->devices[r], cu->device_count);
    if (gpu_cu(run, "making the producer's device current", "cuCtxSetCurrent",
               gpu_use_device((int)o->producer_device)) ||
        RUN_CU(run, "the producer's stream", cuStreamCreate, &GPU(run)->stream,
               CU_STREAM_NON_BLOCKING))
        return -1;
    return 0;
}

/* Fills a device buffer with pattern key, through a host staging buffer. */
CUresult gpu_fill_device(CUdeviceptr dst, uint64_t bytes, uint64_t seed, uint64_t key)
{
    uint64_t stage = bytes < FILL_STAGE ? bytes : FILL_STAGE;
    uint8_t *buf = malloc(stage ? stage : 1);
    CUresult rc = buf ? CUDA_SUCCESS : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    for (uint64_t off = 0; rc == CUDA_SUCCESS && off < bytes; off += stage) {
        uint64_t n = bytes - off < stage ? bytes - off : stage;
        cli_pattern_fill(buf, off, n, seed, key);
        rc = cu->cuMemcpy(dst + off, (CUdeviceptr)(uintptr_t)buf, n);
    }
    free(buf);
    return rc;
}

/* Sources; rtt: the floor's device buffer, exported to the consumers; stream: the copy floor's
 * target, exported when a consumer on another GPU times the peer floor from it; cpu: a device
 * word for the raw calls. */
static int device_buffers(bench_run *run, unsigned needs)
{
    gpu_run *g = GPU(run);
    uint64_t bytes = max_size(run->opt);
    const char *sources = "the producer's source buffers";
    CUipcMemHandle h;
    for (uint32_t k = 0; k < GPU_KEYS; k++)
        if (RUN_CU(run, sources, cuMemAlloc, &g->src[k], bytes) ||
            gpu_cu(run, sources, "cuMemcpy", gpu_fill_device(g->src[k], bytes, run->opt->seed, k)))
            return -1;
    if (((needs & NEED_AUX) &&
         RUN_CU(run, "the floor's device buffer", cuMemAlloc, &g->aux, bytes)) ||
        ((needs & NEED_WORD) &&
         RUN_CU(run, "the raw calls' device word", cuMemAlloc, &g->word, WORD_BYTES)))
        return -1;
    if (!(needs & NEED_EXPORT) && !((needs & NEED_EXPORT_REMOTE) && gpu_has_remote(run->opt)))
        return 0;
    if (RUN_CU(run, "exporting the floor's device buffer", cuIpcGetMemHandle, &h, g->aux))
        return -1;
    memcpy(run->params.floor_handle, &h, sizeof(h));
    run->params.has_floor = 1;
    return 0;
}

/* Every configuration through the library first, then the first pool (which loads the
 * library's driver), then the devices. */
static int gpu_prepare(bench_run *run)
{
    const bench_opts *o = run->opt;
    bench_params *p = &run->params;
    const gpu_mode_ops *ops = ops_of(run);
    if (!(run->state = calloc(1, sizeof(gpu_run))))
        return run_fail(run, "out of memory");
    run->log_muted = o->quiet || o->json || (ops->needs & NEED_QUIET_LIBRARY);
    for (uint32_t i = 0; i < o->nplacements; i++) {
        ferry_pool_config c = pool_config(o, o->placements[i]);
        if (ferry_pool_config_check(&c) != FERRY_OK)
            return run_fail(run, "%s", ferry_last_error());
    }
    if (create_pool(run, o->placements[0]) != 0 || load_driver(run) != 0)
        return -1;
    p->max_item = max_size(o);
    p->items = (uint64_t)(o->items + o->warmup);
    for (uint32_t r = 0; r < run->consumers; r++)
        p->devices[r] = (int32_t)o->devices[r];
    if (ops->prepare)
        ops->prepare(run);
    return device_buffers(run, ops->needs);
}

int gpu_drain_pool(bench_run *run)
{
    gpu_run *g = GPU(run);
    uint64_t start = ferry_now_ns(), timeout = run->params.timeout_ns;
    for (;;) {
        ferry_pool_stats s;
        if (ferry_pool_reclaim(g->pool, NULL) != FERRY_OK ||
            run_pool_stats(g->pool, &s) != FERRY_OK)
            return run_fail(run, "reclaiming the pool failed: %s", ferry_last_error());
        if (s.leases_in_flight == 0)
            return 0;
        if (run_check_often(run) != 0)
            return -1;
        if (ferry_now_ns() - start >= timeout)
            return run_fail(run, "%llu leases were not acknowledged within %llu ms",
                            (unsigned long long)s.leases_in_flight,
                            (unsigned long long)(timeout / 1000000));
        sched_yield();
    }
}

bench_msg gpu_item(bench_run *run, uint32_t type, uint64_t iter, uint64_t size)
{
    uint32_t flags = iter % (uint64_t)run->opt->verify_every == 0 ? MSG_F_VERIFY : 0;
    return (bench_msg){
        .type = type, .flags = flags, .item = iter, .key = take_key(run, iter), .size = size};
}

int gpu_publish(bench_run *run, bench_msg *m, const char *what)
{
    gpu_run *g = GPU(run);
    ferry_tensor t = ferry_tensor_bytes(m->size);
    ferry_descriptor d;
    if (ferry_pool_publish_async(g->pool, &t, (const void *)(uintptr_t)g->src[m->key], g->stream,
                                 run->params.timeout_ns, &d) != FERRY_OK)
        return run_fail(run, "%s %llu: ferry_pool_publish_async failed: %s", what,
                        (unsigned long long)m->item, ferry_last_error());
    if (ferry_descriptor_encode(&d, m->desc) != FERRY_OK)
        return run_fail(run, "encoding a descriptor failed: %s", ferry_last_error());
    return 0;
}

/* One row; its verified and error counts are what the consumers' counters gained. */
static int run_row(bench_run *run, uint64_t size)
{
    gpu_run *g = GPU(run);
    gpu_row *row = &g->rows[g->nrows];
    uint64_t verified, errors;
    *row = (gpu_row){.placement = g->placement, .size = size};
    run_counters(run, &row->verified, &row->errors);
    if (ops_of(run)->row(run, row) != 0)
        return -1;
    run_counters(run, &verified, &errors);
    row->verified = verified - row->verified;
    row->errors = errors - row->errors;
    g->nrows++;
    if (!run->opt->quiet && !run->opt->json)
        fprintf(stderr, "ferry bench: %s, control %s, %llu-byte items: done\n", run->mode->name,
                gpu_placement(g->placement), (unsigned long long)size);
    return 0;
}

/* For each control placement a pool, for each item size a row. */
static int gpu_measure(bench_run *run)
{
    gpu_run *g = GPU(run);
    const bench_opts *o = run->opt;
    if ((ops_of(run)->needs & NEED_FLAGS) &&
        gpu_cu(run, "registering the flag pages", "cuMemHostRegister",
               cu_register_flags(&run->region, &g->flags_dev)))
        return -1;
    for (uint32_t i = 0; i < o->nplacements; i++) {
        if (!g->pool && create_pool(run, o->placements[i]) != 0)
            return -1;
        for (uint32_t s = 0; s < o->nsizes; s++)
            if (run_row(run, o->sizes[s]) != 0)
                return -1;
        ferry_pool_destroy(g->pool);
        g->pool = NULL;
    }
    return 0;
}

static void gpu_release(bench_run *run, int failed)
{
    gpu_run *g = GPU(run);
    if (!g)
        return;
    ferry_pool_destroy(g->pool);
    /* After a failure a stream may wait for a word nobody writes: leave it to the exit. */
    if (!failed && cu && gpu_use_device((int)run->opt->producer_device) == CUDA_SUCCESS) {
        if (g->stream)
            cu->cuStreamDestroy(g->stream);
        CUdeviceptr bufs[] = {g->src[0], g->src[1], g->src[2], g->src[3], g->aux, g->word};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            if (bufs[i])
                cu->cuMemFree(bufs[i]);
        if (g->flags_dev)
            cu->cuMemHostUnregister(run->region.flags);
    }
    free(g);
    run->state = NULL;
}

static void gpu_text(const bench_run *run)
{
    const bench_opts *o = run->opt;
    uint64_t verified, errors;
    char pool[32];
    const char *s = run->consumers > 1 ? "s" : "";
    cli_format_size((uint64_t)o->pool_size, pool, sizeof(pool));
    printf("ferry bench: backend %s, mode %s, producer GPU %lld, consumer GPU%s",
           ferry_backend_name(o->backend), run->mode->name, (long long)o->producer_device, s);
    for (uint32_t r = 0; r < run->consumers; r++)
        printf("%s%lld", r ? "," : " ", (long long)o->devices[r]);
    printf(", pool %s, max-inflight %lld, seed %llu\n", pool, (long long)o->max_inflight,
           (unsigned long long)o->seed);
    ops_of(run)->text(run);
    run_counters(run, &verified, &errors);
    printf("verified: %llu items, errors: %llu\n", (unsigned long long)verified,
           (unsigned long long)errors);
}

static void gpu_json(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const gpu_run *g = GPU(run);
    uint64_t verified, errors;
    printf("{\"backend\": \"%s\", \"mode\": \"%s\", \"producer_device\": %lld, "
           "\"consumers\": %u, \"consumer_devices\": [",
           ferry_backend_name(o->backend), run->mode->name, (long long)o->producer_device,
           run->consumers);
    for (uint32_t r = 0; r < run->consumers; r++)
        printf("%s%lld", r ? ", " : "", (long long)o->devices[r]);
    printf("], \"iterations\": %lld, \"warmup\": %lld, \"items\": %lld, \"rounds\": %lld, "
           "\"verify_every\": %lld, \"seed\": %llu, \"pool_size\": %lld, \"max_inflight\": %lld, "
           "\"results\": [",
           (long long)o->iterations, (long long)o->warmup, (long long)o->items,
           (long long)o->rounds, (long long)o->verify_every, (unsigned long long)o->seed,
           (long long)o->pool_size, (long long)o->max_inflight);
    for (uint32_t i = 0; i < g->nrows; i++) {
        printf("%s{\"control\": \"%s\", \"item_size\": %llu, ", i ? ", " : "",
               gpu_placement(g->rows[i].placement), (unsigned long long)g->rows[i].size);
        ops_of(run)->json_row(run, &g->rows[i]);
        printf("\"verified\": %llu, \"errors\": %llu}", (unsigned long long)g->rows[i].verified,
               (unsigned long long)g->rows[i].errors);
    }
    run_counters(run, &verified, &errors);
    printf("], \"verified\": %llu, \"errors\": %llu}\n", (unsigned long long)verified,
           (unsigned long long)errors);
}

int gpu_worker_cu(bench_worker *w, const char *call, CUresult rc)
{
    return rc == CUDA_SUCCESS ? 0 : worker_fail(w, "%s", cu_error(call, rc));
}

int gpu_worker_sync(bench_worker *w, const char *what)
{
    const char *why = cu_stream_wait(GW(w)->stream, w->p.timeout_ns, what);
    return why ? worker_fail(w, "%s", why) : 0;
}

void gpu_worker_verify(bench_worker *w, const char *what, const gpu_pending *e, const uint8_t *buf,
                       const gpu_span *spans, uint32_t n)
{
    uint8_t got, want;
    for (uint32_t i = 0; i < n; buf += spans[i].len, i++) {
        int64_t off =
            pattern_check(buf, spans[i].off, spans[i].len, w->p.seed, e->key, &got, &want);
        if (off >= 0) {
            worker_error(w, 0,
                         "%s item %llu (%llu bytes, pattern %llu): byte %lld is 0x%02x, expected "
                         "0x%02x",
                         what, (unsigned long long)e->iter, (unsigned long long)e->size,
                         (unsigned long long)e->key, (long long)off, got, want);
            return;
        }
    }
    __atomic_add_fetch(&w->me->verified[0], 1, __ATOMIC_RELEASE);
}

int gpu_worker_check(bench_worker *w, CUdeviceptr dev, uint64_t n, uint64_t key, uint64_t iter,
                     const char *what)
{
    gpu_worker *g = GW(w);
    if (gpu_worker_sync(w, "the consumer's stream") != 0 ||
        WORKER_CU(w, cuMemcpy, (CUdeviceptr)(uintptr_t)g->host, dev, n))
        return -1;
    gpu_worker_verify(w, what, &(gpu_pending){iter, key, n, 0}, g->host, &(gpu_span){0, n}, 1);
    return 0;
}

int gpu_worker_open_floor(bench_worker *w)
{
    CUipcMemHandle h;
    memcpy(&h, w->p.floor_handle, sizeof(h));
    return WORKER_CU(w, cuIpcOpenMemHandle, &GW(w)->peer, h, CU_IPC_LAZY_PEER_ACCESS);
}

static int gpu_worker_init(bench_worker *w)
{
    const gpu_mode_ops *ops = w->mode->family_ops;
    const char *why;
    gpu_worker *g = calloc(1, sizeof(*g));
    if (!(w->state = g))
        return worker_fail(w, "out of memory");
    g->device = w->p.devices[w->rank];
    if ((why = gpu_driver_load()))
        return worker_fail(w, "device %d: %s", g->device, why);
    if (gpu_worker_cu(w, "cuCtxSetCurrent", gpu_use_device(g->device)) ||
        WORKER_CU(w, cuStreamCreate, &g->stream, CU_STREAM_NON_BLOCKING) ||
        WORKER_CU(w, cuMemAlloc, &g->dst, w->p.max_item))
        return -1;
    if (!(g->host = malloc(w->p.max_item)))
        return worker_fail(w, "out of memory for the host staging buffer");
    if ((ops->needs & NEED_FLAGS) && cu_register_flags(&w->region, &g->flags_dev) != CUDA_SUCCESS)
        return worker_fail(w, "registering the flag pages failed");
    if ((ops->needs & NEED_FLAGS) && w->p.has_floor && gpu_worker_open_floor(w) != 0)
        return -1;
    return ops->init ? ops->init(w) : 0;
}

/* After a clean run only: a failed one may leave a stream waiting on a word nobody writes,
 * and freeing what it uses could block; the exit releases everything anyway. */
static void gpu_worker_release(bench_worker *w, int clean)
{
    gpu_worker *g = GW(w);
    if (!g)
        return;
    if (clean && cu) {
        ferry_consumer_destroy(g->consumer);
        if (g->peer)
            cu->cuIpcCloseMemHandle(g->peer);
        if (g->flags_dev)
            cu->cuMemHostUnregister(w->region.flags);
        CUdeviceptr bufs[] = {g->dst, g->raw_dst, g->word, g->ring};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            if (bufs[i])
                cu->cuMemFree(bufs[i]);
        if (g->stream)
            cu->cuStreamDestroy(g->stream);
    }
    free(g->host);
    free(g->pending);
    free(g->batch);
    free(g);
}

int gpu_worker_read(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    ferry_descriptor d;
    if (worker_decode(w, m, w->p.max_item, &d) != 0)
        return -1;
    if (ferry_consumer_read_async(g->consumer, &d, (void *)(uintptr_t)g->dst, w->p.max_item,
                                  g->stream) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_read_async: %s", w->mode->name,
                           (unsigned long long)m->item, ferry_last_error());
    return 0;
}

/* BEGIN and END, and the consumer in between; the mode's messages. */
static int gpu_worker_handle(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    const gpu_mode_ops *ops = w->mode->family_ops;
    if (m->type == MSG_BEGIN) {
        if (g->consumer)
            return worker_fail(w, "BEGIN inside a phase");
        memset(w->me->stat, 0, sizeof(w->me->stat));
        g->batches = g->nbatch = 0;
        g->raw_src = 0;
        if (ferry_consumer_create_on(w->rank, g->device, &g->consumer) != FERRY_OK)
            return worker_fail(w, "ferry_consumer_create_on(%u, %d): %s", w->rank, g->device,
                               ferry_last_error());
        return 0;
    }
    if (m->type == MSG_END) {
        if (gpu_worker_sync(w, "the consumer's stream at the end of a phase") != 0 ||
            (ops->flush && ops->flush(w) != 0))
            return -1;
        ferry_consumer_destroy(g->consumer);
        g->consumer = NULL;
        return 0;
    }
    if (m->type == MSG_ITEM ? !g->consumer || m->key >= GPU_KEYS || m->size > w->p.max_item
                            : m->type != MSG_OWN || !ops->own_msg)
        return worker_fail(w, "a message the run did not prepare for (type %u)", m->type);
    return ops->handle(w, m);
}

/* The GPU modes: the bench_mode slots they share, and each one's own part (ops). */
#define GPU_MODE(mode_name, ops)                                                                   \
    {                                                                                              \
        .name = mode_name, .family = FAMILY_GPU, .progress_by_seq = 1, .family_ops = &ops,         \
        .defaults = &ops.defaults, .adjust = gpu_adjust, .check = gpu_check,                       \
        .prepare = gpu_prepare, .measure = gpu_measure, .report_text = gpu_text,                   \
        .report_json = gpu_json, .release = gpu_release, .worker_init = gpu_worker_init,           \
        .worker_handle = gpu_worker_handle, .worker_release = gpu_worker_release,                  \
    }

const bench_mode rtt_mode = GPU_MODE("rtt", rtt_ops);
const bench_mode stream_mode = GPU_MODE("stream", stream_ops);
const bench_mode cpu_mode = GPU_MODE("cpu", cpu_ops);
