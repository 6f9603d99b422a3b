/* Time and futex helpers of the CLI (processes of one machine share CLOCK_MONOTONIC). */
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

uint64_t cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct timespec to_timespec(uint64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

void cli_sleep_ns(uint64_t ns)
{
    struct timespec ts = to_timespec(ns), rem;
    while (nanosleep(&ts, &rem) != 0 && errno == EINTR)
        ts = rem;
}

void cli_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts = to_timespec(timeout_ns);
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void cli_futex_wake(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}
