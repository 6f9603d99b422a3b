/* The GPU modes of `ferry bench` (--backend cuda_ipc or cuda_vmm: rtt, stream, cpu): what they
 * share (gpu.c): the CUDA driver, loaded by the tool itself; the payload patterns; the
 * producer's device buffers and its loop over (control placement, item size) rows; a
 * consumer's device, stream and buffers; the report's frame. */
#ifndef FERRY_TOOL_GPU_H
#define FERRY_TOOL_GPU_H

#include "bench.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct {
    char reserved[64];
} CUipcMemHandle;

#define CUDA_SUCCESS                 0
#define CUDA_ERROR_NOT_READY         600
#define CU_STREAM_NON_BLOCKING       0x1u
#define CU_STREAM_WAIT_VALUE_GEQ     0x0u
#define CU_IPC_LAZY_PEER_ACCESS      0x1u
#define CU_MEMHOSTREGISTER_PORTABLE  0x01u
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02u

/* X(name, CUDA version of its ABI, parameters) */
#define CU_FUNCTIONS(X)                                                                            \
    X(cuGetErrorName, 6000, (CUresult, const char **))                                             \
    X(cuGetErrorString, 6000, (CUresult, const char **))                                           \
    X(cuInit, 2000, (unsigned int))                                                                \
    X(cuDeviceGetCount, 2000, (int *))                                                             \
    X(cuDeviceGet, 2000, (CUdevice *, int))                                                        \
    X(cuDevicePrimaryCtxRetain, 7000, (CUcontext *, CUdevice))                                     \
    X(cuCtxSetCurrent, 4000, (CUcontext))                                                          \
    X(cuCtxGetCurrent, 4000, (CUcontext *))                                                        \
    X(cuMemAlloc, 3020, (CUdeviceptr *, size_t))                                                   \
    X(cuMemFree, 3020, (CUdeviceptr))                                                              \
    X(cuMemcpy, 4000, (CUdeviceptr, CUdeviceptr, size_t))                                          \
    X(cuMemcpyAsync, 4000, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                           \
    X(cuMemsetD32, 3020, (CUdeviceptr, unsigned int, size_t))                                      \
    X(cuMemHostRegister, 6050, (void *, size_t, unsigned int))                                     \
    X(cuMemHostUnregister, 4000, (void *))                                                         \
    X(cuMemHostGetDevicePointer, 3020, (CUdeviceptr *, void *, unsigned int))                      \
    X(cuIpcGetMemHandle, 4010, (CUipcMemHandle *, CUdeviceptr))                                    \
    X(cuIpcOpenMemHandle, 11000, (CUdeviceptr *, CUipcMemHandle, unsigned int))                    \
    X(cuIpcCloseMemHandle, 4010, (CUdeviceptr))                                                    \
    X(cuStreamCreate, 2000, (CUstream *, unsigned int))                                            \
    X(cuStreamDestroy, 4000, (CUstream))                                                           \
    X(cuStreamQuery, 2000, (CUstream))                                                             \
    X(cuStreamWaitValue32, 12000, (CUstream, CUdeviceptr, uint32_t, unsigned int))                 \
    X(cuStreamWriteValue32, 12000, (CUstream, CUdeviceptr, uint32_t, unsigned int))

typedef struct cu_api {
    int device_count;
#define CU_SLOT_(name, version, params) CUresult(*name) params;
    CU_FUNCTIONS(CU_SLOT_)
#undef CU_SLOT_
} cu_api;

/* "call failed: CUDA_ERROR_X (text, N)", in a thread-local buffer. */
const char *cu_error(const char *call, CUresult rc);

extern const cu_api *cu;

#define GPU_KEYS 4 /* pre-filled source buffers, each with its own pattern */

/* Byte off of pattern key is byte off % 8 of word off / 8 of a splitmix64 stream keyed by
 * (seed, key): -1 when buf matches bytes [off, off + len) of it, else the first offset that
 * differs. */
int64_t pattern_check(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed, uint64_t key,
                      uint8_t *got, uint8_t *want);

typedef struct gpu_lat {
    uint64_t samples;
    double mean_us, p50_us, p99_us;
    uint64_t background; /* rtt: iterations the background reclaimer took (not counted) */
    double items_per_s;
} gpu_lat;

typedef struct gpu_peer {
    int device;
    uint64_t copies;
    double seconds, gbps; /* bytes read per second */
} gpu_peer;

/* One result row: a (control placement, item size) pair. */
typedef struct gpu_row {
    int placement;
    uint64_t size, verified, errors;
    gpu_lat ferry, floor;                                      /* rtt */
    double seconds, items_per_s, payload_gbps, effective_gbps; /* stream */
    uint64_t pool_full, floor_copies;
    double floor_gbps, floor_seconds, read_gbps;
    gpu_peer peers[BENCH_MAX_RANKS];
    uint32_t npeers;
    double publish_ns, publish_raw_ns, read_ns, read_raw_ns, decode_ns, context_ns; /* cpu */
} gpu_row;

typedef struct gpu_run {
    ferry_pool *pool;
    int placement; /* of the current pool */
    CUstream stream;
    CUdeviceptr src[GPU_KEYS]; /* pre-filled sources of the largest item size */
    CUdeviceptr aux;           /* rtt: the floor buffer; stream: the copy floor's target */
    CUdeviceptr word;          /* cpu: a device word for the raw calls */
    CUdeviceptr flags_dev;     /* the flag pages' device address (0: not registered) */
    uint64_t key;              /* last key handed out */
    gpu_row rows[2 * BENCH_MAX_SIZES];
    uint32_t nrows;
} gpu_run;

#define GPU(run) ((gpu_run *)(run)->state)

enum {
    NEED_AUX = 1,            /* the floor's device buffer */
    NEED_EXPORT = 2,         /* exported to the consumers */
    NEED_EXPORT_REMOTE = 4,  /* exported when a consumer is on another GPU */
    NEED_FLAGS = 8,          /* the flag pages registered with CUDA in every process */
    NEED_WORD = 16,          /* a device word for the raw calls */
    NEED_QUIET_LIBRARY = 32, /* a full pool is the steady state: no library warnings */
};

/* The mode's part of a GPU mode (bench_mode.family_ops): what it needs, the defaults of the
 * options the user did not give, one row, its report; a consumer's messages other than BEGIN
 * and END (MSG_ITEM: an item of the pool, checked against the run first) and its drain at the
 * end of a phase (may be NULL). */
typedef struct gpu_mode_ops {
    unsigned needs;
    struct {
        int64_t pool_size, item_size, item_size2, max_inflight, verify_every, iterations, warmup;
        int64_t reclaim_interval_us;
    } defaults;
    int (*row)(bench_run *run, gpu_row *row);
    void (*text)(const bench_run *run);
    void (*json_row)(const bench_run *run, const gpu_row *row);
    int (*handle)(bench_worker *w, const bench_msg *m);
    int (*flush)(bench_worker *w);
} gpu_mode_ops;

enum { MSG_ITEM = 8 }; /* the modes' other messages are 9 and up */

/* The bench_mode slots every GPU mode shares. */
void gpu_defaults(const bench_mode *mode, bench_opts *o);
int gpu_check(const bench_opts *o);
int gpu_prepare(bench_run *run);
int gpu_measure(bench_run *run);
void gpu_release(bench_run *run, int failed);
void gpu_text(const bench_run *run);
void gpu_json(const bench_run *run);
int gpu_worker_init(bench_worker *w);
int gpu_worker_handle(bench_worker *w, const bench_msg *m);
void gpu_worker_release(bench_worker *w, int clean);

/* A GPU mode's bench_mode: the slots every GPU mode shares, and its own. */
#define GPU_MODE(mode_name, ops, prepare_fn, init_fn)                                              \
    {                                                                                              \
        .name = mode_name, .family = FAMILY_GPU, .progress_by_seq = 1, .family_ops = ops,          \
        .defaults = gpu_defaults, .check = gpu_check, .prepare = prepare_fn,                       \
        .measure = gpu_measure, .report_text = gpu_text, .report_json = gpu_json,                  \
        .release = gpu_release, .worker_init = init_fn, .worker_handle = gpu_worker_handle,        \
        .worker_release = gpu_worker_release,                                                      \
    }

uint64_t gpu_take_key(bench_run *run, uint64_t item);
/* Loops ferry_pool_reclaim until no lease is in flight (or the timeout). */
int gpu_drain_pool(bench_run *run);
int gpu_cu_fail(bench_run *run, const char *what, const char *call, CUresult rc);
int gpu_stream_drained(bench_run *run, const char *what);
/* Publishes from source key on the producer's stream, encodes into m->desc. */
int gpu_publish(bench_run *run, uint64_t key, uint64_t size, bench_msg *m, const char *what);
double gpu_ratio(double a, double b);
const char *gpu_placement(int placement);
/* Whether any consumer is on a GPU other than the producer's. */
int gpu_has_remote(const bench_opts *o);

typedef struct gpu_pending {
    uint64_t iter, key, size, at; /* at: offset of its samples in the ring */
} gpu_pending;

typedef struct gpu_worker {
    int device;
    CUstream stream;
    CUdeviceptr dst;       /* max_item bytes: where ferry's reads land */
    CUdeviceptr raw_dst;   /* cpu: where the raw calls' copies land */
    CUdeviceptr word;      /* cpu: the raw calls' device words */
    CUdeviceptr flags_dev; /* the flag pages, registered (rtt, cpu) */
    CUdeviceptr peer;      /* the producer's floor buffer, opened through CUDA IPC */
    uint8_t *host;         /* verification staging */
    uint64_t host_bytes;
    ferry_consumer *consumer; /* between BEGIN and END */
    CUdeviceptr ring;         /* stream: the sample ring */
    uint64_t ring_bytes, ring_used;
    gpu_pending *pending;
    uint32_t npending, max_pending;
    bench_msg *batch; /* cpu: the messages of the current batch */
    uint32_t nbatch;
    uint64_t batches;
    CUdeviceptr raw_src; /* cpu: a pointer into the pool as this consumer maps it */
} gpu_worker;

#define GW(w) ((gpu_worker *)(w)->state)

int gpu_worker_cu(bench_worker *w, const char *call, CUresult rc);
int gpu_worker_sync(bench_worker *w, const char *what);
/* Copies n bytes at dev to the host and checks them against pattern key. */
int gpu_worker_check(bench_worker *w, CUdeviceptr dev, uint64_t n, uint64_t key, uint64_t iter,
                     const char *what);
/* Reads m's item into dst on the consumer's stream. */
int gpu_worker_read(bench_worker *w, const bench_msg *m);
/* Opens the producer's floor buffer (peer) through CUDA IPC. */
int gpu_worker_open_floor(bench_worker *w);

#endif
