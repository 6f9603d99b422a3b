/* Argument parsing: sizes with units, size ranges, integers and the options of `ferry bench`. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define GIB (1024ull * 1024ull * 1024ull)

typedef struct size_unit {
    const char *name;
    uint64_t bytes;
} size_unit;

static const size_unit size_units[] = {
    {"", 1},      {"b", 1},        {"kib", KIB},       {"mib", MIB},
    {"gib", GIB}, {"kb", 1000ull}, {"mb", 1000000ull}, {"gb", 1000000000ull},
};

static int size_error(const char *cmd, const char *what, const char *text, const char *why)
{
    fprintf(stderr,
            "ferry %s: invalid %s '%s': %s (a size such as 4096, 256KiB, 1.5MiB or 2GB; units "
            "B, KiB, MiB, GiB, KB, MB, GB)\n",
            cmd, what, text, why);
    return -1;
}

static int unit_bytes(const char *unit, uint64_t *bytes)
{
    for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++) {
        if (strcasecmp(unit, size_units[i].name) == 0) {
            *bytes = size_units[i].bytes;
            return 0;
        }
    }
    return -1;
}

/* Reads digits at *p into *value (at most max_digits when max_digits > 0). */
static int read_digits(const char **p, uint64_t *value, int *ndigits, int max_digits)
{
    uint64_t v = 0;
    int n = 0;
    while (**p >= '0' && **p <= '9') {
        if (max_digits > 0 && n == max_digits)
            return -1;
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(**p - '0');
        (*p)++;
        n++;
    }
    *value = v;
    *ndigits = n;
    return 0;
}

static uint64_t pow10u(int n)
{
    uint64_t v = 1;
    while (n-- > 0)
        v *= 10;
    return v;
}

int cli_parse_size(const char *cmd, const char *what, const char *text, int64_t *out)
{
    const char *p = text;
    uint64_t whole = 0, frac = 0, mult;
    int nwhole = 0, nfrac = 0, negative = (*p == '-');
    p += negative;
    if (read_digits(&p, &whole, &nwhole, 0) != 0)
        return size_error(cmd, what, text, "too large");
    if (*p == '.') {
        p++;
        if (read_digits(&p, &frac, &nfrac, 9) != 0 || nfrac == 0)
            return size_error(cmd, what, text, "bad fraction");
    }
    if (nwhole == 0 && nfrac == 0)
        return size_error(cmd, what, text, "no number");
    if (unit_bytes(p, &mult) != 0)
        return size_error(cmd, what, text, "unknown unit");
    if (whole > (uint64_t)INT64_MAX / mult)
        return size_error(cmd, what, text, "too large");
    uint64_t scale = pow10u(nfrac), fbytes = frac * mult;
    if (fbytes % scale != 0)
        return size_error(cmd, what, text, "not a whole number of bytes");
    uint64_t bytes = whole * mult + fbytes / scale;
    if (bytes > (uint64_t)INT64_MAX)
        return size_error(cmd, what, text, "too large");
    *out = negative ? -(int64_t)bytes : (int64_t)bytes;
    return 0;
}

int cli_parse_size_range(const char *cmd, const char *what, const char *text, cli_size_range *out)
{
    char lo_text[64];
    const char *dash = text[0] ? strchr(text + 1, '-') : NULL;
    int64_t lo, hi;
    if (!dash) {
        if (cli_parse_size(cmd, what, text, &lo) != 0)
            return -1;
        hi = lo;
    } else {
        size_t n = (size_t)(dash - text);
        if (n >= sizeof(lo_text))
            return size_error(cmd, what, text, "too long");
        memcpy(lo_text, text, n);
        lo_text[n] = '\0';
        if (cli_parse_size(cmd, what, lo_text, &lo) != 0 ||
            cli_parse_size(cmd, what, dash + 1, &hi) != 0)
            return -1;
    }
    if (lo <= 0 || hi <= 0)
        return size_error(cmd, what, text, "sizes must be positive");
    if (lo > hi)
        return size_error(cmd, what, text, "the range's low end exceeds its high end");
    out->lo = (uint64_t)lo;
    out->hi = (uint64_t)hi;
    return 0;
}

int cli_parse_int(const char *cmd, const char *what, const char *text, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || !text[0] || *end || text[0] == ' ' || text[0] == '+') {
        fprintf(stderr, "ferry %s: invalid %s '%s': expected an integer\n", cmd, what, text);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static int parse_u64(const char *cmd, const char *what, const char *text, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno || !text[0] || *end || text[0] == '-' || text[0] == ' ' || text[0] == '+') {
        fprintf(stderr, "ferry %s: invalid %s '%s': expected an unsigned integer\n", cmd, what,
                text);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

void cli_format_size(uint64_t bytes, char *buf, size_t size)
{
    static const size_unit units[] = {{"GiB", GIB}, {"MiB", MIB}, {"KiB", KIB}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (bytes >= units[i].bytes && bytes % units[i].bytes == 0) {
            snprintf(buf, size, "%llu%s", (unsigned long long)(bytes / units[i].bytes),
                     units[i].name);
            return;
        }
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (bytes >= units[i].bytes) {
            snprintf(buf, size, "%.2f%s", (double)bytes / (double)units[i].bytes, units[i].name);
            return;
        }
    }
    snprintf(buf, size, "%lluB", (unsigned long long)bytes);
}

/* ---- ferry bench's options ---------------------------------------------------------- */

typedef enum opt_kind { OPT_INT, OPT_SIZE, OPT_RANGE, OPT_U64, OPT_STRING, OPT_FLAG } opt_kind;

typedef struct opt_spec {
    const char *name;
    opt_kind kind;
    size_t offset;
} opt_spec;

#define OPT(name, kind, field)                                                                     \
    {                                                                                              \
        name, kind, offsetof(bench_options, field)                                                 \
    }

static const opt_spec bench_specs[] = {
    OPT("--backend", OPT_STRING, backend),
    OPT("--consumers", OPT_INT, consumers),
    OPT("--items", OPT_INT, items),
    OPT("--item-size", OPT_RANGE, item_size),
    OPT("--pool-size", OPT_SIZE, pool_size),
    OPT("--max-inflight", OPT_INT, max_inflight),
    OPT("--reclaim-interval-us", OPT_INT, reclaim_interval_us),
    OPT("--seed", OPT_U64, seed),
    OPT("--timeout-ms", OPT_INT, timeout_ms),
    OPT("--reclaim-rounds", OPT_INT, reclaim_rounds),
    OPT("--rounds", OPT_INT, rounds),
    OPT("--json", OPT_FLAG, json),
    OPT("--no-floor", OPT_FLAG, no_floor),
    OPT("--quiet", OPT_FLAG, quiet),
};

static void bench_defaults(bench_options *o)
{
    memset(o, 0, sizeof(*o));
    o->backend = "host";
    o->consumers = 4;
    o->items = 2000;
    o->item_size.lo = 256 * KIB;
    o->item_size.hi = 4 * MIB;
    o->pool_size = (int64_t)(256 * MIB);
    o->max_inflight = 4096;
    o->reclaim_interval_us = 1000;
    o->seed = 1;
    o->timeout_ms = 10000;
    o->reclaim_rounds = 300;
    o->rounds = 4;
}

static const opt_spec *find_spec(const char *arg, size_t len)
{
    for (size_t i = 0; i < sizeof(bench_specs) / sizeof(bench_specs[0]); i++)
        if (strlen(bench_specs[i].name) == len && strncmp(arg, bench_specs[i].name, len) == 0)
            return &bench_specs[i];
    return NULL;
}

static int store_value(const opt_spec *s, const char *value, bench_options *o)
{
    void *field = (char *)o + s->offset;
    switch (s->kind) {
    case OPT_INT:
        return cli_parse_int("bench", s->name, value, field);
    case OPT_SIZE:
        return cli_parse_size("bench", s->name, value, field);
    case OPT_RANGE:
        return cli_parse_size_range("bench", s->name, value, field);
    case OPT_U64:
        return parse_u64("bench", s->name, value, field);
    case OPT_STRING:
        *(const char **)field = value;
        return 0;
    case OPT_FLAG:
        break;
    }
    return -1;
}

/* Handles argv[*i]; advances *i past a separate value. Returns 0 or -1 (message printed). */
static int parse_one(int argc, char **argv, int *i, bench_options *o)
{
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const opt_spec *s = find_spec(arg, len);
    if (!s) {
        fprintf(stderr, "ferry bench: unknown option '%s'\n", arg);
        return -1;
    }
    if (s->kind == OPT_FLAG) {
        if (eq) {
            fprintf(stderr, "ferry bench: %s takes no value\n", s->name);
            return -1;
        }
        *(int *)((char *)o + s->offset) = 1;
        return 0;
    }
    if (!eq && *i + 1 >= argc) {
        fprintf(stderr, "ferry bench: %s needs a value\n", s->name);
        return -1;
    }
    return store_value(s, eq ? eq + 1 : argv[++*i], o);
}

static int check_cli_limits(const bench_options *o)
{
    if (o->items <= 0 || o->items > (int64_t)UINT32_MAX - 1) {
        fprintf(stderr, "ferry bench: --items must be between 1 and %u\n", UINT32_MAX - 1);
        return -1;
    }
    if (o->timeout_ms <= 0) {
        fprintf(stderr, "ferry bench: --timeout-ms must be positive\n");
        return -1;
    }
    if (o->rounds <= 0 || o->rounds > o->items) {
        fprintf(stderr, "ferry bench: --rounds must be between 1 and --items (%lld)\n",
                (long long)o->items);
        return -1;
    }
    if (o->reclaim_rounds < 0 || o->reclaim_rounds > 1000000) {
        fprintf(stderr, "ferry bench: --reclaim-rounds must be between 0 and 1000000\n");
        return -1;
    }
    return 0;
}

int bench_parse_options(int argc, char **argv, bench_options *opt)
{
    bench_defaults(opt);
    for (int i = 1; i < argc; i++) {
        if (parse_one(argc, argv, &i, opt) != 0) {
            fprintf(stderr, "Run 'ferry help' for the options.\n");
            return CLI_EXIT_USAGE;
        }
    }
    if (check_cli_limits(opt) != 0)
        return CLI_EXIT_USAGE;
    return 0;
}
