/* `ferry bench`: orchestration. The producer checks the configuration, creates the pool,
 * starts one worker process per consumer, runs the ferry phase, the floor phase and the
 * reclaim-delay phase, collects the workers and reports. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench_gpu.h"
#include "cli/cli.h"

#define PATTERN_RING_MAX   8u
#define PATTERN_RING_BYTES (128ull << 20) /* the ring's memory budget per process */
#define RECLAIM_ITEM_BYTES 4096ull

static int library_log_muted;

static void library_log(int level, const char *message, void *user)
{
    const bench_options *opt = user;
    if (level != FERRY_LOG_ERROR && (library_log_muted || opt->quiet))
        return;
    fprintf(stderr, "ferry bench: library: %s\n", message);
}

void bench_mute_library_log(int mute)
{
    library_log_muted = mute;
}

static ferry_pool_config pool_config(const bench_run *run)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = run->backend;
    c.memory_size = run->opt->pool_size;
    c.consumer_count = run->opt->consumers;
    c.max_inflight_slices = run->opt->max_inflight;
    c.reclaim_interval_us = run->opt->reclaim_interval_us;
    return c;
}

/* The library's checks and the pool, before any worker exists. */
static int create_pool(bench_run *run)
{
    if (ferry_backend_parse(run->opt->backend, &run->backend) != FERRY_OK)
        return bench_fail(run, "%s", ferry_last_error());
    ferry_pool_config c = pool_config(run);
    if (ferry_pool_config_check(&c) != FERRY_OK || ferry_pool_create(&c, &run->pool) != FERRY_OK)
        return bench_fail(run, "%s", ferry_last_error());
    return 0;
}

static int check_item_fits(bench_run *run)
{
    ferry_pool_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    s.version = FERRY_POOL_STATS_VERSION;
    if (ferry_pool_stats_get(run->pool, &s) != FERRY_OK)
        return bench_fail(run, "%s", ferry_last_error());
    if (run->opt->item_size.hi <= s.usable_bytes)
        return 0;
    char item[32], pool[32];
    cli_format_size(run->opt->item_size.hi, item, sizeof(item));
    cli_format_size((uint64_t)run->opt->pool_size, pool, sizeof(pool));
    return bench_fail(run,
                      "items of up to %s (%llu bytes) do not fit in the pool: --pool-size %s "
                      "leaves %llu usable bytes after its control table; raise --pool-size "
                      "or lower --item-size",
                      item, (unsigned long long)run->opt->item_size.hi, pool,
                      (unsigned long long)s.usable_bytes);
}

static void fill_params(bench_run *run)
{
    const bench_options *o = run->opt;
    bench_params *p = &run->params;
    uint64_t ring = PATTERN_RING_BYTES / o->item_size.hi;
    memset(p, 0, sizeof(*p));
    p->seed = o->seed;
    p->size_lo = o->item_size.lo;
    p->size_hi = o->item_size.hi;
    p->items = (uint64_t)o->items;
    p->consumers = (uint64_t)o->consumers;
    p->ring = ring > PATTERN_RING_MAX ? PATTERN_RING_MAX : ring < 2 ? 2 : ring;
    p->floor_slot_bytes = (o->item_size.hi + 63) & ~63ull;
    p->floor_slots =
        o->no_floor ? 0 : bench_floor_slots(o->pool_size, p->floor_slot_bytes, o->max_inflight);
    p->floor_bytes = p->floor_slots * p->floor_slot_bytes;
    p->timeout_ns = (uint64_t)o->timeout_ms * 1000000ull;
    p->reclaim_rounds = (uint64_t)o->reclaim_rounds;
    p->reclaim_item = o->item_size.hi < RECLAIM_ITEM_BYTES ? o->item_size.hi : RECLAIM_ITEM_BYTES;
}

static int prepare(bench_run *run)
{
    if (create_pool(run) != 0 || check_item_fits(run) != 0)
        return -1;
    fill_params(run);
    run->workers = calloc(run->consumers, sizeof(*run->workers));
    run->publish_ns[0] = calloc(run->params.items, sizeof(uint64_t));
    run->publish_ns[1] = calloc(run->params.items, sizeof(uint64_t));
    if (!run->workers || !run->publish_ns[0] || !run->publish_ns[1])
        return bench_fail(run, "out of memory for %llu items",
                          (unsigned long long)run->params.items);
    for (uint32_t r = 0; r < run->consumers; r++)
        run->workers[r].sock = -1;
    if (bench_region_create(&run->params, &run->region) != 0)
        return bench_fail(run, "creating the results region failed: %s", strerror(errno));
    run->params = run->region.hdr->params;
    if (run->params.floor_slots && bench_floor_create(run) != 0)
        return -1;
    if (bench_patterns_create(&run->patterns, (uint32_t)run->params.ring, run->params.size_hi,
                              run->params.seed) != 0)
        return bench_fail(run, "out of memory for the item patterns");
    if (bench_spawn_workers(run) != 0)
        return -1;
    return bench_wait_ready(run);
}

/* Ferry and floor alternate chunk by chunk, so that both see the same machine. */
static int handoff_phases(bench_run *run)
{
    uint64_t full_after = 0;
    if (bench_pool_full_events(run, &run->ferry_full_before) != 0)
        return -1;
    run->run_start_ns = run->last_progress_ns = cli_now_ns();
    for (uint64_t c = 0; c < (uint64_t)run->opt->rounds; c++) {
        uint64_t begin = bench_chunk_begin(run, c), end = bench_chunk_begin(run, c + 1);
        if (bench_ferry_chunk(run, begin, end) != 0)
            return -1;
        if (run->params.floor_slots && bench_floor_chunk(run, begin, end) != 0)
            return -1;
    }
    if (bench_pool_full_events(run, &full_after) != 0)
        return -1;
    bench_phase_metrics(run, BENCH_PHASE_FERRY, &run->ferry);
    run->ferry.full_events = full_after - run->ferry_full_before;
    if (run->params.floor_slots) {
        bench_phase_metrics(run, BENCH_PHASE_FLOOR, &run->floor);
        run->floor.full_events = run->floor_waits;
    }
    return 0;
}

static int run_phases(bench_run *run)
{
    if (handoff_phases(run) != 0)
        return -1;
    if (run->params.reclaim_rounds && bench_reclaim_phase(run) != 0)
        return -1;
    return bench_finish_workers(run);
}

static void cleanup(bench_run *run)
{
    bench_kill_workers(run);
    for (uint32_t r = 0; run->workers && r < run->consumers; r++)
        if (run->workers[r].sock >= 0)
            close(run->workers[r].sock);
    free(run->workers);
    ferry_pool_destroy(run->pool);
    bench_floor_destroy(run);
    bench_patterns_destroy(&run->patterns);
    if (run->region.base)
        bench_region_unmap(&run->region);
    free(run->publish_ns[0]);
    free(run->publish_ns[1]);
    ferry_set_log(NULL, NULL);
}

/* Exit status after a complete run: every item verified in every consumer, no errors. */
static int verdict(const bench_run *run)
{
    uint64_t errors = run->ferry.errors + run->floor.errors + run->reclaim.errors;
    int bad = errors || run->ferry.verified_items < run->params.items ||
              (run->floor.ran && run->floor.verified_items < run->params.items);
    if (!bad)
        return CLI_EXIT_OK;
    fprintf(stderr, "ferry bench: verification failed (%llu errors)\n", (unsigned long long)errors);
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->region.ranks[r].message[0])
            fprintf(stderr, "ferry bench: consumer rank %u: %s\n", r, run->region.ranks[r].message);
    return CLI_EXIT_FAIL;
}

int cmd_bench(int argc, char **argv)
{
    bench_options opt;
    bench_run run;
    if (bench_gpu_selected(argc, argv))
        return cmd_bench_gpu(argc, argv); /* bench_gpu.c */
    int rc = bench_parse_options(argc, argv, &opt);
    if (rc != 0)
        return rc;
    memset(&run, 0, sizeof(run));
    run.opt = &opt;
    run.consumers = opt.consumers > 0 ? (uint32_t)opt.consumers : 0;
    run.floor_fd = -1;
    run.region.fd = -1;
    ferry_set_log(library_log, &opt);
    if (prepare(&run) != 0 || run_phases(&run) != 0) {
        bench_kill_workers(&run);
        fprintf(stderr, "ferry bench: %s\n", run.error);
        cleanup(&run);
        return CLI_EXIT_FAIL;
    }
    if (opt.json)
        bench_report_json(&run);
    else
        bench_report_text(&run);
    rc = verdict(&run);
    cleanup(&run);
    return rc;
}
