/* The GPU modes of `ferry bench` (--backend cuda_ipc or cuda_vmm: rtt, stream, cpu): what they
 * share (gpu.c): their own driver calls (the library's driver, through
 * ferry_gpu_driver_symbol); the payload patterns; the producer's device buffers and its loop
 * over (control placement, item size) rows; a consumer's device, stream and buffers; the
 * report's frame. */
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

/* Loads the driver the first time (the library's, through ferry_gpu_driver_symbol): NULL, or
 * why it could not be loaded. */
const char *gpu_driver_load(void);
/* Makes device's primary context current on the calling thread. */
CUresult gpu_use_device(int device);
/* Fills bytes of device memory at dst with pattern (seed, key), through host staging. */
CUresult gpu_fill_device(CUdeviceptr dst, uint64_t bytes, uint64_t seed, uint64_t key);

#define GPU_KEYS 4 /* pre-filled source buffers, each with its own pattern */

/* A timed run of copies: the stream's floors. */
typedef struct gpu_copies {
    int device;
    uint64_t copies;
    double seconds, gbps;
} gpu_copies;

/* One result row: a (control placement, item size) pair, and the mode's numbers. */
typedef struct gpu_row {
    int placement;
    uint64_t size, verified, errors;
    union {
        lat_stats lat[2]; /* rtt: ferry, floor */
        struct stream_row {
            double seconds, items_per_s, payload_gbps, effective_gbps, read_gbps;
            uint64_t pool_full;
            gpu_copies floor, peers[BENCH_MAX_RANKS]; /* floor: read + written; peers: read */
            uint32_t npeers;
        } stream;
        double cpu[8]; /* ns, in the order of cpu.c's JSON keys */
    };
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
    uint64_t size, *lat[2], busy_ns[2]; /* rtt: the row being measured (ferry, floor) */
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

/* The defaults of every GPU mode; the consumers follow --consumer-devices (gpu.c). */
#define GPU_DEFAULTS BENCH_DEFAULTS, .consumers = BENCH_UNSET, .items = 200

enum { MSG_ITEM = 8, MSG_OWN = 9 }; /* an item of the pool; the mode's own message */

/* The mode's part of a GPU mode (gpu.c makes the bench_mode): what it needs, whether it has
 * a message of its own, the defaults of the options the user did not give; the producer's
 * params of its own (may be NULL), one row, its report; a consumer's setup of its own (may be
 * NULL), its messages other than BEGIN and END (MSG_ITEM: an item of the pool, checked
 * against the run first) and its drain at the end of a phase (may be NULL). */
typedef struct gpu_mode_ops {
    unsigned needs;
    int own_msg;
    bench_opts defaults; /* GPU_DEFAULTS and the mode's own */
    void (*prepare)(bench_run *run);
    int (*row)(bench_run *run, gpu_row *row);
    void (*text)(const bench_run *run);
    void (*json_row)(const bench_run *run, const gpu_row *row);
    int (*init)(bench_worker *w);
    int (*handle)(bench_worker *w, const bench_msg *m);
    int (*flush)(bench_worker *w);
} gpu_mode_ops;

extern const gpu_mode_ops rtt_ops, stream_ops, cpu_ops;

/* A driver call: 0, or the run (the worker) fails with its name and error. */
#define RUN_CU(run, what, fn, ...) gpu_cu(run, what, #fn, cu->fn(__VA_ARGS__))
#define WORKER_CU(w, fn, ...)      gpu_worker_cu(w, #fn, cu->fn(__VA_ARGS__))
int gpu_cu(bench_run *run, const char *what, const char *call, CUresult rc);
int gpu_worker_cu(bench_worker *w, const char *call, CUresult rc);

/* Item iter of size bytes: its key, checked when iter is a multiple of --verify-every. */
bench_msg gpu_item(bench_run *run, uint32_t type, uint64_t iter, uint64_t size);
/* Loops ferry_pool_reclaim until no lease is in flight (or the timeout). */
int gpu_drain_pool(bench_run *run);
int gpu_stream_drained(bench_run *run, const char *what);
/* Publishes m's item from its source on the producer's stream, encodes into m->desc. */
int gpu_publish(bench_run *run, bench_msg *m, const char *what);
const char *gpu_placement(int placement);
/* Whether any consumer is on a GPU other than the producer's. */
int gpu_has_remote(const bench_opts *o);

typedef struct gpu_pending {
    uint64_t iter, key, size, at; /* at: offset of its samples in the ring */
} gpu_pending;

typedef struct gpu_span {
    uint64_t off, len;
} gpu_span;

typedef struct gpu_worker {
    int device;
    CUstream stream;
    CUdeviceptr dst;          /* max_item bytes: where ferry's reads land */
    CUdeviceptr raw_dst;      /* cpu: where the raw calls' copies land */
    CUdeviceptr word;         /* cpu: the raw calls' device words */
    CUdeviceptr flags_dev;    /* the flag pages, registered (rtt, cpu) */
    CUdeviceptr peer;         /* the producer's floor buffer, opened through CUDA IPC */
    uint8_t *host;            /* verification staging */
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

int gpu_worker_sync(bench_worker *w, const char *what);
/* Checks item e's spans, staged one after another at buf, against its pattern: it counts as
 * verified, or the error is counted and noted. */
void gpu_worker_verify(bench_worker *w, const char *what, const gpu_pending *e, const uint8_t *buf,
                       const gpu_span *spans, uint32_t n);
/* Copies n bytes at dev to the host and checks them against pattern key. */
int gpu_worker_check(bench_worker *w, CUdeviceptr dev, uint64_t n, uint64_t key, uint64_t iter,
                     const char *what);
/* Reads m's item into dst on the consumer's stream. */
int gpu_worker_read(bench_worker *w, const bench_msg *m);
/* Opens the producer's floor buffer (peer) through CUDA IPC. */
int gpu_worker_open_floor(bench_worker *w);

#endif
