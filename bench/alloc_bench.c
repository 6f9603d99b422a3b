/* Allocator micro-benchmark: ferry's best-fit extent allocator (src/pool/alloc.h) against a
 * plain best-fit allocator that scans an address-ordered list of free extents, both driven
 * by the same seeded operation sequence.
 *
 * Each allocator fills the pool with --live leases, runs --warmup untimed steady-state
 * operations so that the free space fragments as it does in steady state, then times its
 * operations: free a random live lease, allocate a new random size in its place. The pool
 * is sized so that the fill uses 75% of it. Both allocators pick the smallest fitting free
 * extent (lowest offset among equals) and take its low end, so they must return the same
 * offset for every operation; any disagreement makes the program exit 1.
 *
 * Usage: ferry-alloc-bench [--live N] [--ops N] [--list-ops N] [--warmup N] [--seed S]
 *                          [--dist uniform|log] [--json] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool/alloc.h"

#define GRANULE       256u
#define MIN_SIZE      256u       /* smallest request */
#define MAX_SIZE      (4u << 20) /* largest request: 4 MiB */
#define MIN_SHIFT     8          /* log2(MIN_SIZE) */
#define MAX_SHIFT     22         /* log2(MAX_SIZE) */
#define FILL_PERMILLE 750u       /* share of the pool the fill uses */
#define NONE          UINT64_MAX /* a failed allocation */

typedef struct options {
    uint32_t live;
    uint32_t ops;
    uint32_t list_ops;
    uint32_t warmup;
    uint64_t seed;
    int log_sizes; /* --dist log: log-uniform sizes; default uniform */
    int json;
} options;

/* The operation sequence, shared by both allocators: warmup operations, then timed ones. */
typedef struct workload {
    uint32_t live;
    uint32_t warmup;
    uint32_t total; /* warmup + the most timed operations */
    uint64_t pool_bytes;
    uint64_t *fill_size; /* [live] */
    uint32_t *victim;    /* [total] lease to free and reallocate */
    uint64_t *op_size;   /* [total] */
} workload;

/* What a run produced: every offset (NONE for a failure), to compare the two, and times. */
typedef struct results {
    uint64_t *fill;      /* [live] */
    uint64_t *op;        /* [total] */
    uint32_t failed;     /* failed allocations in the timed operations */
    uint32_t bad_frees;  /* frees of live leases that were refused (a bug) */
    double ns_per_pair;  /* timed operations */
    double free_extents; /* ferry run: mean free extents over the timed operations */
    double used;         /* ferry run: mean used share of the pool over them */
} results;

/* ------------------------------------------------------------------------------------
 * Reference: best fit by scanning an address-ordered doubly linked list of free extents
 * ---------------------------------------------------------------------------------- */

typedef struct ref_node {
    uint64_t off;
    uint64_t size;
    struct ref_node *prev;
    struct ref_node *next;
} ref_node;

typedef struct ref_alloc {
    ref_node *head;  /* free extents in address order */
    ref_node *spare; /* unused nodes, linked through next */
    ref_node *nodes; /* backing array */
} ref_alloc;

static int ref_init(ref_alloc *r, uint64_t size, uint32_t cap)
{
    memset(r, 0, sizeof(*r));
    r->nodes = calloc(cap, sizeof(*r->nodes));
    if (r->nodes == NULL)
        return -1;
    for (uint32_t i = 1; i < cap; i++) {
        r->nodes[i].next = r->spare;
        r->spare = &r->nodes[i];
    }
    r->head = &r->nodes[0];
    r->head->size = size;
    return 0;
}

static void ref_fini(ref_alloc *r)
{
    free(r->nodes);
    memset(r, 0, sizeof(*r));
}

static void ref_unlink(ref_alloc *r, ref_node *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        r->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    n->next = r->spare;
    r->spare = n;
}

/* Best fit of need bytes (a multiple of the granule); NONE if nothing fits. */
static uint64_t ref_alloc_bytes(ref_alloc *r, uint64_t need)
{
    ref_node *best = NULL;
    for (ref_node *n = r->head; n != NULL; n = n->next) {
        if (n->size >= need && (best == NULL || n->size < best->size)) {
            best = n;
            if (n->size == need)
                break;
        }
    }
    if (best == NULL)
        return NONE;
    uint64_t off = best->off;
    if (best->size == need) {
        ref_unlink(r, best);
    } else {
        best->off += need;
        best->size -= need;
    }
    return off;
}

/* Links a new free extent between prev and next (either may be NULL). */
static void ref_insert(ref_alloc *r, ref_node *prev, ref_node *next, uint64_t off, uint64_t size)
{
    ref_node *n = r->spare;
    r->spare = n->next;
    n->off = off;
    n->size = size;
    n->prev = prev;
    n->next = next;
    if (prev)
        prev->next = n;
    else
        r->head = n;
    if (next)
        next->prev = n;
}

/* Frees [off, off + size), merging with the free extents around it. */
static void ref_free(ref_alloc *r, uint64_t off, uint64_t size)
{
    ref_node *prev = NULL, *next = r->head;
    while (next != NULL && next->off < off) {
        prev = next;
        next = next->next;
    }
    int join_prev = prev != NULL && prev->off + prev->size == off;
    int join_next = next != NULL && off + size == next->off;
    if (join_prev && join_next) {
        prev->size += size + next->size;
        ref_unlink(r, next);
    } else if (join_prev) {
        prev->size += size;
    } else if (join_next) {
        next->off = off;
        next->size += size;
    } else {
        ref_insert(r, prev, next, off, size);
    }
}

/* ------------------------------------------------------------------------------------
 * Workload
 * ---------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A size between 256 B and 4 MiB: uniform, or (log) uniform within a random power-of-two
 * octave, so that there are as many requests of a few KiB as of a few MiB. */
static uint64_t random_size(uint64_t *s, int log_sizes)
{
    if (!log_sizes)
        return MIN_SIZE + rng_next(s) % (MAX_SIZE - MIN_SIZE + 1);
    uint64_t e = MIN_SHIFT + rng_next(s) % (MAX_SHIFT - MIN_SHIFT);
    uint64_t lo = 1ull << e;
    return lo + rng_next(s) % lo;
}

static uint64_t round_up(uint64_t n)
{
    return (n + GRANULE - 1) & ~(uint64_t)(GRANULE - 1);
}

static int workload_make(workload *w, const options *o)
{
    uint64_t s = o->seed, sum = 0;
    memset(w, 0, sizeof(*w));
    w->live = o->live;
    w->warmup = o->warmup;
    w->total = o->warmup + o->ops;
    w->fill_size = malloc(w->live * sizeof(*w->fill_size));
    w->victim = malloc(w->total * sizeof(*w->victim));
    w->op_size = malloc(w->total * sizeof(*w->op_size));
    if (!w->fill_size || !w->victim || !w->op_size)
        return -1;
    for (uint32_t i = 0; i < w->live; i++) {
        w->fill_size[i] = random_size(&s, o->log_sizes);
        sum += round_up(w->fill_size[i]);
    }
    for (uint32_t i = 0; i < w->total; i++) {
        w->victim[i] = (uint32_t)(rng_next(&s) % w->live);
        w->op_size[i] = random_size(&s, o->log_sizes);
    }
    w->pool_bytes = round_up(sum * 1000 / FILL_PERMILLE);
    return 0;
}

static void workload_free(workload *w)
{
    free(w->fill_size);
    free(w->victim);
    free(w->op_size);
}

static int results_make(results *r, const workload *w)
{
    memset(r, 0, sizeof(*r));
    r->fill = malloc(w->live * sizeof(*r->fill));
    r->op = malloc(w->total * sizeof(*r->op));
    return r->fill && r->op ? 0 : -1;
}

static void results_free(results *r)
{
    free(r->fill);
    free(r->op);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die_no_memory(void)
{
    fprintf(stderr, "ferry-alloc-bench: no memory\n");
    exit(3);
}

/* ------------------------------------------------------------------------------------
 * ferry's allocator
 * ---------------------------------------------------------------------------------- */

typedef struct ferry_run {
    const workload *w;
    results *res;
    ferry__alloc a;
    uint32_t *handle; /* [live] FERRY__ALLOC_NIL for an empty slot */
    double sum_free;  /* sums of the samples taken every 256 timed operations */
    double sum_used;
    uint32_t samples;
} ferry_run;

static void ferry_fill(ferry_run *f)
{
    uint64_t off;
    for (uint32_t i = 0; i < f->w->live; i++) {
        int ok = ferry__alloc_alloc(&f->a, f->w->fill_size[i], &off, &f->handle[i]) == FERRY_OK;
        f->res->fill[i] = ok ? off : NONE;
        if (!ok)
            f->handle[i] = FERRY__ALLOC_NIL;
    }
}

/* Runs operations [from, to); samples the pool every 256 operations if sampling. */
static void ferry_steps(ferry_run *f, uint32_t from, uint32_t to, int sampling)
{
    const workload *w = f->w;
    uint64_t off;
    for (uint32_t i = from; i < to; i++) {
        uint32_t *h = &f->handle[w->victim[i]];
        if (*h != FERRY__ALLOC_NIL && ferry__alloc_free(&f->a, *h) != FERRY_OK)
            f->res->bad_frees++;
        if (ferry__alloc_alloc(&f->a, w->op_size[i], &off, h) == FERRY_OK) {
            f->res->op[i] = off;
        } else {
            f->res->op[i] = NONE;
            *h = FERRY__ALLOC_NIL;
            f->res->failed += sampling;
        }
        if (sampling && (i & 255u) == 0) {
            f->sum_free += f->a.free_extents;
            f->sum_used += (double)f->a.used_bytes / (double)f->a.size;
            f->samples++;
        }
    }
}

static void run_ferry(const workload *w, uint32_t ops, results *res)
{
    ferry_run f = {w, res, {0}, NULL, 0, 0, 0};
    f.handle = malloc(w->live * sizeof(*f.handle));
    if (f.handle == NULL)
        die_no_memory();
    if (ferry__alloc_init(&f.a, w->pool_bytes, GRANULE, w->live) != FERRY_OK) {
        fprintf(stderr, "ferry-alloc-bench: %s\n", ferry_last_error());
        exit(3);
    }
    ferry_fill(&f);
    ferry_steps(&f, 0, w->warmup, 0);
    double t0 = now_ns();
    ferry_steps(&f, w->warmup, w->warmup + ops, 1);
    res->ns_per_pair = (now_ns() - t0) / ops;
    res->free_extents = f.samples ? f.sum_free / f.samples : 0;
    res->used = f.samples ? f.sum_used / f.samples : 0;
    ferry__alloc_fini(&f.a);
    free(f.handle);
}

/* ------------------------------------------------------------------------------------
 * The list scan
 * ---------------------------------------------------------------------------------- */

/* One lease of the reference allocator. */
typedef struct ref_lease {
    uint64_t off; /* NONE if the slot is empty */
    uint64_t size;
} ref_lease;

static void list_steps(ref_alloc *r, ref_lease *lease, const workload *w, results *res,
                       uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++) {
        ref_lease *l = &lease[w->victim[i]];
        if (l->off != NONE)
            ref_free(r, l->off, l->size);
        l->size = round_up(w->op_size[i]);
        l->off = ref_alloc_bytes(r, l->size);
        res->op[i] = l->off;
        res->failed += l->off == NONE && i >= w->warmup;
    }
}

static void run_list(const workload *w, uint32_t ops, results *res)
{
    ref_alloc r;
    ref_lease *lease = malloc(w->live * sizeof(*lease));
    if (lease == NULL || ref_init(&r, w->pool_bytes, 2 * w->live + 2) != 0)
        die_no_memory();
    for (uint32_t i = 0; i < w->live; i++) {
        lease[i].size = round_up(w->fill_size[i]);
        lease[i].off = ref_alloc_bytes(&r, lease[i].size);
        res->fill[i] = lease[i].off;
    }
    list_steps(&r, lease, w, res, 0, w->warmup);
    double t0 = now_ns();
    list_steps(&r, lease, w, res, w->warmup, w->warmup + ops);
    res->ns_per_pair = (now_ns() - t0) / ops;
    ref_fini(&r);
    free(lease);
}

/* 0 if the runs agree on every offset both computed and ferry refused no free, else 1. */
static int verify(const results *f, const results *l, const workload *w, uint32_t list_ops)
{
    for (uint32_t i = 0; i < w->live; i++) {
        if (f->fill[i] != l->fill[i]) {
            fprintf(stderr, "ferry-alloc-bench: allocators disagree at fill %" PRIu32 "\n", i);
            return 1;
        }
    }
    for (uint32_t i = 0; i < w->warmup + list_ops; i++) {
        if (f->op[i] != l->op[i]) {
            fprintf(stderr, "ferry-alloc-bench: allocators disagree at operation %" PRIu32 "\n", i);
            return 1;
        }
    }
    if (f->bad_frees != 0) {
        fprintf(stderr, "ferry-alloc-bench: ferry refused %" PRIu32 " frees\n", f->bad_frees);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------
 * Options and report
 * ---------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-alloc-bench [--live N] [--ops N] [--list-ops N] [--warmup N]\n"
               "                         [--seed S] [--dist uniform|log] [--json]\n"
               "  --live N      live leases in steady state (default 4096)\n"
               "  --ops N       timed free+alloc pairs for ferry (default 200000)\n"
               "  --list-ops N  timed pairs for the list scan, the first of the same sequence\n"
               "                (default: same as --ops)\n"
               "  --warmup N    untimed pairs run by both first (default 4 * live)\n"
               "  --seed S      workload seed (default 1)\n"
               "  --dist D      request sizes in [256 B, 4 MiB]: uniform (default) or log\n"
               "                (log-uniform)\n"
               "  --json        print one JSON line instead of the table\n");
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A count in [min, 1e9]. */
static int parse_count(const char *s, uint32_t min, uint32_t *out)
{
    uint64_t v;
    if (parse_u64(s, 1000000000u, &v) != 0 || v < min)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_dist(const char *s, int *log_sizes)
{
    if (s != NULL && strcmp(s, "uniform") == 0)
        *log_sizes = 0;
    else if (s != NULL && strcmp(s, "log") == 0)
        *log_sizes = 1;
    else
        return -1;
    return 0;
}

/* Parses one option that takes a value; -1 if it is unknown or its value is bad. Bits of
 * *set record the options given. */
static int parse_opt(options *o, const char *arg, const char *val, unsigned *set)
{
    if (strcmp(arg, "--live") == 0)
        return parse_count(val, 1, &o->live);
    if (strcmp(arg, "--ops") == 0)
        return parse_count(val, 1, &o->ops);
    if (strcmp(arg, "--list-ops") == 0) {
        *set |= 1u;
        return parse_count(val, 1, &o->list_ops);
    }
    if (strcmp(arg, "--warmup") == 0) {
        *set |= 2u;
        return parse_count(val, 0, &o->warmup);
    }
    if (strcmp(arg, "--seed") == 0)
        return parse_u64(val, UINT64_MAX, &o->seed);
    if (strcmp(arg, "--dist") == 0)
        return parse_dist(val, &o->log_sizes);
    return -1;
}

static int parse_args(int argc, char **argv, options *o)
{
    unsigned set = 0;
    *o = (options){4096, 200000, 0, 0, 1, 0, 0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (parse_opt(o, argv[i], i + 1 < argc ? argv[i + 1] : NULL, &set) != 0)
            return -1;
        i++;
    }
    if (!(set & 1u) || o->list_ops > o->ops)
        o->list_ops = o->ops;
    if (!(set & 2u))
        o->warmup = o->live > 250000000u ? 1000000000u : 4 * o->live;
    return 0;
}

static void print_table(const options *o, const workload *w, const results *f, const results *l)
{
    printf("ferry-alloc-bench: %" PRIu32 " live leases, %s sizes 256 B - 4 MiB, granule %u B, "
           "pool %.2f GiB, seed %" PRIu64 ", %" PRIu32 " warm-up pairs\n",
           o->live, o->log_sizes ? "log-uniform" : "uniform", GRANULE,
           (double)w->pool_bytes / (1u << 30), o->seed, o->warmup);
    printf("steady state: %.1f%% of the pool used, %.0f free extents (means over the timed "
           "ferry pairs)\n",
           100.0 * f->used, f->free_extents);
    printf("%-22s %10s %14s %8s\n", "allocator", "pairs", "ns/free+alloc", "failed");
    printf("%-22s %10" PRIu32 " %14.1f %8" PRIu32 "\n", "ferry (AVL best fit)", o->ops,
           f->ns_per_pair, f->failed);
    printf("%-22s %10" PRIu32 " %14.1f %8" PRIu32 "\n", "list scan best fit", o->list_ops,
           l->ns_per_pair, l->failed);
    printf("ratio list/ferry: %.1fx\n", l->ns_per_pair / f->ns_per_pair);
}

static void print_json(const options *o, const workload *w, const results *f, const results *l)
{
    printf("{\"bench\":\"alloc\",\"live\":%" PRIu32 ",\"ops\":%" PRIu32 ",\"list_ops\":%" PRIu32
           ",\"warmup\":%" PRIu32 ",\"seed\":%" PRIu64 ",\"dist\":\"%s\",\"granule\":%u"
           ",\"pool_bytes\":%" PRIu64 ",\"used\":%.4f,\"free_extents\":%.1f"
           ",\"ferry_failed\":%" PRIu32 ",\"list_failed\":%" PRIu32
           ",\"ferry_ns_per_pair\":%.1f,\"list_ns_per_pair\":%.1f,\"ratio\":%.2f}\n",
           o->live, o->ops, o->list_ops, o->warmup, o->seed, o->log_sizes ? "log" : "uniform",
           GRANULE, w->pool_bytes, f->used, f->free_extents, f->failed, l->failed, f->ns_per_pair,
           l->ns_per_pair, l->ns_per_pair / f->ns_per_pair);
}

int main(int argc, char **argv)
{
    options o;
    workload w;
    results rf, rl;
    if (parse_args(argc, argv, &o) != 0 || (uint64_t)o.warmup + o.ops > UINT32_MAX) {
        usage(stderr);
        return 2;
    }
    if (workload_make(&w, &o) != 0 || results_make(&rf, &w) != 0 || results_make(&rl, &w) != 0)
        die_no_memory();
    run_ferry(&w, o.ops, &rf);
    run_list(&w, o.list_ops, &rl);
    int rc = verify(&rf, &rl, &w, o.list_ops);
    if (o.json)
        print_json(&o, &w, &rf, &rl);
    else
        print_table(&o, &w, &rf, &rl);
    results_free(&rf);
    results_free(&rl);
    workload_free(&w);
    return rc;
}
