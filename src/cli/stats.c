/* Percentiles of latency samples. */
#include <math.h>
#include <stdlib.h>

#include "cli/cli.h"

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least p% of the samples at or below it. */
static uint64_t nearest_rank(const uint64_t *sorted, size_t n, double p)
{
    double rank = ceil(p / 100.0 * (double)n);
    size_t idx = rank < 1.0 ? 0 : (size_t)rank - 1;
    return sorted[idx < n ? idx : n - 1];
}

uint64_t cli_percentile_sorted(uint64_t *values, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(values, n, sizeof(*values), compare_u64);
    return nearest_rank(values, n, p);
}

void cli_p50_p99_us(uint64_t *ns_values, size_t n, double *p50_us, double *p99_us)
{
    if (n == 0) {
        *p50_us = NAN;
        *p99_us = NAN;
        return;
    }
    qsort(ns_values, n, sizeof(*ns_values), compare_u64);
    *p50_us = (double)nearest_rank(ns_values, n, 50.0) / 1e3;
    *p99_us = (double)nearest_rank(ns_values, n, 99.0) / 1e3;
}
