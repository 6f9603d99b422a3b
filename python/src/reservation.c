/* Pool.reserve and ferry.Reservation: a leased slice written in place, then committed. Its
 * memory is the pool's: views of it are valid until the pool closes, and writing after the
 * commit races with the consumers. */
#include <string.h>

#include "ferry_py.h"

typedef struct {
    PyObject_HEAD
    PyObject *pool; /* the fy_pool */
    PyObject *descriptor;
    ferry_descriptor desc;
    void *data;
} fy_reservation;

#define POOL_OF(r) ((fy_pool *)(r)->pool)

static DLDevice reservation_device(const fy_reservation *r)
{
    const fy_pool *pool = POOL_OF(r);
    if (pool->backend == FERRY_BACKEND_HOST)
        return (DLDevice){FY_DL_CPU, 0};
    return (DLDevice){FY_DL_CUDA, pool->device};
}

static PyObject *reservation_new(fy_pool *pool, const ferry_descriptor *d, void *data)
{
    fy_reservation *r = PyObject_New(fy_reservation, &fy_ReservationType);
    if (!r)
        return NULL;
    r->pool = Py_NewRef((PyObject *)pool);
    r->desc = *d;
    r->data = data;
    r->descriptor = fy_descriptor_new(d);
    if (!r->descriptor) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static int reserve_tensor(PyObject *shape, const char *dtype, ferry_tensor *t)
{
    memset(t, 0, sizeof(*t));
    return fy_dtype_parse(dtype, t) < 0 || fy_shape_parse(shape, t) < 0 ? -1 : 0;
}

PyObject *fy_pool_reserve(fy_pool *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"shape", "dtype", "timeout", NULL};
    PyObject *shape, *timeout = Py_None;
    const char *dtype;
    ferry_tensor t;
    uint64_t wait_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os|O:reserve", keywords, &shape, &dtype,
                                     &timeout) ||
        reserve_tensor(shape, dtype, &t) < 0 || fy_pool_wait_ns(self, timeout, &wait_ns) < 0)
        return NULL;
    if (!self->pool) {
        PyErr_SetString(PyExc_RuntimeError, "the Pool was not initialised");
        return NULL;
    }
    ferry_descriptor d;
    void *data = NULL;
    ferry_status st;
    fy_cuda_scope scope;
    Py_BEGIN_ALLOW_THREADS fy_cuda_enter(&scope, FY_CUDA_FOR(self->backend != FERRY_BACKEND_HOST));
    st = ferry_pool_reserve(self->pool, &t, wait_ns, &data, &d);
    fy_cuda_leave(&scope);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_pool_failure(self, st);
    return reservation_new(self, &d, data);
}

static void reservation_dealloc(PyObject *obj)
{
    fy_reservation *r = (fy_reservation *)obj;
    Py_XDECREF(r->descriptor);
    Py_XDECREF(r->pool);
    PyObject_Free(obj);
}

static PyObject *reservation_commit(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", NULL};
    fy_reservation *r = (fy_reservation *)obj;
    PyObject *stream_obj = Py_None;
    void *stream = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:commit", keywords, &stream_obj))
        return NULL;
    int gpu = POOL_OF(r)->backend != FERRY_BACKEND_HOST;
    if (gpu && fy_stream_arg(stream_obj, &stream) < 0)
        return NULL;
    ferry_status st;
    fy_cuda_scope scope;
    fy_cuda_enter(&scope, FY_CUDA_FOR(gpu));
    if (gpu)
        st = ferry_pool_commit_async(POOL_OF(r)->pool, &r->desc, stream);
    else
        st = ferry_pool_commit(POOL_OF(r)->pool, &r->desc);
    fy_cuda_leave(&scope);
    if (st != FERRY_OK)
        return fy_raise_pool(st, POOL_OF(r)->pool);
    Py_RETURN_NONE;
}

static PyObject *reservation_cancel(PyObject *obj, PyObject *unused)
{
    fy_reservation *r = (fy_reservation *)obj;
    (void)unused;
    return PyObject_CallMethod(r->pool, "cancel", "O", r->descriptor);
}

static PyObject *reservation_dlpack(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    fy_reservation *r = (fy_reservation *)obj;
    fy_export_args a;
    DLDevice device = reservation_device(r);
    if (fy_export_args_parse(args, kwargs, device, &a) < 0)
        return NULL;
    /* Nothing to order: the slice has no pending work until the producer writes it. */
    return fy_export(r->data, device, &r->desc.tensor, 0, a.versioned, NULL, NULL);
}

static PyObject *reservation_dlpack_device(PyObject *obj, PyObject *unused)
{
    (void)unused;
    return fy_device_tuple(reservation_device((fy_reservation *)obj));
}

static int reservation_getbuffer(PyObject *obj, Py_buffer *view, int flags)
{
    fy_reservation *r = (fy_reservation *)obj;
    if (POOL_OF(r)->backend != FERRY_BACKEND_HOST) {
        PyErr_SetString(PyExc_BufferError, "a GPU pool's slice is device memory: use __dlpack__");
        return -1;
    }
    return PyBuffer_FillInfo(view, obj, r->data, (Py_ssize_t)r->desc.length, 0, flags);
}

static PyBufferProcs reservation_buffer = {reservation_getbuffer, NULL};

static PyObject *get_descriptor(PyObject *obj, void *closure)
{
    (void)closure;
    return Py_NewRef(((fy_reservation *)obj)->descriptor);
}

static PyObject *get_shape(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_shape_tuple(&((fy_reservation *)obj)->desc.tensor);
}

static PyObject *get_dtype(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_dtype_name(&((fy_reservation *)obj)->desc.tensor);
}

static PyObject *get_nbytes(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(((fy_reservation *)obj)->desc.length);
}

static PyGetSetDef reservation_getset[] = {
    {"descriptor", get_descriptor, NULL, "The lease's Descriptor (may be sent before commit).",
     NULL},
    {"shape", get_shape, NULL, "Shape of the tensor.", NULL},
    {"dtype", get_dtype, NULL, "dtype name of the tensor.", NULL},
    {"nbytes", get_nbytes, NULL, "Bytes of the tensor.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef reservation_methods[] = {
    {"commit", (PyCFunction)(void (*)(void))reservation_commit, METH_VARARGS | METH_KEYWORDS,
     "commit(stream=None)\n\nMarks the slice ready. On GPU pools the ready write is enqueued on "
     "stream after the work that filled the slice."},
    {"cancel", reservation_cancel, METH_NOARGS, "cancel()\n\nPool.cancel(self.descriptor)."},
    {"__dlpack__", (PyCFunction)(void (*)(void))reservation_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A writable DLPack capsule of the slice (host memory for host pools, device memory for "
     "GPU pools)."},
    {"__dlpack_device__", reservation_dlpack_device, METH_NOARGS, "(device_type, device_id)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_ReservationType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Reservation",
    .tp_basicsize = sizeof(fy_reservation),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A slice leased by Pool.reserve: write the tensor through __dlpack__ (or, on host "
              "pools, the buffer protocol: memoryview(r)), then commit(). The memory belongs to "
              "the pool: views of it are valid until the pool closes.",
    .tp_dealloc = reservation_dealloc,
    .tp_as_buffer = &reservation_buffer,
    .tp_methods = reservation_methods,
    .tp_getset = reservation_getset,
};
