/* ferry.Received: what receive returns. It owns the received memory until a DLPack consumer
 * takes it (once: a second __dlpack__ raises BufferError); host results also expose their
 * bytes through the buffer protocol (read-only for views). The payload changes hands with
 * the GIL held, before any wait that releases it: two threads cannot both export it, and a
 * wait holds a reference of its own. */
#include "ferry_py.h"

typedef struct {
    PyObject_HEAD
    fy_payload *payload;  /* NULL once exported */
    PyObject *descriptor; /* NULL until asked for (made from desc) */
    ferry_descriptor desc;
    Py_ssize_t buffers; /* live buffer-protocol exports */
    DLDevice device;
    ferry_tensor tensor;
    uint64_t nbytes;
    int readonly;
} fy_received;

static int is_view(const fy_payload *p)
{
    return p->kind == FY_HOST_VIEW || p->kind == FY_GPU_VIEW;
}

static void release_payload(fy_payload *p)
{
    if (!p)
        return;
    if (p->kind == FY_HOST_COPY || p->kind == FY_HOST_VIEW) {
        fy_payload_release(p);
        return;
    }
    Py_BEGIN_ALLOW_THREADS /* acknowledgements (and a free whose stream is gone) may wait */
        fy_payload_release(p);
    Py_END_ALLOW_THREADS
}

PyObject *fy_received_new(fy_payload *payload, const ferry_descriptor *d, PyObject *descriptor)
{
    fy_received *r = PyObject_GC_New(fy_received, &fy_ReceivedType);
    if (!r) {
        release_payload(payload);
        return NULL;
    }
    r->payload = payload;
    r->descriptor = Py_XNewRef(descriptor);
    r->desc = *d;
    r->buffers = 0;
    r->device = payload->device;
    r->tensor = payload->tensor;
    r->nbytes = payload->nbytes;
    r->readonly = is_view(payload);
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static int received_traverse(PyObject *obj, visitproc visit, void *arg)
{
    Py_VISIT(((fy_received *)obj)->descriptor);
    return 0;
}

static int received_clear(PyObject *obj)
{
    Py_CLEAR(((fy_received *)obj)->descriptor);
    return 0;
}

static void received_dealloc(PyObject *obj)
{
    fy_received *r = (fy_received *)obj;
    PyObject_GC_UnTrack(obj);
    fy_payload *p = r->payload;
    r->payload = NULL;
    release_payload(p);
    received_clear(obj);
    PyObject_GC_Del(obj);
}

/* The consumer's stream for CUDA results: its own, the legacy default stream for None, none
 * (0) for -1. */
static uintptr_t consumer_stream(const fy_export_args *a)
{
    if (a->has_stream)
        return a->stream;
    return a->stream_is_none ? 1u : 0u;
}

/* Makes GPU data safe on the consumer's stream without waiting on the host: a copy's stream
 * waits for the receive's stream (an event recorded there now, after the copy); views need
 * nothing (the CPU saw the lease ready before handing them out). Notes the stream the tensor is
 * used on: views acknowledge there, copies are freed there. The caller owns p (taken from the
 * Received); its fields are read with the GIL. */
static int order_gpu(fy_payload *p, uintptr_t stream)
{
    uintptr_t recv = fy_stream_key(p->recv_stream);
    if (p->kind == FY_GPU_COPY && stream && stream != recv) {
        ferry_status st = fy_cuda_order(p->device.device_id, p->recv_stream,
                                        stream == 1u ? NULL : (void *)stream);
        if (st != FERRY_OK) {
            fy_raise(st);
            return -1;
        }
    }
    uintptr_t use = stream ? stream : recv;
    p->use_stream = use == 1u ? NULL : (void *)use;
    p->has_use_stream = 1;
    return 0;
}

static PyObject *received_dlpack(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    fy_received *r = (fy_received *)obj;
    fy_export_args a;
    if (fy_export_args_parse(args, kwargs, r->device, &a) < 0)
        return NULL;
    if (!r->payload)
        return PyErr_Format(PyExc_BufferError, "this ferry.Received was exported already: "
                                               "a received tensor can be exported once");
    if (r->buffers)
        return PyErr_Format(PyExc_BufferError,
                            "the received memory is exported through the buffer protocol: "
                            "release those memoryviews first");
    /* Taken before any wait releases the GIL: another thread sees it exported already. */
    fy_payload *p = r->payload;
    r->payload = NULL;
    PyObject *capsule = NULL;
    if (p->device.device_type != FY_DL_CUDA || order_gpu(p, consumer_stream(&a)) == 0)
        capsule = fy_export(p->data, p->device, &p->tensor, r->readonly, a.versioned,
                            fy_payload_release, p); /* the capsule (then its consumer) owns p */
    if (!capsule)
        r->payload = p; /* still the Received's */
    return capsule;
}

static PyObject *received_synchronize(PyObject *obj, PyObject *unused)
{
    fy_received *r = (fy_received *)obj;
    (void)unused;
    fy_payload *p = r->payload;
    if (!p || p->kind != FY_GPU_COPY)
        Py_RETURN_NONE; /* views were ready when handed out; host copies are done */
    void *stream = p->recv_stream;
    int device = r->device.device_id;
    ferry_status st;
    fy_payload_ref(p); /* the memory lives while this waits, even if p is exported and freed */
    Py_BEGIN_ALLOW_THREADS st = fy_cuda_wait_stream(device, stream);
    fy_payload_release(p);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *received_dlpack_device(PyObject *obj, PyObject *unused)
{
    (void)unused;
    return fy_device_tuple(((fy_received *)obj)->device);
}

static int received_getbuffer(PyObject *obj, Py_buffer *view, int flags)
{
    fy_received *r = (fy_received *)obj;
    if (!r->payload) {
        PyErr_SetString(PyExc_BufferError, "this ferry.Received was exported through DLPack");
        return -1;
    }
    if (r->device.device_type != FY_DL_CPU) {
        PyErr_SetString(PyExc_BufferError, "the received tensor is in device memory: use DLPack");
        return -1;
    }
    if (PyBuffer_FillInfo(view, obj, r->payload->data, (Py_ssize_t)r->nbytes, r->readonly, flags) <
        0)
        return -1;
    r->buffers++;
    return 0;
}

static void received_releasebuffer(PyObject *obj, Py_buffer *view)
{
    (void)view;
    ((fy_received *)obj)->buffers--;
}

static PyBufferProcs received_buffer = {received_getbuffer, received_releasebuffer};

static PyObject *get_descriptor(PyObject *obj, void *closure)
{
    fy_received *r = (fy_received *)obj;
    (void)closure;
    if (!r->descriptor && !(r->descriptor = fy_descriptor_new(&r->desc)))
        return NULL;
    return Py_NewRef(r->descriptor);
}

static PyObject *get_shape(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_shape_tuple(&((fy_received *)obj)->tensor);
}

static PyObject *get_dtype(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_dtype_name(&((fy_received *)obj)->tensor);
}

static PyObject *get_nbytes(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(((fy_received *)obj)->nbytes);
}

static PyObject *get_readonly(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((fy_received *)obj)->readonly);
}

static PyObject *get_exported(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((fy_received *)obj)->payload == NULL);
}

static PyObject *get_device(PyObject *obj, void *closure)
{
    (void)closure;
    return fy_device_tuple(((fy_received *)obj)->device);
}

/* "cpu", "cuda:1", or the DLPack pair for other devices. */
static PyObject *device_text(DLDevice device)
{
    if (device.device_type == FY_DL_CPU)
        return PyUnicode_FromString("cpu");
    if (device.device_type == FY_DL_CUDA)
        return PyUnicode_FromFormat("cuda:%d", (int)device.device_id);
    return PyUnicode_FromFormat("(%d, %d)", (int)device.device_type, (int)device.device_id);
}

static PyObject *received_repr(PyObject *obj)
{
    fy_received *self = (fy_received *)obj;
    PyObject *shape = fy_shape_tuple(&self->tensor), *dtype = fy_dtype_name(&self->tensor);
    PyObject *device = device_text(self->device), *repr = NULL;
    if (shape && dtype && device)
        repr = PyUnicode_FromFormat(
            "ferry.Received(shape=%R, dtype=%R, nbytes=%llu, device=%R, %s%s)", shape, dtype,
            (unsigned long long)self->nbytes, device, self->readonly ? "view" : "copy",
            self->payload ? "" : ", exported");
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    return repr;
}

static PyGetSetDef received_getset[] = {
    {"descriptor", get_descriptor, NULL, "The Descriptor that was received.", NULL},
    {"shape", get_shape, NULL, "Shape of the tensor.", NULL},
    {"dtype", get_dtype, NULL, "dtype name of the tensor.", NULL},
    {"nbytes", get_nbytes, NULL, "Bytes of the tensor.", NULL},
    {"device", get_device, NULL, "(device_type, device_id), as __dlpack_device__.", NULL},
    {"readonly", get_readonly, NULL, "True for views (copy=False): the producer's memory.", NULL},
    {"exported", get_exported, NULL, "True once a DLPack consumer took the tensor.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef received_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))received_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\n"
     "A DLPack capsule of the tensor (versioned when max_version >= (1, 0)); views are "
     "flagged read-only. For CUDA results on a stream other than the receive's, the data is "
     "made safe on it first. Once only: the capsule's consumer then owns the memory."},
    {"__dlpack_device__", received_dlpack_device, METH_NOARGS, "(device_type, device_id)"},
    {"synchronize", received_synchronize, METH_NOARGS,
     "synchronize()\n\nBlocks until the work enqueued on the receive's stream (GPU pools) up "
     "to this call has run, the receive's copy included: the data can then be read from any "
     "stream or by the host. A no-op for host pools, views and once exported."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_ReceivedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Received",
    .tp_basicsize = sizeof(fy_received),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A received tensor: hand it to numpy.from_dlpack, torch.from_dlpack or "
              "cupy.from_dlpack (once). Copies own their memory; views (copy=False) are the "
              "producer's slice, read-only, and acknowledge the lease when freed. Host results "
              "also support the buffer protocol (bytes(r), memoryview(r)).",
    .tp_dealloc = received_dealloc,
    .tp_repr = received_repr,
    .tp_traverse = received_traverse,
    .tp_clear = received_clear,
    .tp_as_buffer = &received_buffer,
    .tp_methods = received_methods,
    .tp_getset = received_getset,
};
