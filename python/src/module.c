/* The ferry._ferry module: its types, exceptions and functions. */
#include "ferry_py.h"

static PyObject *split_budget(PyObject *module, PyObject *args)
{
    long long total, workers;
    int64_t share;
    (void)module;
    if (!PyArg_ParseTuple(args, "LL:split_budget", &total, &workers))
        return NULL;
    ferry_status st = ferry_split_budget(total, workers, &share);
    if (st != FERRY_OK)
        return fy_raise(st);
    return PyLong_FromLongLong(share);
}

static PyObject *version(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(ferry_version());
}

/* The report, growing the buffer when the first one was too small. */
static PyObject *doctor_text(int json)
{
    size_t size = 16384, needed = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        char *buf = PyMem_Malloc(size);
        if (!buf)
            return PyErr_NoMemory();
        ferry_status st;
        Py_BEGIN_ALLOW_THREADS st = ferry_doctor_report(json, buf, size, &needed);
        Py_END_ALLOW_THREADS if (st != FERRY_OK)
        {
            PyMem_Free(buf);
            return fy_raise(st);
        }
        if (needed < size) {
            PyObject *text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)needed, "replace");
            PyMem_Free(buf);
            return text;
        }
        PyMem_Free(buf);
        size = needed + 1;
    }
    return PyErr_Format(PyExc_RuntimeError, "ferry_doctor_report kept growing");
}

static PyObject *doctor(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"json", NULL};
    int json = 0;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$p:doctor", keywords, &json))
        return NULL;
    return doctor_text(json);
}

/* ferry.release_memory(device=None, keep=0) */
static PyObject *release_memory(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"device", "keep", NULL};
    PyObject *device_obj = Py_None;
    unsigned long long keep = 0;
    int device = -1;
    ferry_status st = FERRY_OK;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OK:release_memory", keywords, &device_obj,
                                     &keep) ||
        fy_device_arg(device_obj, -1, &device) < 0)
        return NULL;
    if (device < 0) {
        Py_BEGIN_ALLOW_THREADS fy_host_buffers_release();
        Py_END_ALLOW_THREADS Py_RETURN_NONE;
    }
    Py_BEGIN_ALLOW_THREADS st = ferry_gpu_trim(device, keep);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *host_buffers_kept(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(fy_host_buffers_kept());
}

#define METH_KW(fn)   (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS
#define METH_FAST(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef module_methods[] = {
    {"receive", METH_FAST(fy_receive),
     "receive(descriptor, *, rank, device=None, copy=True, stream=None, timeout=None, "
     "torch=False, out=None) -> Received | out | torch.Tensor\n\n"
     "Waits up to timeout seconds (default 10, inf: forever; Ctrl-C interrupts it) for the "
     "lease, then copies the "
     "tensor into memory the result owns and acknowledges it as rank (copy=True), or views it "
     "in the pool (copy=False: read-only; acknowledged when the view is freed). GPU pools: "
     "the copy lands in device memory on device (default: the descriptor's), stream-ordered "
     "memory allocated on stream, where the copy and then the acknowledgement are enqueued.\n\n"
     "out: a writable, C-contiguous tensor of the same dtype and element count (any shape, "
     "any object with __dlpack__, e.g. torch.empty(...)): the tensor is copied into it and "
     "out is returned; its device is the default for device. No allocation by ferry, no "
     "Received. Keep out alive until stream has run the copy, as with any stream-ordered "
     "copy.\n\n"
     "torch=True: a torch tensor, from torch's allocator (torch.empty) and read into as out= "
     "is; on GPU pools on torch's current stream of the device, unless stream= names another "
     "(torch's current stream then waits for the copy). Views (copy=False) come as "
     "torch.from_dlpack of the Received.\n"},
    {"receive_many", METH_FAST(fy_receive_many),
     "receive_many(descriptors, *, rank, device=None, copy=True, stream=None, timeout=None, "
     "torch=False) -> list[Received] | list[torch.Tensor]\n\n"
     "receive for the descriptors of one publish_many (one lease): every descriptor is "
     "acknowledged (views: when freed), and the library acknowledges the lease for rank once "
     "all of its parts were."},
    {"release_memory", METH_KW(release_memory),
     "release_memory(device=None, keep=0)\n\n"
     "Gives back memory that received copies came from and that none of them uses now. "
     "device: a GPU, whose stream-ordered pool keeps what it once held (so that receiving "
     "neither allocates nor waits for the device) and now keeps at most keep bytes; None: the "
     "large host buffers kept for reuse (a few, 256 MiB at most), freed."},
    {"ack", METH_KW(fy_ack),
     "ack(descriptor, *, rank=None, ranks=None, device=None, lease=False)\n\n"
     "Acknowledges a lease without reading it: for rank, for ranks (a range, e.g. "
     "range(2, 4)), or for every rank when neither is given. For a part of a packed lease, "
     "that part; with lease=True the whole lease through it, every part at once."},
    {"split_budget", split_budget, METH_VARARGS,
     "split_budget(total, workers) -> int\n\nA node's pool budget split across workers: "
     "total // workers."},
    {"release_consumers", fy_release_consumers, METH_NOARGS,
     "release_consumers()\n\nDrops this process's cached consumers (and so its mappings of "
     "pools) once no view still holds them; later receives open them again. Copies into "
     "out= read the mapping on their stream: synchronise those streams first."},
    {"version", version, METH_NOARGS, "version() -> str\n\nThe libferry version."},
    {"doctor", METH_KW(doctor),
     "doctor(*, json=False) -> str\n\nThe library's report on this machine "
     "(ferry_doctor_report): its CUDA driver, GPUs, CUDA IPC and VMM support, and the backend "
     "that backend='auto' picks and why; text for people, or one JSON object."},
    {"_host_buffers_kept", host_buffers_kept, METH_NOARGS,
     "_host_buffers_kept() -> int\n\nBytes of host buffers kept for reuse (for tests)."},
    {"_log_flush", fy_log_flush, METH_NOARGS,
     "_log_flush()\n\nDelivers the log lines that ferry's own threads queued for logging "
     "now (they go out soon after anyway)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ferry._ferry",
    .m_doc = "The C extension over libferry; use the ferry package.",
    .m_size = -1,
    .m_methods = module_methods,
};

static int add_type(PyObject *module, const char *name, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static int add_constants(PyObject *module)
{
    return PyModule_AddIntConstant(module, "DESCRIPTOR_SIZE", FERRY_DESCRIPTOR_SIZE) < 0 ||
                   PyModule_AddIntConstant(module, "MAX_NDIM", FERRY_MAX_NDIM) < 0 ||
                   PyModule_AddIntConstant(module, "kDLCPU", FY_DL_CPU) < 0 ||
                   PyModule_AddIntConstant(module, "kDLCUDA", FY_DL_CUDA) < 0
               ? -1
               : 0;
}

PyMODINIT_FUNC PyInit__ferry(void); /* the module's only exported symbol */

PyMODINIT_FUNC PyInit__ferry(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (!module)
        return NULL;
    if (fy_names_init() < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (fy_consumers_init() < 0) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_atfork failed");
        return NULL;
    }
    if (fy_errors_add(module) < 0 || add_type(module, "Descriptor", &fy_DescriptorType) < 0 ||
        add_type(module, "Pool", &fy_PoolType) < 0 ||
        add_type(module, "Reservation", &fy_ReservationType) < 0 ||
        add_type(module, "Received", &fy_ReceivedType) < 0 ||
        add_type(module, "Receiver", &fy_ReceiverType) < 0 || add_constants(module) < 0 ||
        fy_log_install(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
