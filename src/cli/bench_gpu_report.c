/* The GPU bench's reports: a table for people, one JSON object for scripts. */
#include <math.h>
#include <stdio.h>

#include "cli/bench_gpu.h"

static double ratio(double a, double b)
{
    return isfinite(a) && isfinite(b) && b > 0 ? a / b : NAN;
}

/* stream: consumer read GB/s / the peer floor when every consumer is on one GPU other than
 * the producer's; NAN otherwise (a consumer on the producer's GPU, or several GPUs). */
static double peer_ratio(const gb_run *run, const gb_row *r)
{
    for (uint32_t c = 1; c < run->consumers; c++)
        if (run->opt->devices[c] != run->opt->devices[0])
            return NAN;
    return r->npeers == 1 ? ratio(r->read_gbps, r->peers[0].gbps) : NAN;
}

static void totals(const gb_run *run, uint64_t *verified, uint64_t *errors)
{
    *verified = *errors = 0;
    for (uint32_t i = 0; i < run->nrows; i++) {
        *verified += run->rows[i].verified;
        *errors += run->rows[i].errors;
    }
}

/* ---- text ---------------------------------------------------------------------------------- */

static void text_header(const gb_run *run)
{
    const gb_options *o = run->opt;
    char pool[32];
    cli_format_size((uint64_t)o->pool_size, pool, sizeof(pool));
    printf("ferry bench: backend %s, mode %s, producer GPU %lld, consumer GPU%s",
           ferry_backend_name(o->backend), gb_mode_name(o->mode), (long long)o->producer_device,
           run->consumers > 1 ? "s" : "");
    for (uint32_t r = 0; r < run->consumers; r++)
        printf("%s%lld", r ? "," : " ", (long long)o->devices[r]);
    printf(", pool %s, max-inflight %lld, seed %llu\n", pool, (long long)o->max_inflight,
           (unsigned long long)o->seed);
    if (o->mode == GB_MODE_RTT)
        printf("%u consumer%s, %lld iterations after %lld warm-up, %lld rounds, verify every "
               "%lld\n",
               run->consumers, run->consumers > 1 ? "s" : "", (long long)o->iterations,
               (long long)o->warmup, (long long)o->rounds, (long long)o->verify_every);
    else if (o->mode == GB_MODE_STREAM)
        printf("%u consumer%s, %lld items after %lld warm-up, verify every %lld\n", run->consumers,
               run->consumers > 1 ? "s" : "", (long long)o->items, (long long)o->warmup,
               (long long)o->verify_every);
    else
        printf("%lld calls of each kind, in batches of up to %d\n", (long long)o->iterations,
               GB_CPU_BATCH);
}

static void rtt_text(const gb_run *run)
{
    printf("\n%-8s %9s %6s %10s %10s %10s %8s %10s\n", "control", "size", "run", "mean us",
           "p50 us", "p99 us", "samples", "items/s");
    for (uint32_t i = 0; i < run->nrows; i++) {
        const gb_row *r = &run->rows[i];
        char size[32];
        cli_format_size(r->size, size, sizeof(size));
        const gb_lat *l[2] = {&r->ferry, &r->floor};
        for (int k = 0; k < 2; k++)
            printf("%-8s %9s %6s %10.1f %10.1f %10.1f %8llu %10.1f\n",
                   gb_placement_name(r->placement), size, k ? "floor" : "ferry", l[k]->mean_us,
                   l[k]->p50_us, l[k]->p99_us, (unsigned long long)l[k]->samples,
                   l[k]->items_per_s);
        printf("%-8s %9s ferry/floor mean: %.3f\n", "", "",
               ratio(r->ferry.mean_us, r->floor.mean_us));
    }
    if (run->consumers > 1)
        printf("\nround trip = publish to the acknowledgement of the last of the %u consumers\n",
               run->consumers);
}

static void peer_text(const gb_run *run, const gb_row *r)
{
    for (uint32_t p = 0; p < r->npeers; p++)
        printf("%-8s %9s peer floor GPU %d: %.2f GB/s read (%llu copies)\n", "", "",
               r->peers[p].device, r->peers[p].gbps, (unsigned long long)r->peers[p].copies);
    double pr = peer_ratio(run, r);
    if (isfinite(pr))
        printf("%-8s %9s consumer read / peer floor: %.3f\n", "", "", pr);
}

static void stream_text(const gb_run *run)
{
    printf("\n%-8s %9s %9s %10s %11s %13s %11s %7s %9s %10s\n", "control", "size", "seconds",
           "items/s", "payload GB/s", "effective GB/s", "floor GB/s", "ratio", "pool-full",
           "read GB/s");
    for (uint32_t i = 0; i < run->nrows; i++) {
        const gb_row *r = &run->rows[i];
        char size[32];
        cli_format_size(r->size, size, sizeof(size));
        printf("%-8s %9s %9.4f %10.1f %11.2f %13.2f %11.2f %7.3f %9llu %10.2f\n",
               gb_placement_name(r->placement), size, r->seconds, r->items_per_s, r->payload_gbps,
               r->effective_gbps, r->floor_gbps, ratio(r->effective_gbps, r->floor_gbps),
               (unsigned long long)r->pool_full, r->read_gbps);
        peer_text(run, r);
    }
    printf("\neffective = (producer copy + every consumer's copy), each byte read and written;\n"
           "floor = device-to-device cuMemcpyAsync of the same size on the producer's GPU, read "
           "+ written;\nratio = ferry effective copy bandwidth / device copy bandwidth;\n"
           "read = bytes the consumers read (items * size * consumers) / s\n");
    if (gb_has_remote(run))
        printf("peer floor = copies of the same size from the producer's GPU into that GPU "
               "(consumer side,\nCUDA IPC mapping), bytes read; consumer read / peer floor "
               "when every consumer is on that GPU\n");
}

static void cpu_text(const gb_run *run)
{
    printf("\n%-8s %9s %8s %11s %11s %11s %10s\n", "control", "size", "call", "total ns",
           "driver ns", "ferry ns", "decode ns");
    for (uint32_t i = 0; i < run->nrows; i++) {
        const gb_row *r = &run->rows[i];
        char size[32];
        cli_format_size(r->size, size, sizeof(size));
        printf("%-8s %9s %8s %11.1f %11.1f %11.1f %10s\n", gb_placement_name(r->placement), size,
               "publish", r->publish_ns, r->publish_raw_ns, r->publish_ns - r->publish_raw_ns, "-");
        printf("%-8s %9s %8s %11.1f %11.1f %11.1f %10.1f\n", "", "", "read", r->read_ns,
               r->read_raw_ns, r->read_ns - r->read_raw_ns, r->decode_ns);
    }
    printf(
        "\nferry ns = ferry's own CPU time per call: the call's thread CPU time minus that of the\n"
        "driver calls it makes, measured on the same thread (target < 1000); decode ns =\n"
        "ferry_descriptor_decode, not part of the read\n");
    for (uint32_t i = 0; i < run->nrows; i++)
        printf("%s%.1f",
               i ? ", "
                 : "one cuCtxSetCurrent (counted as ferry's, which makes its device "
                   "current in every call): ns ",
               run->rows[i].context_ns);
    printf("\n");
}

void gb_report_text(const gb_run *run)
{
    uint64_t verified, errors;
    text_header(run);
    if (run->opt->mode == GB_MODE_RTT)
        rtt_text(run);
    else if (run->opt->mode == GB_MODE_STREAM)
        stream_text(run);
    else
        cpu_text(run);
    totals(run, &verified, &errors);
    printf("verified: %llu items, errors: %llu\n", (unsigned long long)verified,
           (unsigned long long)errors);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static void num(const char *key, double v, const char *after)
{
    if (isfinite(v))
        printf("\"%s\": %.3f%s", key, v, after);
    else
        printf("\"%s\": null%s", key, after);
}

static void json_lat(const char *key, const gb_lat *l)
{
    printf("\"%s\": {", key);
    num("mean_us", l->mean_us, ", ");
    num("p50_us", l->p50_us, ", ");
    num("p99_us", l->p99_us, ", ");
    num("items_per_s", l->items_per_s, ", ");
    printf("\"samples\": %llu, \"background_reclaims\": %llu}, ", (unsigned long long)l->samples,
           (unsigned long long)l->background);
}

static void json_peers(const gb_run *run, const gb_row *r)
{
    num("consumer_read_gbytes_per_s", r->read_gbps, ", ");
    printf("\"peer_floor\": [");
    for (uint32_t p = 0; p < r->npeers; p++) {
        printf("%s{\"device\": %d, \"copies\": %llu, ", p ? ", " : "", r->peers[p].device,
               (unsigned long long)r->peers[p].copies);
        num("seconds", r->peers[p].seconds, ", ");
        num("gbytes_per_s", r->peers[p].gbps, "}");
    }
    printf("], ");
    num("ratio_vs_peer_floor", peer_ratio(run, r), ", ");
}

static void json_row(const gb_run *run, const gb_row *r)
{
    printf("{\"control\": \"%s\", \"item_size\": %llu, ", gb_placement_name(r->placement),
           (unsigned long long)r->size);
    if (run->opt->mode == GB_MODE_RTT) {
        json_lat("ferry", &r->ferry);
        json_lat("floor", &r->floor);
        num("ratio_vs_floor", ratio(r->ferry.mean_us, r->floor.mean_us), ", ");
    } else if (run->opt->mode == GB_MODE_STREAM) {
        num("seconds", r->seconds, ", ");
        num("items_per_s", r->items_per_s, ", ");
        num("gbytes_per_s", r->payload_gbps, ", ");
        num("effective_gbytes_per_s", r->effective_gbps, ", ");
        printf("\"pool_full\": %llu, \"floor\": {\"copies\": %llu, ",
               (unsigned long long)r->pool_full, (unsigned long long)r->floor_copies);
        num("seconds", r->floor_seconds, ", ");
        num("gbytes_per_s", r->floor_gbps, "}, ");
        num("ratio_vs_floor", ratio(r->effective_gbps, r->floor_gbps), ", ");
        json_peers(run, r);
    } else {
        num("publish_ns", r->publish_ns, ", ");
        num("publish_driver_ns", r->publish_raw_ns, ", ");
        num("publish_ferry_ns", r->publish_ns - r->publish_raw_ns, ", ");
        num("read_ns", r->read_ns, ", ");
        num("read_driver_ns", r->read_raw_ns, ", ");
        num("read_ferry_ns", r->read_ns - r->read_raw_ns, ", ");
        num("decode_ns", r->decode_ns, ", ");
        num("context_ns", r->context_ns, ", ");
    }
    printf("\"verified\": %llu, \"errors\": %llu}", (unsigned long long)r->verified,
           (unsigned long long)r->errors);
}

static void json_header(const gb_run *run)
{
    const gb_options *o = run->opt;
    printf("{\"backend\": \"%s\", \"mode\": \"%s\", \"producer_device\": %lld, "
           "\"consumers\": %u, \"consumer_devices\": [",
           ferry_backend_name(o->backend), gb_mode_name(o->mode), (long long)o->producer_device,
           run->consumers);
    for (uint32_t r = 0; r < run->consumers; r++)
        printf("%s%lld", r ? ", " : "", (long long)o->devices[r]);
    printf("], \"iterations\": %lld, \"warmup\": %lld, \"items\": %lld, \"rounds\": %lld, "
           "\"verify_every\": %lld, \"seed\": %llu, \"pool_size\": %lld, \"max_inflight\": %lld, ",
           (long long)o->iterations, (long long)o->warmup, (long long)o->items,
           (long long)o->rounds, (long long)o->verify_every, (unsigned long long)o->seed,
           (long long)o->pool_size, (long long)o->max_inflight);
}

void gb_report_json(const gb_run *run)
{
    uint64_t verified, errors;
    json_header(run);
    printf("\"results\": [");
    for (uint32_t i = 0; i < run->nrows; i++) {
        printf("%s", i ? ", " : "");
        json_row(run, &run->rows[i]);
    }
    totals(run, &verified, &errors);
    printf("], \"verified\": %llu, \"errors\": %llu}\n", (unsigned long long)verified,
           (unsigned long long)errors);
}
