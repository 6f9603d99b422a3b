/* Shared helpers of the C tests: helper processes and deterministic data. */
#ifndef FERRY_TESTS_HELPERS_H
#define FERRY_TESTS_HELPERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Fills buf with bytes derived from seed (xorshift), so that any reader can check them. */
void th_fill(void *buf, size_t n, uint64_t seed);

/* Returns 1 if buf holds exactly what th_fill(buf, n, seed) wrote. */
int th_check(const void *buf, size_t n, uint64_t seed);

/* An item's pattern: its seed in the first 8 bytes (when n >= 8), th_fill(seed) after them,
 * so that a reader that got another item's bytes can tell whose they are. */
void th_stamp(void *buf, size_t n, uint64_t seed);

/* Returns 1 if buf holds exactly what th_stamp(buf, n, seed) wrote; otherwise 0, and *found
 * (may be NULL) gets the seed in the first 8 bytes (0 when n < 8). */
int th_check_stamp(const void *buf, size_t n, uint64_t seed, uint64_t *found);

/* How much of the full iteration counts stress tests run: FERRY_STRESS_SCALE if set (a
 * positive number), else 1, or less under a sanitizer (TSan 0.1, ASan 0.25). */
double th_stress_scale(void);

/* 1 in a sanitizer build (whose allocator keeps freed memory in quarantine, so that resident
 * memory says nothing of leaks: LeakSanitizer does). */
int th_sanitized(void);

/* n scaled by th_stress_scale(), at least min. */
uint64_t th_scaled(uint64_t n, uint64_t min);

/* The descriptors this process has open (the listing's own left out); -1 if /proc/self/fd
 * cannot be read. */
int th_count_fds(void);

/* The number after the field name (with its colon: "Threads:", "VmRSS:") in
 * /proc/self/status; -1 if there is none. */
long th_status_field(const char *name);

/* The process's threads once they are want or fewer, looked at every millisecond for up to a
 * second: a thread UCX stops (its async thread, after the last worker that used it) may still
 * be leaving when the caller looks, or may have been when want was counted. A thread leaked
 * per cycle stays, and the count stays above want. */
long th_threads_settled(long want);

#endif
