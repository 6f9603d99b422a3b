/* Argument conversions shared by the package's functions. */
#include <math.h>

#include "ferry_py.h"

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

/* The handle of a stream object: cuda_stream (torch), ptr (cupy), __cuda_stream__(). */
static PyObject *stream_handle(PyObject *obj)
{
    if (PyObject_HasAttrString(obj, "cuda_stream"))
        return PyObject_GetAttrString(obj, "cuda_stream");
    if (PyObject_HasAttrString(obj, "__cuda_stream__")) {
        PyObject *pair = PyObject_CallMethod(obj, "__cuda_stream__", NULL);
        if (!pair)
            return NULL;
        PyObject *handle = NULL;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2)
            handle = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        else
            PyErr_SetString(PyExc_TypeError, "__cuda_stream__() must return (version, handle)");
        Py_DECREF(pair);
        return handle;
    }
    if (PyObject_HasAttrString(obj, "ptr"))
        return PyObject_GetAttrString(obj, "ptr");
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
