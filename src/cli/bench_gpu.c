/* `ferry bench --backend cuda_ipc`: orchestration. The producer checks every configuration
 * with the library, creates the first pool (which loads the driver), prepares its device
 * buffers, starts the consumer processes, then for each control placement creates a pool and
 * measures one row per item size in the chosen mode; it collects the workers and reports. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench_gpu.h"

#define FLAG_WORDS_DEVICE 256 /* bytes of run->word */

int bench_gpu_selected(int argc, char **argv)
{
    int selected = 0;
    for (int i = 1; i < argc; i++) {
        const char *b = NULL;
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            b = argv[++i];
        else if (strncmp(argv[i], "--backend=", 10) == 0)
            b = argv[i] + 10;
        if (b)
            selected = strcmp(b, "cuda_ipc") == 0 || strcmp(b, "cuda_vmm") == 0;
    }
    return selected;
}

static int library_quiet;

static void library_log(int level, const char *message, void *user)
{
    (void)user;
    if (level != FERRY_LOG_ERROR && library_quiet)
        return;
    fprintf(stderr, "ferry bench: library: %s\n", message);
}

/* ---- small shared pieces ------------------------------------------------------------------- */

ferry_status gb_pool_stats(ferry_pool *pool, ferry_pool_stats *s)
{
    memset(s, 0, sizeof(*s));
    s->struct_size = sizeof(*s);
    s->version = FERRY_POOL_STATS_VERSION;
    return ferry_pool_stats_get(pool, s);
}

int gb_drain_pool(gb_run *run)
{
    uint64_t start = cli_now_ns(), timeout = run->region.params->timeout_ns;
    for (;;) {
        ferry_pool_stats s;
        if (ferry_pool_reclaim(run->pool, NULL) != FERRY_OK || gb_pool_stats(run->pool, &s) != 0)
            return gb_fail(run, "reclaiming the pool failed: %s", ferry_last_error());
        if (s.leases_in_flight == 0)
            return 0;
        if (gb_check_workers_often(run) != 0)
            return -1;
        if (cli_now_ns() - start >= timeout)
            return gb_fail(run, "%llu leases were not acknowledged within %llu ms",
                           (unsigned long long)s.leases_in_flight,
                           (unsigned long long)(timeout / 1000000));
        sched_yield();
    }
}

uint64_t gb_take_key(gb_run *run, uint64_t item)
{
    run->key = gb_next_key(run->key, run->opt->seed, item);
    return run->key;
}

/* ---- the pool ------------------------------------------------------------------------------ */

static ferry_pool_config pool_config(const gb_options *o, int placement)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = o->backend;
    c.memory_size = o->pool_size;
    c.consumer_count = o->consumers;
    c.max_inflight_slices = o->max_inflight;
    c.reclaim_interval_us = o->reclaim_interval_us;
    c.device = (int32_t)o->producer_device;
    c.control_placement = placement;
    return c;
}

static uint64_t max_size(const gb_options *o)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < o->nsizes; i++)
        m = o->sizes[i] > m ? o->sizes[i] : m;
    return m;
}

static int check_configs(gb_run *run)
{
    for (uint32_t i = 0; i < run->opt->nplacements; i++) {
        ferry_pool_config c = pool_config(run->opt, run->opt->placements[i]);
        if (ferry_pool_config_check(&c) != FERRY_OK)
            return gb_fail(run, "%s", ferry_last_error());
    }
    return 0;
}

static int check_item_fits(gb_run *run)
{
    ferry_pool_stats s;
    uint64_t item = max_size(run->opt);
    if (gb_pool_stats(run->pool, &s) != FERRY_OK)
        return gb_fail(run, "%s", ferry_last_error());
    if (item <= s.usable_bytes)
        return 0;
    return gb_fail(run,
                   "items of %llu bytes do not fit in the pool: --pool-size %lld leaves %llu "
                   "usable bytes after its control table; raise --pool-size or lower --item-size",
                   (unsigned long long)item, (long long)run->opt->pool_size,
                   (unsigned long long)s.usable_bytes);
}

static int create_pool(gb_run *run, int placement)
{
    ferry_pool_config c = pool_config(run->opt, placement);
    if (ferry_pool_create(&c, &run->pool) != FERRY_OK)
        return gb_fail(run, "%s", ferry_last_error());
    run->placement = placement;
    return check_item_fits(run);
}

/* ---- the producer's device buffers ------------------------------------------------------------
 */

static int cu_failed(gb_run *run, const char *what)
{
    return gb_fail(run, "%s: %s", what, ferry_last_error());
}

static int check_devices(gb_run *run)
{
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->opt->devices[r] >= run->cu->device_count)
            return gb_fail(run, "consumer device %lld does not exist (%d devices)",
                           (long long)run->opt->devices[r], run->cu->device_count);
    return 0;
}

static int load_driver(gb_run *run)
{
    const ferry__cuda *cu;
    if (ferry__cuda_get(&cu) != FERRY_OK)
        return gb_fail(run, "%s", ferry_last_error());
    run->cu = cu;
    if (check_devices(run) != 0)
        return -1;
    if (ferry__cuda_use_device(cu, (int)run->opt->producer_device) != FERRY_OK)
        return cu_failed(run, "making the producer's device current");
    CUresult rc = cu->cuStreamCreate(&run->stream, CU_STREAM_NON_BLOCKING);
    if (rc != CUDA_SUCCESS) {
        run->stream = NULL;
        ferry__cuda_fail(cu, "cuStreamCreate", rc);
        return cu_failed(run, "the producer's stream");
    }
    return 0;
}

static int make_sources(gb_run *run)
{
    uint64_t bytes = max_size(run->opt);
    for (uint32_t k = 0; k < GB_KEYS; k++) {
        if (gb_alloc(run->cu, &run->src[k], bytes) != FERRY_OK ||
            gb_fill_device(run->cu, run->src[k], bytes, run->opt->seed, k) != FERRY_OK)
            return cu_failed(run, "the producer's source buffers");
    }
    return 0;
}

static int export_floor(gb_run *run)
{
    CUipcMemHandle h;
    CUresult rc = run->cu->cuIpcGetMemHandle(&h, run->aux);
    if (rc != CUDA_SUCCESS) {
        ferry__cuda_fail(run->cu, "cuIpcGetMemHandle", rc);
        return cu_failed(run, "exporting the floor's device buffer");
    }
    memcpy(run->region.params->floor_handle, &h, sizeof(h));
    run->region.params->has_floor = 1;
    return 0;
}

/* rtt: the floor's device buffer, exported to the consumers; stream: the copy floor's target,
 * exported when a consumer on another GPU times the peer floor from it; cpu: a device word
 * for the raw calls. rtt and cpu: the flag pages, registered. */
static int mode_buffers(gb_run *run)
{
    const ferry__cuda *cu = run->cu;
    int mode = run->opt->mode;
    if (mode != GB_MODE_CPU && gb_alloc(cu, &run->aux, max_size(run->opt)) != FERRY_OK)
        return cu_failed(run, "the floor's device buffer");
    if ((mode == GB_MODE_RTT || (mode == GB_MODE_STREAM && gb_has_remote(run))) &&
        export_floor(run) != 0)
        return -1;
    if (mode == GB_MODE_CPU && gb_alloc(cu, &run->word, FLAG_WORDS_DEVICE) != FERRY_OK)
        return cu_failed(run, "the raw calls' device word");
    if (mode == GB_MODE_STREAM)
        return 0;
    if (gb_register_flags(cu, &run->region, &run->flags_dev) != FERRY_OK) {
        run->flags_dev = 0;
        return cu_failed(run, "registering the flag pages");
    }
    return 0;
}

static int make_region(gb_run *run)
{
    const gb_options *o = run->opt;
    gb_params p;
    memset(&p, 0, sizeof(p));
    p.mode = (uint32_t)o->mode;
    p.consumers = run->consumers;
    p.producer_pid = (int32_t)getpid();
    p.seed = o->seed;
    p.timeout_ns = (uint64_t)o->timeout_ms * 1000000ull;
    p.max_item = max_size(o);
    p.items = (uint64_t)(o->items + o->warmup);
    for (uint32_t i = 0; i < o->nsizes; i++)
        if (gb_sample_bytes(o->sizes[i]) > p.sample_bytes)
            p.sample_bytes = gb_sample_bytes(o->sizes[i]);
    for (uint32_t r = 0; r < run->consumers; r++)
        p.devices[r] = (int32_t)o->devices[r];
    if (gb_region_create(&p, &run->region) != 0)
        return gb_fail(run, "creating the results region failed: %m");
    return 0;
}

static int prepare(gb_run *run)
{
    if (check_configs(run) != 0 || create_pool(run, run->opt->placements[0]) != 0 ||
        load_driver(run) != 0 || make_region(run) != 0 || make_sources(run) != 0 ||
        mode_buffers(run) != 0 || gb_spawn_workers(run) != 0)
        return -1;
    return gb_wait_ready(run);
}

/* ---- the rows ------------------------------------------------------------------------------ */

static int run_row(gb_run *run, uint64_t size)
{
    gb_row *row = &run->rows[run->nrows];
    uint64_t v0, e0, v1, e1;
    memset(row, 0, sizeof(*row));
    row->placement = run->placement;
    row->size = size;
    gb_counters(run, &v0, &e0);
    int rc = run->opt->mode == GB_MODE_RTT      ? gb_rtt_row(run, row)
             : run->opt->mode == GB_MODE_STREAM ? gb_stream_row(run, row)
                                                : gb_cpu_row(run, row);
    if (rc != 0)
        return -1;
    gb_counters(run, &v1, &e1);
    row->verified = v1 - v0;
    row->errors = e1 - e0;
    run->nrows++;
    if (!run->opt->quiet && !run->opt->json)
        fprintf(stderr, "ferry bench: %s, control %s, %llu-byte items: done\n",
                gb_mode_name(run->opt->mode), gb_placement_name(run->placement),
                (unsigned long long)size);
    return 0;
}

static int run_rows(gb_run *run)
{
    for (uint32_t i = 0; i < run->opt->nplacements; i++) {
        if (!run->pool && create_pool(run, run->opt->placements[i]) != 0)
            return -1;
        for (uint32_t s = 0; s < run->opt->nsizes; s++)
            if (run_row(run, run->opt->sizes[s]) != 0)
                return -1;
        ferry_pool_destroy(run->pool);
        run->pool = NULL;
    }
    return gb_finish_workers(run);
}

static void release_device(gb_run *run)
{
    const ferry__cuda *cu = run->cu;
    if (!cu || ferry__cuda_use_device(cu, (int)run->opt->producer_device) != FERRY_OK)
        return;
    if (run->stream)
        cu->cuStreamDestroy(run->stream);
    for (uint32_t k = 0; k < GB_KEYS; k++)
        gb_free(cu, &run->src[k]);
    gb_free(cu, &run->aux);
    gb_free(cu, &run->word);
    if (run->flags_dev)
        cu->cuMemHostUnregister(run->region.flags);
}

static void cleanup(gb_run *run, int failed)
{
    gb_kill_workers(run);
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->workers[r].sock >= 0)
            close(run->workers[r].sock);
    ferry_pool_destroy(run->pool);
    /* After a failure a stream may wait for a word nobody writes: leave it to the exit. */
    if (!failed)
        release_device(run);
    if (run->region.base)
        gb_region_unmap(&run->region);
    else if (run->region.fd >= 0)
        close(run->region.fd);
    ferry_set_log(NULL, NULL);
}

static int verdict(const gb_run *run)
{
    uint64_t errors = 0, verified = 0;
    for (uint32_t i = 0; i < run->nrows; i++) {
        errors += run->rows[i].errors;
        verified += run->rows[i].verified;
    }
    if (!errors && verified)
        return CLI_EXIT_OK;
    fprintf(stderr, "ferry bench: verification failed (%llu errors, %llu items verified)\n",
            (unsigned long long)errors, (unsigned long long)verified);
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->region.ranks[r].message[0])
            fprintf(stderr, "ferry bench: consumer rank %u: %s\n", r, run->region.ranks[r].message);
    return CLI_EXIT_FAIL;
}

int cmd_bench_gpu(int argc, char **argv)
{
    gb_options opt;
    gb_run run;
    int rc = gb_parse_options(argc, argv, &opt);
    if (rc != 0)
        return rc;
    memset(&run, 0, sizeof(run));
    run.opt = &opt;
    run.consumers = (uint32_t)opt.consumers;
    run.region.fd = -1;
    for (uint32_t r = 0; r < GB_MAX_RANKS; r++)
        run.workers[r].sock = -1;
    /* A full pool is the steady state of --mode stream (publishers wait for space): its
     * warning would only be noise there; the report counts the events. */
    library_quiet = opt.quiet || opt.json || opt.mode == GB_MODE_STREAM;
    ferry_set_log(library_log, NULL);
    if (prepare(&run) != 0 || run_rows(&run) != 0) {
        gb_kill_workers(&run);
        fprintf(stderr, "ferry bench: %s\n", run.error);
        cleanup(&run, 1);
        return CLI_EXIT_FAIL;
    }
    if (opt.json)
        gb_report_json(&run);
    else
        gb_report_text(&run);
    rc = verdict(&run);
    cleanup(&run, 0);
    return rc;
}
