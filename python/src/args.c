/* Argument conversions shared by the package's functions. */
#include <math.h>
#include <string.h>

#include "ferry_py.h"

static PyObject *names[FY_NAME_COUNT];

int fy_names_init(void)
{
    static const char *const text[FY_NAME_COUNT] = {
        [FY_NAME_DLPACK] = "__dlpack__",
        [FY_NAME_DLPACK_DEVICE] = "__dlpack_device__",
        [FY_NAME_STREAM] = "stream",
        [FY_NAME_MAX_VERSION] = "max_version",
        [FY_NAME_CUDA_STREAM] = "cuda_stream",
        [FY_NAME_CUDA_STREAM_PROTOCOL] = "__cuda_stream__",
        [FY_NAME_PTR] = "ptr",
    };
    for (int i = 0; i < FY_NAME_COUNT; i++)
        if (!names[i] && !(names[i] = PyUnicode_InternFromString(text[i])))
            return -1;
    return 0;
}

PyObject *fy_name(fy_name_id id)
{
    return names[id];
}

/* Interns the names of kw once. 0, or -1 with the exception. */
static int keywords_ready(fy_keywords *kw)
{
    Py_ssize_t n = 0;
    if (kw->count)
        return 0;
    for (; n < FY_KWARGS_MAX && kw->names[n]; n++)
        if (!kw->interned[n] && !(kw->interned[n] = PyUnicode_InternFromString(kw->names[n])))
            return -1;
    kw->count = n;
    return 0;
}

/* The index of name among kw's names, or -1. */
static Py_ssize_t keyword_index(const fy_keywords *kw, PyObject *name)
{
    for (Py_ssize_t i = 0; i < kw->count; i++)
        if (name == kw->interned[i])
            return i;
    for (Py_ssize_t i = 0; i < kw->count; i++)
        if (PyUnicode_Compare(name, kw->interned[i]) == 0)
            return i;
    return -1;
}

int fy_kwargs(fy_keywords *kw, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              PyObject **values)
{
    if (keywords_ready(kw) < 0)
        return -1;
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > kw->positional) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd positional argument%s (%zd given)",
                     kw->fn, kw->positional, kw->positional == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        values[i] = args[i];
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = keyword_index(kw, name);
        if (i < 0 || values[i]) {
            PyErr_Format(PyExc_TypeError, "%s() %s keyword argument '%U'", kw->fn,
                         i < 0 ? "got an unexpected" : "got multiple values for", name);
            return -1;
        }
        values[i] = args[nargs + k];
    }
    return 0;
}

int fy_timeout_arg(PyObject *obj, uint64_t dflt, uint64_t *ns)
{
    if (obj == NULL || obj == Py_None) {
        *ns = dflt;
        return 0;
    }
    double seconds = PyFloat_AsDouble(obj);
    if (seconds == -1.0 && PyErr_Occurred())
        return -1;
    if (isnan(seconds) || seconds < 0) {
        PyErr_Format(PyExc_ValueError, "timeout must be a non-negative number of seconds, got %R",
                     obj);
        return -1;
    }
    if (seconds * 1e9 >= (double)FERRY_WAIT_FOREVER)
        *ns = FERRY_WAIT_FOREVER;
    else
        *ns = (uint64_t)(seconds * 1e9);
    return 0;
}

/* A stream handle from an int-like object. */
static int stream_from_int(PyObject *value, void **stream)
{
    unsigned long long handle = PyLong_AsUnsignedLongLong(value);
    if (handle == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "stream must be a non-negative handle, got %R", value);
        }
        return -1;
    }
    *stream = (void *)(uintptr_t)handle;
    return 0;
}

/* obj.name, or NULL without an exception when obj has no such attribute (NULL with one for
 * another error). */
static PyObject *optional_attr(PyObject *obj, fy_name_id name)
{
    PyObject *v = PyObject_GetAttr(obj, fy_name(name));
    if (!v && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return v;
}

/* The handle of a stream object: cuda_stream (torch), ptr (cupy), __cuda_stream__(). */
static PyObject *stream_handle(PyObject *obj)
{
    PyObject *handle = optional_attr(obj, FY_NAME_CUDA_STREAM);
    if (handle || PyErr_Occurred())
        return handle;
    PyObject *method = optional_attr(obj, FY_NAME_CUDA_STREAM_PROTOCOL);
    if (method) {
        PyObject *pair = PyObject_CallNoArgs(method);
        Py_DECREF(method);
        if (!pair)
            return NULL;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2)
            handle = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        else
            PyErr_SetString(PyExc_TypeError, "__cuda_stream__() must return (version, handle)");
        Py_DECREF(pair);
        return handle;
    }
    if (PyErr_Occurred() || (handle = optional_attr(obj, FY_NAME_PTR)) || PyErr_Occurred())
        return handle;
    PyErr_Format(PyExc_TypeError,
                 "stream must be None, an int handle or a stream object (cuda_stream, ptr or "
                 "__cuda_stream__), got %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

int fy_stream_arg(PyObject *obj, void **stream)
{
    if (obj == NULL || obj == Py_None) {
        *stream = NULL;
        return 0;
    }
    if (PyLong_Check(obj))
        return stream_from_int(obj, stream);
    PyObject *handle = stream_handle(obj);
    if (!handle)
        return -1;
    int rc = PyLong_Check(handle) ? stream_from_int(handle, stream) : -1;
    if (rc < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "the stream object's handle is not an int");
    Py_DECREF(handle);
    return rc;
}

uintptr_t fy_stream_key(void *stream)
{
    return stream ? (uintptr_t)stream : 1u;
}

PyObject *fy_stream_for_dlpack(void *stream)
{
    return PyLong_FromUnsignedLongLong((unsigned long long)fy_stream_key(stream));
}

int fy_int_pair(PyObject *obj, int *a, int *b)
{
    if (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != 2)
        return 0;
    long x = PyLong_AsLong(PyTuple_GET_ITEM(obj, 0)), y = PyLong_AsLong(PyTuple_GET_ITEM(obj, 1));
    if (PyErr_Occurred() || x < INT32_MIN || x > INT32_MAX || y < INT32_MIN || y > INT32_MAX) {
        PyErr_Clear();
        return 0;
    }
    *a = (int)x;
    *b = (int)y;
    return 1;
}

int fy_device_arg(PyObject *obj, int dflt, int *device)
{
    if (obj == NULL || obj == Py_None) {
        *device = dflt;
        return 0;
    }
    long value = PyLong_AsLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "device must be a GPU ordinal (>= 0), got %ld", value);
        return -1;
    }
    *device = (int)value;
    return 0;
}

int fy_rank_arg(PyObject *obj, uint32_t *rank)
{
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value > (long long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "rank must be a non-negative int, got %lld", value);
        return -1;
    }
    *rank = (uint32_t)value;
    return 0;
}

PyObject *fy_tuple_arg(PyObject *obj, const char *message)
{
    PyObject *fast = PySequence_Fast(obj, message);
    if (!fast || !PyList_Check(fast))
        return fast;
    PyObject *tuple = PyList_AsTuple(fast);
    Py_DECREF(fast);
    return tuple;
}
