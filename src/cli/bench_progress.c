/* The producer's waits on its workers' progress words, chunk bookkeeping and the progress
 * lines of long runs. */
#include <stdio.h>

#include "cli/cli.h"

#define SLEEP_SLICE_NS 10000000ull /* longest single sleep before re-checking workers */

static uint32_t slowest_rank(const bench_run *run, int phase, uint32_t nranks, uint32_t *seen)
{
    uint32_t worst = 0, low = UINT32_MAX;
    for (uint32_t r = 0; r < nranks; r++) {
        uint32_t v = __atomic_load_n(&run->region.ranks[r].progress[phase], __ATOMIC_ACQUIRE);
        if (v < low) {
            low = v;
            worst = r;
        }
    }
    *seen = low;
    return worst;
}

/* Sleeps until rank's progress word moves past seen (or a slice passes). */
static void sleep_on_progress(bench_run *run, int phase, uint32_t rank, uint64_t need)
{
    uint32_t *word = &run->region.ranks[rank].progress[phase];
    uint32_t *flag = &run->region.hdr->producer_waiting;
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    uint32_t now = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (now < need)
        cli_futex_wait(word, now, SLEEP_SLICE_NS);
    __atomic_store_n(flag, 0, __ATOMIC_SEQ_CST);
}

int bench_wait_progress(bench_run *run, int phase, uint32_t nranks, uint64_t need, int *waited)
{
    uint32_t seen, last_seen = UINT32_MAX;
    uint64_t last_change = cli_now_ns();
    if (waited)
        *waited = 0;
    for (;;) {
        uint32_t r = slowest_rank(run, phase, nranks, &seen);
        if (seen >= need)
            return 0;
        if (waited)
            *waited = 1;
        if (bench_check_workers_often(run) != 0)
            return -1;
        uint64_t t = cli_now_ns();
        if (seen != last_seen) {
            last_seen = seen;
            last_change = t;
        } else if (t - last_change >= run->params.timeout_ns) {
            return bench_fail(run,
                              "consumer rank %u handled no %s item for %llu ms (%u of %llu "
                              "done)",
                              r, bench_phase_name(phase),
                              (unsigned long long)(run->params.timeout_ns / 1000000ull), seen,
                              (unsigned long long)need);
        }
        sleep_on_progress(run, phase, r, need);
    }
}

void bench_chunk_start(bench_run *run)
{
    run->chunk_start_ns = cli_now_ns();
}

void bench_chunk_end(bench_run *run, int phase)
{
    run->tally[phase].ns += cli_now_ns() - run->chunk_start_ns;
}

uint64_t bench_chunk_begin(const bench_run *run, uint64_t c)
{
    return run->params.items * c / (uint64_t)run->opt->rounds;
}

void bench_progress(bench_run *run, int phase, uint64_t bytes)
{
    run->tally[phase].items++;
    run->tally[phase].bytes += bytes;
    if (run->opt->quiet || run->opt->json)
        return;
    uint64_t t = cli_now_ns();
    if (t - run->run_start_ns < 2000000000ull || t - run->last_progress_ns < 1000000000ull)
        return;
    run->last_progress_ns = t;
    fprintf(stderr, "ferry bench:");
    for (int ph = 0; ph < 2; ph++) {
        const bench_tally *k = &run->tally[ph];
        uint64_t ns = k->ns + (ph == phase ? t - run->chunk_start_ns : 0);
        if (k->items)
            fprintf(stderr, "%s %s %llu/%llu items, %.2f GB/s", ph ? "," : "", bench_phase_name(ph),
                    (unsigned long long)k->items, (unsigned long long)run->params.items,
                    ns ? (double)k->bytes / (double)ns : 0.0);
    }
    fprintf(stderr, "\n");
}
