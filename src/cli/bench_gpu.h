/* `ferry bench --backend cuda_ipc`: the GPU benchmarks of the CUDA IPC transport (round
 * trip, streaming, CPU cost; docs/cli.md). Declarations shared by the bench_gpu*.c files.
 *
 * The producer (the `ferry bench` process) starts its consumers by re-executing itself
 * (`/proc/self/exe bench-gpu-worker ...`). Each consumer gets an AF_UNIX SOCK_SEQPACKET
 * channel and maps a shared results region: the run's parameters, two pages of 32-bit words
 * that both sides register with CUDA (the round-trip floor's ready word and one ack word per
 * rank), and one record per rank (progress, counters, first failure). */
#ifndef FERRY_CLI_BENCH_GPU_H
#define FERRY_CLI_BENCH_GPU_H

#include <stdint.h>
#include <sys/types.h>

#include "cli/cli.h"
#include "driver/driver.h"

#define GB_MAX_SIZES    8
#define GB_MAX_RANKS    64
#define GB_KEYS         4 /* pre-filled source buffers, each with its own pattern */
#define GB_MESSAGE_MAX  320
#define GB_PAGE         4096u
#define GB_FLAG_BYTES   (2 * GB_PAGE) /* the flag words: GB_WORD_ACK(GB_MAX_RANKS - 1) fits */
#define GB_CPU_BATCH    256           /* cpu: calls per batch (the pool holds a batch at once) */
#define GB_FLOOR_WARMUP 2             /* stream: untimed copies before a floor's timed ones */
#define GB_UNSET        INT64_MIN

enum { GB_MODE_RTT = 0, GB_MODE_STREAM = 1, GB_MODE_CPU = 2 };

/* ---- bench_gpu_opts.c ------------------------------------------------------------------ */

typedef struct gb_options {
    ferry_backend backend;        /* --backend: cuda_ipc or cuda_vmm */
    int mode;                     /* --mode */
    uint64_t sizes[GB_MAX_SIZES]; /* --item-size, a comma-separated list */
    uint32_t nsizes;
    int64_t iterations;            /* --iterations (rtt, cpu) */
    int64_t warmup;                /* --warmup (rtt) */
    int64_t rounds;                /* --rounds: ferry/floor alternation (rtt) */
    int64_t items;                 /* --items (stream) */
    int64_t consumers;             /* --consumers (rtt, stream) */
    int64_t verify_every;          /* --verify-every */
    int64_t floor_copies;          /* --floor-copies (stream): copies each floor times */
    int64_t producer_device;       /* --producer-device */
    int64_t consumer_device;       /* --consumer-device */
    int64_t devices[GB_MAX_RANKS]; /* --consumer-devices (rtt, stream) */
    uint32_t ndevices;
    int64_t pool_size, max_inflight, reclaim_interval_us, timeout_ms;
    uint64_t seed;
    int placements[2]; /* --control: FERRY_CONTROL_HOST and/or FERRY_CONTROL_DEVICE */
    uint32_t nplacements;
    int json, quiet;
} gb_options;

/* Parses argv (after "bench"). Returns 0, or CLI_EXIT_USAGE after printing why. */
int gb_parse_options(int argc, char **argv, gb_options *o);
const char *gb_mode_name(int mode);
const char *gb_placement_name(int placement);

/* ---- the results region (bench_gpu_proc.c) ----------------------------------------------- */

#define GB_MAGIC 0x6665727279475055ull /* "ferryGPU" */

/* Word indices in the flag pages (each on its own cache line). */
enum {
    GB_WORD_READY = 0,     /* rtt floor: the producer's stream writes the iteration */
    GB_WORD_RAW_P = 32,    /* cpu: the producer's raw stream writes */
    GB_WORD_RAW_WAIT = 48, /* cpu: the consumer's raw waits (always satisfied) */
    GB_WORD_RAW_C = 64,    /* cpu: the consumer's raw stream writes */
};
/* rtt floor: rank's stream writes the iteration back to its own ack word. */
#define GB_WORD_ACK(rank) (128u + 16u * (uint32_t)(rank))

typedef struct gb_params {
    uint64_t magic;
    uint32_t mode;
    uint32_t consumers;
    uint64_t seed;
    uint64_t timeout_ns;
    uint64_t max_item;     /* bytes of the consumers' item buffers */
    uint64_t items;        /* stream: items per phase, warm-up included (sizes the sample ring) */
    uint64_t sample_bytes; /* stream: most sampled bytes of one item */
    int32_t devices[GB_MAX_RANKS];
    uint32_t has_floor; /* floor_handle names the producer's floor buffer (rtt; stream with a
                         * consumer on another GPU: the peer floor reads it) */
    int32_t producer_pid;
    uint8_t floor_handle[FERRY_CU_IPC_HANDLE_SIZE];
    uint64_t region_bytes;
} gb_params;

/* STARTING until the worker is ready for messages; FAILED after a fatal error (message);
 * DONE after the DONE message. */
enum { GB_STARTING = 0, GB_READY = 1, GB_DONE = 2, GB_FAILED = 3 };

typedef struct gb_rank {
    uint64_t progress; /* seq of the last message handled (release store) */
    uint32_t state;
    uint32_t reserved;
    uint64_t verified;             /* items that passed verification */
    uint64_t errors;               /* items that failed it */
    uint64_t read_ns;              /* cpu: thread CPU time in ferry_consumer_read_async */
    uint64_t raw_ns;               /* cpu: the same in the raw driver calls */
    uint64_t decode_ns;            /* cpu: in ferry_descriptor_decode */
    uint64_t calls;                /* cpu: timed calls of each kind */
    uint64_t peer_ns, peer_copies; /* stream: the last peer floor this rank timed */
    char message[GB_MESSAGE_MAX];  /* first failure, "" if none */
} __attribute__((aligned(64))) gb_rank;

typedef struct gb_region {
    void *base;
    size_t bytes;
    int fd;
    gb_params *params;
    uint32_t *flags; /* GB_FLAG_BYTES of words, registered with CUDA by both sides */
    gb_rank *ranks;
} gb_region;

int gb_region_create(const gb_params *p, gb_region *r);
int gb_region_map(int fd, gb_region *r);
void gb_region_unmap(gb_region *r);

/* ---- the channel message ----------------------------------------------------------------- */

enum {
    GB_MSG_BEGIN = 1,  /* a pool phase starts: make a ferry consumer */
    GB_MSG_END = 2,    /* it ends: drain, verify what is pending, drop the consumer */
    GB_MSG_FERRY = 3,  /* rtt: a descriptor to read_async */
    GB_MSG_FLOOR = 4,  /* rtt: a floor iteration (wait ready, copy, write ack) */
    GB_MSG_STREAM = 5, /* stream: a descriptor to read_async, samples kept for checking */
    GB_MSG_CPU = 6,    /* cpu: a descriptor of the current batch */
    GB_MSG_DONE = 7,   /* the run is over */
    GB_MSG_PEER = 8,   /* stream: rank `key` times `iter` copies of `size` bytes of the
                        * producer's floor buffer into its own (the peer floor) */
};

#define GB_F_VERIFY    0x1u /* verify this item before noting progress */
#define GB_F_BATCH_END 0x2u /* cpu: the last descriptor of a batch */
#define GB_F_WARMUP    0x4u /* cpu: a warm-up batch (not timed) */

typedef struct gb_msg {
    uint32_t type;
    uint32_t flags;
    uint64_t seq; /* message number (progress), and the floor's word value */
    uint64_t iter;
    uint64_t key; /* the source pattern */
    uint64_t size;
    uint8_t desc[FERRY_DESCRIPTOR_SIZE];
} gb_msg;

/* ---- patterns and CUDA helpers (bench_gpu_cuda.c) ---------------------------------------- */

/* Byte `off` of pattern `key` is byte off % 8 of word off / 8 of a splitmix64 stream keyed by
 * (seed, key): any range can be generated or checked on its own. */
void gb_pattern_fill(uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed, uint64_t key);
/* -1 when buf (the pattern's bytes [off, off + len)) matches, else the first offset that
 * differs (*got, *want its bytes). */
int64_t gb_pattern_check(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed,
                         uint64_t key, uint8_t *got, uint8_t *want);
/* The key after prev for item `item`: seeded, never equal to prev. */
uint64_t gb_next_key(uint64_t prev, uint64_t seed, uint64_t item);

/* Spans of an item a stream consumer checks: the whole item up to 1 MiB; else the first and
 * last 4 KiB and one 4 KiB block per 8 MiB at a seeded offset. */
typedef struct gb_span {
    uint64_t off;
    uint64_t len;
} gb_span;
#define GB_MAX_SPANS 258
uint32_t gb_sample_spans(uint64_t seed, uint64_t item, uint64_t size, gb_span *spans);
uint64_t gb_sample_bytes(uint64_t size);

uint64_t gb_thread_cpu_ns(void);
/* Waits at most timeout_ns for stream to finish (cuStreamQuery polling). TIMEOUT names what
 * it waited for. */
ferry_status gb_stream_wait(const ferry__cuda *cu, CUstream s, uint64_t timeout_ns,
                            const char *what);
/* Fills a device buffer with pattern key (through a host staging buffer). */
ferry_status gb_fill_device(const ferry__cuda *cu, CUdeviceptr dst, uint64_t bytes, uint64_t seed,
                            uint64_t key);
/* Registers the region's flag pages with CUDA (current context), gets their device address. */
ferry_status gb_register_flags(const ferry__cuda *cu, gb_region *r, CUdeviceptr *dev);
/* Mapping with CUDA as helpers that record "call failed: ..." in ferry_last_error(). */
ferry_status gb_alloc(const ferry__cuda *cu, CUdeviceptr *p, uint64_t bytes);
void gb_free(const ferry__cuda *cu, CUdeviceptr *p);

/* ---- the producer (bench_gpu.c, bench_gpu_proc.c) ------------------------------------------ */

typedef struct gb_worker {
    pid_t pid;
    int sock;
    int running;
    int wstatus;
} gb_worker;

typedef struct gb_lat {
    int ran;
    uint64_t samples;
    double mean_us, p50_us, p99_us;
    uint64_t background; /* rtt: iterations the background reclaimer took (not counted) */
    double items_per_s;  /* iterations / time in them (verification pauses not counted) */
} gb_lat;

/* stream: the peer floor of one consumer GPU other than the producer's. */
typedef struct gb_peer {
    int device;
    uint64_t copies;
    double seconds, gbps; /* gbps: bytes read (size * copies) per second */
} gb_peer;

/* One result row: a (control placement, item size) pair. */
typedef struct gb_row {
    int placement;
    uint64_t size;
    uint64_t verified, errors;
    gb_lat ferry, floor;                                       /* rtt */
    double seconds, items_per_s, payload_gbps, effective_gbps; /* stream */
    uint64_t pool_full;                                        /* stream */
    double floor_gbps, floor_seconds; /* stream: device copy, read + written */
    uint64_t floor_copies;            /* stream */
    double read_gbps;                 /* stream: items * size * consumers / s */
    gb_peer peers[GB_MAX_RANKS];      /* stream: one per remote consumer GPU */
    uint32_t npeers;
    double publish_ns, publish_raw_ns;      /* cpu, per call */
    double read_ns, read_raw_ns, decode_ns; /* cpu, per call */
    double context_ns;                      /* cpu: one cuCtxSetCurrent */
} gb_row;

typedef struct gb_run {
    const gb_options *opt;
    const ferry__cuda *cu;
    gb_region region;
    gb_worker workers[GB_MAX_RANKS];
    uint32_t consumers;
    uint64_t seq; /* last message number sent */
    uint64_t last_check_ns;
    int failed;
    char error[1024];
    ferry_pool *pool;
    int placement; /* of the current pool */
    CUstream stream;
    CUdeviceptr src[GB_KEYS]; /* pre-filled sources of the largest item size */
    CUdeviceptr aux;          /* rtt: the floor buffer; stream: the copy floor's target, the peer
                               * floor's source */
    CUdeviceptr word;         /* cpu: a device word for the raw calls (device placement) */
    CUdeviceptr flags_dev;    /* the flag pages' device address (0: not registered) */
    uint64_t key;             /* last key handed out */
    gb_row rows[2 * GB_MAX_SIZES];
    uint32_t nrows;
} gb_run;

int gb_fail(gb_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int gb_spawn_workers(gb_run *run);
int gb_wait_ready(gb_run *run);
/* Reaps exited workers and looks for FAILED ones: either fails the run. */
int gb_check_workers(gb_run *run);
int gb_check_workers_often(gb_run *run);
/* Sends msg (its seq set to the next number) to ranks [0, nranks). */
int gb_send(gb_run *run, uint32_t nranks, gb_msg *msg);
/* Waits until ranks [0, nranks) have handled message seq. */
int gb_wait_progress(gb_run *run, uint32_t nranks, uint64_t seq);
int gb_finish_workers(gb_run *run);
void gb_kill_workers(gb_run *run);
/* Sends BEGIN / END of a pool phase (END waits until every rank has drained). */
int gb_phase_begin(gb_run *run, uint32_t nranks);
int gb_phase_end(gb_run *run, uint32_t nranks);
/* Sum of the ranks' verified and errors counters. */
void gb_counters(const gb_run *run, uint64_t *verified, uint64_t *errors);
/* Loops ferry_pool_reclaim until no lease is in flight (or the timeout). */
int gb_drain_pool(gb_run *run);
ferry_status gb_pool_stats(ferry_pool *pool, ferry_pool_stats *s);
uint64_t gb_take_key(gb_run *run, uint64_t item);

/* The modes: one row of results for the current pool (run->pool, run->placement) and one
 * item size. */
int gb_rtt_row(gb_run *run, gb_row *row);
int gb_stream_row(gb_run *run, gb_row *row);
int gb_cpu_row(gb_run *run, gb_row *row);
/* stream: copies a floor times for items of size bytes (--floor-copies, else about 4 GiB). */
uint64_t gb_floor_copies(const gb_options *o, uint64_t size);
/* stream: whether any consumer is on a GPU other than the producer's. */
int gb_has_remote(const gb_run *run);
/* stream: the peer floor of every remote consumer GPU, into row->peers. */
int gb_peer_floors(gb_run *run, gb_row *row);

void gb_report_text(const gb_run *run);
void gb_report_json(const gb_run *run);

/* ---- a consumer process (bench_gpu_worker.c, bench_gpu_consume.c) --------------------------- */

/* An item whose samples wait in the device sample ring. */
typedef struct gb_pending {
    uint64_t iter, key, size;
    uint64_t at; /* offset of its samples in the ring */
} gb_pending;

typedef struct gb_ws {
    uint32_t rank;
    int sock;
    gb_region region;
    gb_params p;
    gb_rank *me;
    const ferry__cuda *cu;
    int device;
    CUstream stream;
    CUdeviceptr dst;       /* p.max_item bytes: where ferry's reads land */
    CUdeviceptr raw_dst;   /* cpu: where the raw calls' copies land */
    CUdeviceptr word;      /* cpu, device placement: the raw calls' words */
    CUdeviceptr flags_dev; /* the flag pages, registered (rtt, cpu) */
    CUdeviceptr peer;      /* the producer's floor buffer, opened through CUDA IPC (rtt; stream
                            * ranks that time a peer floor) */
    uint8_t *host;         /* verification staging */
    uint64_t host_bytes;
    ferry_consumer *consumer; /* between BEGIN and END */
    CUdeviceptr ring;         /* stream: the sample ring */
    uint64_t ring_bytes, ring_used;
    gb_pending *pending;
    uint32_t npending, max_pending;
    gb_msg *batch; /* cpu: the messages of the current batch */
    uint32_t nbatch;
    uint64_t batches;
    CUdeviceptr raw_src; /* cpu: a pointer into the pool as this consumer maps it */
} gb_ws;

/* A fatal error: noted in the region (state FAILED); returns -1. */
int gw_fail(gb_ws *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A verification error: counted, the first one noted. */
void gw_error(gb_ws *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Decodes m's descriptor and checks it against m (size, buffer room, key). */
int gw_decode(gb_ws *w, const gb_msg *m, ferry_descriptor *d);
/* Waits (bounded) for the consumer's stream. */
int gw_sync(gb_ws *w, const char *what);
/* Copies n bytes of dev to w->host and checks them against pattern key at offset 0. */
int gw_check_item(gb_ws *w, CUdeviceptr dev, uint64_t n, uint64_t key, uint64_t iter,
                  const char *what);
int gw_stream_init(gb_ws *w);
int gw_on_stream(gb_ws *w, const gb_msg *m);
/* Checks every item whose samples wait in the ring. */
int gw_flush(gb_ws *w);
int gw_on_cpu(gb_ws *w, const gb_msg *m);
/* Opens the producer's floor buffer (w->peer) through CUDA IPC. */
int gw_open_floor(gb_ws *w);
int gw_on_peer(gb_ws *w, const gb_msg *m);

int cmd_bench_gpu(int argc, char **argv);
int cmd_bench_gpu_worker(int argc, char **argv);
/* Whether argv (after "bench") selects --backend cuda_ipc. */
int bench_gpu_selected(int argc, char **argv);

#endif
