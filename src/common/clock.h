/* Monotonic time in nanoseconds, comparable across processes of one machine. */
#ifndef FERRY_COMMON_CLOCK_H
#define FERRY_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ferry__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Deadline for a timeout, saturating at UINT64_MAX. */
static inline uint64_t ferry__deadline(uint64_t timeout_ns)
{
    if (timeout_ns == UINT64_MAX) /* forever: no need to read the clock */
        return UINT64_MAX;
    uint64_t now = ferry__now_ns();
    return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

#endif
