/* ferry.Pool: create and close a pool, its statistics, cancel and describe. Publishing is in
 * publish.c, reserving in reservation.c. */
#include <stddef.h>
#include <string.h>

#include "ferry_py.h"

static int parse_choice(const char *what, const char *value, const char *const *names, int *out)
{
    for (int i = 0; names[i]; i++) {
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    PyObject *expected = PyUnicode_FromString(names[0]);
    for (int i = 1; expected && names[i]; i++)
        Py_SETREF(expected, PyUnicode_FromFormat("%U, %s", expected, names[i]));
    if (expected)
        PyErr_Format(PyExc_ValueError, "unknown %s \"%s\" (expected %U)", what, value, expected);
    Py_XDECREF(expected);
    return -1;
}

typedef struct pool_args {
    ferry_pool_config config;
    const char *backend, *control, *on_full, *vmm_handle;
    PyObject *timeout;
} pool_args;

static int parse_pool_args(PyObject *args, PyObject *kwargs, pool_args *a)
{
    static char *keywords[] = {"size",         "consumers",           "backend", "device",
                               "max_inflight", "reclaim_interval_us", "control", "on_full",
                               "timeout",      "vmm_handle",          NULL};
    static const char *const controls[] = {"host", "device", NULL};
    static const char *const handles[] = {"auto", "fabric", "posix_fd", NULL};
    ferry_pool_config init = FERRY_POOL_CONFIG_INIT;
    a->config = init;
    a->backend = "auto";
    a->control = "host";
    a->on_full = "raise";
    a->vmm_handle = "auto";
    a->timeout = Py_None;
    long long size, consumers, inflight = 4096, interval = 1000;
    int device = 0, control = 0, handle = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LL|$siLLssOs:Pool", keywords, &size, &consumers,
                                     &a->backend, &device, &inflight, &interval, &a->control,
                                     &a->on_full, &a->timeout, &a->vmm_handle))
        return -1;
    ferry_backend backend;
    ferry_status st = ferry_backend_parse(a->backend, &backend);
    if (st != FERRY_OK) {
        fy_raise(st);
        return -1;
    }
    if (parse_choice("control placement", a->control, controls, &control) < 0 ||
        parse_choice("vmm_handle", a->vmm_handle, handles, &handle) < 0)
        return -1;
    a->config.backend = backend;
    a->config.memory_size = size;
    a->config.consumer_count = consumers;
    a->config.max_inflight_slices = inflight;
    a->config.reclaim_interval_us = interval;
    a->config.device = device;
    a->config.control_placement = control ? FERRY_CONTROL_DEVICE : FERRY_CONTROL_HOST;
    a->config.vmm_handle = handle;
    return 0;
}

/* Learns the backend and device that the pool resolved to. */
static int resolve(fy_pool *self)
{
    ferry_descriptor d;
    ferry_status st = ferry_pool_describe(self->pool, &d);
    if (st != FERRY_OK) {
        fy_raise(st);
        return -1;
    }
    self->backend = d.backend;
    self->device = d.backend == FERRY_BACKEND_HOST ? -1 : d.device;
    self->host_control = !(d.flags & FERRY_DESC_FLAG_DEVICE_CONTROL);
    return 0;
}

static int pool_init(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static const char *const policies[] = {"raise", "none", "wait", NULL};
    fy_pool *self = (fy_pool *)obj;
    pool_args a;
    if (self->pool) {
        PyErr_SetString(PyExc_RuntimeError, "Pool.__init__ called twice");
        return -1;
    }
    if (parse_pool_args(args, kwargs, &a) < 0 ||
        parse_choice("on_full policy", a.on_full, policies, &self->on_full) < 0 ||
        fy_timeout_arg(a.timeout, FY_DEFAULT_WAIT_NS, &self->wait_ns) < 0)
        return -1;
    ferry_status st;
    fy_cuda_scope scope;
    int gpu =
        a.config.backend == FERRY_BACKEND_CUDA_IPC || a.config.backend == FERRY_BACKEND_CUDA_VMM;
    Py_BEGIN_ALLOW_THREADS fy_cuda_enter(&scope, FY_CUDA_FOR(gpu));
    st = ferry_pool_create(&a.config, &self->pool);
    fy_cuda_leave(&scope);
    Py_END_ALLOW_THREADS if (st != FERRY_OK)
    {
        self->pool = NULL;
        fy_raise(st);
        return -1;
    }
    return resolve(self);
}

static void close_pool(fy_pool *self)
{
    fy_pool_settle(self, 1);
    if (self->closed || !self->pool)
        return;
    self->closed = 1;
    fy_cuda_scope scope;
    Py_BEGIN_ALLOW_THREADS fy_cuda_enter(&scope, FY_CUDA_FOR(self->backend != FERRY_BACKEND_HOST));
    ferry_pool_close(self->pool);
    fy_cuda_leave(&scope);
    Py_END_ALLOW_THREADS
}

static void pool_dealloc(PyObject *obj)
{
    fy_pool *self = (fy_pool *)obj;
    if (self->pool) {
        close_pool(self);
        ferry_pool_destroy(self->pool);
        self->pool = NULL;
    }
    Py_TYPE(obj)->tp_free(obj);
}

/* Methods other than close need a created pool (a subclass may skip __init__). */
static int need_pool(fy_pool *self)
{
    if (self->pool)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the Pool was not initialised");
    return -1;
}

static PyObject *pool_close(PyObject *obj, PyObject *unused)
{
    (void)unused;
    close_pool((fy_pool *)obj);
    Py_RETURN_NONE;
}

static PyObject *pool_enter(PyObject *obj, PyObject *unused)
{
    (void)unused;
    if (need_pool((fy_pool *)obj) < 0)
        return NULL;
    return Py_NewRef(obj);
}

static PyObject *pool_exit(PyObject *obj, PyObject *args)
{
    (void)args;
    close_pool((fy_pool *)obj);
    Py_RETURN_FALSE;
}

int fy_pool_wait_ns(fy_pool *self, PyObject *timeout, uint64_t *ns)
{
    return fy_timeout_arg(timeout, self->on_full == FY_FULL_WAIT ? self->wait_ns : FERRY_NO_WAIT,
                          ns);
}

PyObject *fy_pool_failure(fy_pool *self, ferry_status st)
{
    if (st == FERRY_POOL_FULL && self->on_full == FY_FULL_NONE)
        Py_RETURN_NONE;
    return fy_raise_pool(st, self->pool);
}

/* ---- statistics ---------------------------------------------------------------------- */

/* Every uint64_t field of ferry_pool_stats, by name. */
#define FY_STAT_(field)                                                                            \
    {                                                                                              \
#field, offsetof(ferry_pool_stats, field)                                                  \
    }
static const struct stat_field {
    const char *name;
    size_t offset;
} stat_fields[] = {
    FY_STAT_(capacity),          FY_STAT_(usable_bytes),       FY_STAT_(bytes_in_use),
    FY_STAT_(largest_free),      FY_STAT_(leases_in_flight),   FY_STAT_(high_water_bytes),
    FY_STAT_(high_water_leases), FY_STAT_(publishes),          FY_STAT_(pool_full_events),
    FY_STAT_(reclaimed),         FY_STAT_(cancelled),          FY_STAT_(acked_for_dead),
    FY_STAT_(broker_refused),    FY_STAT_(consumers_attached), FY_STAT_(consumers_alive),
};
#undef FY_STAT_

static PyObject *stats_dict(const ferry_pool_stats *s)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
        uint64_t value;
        memcpy(&value, (const char *)s + stat_fields[i].offset, sizeof(value));
        PyObject *v = PyLong_FromUnsignedLongLong(value);
        if (!v || PyDict_SetItemString(d, stat_fields[i].name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *pool_stats(PyObject *obj, PyObject *unused)
{
    fy_pool *self = (fy_pool *)obj;
    (void)unused;
    if (need_pool(self) < 0)
        return NULL;
    ferry_pool_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    s.version = FERRY_POOL_STATS_VERSION;
    ferry_status st = ferry_pool_stats_get(self->pool, &s);
    if (st != FERRY_OK)
        return fy_raise_pool(st, self->pool);
    return stats_dict(&s);
}

static PyObject *pool_consumer_info(PyObject *obj, PyObject *rank_obj)
{
    fy_pool *self = (fy_pool *)obj;
    uint32_t rank;
    if (need_pool(self) < 0 || fy_rank_arg(rank_obj, &rank) < 0)
        return NULL;
    ferry_consumer_info info;
    ferry_status st = ferry_pool_consumer_info(self->pool, rank, &info);
    if (st != FERRY_OK)
        return fy_raise_pool(st, self->pool);
    return Py_BuildValue("{s:O,s:O,s:L,s:K,s:K}", "attached", info.attached ? Py_True : Py_False,
                         "alive", info.alive ? Py_True : Py_False, "pid", (long long)info.pid,
                         "outstanding", (unsigned long long)info.outstanding, "oldest_age_ns",
                         (unsigned long long)info.oldest_age_ns);
}

/* ---- leases -------------------------------------------------------------------------- */

static PyObject *pool_cancel(PyObject *obj, PyObject *desc_obj)
{
    fy_pool *self = (fy_pool *)obj;
    ferry_descriptor d;
    if (need_pool(self) < 0 || fy_descriptor_get(desc_obj, &d) < 0)
        return NULL;
    ferry_status st;
    fy_cuda_scope scope;
    fy_cuda_enter(&scope, FY_CUDA_FOR(self->backend != FERRY_BACKEND_HOST));
    st = ferry_pool_cancel(self->pool, &d);
    fy_cuda_leave(&scope);
    if (st != FERRY_OK)
        return fy_raise_pool(st, self->pool);
    Py_RETURN_NONE;
}

static PyObject *pool_describe(PyObject *obj, PyObject *unused)
{
    fy_pool *self = (fy_pool *)obj;
    (void)unused;
    if (need_pool(self) < 0)
        return NULL;
    ferry_descriptor d;
    ferry_status st = ferry_pool_describe(self->pool, &d);
    if (st != FERRY_OK)
        return fy_raise_pool(st, self->pool);
    return fy_descriptor_new(&d);
}

static PyObject *pool_error(PyObject *obj, PyObject *unused)
{
    fy_pool *self = (fy_pool *)obj;
    (void)unused;
    if (need_pool(self) < 0)
        return NULL;
    char cause[1024] = "";
    if (ferry_pool_error(self->pool, cause, sizeof(cause)) == FERRY_OK)
        Py_RETURN_NONE;
    return PyUnicode_FromString(cause);
}

static PyObject *pool_reclaim(PyObject *obj, PyObject *unused)
{
    fy_pool *self = (fy_pool *)obj;
    (void)unused;
    if (need_pool(self) < 0)
        return NULL;
    uint64_t n = 0;
    ferry_status st;
    fy_cuda_scope scope;
    Py_BEGIN_ALLOW_THREADS fy_cuda_enter(&scope, FY_CUDA_FOR(self->backend != FERRY_BACKEND_HOST));
    st = ferry_pool_reclaim(self->pool, &n);
    fy_cuda_leave(&scope);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_raise_pool(st, self->pool);
    return PyLong_FromUnsignedLongLong(n);
}

/* ---- properties ---------------------------------------------------------------------- */

static PyObject *get_backend(PyObject *obj, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(ferry_backend_name((ferry_backend)((fy_pool *)obj)->backend));
}

static PyObject *get_device(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromLong(((fy_pool *)obj)->device);
}

static PyObject *get_closed(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((fy_pool *)obj)->closed || !((fy_pool *)obj)->pool);
}

static PyObject *get_on_full(PyObject *obj, void *closure)
{
    static const char *const policies[] = {"raise", "none", "wait"};
    (void)closure;
    return PyUnicode_FromString(policies[((fy_pool *)obj)->on_full]);
}

static PyGetSetDef pool_getset[] = {
    {"backend", get_backend, NULL, "The backend the pool uses ('host', 'cuda_ipc', 'cuda_vmm').",
     NULL},
    {"device", get_device, NULL, "The pool's GPU ordinal; -1 for host pools.", NULL},
    {"closed", get_closed, NULL, "True once close() ran.", NULL},
    {"on_full", get_on_full, NULL, "What publish does when the pool is full.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define METH_KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS

static PyMethodDef pool_methods[] = {
    {"publish", METH_KW(fy_pool_publish),
     "publish(x, stream=None, timeout=None) -> Descriptor | None\n\n"
     "Copies x (any object with __dlpack__: numpy arrays, torch and cupy tensors; "
     "C-contiguous) into a new lease and returns its Descriptor. GPU pools copy on stream "
     "(None: the legacy default stream; an int handle or a torch/cupy stream) without host "
     "synchronisation; the source is kept alive until the copy ran. timeout (seconds) bounds "
     "the wait for space (default: 0, or the pool's timeout under on_full='wait'); a full pool "
     "then raises PoolFull, or returns None under on_full='none'."},
    {"publish_many", METH_KW(fy_pool_publish_many),
     "publish_many(xs, stream=None, timeout=None) -> list[Descriptor] | None\n\n"
     "Publishes several tensors of one request into one lease: consumers acknowledge it once "
     "(ferry.receive_many), the producer cancels it once."},
    {"reserve", METH_KW(fy_pool_reserve),
     "reserve(shape, dtype, timeout=None) -> Reservation | None\n\n"
     "Leases a writable slice for one tensor without publishing it (zero-copy publish): write "
     "through the Reservation's __dlpack__ (or its buffer on host pools), then commit()."},
    {"cancel", pool_cancel, METH_O,
     "cancel(descriptor)\n\nCancels a lease never dispatched: its slice is freed and consumers "
     "refuse its descriptor (Stale)."},
    {"stats", pool_stats, METH_NOARGS,
     "stats() -> dict\n\nEvery field of ferry_pool_stats: capacity, usable_bytes, bytes_in_use, "
     "largest_free, leases_in_flight, high_water_bytes, high_water_leases, publishes, "
     "pool_full_events, reclaimed, cancelled, acked_for_dead, broker_refused, "
     "consumers_attached, consumers_alive."},
    {"consumer_info", pool_consumer_info, METH_O,
     "consumer_info(rank) -> dict\n\nattached, alive, pid, outstanding (leases not "
     "acknowledged) and oldest_age_ns of one rank."},
    {"describe", pool_describe, METH_NOARGS,
     "describe() -> Descriptor\n\nA descriptor of the pool only (no lease), to open the pool "
     "before the first tensor."},
    {"error", pool_error, METH_NOARGS,
     "error() -> str | None\n\nNone while the pool is healthy, else the first cause of its "
     "failure."},
    {"reclaim", pool_reclaim, METH_NOARGS,
     "reclaim() -> int\n\nFrees every acknowledged lease now (the background reclaimer does it "
     "too) and returns how many."},
    {"close", pool_close, METH_NOARGS,
     "close()\n\nShuts the pool down: refuses new publishers, waits for active ones, releases "
     "the memory. Waiting consumers see ProducerGone. Closing twice is harmless."},
    {"__enter__", pool_enter, METH_NOARGS, NULL},
    {"__exit__", pool_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Pool",
    .tp_basicsize = sizeof(fy_pool),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Pool(size, consumers, *, backend='auto', device=0, max_inflight=4096, "
              "reclaim_interval_us=1000, control='host', on_full='raise', timeout=None, "
              "vmm_handle='auto')\n--\n\n"
              "A producer's pool of size bytes read by consumers ranks.",
    .tp_new = PyType_GenericNew,
    .tp_init = pool_init,
    .tp_dealloc = pool_dealloc,
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};
