/* The ferry command-line tool: exit codes and the small helpers every command uses (util.c).
 * The tool includes nothing of the library but ferry.h. */
#ifndef FERRY_TOOL_CLI_H
#define FERRY_TOOL_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define CLI_EXIT_OK    0
#define CLI_EXIT_FAIL  1
#define CLI_EXIT_USAGE 2

/* Parses a size with an optional unit (B, KiB, MiB, GiB, KB, MB, GB; case-insensitive, a
 * decimal fraction allowed: "1.5MiB"). Negative values parse. Returns 0, or -1 after printing
 * "ferry CMD: invalid WHAT 'TEXT': why" to stderr. */
int cli_parse_size(const char *cmd, const char *what, const char *text, int64_t *out);
/* A decimal integer (optionally negative), or an unsigned one (any base strtoull takes). */
int cli_parse_int(const char *cmd, const char *what, const char *text, int64_t *out);
int cli_parse_u64(const char *cmd, const char *what, const char *text, uint64_t *out);
/* "256KiB", "1.50MiB", "1000B". */
void cli_format_size(uint64_t bytes, char *buf, size_t size);
/* Whether arg is --help or -h. */
int cli_is_help(const char *arg);

/* CLOCK_MONOTONIC (shared by the processes of one machine), CPU time of this thread, sleeps,
 * and a process-shared futex on a 32-bit word. */
uint64_t cli_now_ns(void);
uint64_t cli_thread_cpu_ns(void);
void cli_sleep_ns(uint64_t ns);
void cli_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns);
void cli_futex_wake(uint32_t *word);

uint64_t cli_mix64(uint64_t x); /* splitmix64's finaliser */
/* p50 and p99 (nearest rank) of ns_values, sorted in place, in microseconds; NAN if n == 0. */
void cli_p50_p99_us(uint64_t *ns_values, size_t n, double *p50_us, double *p99_us);
/* "key": v with three decimals (null when not finite), then after. */
void cli_json_num(const char *key, double v, const char *after);

/* Commands (main.c dispatches). */
int cmd_bench(int argc, char **argv);
int cmd_bench_worker(int argc, char **argv);

#endif
