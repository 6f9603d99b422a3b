/* ferry: the command-line tool. Dispatch, help, and the small commands: doctor,
 * split-budget, version. `bench` is bench.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct command {
    const char *name, *args, *help;
    int (*run)(int argc, char **argv);
} command;

static int cmd_doctor(int argc, char **argv);
static int cmd_split_budget(int argc, char **argv);
static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const command commands[] = {
    {"bench", "[OPTIONS]",
     "hand items from one producer to N consumer processes through a\n"
     "ferry pool, verify every byte, and compare with a floor without\n"
     "pool logic (--backend cuda_ipc or cuda_vmm: the GPU benchmarks)",
     cmd_bench},
    {"doctor", "[--json]",
     "probe this machine's GPUs, driver and MPS for ferry and say\n"
     "which transport ferry would pick, and why",
     cmd_doctor},
    {"split-budget", "TOTAL WORKERS",
     "print one tokenizer worker's share of a node's pool budget\n"
     "(TOTAL is a size, e.g. 8GiB)",
     cmd_split_budget},
    {"version", "", "print the library version (also ferry --version)", cmd_version},
    {"help", "[COMMAND]", "print this text, or a command's", cmd_help},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry COMMAND [OPTIONS]\n       ferry --help | --version\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        char left[64];
        snprintf(left, sizeof(left), "%s %s", commands[i].name, commands[i].args);
        fprintf(f, "  %-28s ", left);
        for (const char *p = commands[i].help; *p; p++)
            *p == '\n' ? fprintf(f, "\n%31s", "") : fputc(*p, f);
        fputc('\n', f);
    }
    fprintf(f, "\n'ferry COMMAND --help' says more; sizes take the units B, KiB, MiB, GiB, KB, "
               "MB, GB.\n");
}

/* `ferry NAME --help`: its line of the usage. */
static int command_help(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) {
            printf("usage: ferry %s %s\n\n%s\n", name, commands[i].args, commands[i].help);
            return CLI_EXIT_OK;
        }
    fprintf(stderr, "ferry help: unknown command '%s'\n", name);
    return CLI_EXIT_USAGE;
}

/* Refuses, in order, arguments a command does not take; handles --help. -1: go on. */
static int plain_args(const char *name, int argc, char **argv, int nargs, const char *flag,
                      int *flag_set)
{
    const char *why = NULL, *arg = NULL;
    int positional = 0;
    for (int i = 1; i < argc && !why; i++) {
        arg = argv[i];
        if (cli_is_help(arg))
            return command_help(name);
        if (flag && strcmp(arg, flag) == 0)
            *flag_set = 1;
        else if (nargs == 0 && arg[0] == '-' && arg[1])
            why = "unknown option";
        else if (++positional > nargs)
            why = "unexpected argument";
    }
    if (why)
        fprintf(stderr, "ferry %s: %s '%s'\n", name, why, arg);
    else if (positional < nargs) /* only split-budget has operands */
        fprintf(stderr, "ferry %s: expected TOTAL WORKERS\n", name);
    else
        return -1;
    fprintf(stderr, "Run 'ferry %s --help' for the options.\n", name);
    return CLI_EXIT_USAGE;
}

/* The library's report, sized by a first call. */
static int cmd_doctor(int argc, char **argv)
{
    int json = 0, rc = plain_args("doctor", argc, argv, 0, "--json", &json);
    size_t needed = 0;
    char *text = NULL;
    const char *why = NULL;
    if (rc >= 0)
        return rc;
    if (ferry_doctor_report(json, NULL, 0, &needed) != FERRY_OK)
        why = ferry_last_error();
    else if (!(text = malloc(needed + 1)))
        why = "out of memory";
    else if (ferry_doctor_report(json, text, needed + 1, NULL) != FERRY_OK)
        why = ferry_last_error();
    else if (fputs(text, stdout) < 0 || fflush(stdout) != 0 || ferror(stdout))
        why = "cannot write the report";
    free(text);
    if (why)
        fprintf(stderr, "ferry doctor: %s\n", why);
    return why ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

static int cmd_split_budget(int argc, char **argv)
{
    int64_t total, workers, share;
    int rc = plain_args("split-budget", argc, argv, 2, NULL, NULL);
    if (rc >= 0)
        return rc;
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

static int cmd_version(int argc, char **argv)
{
    int rc = plain_args("version", argc, argv, 0, NULL, NULL);
    if (rc >= 0)
        return rc;
    printf("ferry %s\n", ferry_version());
    return CLI_EXIT_OK;
}

/* `ferry help [COMMAND]`. */
static int cmd_help(int argc, char **argv)
{
    if (argc == 2 && !cli_is_help(argv[1]))
        return command_help(argv[1]);
    usage(stdout);
    return CLI_EXIT_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2 || cli_is_help(argv[1]))
        return cmd_help(1, argv);
    if (strcmp(argv[1], "--version") == 0)
        return cmd_version(1, argv);
    if (strcmp(argv[1], "bench-worker") == 0) /* hidden: a consumer process of `ferry bench` */
        return cmd_bench_worker(argc - 1, argv + 1);
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ferry: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
