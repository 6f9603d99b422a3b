/* ferry.Pool: create and close a pool, its statistics, cancel and describe. Publishing is in
 * publish.c, reserving in reservation.c. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

/* ---- the library's pool, shared with the exports of its memory ------------------------ */

struct fy_pool_core {
    long refs;        /* atomic: the Pool's, and one per reservation */
    long exports;     /* atomic: live exports of the pool's memory */
    int close_wanted; /* atomic: Pool.close() ran */
    int shut;         /* atomic: ferry_pool_close was called */
    ferry_pool *pool;
};

static fy_pool_core *core_new(ferry_pool *pool)
{
    fy_pool_core *core = calloc(1, sizeof(*core));
    if (!core)
        return NULL;
    core->refs = 1;
    core->pool = pool;
    return core;
}

/* ferry_pool_close, once. The thread's CUDA context is kept (GPU pools set their own). */
static void core_shut(fy_pool_core *core)
{
    int open = 0;
    if (!__atomic_compare_exchange_n(&core->shut, &open, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return;
    ferry_pool_close(core->pool);
}

/* Pool.close(): the library's close now, or by the last export. Both sides store, then load
 * (sequentially consistent): at least one of them sees the other's store. */
static void core_close(fy_pool_core *core)
{
    __atomic_store_n(&core->close_wanted, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&core->exports, __ATOMIC_SEQ_CST) == 0)
        core_shut(core);
}

static int core_is_shut(fy_pool_core *core)
{
    return __atomic_load_n(&core->shut, __ATOMIC_SEQ_CST);
}

void fy_core_ref(fy_pool_core *core)
{
    __atomic_add_fetch(&core->refs, 1, __ATOMIC_RELAXED);
}

void fy_core_unref(fy_pool_core *core)
{
    if (!core || __atomic_sub_fetch(&core->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    ferry_pool_destroy(core->pool); /* closes it first if nobody did */
    free(core);
}

void fy_core_export_begin(fy_pool_core *core)
{
    __atomic_add_fetch(&core->exports, 1, __ATOMIC_SEQ_CST);
}

void fy_core_export_end(fy_pool_core *core)
{
    if (__atomic_sub_fetch(&core->exports, 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&core->close_wanted, __ATOMIC_SEQ_CST))
        core_shut(core);
}

void fy_core_cancel(fy_pool_core *core, const ferry_descriptor *d)
{
    if (core_is_shut(core))
        return;
    ferry_pool_cancel(core->pool, d);
}

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
    const char *backend, *control, *on_full, *vmm_handle, *listen;
    PyObject *timeout, *drain_timeout, *remote_timeout;
} pool_args;

static int parse_pool_args(PyObject *args, PyObject *kwargs, pool_args *a)
{
    static char *keywords[] = {"size",       "consumers",      "backend",
                               "device",     "max_inflight",   "reclaim_interval_us",
                               "control",    "on_full",        "timeout",
                               "vmm_handle", "channel_depth",  "drain_timeout",
                               "listen",     "remote_timeout", NULL};
    static const char *const controls[] = {"host", "device", NULL};
    static const char *const handles[] = {"auto", "fabric", "posix_fd", NULL};
    ferry_pool_config init = FERRY_POOL_CONFIG_INIT;
    a->config = init;
    a->backend = "auto";
    a->control = "host";
    a->on_full = "raise";
    a->vmm_handle = "auto";
    a->timeout = Py_None;
    a->drain_timeout = Py_None;
    a->listen = NULL;
    a->remote_timeout = Py_None;
    long long size, consumers, inflight = 4096, interval = 1000, depth = init.channel_depth;
    int device = init.device, control = 0, handle = 0; /* no device named: where AUTO says */
    uint64_t remote_ns = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LL|$siLLssOsLOzO:Pool", keywords, &size,
                                     &consumers, &a->backend, &device, &inflight, &interval,
                                     &a->control, &a->on_full, &a->timeout, &a->vmm_handle, &depth,
                                     &a->drain_timeout, &a->listen, &a->remote_timeout) ||
        fy_timeout_arg(a->remote_timeout, init.remote_timeout_us * 1000ull, &remote_ns) < 0)
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
    /* Config version 2. close() drains itself, in slices (Ctrl-C ends the wait): the
     * library's own drain at close (drain_timeout_us) would wait without handling signals,
     * and wait again after a drain that timed out or was interrupted. */
    a->config.version = FERRY_POOL_CONFIG_VERSION;
    a->config.channel_depth = depth;
    a->config.drain_timeout_us = 0;
    a->config.listen = a->listen; /* the argument's string: create does not keep it */
    a->config.remote_timeout_us = (int64_t)(remote_ns / 1000ull);
    return 0;
}

static ferry_status stats_of(ferry_pool *pool, ferry_pool_stats *s)
{
    memset(s, 0, sizeof(*s));
    s->struct_size = sizeof(*s);
    s->version = FERRY_POOL_STATS_VERSION;
    return ferry_pool_stats_get(pool, s);
}

/* Learns the backend and device that the pool resolved to, and its bytes for data. */
static int resolve(fy_pool *self, ferry_pool *pool)
{
    ferry_descriptor d;
    ferry_pool_stats s;
    ferry_status st = ferry_pool_describe(pool, &d);
    if (st == FERRY_OK)
        st = stats_of(pool, &s);
    if (st != FERRY_OK) {
        fy_raise(st);
        return -1;
    }
    self->backend = d.backend;
    self->device = d.device; /* -1 for host memory */
    self->host_control = !(d.flags & FERRY_DESC_FLAG_DEVICE_CONTROL);
    self->usable = s.usable_bytes;
    st = ferry_pool_address(pool, self->address, sizeof(self->address));
    if (st == FERRY_OK && ferry_pool_remote_address(pool, self->remote_address,
                                                    sizeof(self->remote_address)) != FERRY_OK)
        self->remote_address[0] = '\0'; /* a pool without listen= has none */
    if (st != FERRY_OK) {
        fy_raise(st);
        return -1;
    }
    return 0;
}

static void destroy_unshared(ferry_pool *pool)
{
    Py_BEGIN_ALLOW_THREADS ferry_pool_destroy(pool);
    Py_END_ALLOW_THREADS
}

static int pool_init(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static const char *const policies[] = {"raise", "none", "wait", NULL};
    fy_pool *self = (fy_pool *)obj;
    pool_args a;
    ferry_pool *pool = NULL;
    if (self->pool) {
        PyErr_SetString(PyExc_RuntimeError, "Pool.__init__ called twice");
        return -1;
    }
    if (parse_pool_args(args, kwargs, &a) < 0 ||
        parse_choice("on_full policy", a.on_full, policies, &self->on_full) < 0 ||
        fy_timeout_arg(a.timeout, FY_DEFAULT_WAIT_NS, &self->wait_ns) < 0 ||
        fy_timeout_arg(a.drain_timeout, 0, &self->drain_ns) < 0)
        return -1;
    self->channel_depth = a.config.channel_depth;
    self->drain_set = a.drain_timeout != Py_None;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_pool_create(&a.config, &pool);
    Py_END_ALLOW_THREADS if (st != FERRY_OK)
    {
        fy_raise(st);
        return -1;
    }
    fy_pool_core *core = resolve(self, pool) < 0 ? NULL : core_new(pool);
    if (!core) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        destroy_unshared(pool);
        return -1;
    }
    self->core = core;
    self->pool = pool;
    return 0;
}

/* Closes the pool for this object's callers at once; the library's close runs now, or when
 * the last export of the pool's memory goes. */
static void close_pool(fy_pool *self)
{
    fy_pool_settle(self, 1);
    if (self->closed || !self->core)
        return;
    self->closed = 1;
    Py_BEGIN_ALLOW_THREADS core_close(self->core);
    Py_END_ALLOW_THREADS
}

/* Runs when the Pool is collected, before the garbage collector clears anything: the
 * library's close waits for publishers and GPU copies, which needs the sources still held. */
static void pool_finalize(PyObject *obj)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    fy_pool *self = (fy_pool *)obj;
    if (self->drain_ns && self->pool && !self->closed) { /* no signals here: one wait */
        Py_BEGIN_ALLOW_THREADS ferry_pool_drain(self->pool, self->drain_ns);
        Py_END_ALLOW_THREADS
    }
    close_pool(self);
    PyErr_Restore(type, value, traceback);
}

static int pool_traverse(PyObject *obj, visitproc visit, void *arg)
{
    return fy_pool_traverse_pending((fy_pool *)obj, visit, arg);
}

static int pool_clear(PyObject *obj)
{
    fy_pool_settle((fy_pool *)obj, 1); /* empty already once finalized */
    return 0;
}

static void pool_dealloc(PyObject *obj)
{
    fy_pool *self = (fy_pool *)obj;
    if (PyObject_CallFinalizerFromDealloc(obj) < 0)
        return; /* resurrected */
    PyObject_GC_UnTrack(obj);
    pool_clear(obj);
    if (self->core) {
        fy_pool_core *core = self->core;
        self->core = NULL;
        self->pool = NULL;
        Py_BEGIN_ALLOW_THREADS fy_core_unref(core);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(obj)->tp_free(obj);
}

/* The library's name of the pool in its messages ("host pool is closing"), by backend. */
static const char *pool_name(const fy_pool *self)
{
    static const char *const names[] = {"host", "host", "CUDA IPC", "CUDA VMM multimodal"};
    size_t b = (size_t)self->backend;
    return b < sizeof(names) / sizeof(names[0]) ? names[b] : "host";
}

int fy_pool_check(fy_pool *self)
{
    if (!self->pool) { /* a subclass may skip __init__ */
        PyErr_SetString(PyExc_RuntimeError, "the Pool was not initialised");
        return -1;
    }
    if (!self->closed || core_is_shut(self->core))
        return 0; /* the library answers CLOSING itself once closed */
    char message[128];
    snprintf(message, sizeof(message), "%s pool is closing", pool_name(self));
    fy_raise_as(NULL, FERRY_CLOSING, message);
    return -1;
}

/* Default drain of a with block that ends normally, when the pool has no drain_timeout. */
#define FY_EXIT_DRAIN_NS 10000000000ull

/* The library's drain message names the wait it was given: *text gets it for the whole wait
 * of ns (a sliced drain gave the library one slice). */
static void drain_message(char *text, size_t size, const char *message, uint64_t ns)
{
    const char *within = strstr(message, "within "), *ms = within ? strstr(within, " ms") : NULL;
    if (!ms) {
        snprintf(text, size, "%s", message);
        return;
    }
    snprintf(text, size, "%.*swithin %.3f%s", (int)(within - message), message, (double)ns / 1e6,
             ms);
}

static ferry_status drain_slice(void *pool, uint64_t slice_ns)
{
    return ferry_pool_drain(pool, slice_ns);
}

/* ferry_pool_drain for up to ns, in slices: 0 with *status (and the exception's message in
 * text for TIMEOUT), or -1 with the exception of a signal handler (KeyboardInterrupt). */
static int drain_sliced(fy_pool *self, uint64_t ns, ferry_status *status, char *text, size_t size)
{
    fy_wait w;
    fy_wait_start(&w, ns);
    if (fy_wait_call(&w, drain_slice, self->pool, status) < 0)
        return -1;
    if (*status == FERRY_TIMEOUT)
        drain_message(text, size, ferry_last_error(), ns);
    return 0;
}

static PyObject *pool_drain(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"timeout", NULL};
    fy_pool *self = (fy_pool *)obj;
    PyObject *timeout = Py_None;
    uint64_t ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:drain", keywords, &timeout) ||
        fy_pool_check(self) < 0 ||
        fy_timeout_arg(timeout, self->drain_ns ? self->drain_ns : FY_DEFAULT_WAIT_NS, &ns) < 0)
        return NULL;
    ferry_status st;
    char text[1024];
    if (drain_sliced(self, ns, &st, text, sizeof(text)) < 0)
        return NULL;
    if (st == FERRY_TIMEOUT)
        return fy_raise_as(NULL, st, text);
    if (st != FERRY_OK)
        return fy_raise_pool(st, self->pool);
    Py_RETURN_NONE;
}

/* Logs a warning through logging.getLogger("ferry"); errors are dropped. */
static void log_warning(const char *text)
{
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "ferry") : NULL;
    PyObject *r = logger ? PyObject_CallMethod(logger, "warning", "s", text) : NULL;
    if (!r)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_XDECREF(logger);
    Py_XDECREF(logging);
}

/* close(drain=...): drains up to ns first (0: not at all), then closes. A drain that times out
 * is logged and the pool closed anyway; Ctrl-C during it closes at once and raises. */
static PyObject *close_draining(fy_pool *self, uint64_t ns)
{
    if (ns && self->pool && !self->closed) {
        ferry_status st;
        char text[1024];
        if (drain_sliced(self, ns, &st, text, sizeof(text)) < 0) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            close_pool(self);
            PyErr_Restore(type, value, traceback);
            return NULL;
        }
        if (st == FERRY_TIMEOUT) {
            char line[1100];
            snprintf(line, sizeof(line), "%s; closing anyway", text);
            log_warning(line);
        }
    }
    close_pool(self);
    Py_RETURN_NONE;
}

/* drain= of close: None (the pool's drain_timeout, else none), False, True (the pool's
 * drain_timeout if one was given, 0 included, else dflt) or seconds. */
static int drain_arg(fy_pool *self, PyObject *drain, uint64_t dflt, uint64_t *ns)
{
    if (drain == NULL || drain == Py_None) {
        *ns = self->drain_ns;
        return 0;
    }
    if (PyBool_Check(drain)) {
        *ns = drain == Py_False ? 0 : self->drain_set ? self->drain_ns : dflt;
        return 0;
    }
    return fy_timeout_arg(drain, 0, ns);
}

static PyObject *pool_close(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"drain", NULL};
    fy_pool *self = (fy_pool *)obj;
    PyObject *drain = Py_None;
    uint64_t ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:close", keywords, &drain) ||
        drain_arg(self, drain, FY_EXIT_DRAIN_NS, &ns) < 0)
        return NULL;
    return close_draining(self, ns);
}

static PyObject *pool_enter(PyObject *obj, PyObject *unused)
{
    (void)unused;
    if (!((fy_pool *)obj)->pool)
        return PyErr_Format(PyExc_RuntimeError, "the Pool was not initialised");
    return Py_NewRef(obj);
}

/* A with block that ends normally drains first (drain=True); one that raised closes as
 * close() does. */
static PyObject *pool_exit(PyObject *obj, PyObject *args)
{
    fy_pool *self = (fy_pool *)obj;
    PyObject *type =
        PyTuple_Check(args) && PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None;
    uint64_t ns = 0;
    drain_arg(self, type == Py_None ? Py_True : Py_None, FY_EXIT_DRAIN_NS, &ns);
    PyObject *r = close_draining(self, ns);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

int fy_pool_wait_next(fy_pool *self, fy_wait *w)
{
    int more = fy_wait_next(w);
    return more > 0 && fy_pool_check(self) < 0 ? -1 : more;
}

int fy_pool_wait_ns(fy_pool *self, PyObject *timeout, uint64_t *ns)
{
    return fy_timeout_arg(timeout, self->on_full == FY_FULL_WAIT ? self->wait_ns : FERRY_NO_WAIT,
                          ns);
}

int fy_pool_too_large(const fy_pool *self, ferry_status st, uint64_t needed)
{
    return st == FERRY_POOL_FULL && needed > self->usable;
}

PyObject *fy_pool_failure(fy_pool *self, ferry_status st, uint64_t needed)
{
    if (st == FERRY_POOL_FULL && self->on_full == FY_FULL_NONE)
        Py_RETURN_NONE;
    if (fy_pool_too_large(self, st, needed))
        return fy_raise_as(fy_TooLarge, st, ferry_last_error());
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
    FY_STAT_(capacity),
    FY_STAT_(usable_bytes),
    FY_STAT_(bytes_in_use),
    FY_STAT_(largest_free),
    FY_STAT_(leases_in_flight),
    FY_STAT_(high_water_bytes),
    FY_STAT_(high_water_leases),
    FY_STAT_(publishes),
    FY_STAT_(pool_full_events),
    FY_STAT_(reclaimed),
    FY_STAT_(cancelled),
    FY_STAT_(acked_for_dead),
    FY_STAT_(broker_refused),
    FY_STAT_(consumers_attached),
    FY_STAT_(consumers_alive),
    FY_STAT_(too_large),
    FY_STAT_(pool_full_waits),
    FY_STAT_(pool_full_timeouts),
    FY_STAT_(remote_connected),
    FY_STAT_(remote_admitted),
    FY_STAT_(remote_refused),
    FY_STAT_(remote_emulated),
    FY_STAT_(remote_forwarded),
    FY_STAT_(remote_bad_messages),
    FY_STAT_(remote_refused_malformed),
    FY_STAT_(remote_refused_secret),
    FY_STAT_(remote_refused_rank),
    FY_STAT_(remote_refused_silent),
    FY_STAT_(remote_refused_flood),
    FY_STAT_(remote_refused_error),
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
    if (fy_pool_check(self) < 0)
        return NULL;
    ferry_pool_stats s;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = stats_of(self->pool, &s); /* reads device control words */
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_raise_pool(st, self->pool);
    return stats_dict(&s);
}

static PyObject *pool_consumer_info(PyObject *obj, PyObject *rank_obj)
{
    fy_pool *self = (fy_pool *)obj;
    uint32_t rank;
    if (fy_pool_check(self) < 0 || fy_rank_arg(rank_obj, &rank) < 0)
        return NULL;
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_pool_consumer_info(self->pool, rank, &info);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_raise_pool(st, self->pool);
    return Py_BuildValue("{s:O,s:O,s:L,s:K,s:K,s:K}", "attached",
                         info.attached ? Py_True : Py_False, "alive",
                         info.alive ? Py_True : Py_False, "pid", (long long)info.pid, "outstanding",
                         (unsigned long long)info.outstanding, "oldest_age_ns",
                         (unsigned long long)info.oldest_age_ns, "partly_acknowledged",
                         (unsigned long long)info.partly_acknowledged);
}

/* ---- leases -------------------------------------------------------------------------- */

int fy_pool_cancel_lease(fy_pool *self, const ferry_descriptor *d)
{
    if (fy_pool_check(self) < 0)
        return -1;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_pool_cancel(self->pool, d);
    Py_END_ALLOW_THREADS if (st != FERRY_OK)
    {
        fy_raise_pool(st, self->pool);
        return -1;
    }
    return 0;
}

static PyObject *pool_cancel(PyObject *obj, PyObject *desc_obj)
{
    ferry_descriptor d;
    if (fy_descriptor_get(desc_obj, &d) < 0 || fy_pool_cancel_lease((fy_pool *)obj, &d) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *pool_describe(PyObject *obj, PyObject *unused)
{
    fy_pool *self = (fy_pool *)obj;
    (void)unused;
    if (fy_pool_check(self) < 0)
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
    if (!self->pool)
        return PyErr_Format(PyExc_RuntimeError, "the Pool was not initialised");
    char cause[1024] = "";
    if (ferry_pool_error(self->pool, cause, sizeof(cause)) == FERRY_OK)
        Py_RETURN_NONE;
    return PyUnicode_FromString(cause);
}

static PyObject *pool_reclaim(PyObject *obj, PyObject *unused)
{
    fy_pool *self = (fy_pool *)obj;
    (void)unused;
    if (fy_pool_check(self) < 0)
        return NULL;
    uint64_t n = 0;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_pool_reclaim(self->pool, &n);
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

static PyObject *get_address(PyObject *obj, void *closure)
{
    (void)closure;
    fy_pool *self = (fy_pool *)obj;
    if (!self->pool)
        return PyErr_Format(PyExc_RuntimeError, "the Pool was not initialised");
    return PyUnicode_FromString(self->address);
}

static PyObject *get_remote_address(PyObject *obj, void *closure)
{
    (void)closure;
    fy_pool *self = (fy_pool *)obj;
    if (!self->pool)
        return PyErr_Format(PyExc_RuntimeError, "the Pool was not initialised");
    if (!self->remote_address[0])
        Py_RETURN_NONE;
    return PyUnicode_FromString(self->remote_address);
}

static PyObject *get_channel_depth(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(((fy_pool *)obj)->channel_depth);
}

static PyObject *get_drain_timeout(PyObject *obj, void *closure)
{
    (void)closure;
    uint64_t ns = ((fy_pool *)obj)->drain_ns;
    if (!((fy_pool *)obj)->drain_set)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(ns == FERRY_WAIT_FOREVER ? Py_HUGE_VAL : (double)ns / 1e9);
}

static PyGetSetDef pool_getset[] = {
    {"address", get_address, NULL,
     "The pool's address ('ferry:' and 32 hex digits): consumers on this machine connect to "
     "it (ferry.connect). Valid after close() too (nobody serves it then).",
     NULL},
    {"remote_address", get_remote_address, NULL,
     "The pool's remote address ('ferry+ucx://HOST:PORT/<pool id>/<secret>') for consumers on "
     "other hosts (ferry.connect), or None for a pool made without listen=. It carries the "
     "pool's secret: whoever has it can read every lease.",
     NULL},
    {"channel_depth", get_channel_depth, NULL, "Descriptors each rank's ring holds (send).", NULL},
    {"drain_timeout", get_drain_timeout, NULL,
     "Seconds close() waits for every lease to be acknowledged first (None: not given: no "
     "wait, 10 s at the end of a with block; 0: never).",
     NULL},
    {"backend", get_backend, NULL, "The backend the pool uses ('host', 'cuda_ipc', 'cuda_vmm').",
     NULL},
    {"device", get_device, NULL, "The pool's GPU ordinal; -1 for host pools.", NULL},
    {"closed", get_closed, NULL, "True once close() ran.", NULL},
    {"on_full", get_on_full, NULL, "What publish does when the pool is full.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define METH_KW(fn)   (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS
#define METH_FAST(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef pool_methods[] = {
    {"publish", METH_FAST(fy_pool_publish),
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
     "consumers_attached, consumers_alive, too_large (publishes and reserves refused because "
     "they can never fit), pool_full_waits (publishes that waited for space), "
     "pool_full_timeouts (that waited and gave up), and for consumers on other hosts "
     "remote_connected, remote_admitted, remote_refused (and by reason: "
     "remote_refused_malformed, _secret, _rank, _silent, _flood, _error), remote_emulated "
     "(reading over emulated RMA), remote_forwarded (descriptors sent) and "
     "remote_bad_messages."},
    {"metrics", METH_KW(fy_pool_metrics),
     "metrics(labels=None) -> str\n\nThe pool's statistics and ranks in the Prometheus text "
     "format; labels (a dict) are added to every sample (ferry.prometheus has a collector)."},
    {"consumer_info", pool_consumer_info, METH_O,
     "consumer_info(rank) -> dict\n\nattached, alive, pid, outstanding (leases not "
     "acknowledged), oldest_age_ns and partly_acknowledged (packed leases of which it "
     "acknowledged some parts, not all) of one rank."},
    {"describe", pool_describe, METH_NOARGS,
     "describe() -> Descriptor\n\nA descriptor of the pool only (no lease), to open the pool "
     "before the first tensor."},
    {"error", pool_error, METH_NOARGS,
     "error() -> str | None\n\nNone while the pool is healthy, else the first cause of its "
     "failure."},
    {"reclaim", pool_reclaim, METH_NOARGS,
     "reclaim() -> int\n\nFrees every acknowledged lease now (the background reclaimer does it "
     "too) and returns how many."},
    {"send", METH_FAST(fy_pool_send),
     "send(x, ranks=None, stream=None, timeout=None) -> Descriptor | list[Descriptor] | None\n\n"
     "Publishes x (one tensor, or a list or tuple of them packed into one lease) as publish "
     "and publish_many do, and queues its descriptors in the descriptor ring of every rank "
     "(ranks=None), of one rank (an int), of a range of ranks or of a list of them: consumers "
     "connected with ferry.connect(pool.address, rank) get it from Receiver.recv(). Ranks not "
     "chosen are acknowledged for at once. A rank whose ring is full follows on_full as a "
     "full pool does (timeout= overrides the wait). Returns the Descriptor (a list for a "
     "list), or None under on_full='none'."},
    {"drain", METH_KW(pool_drain),
     "drain(timeout=None)\n\nWaits until every published lease has been acknowledged by all "
     "its ranks (or on behalf of ranks whose process died). timeout: seconds (default: the "
     "pool's drain_timeout, else 10; inf: forever); Timeout names the slowest rank. Ctrl-C "
     "ends the wait (KeyboardInterrupt)."},
    {"close", METH_KW(pool_close),
     "close(drain=None)\n\nShuts the pool down: refuses new publishers, waits for active ones, "
     "releases the memory. Waiting consumers see ProducerGone. Closing twice is harmless. "
     "drain: wait for every published lease to be acknowledged first, up to drain seconds "
     "(True: the pool's drain_timeout if one was given, else 10 s; None: the pool's "
     "drain_timeout, else no wait; False: no wait); a drain that runs out is logged ('ferry' "
     "logger) and the pool "
     "closed anyway; Ctrl-C closes at once. A with block that ends normally closes with "
     "drain=True, one that raised as close(). While a "
     "reservation's buffer or DLPack tensor is alive, the pool refuses every call from here "
     "(Closing) and the rest of the shutdown happens when the last of them is freed."},
    {"__enter__", pool_enter, METH_NOARGS, NULL},
    {"__exit__", pool_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Pool",
    .tp_basicsize = sizeof(fy_pool),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Pool(size, consumers, *, backend='auto', device=0, max_inflight=4096, "
              "reclaim_interval_us=1000, control='host', on_full='raise', timeout=None, "
              "vmm_handle='auto', channel_depth=64, drain_timeout=None)\n--\n\n"
              "A producer's pool of size bytes read by consumers ranks.",
    .tp_new = PyType_GenericNew,
    .tp_init = pool_init,
    .tp_dealloc = pool_dealloc,
    .tp_finalize = pool_finalize,
    .tp_traverse = pool_traverse,
    .tp_clear = pool_clear,
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};
