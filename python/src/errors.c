/* ferry statuses as Python exceptions. Invalid arguments (INVALID_ARGUMENT, MALFORMED,
 * MISMATCH) are ValueError; everything else derives from ferry.Error (a RuntimeError). Every
 * exception carries the library's detailed message and the status name in .status. One class
 * has no status of its own: TooLarge, the POOL_FULL of a tensor that can never fit. */
#include "ferry_py.h"

PyObject *fy_Error, *fy_PoolFull, *fy_TooLarge, *fy_Stale, *fy_ProducerGone, *fy_Timeout,
    *fy_PoolFailed, *fy_Closing, *fy_RankInUse, *fy_Forked;

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
    fy_RankInUse = new_subclass("ferry.RankInUse",
                                "The rank is held by another live process (status RANK_IN_USE): "
                                "each rank of a pool belongs to one consumer process.");
    fy_Forked = new_subclass("ferry.Forked",
                             "A pool or consumer was used in a forked child of the process that "
                             "made it (status FORKED): create a new one in the child.");
    if (add_class(module, "PoolFull", fy_PoolFull) < 0 ||
        add_class(module, "Stale", fy_Stale) < 0 ||
        add_class(module, "ProducerGone", fy_ProducerGone) < 0 ||
        add_class(module, "PoolFailed", fy_PoolFailed) < 0 ||
        add_class(module, "Closing", fy_Closing) < 0 ||
        add_class(module, "RankInUse", fy_RankInUse) < 0 ||
        add_class(module, "Forked", fy_Forked) < 0)
        return -1;
    fy_TooLarge = new_class("ferry.TooLarge",
                            "The tensor can never fit in the pool, however empty (status "
                            "POOL_FULL): take the fallback path. A PoolFull; publish and "
                            "reserve never wait for it.",
                            fy_PoolFull);
    if (add_class(module, "TooLarge", fy_TooLarge) < 0)
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
    case FERRY_RANK_IN_USE:
        return fy_RankInUse;
    case FERRY_FORKED:
        return fy_Forked;
    default:
        return fy_Error;
    }
}

/* An instance of cls (NULL: the status's class) with message, and .status set. */
static PyObject *make_error(PyObject *cls, ferry_status st, const char *message)
{
    if (!cls)
        cls = class_of(st);
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

static PyObject *raise_with(PyObject *cls, ferry_status st, const char *message, const char *cause)
{
    PyObject *exc = make_error(cls, st, *message ? message : ferry_status_str(st));
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
    return raise_with(NULL, st, ferry_last_error(), NULL);
}

PyObject *fy_raise_as(PyObject *cls, ferry_status st, const char *message)
{
    return raise_with(cls, st, message, NULL);
}

PyObject *fy_raise_pool(ferry_status st, ferry_pool *pool)
{
    if (st != FERRY_POOL_FAILED || !pool)
        return fy_raise(st);
    char message[1024], cause[1024] = "";
    snprintf(message, sizeof(message), "%s", ferry_last_error());
    ferry_pool_error(pool, cause, sizeof(cause)); /* overwrites the thread's last error */
    return raise_with(NULL, st, message, cause);
}
