/* Declarations shared between the files of the ferry command-line tool (src/cli). */
#ifndef FERRY_CLI_CLI_H
#define FERRY_CLI_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

#define CLI_EXIT_OK    0
#define CLI_EXIT_FAIL  1
#define CLI_EXIT_USAGE 2

/* ---- main.c -------------------------------------------------------------------------- */

/* Prints the usage text to stdout (to_stderr = 0) or stderr. */
void cli_usage(int to_stderr);

/* ---- options.c: argument parsing ----------------------------------------------------- */

/* An item size: a single size has lo == hi. */
typedef struct cli_size_range {
    uint64_t lo;
    uint64_t hi;
} cli_size_range;

/* Parses a size with an optional unit (B, KiB, MiB, GiB, KB, MB, GB; case-insensitive, a
 * decimal fraction allowed: "1.5MiB"). Negative values parse (the library judges them).
 * Returns 0, or -1 after printing "ferry CMD: invalid WHAT ..." to stderr. */
int cli_parse_size(const char *cmd, const char *what, const char *text, int64_t *out);

/* Parses "SIZE" or "LO-HI" (positive sizes, LO <= HI). Returns 0 or -1 (message printed). */
int cli_parse_size_range(const char *cmd, const char *what, const char *text, cli_size_range *out);

/* Parses a decimal integer (optionally negative). Returns 0 or -1 (message printed). */
int cli_parse_int(const char *cmd, const char *what, const char *text, int64_t *out);

/* Formats bytes as the shortest exact or one-decimal form: "256KiB", "1.5MiB", "1000B". */
void cli_format_size(uint64_t bytes, char *buf, size_t size);

/* Options of `ferry bench`. */
typedef struct bench_options {
    const char *backend;         /* --backend */
    int64_t consumers;           /* --consumers */
    int64_t items;               /* --items */
    cli_size_range item_size;    /* --item-size */
    int64_t pool_size;           /* --pool-size */
    int64_t max_inflight;        /* --max-inflight */
    int64_t reclaim_interval_us; /* --reclaim-interval-us */
    uint64_t seed;               /* --seed */
    int64_t timeout_ms;          /* --timeout-ms */
    int64_t reclaim_rounds;      /* --reclaim-rounds (0: skip the reclaim phase) */
    int64_t rounds;              /* --rounds: ferry and floor alternate in this many chunks */
    int json;                    /* --json */
    int no_floor;                /* --no-floor */
    int quiet;                   /* --quiet */
} bench_options;

/* Fills *opt from argv (after "bench"). Returns 0, or CLI_EXIT_USAGE after printing why. */
int bench_parse_options(int argc, char **argv, bench_options *opt);

/* ---- sync.c: time and futex helpers --------------------------------------------------- */

uint64_t cli_now_ns(void);
void cli_sleep_ns(uint64_t ns);
/* Sleeps while *word == expected, at most timeout_ns (shared, not private, futex). */
void cli_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns);
void cli_futex_wake(uint32_t *word);

/* ---- stats.c -------------------------------------------------------------------------- */

/* Sorts values[0..n) in place and returns the nearest-rank percentile p (0 < p <= 100);
 * 0 when n == 0. */
uint64_t cli_percentile_sorted(uint64_t *values, size_t n, double p);
/* p50 and p99 of values (sorted in place), in microseconds; NAN when n == 0. */
void cli_p50_p99_us(uint64_t *ns_values, size_t n, double *p50_us, double *p99_us);

/* ---- pattern.c: the deterministic payload ------------------------------------------- */

/* Every BENCH_STAMP_STRIDE bytes an item carries one 8-byte word that depends on the item
 * index, so that bytes of another item (or a stale slice) never verify. */
#define BENCH_STAMP_STRIDE 4096u

uint64_t cli_mix64(uint64_t x);
/* Size of item `item`: lo == hi gives lo; otherwise log-uniform in [lo, hi], rounded to a
 * multiple of 4 bytes where one lies in the range. */
uint64_t bench_item_size(uint64_t seed, uint64_t lo, uint64_t hi, uint64_t item);
/* Which base pattern (0..ring-1) item `item` uses. */
uint32_t bench_item_key(uint64_t item, uint32_t ring);
/* Fills buf with the base stream keyed by (seed, key). */
void bench_pattern_fill(uint8_t *buf, uint64_t bytes, uint64_t seed, uint64_t key);
/* Writes item's stamp words into buf (a copy of its base pattern). */
void bench_pattern_stamp(uint8_t *buf, uint64_t size, uint64_t seed, uint64_t item);
/* Checks every byte of got against base + item's stamps. Returns -1 when all match, else
 * the offset of the first byte that differs (*got_byte and *want_byte tell the values). */
int64_t bench_pattern_verify(const uint8_t *got, const uint8_t *base, uint64_t size, uint64_t seed,
                             uint64_t item, uint8_t *got_byte, uint8_t *want_byte);

/* The ring of base patterns one process keeps (each `bytes` long). */
typedef struct bench_patterns {
    uint8_t **buf;
    uint32_t count;
    uint64_t bytes;
} bench_patterns;

int bench_patterns_create(bench_patterns *p, uint32_t count, uint64_t bytes, uint64_t seed);
void bench_patterns_destroy(bench_patterns *p);

/* ---- bench_shared.c: the results region shared by the producer and its workers --------- */

enum { BENCH_PHASE_FERRY = 0, BENCH_PHASE_FLOOR = 1, BENCH_PHASE_RECLAIM = 2, BENCH_PHASES = 3 };

#define BENCH_MAGIC       0x6665727279424e43ull /* "ferryBNC" */
#define BENCH_MESSAGE_MAX 320

/* Parameters the producer writes before it starts the workers. */
typedef struct bench_params {
    uint64_t magic;
    uint64_t seed;
    uint64_t size_lo;
    uint64_t size_hi;
    uint64_t items;
    uint64_t consumers;
    uint64_t ring;        /* distinct base patterns */
    uint64_t floor_slots; /* 0 without a floor */
    uint64_t floor_slot_bytes;
    uint64_t floor_bytes; /* size of the floor memfd */
    uint64_t timeout_ns;
    uint64_t reclaim_rounds; /* items of the reclaim phase (0: none) */
    uint64_t reclaim_item;   /* bytes of each reclaim item */
    uint64_t region_bytes;
} bench_params;

/* One worker's counters and state; one cache line group per rank. */
typedef struct bench_rank {
    uint32_t progress[BENCH_PHASES]; /* items handled per phase (futex words) */
    uint32_t state;                  /* BENCH_STATE_* */
    uint64_t verified[BENCH_PHASES];
    uint64_t errors[BENCH_PHASES];
    char message[BENCH_MESSAGE_MAX]; /* first failure, "" if none */
} __attribute__((aligned(64))) bench_rank;

/* STARTING until the worker has mapped everything and built its patterns; DONE after the
 * last message (errors may be counted); FAILED after a fatal error (see message). */
enum {
    BENCH_STATE_STARTING = 0,
    BENCH_STATE_READY = 1,
    BENCH_STATE_DONE = 2,
    BENCH_STATE_FAILED = 3,
};

typedef struct bench_header {
    bench_params params;
    uint32_t producer_waiting __attribute__((aligned(64))); /* the producer sleeps on progress */
} bench_header;

typedef struct bench_region {
    void *base;
    size_t bytes;
    int fd;
    bench_header *hdr;
    bench_rank *ranks;        /* [consumers] */
    uint64_t *ack_ns[2];      /* ferry, floor: [items][consumers] */
    uint64_t *reclaim_ack_ns; /* [reclaim_rounds + 1] */
} bench_region;

/* Producer: creates the memfd, sizes and maps it, writes params. Returns 0 or -1 (errno). */
int bench_region_create(const bench_params *params, bench_region *r);
/* Worker: maps the region behind fd. Returns 0 or -1. */
int bench_region_map(int fd, bench_region *r);
void bench_region_unmap(bench_region *r);
/* ack_ns slot of (item, rank) in a phase's table. */
uint64_t *bench_ack_slot(const bench_region *r, int phase, uint64_t item, uint32_t rank);
/* "ferry", "floor" or "reclaim". */
const char *bench_phase_name(int phase);
/* Worker: publishes that `count` items of a phase are done, waking a sleeping producer. */
void bench_note_progress(bench_region *r, int phase, uint32_t rank, uint32_t count);

/* ---- the channel message ------------------------------------------------------------- */

enum {
    BENCH_MSG_FERRY = 1,   /* an item published into the ferry pool */
    BENCH_MSG_FLOOR = 2,   /* an item copied into the floor ring */
    BENCH_MSG_RECLAIM = 3, /* an item of the reclaim phase (rank 0 only) */
    BENCH_MSG_DONE = 4,    /* the run is over: exit */
};

typedef struct bench_msg {
    uint32_t type;
    uint32_t reserved;
    uint64_t item;
    uint64_t seed;
    uint64_t size;
    uint64_t slot; /* floor ring slot */
    uint8_t desc[FERRY_DESCRIPTOR_SIZE];
} bench_msg;

/* ---- bench_procs.c: the producer's view of its workers ------------------------------- */

typedef struct bench_worker {
    pid_t pid;
    int sock;    /* producer's end of the channel */
    int running; /* not reaped yet */
    int wstatus; /* waitpid status once reaped */
} bench_worker;

/* Per-phase measurements the producer keeps. */
typedef struct bench_phase_result {
    int ran;
    uint64_t items;
    uint64_t bytes;
    double seconds;
    double items_per_s;
    double gbytes_per_s;
    double p50_us;
    double p99_us;
    uint64_t full_events;    /* ferry: pool_full_events; floor: waits for a busy slot */
    uint64_t verified_items; /* items verified by every consumer (minimum over ranks) */
    uint64_t errors;
} bench_phase_result;

typedef struct bench_reclaim_result {
    int ran;
    uint64_t rounds; /* publishes that had to wait for the previous ack */
    double p50_us;
    double p99_us;
    uint64_t errors; /* verification errors of rank 0 in this phase */
} bench_reclaim_result;

/* What the producer has done so far in one phase (for progress lines). */
typedef struct bench_tally {
    uint64_t items;
    uint64_t bytes;
    uint64_t ns; /* producer time spent in the phase's finished chunks */
} bench_tally;

typedef struct bench_run {
    const bench_options *opt;
    ferry_backend backend;
    bench_params params;
    bench_region region;
    bench_worker *workers;
    uint32_t consumers;
    bench_patterns patterns; /* the producer's staging ring (stamped in place) */
    ferry_pool *pool;
    int floor_fd;
    uint8_t *floor_ring;
    uint64_t *publish_ns[2]; /* ferry, floor: [items], when each item's handoff began */
    uint64_t last_check_ns;  /* last liveness check of the workers */
    uint64_t run_start_ns;
    uint64_t chunk_start_ns;
    uint64_t last_progress_ns;
    bench_tally tally[2];
    uint64_t ferry_full_before; /* the pool's pool_full_events before the first chunk */
    uint64_t floor_waits;       /* floor publishes that waited for a slot */
    int failed;
    char error[1024];
    bench_phase_result ferry;
    bench_phase_result floor;
    bench_reclaim_result reclaim;
} bench_run;

/* Records the first failure of the run; returns -1. */
int bench_fail(bench_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Makes fd close-on-exec and numbered at least 10 (so that the spawn's dup2 to 3..5 never
 * meets it). Returns the new fd or -1. */
int bench_high_fd(int fd);

/* procs.c: worker processes. A SOCK_SEQPACKET pair on high, close-on-exec descriptors (0 or
 * an errno); this binary re-executed with fds[i] on descriptor 3 + i (fds[i] < 0: none) (0 or
 * an errno); "was killed by signal N (name)" / "exited with status N". */
int cli_channel(int *parent, int *child);
int cli_spawn_self(char *const argv[], const int *fds, int nfds, pid_t *pid);
void cli_exit_reason(int wstatus, char *buf, size_t size);
/* A worker's next fixed-size record from its channel: 0, or -1 with the reason in why. */
int cli_recv_record(int sock, void *record, size_t size, char *why, size_t why_size);
/* Starts one worker process per consumer. Returns 0 or -1 (run->error). */
int bench_spawn_workers(bench_run *run);
/* Waits until every worker is READY. */
int bench_wait_ready(bench_run *run);
/* Reaps workers that exited; a worker that exited before the end fails the run. */
int bench_check_workers(bench_run *run);
/* Same, at most once every few milliseconds. */
int bench_check_workers_often(bench_run *run);
/* Sends msg to ranks [0, nranks). */
int bench_send(bench_run *run, uint32_t nranks, const bench_msg *msg);
/* Waits until ranks [0, nranks) have handled `need` items of a phase. *waited (may be NULL)
 * is set when the wait had to sleep. */
int bench_wait_progress(bench_run *run, int phase, uint32_t nranks, uint64_t need, int *waited);
/* Sends DONE and waits for every worker to exit; then checks their status and counters. */
int bench_finish_workers(bench_run *run);
/* Kills and reaps the workers still running (after a failure). */
void bench_kill_workers(bench_run *run);
/* Counts one handed-over item of a phase and prints a progress line about once a second on
 * long runs (unless --quiet or --json). */
void bench_progress(bench_run *run, int phase, uint64_t bytes);
/* Marks the start and the end of a chunk of a phase (for the progress lines). */
void bench_chunk_start(bench_run *run);
void bench_chunk_end(bench_run *run, int phase);
/* First item of chunk c (c == rounds gives the item count). */
uint64_t bench_chunk_begin(const bench_run *run, uint64_t c);

/* ---- phases (bench_ferry.c, bench_floor.c, bench_reclaim.c) ------------------------- */

/* Producer staging for item i: stamps it and returns its buffer and size. */
const uint8_t *bench_stage_item(bench_run *run, uint64_t item, uint64_t *size);
/* Hands items [begin, end) over through the pool and waits until every consumer is done. */
int bench_ferry_chunk(bench_run *run, uint64_t begin, uint64_t end);
/* The pool's pool_full_events so far. */
int bench_pool_full_events(bench_run *run, uint64_t *events);
/* The floor: its slot count for a pool of pool_size bytes and items up to slot_bytes. */
uint64_t bench_floor_slots(int64_t pool_size, uint64_t slot_bytes, int64_t max_inflight);
int bench_floor_create(bench_run *run);
void bench_floor_destroy(bench_run *run);
/* Hands items [begin, end) over through the floor ring and waits for every consumer. */
int bench_floor_chunk(bench_run *run, uint64_t begin, uint64_t end);
int bench_reclaim_phase(bench_run *run);
/* Mutes (1) or restores (0) the library's log lines on stderr. */
void bench_mute_library_log(int mute);

/* ---- bench_report.c -------------------------------------------------------------------- */

/* Computes a phase's metrics from its publish_ns and ack tables: seconds is the sum over
 * the chunks of (last ack of the chunk - first publish of the chunk). */
void bench_phase_metrics(bench_run *run, int phase, bench_phase_result *out);
void bench_report_text(const bench_run *run);
void bench_report_json(const bench_run *run);

/* ---- commands ------------------------------------------------------------------------ */

int cmd_bench(int argc, char **argv);
int cmd_bench_worker(int argc, char **argv);
/* doctor.c: `ferry doctor [--json]` (docs/cli.md). */
int cmd_doctor(int argc, char **argv);

#endif
