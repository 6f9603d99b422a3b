/* Helpers of the ferry tool: sizes and numbers on the command line, CPU time and sleeps,
 * statistics. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

/* The units, lower case, and their bytes ("" is bytes). */
static const char *const unit_names[] = {"", "b", "kib", "mib", "gib", "kb", "mb", "gb"};
static const uint64_t unit_bytes[] = {1,          1,       1ull << 10, 1ull << 20,
                                      1ull << 30, 1000ull, 1000000ull, 1000000000ull};

static int size_error(const char *cmd, const char *what, const char *text, const char *why)
{
    fprintf(stderr,
            "ferry %s: invalid %s '%s': %s (a size such as 4096, 256KiB, 1.5MiB or 2GB; units "
            "B, KiB, MiB, GiB, KB, MB, GB)\n",
            cmd, what, text, why);
    return -1;
}

/* Reads digits at *p (at most max of them when max > 0); -1 on overflow. */
static int read_digits(const char **p, uint64_t *value, int *ndigits, int max)
{
    uint64_t v = 0;
    int n = 0;
    for (; **p >= '0' && **p <= '9'; (*p)++, n++) {
        if ((max > 0 && n == max) || v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(**p - '0');
    }
    *value = v;
    *ndigits = n;
    return 0;
}

int cli_parse_size(const char *cmd, const char *what, const char *text, int64_t *out)
{
    const char *p = text + (text[0] == '-');
    uint64_t whole = 0, frac = 0, mult = 0, scale = 1;
    int nwhole = 0, nfrac = 0;
    if (read_digits(&p, &whole, &nwhole, 0) != 0)
        return size_error(cmd, what, text, "too large");
    if (*p == '.' && (p++, read_digits(&p, &frac, &nfrac, 9) != 0 || nfrac == 0))
        return size_error(cmd, what, text, "bad fraction");
    if (nwhole == 0 && nfrac == 0)
        return size_error(cmd, what, text, "no number");
    for (size_t i = 0; i < sizeof(unit_bytes) / sizeof(unit_bytes[0]); i++)
        if (strcasecmp(p, unit_names[i]) == 0)
            mult = unit_bytes[i];
    if (!mult)
        return size_error(cmd, what, text, "unknown unit");
    if (whole > (uint64_t)INT64_MAX / mult)
        return size_error(cmd, what, text, "too large");
    for (int i = 0; i < nfrac; i++)
        scale *= 10;
    if (frac * mult % scale != 0)
        return size_error(cmd, what, text, "not a whole number of bytes");
    uint64_t bytes = whole * mult + frac * mult / scale;
    if (bytes > (uint64_t)INT64_MAX)
        return size_error(cmd, what, text, "too large");
    *out = text[0] == '-' ? -(int64_t)bytes : (int64_t)bytes;
    return 0;
}

/* strtoll or strtoull, refusing what they would skip or wrap: blanks, a sign (a minus sign
 * in the unsigned case), garbage after the number, a value out of range. */
static int parse_number(const char *cmd, const char *what, const char *text, int is_signed,
                        void *out)
{
    char *end = NULL;
    errno = 0;
    if (is_signed)
        *(int64_t *)out = strtoll(text, &end, 10);
    else
        *(uint64_t *)out = strtoull(text, &end, 0);
    if (!errno && text[0] && !*end && text[0] != ' ' && text[0] != '+' &&
        (is_signed || text[0] != '-'))
        return 0;
    fprintf(stderr, "ferry %s: invalid %s '%s': expected %s\n", cmd, what, text,
            is_signed ? "an integer" : "an unsigned integer");
    return -1;
}

int cli_parse_int(const char *cmd, const char *what, const char *text, int64_t *out)
{
    return parse_number(cmd, what, text, 1, out);
}

int cli_parse_u64(const char *cmd, const char *what, const char *text, uint64_t *out)
{
    return parse_number(cmd, what, text, 0, out);
}

/* In the largest binary unit that divides it, else to two decimals in the largest below it. */
void cli_format_size(uint64_t bytes, char *buf, size_t size)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB"};
    int exact = 3, below = 3;
    while (exact > 0 && (bytes < 1ull << 10 * exact || bytes % (1ull << 10 * exact)))
        exact--;
    while (below > 0 && bytes < 1ull << 10 * below)
        below--;
    if (exact > 0 || below == 0)
        snprintf(buf, size, "%llu%s", (unsigned long long)(bytes >> 10 * exact), names[exact]);
    else
        snprintf(buf, size, "%.2f%s", (double)bytes / (double)(1ull << 10 * below), names[below]);
}

int cli_is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

uint64_t cli_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void cli_sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)},
                    rem;
    while (nanosleep(&ts, &rem) != 0 && errno == EINTR)
        ts = rem;
}

void cli_pattern_fill(uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed, uint64_t key)
{
    uint64_t base = cli_mix64(seed ^ cli_mix64(key + 0x6b657967707531ull));
    for (uint64_t i = 0; i < len;) {
        uint64_t at = off + i, w = cli_mix64(base + at / 8 * 0x9e3779b97f4a7c15ull);
        uint64_t skip = at % 8, n = 8 - skip < len - i ? 8 - skip : len - i;
        memcpy(buf + i, (const uint8_t *)&w + skip, n);
        i += n;
    }
}

uint64_t cli_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least p% of the n > 0 samples at or below it
 * (0 < p < 100, so the rank is 1 to n). */
static double nearest_rank_us(const uint64_t *sorted, size_t n, double p)
{
    return (double)sorted[(size_t)ceil(p / 100.0 * (double)n) - 1] / 1e3;
}

void cli_p50_p99_us(uint64_t *ns_values, size_t n, double *p50_us, double *p99_us)
{
    *p50_us = *p99_us = NAN;
    if (n == 0)
        return;
    qsort(ns_values, n, sizeof(*ns_values), compare_u64);
    *p50_us = nearest_rank_us(ns_values, n, 50.0);
    *p99_us = nearest_rank_us(ns_values, n, 99.0);
}

void cli_json_num(const char *key, double v, const char *after)
{
    if (isfinite(v))
        printf("\"%s\": %.3f%s", key, v, after);
    else
        printf("\"%s\": null%s", key, after);
}

double cli_ratio(double a, double b)
{
    return isfinite(a) && isfinite(b) && b > 0 ? a / b : NAN;
}

void lat_summarize(uint64_t *ns, uint64_t n, uint64_t busy_ns, lat_stats *out)
{
    double sum = 0;
    out->samples = 0;
    for (uint64_t i = 0; i < n; i++)
        if (ns[i]) {
            sum += (double)ns[i];
            ns[out->samples++] = ns[i];
        }
    out->skipped = n - out->samples;
    out->mean_us = out->samples ? sum / (double)out->samples / 1e3 : NAN;
    out->items_per_s = busy_ns ? (double)n * 1e9 / (double)busy_ns : NAN;
    cli_p50_p99_us(ns, out->samples, &out->p50_us, &out->p99_us);
}

void lat_json(const char *key, const lat_stats *l, int counts)
{
    printf("\"%s\": {", key);
    cli_json_num("mean_us", l->mean_us, ", ");
    cli_json_num("p50_us", l->p50_us, ", ");
    cli_json_num("p99_us", l->p99_us, ", ");
    cli_json_num("items_per_s", l->items_per_s, counts ? ", " : "}, ");
    if (counts)
        printf("\"samples\": %llu, \"background_reclaims\": %llu}, ",
               (unsigned long long)l->samples, (unsigned long long)l->skipped);
}
