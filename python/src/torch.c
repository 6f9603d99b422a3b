/* torch tensors without a DLPack capsule: the fast path for the framework most of ferry's
 * users run. torch's __dlpack__ and __dlpack_device__ are Python code (3-12 us a call on the
 * GPU machine, most of a publish); the tensor's C getters say the same in well under 1 us.
 * The path is taken only where it changes nothing: a CUDA tensor that DLPack would export as
 * it is (strided, C-contiguous, no pending conjugation or negation, no autograd), of a dtype
 * an earlier DLPack export of a torch tensor mapped, read or written on torch's current
 * stream of its device (so no stream ordering is owed). Everything else goes through DLPack.
 * ferry never imports torch: all this waits until the program has. */
#include <string.h>

#include "ferry_py.h"

static PyObject *tensor_type; /* torch.Tensor */
static PyObject *raw_stream;  /* torch._C._cuda_getCurrentRawStream */
static PyObject *strided;     /* torch.strided */
static PyObject *dtypes;      /* {torch.dtype: (code, bits, lanes)}, learnt from DLPack */
static PyObject *names[8];    /* interned attribute names, as in enum below */
enum {
    A_IS_CUDA,
    A_REQUIRES_GRAD,
    A_LAYOUT,
    A_DTYPE,
    A_SHAPE,
    A_IS_CONTIGUOUS,
    A_IS_CONJ,
    A_IS_NEG
};
static PyObject *m_get_device, *m_data_ptr;

static int lookup(void)
{
    static const char *const attrs[] = {"is_cuda", "requires_grad", "layout",  "dtype",
                                        "shape",   "is_contiguous", "is_conj", "is_neg"};
    PyObject *modules = PyImport_GetModuleDict();
    PyObject *torch = PyDict_GetItemString(modules, "torch");
    PyObject *torch_c = PyDict_GetItemString(modules, "torch._C");
    if (!torch || !torch_c)
        return 0;
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
    PyObject *getter = PyObject_GetAttrString(torch_c, "_cuda_getCurrentRawStream");
    PyObject *layout = PyObject_GetAttrString(torch, "strided");
    PyObject *map = PyDict_New();
    int ok = tensor && getter && layout && map && PyType_Check(tensor);
    for (size_t i = 0; ok && i < sizeof(attrs) / sizeof(attrs[0]); i++)
        ok = (names[i] = PyUnicode_InternFromString(attrs[i])) != NULL;
    ok = ok && (m_get_device = PyUnicode_InternFromString("get_device")) &&
         (m_data_ptr = PyUnicode_InternFromString("data_ptr"));
    if (!ok) {
        PyErr_Clear();
        Py_XDECREF(tensor);
        Py_XDECREF(getter);
        Py_XDECREF(layout);
        Py_XDECREF(map);
        return 0;
    }
    tensor_type = tensor;
    raw_stream = getter;
    strided = layout;
    dtypes = map;
    return 1;
}

static int is_torch_tensor(PyObject *obj)
{
    if (!tensor_type && !lookup())
        return 0;
    return PyObject_TypeCheck(obj, (PyTypeObject *)tensor_type);
}

int fy_torch_on_stream(PyObject *obj, int32_t device_id, void *stream)
{
    if (!is_torch_tensor(obj))
        return 0;
    PyObject *raw = PyObject_CallFunction(raw_stream, "i", (int)device_id);
    unsigned long long handle = raw ? PyLong_AsUnsignedLongLong(raw) : 0;
    Py_XDECREF(raw);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return fy_stream_key((void *)(uintptr_t)handle) == fy_stream_key(stream);
}

void fy_torch_learn(PyObject *obj, const ferry_tensor *t)
{
    if (!is_torch_tensor(obj))
        return;
    PyObject *dtype = PyObject_GetAttr(obj, names[A_DTYPE]);
    PyObject *value = Py_BuildValue("(iii)", t->dtype_code, t->dtype_bits, t->dtype_lanes);
    if (dtype && value)
        PyDict_SetItem(dtypes, dtype, value);
    Py_XDECREF(dtype);
    Py_XDECREF(value);
    PyErr_Clear();
}

/* obj.name is the object want (for bools: Py_True or Py_False). */
static int attr_is(PyObject *obj, int name, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(obj, names[name]);
    int same = v == want;
    Py_XDECREF(v);
    return same;
}

/* obj.name() returns want. */
static int call_is(PyObject *obj, int name, PyObject *want)
{
    PyObject *v = PyObject_CallMethodNoArgs(obj, names[name]);
    int same = v == want;
    Py_XDECREF(v);
    return same;
}

static long long call_int(PyObject *obj, PyObject *method)
{
    PyObject *v = PyObject_CallMethodNoArgs(obj, method);
    long long value = v ? PyLong_AsLongLong(v) : -1;
    Py_XDECREF(v);
    return value;
}

/* dtype and shape into t; 0 when the dtype was never mapped or the shape is not ferry's. */
static int describe(PyObject *obj, ferry_tensor *t)
{
    memset(t, 0, sizeof(*t));
    PyObject *dtype = PyObject_GetAttr(obj, names[A_DTYPE]);
    PyObject *code = dtype ? PyDict_GetItemWithError(dtypes, dtype) : NULL;
    Py_XDECREF(dtype);
    int c, b, l;
    if (!code || !PyArg_ParseTuple(code, "iii", &c, &b, &l))
        return 0;
    t->dtype_code = (uint8_t)c;
    t->dtype_bits = (uint8_t)b;
    t->dtype_lanes = (uint16_t)l;
    PyObject *shape = PyObject_GetAttr(obj, names[A_SHAPE]);
    int ok = shape && PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) <= FERRY_MAX_NDIM;
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(shape); i++) {
        long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        ok = n >= 0;
        t->shape[i] = n;
    }
    if (ok)
        t->ndim = (uint8_t)PyTuple_GET_SIZE(shape);
    Py_XDECREF(shape);
    uint64_t nbytes;
    return ok && ferry_tensor_nbytes(t, &nbytes) == FERRY_OK;
}

int fy_torch_take(PyObject *obj, void *stream, fy_import *out)
{
    if (!is_torch_tensor(obj))
        return 0;
    fy_import imp;
    memset(&imp, 0, sizeof(imp));
    int ok = attr_is(obj, A_IS_CUDA, Py_True) && attr_is(obj, A_REQUIRES_GRAD, Py_False) &&
             attr_is(obj, A_LAYOUT, strided) && call_is(obj, A_IS_CONTIGUOUS, Py_True) &&
             call_is(obj, A_IS_CONJ, Py_False) && call_is(obj, A_IS_NEG, Py_False) &&
             describe(obj, &imp.tensor);
    long long device = ok ? call_int(obj, m_get_device) : -1;
    long long ptr = device >= 0 ? call_int(obj, m_data_ptr) : -1;
    ok = ok && device >= 0 && ptr != -1 && !PyErr_Occurred() &&
         fy_torch_on_stream(obj, (int32_t)device, stream);
    PyErr_Clear();
    if (!ok)
        return 0;
    imp.data = (const void *)(uintptr_t)ptr;
    imp.device_type = FY_DL_CUDA;
    imp.device_id = (int32_t)device;
    imp.owner = Py_NewRef(obj);
    *out = imp;
    return 1;
}
