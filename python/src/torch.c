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
static PyObject *get_device;  /* torch._C._cuda_getDevice (NULL: torch has none) */
static PyObject *set_device;  /* torch._C._cuda_setDevice */
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
    get_device = PyObject_GetAttrString(torch_c, "_cuda_getDevice");
    set_device = get_device ? PyObject_GetAttrString(torch_c, "_cuda_setDevice") : NULL;
    if (!set_device)
        Py_CLEAR(get_device);
    PyErr_Clear();
    return 1;
}

static int is_torch_tensor(PyObject *obj)
{
    if (!tensor_type && !lookup())
        return 0;
    return PyObject_TypeCheck(obj, (PyTypeObject *)tensor_type);
}

int fy_torch_current_stream(int32_t device, void **stream)
{
    if (!tensor_type && !lookup())
        return -1;
    PyObject *index = PyLong_FromLong(device);
    PyObject *raw = index ? PyObject_CallOneArg(raw_stream, index) : NULL;
    unsigned long long handle = raw ? PyLong_AsUnsignedLongLong(raw) : 0;
    Py_XDECREF(index);
    Py_XDECREF(raw);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *stream = (void *)(uintptr_t)handle;
    return 0;
}

int fy_torch_on_stream(PyObject *obj, int32_t device_id, void *stream)
{
    void *current;
    if (!is_torch_tensor(obj) || fy_torch_current_stream(device_id, &current) < 0)
        return 0;
    return fy_stream_key(current) == fy_stream_key(stream);
}

/* ---- tensors from torch's allocator --------------------------------------------------- */

static long long call_int(PyObject *obj, PyObject *method);

static PyObject *m_empty;       /* torch.empty */
static PyObject *m_from_dlpack; /* torch.from_dlpack */
static PyObject *dtype_type;    /* torch.dtype */
static PyObject *by_name;       /* {ferry dtype name: torch.dtype or None} */
static PyObject *empty_kwnames; /* ("dtype", "device") */

static int empty_ready(void)
{
    if (m_empty)
        return 0;
    PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
    if (!torch) {
        PyErr_SetString(PyExc_ImportError, "torch=True needs torch: import torch first");
        return -1;
    }
    PyObject *empty = PyObject_GetAttrString(torch, "empty");
    PyObject *from = empty ? PyObject_GetAttrString(torch, "from_dlpack") : NULL;
    PyObject *type = from ? PyObject_GetAttrString(torch, "dtype") : NULL;
    PyObject *map = type ? PyDict_New() : NULL;
    PyObject *kw = map ? Py_BuildValue("(ss)", "dtype", "device") : NULL;
    if (!kw) {
        Py_XDECREF(empty);
        Py_XDECREF(from);
        Py_XDECREF(type);
        Py_XDECREF(map);
        return -1;
    }
    dtype_type = type;
    m_empty = empty;
    m_from_dlpack = from;
    by_name = map;
    empty_kwnames = kw;
    return 0;
}

/* torch's dtype of ferry's dtype name (borrowed; Py_None when torch has none). */
static PyObject *torch_dtype(const ferry_tensor *t)
{
    PyObject *name = fy_dtype_name(t);
    if (!name)
        return NULL;
    PyObject *dtype = PyDict_GetItemWithError(by_name, name);
    if (!dtype && !PyErr_Occurred()) {
        PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
        /* ferry's names are torch's but for the packed float4 pairs */
        const char *text = PyUnicode_AsUTF8(name);
        PyObject *attr = text && strcmp(text, "float4_e2m1fnx2") == 0
                             ? PyUnicode_FromString("float4_e2m1fn_x2")
                             : Py_NewRef(name);
        PyObject *found = torch && attr ? PyObject_GetAttr(torch, attr) : NULL;
        Py_XDECREF(attr);
        if (!found || !PyObject_TypeCheck(found, (PyTypeObject *)dtype_type)) {
            PyErr_Clear(); /* torch has no such dtype (float32x4; float8 in older torch) */
            Py_XDECREF(found);
            found = Py_NewRef(Py_None);
        }
        if (PyDict_SetItem(by_name, name, found) == 0)
            dtype = found;
        Py_DECREF(found);
    }
    Py_DECREF(name);
    return dtype;
}

int fy_torch_empty(const ferry_tensor *t, int32_t device, fy_import *out)
{
    if (empty_ready() < 0)
        return -1;
    PyObject *dtype = torch_dtype(t);
    if (!dtype)
        return -1;
    if (dtype == Py_None)
        return 0;
    PyObject *shape = fy_shape_tuple(t);
    PyObject *where = device >= 0 ? PyLong_FromLong(device) : PyUnicode_FromString("cpu");
    PyObject *args[3] = {shape, dtype, where};
    PyObject *tensor = shape && where ? PyObject_Vectorcall(m_empty, args, 1, empty_kwnames) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(where);
    if (!tensor)
        return -1;
    if (!tensor_type && !lookup()) {
        Py_DECREF(tensor);
        PyErr_SetString(PyExc_RuntimeError, "torch's Tensor type was not found");
        return -1;
    }
    long long ptr = call_int(tensor, m_data_ptr);
    if (ptr == -1 && PyErr_Occurred()) {
        Py_DECREF(tensor);
        return -1;
    }
    memset(out, 0, sizeof(*out));
    out->owner = tensor;
    out->data = (const void *)(uintptr_t)ptr;
    out->device_type = device >= 0 ? FY_DL_CUDA : FY_DL_CPU;
    out->device_id = device >= 0 ? device : 0;
    out->tensor = *t;
    return 1;
}

PyObject *fy_torch_from_dlpack(PyObject *obj)
{
    if (empty_ready() < 0)
        return NULL;
    return PyObject_CallOneArg(m_from_dlpack, obj);
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
    long c, b, l;
    if (!code || !PyTuple_CheckExact(code) || PyTuple_GET_SIZE(code) != 3)
        return 0;
    c = PyLong_AsLong(PyTuple_GET_ITEM(code, 0)); /* the module's own (code, bits, lanes) */
    b = PyLong_AsLong(PyTuple_GET_ITEM(code, 1));
    l = PyLong_AsLong(PyTuple_GET_ITEM(code, 2));
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

/* ---- torch's current device around a DLPack export -------------------------------------- */

int fy_torch_device_enter(PyObject *obj, int32_t device)
{
    if (!is_torch_tensor(obj) || !get_device)
        return -1;
    PyObject *now = PyObject_CallNoArgs(get_device);
    long current = now ? PyLong_AsLong(now) : -1;
    Py_XDECREF(now);
    PyObject *want = current >= 0 && current != device ? PyLong_FromLong(device) : NULL;
    PyObject *done = want ? PyObject_CallOneArg(set_device, want) : NULL;
    Py_XDECREF(want);
    Py_XDECREF(done);
    PyErr_Clear(); /* torch's own export then says what is wrong */
    return done ? (int)current : -1;
}

void fy_torch_device_exit(int restore)
{
    if (restore < 0)
        return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* the export's, if it failed */
    PyObject *index = PyLong_FromLong(restore);
    PyObject *done = index ? PyObject_CallOneArg(set_device, index) : NULL;
    Py_XDECREF(index);
    Py_XDECREF(done);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}
