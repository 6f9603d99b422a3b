/* Sleeping on a shared 32-bit word, and the public clock and futex of ferry.h. */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/futex.h"
#include "ferry.h"

int ferry__futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000ull),
                          .tv_nsec = (long)(timeout_ns % 1000000000ull)};
    return (int)syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void ferry__futex_wake_all(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

uint64_t ferry_now_ns(void)
{
    return ferry__now_ns();
}

void ferry_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    ferry__futex_wait(word, expected, timeout_ns);
}

void ferry_futex_wake(uint32_t *word)
{
    ferry__futex_wake_all(word);
}
