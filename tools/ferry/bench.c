/* `ferry bench` and its hidden worker command: the modes, and one run from the command line
 * to the report. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench.h"

static const bench_mode *const modes[] = {&handover_mode, &channel_mode, &rtt_mode, &stream_mode,
                                          &cpu_mode};
#define NMODES (sizeof(modes) / sizeof(modes[0]))

static uint32_t mode_index(const bench_mode *mode)
{
    uint32_t i = 0;
    while (i < NMODES && modes[i] != mode)
        i++;
    return i;
}

/* Exit status after a complete run: something verified, nothing failed verification. */
static int verdict(const bench_run *run, int complete)
{
    uint64_t verified, errors;
    run_counters(run, &verified, &errors);
    if (!errors && verified && complete)
        return CLI_EXIT_OK;
    fprintf(stderr, "ferry bench: verification failed (%llu errors, %llu items verified)\n",
            (unsigned long long)errors, (unsigned long long)verified);
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->region.ranks[r].message[0])
            fprintf(stderr, "ferry bench: consumer rank %u: %s\n", r, run->region.ranks[r].message);
    return CLI_EXIT_FAIL;
}

int cmd_bench(int argc, char **argv)
{
    bench_opts opt;
    bench_run run;
    const bench_mode *mode;
    int rc = bench_parse_options(argc, argv, modes, NMODES, &opt, &mode);
    if (rc != 0)
        return rc < 0 ? CLI_EXIT_OK : rc; /* < 0: --help */
    memset(&run, 0, sizeof(run));
    run.opt = &opt;
    run.mode = mode;
    run.consumers = (uint32_t)opt.consumers;
    run.extra_fd = -1;
    run.region.fd = -1;
    run.log_muted = opt.quiet;
    run.params.mode = mode_index(mode);
    run.params.seed = opt.seed;
    run.params.timeout_ns = (uint64_t)opt.timeout_ms * 1000000ull;
    ferry_set_log(run_library_log, &run.log_muted);
    if (mode->prepare(&run) != 0 || harness_start(&run) != 0 || mode->measure(&run) != 0 ||
        harness_finish(&run) != 0) {
        harness_kill(&run);
        fprintf(stderr, "ferry bench: %s\n", run.error);
        mode->release(&run, 1);
        harness_close(&run);
        ferry_set_log(NULL, NULL);
        return CLI_EXIT_FAIL;
    }
    if (opt.json)
        mode->report_json(&run);
    else
        mode->report_text(&run);
    rc = verdict(&run, !run.incomplete);
    mode->release(&run, 0);
    harness_close(&run);
    ferry_set_log(NULL, NULL);
    return rc;
}

static int worker_args(int argc, char **argv, int64_t v[4])
{
    static const char *const names[] = {"--rank", "--fd", "--results-fd", "--extra-fd"};
    if (argc != 9)
        return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(argv[1 + 2 * i], names[i]) != 0 ||
            cli_parse_int("bench-worker", names[i], argv[2 + 2 * i], &v[i]) != 0)
            return -1;
    return v[0] >= 0 && v[0] < BENCH_MAX_RANKS ? 0 : -1;
}

/* A consumer process of `ferry bench`: dies with the producer, never outlives it waiting. */
int cmd_bench_worker(int argc, char **argv)
{
    bench_worker w;
    int64_t v[4];
    memset(&w, 0, sizeof(w));
    if (worker_args(argc, argv, v) != 0) {
        fprintf(stderr, "ferry bench-worker: internal command of 'ferry bench'\n");
        return CLI_EXIT_USAGE;
    }
    w.rank = (uint32_t)v[0];
    w.sock = (int)v[1];
    w.region.fd = (int)v[2];
    w.extra_fd = (int)v[3];
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* the handover's reclaim phase sleeps 0-200 us */
    return worker_serve(&w, modes, NMODES);
}
