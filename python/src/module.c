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

#define METH_KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS

static PyMethodDef module_methods[] = {
    {"receive", METH_KW(fy_receive),
     "receive(descriptor, *, rank, device=None, copy=True, stream=None, timeout=None, "
     "out=None) -> Received | out\n\n"
     "Waits up to timeout seconds (default 10, inf: forever; Ctrl-C interrupts it) for the "
     "lease, then copies the "
     "tensor into memory the result owns and acknowledges it as rank (copy=True), or views it "
     "in the pool (copy=False: read-only; acknowledged when the view is freed). GPU pools: "
     "the copy lands in device memory on device (default: the descriptor's), enqueued on "
     "stream, and so does the acknowledgement.\n\n"
     "out: a writable, C-contiguous tensor of the same dtype and element count (any shape, "
     "any object with __dlpack__, e.g. torch.empty(...)): the tensor is copied into it and "
     "out is returned; its device is the default for device. The fastest way to a tensor "
     "the caller owns: no allocation by ferry, no Received. Keep out alive until stream has "
     "run the copy, as with any stream-ordered copy.\n"},
    {"receive_many", METH_KW(fy_receive_many),
     "receive_many(descriptors, *, rank, device=None, copy=True, stream=None, timeout=None) "
     "-> list[Received]\n\n"
     "receive for the descriptors of one publish_many (one lease): every descriptor is "
     "acknowledged (views: when freed), and the library acknowledges the lease for rank once "
     "all of its parts were."},
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
