/* --mode rtt: the round trip of one item through the pool to every consumer, against a
 * floor without pool logic in the same processes over the same channels (docs/cli.md). */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define LOOK_PERIOD_NS 1000000ull /* checks while spinning: workers, timeout, background */
#define WORD_READY     0          /* the flag word the producer's stream writes */
#define WORD_ACK(rank) (128u + 16u * (uint32_t)(rank))
enum { MSG_FLOOR = 9 };

/* One iteration: *ns its round trip (0: not counted), *check the message the consumers
 * verify before the next iteration (0: none). */
typedef int (*iteration_fn)(bench_run *run, uint64_t size, uint64_t iter, uint64_t *ns,
                            uint64_t *check);

typedef struct side {
    iteration_fn fn;
    uint64_t *lat;    /* round trips of the timed iterations */
    uint64_t busy_ns; /* time in the timed iterations, verification pauses not counted */
} side;

/* Whether every rank's ack word reached value. */
static int acked(bench_run *run, uint32_t value)
{
    for (uint32_t r = 0; r < run->consumers; r++)
        if ((int32_t)(__atomic_load_n(&run->region.flags[WORD_ACK(r)], __ATOMIC_ACQUIRE) - value) <
            0)
            return 0;
    return 1;
}

/* Spins until the consumers acknowledged: ferry (taken != NULL): a reclaim found the lease
 * acknowledged, or the background reclaimer took it first (*taken: the iteration is not
 * counted); the floor: every ack word reached value. */
static int spin(bench_run *run, uint32_t value, int *taken, const char *what, uint64_t iter)
{
    ferry_pool *pool = GPU(run)->pool;
    uint64_t start = cli_now_ns(), next_look = start + LOOK_PERIOD_NS, n = 0;
    ferry_pool_stats s;
    for (;;) {
        if (taken && ferry_pool_reclaim(pool, &n) != FERRY_OK)
            return run_fail(run, "ferry_pool_reclaim failed: %s", ferry_last_error());
        if (taken ? n != 0 : acked(run, value))
            return 0;
        sched_yield();
        uint64_t now = cli_now_ns();
        if (now < next_look)
            continue;
        next_look = now + LOOK_PERIOD_NS;
        if (taken && run_pool_stats(pool, &s) != FERRY_OK)
            return run_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
        if (taken && s.leases_in_flight == 0)
            return *taken = 1, 0;
        if (run_check(run) != 0)
            return -1;
        if (now - start >= run->params.timeout_ns)
            return run_fail(run, "rtt %s %llu: no acknowledgement within %llu ms", what,
                            (unsigned long long)iter,
                            (unsigned long long)(run->params.timeout_ns / 1000000));
    }
}

static bench_msg message(bench_run *run, uint32_t type, uint64_t iter, uint64_t size)
{
    uint32_t flags = iter % (uint64_t)run->opt->verify_every == 0 ? MSG_F_VERIFY : 0;
    return (bench_msg){
        .type = type, .flags = flags, .item = iter, .key = gpu_take_key(run, iter), .size = size};
}

static int ferry_once(bench_run *run, uint64_t size, uint64_t iter, uint64_t *ns, uint64_t *check)
{
    bench_msg m = message(run, MSG_ITEM, iter, size);
    int taken = 0;
    uint64_t t0 = cli_now_ns();
    if (gpu_publish(run, m.key, size, &m, "rtt iteration") != 0 ||
        run_send(run, run->consumers, &m) != 0 || spin(run, 0, &taken, "iteration", iter) != 0)
        return -1;
    *ns = taken ? 0 : cli_now_ns() - t0;
    *check = m.flags & MSG_F_VERIFY ? m.seq : 0;
    return 0;
}

static int floor_once(bench_run *run, uint64_t size, uint64_t iter, uint64_t *ns, uint64_t *check)
{
    gpu_run *g = GPU(run);
    bench_msg m = message(run, MSG_FLOOR, iter, size);
    CUresult rc;
    /* run_send numbers the message run->seq + 1: that is the value of the words. */
    uint32_t value = (uint32_t)(run->seq + 1);
    uint64_t t0 = cli_now_ns();
    if ((rc = cu->cuMemcpyAsync(g->aux, g->src[m.key], size, g->stream)) != CUDA_SUCCESS)
        return gpu_cu_fail(run, "rtt floor", "cuMemcpyAsync", rc);
    if ((rc = cu->cuStreamWriteValue32(g->stream, g->flags_dev + WORD_READY * 4, value, 0)) !=
        CUDA_SUCCESS)
        return gpu_cu_fail(run, "rtt floor", "cuStreamWriteValue32", rc);
    if (run_send(run, run->consumers, &m) != 0 ||
        spin(run, value, NULL, "floor iteration", iter) != 0)
        return -1;
    *ns = cli_now_ns() - t0;
    *check = m.flags & MSG_F_VERIFY ? m.seq : 0;
    return 0;
}

/* Iterations [first, first + n) of one side; lat (NULL: the warm-up) gets their round trips. */
static int iterations(bench_run *run, side *s, uint64_t size, uint64_t first, uint64_t n,
                      uint64_t *lat)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t ns = 0, check = 0, t0 = cli_now_ns();
        if (s->fn(run, size, first + i, &ns, &check) != 0)
            return -1;
        if (lat) {
            s->busy_ns += cli_now_ns() - t0;
            lat[i] = ns;
        }
        if ((check && run_wait(run, 0, run->consumers, check, NULL) != 0) ||
            run_check_often(run) != 0)
            return -1;
    }
    return 0;
}

/* Mean, p50 and p99 of the counted samples (zeros were not counted), and the rate of all n. */
static void summarize(side *s, uint64_t n, gpu_lat *out)
{
    uint64_t kept = 0;
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        if (s->lat[i]) {
            s->lat[kept++] = s->lat[i];
            sum += (double)s->lat[i];
        }
    out->samples = kept;
    out->background = n - kept;
    out->mean_us = kept ? sum / (double)kept / 1e3 : NAN;
    cli_p50_p99_us(s->lat, kept, &out->p50_us, &out->p99_us);
    out->items_per_s = s->busy_ns ? (double)n * 1e9 / (double)s->busy_ns : NAN;
}

static int measure(bench_run *run, gpu_row *row, side sides[2])
{
    const bench_opts *o = run->opt;
    uint64_t n = (uint64_t)o->iterations, warm = (uint64_t)o->warmup;
    for (int k = 0; k < 2; k++)
        if (iterations(run, &sides[k], row->size, 0, warm, NULL) != 0)
            return -1;
    for (uint64_t c = 0; c < (uint64_t)o->rounds; c++) {
        uint64_t begin = n * c / (uint64_t)o->rounds, end = n * (c + 1) / (uint64_t)o->rounds;
        for (int k = 0; k < 2; k++)
            if (iterations(run, &sides[k], row->size, warm + begin, end - begin,
                           sides[k].lat + begin) != 0)
                return -1;
    }
    summarize(&sides[0], n, &row->ferry);
    summarize(&sides[1], n, &row->floor);
    return 0;
}

static int rtt_row(bench_run *run, gpu_row *row)
{
    uint64_t n = (uint64_t)run->opt->iterations;
    side sides[2] = {{ferry_once, calloc(n, sizeof(uint64_t)), 0},
                     {floor_once, calloc(n, sizeof(uint64_t)), 0}};
    int rc = -1;
    if (!sides[0].lat || !sides[1].lat)
        run_fail(run, "out of memory for %llu samples", (unsigned long long)n);
    else if (run_send_type(run, run->consumers, MSG_BEGIN) == 0 && measure(run, row, sides) == 0)
        rc = run_phase_end(run, run->consumers);
    free(sides[0].lat);
    free(sides[1].lat);
    return rc;
}

static void rtt_text(const bench_run *run)
{
    const bench_opts *o = run->opt;
    const gpu_run *g = GPU(run);
    printf("%u consumer%s, %lld iterations after %lld warm-up, %lld rounds, verify every %lld\n",
           run->consumers, run->consumers > 1 ? "s" : "", (long long)o->iterations,
           (long long)o->warmup, (long long)o->rounds, (long long)o->verify_every);
    printf("\n%-8s %9s %6s %10s %10s %10s %8s %10s\n", "control", "size", "run", "mean us",
           "p50 us", "p99 us", "samples", "items/s");
    for (uint32_t i = 0; i < g->nrows; i++) {
        const gpu_row *r = &g->rows[i];
        const gpu_lat *l[2] = {&r->ferry, &r->floor};
        char size[32];
        cli_format_size(r->size, size, sizeof(size));
        for (int k = 0; k < 2; k++)
            printf("%-8s %9s %6s %10.1f %10.1f %10.1f %8llu %10.1f\n", gpu_placement(r->placement),
                   size, k ? "floor" : "ferry", l[k]->mean_us, l[k]->p50_us, l[k]->p99_us,
                   (unsigned long long)l[k]->samples, l[k]->items_per_s);
        printf("%-8s %9s ferry/floor mean: %.3f\n", "", "",
               gpu_ratio(r->ferry.mean_us, r->floor.mean_us));
    }
    if (run->consumers > 1)
        printf("\nround trip = publish to the acknowledgement of the last of the %u consumers\n",
               run->consumers);
}

static void json_lat(const char *key, const gpu_lat *l)
{
    printf("\"%s\": {", key);
    cli_json_num("mean_us", l->mean_us, ", ");
    cli_json_num("p50_us", l->p50_us, ", ");
    cli_json_num("p99_us", l->p99_us, ", ");
    cli_json_num("items_per_s", l->items_per_s, ", ");
    printf("\"samples\": %llu, \"background_reclaims\": %llu}, ", (unsigned long long)l->samples,
           (unsigned long long)l->background);
}

static void rtt_json_row(const bench_run *run, const gpu_row *r)
{
    (void)run;
    json_lat("ferry", &r->ferry);
    json_lat("floor", &r->floor);
    cli_json_num("ratio_vs_floor", gpu_ratio(r->ferry.mean_us, r->floor.mean_us), ", ");
}

static int rtt_handle(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    uint32_t value = (uint32_t)m->seq;
    if (m->type == MSG_ITEM) {
        if (gpu_worker_read(w, m) != 0)
            return -1;
    } else if (m->type != MSG_FLOOR || m->size > w->p.max_item || m->key >= GPU_KEYS) {
        return worker_fail(w, "a message the run did not prepare for (type %u)", m->type);
    } else if (!g->peer) {
        return worker_fail(w, "a floor message the run did not prepare for");
    } else if (gpu_worker_cu(w, "cuStreamWaitValue32",
                             cu->cuStreamWaitValue32(g->stream, g->flags_dev + WORD_READY * 4,
                                                     value, CU_STREAM_WAIT_VALUE_GEQ)) ||
               gpu_worker_cu(w, "cuMemcpyAsync",
                             cu->cuMemcpyAsync(g->dst, g->peer, m->size, g->stream)) ||
               gpu_worker_cu(w, "cuStreamWriteValue32",
                             cu->cuStreamWriteValue32(
                                 g->stream, g->flags_dev + WORD_ACK(w->rank) * 4, value, 0))) {
        return -1;
    }
    if (m->flags & MSG_F_VERIFY)
        return gpu_worker_check(w, g->dst, m->size, m->key, m->item,
                                m->type == MSG_ITEM ? "rtt" : "rtt floor");
    return 0;
}

static const gpu_mode_ops rtt_ops = {
    .needs = NEED_AUX | NEED_EXPORT | NEED_FLAGS,
    /* rtt observes acknowledgements itself: the background reclaimer stays out of the way. */
    .defaults = {.pool_size = 64ll << 20,
                 .item_size = 4096,
                 .item_size2 = 1 << 20,
                 .max_inflight = 64,
                 .verify_every = 100,
                 .iterations = 1000,
                 .warmup = 100,
                 .reclaim_interval_us = 1000000},
    .row = rtt_row,
    .text = rtt_text,
    .json_row = rtt_json_row,
    .handle = rtt_handle,
};

const bench_mode rtt_mode = GPU_MODE("rtt", &rtt_ops, gpu_prepare, gpu_worker_init);
