/* Pool.reserve and ferry.Reservation: a leased slice written in place, then committed (or
 * cancelled). The slice is the pool's memory. Its exports (the buffer protocol on host pools,
 * __dlpack__) keep that memory mapped, across Pool.close() too (pool.c); new exports are
 * refused once the reservation was committed or cancelled or its pool closed, and writing
 * through an older one after the commit races with the consumers. A reservation that nobody
 * can commit any more (the object and its DLPack exports gone) is cancelled. */
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

enum { SLICE_OPEN, SLICE_COMMITTED, SLICE_CANCELLED };

/* The lease, shared by the Reservation and its DLPack exports; the last of them cancels it if
 * it is still open. Any thread, no GIL. */
typedef struct fy_slice {
    long refs; /* atomic */
    fy_pool_core *core;
    ferry_descriptor desc;
    int state; /* SLICE_*: written with the GIL while the Reservation lives */
} fy_slice;

typedef struct {
    PyObject_HEAD
    PyObject *pool; /* the fy_pool */
    PyObject *descriptor;
    fy_slice *slice;
    void *data;
    int gpu;
    DLDevice device;
} fy_reservation;

static fy_slice *slice_new(fy_pool_core *core, const ferry_descriptor *d)
{
    fy_slice *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->refs = 1;
    fy_core_ref(core);
    s->core = core;
    s->desc = *d;
    s->state = SLICE_OPEN;
    return s;
}

static void slice_ref(fy_slice *s)
{
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

static void slice_unref(fy_slice *s)
{
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (s->state == SLICE_OPEN)
        fy_core_cancel(s->core, &s->desc);
    fy_core_unref(s->core);
    free(s);
}

/* A DLPack export's end (its consumer's deleter, or its capsule unconsumed). */
static void export_release(void *ctx)
{
    fy_slice *s = ctx;
    fy_pool_core *core = s->core;
    fy_core_ref(core);
    slice_unref(s);
    fy_core_export_end(core); /* may finish a close that waited for the exports */
    fy_core_unref(core);
}

/* ---- Pool.reserve --------------------------------------------------------------------- */

static PyObject *reservation_new(fy_pool *pool, const ferry_descriptor *d, void *data)
{
    fy_reservation *r = PyObject_GC_New(fy_reservation, &fy_ReservationType);
    if (!r) {
        fy_core_cancel(pool->core, d);
        return NULL;
    }
    r->pool = Py_NewRef((PyObject *)pool);
    r->data = data;
    r->gpu = FY_POOL_GPU(pool);
    r->device = r->gpu ? (DLDevice){FY_DL_CUDA, pool->device} : (DLDevice){FY_DL_CPU, 0};
    r->slice = slice_new(pool->core, d);
    r->descriptor = r->slice ? fy_descriptor_new(d) : NULL;
    PyObject_GC_Track(r);
    if (!r->slice) {
        fy_core_cancel(pool->core, d);
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    if (!r->descriptor) {
        Py_DECREF(r); /* cancels the lease */
        return NULL;
    }
    return (PyObject *)r;
}

static int reserve_tensor(PyObject *shape, const char *dtype, ferry_tensor *t)
{
    memset(t, 0, sizeof(*t));
    return fy_dtype_parse(dtype, t) < 0 || fy_shape_parse(shape, t) < 0 ? -1 : 0;
}

static ferry_status reserve_once(fy_pool *self, const ferry_tensor *t, uint64_t wait_ns,
                                 void **data, ferry_descriptor *d)
{
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ferry_pool_reserve(self->pool, t, wait_ns, data, d);
    Py_END_ALLOW_THREADS return st;
}

static PyObject *reserve(fy_pool *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"shape", "dtype", "timeout", NULL};
    PyObject *shape, *timeout = Py_None;
    const char *dtype;
    ferry_tensor t;
    uint64_t wait_ns, needed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os|O:reserve", keywords, &shape, &dtype,
                                     &timeout) ||
        reserve_tensor(shape, dtype, &t) < 0 || fy_pool_wait_ns(self, timeout, &wait_ns) < 0 ||
        fy_pool_check(self) < 0)
        return NULL;
    ferry_tensor_nbytes(&t, &needed); /* invalid shapes: the library says why below */
    ferry_descriptor d;
    void *data = NULL;
    ferry_status st;
    fy_wait w;
    fy_wait_start(&w, wait_ns);
    for (;;) { /* in slices, so that Ctrl-C ends a wait for space */
        st = reserve_once(self, &t, fy_wait_slice(&w), &data, &d);
        if (st != FERRY_POOL_FULL || fy_pool_too_large(self, st, needed))
            break;
        int more = fy_pool_wait_next(self, &w);
        if (more < 0)
            return NULL;
        if (more == 0)
            break;
    }
    if (st != FERRY_OK)
        return fy_pool_failure(self, st, needed);
    return reservation_new(self, &d, data);
}

PyObject *fy_pool_reserve(fy_pool *self, PyObject *args, PyObject *kwargs)
{
    fy_log_hold hold;
    fy_log_hold_begin(&hold);
    PyObject *result = reserve(self, args, kwargs);
    fy_log_hold_end(&hold, !result && PyErr_ExceptionMatches(fy_PoolFull));
    return result;
}

/* ---- the object ----------------------------------------------------------------------- */

static int reservation_traverse(PyObject *obj, visitproc visit, void *arg)
{
    fy_reservation *r = (fy_reservation *)obj;
    Py_VISIT(r->pool);
    Py_VISIT(r->descriptor);
    return 0;
}

static int reservation_clear(PyObject *obj)
{
    fy_reservation *r = (fy_reservation *)obj;
    Py_CLEAR(r->pool);
    Py_CLEAR(r->descriptor);
    return 0;
}

static void reservation_dealloc(PyObject *obj)
{
    fy_reservation *r = (fy_reservation *)obj;
    PyObject_GC_UnTrack(obj);
    reservation_clear(obj);
    if (r->slice) { /* the last reference cancels a lease never committed */
        fy_slice *s = r->slice;
        r->slice = NULL;
        Py_BEGIN_ALLOW_THREADS slice_unref(s);
        Py_END_ALLOW_THREADS
    }
    PyObject_GC_Del(obj);
}

/* The reservation's pool (new reference), taking calls; NULL with an exception. */
static fy_pool *open_pool(fy_reservation *r)
{
    if (!r->pool) {
        PyErr_SetString(PyExc_RuntimeError, "the reservation's pool is gone");
        return NULL;
    }
    fy_pool *pool = (fy_pool *)Py_NewRef(r->pool);
    if (fy_pool_check(pool) == 0)
        return pool;
    Py_DECREF(pool);
    return NULL;
}

static ferry_status commit_lease(fy_pool *pool, const ferry_descriptor *d, void *stream)
{
    ferry_status st;
    int gpu = FY_POOL_GPU(pool);
    Py_BEGIN_ALLOW_THREADS
    if (gpu)
        st = ferry_pool_commit_async(pool->pool, d, stream);
    else
        st = ferry_pool_commit(pool->pool, d);
    Py_END_ALLOW_THREADS return st;
}

static PyObject *reservation_commit(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", NULL};
    fy_reservation *r = (fy_reservation *)obj;
    PyObject *stream_obj = Py_None, *result = NULL;
    void *stream = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:commit", keywords, &stream_obj) ||
        (r->gpu && fy_stream_arg(stream_obj, &stream) < 0))
        return NULL;
    fy_pool *pool = open_pool(r); /* held across the call */
    if (!pool)
        return NULL;
    ferry_status st = commit_lease(pool, &r->slice->desc, stream);
    if (st == FERRY_OK) {
        r->slice->state = SLICE_COMMITTED;
        result = Py_NewRef(Py_None);
    } else {
        fy_raise_pool(st, pool->pool);
    }
    Py_DECREF(pool);
    return result;
}

static PyObject *reservation_cancel(PyObject *obj, PyObject *unused)
{
    fy_reservation *r = (fy_reservation *)obj;
    (void)unused;
    fy_pool *pool = open_pool(r);
    if (!pool)
        return NULL;
    int rc = fy_pool_cancel_lease(pool, &r->slice->desc);
    Py_DECREF(pool);
    if (rc < 0)
        return NULL;
    r->slice->state = SLICE_CANCELLED;
    Py_RETURN_NONE;
}

static PyObject *reservation_enter(PyObject *obj, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(obj);
}

/* Commits after a block that ended normally, cancels after one that raised; a reservation
 * committed or cancelled already is left as it is, and so is one whose pool was closed (its
 * close released the lease). */
static PyObject *reservation_exit(PyObject *obj, PyObject *args)
{
    fy_reservation *r = (fy_reservation *)obj;
    PyObject *type, *value, *traceback, *done;
    if (!PyArg_UnpackTuple(args, "__exit__", 3, 3, &type, &value, &traceback))
        return NULL;
    if (r->slice->state != SLICE_OPEN)
        Py_RETURN_FALSE;
    if (type == Py_None) {
        PyObject *none = PyTuple_New(0);
        done = none ? reservation_commit(obj, none, NULL) : NULL;
        Py_XDECREF(none);
    } else if (!r->pool || ((fy_pool *)r->pool)->closed) {
        Py_RETURN_FALSE;
    } else {
        done = reservation_cancel(obj, NULL);
    }
    if (!done)
        return NULL;
    Py_DECREF(done);
    Py_RETURN_FALSE;
}

/* ---- exports -------------------------------------------------------------------------- */

static int check_exportable(fy_reservation *r)
{
    const char *why = NULL;
    if (!r->pool || ((fy_pool *)r->pool)->closed)
        why = "its pool is closed";
    else if (r->slice->state == SLICE_COMMITTED)
        why = "it was committed, and the consumers may read the slice now";
    else if (r->slice->state == SLICE_CANCELLED)
        why = "it was cancelled, and the slice may hold another lease now";
    if (!why)
        return 0;
    PyErr_Format(PyExc_BufferError, "the reservation's slice cannot be exported: %s", why);
    return -1;
}

static PyObject *reservation_dlpack(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    fy_reservation *r = (fy_reservation *)obj;
    fy_export_args a;
    if (fy_export_args_parse(args, kwargs, r->device, &a) < 0 || check_exportable(r) < 0)
        return NULL;
    fy_slice *s = r->slice;
    slice_ref(s);
    fy_core_export_begin(s->core);
    /* Nothing to order: the slice has no pending work until the producer writes it. */
    PyObject *capsule =
        fy_export(r->data, r->device, &s->desc.tensor, 0, a.versioned, export_release, s);
    if (!capsule)
        export_release(s);
    return capsule;
}

static PyObject *reservation_dlpack_device(PyObject *obj, PyObject *unused)
{
    (void)unused;
    return fy_device_tuple(((fy_reservation *)obj)->device);
}

static int reservation_getbuffer(PyObject *obj, Py_buffer *view, int flags)
{
    fy_reservation *r = (fy_reservation *)obj;
    if (r->gpu) {
        PyErr_SetString(PyExc_BufferError, "a GPU pool's slice is device memory: use __dlpack__");
        return -1;
    }
    if (check_exportable(r) < 0 ||
        PyBuffer_FillInfo(view, obj, r->data, (Py_ssize_t)r->slice->desc.length, 0, flags) < 0)
        return -1;
    fy_core_export_begin(r->slice->core); /* the memoryview holds the Reservation */
    return 0;
}

static void reservation_releasebuffer(PyObject *obj, Py_buffer *view)
{
    fy_pool_core *core = ((fy_reservation *)obj)->slice->core;
    (void)view;
    Py_BEGIN_ALLOW_THREADS fy_core_export_end(core); /* may finish a close */
    Py_END_ALLOW_THREADS
}

static PyBufferProcs reservation_buffer = {reservation_getbuffer, reservation_releasebuffer};

/* ---- properties and methods ----------------------------------------------------------- */

static PyObject *get_descriptor(PyObject *obj, void *closure)
{
    fy_reservation *r = (fy_reservation *)obj;
    (void)closure;
    if (!r->descriptor)
        return fy_descriptor_new(&r->slice->desc);
    return Py_NewRef(r->descriptor);
}

static PyObject *get_shape(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_shape_tuple(&((fy_reservation *)obj)->slice->desc.tensor);
}

static PyObject *get_dtype(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_dtype_name(&((fy_reservation *)obj)->slice->desc.tensor);
}

static PyObject *get_nbytes(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(((fy_reservation *)obj)->slice->desc.length);
}

static PyObject *get_state(PyObject *obj, void *closure)
{
    static const char *const states[] = {"open", "committed", "cancelled"};
    (void)closure;
    return PyUnicode_FromString(states[((fy_reservation *)obj)->slice->state]);
}

static PyObject *reservation_repr(PyObject *obj)
{
    static const char *const states[] = {"open", "committed", "cancelled"};
    fy_reservation *r = (fy_reservation *)obj;
    const ferry_descriptor *d = &r->slice->desc;
    PyObject *shape = fy_shape_tuple(&d->tensor), *dtype = fy_dtype_name(&d->tensor);
    PyObject *device = r->gpu ? PyUnicode_FromFormat("cuda:%d", (int)r->device.device_id)
                              : PyUnicode_FromString("cpu");
    PyObject *repr = NULL;
    if (shape && dtype && device)
        repr = PyUnicode_FromFormat(
            "ferry.Reservation(shape=%R, dtype=%R, nbytes=%llu, device=%R, slot=%u, state='%s')",
            shape, dtype, (unsigned long long)d->length, device, (unsigned)d->slot,
            states[r->slice->state]);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    return repr;
}

static PyGetSetDef reservation_getset[] = {
    {"descriptor", get_descriptor, NULL, "The lease's Descriptor (may be sent before commit).",
     NULL},
    {"shape", get_shape, NULL, "Shape of the tensor.", NULL},
    {"dtype", get_dtype, NULL, "dtype name of the tensor.", NULL},
    {"nbytes", get_nbytes, NULL, "Bytes of the tensor.", NULL},
    {"state", get_state, NULL,
     "'open', 'committed' or 'cancelled' (by this object's commit(), cancel() or exit).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef reservation_methods[] = {
    {"commit", (PyCFunction)(void (*)(void))reservation_commit, METH_VARARGS | METH_KEYWORDS,
     "commit(stream=None)\n\nMarks the slice ready. On GPU pools the ready write is enqueued on "
     "stream after the work that filled the slice. The slice cannot be exported afterwards."},
    {"cancel", reservation_cancel, METH_NOARGS,
     "cancel()\n\nPool.cancel(self.descriptor): the slice is freed, consumers refuse the "
     "descriptor (Stale)."},
    {"__enter__", reservation_enter, METH_NOARGS, NULL},
    {"__exit__", reservation_exit, METH_VARARGS,
     "Commits the reservation when the with block ends normally (on GPU pools: on the legacy "
     "default stream), cancels it when the block raised; one committed or cancelled already "
     "is left alone."},
    {"__dlpack__", (PyCFunction)(void (*)(void))reservation_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A writable DLPack capsule of the slice (host memory for host pools, device memory for "
     "GPU pools); the tensor keeps the pool's memory mapped. Refused (BufferError) once the "
     "reservation was committed or cancelled, or its pool closed."},
    {"__dlpack_device__", reservation_dlpack_device, METH_NOARGS, "(device_type, device_id)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_ReservationType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Reservation",
    .tp_basicsize = sizeof(fy_reservation),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A slice leased by Pool.reserve: write the tensor through __dlpack__ (or, on host "
              "pools, the buffer protocol: memoryview(r)), then commit(); or use it as a "
              "context manager (commit on a normal exit, cancel on an exception). The memory "
              "belongs to the pool: exports of it keep the pool's memory mapped, and new ones "
              "are refused after the commit. A reservation collected without a commit is "
              "cancelled.",
    .tp_dealloc = reservation_dealloc,
    .tp_repr = reservation_repr,
    .tp_traverse = reservation_traverse,
    .tp_clear = reservation_clear,
    .tp_as_buffer = &reservation_buffer,
    .tp_methods = reservation_methods,
    .tp_getset = reservation_getset,
};
