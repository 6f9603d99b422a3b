/* The ferry command-line tool, a client of ferry.h alone: its helpers (util.c) and `ferry
 * bench`: one harness (harness.c) for every mode, a bench_mode ops table: handover and
 * channel (host), rtt, stream, cpu (GPU), remote (any backend). The producer re-executes
 * itself once per consumer rank and shares a channel and a results region with each
 * (docs/cli.md). */
#ifndef FERRY_TOOL_BENCH_H
#define FERRY_TOOL_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

#define CLI_EXIT_OK    0
#define CLI_EXIT_FAIL  1
#define CLI_EXIT_USAGE 2

/* Parses a size with an optional unit (B, KiB, MiB, GiB, KB, MB, GB; case-insensitive, a
 * decimal fraction allowed: "1.5MiB"). Negative values parse. Returns 0, or -1 after printing
 * "ferry CMD: invalid WHAT 'TEXT': why" to stderr. */
int cli_parse_size(const char *cmd, const char *what, const char *text, int64_t *out);
/* A decimal integer (optionally negative), or an unsigned one (any base strtoull takes). */
int cli_parse_int(const char *cmd, const char *what, const char *text, int64_t *out);
int cli_parse_u64(const char *cmd, const char *what, const char *text, uint64_t *out);
/* "256KiB", "1.50MiB", "1000B". */
void cli_format_size(uint64_t bytes, char *buf, size_t size);
/* Whether arg is --help or -h. */
int cli_is_help(const char *arg);

/* CPU time of this thread, and sleeps. (The clock and the futex are the library's:
 * ferry_now_ns, ferry_futex_wait, ferry_futex_wake.) */
uint64_t cli_thread_cpu_ns(void);
void cli_sleep_ns(uint64_t ns);

uint64_t cli_mix64(uint64_t x); /* splitmix64's finaliser */
/* Bytes [off, off + len) of the payload pattern keyed by (seed, key): byte at is byte at % 8 of
 * word at / 8 of a splitmix64 stream. Every mode's payloads are made of it. */
void cli_pattern_fill(uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed, uint64_t key);
/* p50 and p99 (nearest rank) of ns_values, sorted in place, in microseconds; NAN if n == 0. */
void cli_p50_p99_us(uint64_t *ns_values, size_t n, double *p50_us, double *p99_us);
/* "key": v with three decimals (null when not finite), then after. */
void cli_json_num(const char *key, double v, const char *after);
/* a / b, NAN unless both are finite and b > 0. */
double cli_ratio(double a, double b);

/* The latency of n round trips (ns each; a 0 was not counted) timed over busy_ns in all. */
typedef struct lat_stats {
    uint64_t samples, skipped;                   /* counted, and not counted */
    double mean_us, p50_us, p99_us, items_per_s; /* items_per_s: of all n */
} lat_stats;
/* Compacts and sorts ns. */
void lat_summarize(uint64_t *ns, uint64_t n, uint64_t busy_ns, lat_stats *out);
/* "key": {"mean_us": .., "p50_us": .., "p99_us": .., "items_per_s": .. and, with counts,
 * "samples" and "background_reclaims" (the skipped)}, then ", ". */
void lat_json(const char *key, const lat_stats *l, int counts);

/* Commands (main.c dispatches). */
int cmd_bench(int argc, char **argv);
int cmd_bench_worker(int argc, char **argv);

#define BENCH_MAX_SIZES   8
#define BENCH_MAX_RANKS   64
#define BENCH_MESSAGE_MAX 320
#define BENCH_PAGE        4096u
#define BENCH_FLAG_BYTES  (2 * BENCH_PAGE)
#define BENCH_PHASES      3
#define BENCH_UNSET       INT64_MIN
/* The defaults every mode shares (bench_mode.defaults). */
#define BENCH_DEFAULTS .timeout_ms = 10000, .rounds = 4

/* Which options apply: the backend's family, or remote for --mode remote (any backend). */
enum { FAMILY_HOST = 1, FAMILY_GPU = 2, FAMILY_REMOTE = 4 };

typedef struct bench_opts {
    ferry_backend backend;
    const char *backend_name;
    const char *mode_name;
    int64_t consumers, items, iterations, warmup, rounds, verify_every, floor_copies;
    int64_t producer_device, consumer_device, pool_size, max_inflight, reclaim_interval_us;
    int64_t timeout_ms, reclaim_rounds;
    uint64_t seed;
    uint64_t sizes[BENCH_MAX_SIZES]; /* --item-size: host: [lo, hi]; GPU: the list */
    uint32_t nsizes;
    int64_t devices[BENCH_MAX_RANKS]; /* --consumer-devices, then one per consumer */
    uint32_t ndevices;
    int placements[2]; /* --control */
    uint32_t nplacements;
    int json, quiet, no_floor;
    /* remote */
    int64_t latency_size;
    const char *listen, *worker_netns, *net_devices, *memory_name;
} bench_opts;

typedef struct bench_params {
    uint64_t magic, region_bytes, table_bytes;
    uint32_t mode, consumers;
    uint64_t seed, timeout_ns;
    int32_t producer_pid;
    /* handover */
    uint64_t size_lo, size_hi, items, ring, floor_slots, floor_slot_bytes, floor_bytes;
    uint64_t reclaim_rounds, reclaim_item;
    /* GPU */
    uint64_t max_item, sample_bytes; /* (items: stream's items per phase, warm-up included) */
    int32_t devices[BENCH_MAX_RANKS];
    uint32_t has_floor;
    uint8_t floor_handle[64];
    char address[FERRY_ADDRESS_SIZE]; /* channel: the pool's */
    /* remote: the pool's remote address; the workers' network namespace ("": the producer's)
     * and UCX_NET_DEVICES ("": the namespace's own devices, or as inherited); items checked in
     * full; the consumers' GPU (-1: host) */
    char remote_address[FERRY_REMOTE_ADDRESS_SIZE];
    char netns[64], net_devices[192];
    uint64_t verify_every;
    int32_t consumer_device;
    uint32_t producer_waiting __attribute__((aligned(64))); /* the producer sleeps on progress */
} bench_params;

/* STARTING until the worker is ready for messages; FAILED after a fatal error (message);
 * DONE after the DONE message. */
enum { STATE_STARTING = 0, STATE_READY = 1, STATE_DONE = 2, STATE_FAILED = 3 };

typedef struct bench_rank {
    uint32_t progress[BENCH_PHASES]; /* futex words: per phase (handover) or seq (GPU) */
    uint32_t state;
    uint64_t verified[BENCH_PHASES], errors[BENCH_PHASES];
    uint64_t stat[6];                /* the mode's counters */
    char message[BENCH_MESSAGE_MAX]; /* first failure, "" if none */
} __attribute__((aligned(64))) bench_rank;

typedef struct bench_region {
    void *base;
    size_t bytes;
    int fd;
    bench_params *p;
    uint32_t *flags; /* BENCH_FLAG_BYTES of words */
    bench_rank *ranks;
    void *tables; /* the mode's table_bytes */
} bench_region;

enum { MSG_BEGIN = 1, MSG_END = 2, MSG_DONE = 3 }; /* modes number theirs from 8 */

#define MSG_F_VERIFY 0x1u /* check this item */

typedef struct bench_msg {
    uint32_t type, flags;
    uint32_t phase, reserved;
    uint64_t seq; /* message number; GPU progress, the rtt floor's word value */
    uint64_t item, key, size, seed;
    uint8_t desc[FERRY_DESCRIPTOR_SIZE];
} bench_msg;

typedef struct bench_mode bench_mode;

typedef struct bench_child {
    pid_t pid;
    int sock;
    int running;
    int wstatus;
} bench_child;

typedef struct bench_run {
    const bench_opts *opt;
    const bench_mode *mode;
    bench_params params; /* what the region starts with */
    bench_region region;
    bench_child children[BENCH_MAX_RANKS];
    uint32_t consumers;
    uint64_t seq;
    uint64_t last_check_ns;
    int failed;
    char error[1024];
    int log_muted;  /* the library's warnings are not printed */
    int incomplete; /* the mode saw items that were never verified */
    void *state;    /* the mode's */
} bench_run;

int run_fail(bench_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reaps exited workers and looks for FAILED ones: either fails the run. */
int run_check(bench_run *run);
int run_check_often(bench_run *run);
/* Sends msg (its seq set to the next number) to ranks [0, nranks). */
int run_send(bench_run *run, uint32_t nranks, bench_msg *msg);
/* Sends a message of only a type (BEGIN, END, ...) to ranks [0, nranks). */
int run_send_type(bench_run *run, uint32_t nranks, uint32_t type);
/* Waits until ranks [0, nranks) have progress[phase] >= need, failing after timeout without
 * progress; *waited (may be NULL) says whether it had to sleep. */
int run_wait(bench_run *run, int phase, uint32_t nranks, uint64_t need, int *waited);
/* [0, n) in `rounds` chunks, and every chunk measured by each of the kinds in turn (so that
 * all see the same machine): fn(run, kind, begin, end). */
int run_rounds(bench_run *run, uint64_t n, uint64_t rounds, int kinds,
               int (*fn)(bench_run *run, int kind, uint64_t begin, uint64_t end));
/* END, and the wait until every rank has handled it. */
int run_phase_end(bench_run *run, uint32_t nranks);
/* Sums of the ranks' verified and error counters over every phase. */
void run_counters(const bench_run *run, uint64_t *verified, uint64_t *errors);
ferry_status run_pool_stats(ferry_pool *pool, ferry_pool_stats *s);
/* The pool's pool_full_events, or the run failed. */
int run_full_events(bench_run *run, ferry_pool *pool, uint64_t *events);
/* A library log sink: lines on stderr as "ferry bench: library: ...", warnings muted while
 * *muted is set. */
void run_library_log(int level, const char *message, void *muted);
/* The pool the options ask for (the GPU modes add device and placement). */
ferry_pool_config run_pool_config(const bench_opts *o);
/* Fails the run with the pool's item limit when max_item does not fit in pool. */
int run_check_fits(bench_run *run, ferry_pool *pool, uint64_t max_item);

/* harness.c, used by bench.c: the region, the workers and the end of a run. */
int harness_start(bench_run *run);
int harness_finish(bench_run *run);
void harness_kill(bench_run *run);
void harness_close(bench_run *run);

typedef struct bench_worker {
    uint32_t rank;
    int sock;
    bench_region region;
    bench_params p;
    bench_rank *me;
    const bench_mode *mode;
    void *state; /* the mode's */
} bench_worker;

int worker_fail(bench_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A verification error: counted, the first one noted. */
void worker_error(bench_worker *w, int phase, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Decodes m's descriptor and checks its length against m and room. */
int worker_decode(bench_worker *w, const bench_msg *m, uint64_t room, ferry_descriptor *d);
void worker_progress(bench_worker *w, int phase, uint32_t value);
/* Maps the region (w->region.fd), runs the mode's worker until DONE: the exit status. */
int worker_serve(bench_worker *w, const bench_mode *const *modes, size_t nmodes);

struct bench_mode {
    const char *name;
    unsigned family;
    int progress_by_seq;    /* the harness notes progress[0] = seq after every message */
    const void *family_ops; /* what the family's shared code needs of the mode (gpu.h) */
    /* Options: the mode's values of the number options and of --item-size where they were
     * not given (the number fields of defaults, BENCH_UNSET for none; its sizes), then the
     * family's own defaults (may be NULL), then the mode's limits. */
    const bench_opts *defaults;
    void (*adjust)(bench_opts *o);
    int (*check)(const bench_opts *o);
    /* The producer: before the workers start (pools, buffers, params, table_bytes), the
     * measurements, the report, and what is left to release (failed: after a failure). */
    int (*prepare)(bench_run *run);
    int (*measure)(bench_run *run);
    void (*report_text)(const bench_run *run);
    void (*report_json)(const bench_run *run);
    void (*release)(bench_run *run, int failed);
    /* A worker: after the region is mapped; one message; at the end (clean: the run was). */
    int (*worker_init)(bench_worker *w);
    int (*worker_handle)(bench_worker *w, const bench_msg *m);
    void (*worker_release)(bench_worker *w, int clean);
};

extern const bench_mode handover_mode, channel_mode, rtt_mode, stream_mode, cpu_mode, remote_mode;

/* options.c */
int bench_parse_options(int argc, char **argv, const bench_mode *const *modes, size_t nmodes,
                        bench_opts *o, const bench_mode **mode);
void bench_help(void);
/* Sets *v to value unless the user gave it. */
void bench_default(int64_t *v, int64_t value);

#endif
