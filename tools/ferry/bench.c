/* `ferry bench` and its hidden worker command: the modes, and one run from the command line
 * to the report. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench.h"

static const bench_mode *const modes[] = {&handover_mode, &channel_mode, &rtt_mode,
                                          &stream_mode,   &cpu_mode,     &remote_mode};
#define NMODES (sizeof(modes) / sizeof(modes[0]))

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
    run.region.fd = -1;
    for (uint32_t r = 0; r < BENCH_MAX_RANKS; r++) /* closed at the end, a failed prepare too */
        run.children[r].sock = -1;
    run.log_muted = opt.quiet;
    while (modes[run.params.mode] != mode) /* the workers look their mode up by index */
        run.params.mode++;
    run.params.seed = opt.seed;
    run.params.timeout_ns = (uint64_t)opt.timeout_ms * 1000000ull;
    ferry_set_log(run_library_log, &run.log_muted);
    int failed = mode->prepare(&run) != 0 || harness_start(&run) != 0 || mode->measure(&run) != 0 ||
                 harness_finish(&run) != 0;
    if (failed) {
        harness_kill(&run);
        fprintf(stderr, "ferry bench: %s\n", run.error);
        rc = CLI_EXIT_FAIL;
    } else {
        (opt.json ? mode->report_json : mode->report_text)(&run);
        rc = verdict(&run, !run.incomplete);
    }
    mode->release(&run, failed);
    harness_close(&run);
    ferry_set_log(NULL, NULL);
    return rc;
}

/* A consumer process of `ferry bench`: dies with the producer, never outlives it waiting. */
int cmd_bench_worker(int argc, char **argv)
{
    static const char *const names[] = {"--rank", "--fd", "--results-fd"};
    int64_t v[3] = {0};
    int ok = argc == 7;
    for (int i = 0; ok && i < 3; i++)
        ok = strcmp(argv[1 + 2 * i], names[i]) == 0 &&
             cli_parse_int("bench-worker", names[i], argv[2 + 2 * i], &v[i]) == 0;
    if (!ok || v[0] < 0 || v[0] >= BENCH_MAX_RANKS) {
        fprintf(stderr, "ferry bench-worker: internal command of 'ferry bench'\n");
        return CLI_EXIT_USAGE;
    }
    bench_worker w = {.rank = (uint32_t)v[0], .sock = (int)v[1], .region.fd = (int)v[2]};
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* the handover's reclaim phase sleeps 0-200 us */
    return worker_serve(&w, modes, NMODES);
}
