/* ferry.ack: acknowledge a lease for one rank, a range of ranks, or every rank, without
 * reading it; a packed lease's part alone, or (lease=True) the whole lease through it. */
#include "ferry_py.h"

int fy_consumer_device(const ferry_descriptor *d, PyObject *device, int32_t *out)
{
    int dev = -1;
    if (d->device < 0) { /* the pool's data is in host memory */
        *out = -1;
        return 0;
    }
    if (fy_device_arg(device, d->device, &dev) < 0)
        return -1;
    *out = dev;
    return 0;
}

/* first and count of a range(first, stop) with step 1. */
int fy_range_arg(PyObject *ranks, uint32_t *first, uint32_t *count)
{
    if (!PyObject_TypeCheck(ranks, &PyRange_Type)) {
        PyErr_SetString(PyExc_TypeError, "ranks must be a range, e.g. range(2, 4)");
        return -1;
    }
    PyObject *start = PyObject_GetAttrString(ranks, "start");
    PyObject *stop = start ? PyObject_GetAttrString(ranks, "stop") : NULL;
    PyObject *step = stop ? PyObject_GetAttrString(ranks, "step") : NULL;
    long long a = start ? PyLong_AsLongLong(start) : -1, b = stop ? PyLong_AsLongLong(stop) : -1;
    long long s = step ? PyLong_AsLongLong(step) : -1;
    Py_XDECREF(start);
    Py_XDECREF(stop);
    Py_XDECREF(step);
    if (PyErr_Occurred())
        return -1;
    if (s != 1 || a < 0 || b < a || b > (long long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "ranks must be a range of ranks with step 1, got range(%lld, %lld, %lld)", a,
                     b, s);
        return -1;
    }
    *first = (uint32_t)a;
    *count = (uint32_t)(b - a);
    return 0;
}

typedef struct ack_request {
    ferry_descriptor desc;
    int32_t device;
    int mode;  /* 0: one rank, 1: range, 2: all */
    int lease; /* the whole lease through a part (ferry_consumer_ack_lease*) */
    uint32_t first, count;
} ack_request;

static ferry_status ack_call(fy_consumer *c, const ack_request *r)
{
    if (r->mode == 2)
        return (r->lease ? ferry_consumer_ack_lease_all : ferry_consumer_ack_all)(c->handle,
                                                                                  &r->desc);
    if (r->mode == 0 && c->rank == r->first)
        return (r->lease ? ferry_consumer_ack_lease : ferry_consumer_ack)(c->handle, &r->desc);
    return (r->lease ? ferry_consumer_ack_lease_range
                     : ferry_consumer_ack_range)(c->handle, &r->desc, r->first, r->count);
}

/* The acknowledgement through c (a reference the call takes over). */
static PyObject *ack_through(fy_consumer *c, const ack_request *r)
{
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ack_call(c, r);
    Py_END_ALLOW_THREADS fy_consumer_unref(c);
    if (st != FERRY_OK)
        return fy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *ack_run(const ack_request *r)
{
    fy_consumer *c = fy_consumer_any(r->desc.consumer_count, r->device, r->first);
    return c ? ack_through(c, r) : NULL;
}

PyObject *fy_ack_as(fy_consumer *consumer, PyObject *desc, PyObject *ranks, int lease)
{
    ack_request r = {.mode = 0, .lease = lease, .first = consumer->rank, .count = 1};
    if (fy_descriptor_get(desc, &r.desc) < 0)
        return NULL;
    if (ranks != Py_None) {
        r.mode = 1;
        if (fy_range_arg(ranks, &r.first, &r.count) < 0)
            return NULL;
    }
    fy_consumer_ref(consumer);
    return ack_through(consumer, &r);
}

PyObject *fy_ack(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"descriptor", "rank", "ranks", "device", "lease", NULL};
    PyObject *desc, *rank = Py_None, *ranks = Py_None, *device = Py_None;
    ack_request r = {.mode = 2, .first = 0, .count = 0};
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OOOp:ack", keywords, &desc, &rank, &ranks,
                                     &device, &r.lease) ||
        fy_descriptor_get(desc, &r.desc) < 0 || fy_consumer_device(&r.desc, device, &r.device) < 0)
        return NULL;
    if (rank != Py_None && ranks != Py_None) {
        PyErr_SetString(PyExc_ValueError, "give rank or ranks, not both");
        return NULL;
    }
    if (rank != Py_None) {
        r.mode = 0;
        r.count = 1;
        if (fy_rank_arg(rank, &r.first) < 0)
            return NULL;
    } else if (ranks != Py_None) {
        r.mode = 1;
        if (fy_range_arg(ranks, &r.first, &r.count) < 0)
            return NULL;
    }
    return ack_run(&r);
}
