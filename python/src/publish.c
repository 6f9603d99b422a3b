/* Pool.publish and Pool.publish_many: take the sources through DLPack, copy them into one
 * lease, and keep them alive until the copy ran. On host pools the copy is done when publish
 * returns; on GPU pools it is enqueued on the caller's stream, so the sources are held until
 * the stream has run it (checked at every publish, waited for at close): the lease's ready
 * word says so where the control words are in host memory (plain loads, no driver call), an
 * event recorded after the copy where they are on the device. */
#include <string.h>
#include <time.h>

#include "ferry_py.h"

struct fy_pending {
    fy_pending *next;
    ferry_descriptor desc; /* host control: the lease whose ready write follows the copy */
    void *event;           /* device control: recorded after the copy (NULL: complete) */
    fy_import *imports;
    size_t count;
};

static void release_imports(fy_import *imports, size_t count)
{
    for (size_t i = 0; i < count; i++)
        fy_import_release(&imports[i]);
    PyMem_Free(imports);
}

static void pending_free(fy_pending *p, int device)
{
    fy_cuda_event_destroy(p->event, device);
    release_imports(p->imports, p->count);
    PyMem_Free(p);
}

/* Whether the lease's copy ran; an error (none is expected for a lease of this pool) counts
 * as done rather than holding the sources forever. */
static int lease_copied(fy_pool *self, const ferry_descriptor *d)
{
    int done = 1;
    return ferry_pool_copied(self->pool, d, &done) != FERRY_OK || done;
}

static void wait_copied(fy_pool *self, const ferry_descriptor *d)
{
    struct timespec ts = {0, 20000};
    while (!lease_copied(self, d))
        nanosleep(&ts, NULL);
}

/* Called with the GIL; waits (wait) without it. */
static int pending_ran(fy_pool *self, fy_pending *p, int wait)
{
    if (!self->host_control) {
        if (wait && p->event) {
            Py_BEGIN_ALLOW_THREADS fy_cuda_event_wait(p->event, self->device);
            Py_END_ALLOW_THREADS
        }
        return wait || fy_cuda_event_done(p->event, self->device);
    }
    int done = lease_copied(self, &p->desc);
    if (!done && wait) {
        Py_BEGIN_ALLOW_THREADS wait_copied(self, &p->desc);
        Py_END_ALLOW_THREADS done = 1;
    }
    return done;
}

/* The whole list is taken off the pool while it is looked at (waits release the GIL, and
 * deleters may run Python code); entries still running are put back. */
void fy_pool_settle(fy_pool *self, int wait)
{
    fy_pending *list = self->pending, *done = NULL;
    self->pending = NULL;
    while (list) {
        fy_pending *p = list;
        list = p->next;
        fy_pending **into = pending_ran(self, p, wait) ? &done : &self->pending;
        p->next = *into;
        *into = p;
    }
    while (done) {
        fy_pending *p = done;
        done = p->next;
        pending_free(p, self->device);
    }
}

int fy_pool_traverse_pending(fy_pool *self, visitproc visit, void *arg)
{
    for (fy_pending *p = self->pending; p; p = p->next)
        for (size_t i = 0; i < p->count; i++)
            Py_VISIT(p->imports[i].owner);
    return 0;
}

/* Waits here for a stream whose copies cannot be watched otherwise. */
static void sync_stream(fy_pool *self, void *stream)
{
    fy_cuda_stream_sync(self->device, stream);
}

/* Holds the sources of a GPU publish until the stream has run their copies: d names the
 * lease (NULL when the publish failed, its copies perhaps enqueued already). */
static void defer_release(fy_pool *self, void *stream, fy_import *imports, size_t count,
                          const ferry_descriptor *d)
{
    fy_pending *p = PyMem_Calloc(1, sizeof(*p));
    int watched = p && d && self->host_control;
    if (p && d && !self->host_control) {
        if (fy_cuda_event_record(self->device, stream, &p->event) != FERRY_OK)
            p->event = NULL;
        watched = p->event != NULL;
    }
    if (!watched) {
        PyMem_Free(p);
        Py_BEGIN_ALLOW_THREADS sync_stream(self, stream);
        Py_END_ALLOW_THREADS release_imports(imports, count);
        return;
    }
    if (d)
        p->desc = *d;
    p->imports = imports;
    p->count = count;
    p->next = self->pending;
    self->pending = p;
}

typedef struct publish_call {
    fy_pool *self;
    size_t count;
    void *stream;
    uint64_t wait_ns;
    fy_import *imports;
    ferry_tensor *tensors;
    const void **srcs;
    ferry_descriptor *descs;
    uint64_t needed; /* bytes of the lease */
    int send;        /* Pool.send: ferry_pool_send to ranks (NULL: every rank) */
    const ferry_ranks *ranks;
} publish_call;

static int take_sources(publish_call *c, PyObject *const *items)
{
    int host_only = !FY_POOL_GPU(c->self);
    for (size_t i = 0; i < c->count; i++) {
        if (fy_import_take(items[i], host_only, c->stream, &c->imports[i]) < 0) {
            for (size_t j = 0; j < i; j++)
                fy_import_release(&c->imports[j]);
            return -1;
        }
        c->tensors[i] = c->imports[i].tensor;
        c->srcs[i] = c->imports[i].data;
    }
    return 0;
}

/* One attempt, waiting up to wait_ns for space. */
static ferry_status publish_once(publish_call *c, uint64_t wait_ns)
{
    ferry_status st;
    ferry_pool *pool = c->self->pool;
    int gpu = FY_POOL_GPU(c->self);
    Py_BEGIN_ALLOW_THREADS
    if (c->send)
        st = ferry_pool_send(pool, c->tensors, c->srcs, c->count, c->ranks, gpu ? c->stream : NULL,
                             wait_ns, c->descs);
    else if (gpu)
        st = ferry_pool_publish_many_async(pool, c->tensors, c->srcs, c->count, c->stream, wait_ns,
                                           c->descs);
    else
        st = ferry_pool_publish_many(pool, c->tensors, c->srcs, c->count, wait_ns, c->descs);
    Py_END_ALLOW_THREADS return st;
}

/* Bytes of the lease the tensors need, packed as ferry_pool_publish_many packs them: each
 * offset aligned to its element size. */
static uint64_t packed_bytes(const ferry_tensor *tensors, size_t count)
{
    uint64_t cursor = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t n = 0, elem = (uint64_t)tensors[i].dtype_bits * tensors[i].dtype_lanes / 8;
        uint64_t align = elem > 1 ? elem : 1;
        ferry_tensor_nbytes(&tensors[i], &n); /* checked when the sources were taken */
        cursor = (cursor + align - 1) / align * align + n;
    }
    return cursor;
}

/* The publish, waiting for space in slices (Ctrl-C or a close() meanwhile ends it:
 * *interrupted, an exception set, nothing leased). A tensor that can never fit is not waited
 * for. */
static ferry_status run_publish(publish_call *c, int *interrupted)
{
    fy_wait w;
    ferry_status st;
    fy_wait_start(&w, c->wait_ns);
    for (;;) {
        st = publish_once(c, fy_wait_slice(&w));
        if (st != FERRY_POOL_FULL || fy_pool_too_large(c->self, st, c->needed))
            return st;
        int more = fy_pool_wait_next(c->self, &w);
        if (more <= 0) {
            *interrupted = more < 0;
            return st;
        }
    }
}

static PyObject *descriptors(const publish_call *c, int single)
{
    if (single)
        return fy_descriptor_new(&c->descs[0]);
    PyObject *list = PyList_New((Py_ssize_t)c->count);
    for (size_t i = 0; list && i < c->count; i++) {
        PyObject *d = fy_descriptor_new(&c->descs[i]);
        if (!d)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    return list;
}

static int alloc_call(publish_call *c)
{
    c->imports = PyMem_Calloc(c->count, sizeof(*c->imports));
    c->tensors = PyMem_Calloc(c->count, sizeof(*c->tensors));
    c->srcs = PyMem_Calloc(c->count, sizeof(*c->srcs));
    c->descs = PyMem_Calloc(c->count, sizeof(*c->descs));
    if (c->imports && c->tensors && c->srcs && c->descs)
        return 0;
    PyErr_NoMemory();
    return -1;
}

static void free_call(publish_call *c)
{
    PyMem_Free(c->imports);
    PyMem_Free(c->tensors);
    PyMem_Free(c->srcs);
    PyMem_Free(c->descs);
}

/* Publishes items; imports pass to the pending list (GPU) or are released here. */
static PyObject *publish_items(publish_call *c, PyObject *const *items, int single)
{
    PyObject *result = NULL;
    int interrupted = 0;
    if (alloc_call(c) < 0 || take_sources(c, items) < 0) {
        free_call(c);
        return NULL;
    }
    c->needed = packed_bytes(c->tensors, c->count);
    ferry_status st = run_publish(c, &interrupted);
    if (FY_POOL_GPU(c->self))
        defer_release(c->self, c->stream, c->imports, c->count,
                      st == FERRY_OK ? &c->descs[0] : NULL);
    else
        release_imports(c->imports, c->count);
    c->imports = NULL;
    if (!interrupted)
        result = st == FERRY_OK ? descriptors(c, single) : fy_pool_failure(c->self, st, c->needed);
    free_call(c);
    return result;
}

static int prepare(publish_call *c, fy_pool *self, PyObject *stream, PyObject *timeout)
{
    memset(c, 0, sizeof(*c));
    c->self = self;
    if (fy_pool_check(self) < 0 || fy_pool_wait_ns(self, timeout, &c->wait_ns) < 0)
        return -1;
    if (!FY_POOL_GPU(self))
        return 0; /* host pools copy on the CPU: a stream has no meaning there */
    fy_pool_settle(self, 0);
    return fy_stream_arg(stream, &c->stream);
}

/* Whether x is a numpy array of an ml_dtypes dtype (float8_*, bfloat16, ...), which numpy
 * cannot export through DLPack: asked of the package (ferry._ml_dtypes_array) once numpy has
 * refused it, so that other publishes pay nothing. */
static int ml_dtypes_array(PyObject *x)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* the publish's, kept unless this says yes */
    PyObject *ferry = PyImport_ImportModule("ferry");
    PyObject *check = ferry ? PyObject_GetAttrString(ferry, "_ml_dtypes_array") : NULL;
    PyObject *answer = check ? PyObject_CallOneArg(check, x) : NULL;
    int yes = answer ? PyObject_IsTrue(answer) > 0 : 0;
    Py_XDECREF(ferry);
    Py_XDECREF(check);
    Py_XDECREF(answer);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return yes;
}

PyObject *fy_pool_publish(fy_pool *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static fy_keywords kw = {
        .fn = "publish", .positional = 3, .names = {"x", "stream", "timeout", NULL}};
    PyObject *v[3] = {NULL};
    publish_call c;
    if (fy_kwargs(&kw, args, nargs, kwnames, v) < 0)
        return NULL;
    if (!v[0]) {
        PyErr_SetString(PyExc_TypeError, "publish() missing its required argument 'x'");
        return NULL;
    }
    PyObject *x = v[0], *timeout = v[2] ? v[2] : Py_None;
    if (prepare(&c, self, v[1] ? v[1] : Py_None, timeout) < 0)
        return NULL;
    c.count = 1;
    fy_log_hold hold;
    fy_log_hold_begin(&hold);
    PyObject *result = publish_items(&c, &x, 1);
    int full = !result && PyErr_ExceptionMatches(fy_PoolFull);
    fy_log_hold_end(&hold, full);
    if (!result && !full && ml_dtypes_array(x)) {
        PyErr_Clear(); /* numpy refused the export: the bytes go through a reservation */
        result = PyObject_CallMethod((PyObject *)self, "_publish_bytes", "OO", x, timeout);
    }
    return result;
}

PyObject *fy_pool_publish_many(fy_pool *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"xs", "stream", "timeout", NULL};
    PyObject *xs, *stream = Py_None, *timeout = Py_None;
    publish_call c;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:publish_many", keywords, &xs, &stream,
                                     &timeout) ||
        prepare(&c, self, stream, timeout) < 0)
        return NULL;
    /* A tuple of its own: __dlpack__ runs Python code, which may change a list given here. */
    PyObject *seq = fy_tuple_arg(xs, "publish_many takes a sequence of tensors");
    if (!seq)
        return NULL;
    c.count = (size_t)PyTuple_GET_SIZE(seq);
    PyObject *result = NULL;
    if (c.count == 0)
        PyErr_SetString(PyExc_ValueError, "publish_many needs at least one tensor");
    else {
        fy_log_hold hold;
        fy_log_hold_begin(&hold);
        result = publish_items(&c, &PyTuple_GET_ITEM(seq, 0), 0);
        fy_log_hold_end(&hold, !result && PyErr_ExceptionMatches(fy_PoolFull));
    }
    Py_DECREF(seq);
    return result;
}

/* ranks= of Pool.send: None (every rank), an int, a range (first and count) or a sequence of
 * ints. *list gets the ints (PyMem, the caller frees it). 0, or -1 with an exception. */
static int ranks_arg(PyObject *obj, ferry_ranks *ranks, uint32_t **list)
{
    *list = NULL;
    memset(ranks, 0, sizeof(*ranks));
    if (PyObject_TypeCheck(obj, &PyRange_Type))
        return fy_range_arg(obj, &ranks->first, &ranks->count);
    if (PyLong_Check(obj) && !PyBool_Check(obj)) {
        if (!(*list = PyMem_Malloc(sizeof(**list))))
            return PyErr_NoMemory(), -1;
        ranks->count = 1;
        ranks->list = *list;
        return fy_rank_arg(obj, *list);
    }
    if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "ranks must be None (every rank), an int, a range or a list of ints, not "
                     "%.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *seq = fy_tuple_arg(obj, "ranks must be a list of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    *list = PyMem_Calloc(n ? (size_t)n : 1, sizeof(**list));
    int rc = *list ? 0 : (PyErr_NoMemory(), -1);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (PyBool_Check(item) || !PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "ranks must be ints, got %.100s",
                         Py_TYPE(item)->tp_name);
            rc = -1;
        } else {
            rc = fy_rank_arg(item, &(*list)[i]);
        }
    }
    Py_DECREF(seq);
    ranks->list = *list;
    ranks->count = (uint32_t)n;
    return rc;
}

PyObject *fy_pool_send(fy_pool *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static fy_keywords kw = {
        .fn = "send", .positional = 4, .names = {"x", "ranks", "stream", "timeout", NULL}};
    PyObject *v[4] = {NULL};
    publish_call c;
    ferry_ranks ranks;
    uint32_t *list = NULL;
    if (fy_kwargs(&kw, args, nargs, kwnames, v) < 0)
        return NULL;
    if (!v[0]) {
        PyErr_SetString(PyExc_TypeError, "send() missing its required argument 'x'");
        return NULL;
    }
    PyObject *x = v[0], *ranks_obj = v[1] ? v[1] : Py_None;
    if (prepare(&c, self, v[2] ? v[2] : Py_None, v[3] ? v[3] : Py_None) < 0)
        return NULL;
    if (ranks_obj != Py_None && ranks_arg(ranks_obj, &ranks, &list) < 0) {
        PyMem_Free(list);
        return NULL;
    }
    c.send = 1;
    c.ranks = ranks_obj == Py_None ? NULL : &ranks;
    /* One tensor, or a list or tuple of them (one lease, packed; a tuple of its own: __dlpack__
     * runs Python code, which may change a list given here). */
    int single = !PyList_Check(x) && !PyTuple_Check(x);
    PyObject *seq = single ? PyTuple_Pack(1, x) : fy_tuple_arg(x, "send takes a tensor or a list");
    PyObject *result = NULL;
    if (seq && PyTuple_GET_SIZE(seq) == 0)
        PyErr_SetString(PyExc_ValueError, "send needs at least one tensor");
    else if (seq) {
        c.count = (size_t)PyTuple_GET_SIZE(seq);
        fy_log_hold hold;
        fy_log_hold_begin(&hold);
        result = publish_items(&c, &PyTuple_GET_ITEM(seq, 0), single);
        fy_log_hold_end(&hold, !result && PyErr_ExceptionMatches(fy_PoolFull));
    }
    Py_XDECREF(seq);
    PyMem_Free(list);
    return result;
}
