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

#endif
