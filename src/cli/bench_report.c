/* `ferry bench`'s metrics and its two reports: a table for people, one JSON object for
 * scripts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

/* Latest ack of item over all ranks; 0 if some rank has none. */
static uint64_t last_ack(const bench_run *run, int phase, uint64_t item)
{
    uint64_t last = 0;
    for (uint32_t r = 0; r < run->consumers; r++) {
        uint64_t t = *bench_ack_slot(&run->region, phase, item, r);
        if (!t)
            return 0;
        last = t > last ? t : last;
    }
    return last;
}

/* Latencies of items [begin, end) into lat; returns the chunk's last ack (0 if none). */
static uint64_t chunk_latencies(bench_run *run, int phase, uint64_t begin, uint64_t end,
                                uint64_t *lat, size_t *n, bench_phase_result *out)
{
    const bench_params *p = &run->params;
    uint64_t last = 0;
    for (uint64_t i = begin; i < end; i++) {
        uint64_t t = last_ack(run, phase, i);
        out->bytes += bench_item_size(p->seed, p->size_lo, p->size_hi, i);
        if (!t)
            continue;
        last = t > last ? t : last;
        if (lat)
            lat[(*n)++] = t - run->publish_ns[phase][i];
    }
    return last;
}

static void latencies(bench_run *run, int phase, bench_phase_result *out)
{
    uint64_t *lat = malloc(run->params.items * sizeof(*lat)), wall = 0;
    size_t n = 0;
    for (uint64_t c = 0; c < (uint64_t)run->opt->rounds; c++) {
        uint64_t begin = bench_chunk_begin(run, c), end = bench_chunk_begin(run, c + 1);
        uint64_t last = chunk_latencies(run, phase, begin, end, lat, &n, out);
        if (last > run->publish_ns[phase][begin])
            wall += last - run->publish_ns[phase][begin];
    }
    out->seconds = wall ? (double)wall / 1e9 : NAN;
    cli_p50_p99_us(lat, lat ? n : 0, &out->p50_us, &out->p99_us);
    free(lat);
}

static void counters(const bench_run *run, int phase, bench_phase_result *out)
{
    uint64_t verified = UINT64_MAX;
    for (uint32_t r = 0; r < run->consumers; r++) {
        if (run->region.ranks[r].verified[phase] < verified)
            verified = run->region.ranks[r].verified[phase];
        out->errors += run->region.ranks[r].errors[phase];
    }
    out->verified_items = run->consumers ? verified : 0;
}

void bench_phase_metrics(bench_run *run, int phase, bench_phase_result *out)
{
    *out = (bench_phase_result){0};
    out->ran = 1;
    out->items = run->params.items;
    latencies(run, phase, out);
    counters(run, phase, out);
    out->items_per_s = (double)out->items / out->seconds;
    out->gbytes_per_s = (double)out->bytes / out->seconds / 1e9;
}

static double ratio(const bench_run *run)
{
    if (!run->floor.ran || !(run->floor.gbytes_per_s > 0))
        return NAN;
    return run->ferry.gbytes_per_s / run->floor.gbytes_per_s;
}

/* ---- text ------------------------------------------------------------------------------ */

static void table_row(const char *name, const bench_phase_result *r)
{
    printf("%-6s %8llu %10.1f %9.3f %10.1f %8.3f %10.1f %10.1f %10llu\n", name,
           (unsigned long long)r->items, (double)r->bytes / 1048576.0, r->seconds, r->items_per_s,
           r->gbytes_per_s, r->p50_us, r->p99_us, (unsigned long long)r->full_events);
}

static void text_header(const bench_run *run)
{
    const bench_options *o = run->opt;
    char lo[32], hi[32], pool[32];
    cli_format_size(o->item_size.lo, lo, sizeof(lo));
    cli_format_size(o->item_size.hi, hi, sizeof(hi));
    cli_format_size((uint64_t)o->pool_size, pool, sizeof(pool));
    printf("ferry bench: backend %s, %u consumers, %llu items of %s%s%s (seed %llu), pool %s, "
           "max-inflight %lld, reclaim interval %lld us, %lld round%s\n",
           ferry_backend_name(run->backend), run->consumers, (unsigned long long)o->items, lo,
           o->item_size.lo == o->item_size.hi ? "" : "-",
           o->item_size.lo == o->item_size.hi ? "" : hi, (unsigned long long)o->seed, pool,
           (long long)o->max_inflight, (long long)o->reclaim_interval_us, (long long)o->rounds,
           o->rounds == 1 ? "" : "s");
    if (run->floor.ran)
        printf("floor: %llu slots of %llu bytes in one shared ring\n",
               (unsigned long long)run->params.floor_slots,
               (unsigned long long)run->params.floor_slot_bytes);
}

void bench_report_text(const bench_run *run)
{
    text_header(run);
    printf("\n%-6s %8s %10s %9s %10s %8s %10s %10s %10s\n", "run", "items", "MiB", "seconds",
           "items/s", "GB/s", "p50 us", "p99 us", "pool-full");
    table_row("ferry", &run->ferry);
    if (run->floor.ran)
        table_row("floor", &run->floor);
    printf("\n");
    if (run->floor.ran)
        printf("ferry/floor GB/s ratio: %.3f\n", ratio(run));
    if (run->reclaim.ran)
        printf("reclaim delay p50/p99: %.1f/%.1f us (%llu blocked rounds of %llu)\n",
               run->reclaim.p50_us, run->reclaim.p99_us, (unsigned long long)run->reclaim.rounds,
               (unsigned long long)run->params.reclaim_rounds);
    printf("verified: %llu/%llu items in every consumer",
           (unsigned long long)run->ferry.verified_items, (unsigned long long)run->params.items);
    if (run->floor.ran)
        printf(" (floor %llu/%llu)", (unsigned long long)run->floor.verified_items,
               (unsigned long long)run->params.items);
    printf(", errors: %llu\n",
           (unsigned long long)(run->ferry.errors + run->floor.errors + run->reclaim.errors));
}

/* ---- JSON ------------------------------------------------------------------------------ */

static void json_number(const char *key, double v, const char *after)
{
    if (isfinite(v))
        printf("\"%s\": %.3f%s", key, v, after);
    else
        printf("\"%s\": null%s", key, after);
}

static void json_phase(const bench_phase_result *r, uint64_t pool_full, uint64_t errors)
{
    printf("\"items\": %llu, \"bytes\": %llu, ", (unsigned long long)r->items,
           (unsigned long long)r->bytes);
    json_number("seconds", r->seconds, ", ");
    json_number("items_per_s", r->items_per_s, ", ");
    json_number("gbytes_per_s", r->gbytes_per_s, ", ");
    json_number("p50_us", r->p50_us, ", ");
    json_number("p99_us", r->p99_us, ", ");
    printf("\"pool_full\": %llu, ", (unsigned long long)pool_full);
    printf("\"verified_items\": %llu, ", (unsigned long long)r->verified_items);
    printf("\"errors\": %llu", (unsigned long long)errors);
}

void bench_report_json(const bench_run *run)
{
    const bench_options *o = run->opt;
    printf("{\"backend\": \"%s\", \"consumers\": %u, ", ferry_backend_name(run->backend),
           run->consumers);
    json_phase(&run->ferry, run->ferry.full_events, run->ferry.errors + run->reclaim.errors);
    printf(", \"floor\": ");
    if (run->floor.ran) {
        printf("{");
        json_phase(&run->floor, run->floor.full_events, run->floor.errors);
        printf("}, ");
    } else {
        printf("null, ");
    }
    json_number("ratio_vs_floor", ratio(run), ", ");
    json_number("reclaim_delay_p50_us", run->reclaim.ran ? run->reclaim.p50_us : NAN, ", ");
    json_number("reclaim_delay_p99_us", run->reclaim.ran ? run->reclaim.p99_us : NAN, ", ");
    printf("\"reclaim_rounds\": %llu, \"rounds\": %lld, \"seed\": %llu, ",
           (unsigned long long)run->reclaim.rounds, (long long)o->rounds,
           (unsigned long long)o->seed);
    printf("\"item_size\": {\"min\": %llu, \"max\": %llu}, \"pool_size\": %lld, "
           "\"max_inflight\": %lld}\n",
           (unsigned long long)o->item_size.lo, (unsigned long long)o->item_size.hi,
           (long long)o->pool_size, (long long)o->max_inflight);
}
