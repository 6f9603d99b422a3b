/* --mode rtt: the round trip of one item through the pool to every consumer, against a
 * floor without pool logic in the same processes over the same channels (docs/cli.md). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define LOOK_PERIOD_NS 1000000ull /* checks while spinning: workers, timeout, background */
#define WORD_READY     0          /* the flag word the producer's stream writes */
#define WORD_ACK(rank) (128u + 16u * (uint32_t)(rank))
enum { MSG_FLOOR = MSG_OWN };

static const char *const side_names[2] = {"ferry", "floor"};

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
    uint64_t start = ferry_now_ns(), next_look = start + LOOK_PERIOD_NS, n = 0;
    ferry_pool_stats s;
    for (;;) {
        if (taken && ferry_pool_reclaim(pool, &n) != FERRY_OK)
            return run_fail(run, "ferry_pool_reclaim failed: %s", ferry_last_error());
        if (taken ? n != 0 : acked(run, value))
            return 0;
        sched_yield();
        uint64_t now = ferry_now_ns();
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

/* The floor's start: the copy into the buffer the consumers copy from, then the ready word
 * (value), on the producer's stream. */
static int floor_start(bench_run *run, const bench_msg *m, uint32_t value)
{
    gpu_run *g = GPU(run);
    if (RUN_CU(run, "rtt floor", cuMemcpyAsync, g->aux, g->src[m->key], m->size, g->stream) ||
        RUN_CU(run, "rtt floor", cuStreamWriteValue32, g->stream, g->flags_dev + WORD_READY * 4,
               value, 0))
        return -1;
    return 0;
}

/* Iterations [first, first + n) of side k (0: ferry, 1: the floor); lat (NULL: the warm-up)
 * gets their round trips (0: the background reclaimer took the lease, not counted), and the
 * side's busy time the time they took, the waits for the consumers' checks not counted. */
static int iterations(bench_run *run, int k, uint64_t first, uint64_t n, uint64_t *lat)
{
    gpu_run *g = GPU(run);
    for (uint64_t i = first; i < first + n; i++) {
        uint64_t t0 = ferry_now_ns();
        bench_msg m = gpu_item(run, k ? MSG_FLOOR : MSG_ITEM, i, g->size);
        /* run_send numbers the message run->seq + 1: that is the value of the floor's words. */
        uint32_t value = (uint32_t)(run->seq + 1);
        int taken = 0;
        uint64_t start = ferry_now_ns();
        if ((k == 0 ? gpu_publish(run, &m, "rtt iteration") : floor_start(run, &m, value)) != 0 ||
            run_send(run, run->consumers, &m) != 0 ||
            spin(run, value, k ? NULL : &taken, k ? "floor iteration" : "iteration", i) != 0)
            return -1;
        uint64_t end = ferry_now_ns();
        if (lat) {
            g->busy_ns[k] += end - t0;
            lat[i - first] = taken ? 0 : end - start;
        }
        if (((m.flags & MSG_F_VERIFY) && run_wait(run, 0, run->consumers, m.seq, NULL) != 0) ||
            run_check_often(run) != 0)
            return -1;
    }
    return 0;
}

static int timed(bench_run *run, int k, uint64_t begin, uint64_t end)
{
    gpu_run *g = GPU(run);
    return iterations(run, k, (uint64_t)run->opt->warmup + begin, end - begin, g->lat[k] + begin);
}

/* --warmup iterations of each side, then the timed ones in --rounds rounds of both. */
static int rtt_row(bench_run *run, gpu_row *row)
{
    gpu_run *g = GPU(run);
    uint64_t n = (uint64_t)run->opt->iterations, warm = (uint64_t)run->opt->warmup;
    int rc = -1;
    g->size = row->size;
    g->busy_ns[0] = g->busy_ns[1] = 0;
    g->lat[0] = calloc(n, sizeof(uint64_t));
    g->lat[1] = calloc(n, sizeof(uint64_t));
    if (!g->lat[0] || !g->lat[1])
        run_fail(run, "out of memory for %llu samples", (unsigned long long)n);
    else if (run_send_type(run, run->consumers, MSG_BEGIN) == 0 &&
             iterations(run, 0, 0, warm, NULL) == 0 && iterations(run, 1, 0, warm, NULL) == 0 &&
             run_rounds(run, n, (uint64_t)run->opt->rounds, 2, timed) == 0) {
        for (int k = 0; k < 2; k++)
            lat_summarize(g->lat[k], n, g->busy_ns[k], &row->lat[k]);
        rc = run_phase_end(run, run->consumers);
    }
    for (int k = 0; k < 2; k++) {
        free(g->lat[k]);
        g->lat[k] = NULL;
    }
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
        char size[32];
        cli_format_size(r->size, size, sizeof(size));
        for (int k = 0; k < 2; k++)
            printf("%-8s %9s %6s %10.1f %10.1f %10.1f %8llu %10.1f\n", gpu_placement(r->placement),
                   size, side_names[k], r->lat[k].mean_us, r->lat[k].p50_us, r->lat[k].p99_us,
                   (unsigned long long)r->lat[k].samples, r->lat[k].items_per_s);
        printf("%-8s %9s ferry/floor mean: %.3f\n", "", "",
               cli_ratio(r->lat[0].mean_us, r->lat[1].mean_us));
    }
    if (run->consumers > 1)
        printf("\nround trip = publish to the acknowledgement of the last of the %u consumers\n",
               run->consumers);
}

static void rtt_json_row(const bench_run *run, const gpu_row *r)
{
    (void)run;
    for (int k = 0; k < 2; k++)
        lat_json(side_names[k], &r->lat[k], 1);
    cli_json_num("ratio_vs_floor", cli_ratio(r->lat[0].mean_us, r->lat[1].mean_us), ", ");
}

/* A pool item (the frame checked it), or a floor message: wait for the ready word, copy
 * from the producer's floor buffer, write the ack word, all on the consumer's stream. */
static int rtt_handle(bench_worker *w, const bench_msg *m)
{
    gpu_worker *g = GW(w);
    uint32_t value = (uint32_t)m->seq;
    if (m->type == MSG_ITEM) {
        if (gpu_worker_read(w, m) != 0)
            return -1;
    } else if (m->size > w->p.max_item || m->key >= GPU_KEYS) {
        return worker_fail(w, "a message the run did not prepare for (type %u)", m->type);
    } else if (!g->peer) {
        return worker_fail(w, "a floor message the run did not prepare for");
    } else if (WORKER_CU(w, cuStreamWaitValue32, g->stream, g->flags_dev + WORD_READY * 4, value,
                         CU_STREAM_WAIT_VALUE_GEQ) ||
               WORKER_CU(w, cuMemcpyAsync, g->dst, g->peer, m->size, g->stream) ||
               WORKER_CU(w, cuStreamWriteValue32, g->stream, g->flags_dev + WORD_ACK(w->rank) * 4,
                         value, 0)) {
        return -1;
    }
    if (m->flags & MSG_F_VERIFY)
        return gpu_worker_check(w, g->dst, m->size, m->key, m->item,
                                m->type == MSG_ITEM ? "rtt" : "rtt floor");
    return 0;
}

const gpu_mode_ops rtt_ops = {
    .needs = NEED_AUX | NEED_EXPORT | NEED_FLAGS,
    .own_msg = 1,
    /* rtt observes acknowledgements itself: the background reclaimer stays out of the way. */
    .defaults =
        {
            GPU_DEFAULTS,
            .pool_size = 64ll << 20,
            .sizes = {4096, 1 << 20},
            .nsizes = 2,
            .max_inflight = 64,
            .verify_every = 100,
            .iterations = 1000,
            .warmup = 100,
            .reclaim_interval_us = 1000000,
        },
    .row = rtt_row,
    .text = rtt_text,
    .json_row = rtt_json_row,
    .handle = rtt_handle,
};
