/* ferry: the command-line tool. Dispatch, help, version and split-budget. */
#include <stdio.h>
#include <string.h>

#include "cli/bench_gpu.h"
#include "cli/cli.h"

static const char usage_text[] =
    "usage: ferry COMMAND [OPTIONS]\n"
    "\n"
    "commands:\n"
    "  bench [OPTIONS]               hand items from one producer to N consumer processes\n"
    "                                through a ferry pool, verify every byte, and compare\n"
    "                                with a plain shared-memory ring (the floor)\n"
    "  doctor [--json]               probe this machine's GPUs, driver and MPS for ferry and\n"
    "                                say which transport ferry would pick, and why\n"
    "  split-budget TOTAL WORKERS    print one tokenizer worker's share of a node's pool\n"
    "                                budget (TOTAL is a size, e.g. 8GiB)\n"
    "  version                       print the library version\n"
    "  help                          print this text\n"
    "\n"
    "bench options:\n"
    "  --backend NAME                pool backend (default host)\n"
    "  --consumers N                 consumer processes (default 4)\n"
    "  --items N                     items to hand over (default 2000)\n"
    "  --item-size SIZE|LO-HI        item size, or a log-uniform range (default 256KiB-4MiB)\n"
    "  --pool-size SIZE              pool memory, control table included (default 256MiB)\n"
    "  --max-inflight N              rows of the pool's control table (default 4096)\n"
    "  --reclaim-interval-us N       background reclaim period (default 1000)\n"
    "  --seed S                      seed of sizes and payloads (default 1)\n"
    "  --timeout-ms N                limit of every single wait (default 10000)\n"
    "  --rounds N                    ferry and floor alternate in N chunks of the items, to\n"
    "                                share the machine's ups and downs (default 4)\n"
    "  --reclaim-rounds N            rounds of the reclaim-delay phase, 0 to skip (default 300)\n"
    "  --no-floor                    skip the floor run\n"
    "  --json                        print one JSON object on stdout\n"
    "  --quiet                       no progress lines\n"
    "\n"
    "bench --backend cuda_ipc options (GPU benchmarks; the host-only options above do not apply):\n"
    "  --mode rtt|stream|cpu         round trip, streaming throughput, or CPU cost per call\n"
    "                                (default rtt)\n"
    "  --item-size SIZE[,SIZE...]    item sizes (rtt 4KiB,1MiB; stream 64MiB; cpu 4KiB)\n"
    "  --control host|device|both    where the pool keeps its control words (default host)\n"
    "  --producer-device P           the pool's GPU (default 0)\n"
    "  --consumer-device D           the consumer's GPU (default 0)\n"
    "  --consumer-devices D[,D...]   rtt, stream: one GPU for all consumers, or one per consumer\n"
    "  --consumers N                 rtt, stream: consumer processes (default 1, or one per\n"
    "                                --consumer-devices entry)\n"
    "  --iterations N                rtt: timed round trips (1000); cpu: calls (10000)\n"
    "  --warmup N                    rtt: untimed round trips (100); stream: untimed items (8)\n"
    "  --items N                     stream: timed items (default 200)\n"
    "  --verify-every N              check every Nth item (rtt 100, stream 1)\n"
    "  --rounds N                    rtt: ferry and floor alternate in N chunks (default 4)\n"
    "  --pool-size, --max-inflight, --reclaim-interval-us, --seed, --timeout-ms, --json, --quiet\n"
    "                                as above (defaults per mode: docs/cli.md)\n"
    "\n"
    "sizes take the units B, KiB, MiB, GiB, KB, MB, GB (e.g. 256KiB, 1.5MiB).\n";

void cli_usage(int to_stderr)
{
    fputs(usage_text, to_stderr ? stderr : stdout);
}

static int cmd_version(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "ferry version: takes no arguments\n");
        return CLI_EXIT_USAGE;
    }
    printf("ferry %s\n", ferry_version());
    return CLI_EXIT_OK;
}

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_usage(0);
    return CLI_EXIT_OK;
}

static int cmd_split_budget(int argc, char **argv)
{
    int64_t total, workers, share;
    if (argc != 3) {
        fprintf(stderr, "ferry split-budget: expected TOTAL WORKERS\n");
        return CLI_EXIT_USAGE;
    }
    if (cli_parse_size("split-budget", "TOTAL", argv[1], &total) != 0 ||
        cli_parse_int("split-budget", "WORKERS", argv[2], &workers) != 0)
        return CLI_EXIT_USAGE;
    if (ferry_split_budget(total, workers, &share) != FERRY_OK) {
        fprintf(stderr, "ferry split-budget: %s\n", ferry_last_error());
        return CLI_EXIT_FAIL;
    }
    printf("%lld\n", (long long)share);
    return CLI_EXIT_OK;
}

typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
} cli_command;

static const cli_command commands[] = {
    {"bench", cmd_bench},
    {"doctor", cmd_doctor},
    {"split-budget", cmd_split_budget},
    {"version", cmd_version},
    {"--version", cmd_version},
    {"help", cmd_help},
    {"--help", cmd_help},
    {"-h", cmd_help},
    {"bench-worker", cmd_bench_worker}, /* hidden: a consumer process of `ferry bench` */
    /* hidden: a consumer process of `ferry bench --backend cuda_ipc` */
    {"bench-gpu-worker", cmd_bench_gpu_worker},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        cli_usage(0);
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ferry: unknown command '%s'\n\n", argv[1]);
    cli_usage(1);
    return CLI_EXIT_USAGE;
}
