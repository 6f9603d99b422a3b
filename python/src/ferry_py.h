/* ferry._ferry: the CPython extension over libferry. Declarations shared by its files, one
 * file per concern:
 *   module.c      the module: types, exceptions, functions
 *   errors.c      ferry statuses as Python exceptions
 *   log.c         ferry's log lines through Python's logging
 *   args.c        argument conversions: timeouts, streams, devices, ranks
 *   wait.c        blocking calls in bounded slices, with signals handled between them
 *   dtype.c       dtype names and shapes
 *   cuda.c        the few CUDA driver calls the package makes itself (ferry's driver table)
 *   descriptor.c  ferry.Descriptor
 *   pool.c        ferry.Pool: life cycle, statistics, cancel
 *   publish.c     Pool.publish / publish_many, and sources kept until their copy ran
 *   metrics.c     Pool.metrics: Prometheus text, the caller's labels rendered
 *   reservation.c Pool.reserve and ferry.Reservation
 *   dlpack_in.c   taking tensors from DLPack producers
 *   dlpack_out.c  handing tensors to DLPack consumers
 *   consumer.c    the per-process consumer cache
 *   ack.c         ferry.ack
 *   payload.c     received memory and the leases that views hold
 *   receive.c     ferry.receive / receive_many
 *   received.c    ferry.Received, what receive returns
 *   receiver.c    ferry.Receiver: a consumer connected by address (ferry.connect), recv
 */
#ifndef FERRY_PY_H
#define FERRY_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "dlpack.h"
#include "ferry.h"

/* Default wait of a receive, and of a publish with on_full="wait": 10 s. */
#define FY_DEFAULT_WAIT_NS 10000000000ull

/* ---- errors.c ------------------------------------------------------------------------- */

extern PyObject *fy_Error, *fy_PoolFull, *fy_TooLarge, *fy_Stale, *fy_ProducerGone, *fy_Timeout,
    *fy_PoolFailed, *fy_Closing, *fy_RankInUse, *fy_Forked;

/* Creates the exception classes and adds them to the module; -1 on failure. */
int fy_errors_add(PyObject *module);

/* Raises the exception for a failed ferry call, with ferry_last_error() as its message and the
 * status name as its .status attribute. Returns NULL. */
PyObject *fy_raise(ferry_status st);

/* fy_raise for a call on pool: POOL_FAILED also carries the pool's first cause (__cause__). */
PyObject *fy_raise_pool(ferry_status st, ferry_pool *pool);

/* Raises cls (NULL: the status's class) with message and st's name as .status. Returns NULL. */
PyObject *fy_raise_as(PyObject *cls, ferry_status st, const char *message);

/* ---- log.c --------------------------------------------------------------------------- */

/* Routes the library's log lines to logging.getLogger("ferry") (ferry_set_log) and restores
 * stderr at exit. 0, or -1 with an exception. */
int fy_log_install(PyObject *module);

/* The lines that the calling thread logs from fy_log_hold_begin to fy_log_hold_end (a publish,
 * a reserve) are delivered at the end, with the GIL. */
typedef struct fy_log_hold {
    struct fy_log_line *first, **last;
    struct fy_log_hold *outer;
} fy_log_hold;

void fy_log_hold_begin(fy_log_hold *hold);
/* Delivers the hold's lines, less the pool-full warning when the call raised PoolFull (the
 * exception says it); keeps the exception set. With the GIL. */
void fy_log_hold_end(fy_log_hold *hold, int raised_pool_full);
/* Delivers the lines other threads queued (_ferry._log_flush()). */
PyObject *fy_log_flush(PyObject *module, PyObject *unused);

/* ---- args.c --------------------------------------------------------------------------- */

/* Attribute and keyword names the hot paths look up, interned once at import (fy_names_init):
 * a lookup by C string makes and hashes a new str every time. */
typedef enum {
    FY_NAME_DLPACK,               /* __dlpack__ */
    FY_NAME_DLPACK_DEVICE,        /* __dlpack_device__ */
    FY_NAME_STREAM,               /* stream */
    FY_NAME_MAX_VERSION,          /* max_version */
    FY_NAME_CUDA_STREAM,          /* cuda_stream (torch) */
    FY_NAME_CUDA_STREAM_PROTOCOL, /* __cuda_stream__ */
    FY_NAME_PTR,                  /* ptr (cupy) */
    FY_NAME_COUNT
} fy_name_id;

int fy_names_init(void);
/* The interned name (borrowed). */
PyObject *fy_name(fy_name_id id);

/* The parameters of a METH_FASTCALL | METH_KEYWORDS function, for fy_kwargs: the first
 * `positional` may be passed by position, every one by name. A static table per function; its
 * names are interned on first use. */
#define FY_KWARGS_MAX 12
typedef struct fy_keywords {
    const char *fn;
    Py_ssize_t positional;
    const char *names[FY_KWARGS_MAX + 1]; /* NULL-terminated */
    PyObject *interned[FY_KWARGS_MAX];
    Py_ssize_t count; /* 0 until interned */
} fy_keywords;

/* Fills values[i] (borrowed; the caller zeroes the array, NULL: not given) from the positional
 * arguments and the keywords, matched by identity first (Python passes interned names), then
 * by value: a call spends no time building a dict. TypeError for too many positional
 * arguments, an unknown keyword or one given twice. 0, or -1 with the exception. */
int fy_kwargs(fy_keywords *kw, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              PyObject **values);

/* Seconds (None: dflt; inf: forever) to nanoseconds. 0, or -1 with ValueError/TypeError. */
int fy_timeout_arg(PyObject *obj, uint64_t dflt, uint64_t *ns);

/* A CUDA stream: None (the legacy default stream, NULL), an int handle, or an object with
 * cuda_stream (torch), ptr (cupy) or __cuda_stream__. 0, or -1 with TypeError/ValueError. */
int fy_stream_arg(PyObject *obj, void **stream);

/* The value a DLPack producer is given for stream: 1 (legacy default) for NULL. */
PyObject *fy_stream_for_dlpack(void *stream);

/* The same stream whatever its spelling: NULL and 1 both name the legacy default stream. */
uintptr_t fy_stream_key(void *stream);

/* The two ints of a 2-tuple of ints (__dlpack_device__'s answer): 1, or 0 (no exception) for
 * anything else, which the caller parses the slow way for its message. */
int fy_int_pair(PyObject *obj, int *a, int *b);

/* A device ordinal: None gives dflt. 0, or -1 with an exception. */
int fy_device_arg(PyObject *obj, int dflt, int *device);

/* A non-negative rank below 2^32. 0, or -1 with an exception. */
int fy_rank_arg(PyObject *obj, uint32_t *rank);

/* The items of an iterable as a tuple of their own (new reference; TypeError with message for
 * an object that is not iterable): the caller's list may change while Python code runs. */
PyObject *fy_tuple_arg(PyObject *obj, const char *message);

/* ---- wait.c: with the GIL --------------------------------------------------------- */

/* The longest a blocking call waits inside the library before Python handles its signals
 * (Ctrl-C raises KeyboardInterrupt within about this long). */
#define FY_WAIT_SLICE_NS 50000000ull

/* A wait of total_ns (FERRY_WAIT_FOREVER: no end) taken in slices. */
typedef struct fy_wait {
    uint64_t total_ns;
    uint64_t deadline; /* monotonic ns; UINT64_MAX: none */
    int sliced;        /* more than one slice was taken */
} fy_wait;

void fy_wait_start(fy_wait *w, uint64_t total_ns);
/* The wait of the next slice: what is left, at most FY_WAIT_SLICE_NS. */
uint64_t fy_wait_slice(const fy_wait *w);
/* After a slice ran out: 1 to wait on, 0 once the whole wait is over, -1 with the exception
 * of a signal handler (KeyboardInterrupt). */
int fy_wait_next(fy_wait *w);
/* Runs call(ctx, slice_ns) without the GIL, one slice of w after the other, while it answers
 * TIMEOUT: 0 with its last answer in *status, or -1 with the exception of a signal handler
 * (KeyboardInterrupt). */
int fy_wait_call(fy_wait *w, ferry_status (*call)(void *ctx, uint64_t slice_ns), void *ctx,
                 ferry_status *status);

/* ---- dtype.c -------------------------------------------------------------------------- */

/* Sets t's dtype from a name ("float32", "bfloat16", "bool", "int8x4"). 0, or -1 with
 * ValueError. */
int fy_dtype_parse(const char *name, ferry_tensor *t);

/* The name of t's dtype (new reference). */
PyObject *fy_dtype_name(const ferry_tensor *t);

/* Sets t's ndim and shape from a sequence of ints (or one int). 0, or -1 with an exception. */
int fy_shape_parse(PyObject *shape, ferry_tensor *t);

/* t's shape as a tuple (new reference). */
PyObject *fy_shape_tuple(const ferry_tensor *t);

/* Elements of t (0 if a dimension is 0). */
uint64_t fy_tensor_elements(const ferry_tensor *t);

/* ---- cuda.c: every function here runs without the GIL -------------------------------- */

/* ferry's GPU helpers (ferry.h), each on device; the library keeps the calling thread's
 * current CUDA context across them and across every other ferry call, which frameworks read
 * their current device from. */
/* Received tensors' memory, stream-ordered (a CUDA memory pool per device: no driver
 * allocation and no wait for the device once the pool holds the working set). */
ferry_status fy_cuda_alloc_async(int device, uint64_t bytes, void *stream, void **ptr);
void fy_cuda_free_async(int device, void *ptr, void *stream);
ferry_status fy_cuda_copy_async(int device, void *dst, const void *src, uint64_t n, void *stream);
/* An event recorded on stream, after the work enqueued there so far. */
ferry_status fy_cuda_event_record(int device, void *stream, void **event);
ferry_status fy_cuda_stream_sync(int device, void *stream);
/* Orders the work enqueued on `after` from now on behind the work enqueued on `before` so far
 * (an event recorded on before, waited for on after, then destroyed). */
ferry_status fy_cuda_order(int device, void *before, void *after);
/* Waits until the work enqueued on stream so far has run (an event, not the whole stream's
 * later work). */
ferry_status fy_cuda_wait_stream(int device, void *stream);

ferry_status fy_cuda_event_wait(void *event, int device);
int fy_cuda_event_done(void *event, int device); /* 1 when complete (or failed), 0 pending */
void fy_cuda_event_destroy(void *event, int device);

/* ---- descriptor.c --------------------------------------------------------------------- */

extern PyTypeObject fy_DescriptorType;

typedef struct {
    PyObject_HEAD
    ferry_descriptor desc;
    uint8_t wire[FERRY_DESCRIPTOR_SIZE];
} fy_descriptor;

/* A Descriptor of d (new reference), or NULL with an exception. */
PyObject *fy_descriptor_new(const ferry_descriptor *d);

/* The decoded descriptor of a Descriptor or of its 256 bytes. 0, or -1 with an exception. */
int fy_descriptor_get(PyObject *obj, ferry_descriptor *out);

/* ---- consumer.c ----------------------------------------------------------------------- */

/* One ferry_consumer, shared by the cache and by every view that must acknowledge through
 * it; freed with the last reference, which may be dropped on any thread without the GIL. */
typedef struct fy_consumer {
    long refs; /* atomic */
    ferry_consumer *handle;
    uint32_t rank;
    int32_t device; /* -1: host pools only */
    long pid;       /* the process that created it */
} fy_consumer;

/* Drops the cache in forked children (pthread_atfork); 0, or -1. */
int fy_consumers_init(void);

/* The cached consumer of (rank, device), created on first use; a new reference, or NULL with
 * an exception. Needs the GIL. */
fy_consumer *fy_consumer_get(uint32_t rank, int32_t device);

/* A consumer to acknowledge ranks of a pool with, without attaching this process as another
 * rank when it can be helped: the cached one of (fallback, device), else a cached one on device
 * whose rank is one of the pool's, else a new one of fallback (new reference, or NULL with an
 * exception). */
fy_consumer *fy_consumer_any(uint32_t consumer_count, int32_t device, uint32_t fallback);

void fy_consumer_ref(fy_consumer *c);
void fy_consumer_unref(fy_consumer *c);

PyObject *fy_release_consumers(PyObject *module, PyObject *unused);

/* ---- ack.c ---------------------------------------------------------------------------- */

PyObject *fy_ack(PyObject *module, PyObject *args, PyObject *kwargs);
/* Acknowledges desc through consumer (a Receiver's): for its rank, or the ranks of a range;
 * lease: the whole lease through a part. None, or NULL with the exception. */
PyObject *fy_ack_as(fy_consumer *consumer, PyObject *desc, PyObject *ranks, int lease);

/* first and count of a range(first, stop) with step 1 (TypeError for another object). 0, or -1
 * with an exception. */
int fy_range_arg(PyObject *ranks, uint32_t *first, uint32_t *count);

/* The device a consumer of d's pool works on: -1 for host pools, else the device argument
 * (None: the descriptor's). 0, or -1 with an exception. */
int fy_consumer_device(const ferry_descriptor *d, PyObject *device, int32_t *out);

/* ---- payload.c ------------------------------------------------------------------------ */

/* A lease that views (or a GPU copy still in flight) hold: the consumer stays alive, and the
 * last reference acknowledges the lease (ack_on_drop) for the consumer's rank. */
typedef struct fy_lease fy_lease;

fy_lease *fy_lease_new(fy_consumer *consumer, const ferry_descriptor *d, int ack_on_drop);
void fy_lease_ref(fy_lease *lease);
/* Drops a reference that must not acknowledge (a receive that failed). */
void fy_lease_forget(fy_lease *lease);
/* Drops a reference; the last one acknowledges, stream-ordered on *stream if stream is not
 * NULL (GPU views), else on the CPU. Any thread, no GIL. */
void fy_lease_drop(fy_lease *lease, void *const *stream);

typedef enum { FY_HOST_COPY, FY_HOST_VIEW, FY_GPU_COPY, FY_GPU_VIEW } fy_kind;

/* Host copies' memory: nbytes (64-byte aligned) from a few large buffers kept for reuse, or
 * malloc; *size is what to give fy_host_buffer_free. NULL when out of memory. Any thread. */
void *fy_host_buffer(uint64_t nbytes, uint64_t *size);
void fy_host_buffer_free(void *p, uint64_t size);
/* Frees the buffers kept for reuse (ferry.release_memory()); the bytes kept now. */
void fy_host_buffers_release(void);
uint64_t fy_host_buffers_kept(void);

/* Memory that receive produced, and what must happen when its last user lets go: the
 * Received (or the DLPack tensor it was exported to). GPU copies live in stream-ordered memory
 * allocated on the receive's stream; the consumer's stream (named in __dlpack__) is ordered
 * after the receive's copy, and the memory is freed in that stream's order (as torch's caching
 * allocator frees a block in its stream's order): work on other streams must be done, or
 * ordered before it, when the tensor is freed. */
typedef struct fy_payload {
    long refs; /* atomic */
    fy_kind kind;
    void *data;
    DLDevice device;
    ferry_tensor tensor;
    uint64_t nbytes;
    fy_lease *lease;      /* views and GPU copies */
    void *buffer;         /* copies: memory the payload owns */
    uint64_t buffer_size; /* host copies: the size of buffer (fy_host_buffer) */
    void *recv_stream;    /* GPU: the stream of the receive */
    void *use_stream;     /* GPU: the stream the consumer uses the tensor on (views acknowledge on
                           * it, copies are freed on it) */
    int has_use_stream;
} fy_payload;

void fy_payload_ref(fy_payload *payload);
/* Drops a reference; the last one frees the payload: acknowledges views, frees copies. Any
 * thread, no GIL. */
void fy_payload_release(void *payload);

/* ---- dlpack_out.c --------------------------------------------------------------------- */

/* The __dlpack__ keyword arguments. */
typedef struct fy_export_args {
    int versioned;      /* max_version >= (1, 0) */
    int has_stream;     /* stream given, not None and not -1 */
    uintptr_t stream;   /* the consumer's stream (1: legacy default) */
    int stream_is_none; /* stream=None */
} fy_export_args;

/* Parses __dlpack__(*, stream, max_version, dl_device, copy) for a tensor on device. 0, or -1
 * with an exception (BufferError for a device or copy that cannot be honoured). */
int fy_export_args_parse(PyObject *args, PyObject *kwargs, DLDevice device, fy_export_args *out);

/* A "dltensor_versioned" (versioned) or "dltensor" capsule over data, C-contiguous; release
 * (may be NULL) runs once with ctx when the consumer's deleter runs or when the capsule dies
 * unconsumed, on any thread and without the GIL. */
PyObject *fy_export(void *data, DLDevice device, const ferry_tensor *t, int readonly, int versioned,
                    void (*release)(void *), void *ctx);

/* (device_type, device_id) */
PyObject *fy_device_tuple(DLDevice device);

/* ---- dlpack_in.c ---------------------------------------------------------------------- */

/* A producer's tensor taken through DLPack (managed) or torch's fast path (owner), held
 * until fy_import_release (which needs the GIL). */
typedef struct fy_import {
    PyObject *owner;
    void *managed;
    int versioned;
    const void *data;
    int32_t device_type;
    int32_t device_id;
    ferry_tensor tensor;
} fy_import;

/* Takes obj's tensor: C-contiguous, in memory the pool can read (host_only: CPU memory).
 * stream is the CUDA stream the copy will run on (handed to CUDA producers). 0, or -1 with an
 * exception. */
int fy_import_take(PyObject *obj, int host_only, void *stream, fy_import *out);
/* fy_import_take for memory ferry writes into (receive's out=): refuses tensors flagged
 * read-only. */
int fy_import_writable(PyObject *obj, int host_only, void *stream, fy_import *out);
void fy_import_release(fy_import *imp);

/* ---- torch.c -------------------------------------------------------------------------- */

/* Whether obj is a torch tensor and torch's current stream of device_id is stream. */
int fy_torch_on_stream(PyObject *obj, int32_t device_id, void *stream);
/* Takes a torch CUDA tensor read or written on stream without DLPack, where that changes
 * nothing (see torch.c): 1, or 0 (no exception) for the DLPack path. */
int fy_torch_take(PyObject *obj, void *stream, fy_import *out);
/* Remembers the DLPack dtype of obj's torch dtype (after a DLPack export of a CUDA tensor). */
void fy_torch_learn(PyObject *obj, const ferry_tensor *t);
/* torch's current stream on device (its raw handle), in *stream. 0, or -1 (no exception) when
 * torch is not imported or cannot say. */
int fy_torch_current_stream(int32_t device, void **stream);
/* A new torch tensor for t from torch's allocator (torch.empty: on device, a GPU ordinal, or
 * the CPU for -1; a CUDA tensor's memory belongs to torch's current stream), taken as *out
 * (its owner the tensor) for a receive to write into. 1; 0 without an exception when torch
 * has no dtype of that name (the caller takes another way); -1 with an exception. */
int fy_torch_empty(const ferry_tensor *t, int32_t device, fy_import *out);
/* torch.from_dlpack(obj) (new reference), or NULL with an exception. */
PyObject *fy_torch_from_dlpack(PyObject *obj);
/* Around the DLPack export of a torch CUDA tensor on device: torch exports a CUDA tensor only
 * while its device is torch's current device. Makes it so and returns the device to put back
 * (fy_torch_device_exit), or -1 when nothing changed (not torch, the device current already).
 * Never raises; exit keeps the exception set. */
int fy_torch_device_enter(PyObject *obj, int32_t device);
void fy_torch_device_exit(int restore);

/* ---- pool.c / publish.c / reservation.c --------------------------------------------- */

enum { FY_FULL_RAISE = 0, FY_FULL_NONE = 1, FY_FULL_WAIT = 2 };

/* The library's pool, shared by the Pool object and by the reservations and exports of its
 * memory (a reservation's buffer or DLPack tensor), so that the memory stays mapped while any
 * export lives: Pool.close() with exports alive refuses every later call at once (Closing)
 * and leaves the library's close (ferry_pool_close: waiting consumers see ProducerGone, the
 * memory is released) to the last export. The last reference destroys the pool. Any thread,
 * no GIL, also after the interpreter finalised (DLPack deleters). */
typedef struct fy_pool_core fy_pool_core;

void fy_core_ref(fy_pool_core *core);
void fy_core_unref(fy_pool_core *core);
/* An export of the pool's memory begins (with the GIL, the Pool open) or ends (any thread). */
void fy_core_export_begin(fy_pool_core *core);
void fy_core_export_end(fy_pool_core *core);
/* ferry_pool_cancel of a reservation nobody can commit any more; errors are dropped (a pool
 * closed or a lease cancelled meanwhile has nothing left to cancel). Any thread, no GIL. */
void fy_core_cancel(fy_pool_core *core, const ferry_descriptor *d);

typedef struct fy_pending fy_pending;

typedef struct {
    PyObject_HEAD
    fy_pool_core *core; /* NULL until __init__ succeeded */
    ferry_pool *pool;   /* the core's */
    int backend;        /* the resolved ferry_backend */
    int device;         /* -1 for host pools */
    int on_full;
    uint64_t wait_ns; /* how long on_full="wait" waits by default */
    uint64_t usable;  /* bytes for data: a larger lease can never fit */
    int closed;
    int host_control;    /* GPU pools: control words in host memory (ready words the CPU reads) */
    fy_pending *pending; /* GPU pools: sources whose copy may still be running */
    uint64_t drain_ns;   /* drain_timeout: close() drains this long first (0: no drain) */
    int drain_set;       /* drain_timeout was given (0 included: never drain, not at exit) */
    int64_t channel_depth;
    char address[FERRY_ADDRESS_SIZE];
    char remote_address[FERRY_REMOTE_ADDRESS_SIZE]; /* "" without listen= */
} fy_pool;

extern PyTypeObject fy_PoolType;

#define FY_POOL_GPU(self) ((self)->device >= 0) /* the pool's data is on a GPU */

/* 0 if the pool takes calls, else -1 with RuntimeError (not initialised) or Closing (closed
 * while exports of its memory live: the library's close waits for them). */
int fy_pool_check(fy_pool *self);

/* How long a publish or reserve may wait for space: timeout if given, else the policy's. */
int fy_pool_wait_ns(fy_pool *self, PyObject *timeout, uint64_t *ns);

/* fy_wait_next for a wait for space: also -1 (Closing) once close() ran meanwhile. */
int fy_pool_wait_next(fy_pool *self, fy_wait *w);

/* Whether a publish or reserve of needed bytes failed with st because they can never fit. */
int fy_pool_too_large(const fy_pool *self, ferry_status st, uint64_t needed);

/* The answer to a failed publish or reserve of needed bytes: None for a full pool (or a
 * tensor that can never fit) under on_full="none", else the exception (NULL): TooLarge for a
 * tensor that can never fit, PoolFull, ... */
PyObject *fy_pool_failure(fy_pool *self, ferry_status st, uint64_t needed);

/* ferry_pool_cancel without the GIL; 0, or -1 with the exception. */
int fy_pool_cancel_lease(fy_pool *self, const ferry_descriptor *d);

PyObject *fy_pool_publish(fy_pool *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *fy_pool_publish_many(fy_pool *self, PyObject *args, PyObject *kwargs);
/* Pool.send: publish_many into one lease, queued in the rings of the chosen ranks. */
PyObject *fy_pool_send(fy_pool *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* Pool.metrics(labels=None) -> str (metrics.c). */
PyObject *fy_pool_metrics(fy_pool *self, PyObject *args, PyObject *kwargs);
/* Lets go of sources whose copies have run (all of them, waiting, with wait). */
void fy_pool_settle(fy_pool *self, int wait);
/* Owners of the sources still held, for the garbage collector. */
int fy_pool_traverse_pending(fy_pool *self, visitproc visit, void *arg);

extern PyTypeObject fy_ReservationType;
PyObject *fy_pool_reserve(fy_pool *self, PyObject *args, PyObject *kwargs);

/* ---- receive.c / received.c ---------------------------------------------------------- */

extern PyTypeObject fy_ReceivedType;

/* A Received that owns payload (new reference; on failure the payload is released), of
 * descriptor d; descriptor (may be NULL: made when asked for) is its Descriptor object. */
PyObject *fy_received_new(fy_payload *payload, const ferry_descriptor *d, PyObject *descriptor);

PyObject *fy_receive(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *fy_receive_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);

/* The receive of a lease's count descriptors (one, or a packed lease's parts) through consumer,
 * as ferry.receive (single) or receive_many does it: the wait for the lease (timeout_ns, in
 * slices), then the copy (copy, stream, out, torch) or view. On failure NULL with the
 * exception, and *status the library's status (STALE, TIMEOUT, ...), or FERRY_OK when an
 * argument was refused or a signal handler raised: nothing was read or acknowledged then. */
PyObject *fy_receive_leased(fy_consumer *consumer, const ferry_descriptor *descs, size_t count,
                            PyObject *copy, PyObject *stream, PyObject *out, int torch,
                            uint64_t timeout_ns, int single, ferry_status *status);

/* Whether out could take the tensor of desc in a receive through consumer (on stream): the
 * checks fy_receive_leased makes of out= (writable, dtype, element count), without waiting,
 * reading or acknowledging anything. -1 with the exception if not. */
int fy_receive_check_out(fy_consumer *consumer, const ferry_descriptor *desc, PyObject *stream,
                         PyObject *out);

/* ---- receiver.c ----------------------------------------------------------------------- */

extern PyTypeObject fy_ReceiverType;

/* A consumer that ferry_consumer_connect made (not in the cache): a new reference, or NULL
 * with an exception. */
fy_consumer *fy_consumer_wrap(ferry_consumer *handle, uint32_t rank, int32_t device);

#endif
