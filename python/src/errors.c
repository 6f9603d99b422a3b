/* ferry statuses as Python exceptions. Invalid arguments (INVALID_ARGUMENT, MALFORMED,
 * MISMATCH) are ValueError; everything else derives from ferry.Error (a RuntimeError). Every
 * exception carries the library's detailed message and the status name in .status. */
#include "ferry_py.h"

PyObject *fy_Error, *fy_PoolFull, *fy_Stale, *fy_ProducerGone, *fy_Timeout, *fy_PoolFailed,
    *fy_Closing;

static PyObject *new_class(const char *name, const char *doc, PyObject *bases)
{
    return PyErr_NewExceptionWithDoc(name, doc, bases, NULL);
}

static int add_class(PyObject *module, const char *attr, PyObject *cls)
{
    if (!cls)
        return -1;
    Py_INCREF(cls);
    if (PyModule_AddObject(module, attr, cls) < 0) {
        Py_DECREF(cls);
        return -1;
    }
    return 0;
}

static PyObject *new_subclass(const char *name, const char *doc)
{
    return new_class(name, doc, fy_Error);
}

static PyObject *new_timeout_class(void)
{
    PyObject *bases = PyTuple_Pack(2, fy_Error, PyExc_TimeoutError);
    if (!bases)
        return NULL;
    PyObject *cls = new_class(
        "ferry.Timeout", "A wait ran out of time (status TIMEOUT). Also a TimeoutError.", bases);
    Py_DECREF(bases);
    return cls;
}

int fy_errors_add(PyObject *module)
{
    fy_Error = new_class("ferry.Error",
                         "Base class of ferry's errors other than invalid arguments (which are "
                         "ValueError). .status is the ferry status name.",
                         PyExc_RuntimeError);
    if (add_class(module, "Error", fy_Error) < 0)
        return -1;
    fy_PoolFull = new_subclass("ferry.PoolFull",
                               "The pool had no room for the tensor (status POOL_FULL); the "
                               "message names the slowest consumer.");
    fy_Stale = new_subclass("ferry.Stale", "The descriptor's lease was acknowledged by this rank, "
                                           "cancelled, or its slot was reused (status STALE).");
    fy_ProducerGone = new_subclass("ferry.ProducerGone",
                                   "The producer died or closed the pool (status PRODUCER_GONE).");
    fy_PoolFailed = new_subclass("ferry.PoolFailed",
                                 "A background part of the pool failed (status POOL_FAILED); "
                                 "__cause__ carries the first cause.");
    fy_Closing = new_subclass("ferry.Closing", "The pool is closing or closed (status CLOSING).");
    if (add_class(module, "PoolFull", fy_PoolFull) < 0 ||
        add_class(module, "Stale", fy_Stale) < 0 ||
        add_class(module, "ProducerGone", fy_ProducerGone) < 0 ||
        add_class(module, "PoolFailed", fy_PoolFailed) < 0 ||
        add_class(module, "Closing", fy_Closing) < 0)
        return -1;
    fy_Timeout = new_timeout_class();
    return add_class(module, "Timeout", fy_Timeout);
}

static PyObject *class_of(ferry_status st)
{
    switch (st) {
    case FERRY_INVALID_ARGUMENT:
    case FERRY_MALFORMED:
    case FERRY_MISMATCH:
        return PyExc_ValueError;
    case FERRY_POOL_FULL:
        return fy_PoolFull;
    case FERRY_STALE:
        return fy_Stale;
    case FERRY_PRODUCER_GONE:
        return fy_ProducerGone;
    case FERRY_TIMEOUT:
        return fy_Timeout;
    case FERRY_POOL_FAILED:
        return fy_PoolFailed;
    case FERRY_CLOSING:
        return fy_Closing;
    default:
        return fy_Error;
    }
}

/* An instance of the status's class with message, and .status set. */
static PyObject *make_error(ferry_status st, const char *message)
{
    PyObject *cls = class_of(st);
    PyObject *exc = PyObject_CallFunction(cls, "s", message);
    if (!exc)
        return NULL;
    PyObject *name = PyUnicode_FromString(ferry_status_name(st));
    if (!name || PyObject_SetAttrString(exc, "status", name) < 0) {
        Py_XDECREF(name);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(name);
    return exc;
}

static PyObject *raise_with(ferry_status st, const char *message, const char *cause)
{
    PyObject *exc = make_error(st, *message ? message : ferry_status_str(st));
    if (!exc)
        return NULL;
    if (cause && *cause) {
        PyObject *why = PyObject_CallFunction(PyExc_RuntimeError, "s", cause);
        if (why)
            PyException_SetCause(exc, why); /* steals why */
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *fy_raise(ferry_status st)
{
    return raise_with(st, ferry_last_error(), NULL);
}

PyObject *fy_raise_pool(ferry_status st, ferry_pool *pool)
{
    if (st != FERRY_POOL_FAILED || !pool)
        return fy_raise(st);
    char message[1024], cause[1024] = "";
    snprintf(message, sizeof(message), "%s", ferry_last_error());
    ferry_pool_error(pool, cause, sizeof(cause)); /* overwrites the thread's last error */
    return raise_with(st, message, cause);
}
