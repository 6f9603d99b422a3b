/* The options of `ferry bench`: one table for every mode. --backend picks the family (host:
 * the handover; cuda_ipc, cuda_vmm: the GPU modes, --mode), --mode remote a family of its own
 * (any backend); the family says which options apply, the mode fills the defaults and checks
 * its limits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

typedef enum kind { K_INT, K_SIZE, K_U64, K_FLAG, K_STR, K_SIZES, K_DEVICES, K_CONTROL } kind;

typedef struct spec {
    const char *name, *arg;
    kind kind;
    size_t offset;
    unsigned families;
    const char *help;
} spec;

#define BOTH   (FAMILY_HOST | FAMILY_GPU)
#define ALL    (FAMILY_HOST | FAMILY_GPU | FAMILY_REMOTE)
#define REMOTE FAMILY_REMOTE
#define GPU_R  (FAMILY_GPU | FAMILY_REMOTE)
#define O(name, arg, k, field, fam, help)                                                          \
    {                                                                                              \
        name, arg, k, offsetof(bench_opts, field), fam, help                                       \
    }

static const spec specs[] = {
    O("--backend", "NAME", K_STR, backend_name, ALL,
      "host (default): the handover; cuda_ipc, cuda_vmm: the GPU modes"),
    O("--mode", "MODE", K_STR, mode_name, ALL,
      "host: handover (default), channel: send/recv round trip; GPU: rtt (default): round "
      "trip, stream: throughput, cpu: CPU cost per call; any backend: remote: consumers over "
      "UCX"),
    O("--consumers", "N", K_INT, consumers, ALL,
      "consumer processes (host 4; GPU 1 or one per --consumer-devices entry; remote 1)"),
    O("--items", "N", K_INT, items, ALL,
      "items handed over (host 2000; channel: timed round trips of each kind, 2000, after a "
      "tenth as many untimed; stream 200; remote: of the largest --item-size, as many bytes "
      "of each smaller one, 16)"),
    O("--item-size", "SIZE", K_SIZES, sizes, ALL,
      "host: SIZE or LO-HI, log-uniform (256KiB-4MiB); GPU, remote: SIZE[,SIZE...] (rtt "
      "4KiB,1MiB; stream 64MiB; cpu 4KiB; remote 1MiB,4MiB,16MiB,64MiB)"),
    O("--pool-size", "SIZE", K_SIZE, pool_size, ALL,
      "pool memory, control table included (host, remote 256MiB; rtt, cpu 64MiB; stream "
      "1GiB)"),
    O("--max-inflight", "N", K_INT, max_inflight, ALL,
      "rows of the control table (host 4096; rtt, stream, remote 64; cpu 1024)"),
    O("--reclaim-interval-us", "N", K_INT, reclaim_interval_us, ALL,
      "background reclaim period (1000; rtt 1000000)"),
    O("--seed", "S", K_U64, seed, ALL, "seed of sizes and payloads (1)"),
    O("--timeout-ms", "N", K_INT, timeout_ms, ALL, "limit of every single wait (10000)"),
    O("--rounds", "N", K_INT, rounds, ALL,
      "host, rtt, remote: ferry and floor alternate in N chunks (4)"),
    O("--reclaim-rounds", "N", K_INT, reclaim_rounds, FAMILY_HOST,
      "rounds of the reclaim-delay phase, 0 to skip (300)"),
    O("--no-floor", NULL, K_FLAG, no_floor, FAMILY_HOST, "skip the floor"),
    O("--iterations", "N", K_INT, iterations, GPU_R,
      "rtt, remote: timed round trips (1000); cpu: calls (10000)"),
    O("--warmup", "N", K_INT, warmup, GPU_R,
      "untimed round trips (rtt, remote 100) or items (stream 8)"),
    O("--verify-every", "N", K_INT, verify_every, GPU_R,
      "check every Nth item (rtt 100; stream, cpu 1); remote: every Nth in full (10)"),
    O("--floor-copies", "N", K_INT, floor_copies, FAMILY_GPU,
      "stream: copies each floor times (0: about 4 GiB worth)"),
    O("--control", "WHERE", K_CONTROL, placements, FAMILY_GPU,
      "host (default), device or both: where the pool keeps its control words"),
    O("--producer-device", "P", K_INT, producer_device, GPU_R, "the pool's GPU (0)"),
    O("--consumer-device", "D", K_INT, consumer_device, GPU_R, "the consumers' GPU (0)"),
    O("--consumer-devices", "D[,D...]", K_DEVICES, devices, FAMILY_GPU,
      "one GPU for all consumers, or one per consumer"),
    O("--latency-size", "SIZE", K_SIZE, latency_size, REMOTE,
      "the items of the latency rows (4KiB)"),
    O("--listen", "HOST:PORT", K_STR, listen, REMOTE,
      "where the pool listens for its consumers (127.0.0.1:0)"),
    O("--worker-netns", "NAME", K_STR, worker_netns, REMOTE,
      "the consumers run in that network namespace (ip netns exec; as root)"),
    O("--worker-net-devices", "DEV[,DEV...]", K_STR, net_devices, REMOTE,
      "the consumers' UCX_NET_DEVICES (with --worker-netns: the namespace's own devices)"),
    O("--consumer-memory", "WHERE", K_STR, memory_name, REMOTE,
      "host, device or both: where consumers read into (host; GPU backends both)"),
    O("--json", NULL, K_FLAG, json, ALL, "one JSON object on stdout, nothing else"),
    O("--quiet", NULL, K_FLAG, quiet, ALL, "no progress lines, no library warnings"),
};
#define NSPECS (sizeof(specs) / sizeof(specs[0]))

/* "[host] ", "[GPU, remote] ", or "" for an option of every family. */
static void family_tag(unsigned families, char *buf, size_t size)
{
    static const char *const names[] = {"host", "GPU", "remote"};
    size_t used = 0;
    buf[0] = '\0';
    if (families == ALL)
        return;
    for (unsigned i = 0; i < 3; i++)
        if (families & (1u << i))
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? ", " : "[", names[i]);
    snprintf(buf + used, size - used, "] ");
}

void bench_help(void)
{
    printf("usage: ferry bench [OPTIONS]\n\n"
           "Hands items from one producer to consumer processes through a ferry pool, checks\n"
           "the data, and measures ferry against a floor without pool logic in the same run.\n"
           "Defaults in parentheses (docs/cli.md); sizes take B, KiB, MiB, GiB, KB, MB, GB.\n\n");
    for (size_t i = 0; i < NSPECS; i++) {
        char left[64], tag[32];
        snprintf(left, sizeof(left), "%s%s%s", specs[i].name, specs[i].arg ? " " : "",
                 specs[i].arg ? specs[i].arg : "");
        family_tag(specs[i].families, tag, sizeof(tag));
        printf("  %-30s %s%s\n", left, tag, specs[i].help);
    }
}

void bench_default(int64_t *v, int64_t value)
{
    if (*v == BENCH_UNSET)
        *v = value;
}

static __attribute__((format(printf, 1, 2))) int usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ferry bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return -1;
}

/* Splits a comma-separated list into at most max items of up to 63 characters. */
static int split_list(const char *opt, const char *text, char items[][64], uint32_t max,
                      uint32_t *n)
{
    *n = 0;
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (*n == max || len == 0 || len >= 64)
            return usage("invalid %s '%s': a comma-separated list of values", opt, text);
        memcpy(items[*n], p, len);
        items[(*n)++][len] = '\0';
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

/* host: SIZE or LO-HI, the range's ends (a lone SIZE is both, parsed twice); GPU, remote:
 * SIZE[,SIZE...]. Positive sizes. */
static int parse_sizes(const char *text, unsigned family, bench_opts *o)
{
    char items[BENCH_MAX_SIZES][64];
    if (family != FAMILY_HOST) {
        if (split_list("--item-size", text, items, BENCH_MAX_SIZES, &o->nsizes) != 0)
            return -1;
    } else {
        const char *dash = text[0] ? strchr(text + 1, '-') : NULL;
        int range = dash && dash - text < 64;
        size_t len = range ? (size_t)(dash - text) : strnlen(text, 63);
        memcpy(items[0], text, len);
        items[0][len] = '\0';
        if (range)
            snprintf(items[1], sizeof(items[1]), "%s", dash + 1);
        else
            memcpy(items[1], items[0], sizeof(items[1]));
        o->nsizes = 2;
    }
    for (uint32_t i = 0; i < o->nsizes; i++) {
        int64_t v;
        if (cli_parse_size("bench", "--item-size", items[i], &v) != 0)
            return -1;
        if (v <= 0)
            return usage("invalid --item-size '%s': sizes must be positive", text);
        o->sizes[i] = (uint64_t)v;
    }
    if (family == FAMILY_HOST && o->sizes[0] > o->sizes[1])
        return usage("invalid --item-size '%s': the range's low end exceeds its high end", text);
    return 0;
}

static int parse_devices(const char *text, bench_opts *o)
{
    char items[BENCH_MAX_RANKS][64];
    if (split_list("--consumer-devices", text, items, BENCH_MAX_RANKS, &o->ndevices) != 0)
        return -1;
    for (uint32_t i = 0; i < o->ndevices; i++)
        if (cli_parse_int("bench", "--consumer-devices", items[i], &o->devices[i]) != 0)
            return -1;
    return 0;
}

static int parse_control(const char *text, bench_opts *o)
{
    static const char *const names[] = {"host", "device", "both"};
    for (int i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) {
            o->placements[0] = i == 1 ? FERRY_CONTROL_DEVICE : FERRY_CONTROL_HOST;
            o->placements[1] = FERRY_CONTROL_DEVICE;
            o->nplacements = i == 2 ? 2 : 1;
            return 0;
        }
    return usage("invalid --control '%s': expected host, device or both", text);
}

static int store(const spec *s, const char *value, unsigned family, bench_opts *o)
{
    void *field = (char *)o + s->offset;
    switch (s->kind) {
    case K_INT:
        return cli_parse_int("bench", s->name, value, field);
    case K_SIZE:
        return cli_parse_size("bench", s->name, value, field);
    case K_U64:
        return cli_parse_u64("bench", s->name, value, field);
    case K_STR:
        *(const char **)field = value;
        return 0;
    case K_SIZES:
        return parse_sizes(value, family, o);
    case K_DEVICES:
        return parse_devices(value, o);
    case K_CONTROL:
        return parse_control(value, o);
    case K_FLAG:
        *(int *)field = 1;
        return 0;
    }
    return -1;
}

/* "--backend host", "--backend cuda_ipc and cuda_vmm, and of --mode remote", ... */
static void families_text(unsigned families, char *buf, size_t size)
{
    static const char *const names[] = {"--backend host", "--backend cuda_ipc and cuda_vmm",
                                        "--mode remote"};
    size_t used = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < 3; i++)
        if (families & (1u << i))
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? ", and of " : "",
                                     names[i]);
}

/* argv[*i]; advances *i past a separate value. */
static int parse_one(int argc, char **argv, int *i, unsigned family, bench_opts *o)
{
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const spec *s = specs;
    while (s < specs + NSPECS && (strlen(s->name) != len || strncmp(arg, s->name, len) != 0))
        s++;
    if (s == specs + NSPECS)
        return usage("unknown option '%s'", arg);
    if (!(s->families & family)) {
        char owners[128];
        families_text(s->families, owners, sizeof(owners));
        if (family == FAMILY_REMOTE)
            return usage("%s does not apply to --mode remote (it is an option of %s)", s->name,
                         owners);
        return usage("%s does not apply to --backend %s (it is an option of %s)", s->name,
                     o->backend_name, owners);
    }
    if (s->kind == K_FLAG && eq)
        return usage("%s takes no value", s->name);
    if (s->kind != K_FLAG && !eq && *i + 1 >= argc)
        return usage("%s needs a value", s->name);
    return store(s, s->kind == K_FLAG ? NULL : eq ? eq + 1 : argv[++*i], family, o);
}

/* The value of --backend or --mode, looked for before the rest is parsed. */
static const char *prescan(int argc, char **argv, const char *name, const char *fallback)
{
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], name) == 0 && i + 1 < argc)
            fallback = argv[++i];
        else if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=')
            fallback = argv[i] + n + 1;
    }
    return fallback;
}

static int pick_mode(bench_opts *o, unsigned family, const bench_mode *const *modes, size_t nmodes,
                     const bench_mode **mode)
{
    const char *want = o->mode_name ? o->mode_name : family == FAMILY_HOST ? "handover" : "rtt";
    for (size_t i = 0; i < nmodes; i++)
        if (modes[i]->family == family && strcmp(modes[i]->name, want) == 0) {
            *mode = modes[i];
            return 0;
        }
    return usage("invalid --mode '%s': expected %s", want,
                 family == FAMILY_HOST ? "handover, channel or remote"
                                       : "rtt, stream, cpu or remote");
}

/* The options every mode hands to the library, named as the user typed them. */
static int check_common(const bench_opts *o)
{
    const struct {
        const char *name;
        int64_t v;
    } positive[] = {
        {"--consumers", o->consumers},       {"--pool-size", o->pool_size},
        {"--max-inflight", o->max_inflight}, {"--reclaim-interval-us", o->reclaim_interval_us},
        {"--timeout-ms", o->timeout_ms},     {"--items", o->items}};
    for (size_t i = 0; i < sizeof(positive) / sizeof(positive[0]); i++)
        if (positive[i].v <= 0)
            return usage("%s must be positive", positive[i].name);
    return o->consumers > BENCH_MAX_RANKS ? usage("--consumers must be at most %d", BENCH_MAX_RANKS)
                                          : 0;
}

/* The mode's defaults d where the user gave nothing. */
static void apply_defaults(const bench_opts *d, bench_opts *o)
{
    for (size_t i = 0; i < NSPECS; i++)
        if (specs[i].kind == K_INT || specs[i].kind == K_SIZE)
            bench_default((int64_t *)((char *)o + specs[i].offset),
                          *(const int64_t *)((const char *)d + specs[i].offset));
    if (!o->nsizes) {
        memcpy(o->sizes, d->sizes, sizeof(o->sizes));
        o->nsizes = d->nsizes;
    }
}

/* Every number option unset (the mode's defaults fill them), the rest at its default. */
static void init(bench_opts *o)
{
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < NSPECS; i++)
        if (specs[i].kind == K_INT || specs[i].kind == K_SIZE)
            *(int64_t *)((char *)o + specs[i].offset) = BENCH_UNSET;
    o->seed = 1;
    o->placements[0] = FERRY_CONTROL_HOST;
    o->nplacements = 1;
}

int bench_parse_options(int argc, char **argv, const bench_mode *const *modes, size_t nmodes,
                        bench_opts *o, const bench_mode **mode)
{
    init(o);
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            bench_help();
            return -1;
        }
    o->backend_name = prescan(argc, argv, "--backend", "host");
    o->mode_name = prescan(argc, argv, "--mode", NULL);
    if (ferry_backend_parse(o->backend_name, &o->backend) != FERRY_OK) {
        usage("--backend %s: %s", o->backend_name, ferry_last_error());
        goto usage_error;
    }
    unsigned family = o->mode_name && strcmp(o->mode_name, "remote") == 0 ? FAMILY_REMOTE
                      : ferry_backend_uses_gpu(o->backend)                ? FAMILY_GPU
                                                                          : FAMILY_HOST;
    for (int i = 1; i < argc; i++)
        if (parse_one(argc, argv, &i, family, o) != 0)
            goto usage_error;
    if (pick_mode(o, family, modes, nmodes, mode) != 0)
        goto usage_error;
    apply_defaults((*mode)->defaults, o);
    if ((*mode)->adjust)
        (*mode)->adjust(o);
    if (check_common(o) != 0 || (*mode)->check(o) != 0)
        return CLI_EXIT_USAGE;
    return 0;
usage_error:
    fprintf(stderr, "Run 'ferry bench --help' for the options.\n");
    return CLI_EXIT_USAGE;
}
