/* ferry._ferry: the CPython extension over libferry. Declarations shared by its files, one
 * file per concern:
 *   module.c      the module: types, exceptions, functions
 *   errors.c      ferry statuses as Python exceptions
 *   args.c        argument conversions: timeouts, streams, devices, ranks
 *   dtype.c       dtype names and shapes
 *   cuda.c        the few CUDA driver calls the package makes itself (ferry's driver table)
 *   descriptor.c  ferry.Descriptor
 *   pool.c        ferry.Pool: life cycle, statistics, cancel
 *   publish.c     Pool.publish / publish_many, and sources kept until their copy ran
 *   reservation.c Pool.reserve and ferry.Reservation
 *   dlpack_in.c   taking tensors from DLPack producers
 *   dlpack_out.c  handing tensors to DLPack consumers
 *   consumer.c    the per-process consumer cache
 *   ack.c         ferry.ack
 *   payload.c     received memory and the leases that views hold
 *   receive.c     ferry.receive / receive_many
 *   received.c    ferry.Received, what receive returns
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

extern PyObject *fy_Error, *fy_PoolFull, *fy_Stale, *fy_ProducerGone, *fy_Timeout, *fy_PoolFailed,
    *fy_Closing;

/* Creates the exception classes and adds them to the module; -1 on failure. */
int fy_errors_add(PyObject *module);

/* Raises the exception for a failed ferry call, with ferry_last_error() as its message and the
 * status name as its .status attribute. Returns NULL. */
PyObject *fy_raise(ferry_status st);

/* fy_raise for a call on pool: POOL_FAILED also carries the pool's first cause (__cause__). */
PyObject *fy_raise_pool(ferry_status st, ferry_pool *pool);

/* ---- args.c --------------------------------------------------------------------------- */

/* Seconds (None: dflt; inf: forever) to nanoseconds. 0, or -1 with ValueError/TypeError. */
int fy_timeout_arg(PyObject *obj, uint64_t dflt, uint64_t *ns);

/* A CUDA stream: None (the legacy default stream, NULL), an int handle, or an object with
 * cuda_stream (torch), ptr (cupy) or __cuda_stream__. 0, or -1 with TypeError/ValueError. */
int fy_stream_arg(PyObject *obj, void **stream);

/* The value a DLPack producer is given for stream: 1 (legacy default) for NULL. */
PyObject *fy_stream_for_dlpack(void *stream);

/* The same stream whatever its spelling: NULL and 1 both name the legacy default stream. */
uintptr_t fy_stream_key(void *stream);

/* A device ordinal: None gives dflt. 0, or -1 with an exception. */
int fy_device_arg(PyObject *obj, int dflt, int *device);

/* A non-negative rank below 2^32. 0, or -1 with an exception. */
int fy_rank_arg(PyObject *obj, uint32_t *rank);

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

/* Keeps the calling thread's current CUDA context across ferry's GPU calls, which make the
 * primary context of their device current: frameworks read their current device from it. */
typedef struct fy_cuda_scope {
    void *saved; /* CUcontext */
    int active;
} fy_cuda_scope;

/* What fy_cuda_enter does besides a device ordinal: */
#define FY_CUDA_SAVE (-1) /* only keep the current context (GPU pools: ferry sets its own) */
#define FY_CUDA_NONE (-2) /* nothing at all: host pools never load the CUDA driver */

/* Saves the current context and, for device >= 0, makes device's primary context current.
 * FY_CUDA_SAVE only saves, and never fails (no driver: nothing to keep); FY_CUDA_NONE does
 * nothing. */
ferry_status fy_cuda_enter(fy_cuda_scope *scope, int device);

/* FY_CUDA_SAVE for GPU pools, FY_CUDA_NONE for host pools. */
#define FY_CUDA_FOR(gpu) ((gpu) ? FY_CUDA_SAVE : FY_CUDA_NONE)
void fy_cuda_leave(fy_cuda_scope *scope);

/* Inside a scope entered on the device: */
ferry_status fy_cuda_alloc(uint64_t bytes, void **ptr);
void fy_cuda_free(void *ptr); /* waits for the work that uses it (cuMemFree) */
ferry_status fy_cuda_copy_async(void *dst, const void *src, uint64_t n, void *stream);
/* An event recorded on stream, after the work enqueued there so far. */
ferry_status fy_cuda_event_record(void *stream, void **event);
ferry_status fy_cuda_stream_sync(void *stream);

/* Any thread, no scope needed (they enter device's context themselves): */
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
} fy_consumer;

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

/* The device a consumer of d's pool works on: -1 for host pools, else the device argument
 * (None: the descriptor's). 0, or -1 with an exception. */
int fy_consumer_device(const ferry_descriptor *d, PyObject *device, int32_t *out);

/* ---- payload.c ------------------------------------------------------------------------ */

/* A lease that views (or a GPU copy still in flight) hold: the consumer stays alive, and the
 * last reference acknowledges the lease (ack_on_drop) for the consumer's rank. */
typedef struct fy_lease fy_lease;

fy_lease *fy_lease_new(fy_consumer *consumer, const ferry_descriptor *d, int ack_on_drop);
void fy_lease_ref(fy_lease *lease);
/* Drops a reference; the last one acknowledges, stream-ordered on *stream if stream is not
 * NULL (GPU views), else on the CPU. Any thread, no GIL. */
void fy_lease_drop(fy_lease *lease, void *const *stream);

typedef enum { FY_HOST_COPY, FY_HOST_VIEW, FY_GPU_COPY, FY_GPU_VIEW } fy_kind;

/* Memory that receive produced, and what must happen when its last user lets go. */
typedef struct fy_payload {
    fy_kind kind;
    void *data;
    DLDevice device;
    ferry_tensor tensor;
    uint64_t nbytes;
    fy_lease *lease;   /* views and GPU copies */
    void *buffer;      /* copies: memory the payload owns */
    void *ready;       /* GPU: event recorded after the enqueued read, NULL if none */
    void *recv_stream; /* GPU: the stream of the receive */
    void *ack_stream;  /* GPU views: the stream the consumer uses the view on */
    int has_ack_stream;
} fy_payload;

/* Frees a payload: acknowledges views, frees copies. Any thread, no GIL. */
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

/* ---- pool.c / publish.c / reservation.c --------------------------------------------- */

enum { FY_FULL_RAISE = 0, FY_FULL_NONE = 1, FY_FULL_WAIT = 2 };

typedef struct fy_pending fy_pending;

typedef struct {
    PyObject_HEAD
    ferry_pool *pool;
    int backend; /* the resolved ferry_backend */
    int device;  /* -1 for host pools */
    int on_full;
    uint64_t wait_ns; /* how long on_full="wait" waits by default */
    int closed;
    int host_control;    /* GPU pools: control words in host memory (ready words the CPU reads) */
    fy_pending *pending; /* GPU pools: sources whose copy may still be running */
} fy_pool;

extern PyTypeObject fy_PoolType;

/* How long a publish or reserve may wait for space: timeout if given, else the policy's. */
int fy_pool_wait_ns(fy_pool *self, PyObject *timeout, uint64_t *ns);

/* The answer to a failed publish or reserve: None for a full pool under on_full="none",
 * else the exception (NULL). */
PyObject *fy_pool_failure(fy_pool *self, ferry_status st);

PyObject *fy_pool_publish(fy_pool *self, PyObject *args, PyObject *kwargs);
PyObject *fy_pool_publish_many(fy_pool *self, PyObject *args, PyObject *kwargs);
/* Lets go of sources whose copies have run (all of them, waiting, with wait). */
void fy_pool_settle(fy_pool *self, int wait);

extern PyTypeObject fy_ReservationType;
PyObject *fy_pool_reserve(fy_pool *self, PyObject *args, PyObject *kwargs);

/* ---- receive.c / received.c ---------------------------------------------------------- */

extern PyTypeObject fy_ReceivedType;

/* A Received that owns payload (new reference; on failure the payload is released). */
PyObject *fy_received_new(fy_payload *payload, PyObject *descriptor);

PyObject *fy_receive(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fy_receive_many(PyObject *module, PyObject *args, PyObject *kwargs);

#endif
