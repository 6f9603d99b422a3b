/*
 * ferry: hand tensors between processes through one bounded, pre-allocated pool.
 *
 * A producer owns a pool. It publishes each tensor into a leased slice of the pool and
 * sends the small descriptor that publish returns (FERRY_DESCRIPTOR_SIZE bytes) to its
 * consumers over any channel it likes. Each of the pool's consumers opens the pool once,
 * waits for the slice to be ready, reads it and acknowledges it as its rank. The producer
 * recycles the slice once every rank has acknowledged it.
 *
 * Conventions: every function returns a ferry_status (0 = FERRY_OK); on failure the
 * detailed message of the failure is available from ferry_last_error() on the same
 * thread. Outputs are the last parameters and are written only on success. Objects are
 * opaque; destroy(NULL) is a no-op.
 *
 * Threads: a pool and a consumer may be used from any number of threads at once, close
 * included (see ferry_pool_close for what a call racing it gets); only destroy must come
 * after every other call on the object has returned.
 *
 * Processes: a rank belongs to one live process at a time. The calls that read a lease (open,
 * wait, read, view and their stream-ordered forms) claim the consumer's rank for the calling
 * process; a second live process claiming it gets RANK_IN_USE, naming the holder's pid. A
 * rank whose process died may be claimed again (a restarted worker): the leases the dead
 * process held are acknowledged on its behalf first (those published before the new process
 * started; later ones may be on their way to it). A process keeps the ranks it claimed by a
 * pool's local address until it exits, also after destroying its consumers: a restarted
 * worker should claim its rank (ferry_consumer_open) before it is sent work. Consumers by
 * remote address give their rank back when destroyed (ferry_consumer_connect).
 * Acknowledgements claim nothing, so any process (a group leader, the producer itself) may
 * acknowledge on behalf of other ranks. A consumer in the producer's own process works on
 * every backend and placement.
 *
 * fork(): pools and consumers belong to the process that created them. In a forked child
 * every call on them fails with FORKED; ferry_pool_destroy and ferry_consumer_destroy there
 * release only the child's copies (no thread joined, no shared word written, no device
 * call). A child makes its own consumers (claiming ranks as itself) and its own pools.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FERRY_BUILDING) && defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_NUMBER                                                                       \
    (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

/* Status codes: stable values, one X-macro list (name, value, short text). */
#define FERRY_STATUS_MAP(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                                     \
    X(POOL_FULL, 2, "pool is full")                                                                \
    X(STALE, 3, "descriptor is stale")                                                             \
    X(TIMEOUT, 4, "timed out")                                                                     \
    X(PRODUCER_GONE, 5, "producer is gone")                                                        \
    X(MALFORMED, 6, "malformed descriptor")                                                        \
    X(MISMATCH, 7, "descriptor does not match the pool")                                           \
    X(NOT_SUPPORTED, 8, "not supported")                                                           \
    X(NO_MEMORY, 9, "out of memory")                                                               \
    X(SYSTEM, 10, "system call failed")                                                            \
    X(GENERATION_EXHAUSTED, 11, "slot generation exhausted")                                       \
    X(INACTIVE_LEASE, 12, "lease is not active")                                                   \
    X(CLOSING, 13, "pool is closing")                                                              \
    X(POOL_FAILED, 14, "pool failed")                                                              \
    X(PERMISSION, 15, "permission denied")                                                         \
    X(DRIVER, 16, "device driver error")                                                           \
    X(RANK_IN_USE, 17, "rank is held by another live process")                                     \
    X(FORKED, 18, "object belongs to the process that created it")

typedef enum ferry_status {
#define FERRY_STATUS_ENUM_(name, value, text) FERRY_##name = value,
    FERRY_STATUS_MAP(FERRY_STATUS_ENUM_)
#undef FERRY_STATUS_ENUM_
} ferry_status;

/* Short fixed text of a status ("pool is full"); never NULL. */
FERRY_API const char *ferry_status_str(ferry_status status);

/* Symbolic name of a status ("POOL_FULL"); never NULL. */
FERRY_API const char *ferry_status_name(ferry_status status);

/* Detailed message of the last failure on the calling thread ("" if none). The buffer is
 * thread-local and valid until the next ferry call on this thread. */
FERRY_API const char *ferry_last_error(void);

/* Library version as "MAJOR.MINOR.PATCH". */
FERRY_API const char *ferry_version(void);

/* The library's version as a number, MAJOR * 10000 + MINOR * 100 + PATCH, to compare the
 * library a program runs with against the FERRY_VERSION_NUMBER it was built with. */
FERRY_API uint32_t ferry_version_number(void);

/* ------------------------------------------------------------------------------------
 * Tensors
 * ---------------------------------------------------------------------------------- */

#define FERRY_MAX_NDIM 8

/* DLPack type codes (DLDataTypeCode). */
enum {
    FERRY_DTYPE_INT = 0,
    FERRY_DTYPE_UINT = 1,
    FERRY_DTYPE_FLOAT = 2,
    FERRY_DTYPE_OPAQUE_HANDLE = 3,
    FERRY_DTYPE_BFLOAT = 4,
    FERRY_DTYPE_COMPLEX = 5,
    FERRY_DTYPE_BOOL = 6,
    /* DLPack 1.1's low-precision floats (bits 8, 6 or 4 as their names say). */
    FERRY_DTYPE_FLOAT8_E3M4 = 7,
    FERRY_DTYPE_FLOAT8_E4M3 = 8,
    FERRY_DTYPE_FLOAT8_E4M3B11FNUZ = 9,
    FERRY_DTYPE_FLOAT8_E4M3FN = 10,
    FERRY_DTYPE_FLOAT8_E4M3FNUZ = 11,
    FERRY_DTYPE_FLOAT8_E5M2 = 12,
    FERRY_DTYPE_FLOAT8_E5M2FNUZ = 13,
    FERRY_DTYPE_FLOAT8_E8M0FNU = 14,
    FERRY_DTYPE_FLOAT6_E2M3FN = 15,
    FERRY_DTYPE_FLOAT6_E3M2FN = 16,
    FERRY_DTYPE_FLOAT4_E2M1FN = 17,
    FERRY_DTYPE_LAST = FERRY_DTYPE_FLOAT4_E2M1FN,
};

/* A dense, C-contiguous tensor's metadata: DLPack dtype and shape. Its size in bytes is
 * product(shape) * bits * lanes / 8; bits * lanes must be a multiple of 8. */
typedef struct ferry_tensor {
    uint8_t dtype_code;
    uint8_t dtype_bits;
    uint16_t dtype_lanes;
    uint8_t ndim;
    int64_t shape[FERRY_MAX_NDIM];
} ferry_tensor;

/* A 1-D tensor of n bytes (dtype uint8). */
FERRY_API ferry_tensor ferry_tensor_bytes(uint64_t n);

/* Size in bytes of a tensor; fails with INVALID_ARGUMENT on a bad dtype, a negative
 * dimension, ndim > FERRY_MAX_NDIM or overflow. */
FERRY_API ferry_status ferry_tensor_nbytes(const ferry_tensor *tensor, uint64_t *nbytes);

/* ------------------------------------------------------------------------------------
 * Descriptors (docs/wire-format.md)
 * ---------------------------------------------------------------------------------- */

#define FERRY_DESCRIPTOR_SIZE 256

typedef enum ferry_backend {
    /* Resolved when the pool is created, by where the data is (the config's device) and what
     * the machine supports: see ferry_backend_resolve. */
    FERRY_BACKEND_AUTO = 0,
    FERRY_BACKEND_HOST = 1,
    FERRY_BACKEND_CUDA_IPC = 2,
    FERRY_BACKEND_CUDA_VMM = 3,
} ferry_backend;

/* Name of a backend ("host", "cuda_ipc", "cuda_vmm", "auto"); NULL for an unknown value. */
FERRY_API const char *ferry_backend_name(ferry_backend backend);

/* Parses a backend name; INVALID_ARGUMENT for an unknown one. */
FERRY_API ferry_status ferry_backend_parse(const char *name, ferry_backend *backend);

/* 1 when the pools of backend keep their data in GPU memory (cuda_ipc, cuda_vmm); 0 for
 * host, for auto (decided at create) and for an unknown value. */
FERRY_API int ferry_backend_uses_gpu(ferry_backend backend);

/* The decoded form of a descriptor. One descriptor names one tensor inside one lease; the
 * tensors of a multi-tensor publish share slot and generation. */
typedef struct ferry_descriptor {
    uint8_t backend;         /* ferry_backend */
    uint8_t flags;           /* FERRY_DESC_FLAG_* */
    uint16_t consumer_count; /* ranks that must acknowledge */
    uint32_t max_inflight;   /* rows of the pool's control table */
    uint32_t slot;           /* control-table row of the lease */
    uint32_t generation;     /* generation of the lease in that row */
    uint64_t offset;         /* byte offset of the tensor from the pool's data start */
    uint64_t length;         /* bytes of the tensor */
    uint64_t pool_size;      /* memory_size of the pool */
    uint8_t pool_id[16];     /* random identity of the pool */
    uint8_t broker[16];      /* random name of the pool's broker socket */
    uint32_t producer_pid;   /* producer's pid, in its own namespace (diagnostics only) */
    int32_t device;          /* producer's device ordinal, -1 for host memory */
    uint8_t handle[64];      /* backend-specific handle (CUDA IPC / FABRIC); zero for host */
    ferry_tensor tensor;     /* dtype and shape */
    uint32_t part_index;     /* packed lease: this tensor's index among its parts */
    uint32_t part_count;     /* packed lease: how many tensors it holds (0 if not packed) */
} ferry_descriptor;

/* Control words live in the device pool rather than host shared memory (GPU backends). */
#define FERRY_DESC_FLAG_DEVICE_CONTROL 0x01u
/* The lease holds several tensors (multi-tensor publish). */
#define FERRY_DESC_FLAG_MULTI 0x02u
/* The descriptor names the pool only, no lease: slot, generation, offset and length are 0
 * (ferry_pool_describe; consumers may only open the pool with it). */
#define FERRY_DESC_FLAG_POOL_ONLY 0x04u
/* CUDA VMM: handle holds a 64-byte FABRIC handle (otherwise the name of the broker that
 * hands out the pool's POSIX file descriptor, in its first 16 bytes). */
#define FERRY_DESC_FLAG_FABRIC 0x08u
#define FERRY_DESC_FLAGS_KNOWN 0x0Fu

/* Encodes a descriptor into exactly FERRY_DESCRIPTOR_SIZE bytes. Fails with
 * INVALID_ARGUMENT if the descriptor is not self-consistent. */
FERRY_API ferry_status ferry_descriptor_encode(const ferry_descriptor *desc,
                                               uint8_t out[FERRY_DESCRIPTOR_SIZE]);

/* Decodes and validates a descriptor received from the wire. Anything malformed (bad magic,
 * version, size, checksum, reserved bits, inconsistent tensor metadata) fails with
 * MALFORMED and leaves *desc untouched. Consistency with the opened pool is checked when a
 * consumer uses the descriptor. */
FERRY_API ferry_status ferry_descriptor_decode(const void *buf, size_t len, ferry_descriptor *desc);

/* ------------------------------------------------------------------------------------
 * Pools (producer side)
 * ---------------------------------------------------------------------------------- */

typedef struct ferry_pool ferry_pool;

#define FERRY_POOL_CONFIG_VERSION 3

typedef struct ferry_pool_config {
    uint32_t struct_size;        /* sizeof(ferry_pool_config), set by the initialiser */
    uint32_t version;            /* FERRY_POOL_CONFIG_VERSION */
    ferry_backend backend;       /* AUTO (default): ferry_backend_resolve(device) decides */
    int64_t memory_size;         /* bytes of pool memory: control table + data */
    int64_t consumer_count;      /* ranks that read every lease */
    int64_t max_inflight_slices; /* rows of the control table (default 4096) */
    int64_t reclaim_interval_us; /* background reclaim period (default 1000) */
    uint32_t initial_generation; /* first generation of every slot (tests; default 0) */
    int32_t device;              /* where the data is: a GPU ordinal, or FERRY_DEVICE_HOST;
                                  * default FERRY_DEVICE_DEFAULT: GPU 0 for the GPU backends,
                                  * host memory for AUTO */
    int32_t control_placement;   /* ferry_control_placement, GPU backends (default HOST) */
    int32_t vmm_handle;          /* ferry_vmm_handle, CUDA VMM only (default AUTO) */
    /* version 2 */
    int64_t channel_depth;    /* descriptors each rank's ring holds (ferry_pool_send): a power
                               * of two, default 64; the rings live in the shared host segment,
                               * consumer_count * (192 + 256 * channel_depth) bytes */
    int64_t drain_timeout_us; /* close first waits up to this long for every published lease
                               * to be acknowledged (ferry_pool_drain); default 0: no wait */
    /* version 3 */
    const char *listen;        /* "HOST:PORT" (port 0: any free one; HOST 0.0.0.0 or [::]: every
                                * interface): the pool also serves consumers on other hosts, over
                                * UCX (ferry_pool_remote_address); NULL (default): local only. The
                                * string is not kept. */
    int64_t remote_timeout_us; /* a remote consumer (or its host, or the link) silent this long
                                * is gone: its leases are acknowledged for it, and its calls
                                * get PRODUCER_GONE when the producer falls silent; default
                                * 5 s, at least 2 s */
} ferry_pool_config;

/* How a CUDA VMM pool is shared. */
typedef enum ferry_vmm_handle {
    /* FABRIC where cuMemCreate grants it, else POSIX_FD (single node); the choice is logged. */
    FERRY_VMM_HANDLE_AUTO = 0,
    /* FABRIC or fail ("CUDA VMM multimodal transport selected POSIX_FD, but this pool
     * requires FABRIC"): pools read across nodes over an NVLink fabric. */
    FERRY_VMM_HANDLE_FABRIC = 1,
    /* A POSIX file descriptor handed out by the pool's broker (single node). */
    FERRY_VMM_HANDLE_POSIX_FD = 2,
} ferry_vmm_handle;

/* Where a GPU pool keeps its control words. */
typedef enum ferry_control_placement {
    /* Host shared memory registered with CUDA in every process (default): the producer reads
     * acknowledgements with plain loads, and it measured ~35% faster than device memory. */
    FERRY_CONTROL_HOST = 0,
    /* Inside the device pool, as the reference layout has it (needed across nodes). */
    FERRY_CONTROL_DEVICE = 1,
} ferry_control_placement;

/* ferry_pool_config.device: the data is in host memory. */
#define FERRY_DEVICE_HOST (-1)
/* ferry_pool_config.device as the initialiser sets it: GPU 0 for the GPU backends; for AUTO,
 * host memory (a configuration that names no GPU never becomes a GPU pool). */
#define FERRY_DEVICE_DEFAULT (-2)

#define FERRY_POOL_CONFIG_INIT                                                                     \
    {                                                                                              \
        sizeof(ferry_pool_config), FERRY_POOL_CONFIG_VERSION, FERRY_BACKEND_AUTO, 0, 1, 4096,      \
            1000, 0, FERRY_DEVICE_DEFAULT, FERRY_CONTROL_HOST, FERRY_VMM_HANDLE_AUTO, 64, 0, NULL, \
            5000000                                                                                \
    }

/* Validates a configuration without creating anything; the messages are those of
 * ferry_pool_create. A config from a caller built against an older header (a smaller
 * struct_size, an older version) is accepted: the fields it lacks take their defaults. */
FERRY_API ferry_status ferry_pool_config_check(const ferry_pool_config *config);

/* Creates a pool: allocates its memory, starts its broker and its reclaimer thread.
 * FERRY_BACKEND_AUTO is resolved first, by ferry_backend_resolve(config->device): the choice
 * and its reason are logged once (FERRY_LOG_INFO) and the pool's descriptors carry the backend
 * it resolved to (ferry_pool_describe). On failure nothing is left behind. The caller owns
 * *pool (ferry_pool_destroy). */
FERRY_API ferry_status ferry_pool_create(const ferry_pool_config *config, ferry_pool **pool);

/* Shuts a pool down: refuses new publishers ("<transport> pool is closing"), waits for the
 * active ones, stops the reclaimer, closes the broker, then releases the memory. Consumers
 * still waiting see PRODUCER_GONE. From the moment close begins, every call on the pool on
 * any thread fails with CLOSING (ferry_pool_copied answers done = 1 once it has finished;
 * ferry_pool_error still reports a latched failure); calls already inside the pool finish
 * first, and a publisher waiting for space is woken. A second close, concurrent or later,
 * returns once the first has finished. While a reservation is outstanding (neither committed
 * nor cancelled) the memory stays mapped until ferry_pool_destroy, so that a writer still
 * filling it does not fault; its commit then fails CLOSING. NULL is a no-op. */
FERRY_API void ferry_pool_close(ferry_pool *pool);

/* Closes the pool if it is not closed yet, then frees it. NULL is a no-op. */
FERRY_API void ferry_pool_destroy(ferry_pool *pool);

/* FERRY_OK while the pool is healthy. Once a background part failed (its broker, its
 * reclaimer, a publish whose cleanup failed too), every later publish fails with
 * POOL_FAILED ("<transport> pool failed", "CUDA VMM multimodal pool failed"); this returns
 * that status and copies the first cause into cause (size bytes, may be NULL/0). */
FERRY_API ferry_status ferry_pool_error(ferry_pool *pool, char *cause, size_t size);

/* Timeouts are in nanoseconds. 0 means "do not wait". */
#define FERRY_NO_WAIT      0ull
#define FERRY_WAIT_FOREVER UINT64_MAX

/* Copies one tensor into a new lease and marks it ready. With timeout_ns == 0 a full pool
 * fails at once with POOL_FULL (a warning is logged once per pool); otherwise publish waits
 * up to timeout_ns for space (reclaiming acknowledged slices as they free up) and then fails
 * with POOL_FULL. A tensor larger than the pool's usable bytes fails with POOL_FULL at once,
 * whatever the timeout ("... can never fit ..."; counted in stats.too_large): the caller's
 * signal to take its fallback path. On success *desc is the descriptor to send to the
 * consumers. */
FERRY_API ferry_status ferry_pool_publish(ferry_pool *pool, const ferry_tensor *tensor,
                                          const void *src, uint64_t timeout_ns,
                                          ferry_descriptor *desc);

/* Publishes count tensors of one request into a single lease, each offset aligned to its
 * element size; descs[i] describes tensors[i] (part_index i of part_count count). All
 * descriptors share the lease: a rank may receive and acknowledge the parts one by one (in
 * one process), and the lease is acknowledged for that rank once all its parts are; any
 * process may acknowledge it whole through any part (ferry_consumer_ack_lease and its range
 * and all forms). A lease a rank acknowledged some parts of, not all, is counted in
 * ferry_pool_consumer_info's partly_acknowledged and named in POOL_FULL's message. The
 * producer cancels it through any part (cancelling another part afterwards is harmless). */
FERRY_API ferry_status ferry_pool_publish_many(ferry_pool *pool, const ferry_tensor *tensors,
                                               const void *const *srcs, size_t count,
                                               uint64_t timeout_ns, ferry_descriptor *descs);

/* Reserves a writable slice for one tensor without marking it ready (zero-copy publish):
 * *data points at the slice; write the tensor there, then call ferry_pool_commit. The
 * descriptor may be sent before the commit: consumers wait for it. */
FERRY_API ferry_status ferry_pool_reserve(ferry_pool *pool, const ferry_tensor *tensor,
                                          uint64_t timeout_ns, void **data, ferry_descriptor *desc);

/* Marks a reserved lease ready. Fails with INACTIVE_LEASE if it is not a reserved lease of
 * this pool. */
FERRY_API ferry_status ferry_pool_commit(ferry_pool *pool, const ferry_descriptor *desc);

/* Cancels a lease that was never dispatched (reserved or published): its slice is free
 * at once and its descriptor is refused as STALE by consumers. Cancelling twice fails with
 * INACTIVE_LEASE ("Cannot release inactive host pool lease (slot=S, generation=G)"). */
FERRY_API ferry_status ferry_pool_cancel(ferry_pool *pool, const ferry_descriptor *desc);

/* GPU pools, stream-ordered: copies the tensor (device memory, or pinned or pageable host
 * memory) into a new lease on stream (a CUstream; NULL is the legacy default stream) and
 * enqueues the ready write after it (cuStreamWriteValue32). Returns once both are enqueued:
 * no host synchronisation. The caller keeps src unchanged until the stream has run the copy.
 * On a host pool stream must be NULL and this is ferry_pool_publish. */
FERRY_API ferry_status ferry_pool_publish_async(ferry_pool *pool, const ferry_tensor *tensor,
                                                const void *src, void *stream, uint64_t timeout_ns,
                                                ferry_descriptor *desc);

/* Whether the stream has run a stream-ordered publish's copy (its ready write landed), so
 * that the sources may be changed or freed: *done = 1 then, 0 while it is pending. Also 1
 * for host pools, for leases no longer current (a slot is recycled only after its ready
 * write) and once the pool is closed; a reservation counts once its commit ran. Plain loads
 * of the control words, with control_placement DEVICE one read of the device's table. */
FERRY_API ferry_status ferry_pool_copied(ferry_pool *pool, const ferry_descriptor *desc, int *done);

/* Stream-ordered ferry_pool_publish_many (one lease, one ready write). */
FERRY_API ferry_status ferry_pool_publish_many_async(ferry_pool *pool, const ferry_tensor *tensors,
                                                     const void *const *srcs, size_t count,
                                                     void *stream, uint64_t timeout_ns,
                                                     ferry_descriptor *descs);

/* Stream-ordered commit of a reserved lease: the ready write is enqueued on stream after the
 * work the producer queued there to fill the slice. */
FERRY_API ferry_status ferry_pool_commit_async(ferry_pool *pool, const ferry_descriptor *desc,
                                               void *stream);

/* A descriptor that names the pool but no lease (FERRY_DESC_FLAG_POOL_ONLY), for consumers
 * to open the pool with ferry_consumer_open before the first tensor arrives. */
FERRY_API ferry_status ferry_pool_describe(ferry_pool *pool, ferry_descriptor *desc);

/* Frees every lease that every rank has acknowledged; *reclaimed (may be NULL) gets how
 * many. Also acknowledges on behalf of consumers whose process died. */
FERRY_API ferry_status ferry_pool_reclaim(ferry_pool *pool, uint64_t *reclaimed);

/* Waits until every published lease (committed, not cancelled) is acknowledged by all its
 * ranks, or acknowledged on their behalf because their process died: FERRY_OK then. TIMEOUT
 * after timeout_ns, naming the slowest rank, whether it is alive and what it holds; CLOSING
 * once close began. Outstanding reservations are not waited for. ferry_pool_close drains
 * first when the config's drain_timeout_us is set. */
FERRY_API ferry_status ferry_pool_drain(ferry_pool *pool, uint64_t timeout_ns);

/* ------------------------------------------------------------------------------------
 * Channels: connect by address, send and receive without a channel of your own
 *
 * Every pool has an address, a short printable string ("ferry:" and 32 lowercase hex digits,
 * the name of its broker on this machine) that a server passes in a flag, an environment
 * variable or its config; only that exact form is accepted. Consumers connect to it
 * (ferry_consumer_connect) and receive what the producer sends (ferry_pool_send) from their
 * rank's descriptor ring, which lives in the pool's shared host segment (channel_depth
 * entries per rank): no socket on the way. The descriptor API above stays as it is; the two
 * mix freely.
 * ---------------------------------------------------------------------------------- */

/* Bytes an address needs, NUL included. */
#define FERRY_ADDRESS_SIZE 40

/* The pool's address into buf (size >= FERRY_ADDRESS_SIZE); also once close began (it never
 * changes, but nobody answers at it after the close). */
FERRY_API ferry_status ferry_pool_address(ferry_pool *pool, char *buf, size_t size);

/* Bytes a remote address needs, NUL included. */
#define FERRY_REMOTE_ADDRESS_SIZE 352

/* The pool's remote address into buf (size >= FERRY_REMOTE_ADDRESS_SIZE), for consumers on
 * other hosts: "ferry+ucx://HOST:PORT/<pool id>/<secret>", 32 hex digits each. It carries a
 * 128-bit secret: whoever has the address can read every lease of the pool (docs/design.md,
 * "Security"). INVALID_ARGUMENT for a pool made without cfg.listen. Also once close began, as
 * ferry_pool_address. */
FERRY_API ferry_status ferry_pool_remote_address(ferry_pool *pool, char *buf, size_t size);

/* The entry point `name` (a UCP or UCS function, e.g. "ucp_get_nbx") of the UCX ferry loaded
 * for remote pools (FERRY_UCX_LIBRARY, else libucp.so.0), for programs that make UCX calls of
 * their own beside ferry's, on the same UCX (the ferry CLI's remote benchmark). Raw: what the
 * caller makes with it is the caller's. NOT_SUPPORTED, with the reason, where there is no
 * usable UCX or it has no such entry point. */
FERRY_API ferry_status ferry_ucx_symbol(const char *name, void **fn);

/* The ranks a send goes to: the list of count ranks, or when list is NULL the range
 * [first, first + count). A NULL ferry_ranks pointer means every rank. */
typedef struct ferry_ranks {
    const uint32_t *list;
    uint32_t first;
    uint32_t count;
} ferry_ranks;

/* Publishes count tensors (1 to channel_depth) into one lease, as ferry_pool_publish_many_async
 * (stream NULL: a synchronous copy, as ferry_pool_publish_many), and queues its descriptors
 * in the ring of each chosen rank. The ranks not chosen are acknowledged for at once, so the
 * lease is recycled once the chosen ones acknowledged it; so are chosen ranks whose process
 * died (their queued descriptors are dropped: those leases are acknowledged on their behalf).
 * A rank that never connected gets its descriptors queued for when it does. A chosen rank
 * whose ring has no room follows the full policy: with timeout_ns == 0 POOL_FULL at once,
 * naming the rank behind ("the descriptor ring of rank 3 is full ... rank 3 is behind (pid
 * P, alive)"); otherwise the send waits up to timeout_ns for room and for pool space, then
 * fails POOL_FULL. A send that fails has queued and leased nothing. descs (may be NULL)
 * gets the count descriptors. Sends from several threads may run at once: none waits behind
 * another's wait (for room or for space), only as long as its own timeout_ns says. */
FERRY_API ferry_status ferry_pool_send(ferry_pool *pool, const ferry_tensor *tensors,
                                       const void *const *srcs, size_t count,
                                       const ferry_ranks *ranks, void *stream, uint64_t timeout_ns,
                                       ferry_descriptor *descs);

#define FERRY_POOL_STATS_VERSION 4

typedef struct ferry_pool_stats {
    uint32_t struct_size;        /* set by the caller: sizeof(ferry_pool_stats) */
    uint32_t version;            /* set by the caller: FERRY_POOL_STATS_VERSION */
    uint64_t capacity;           /* memory_size */
    uint64_t usable_bytes;       /* bytes available for data (after the control table) */
    uint64_t bytes_in_use;       /* bytes held by live leases */
    uint64_t largest_free;       /* largest free extent */
    uint64_t leases_in_flight;   /* reserved or published, not yet reclaimed */
    uint64_t high_water_bytes;   /* most bytes_in_use ever */
    uint64_t high_water_leases;  /* most leases_in_flight ever */
    uint64_t publishes;          /* leases created (publish, publish_many, reserve) */
    uint64_t pool_full_events;   /* publishes that found the pool full even after reclaiming */
    uint64_t reclaimed;          /* leases freed after every rank acknowledged */
    uint64_t cancelled;          /* leases cancelled */
    uint64_t acked_for_dead;     /* acknowledgements written on behalf of dead consumers */
    uint64_t broker_refused;     /* broker connections refused (other uid, bad message) */
    uint64_t consumers_attached; /* ranks that attached at least once */
    uint64_t consumers_alive;    /* attached ranks whose process is alive */
    uint64_t too_large;          /* publishes refused because they can never fit (POOL_FULL) */
    /* version 3 */
    uint64_t pool_full_waits;    /* publishes that found the pool full and waited (timeout > 0) */
    uint64_t pool_full_timeouts; /* publishes that waited for space and gave up with POOL_FULL */
    /* version 4: consumers on other hosts (cfg.listen) */
    uint64_t remote_connected;         /* ranks held by remote consumers now */
    uint64_t remote_admitted;          /* remote consumers admitted so far */
    uint64_t remote_refused;           /* remote connections refused, for every reason below */
    uint64_t remote_refused_malformed; /* not a well-formed hello (junk, wrong version, size) */
    uint64_t remote_refused_secret;    /* a wrong secret or another pool's identity */
    uint64_t remote_refused_rank;      /* a rank out of range or held by a live holder */
    uint64_t remote_refused_silent;    /* no whole hello within 1 s */
    uint64_t remote_refused_flood;     /* 64 connections were already waiting for theirs */
    uint64_t remote_refused_error;     /* admitting failed on the producer's side (UCX, memory) */
    uint64_t remote_emulated;          /* remote consumers connected now whose reads are emulated
                                        * over active messages (tcp; logged once per pool) */
    uint64_t remote_forwarded;         /* descriptors sent to remote consumers */
    uint64_t remote_bad_messages;      /* active messages dropped as malformed, forged or stale */
} ferry_pool_stats;

/* Fills *stats (whose struct_size and version the caller sets). */
FERRY_API ferry_status ferry_pool_stats_get(ferry_pool *pool, ferry_pool_stats *stats);

#define FERRY_CONSUMER_INFO_VERSION 2

typedef struct ferry_consumer_info {
    uint32_t struct_size;   /* set by the caller: sizeof(ferry_consumer_info) */
    uint32_t version;       /* set by the caller: FERRY_CONSUMER_INFO_VERSION */
    int32_t attached;       /* the rank attached at least once */
    int32_t alive;          /* its last process is alive */
    int64_t pid;            /* its last process (producer's pid namespace), 0 if none */
    uint64_t outstanding;   /* published leases it has not acknowledged */
    uint64_t oldest_age_ns; /* age of its oldest unacknowledged lease, 0 if none */
    /* version 2 */
    uint64_t partly_acknowledged; /* of those, packed leases some of whose parts it
                                   * acknowledged, not all (0 where the control words live
                                   * on the device: they are not marked there) */
} ferry_consumer_info;

#define FERRY_CONSUMER_INFO_INIT                                                                   \
    {                                                                                              \
        sizeof(ferry_consumer_info), FERRY_CONSUMER_INFO_VERSION, 0, 0, 0, 0, 0, 0                 \
    }

/* Per-rank view of the pool: who is behind, whether its process is alive, and how many of
 * its leases are packed leases it acknowledged only some parts of (a leader that released a
 * packed request through one part's descriptor with ferry_consumer_ack_range instead of
 * ferry_consumer_ack_lease_range leaves those). The caller sets info's struct_size and
 * version (FERRY_CONSUMER_INFO_INIT; an older version gets the fields it has). */
FERRY_API ferry_status ferry_pool_consumer_info(ferry_pool *pool, uint32_t rank,
                                                ferry_consumer_info *info);

/* Renders the pool's statistics and every rank's state in the Prometheus text exposition
 * format (version 0.0.4; docs/metrics.md lists the metrics), taken under one hold of the
 * pool's lock. Every sample carries pool="<pool id, 32 hex digits>" and
 * backend="host|cuda_ipc|cuda_vmm", then labels (may be NULL or ""): label text the caller
 * adds to every sample as it is, e.g. worker="3" or a="1",b="x" (printable, no newline, no
 * braces outside quoted values, quotes balanced; otherwise INVALID_ARGUMENT and nothing is
 * written). The per-rank metrics add rank="R". Writes the text into buf NUL-terminated and
 * truncated to size (buf may be NULL when size is 0); *needed (may be NULL) gets the length
 * of the whole text without the NUL, so a caller can size its buffer. CLOSING once close
 * began. */
FERRY_API ferry_status ferry_pool_metrics(ferry_pool *pool, const char *labels, char *buf,
                                          size_t size, size_t *needed);

/* Splits a node's pool budget across tokenizer workers: share = total / workers. */
FERRY_API ferry_status ferry_split_budget(int64_t total_pool_size, int64_t tokenizer_worker_num,
                                          int64_t *share);

/* ------------------------------------------------------------------------------------
 * Consumers
 * ---------------------------------------------------------------------------------- */

typedef struct ferry_consumer ferry_consumer;

/* Creates a consumer context acting as one rank. Pools are opened through a process-wide
 * cache keyed by pool identity, so every pool is mapped once per process; a consumer holds
 * no pool: a pool whose producer is gone is unmapped once no call and no view uses it. */
FERRY_API ferry_status ferry_consumer_create(uint32_t rank, ferry_consumer **consumer);

/* Creates a consumer context for rank whose GPU work runs on device (an ordinal; -1 for a
 * consumer of host pools only). GPU pools are opened on that device, never on the
 * producer's: peers are reached through lazy peer access. */
FERRY_API ferry_status ferry_consumer_create_on(uint32_t rank, int32_t device,
                                                ferry_consumer **consumer);

/* Frees the context. NULL is a no-op. */
FERRY_API void ferry_consumer_destroy(ferry_consumer *consumer);

/* Connects to the pool at address (ferry_pool_address) as rank, GPU work on device (-1 for a
 * consumer of host pools only): opens the pool and claims the rank for this process (one
 * live process per rank: RANK_IN_USE otherwise), before the first tensor is sent. The
 * consumer keeps the pool mapped until it is destroyed. PRODUCER_GONE if nobody serves the
 * address, INVALID_ARGUMENT for a malformed address (anything but the form
 * ferry_pool_address prints) or rank, TIMEOUT after 5 s. The consumer works with every call
 * above; ferry_consumer_recv and ferry_consumer_fd need it.
 *
 * address may also be a pool's remote address (ferry_pool_remote_address,
 * "ferry+ucx://..."), from any host: the consumer is admitted over TCP (PERMISSION for a
 * wrong secret) and reads the pool over UCX (docs/design.md, "Remote consumers"). recv,
 * read, wait, ack (by rank, range or all), fd and the stream-ordered read (done before it
 * returns) work as for a local pool; views need the pool mapped in this process and answer
 * NOT_SUPPORTED. NOT_SUPPORTED also without UCX, FORKED in a child forked by a process that
 * used UCX (start such processes with spawn or exec). A process on the pool's own host, in
 * its network namespace, of its user and where the producer's pid is seen, is told by the
 * producer which pool it is and opens it through its broker instead: a local consumer in
 * every respect (views work), no UCX used, whose ferry_consumer_destroy gives the rank back
 * as closing a remote connection does: what it has not acknowledged is acknowledged for it,
 * views it handed out included (work the caller queued on a view must have run by then),
 * once the stream-ordered copies and acknowledgements ferry queued for it have run (destroy
 * waits 5 s at most; docs/design.md, "Consumers on the producer's host"). Where it cannot
 * open the pool so, it connects over UCX. FERRY_REMOTE_LOCAL=0 in the environment keeps it
 * on UCX. */
FERRY_API ferry_status ferry_consumer_connect(const char *address, uint32_t rank, int32_t device,
                                              ferry_consumer **consumer);

/* Takes the next lease sent to this rank from its ring: descs[0, *count) are its descriptors
 * (one, or a packed lease's parts), to be read and acknowledged as any other. Leases that
 * are no longer current for this rank (acknowledged on its behalf, cancelled, recycled) are
 * skipped. Waits up to timeout_ns (0: do not wait) for one: TIMEOUT if none came,
 * PRODUCER_GONE once the producer closed the pool or died (within 10 ms of it),
 * INVALID_ARGUMENT if the lease has more parts than max (it stays queued, and *count says how
 * many it has), or if the
 * consumer was not made by ferry_consumer_connect. Receives from several threads of the
 * process each get different leases. */
FERRY_API ferry_status ferry_consumer_recv(ferry_consumer *consumer, uint64_t timeout_ns,
                                           ferry_descriptor *descs, size_t max, size_t *count);

/* A file descriptor that becomes readable when this rank's ring may hold a lease, and when
 * the producer closes the pool or dies (its pidfd is in the set, where the kernel has
 * pidfds): for poll/epoll/select and event loops (asyncio), one per connected pool. Use it
 * as: ferry_consumer_recv with timeout 0 until it answers TIMEOUT, then poll the fd (a
 * TIMEOUT answer re-arms it; it is readable once when made, and may wake without a lease).
 * The fd is the consumer's (closed by ferry_consumer_destroy); the first call hands an
 * eventfd to the producer. The producer signals one fd per rank: of two connected consumers
 * of one rank in a process, the later fd is the one signalled. */
FERRY_API ferry_status ferry_consumer_fd(ferry_consumer *consumer, int *fd);

/* Opens (or finds in the cache) the pool a descriptor names and claims this rank for the
 * calling process, before the first tensor must be read. Fails with MISMATCH if the
 * descriptor disagrees with the pool's own header, PRODUCER_GONE if the pool's broker cannot
 * be reached, RANK_IN_USE if another live process holds the rank, TIMEOUT after 5 s. */
FERRY_API ferry_status ferry_consumer_open(ferry_consumer *consumer, const ferry_descriptor *desc);

/* Waits up to timeout_ns for the lease to be ready. STALE if this rank already acknowledged
 * it (for a part of a packed lease: that part, from this process) or its slot was reused or
 * cancelled; MISMATCH if the descriptor's range is not inside its lease (a forged or
 * corrupted descriptor); PRODUCER_GONE if the producer died or closed the pool; RANK_IN_USE
 * as for ferry_consumer_open; TIMEOUT otherwise. The timeout bounds the whole call, the first
 * opening of the pool included (which gets at least 100 ms). */
FERRY_API ferry_status ferry_consumer_wait(ferry_consumer *consumer, const ferry_descriptor *desc,
                                           uint64_t timeout_ns);

/* Waits for the lease (as ferry_consumer_wait), then copies the tensor into dst (dst_size >=
 * desc->length). Does not acknowledge. Never returns bytes of another lease: if the lease
 * could have been recycled during the copy (its slot reused, or this rank acknowledged on its
 * behalf by another thread or process, after which the slice may be freed and reused), the
 * read ends STALE and dst holds garbage. A remote pool's read over tcp may also end TIMEOUT
 * once the lease is ready, when the producer has had no room for its answers until the
 * timeout (docs/design.md, "Served reads"). */
FERRY_API ferry_status ferry_consumer_read(ferry_consumer *consumer, const ferry_descriptor *desc,
                                           void *dst, size_t dst_size, uint64_t timeout_ns);

/* Waits for the lease, then points *data at the tensor inside the pool (read-only, valid until
 * this rank's acknowledgement of the lease, whoever writes it: a group leader acknowledging
 * on this rank's behalf ends the view too). The view keeps the pool mapped in this process
 * until this process acknowledges it, even after the producer is gone. */
FERRY_API ferry_status ferry_consumer_view(ferry_consumer *consumer, const ferry_descriptor *desc,
                                           const void **data, uint64_t timeout_ns);

/* Acknowledges the lease as this consumer's rank (also without reading it). For a part of a
 * packed lease, acknowledges that part (see ferry_pool_publish_many; the whole lease at
 * once: ferry_consumer_ack_lease). STALE if it was acknowledged already; PRODUCER_GONE if
 * the producer is gone (the ack still ends this process's view of the lease). Claims no
 * rank. A consumer connected over UCX records it at once and sends it with others: within
 * FERRY_REMOTE_ACK_DELAY_US (default 200 us; 0 sends each at once) whatever the process
 * does meanwhile, at once when a ferry_consumer_recv finds nothing to take, and at destroy
 * (a process that exits without destroying it leaves those leases to be acknowledged for
 * its rank as a dead one's); a producer that left by then is reported by a later call
 * (docs/design.md, "Acknowledgements"). */
FERRY_API ferry_status ferry_consumer_ack(ferry_consumer *consumer, const ferry_descriptor *desc);

/* Acknowledges the lease for ranks [first, first + count) (an attention subgroup), on their
 * behalf: claims no rank, and ends those ranks' views and CPU reads in progress (which then
 * end STALE; a remote rank's read whose bytes the producer had already copied for it, inline
 * or over tcp, ends OK with the lease's bytes). STALE only if every rank had acknowledged
 * already. */
FERRY_API ferry_status ferry_consumer_ack_range(ferry_consumer *consumer,
                                                const ferry_descriptor *desc, uint32_t first,
                                                uint32_t count);

/* Acknowledges the lease for every rank (as ferry_consumer_ack_range). */
FERRY_API ferry_status ferry_consumer_ack_all(ferry_consumer *consumer,
                                              const ferry_descriptor *desc);

/* Whole-lease acknowledgements, through any one descriptor of a lease. For a part of a
 * packed lease (ferry_pool_publish_many) they acknowledge the whole lease at once, every
 * part, whichever parts this or another process acknowledged before (the acknowledgements
 * above, through a part, acknowledge that part only, and the lease stays in flight until
 * every part is): what a group leader needs to release an abandoned packed request (a cache
 * hit, an aborted request) through the one descriptor it holds. For a lease of one tensor
 * they are the calls above. Claim no rank; end the ranks' views and CPU reads of every part
 * as the calls above end them for one.
 *
 * ferry_consumer_ack_lease: as this consumer's rank; STALE if the rank had acknowledged the
 * lease already (or it was cancelled, or its slot reused). */
FERRY_API ferry_status ferry_consumer_ack_lease(ferry_consumer *consumer,
                                                const ferry_descriptor *desc);

/* The whole lease for ranks [first, first + count); STALE only if every rank had
 * acknowledged it already. */
FERRY_API ferry_status ferry_consumer_ack_lease_range(ferry_consumer *consumer,
                                                      const ferry_descriptor *desc, uint32_t first,
                                                      uint32_t count);

/* The whole lease for every rank (as ferry_consumer_ack_lease_range). */
FERRY_API ferry_status ferry_consumer_ack_lease_all(ferry_consumer *consumer,
                                                    const ferry_descriptor *desc);

/* GPU pools, stream-ordered consume on the consumer's stream (a CUstream; NULL is the
 * legacy default stream): waits for the ready word (cuStreamWaitValue32), copies the tensor
 * into dst (device or host memory the caller owns), then writes this rank's
 * acknowledgement, all enqueued: the call returns at once. To bound the wait on a producer
 * that may die, call ferry_consumer_wait (CPU, with a timeout) first. With control words in
 * host memory the stream wait is left out when the CPU already sees the ready word (the
 * producer's stream fences its copy before writing it). NOT_SUPPORTED on host pools.
 * What is guaranteed: the copy runs after the producer's copy and before this rank's
 * acknowledgement, and the lease is checked current (and its range inside it) when the call
 * is made. What is not: ferry cannot stop another process from acknowledging this rank on
 * its behalf before the stream has run (the slice may then be reused under the stream's
 * copy); acknowledge a stream-reading rank on its behalf only after its stream has run. The
 * parts of a packed lease read stream-ordered must be acknowledged on one stream. On a pool of
 * another host (a remote address) the read is a get that completes before the call returns,
 * then the acknowledgement: work enqueued afterwards sees the bytes. */
FERRY_API ferry_status ferry_consumer_read_async(ferry_consumer *consumer,
                                                 const ferry_descriptor *desc, void *dst,
                                                 size_t dst_size, void *stream);

/* GPU pools: enqueues the wait for the ready word on stream (left out as in
 * ferry_consumer_read_async) and points *data at the tensor in
 * this process's mapping of the pool (device memory, read-only, valid until this rank
 * acknowledges). Kernels enqueued on stream afterwards may read it; then acknowledge with
 * ferry_consumer_ack_async on the same stream. */
FERRY_API ferry_status ferry_consumer_view_async(ferry_consumer *consumer,
                                                 const ferry_descriptor *desc, void *stream,
                                                 const void **data);

/* GPU pools: enqueues this rank's acknowledgement on stream, after the work already there. */
FERRY_API ferry_status ferry_consumer_ack_async(ferry_consumer *consumer,
                                                const ferry_descriptor *desc, void *stream);

/* ------------------------------------------------------------------------------------
 * The machine: what it supports, and which transport AUTO picks
 * ---------------------------------------------------------------------------------- */

/* Probes this machine (the CUDA driver, its devices, CUDA IPC, CUDA VMM handle types, stream
 * memory operations, MPS) and decides which transport FERRY_BACKEND_AUTO picks and why.
 * Writes the report (json = 0: text for people; json = 1: one JSON object) into buf,
 * NUL-terminated and truncated to size; *needed (may be NULL) gets the length of the whole
 * report without the NUL. The probes run once per process. */
FERRY_API ferry_status ferry_doctor_report(int json, char *buf, size_t size, size_t *needed);

/* What FERRY_BACKEND_AUTO resolves to for a pool on device (a GPU ordinal, or -1 for data in
 * host memory): *backend, and the reason in reason (size bytes, may be NULL/0). The decision,
 * the one ferry_pool_create makes and ferry_doctor_report explains:
 * - a negative device (FERRY_DEVICE_HOST, FERRY_DEVICE_DEFAULT): host, without loading the
 *   CUDA driver, on a GPU machine too (CPU consumers read the pool);
 * - a GPU: cuda_ipc on that GPU when the stream memory operations every GPU transport needs
 *   work there (probed for real, once per process: a page of registered host memory, a
 *   stream write and a stream wait); host when they fail, or when the machine has no driver
 *   or no GPU (the reason says which);
 * - a GPU ordinal the driver does not have: INVALID_ARGUMENT ("device 5 does not exist").
 * cuda_vmm is never picked: ask for it where legacy CUDA IPC is forbidden (containers) or
 * pools cross nodes. The caller's current CUDA context is left as it was. */
FERRY_API ferry_status ferry_backend_resolve(int32_t device, ferry_backend *backend, char *reason,
                                             size_t size);

/* ------------------------------------------------------------------------------------
 * GPU helpers, for programs with no CUDA runtime of their own (ferry's Python package)
 *
 * The CUDA driver ferry loads at run time, on device's primary context; the calling
 * thread's current context is what it was afterwards. NOT_SUPPORTED without a driver;
 * DRIVER with the driver's error name when a call fails.
 * ---------------------------------------------------------------------------------- */

/* The entry point `name` of the driver ferry loaded (FERRY_CUDA_DRIVER, else libcuda.so.1),
 * with the ABI of CUDA version cuda_version (e.g. 12000), for programs that make driver calls
 * of their own beside ferry's, on the same driver (the ferry CLI's GPU benchmarks). Raw: the
 * caller's context is the caller's business. NOT_SUPPORTED without a driver, or when the
 * driver has no such call for that version. */
FERRY_API ferry_status ferry_gpu_driver_symbol(const char *name, int cuda_version, void **fn);

/* Allocates size bytes of device memory on device (at least 1 byte). */
FERRY_API ferry_status ferry_gpu_alloc(int32_t device, uint64_t size, void **ptr);

/* Frees what ferry_gpu_alloc gave (after the work that uses it, as cuMemFree). NULL: no-op. */
FERRY_API void ferry_gpu_free(int32_t device, void *ptr);

/* Stream-ordered device memory, for buffers that come and go with every item (the Python
 * package's received tensors): size bytes (at least 1) from a CUDA memory pool that ferry keeps
 * per device for the process, usable by work enqueued on stream after this call (other streams
 * must be ordered after stream first: ferry_gpu_event_record + ferry_gpu_stream_wait_event).
 * Once the pool holds enough memory, neither this call nor ferry_gpu_free_async calls the
 * driver's allocator or waits for the device. The pool keeps what it once held (its release
 * threshold is the largest value) until ferry_gpu_trim. Where the driver or device has no
 * memory pools, the memory comes from cuMemAlloc (a warning says so, once per device). */
FERRY_API ferry_status ferry_gpu_alloc_async(int32_t device, uint64_t size, void *stream,
                                             void **ptr);

/* Gives memory of ferry_gpu_alloc_async back, in stream order: the pool may hand it out again
 * to work that runs after everything enqueued on stream so far. Work on other streams that uses
 * the memory must be ordered before that point (or done) first. Where stream cannot take the
 * free (destroyed meanwhile), or there is no pool, the memory is freed with cuMemFree, which
 * waits for the device; the first failure is returned (the memory is freed either way). NULL:
 * no-op. */
FERRY_API ferry_status ferry_gpu_free_async(int32_t device, void *ptr, void *stream);

/* Gives the memory that device's pool holds and no allocation uses back to the driver, keeping
 * at most keep bytes of it (cuMemPoolTrimTo). */
FERRY_API ferry_status ferry_gpu_trim(int32_t device, uint64_t keep);

/* Enqueues on stream a wait for event (recorded with ferry_gpu_event_record): work enqueued on
 * stream afterwards runs after the work the event follows. NULL event: no-op. */
FERRY_API ferry_status ferry_gpu_stream_wait_event(int32_t device, void *stream, void *event);

/* Enqueues a copy of n bytes between device or host memory on stream. */
FERRY_API ferry_status ferry_gpu_copy_async(int32_t device, void *dst, const void *src, uint64_t n,
                                            void *stream);

/* Waits until stream has run everything enqueued so far. */
FERRY_API ferry_status ferry_gpu_stream_synchronize(int32_t device, void *stream);

/* Records an event behind the work enqueued on stream so far; *event is the caller's
 * (ferry_gpu_event_destroy). */
FERRY_API ferry_status ferry_gpu_event_record(int32_t device, void *stream, void **event);

/* Waits for an event; *done (ferry_gpu_event_query) is 1 once it completed, 0 while pending. */
FERRY_API ferry_status ferry_gpu_event_wait(int32_t device, void *event);
FERRY_API ferry_status ferry_gpu_event_query(int32_t device, void *event, int *done);
FERRY_API void ferry_gpu_event_destroy(int32_t device, void *event);

/* ------------------------------------------------------------------------------------
 * Time and shared words: the clock of every ferry timeout, and the sleep on a 32-bit word
 * that ferry's waits use, for programs that coordinate their own processes beside ferry's
 * (the ferry CLI's benchmarks, the Python package)
 * ---------------------------------------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds, comparable between the processes of one machine. */
FERRY_API uint64_t ferry_now_ns(void);

/* Sleeps while *word == expected, at most timeout_ns (a Linux futex that is not private to
 * the process: word may sit in shared memory). It returns on a wake-up, the timeout, a
 * signal or a changed word alike: the caller checks its condition again. */
FERRY_API void ferry_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns);

/* Wakes every thread, of any process, sleeping on word. */
FERRY_API void ferry_futex_wake(uint32_t *word);

/* ------------------------------------------------------------------------------------
 * Logging
 * ---------------------------------------------------------------------------------- */

typedef void (*ferry_log_fn)(int level, const char *message, void *user);

enum { FERRY_LOG_ERROR = 0, FERRY_LOG_WARN = 1, FERRY_LOG_INFO = 2 };

/* Routes ferry's log lines (warnings such as the once-per-pool "pool full") to fn; NULL
 * restores the default, which writes to stderr. */
FERRY_API void ferry_set_log(ferry_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
