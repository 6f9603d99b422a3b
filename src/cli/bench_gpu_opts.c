/* The options of `ferry bench --backend cuda_ipc` and their per-mode defaults. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_gpu.h"

#define KIB 1024ll
#define MIB (1024ll * 1024ll)
#define GIB (1024ll * 1024ll * 1024ll)

typedef enum gk {
    GK_INT,
    GK_SIZE,
    GK_U64,
    GK_FLAG,
    GK_BACKEND,
    GK_MODE,
    GK_SIZES,
    GK_DEVICES,
    GK_CONTROL
} gk;

typedef struct gspec {
    const char *name;
    gk kind;
    size_t offset;
} gspec;

#define GOPT(name, kind, field)                                                                    \
    {                                                                                              \
        name, kind, offsetof(gb_options, field)                                                    \
    }

static const gspec specs[] = {
    GOPT("--backend", GK_BACKEND, backend),
    GOPT("--mode", GK_MODE, mode),
    GOPT("--item-size", GK_SIZES, sizes),
    GOPT("--iterations", GK_INT, iterations),
    GOPT("--warmup", GK_INT, warmup),
    GOPT("--rounds", GK_INT, rounds),
    GOPT("--items", GK_INT, items),
    GOPT("--consumers", GK_INT, consumers),
    GOPT("--verify-every", GK_INT, verify_every),
    GOPT("--floor-copies", GK_INT, floor_copies),
    GOPT("--producer-device", GK_INT, producer_device),
    GOPT("--consumer-device", GK_INT, consumer_device),
    GOPT("--consumer-devices", GK_DEVICES, devices),
    GOPT("--pool-size", GK_SIZE, pool_size),
    GOPT("--max-inflight", GK_INT, max_inflight),
    GOPT("--reclaim-interval-us", GK_INT, reclaim_interval_us),
    GOPT("--timeout-ms", GK_INT, timeout_ms),
    GOPT("--seed", GK_U64, seed),
    GOPT("--control", GK_CONTROL, placements),
    GOPT("--json", GK_FLAG, json),
    GOPT("--quiet", GK_FLAG, quiet),
};

static const char *const mode_names[] = {"rtt", "stream", "cpu"};

const char *gb_mode_name(int mode)
{
    return mode >= 0 && mode <= GB_MODE_CPU ? mode_names[mode] : "?";
}

const char *gb_placement_name(int placement)
{
    return placement == FERRY_CONTROL_DEVICE ? "device" : "host";
}

static int usage_error(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "ferry bench: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return -1;
}

static int parse_mode(const char *text, gb_options *o)
{
    for (int m = 0; m <= GB_MODE_CPU; m++)
        if (strcmp(text, mode_names[m]) == 0) {
            o->mode = m;
            return 0;
        }
    return usage_error("invalid --mode '%s': expected rtt, stream or cpu%s", text, "");
}

static int parse_control(const char *text, gb_options *o)
{
    o->nplacements = 1;
    if (strcmp(text, "host") == 0)
        o->placements[0] = FERRY_CONTROL_HOST;
    else if (strcmp(text, "device") == 0)
        o->placements[0] = FERRY_CONTROL_DEVICE;
    else if (strcmp(text, "both") == 0) {
        o->placements[0] = FERRY_CONTROL_HOST;
        o->placements[1] = FERRY_CONTROL_DEVICE;
        o->nplacements = 2;
    } else
        return usage_error("invalid --control '%s': expected host, device or both%s", text, "");
    return 0;
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
            return usage_error("invalid %s '%s': a comma-separated list of values", opt, text);
        memcpy(items[*n], p, len);
        items[(*n)++][len] = '\0';
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

static int parse_sizes(const char *text, gb_options *o)
{
    char items[GB_MAX_SIZES][64];
    if (split_list("--item-size", text, items, GB_MAX_SIZES, &o->nsizes) != 0)
        return -1;
    for (uint32_t i = 0; i < o->nsizes; i++) {
        int64_t v;
        if (cli_parse_size("bench", "--item-size", items[i], &v) != 0)
            return -1;
        if (v <= 0)
            return usage_error("invalid --item-size '%s': sizes must be positive%s", text, "");
        o->sizes[i] = (uint64_t)v;
    }
    return 0;
}

static int parse_devices(const char *text, gb_options *o)
{
    char items[GB_MAX_RANKS][64];
    if (split_list("--consumer-devices", text, items, GB_MAX_RANKS, &o->ndevices) != 0)
        return -1;
    for (uint32_t i = 0; i < o->ndevices; i++)
        if (cli_parse_int("bench", "--consumer-devices", items[i], &o->devices[i]) != 0)
            return -1;
    return 0;
}

static int parse_u64(const char *text, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno || !text[0] || *end || text[0] == '-' || text[0] == ' ' || text[0] == '+')
        return usage_error("invalid --seed '%s': expected an unsigned integer%s", text, "");
    *out = (uint64_t)v;
    return 0;
}

static int store(const gspec *s, const char *value, gb_options *o)
{
    void *field = (char *)o + s->offset;
    switch (s->kind) {
    case GK_INT:
        return cli_parse_int("bench", s->name, value, field);
    case GK_SIZE:
        return cli_parse_size("bench", s->name, value, field);
    case GK_U64:
        return parse_u64(value, field);
    case GK_BACKEND:
        if (ferry_backend_parse(value, &o->backend) == FERRY_OK &&
            (o->backend == FERRY_BACKEND_CUDA_IPC || o->backend == FERRY_BACKEND_CUDA_VMM))
            return 0;
        return usage_error("--backend %s: these options are those of cuda_ipc and cuda_vmm%s",
                           value, "");
    case GK_MODE:
        return parse_mode(value, o);
    case GK_SIZES:
        return parse_sizes(value, o);
    case GK_DEVICES:
        return parse_devices(value, o);
    case GK_CONTROL:
        return parse_control(value, o);
    case GK_FLAG:
        break;
    }
    return -1;
}

static const gspec *find(const char *arg, size_t len)
{
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        if (strlen(specs[i].name) == len && strncmp(arg, specs[i].name, len) == 0)
            return &specs[i];
    return NULL;
}

static int parse_one(int argc, char **argv, int *i, gb_options *o)
{
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const gspec *s = find(arg, len);
    if (!s)
        return usage_error("unknown option '%s' for --backend cuda_ipc%s", arg, "");
    if (s->kind == GK_FLAG) {
        if (eq)
            return usage_error("%s takes no value%s", s->name, "");
        *(int *)((char *)o + s->offset) = 1;
        return 0;
    }
    if (!eq && *i + 1 >= argc)
        return usage_error("%s needs a value%s", s->name, "");
    return store(s, eq ? eq + 1 : argv[++*i], o);
}

static void set_default(int64_t *v, int64_t value)
{
    if (*v == GB_UNSET)
        *v = value;
}

static void mode_defaults(gb_options *o)
{
    static const int64_t pool[] = {64 * MIB, 1 * GIB, 64 * MIB};
    static const int64_t size[] = {4 * KIB, 64 * MIB, 4 * KIB};
    static const int64_t inflight[] = {64, 64, 1024};
    static const int64_t verify[] = {100, 1, 1};
    set_default(&o->iterations, o->mode == GB_MODE_CPU ? 10000 : 1000);
    set_default(&o->warmup, o->mode == GB_MODE_STREAM ? 8 : 100);
    set_default(&o->rounds, 4);
    set_default(&o->items, 200);
    set_default(&o->verify_every, verify[o->mode]);
    set_default(&o->floor_copies, 0); /* 0: about 4 GiB worth, 8 to 1000 copies */
    set_default(&o->producer_device, 0);
    set_default(&o->consumer_device, 0);
    set_default(&o->pool_size, pool[o->mode]);
    set_default(&o->max_inflight, inflight[o->mode]);
    /* rtt observes acknowledgements itself: keep the background reclaimer out of the way. */
    set_default(&o->reclaim_interval_us, o->mode == GB_MODE_RTT ? 1000000 : 1000);
    if (o->nsizes == 0) {
        o->sizes[o->nsizes++] = (uint64_t)size[o->mode];
        if (o->mode == GB_MODE_RTT)
            o->sizes[o->nsizes++] = (uint64_t)MIB;
    }
}

/* --consumer-devices with several GPUs implies one consumer each; --consumer-device D is the
 * shorthand of --consumer-devices D. */
static void consumer_defaults(gb_options *o)
{
    if (o->consumers == GB_UNSET)
        o->consumers = o->ndevices > 1 ? o->ndevices : 1;
    if (o->ndevices == 0)
        o->devices[o->ndevices++] = o->consumer_device;
    if (o->ndevices == 1)
        for (int64_t r = 1; r < o->consumers && r < GB_MAX_RANKS; r++)
            o->devices[r] = o->devices[0];
}

static int check_range(const char *name, int64_t v, int64_t lo, int64_t hi)
{
    if (v >= lo && v <= hi)
        return 0;
    fprintf(stderr, "ferry bench: %s must be between %lld and %lld\n", name, (long long)lo,
            (long long)hi);
    return -1;
}

static int check_limits(const gb_options *o)
{
    if (check_range("--iterations", o->iterations, 1, 100000000) ||
        check_range("--warmup", o->warmup, 0, 100000000) ||
        check_range("--rounds", o->rounds, 1, o->mode == GB_MODE_RTT ? o->iterations : INT64_MAX) ||
        check_range("--items", o->items, 1, 100000000) ||
        check_range("--verify-every", o->verify_every, 1, INT64_MAX) ||
        check_range("--floor-copies", o->floor_copies, 0, 1000000) ||
        check_range("--timeout-ms", o->timeout_ms, 1, 86400000) ||
        check_range("--producer-device", o->producer_device, 0, GB_MAX_RANKS - 1) ||
        check_range("--consumer-device", o->consumer_device, 0, GB_MAX_RANKS - 1))
        return -1;
    if (o->mode == GB_MODE_CPU && o->consumers != 1) {
        fprintf(stderr, "ferry bench: --mode cpu runs one consumer (--consumers 1)\n");
        return -1;
    }
    if (check_range("--consumers", o->consumers, 1, GB_MAX_RANKS))
        return -1;
    if (o->ndevices != 1 && o->ndevices != (uint32_t)o->consumers) {
        fprintf(stderr, "ferry bench: --consumer-devices lists %u devices for %lld consumers\n",
                o->ndevices, (long long)o->consumers);
        return -1;
    }
    for (int64_t r = 0; r < o->consumers; r++)
        if (check_range("a consumer device", o->devices[r], 0, GB_MAX_RANKS - 1))
            return -1;
    return 0;
}

static void init(gb_options *o)
{
    memset(o, 0, sizeof(*o));
    int64_t *unset[] = {&o->iterations,   &o->warmup,          &o->rounds,
                        &o->items,        &o->consumers,       &o->verify_every,
                        &o->floor_copies, &o->producer_device, &o->consumer_device,
                        &o->pool_size,    &o->max_inflight,    &o->reclaim_interval_us};
    for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++)
        *unset[i] = GB_UNSET;
    o->backend = FERRY_BACKEND_CUDA_IPC;
    o->mode = GB_MODE_RTT;
    o->timeout_ms = 10000;
    o->seed = 1;
    o->placements[0] = FERRY_CONTROL_HOST;
    o->nplacements = 1;
}

int gb_parse_options(int argc, char **argv, gb_options *o)
{
    init(o);
    for (int i = 1; i < argc; i++) {
        if (parse_one(argc, argv, &i, o) != 0) {
            fprintf(stderr, "Run 'ferry help' for the options.\n");
            return CLI_EXIT_USAGE;
        }
    }
    mode_defaults(o);
    consumer_defaults(o);
    return check_limits(o) != 0 ? CLI_EXIT_USAGE : 0;
}
