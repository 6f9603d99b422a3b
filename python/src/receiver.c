/* ferry.Receiver: a consumer connected to a pool by its address (ferry_consumer_connect), which
 * takes the leases sent to its rank from the rank's descriptor ring (ferry_consumer_recv) and
 * reads them as ferry.receive does (receive.c). Waits run in slices without the GIL (Ctrl-C
 * ends them). A lease taken from the ring but not read (its readiness wait timed out, out= was
 * refused, Ctrl-C) is kept and handed out first by the next recv, so that nothing taken is
 * lost; a lease found stale (acknowledged on this rank's behalf) is skipped. */
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

/* A lease taken from the ring and not read yet. */
typedef struct pending_lease {
    struct pending_lease *next;
    size_t count;
    ferry_descriptor *descs; /* malloc */
} pending_lease;

typedef struct {
    PyObject_HEAD
    fy_consumer *consumer; /* NULL before __init__ and once closed */
    PyObject *address;
    uint32_t rank;
    int32_t device;
    int fd;    /* -1 until fileno() */
    int torch; /* recv's default for torch= */
    pending_lease *pending;
} fy_receiver;

/* Descriptors a first recv has room for; a packed lease of more parts gets a larger array. */
#define FY_RECV_PARTS     8
#define FY_RECV_PARTS_MAX (1u << 16)

static PyObject *closed_error(void)
{
    PyErr_SetString(PyExc_ValueError, "recv on a closed Receiver");
    return NULL;
}

/* The receiver's consumer (a new reference), or NULL with ValueError once closed. */
static fy_consumer *open_consumer(fy_receiver *self)
{
    if (!self->consumer) {
        if (!self->address)
            PyErr_SetString(PyExc_RuntimeError, "the Receiver was not initialised");
        else
            closed_error();
        return NULL;
    }
    fy_consumer_ref(self->consumer);
    return self->consumer;
}

/* The library reads an address up to its first NUL: one with a NUL inside is refused here,
 * as the library refuses anything but the printed form. */
static int address_whole(PyObject *address, const char *text, Py_ssize_t size)
{
    if (strlen(text) == (size_t)size)
        return 0;
    PyObject *message = PyUnicode_FromFormat("%R is not a ferry address (ferry: and 32 hex "
                                             "digits, as Pool.address gives): it holds a NUL",
                                             address);
    const char *utf8 = message ? PyUnicode_AsUTF8(message) : NULL;
    if (utf8)
        fy_raise_as(NULL, FERRY_INVALID_ARGUMENT, utf8);
    Py_XDECREF(message);
    return -1;
}

static int receiver_init(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"address", "rank", "device", "torch", NULL};
    fy_receiver *self = (fy_receiver *)obj;
    PyObject *address, *rank_obj, *device_obj = Py_None;
    uint32_t rank;
    int device = -1, torch = 0;
    if (self->address) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO|O$p:Receiver", keywords, &address, &rank_obj,
                                     &device_obj, &torch) ||
        fy_rank_arg(rank_obj, &rank) < 0 || fy_device_arg(device_obj, -1, &device) < 0)
        return -1;
    Py_ssize_t size = 0;
    const char *text = PyUnicode_AsUTF8AndSize(address, &size);
    if (!text || address_whole(address, text, size) < 0)
        return -1;
    ferry_consumer *handle = NULL;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_consumer_connect(text, rank, device, &handle);
    Py_END_ALLOW_THREADS if (st != FERRY_OK)
    {
        fy_raise(st);
        return -1;
    }
    fy_consumer *c = fy_consumer_wrap(handle, rank, device);
    if (!c) {
        ferry_consumer_destroy(handle);
        return -1;
    }
    self->consumer = c;
    self->address = Py_NewRef(address);
    self->rank = rank;
    self->device = device;
    self->fd = -1;
    self->torch = torch;
    return 0;
}

/* ---- pending leases ------------------------------------------------------------------- */

static int keep_pending(fy_receiver *self, ferry_descriptor *descs, size_t count)
{
    pending_lease *p = malloc(sizeof(*p));
    if (!p)
        return -1;
    p->descs = descs;
    p->count = count;
    p->next = self->pending;
    self->pending = p;
    return 0;
}

/* Acknowledges (gives up) the leases taken and never read, so that the pool can recycle them. */
static void drop_pending(pending_lease *p, ferry_consumer *handle)
{
    while (p) {
        pending_lease *next = p->next;
        for (size_t i = 0; handle && i < p->count; i++)
            ferry_consumer_ack(handle, &p->descs[i]);
        free(p->descs);
        free(p);
        p = next;
    }
}

static void receiver_close_now(fy_receiver *self)
{
    fy_consumer *c = self->consumer;
    pending_lease *p = self->pending;
    self->consumer = NULL;
    self->pending = NULL;
    self->fd = -1;
    if (!c)
        return;
    Py_BEGIN_ALLOW_THREADS drop_pending(p, c->handle);
    fy_consumer_unref(c); /* destroys the consumer once no view holds it */
    Py_END_ALLOW_THREADS
}

static void receiver_dealloc(PyObject *obj)
{
    fy_receiver *self = (fy_receiver *)obj;
    receiver_close_now(self);
    Py_CLEAR(self->address);
    Py_TYPE(obj)->tp_free(obj);
}

/* ---- recv ----------------------------------------------------------------------------- */

/* ferry_consumer_recv into a malloc'd array that grows for a packed lease of many parts
 * (the library answers INVALID_ARGUMENT and keeps the lease queued when it has no room).
 * Without the GIL. */
static ferry_status ring_take(ferry_consumer *h, uint64_t ns, ferry_descriptor **descs,
                              size_t *count)
{
    size_t cap = FY_RECV_PARTS;
    ferry_descriptor *d = malloc(cap * sizeof(*d));
    if (!d)
        return FERRY_NO_MEMORY;
    for (;;) {
        *count = 0;
        ferry_status st = ferry_consumer_recv(h, ns, d, cap, count);
        if (st == FERRY_OK) {
            *descs = d;
            return st;
        }
        /* A lease of more parts than d holds stays queued, and *count says how many. */
        int larger = st == FERRY_INVALID_ARGUMENT && *count > cap && *count <= FY_RECV_PARTS_MAX;
        ferry_descriptor *grown = larger ? realloc(d, *count * sizeof(*d)) : NULL;
        if (!grown) {
            free(d);
            return larger ? FERRY_NO_MEMORY : st;
        }
        d = grown;
        cap = *count;
    }
}

/* The next lease from the ring, waiting as w says: 0 with *descs and *count, or -1 with the
 * exception (Timeout, ProducerGone, a closed receiver, KeyboardInterrupt). */
static int next_lease(fy_receiver *self, fy_consumer *c, fy_wait *w, ferry_descriptor **descs,
                      size_t *count)
{
    if (self->pending) {
        pending_lease *p = self->pending;
        self->pending = p->next;
        *descs = p->descs;
        *count = p->count;
        free(p);
        return 0;
    }
    for (;;) {
        ferry_status st;
        uint64_t slice = fy_wait_slice(w);
        Py_BEGIN_ALLOW_THREADS st = ring_take(c->handle, slice, descs, count);
        Py_END_ALLOW_THREADS if (st == FERRY_OK) return 0;
        if (st != FERRY_TIMEOUT) {
            fy_raise(st);
            return -1;
        }
        int more = fy_wait_next(w);
        if (more < 0)
            return -1;
        if (more > 0 && !self->consumer) {
            closed_error();
            return -1;
        }
        if (more == 0) {
            if (!w->sliced) {
                fy_raise(st);
                return -1;
            }
            char message[128]; /* the library's, for the whole wait rather than its last slice */
            snprintf(message, sizeof(message), "no lease came for rank %u within %.3f ms", c->rank,
                     (double)w->total_ns / 1e6);
            fy_raise_as(NULL, st, message);
            return -1;
        }
    }
}

/* How long a lease taken from the ring may take to be ready (a GPU copy still on the
 * producer's stream): what is left of the call's wait, at least the default wait. */
static uint64_t ready_wait(const fy_wait *w)
{
    if (w->deadline == UINT64_MAX)
        return FERRY_WAIT_FOREVER;
    uint64_t now = ferry_now_ns(), left = w->deadline > now ? w->deadline - now : 0;
    return left > FY_DEFAULT_WAIT_NS ? left : FY_DEFAULT_WAIT_NS;
}

/* Every out= tensor against its part, before any part is read and acknowledged: a refusal
 * leaves the whole lease to the next recv. */
static int check_outs(fy_consumer *c, const ferry_descriptor *descs, size_t count, PyObject *stream,
                      PyObject *outs)
{
    for (size_t i = 0; i < count; i++)
        if (fy_receive_check_out(c, &descs[i], stream, PyTuple_GET_ITEM(outs, (Py_ssize_t)i)) < 0)
            return -1;
    return 0;
}

/* Reads the lease: one Received (or out) for a single tensor, a list for a packed lease (out:
 * a list or tuple with one tensor per part). NULL with the exception and *status as
 * fy_receive_leased says; *from gets the first part not read. */
static PyObject *read_lease(fy_consumer *c, const ferry_descriptor *descs, size_t count,
                            PyObject *copy, PyObject *stream, PyObject *out, int torch,
                            uint64_t wait_ns, ferry_status *status, size_t *from)
{
    int packed = descs[0].part_count != 0;
    *status = FERRY_OK;
    *from = 0;
    int out_list = out != Py_None && (PyList_Check(out) || PyTuple_Check(out));
    if (out != Py_None && out_list != packed) {
        if (packed)
            PyErr_Format(PyExc_ValueError,
                         "the lease holds %zu tensors: out= takes a list of %zu tensors", count,
                         count);
        else
            PyErr_SetString(PyExc_ValueError,
                            "the lease holds one tensor: out= takes one tensor, not a list");
        return NULL;
    }
    if (!out_list)
        return fy_receive_leased(c, descs, count, copy, stream, out, torch, wait_ns, !packed,
                                 status);
    PyObject *outs = fy_tuple_arg(out, "out= takes a list of tensors");
    if (!outs)
        return NULL;
    PyObject *result = NULL;
    if ((size_t)PyTuple_GET_SIZE(outs) != count) {
        PyErr_Format(PyExc_ValueError, "the lease holds %zu tensors; out= has %zd", count,
                     PyTuple_GET_SIZE(outs));
    } else if (check_outs(c, descs, count, stream, outs) == 0) {
        /* Part by part (the library acknowledges the lease once every part was). */
        size_t i;
        for (i = 0; i < count; i++) {
            PyObject *r =
                fy_receive_leased(c, &descs[i], 1, copy, stream,
                                  PyTuple_GET_ITEM(outs, (Py_ssize_t)i), 0, wait_ns, 1, status);
            if (!r)
                break;
            Py_DECREF(r);
        }
        *from = i;
        if (i == count)
            result = PySequence_List(outs);
    }
    Py_DECREF(outs);
    return result;
}

/* A call's torch= (NULL or None: the receiver's own): 0 or 1, or -1 with the exception. */
static int torch_arg(const fy_receiver *self, PyObject *torch)
{
    return torch && torch != Py_None ? PyObject_IsTrue(torch) : self->torch;
}

static PyObject *receiver_recv(PyObject *obj, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    static fy_keywords kw = {.fn = "recv",
                             .positional = 5,
                             .names = {"timeout", "copy", "out", "stream", "torch", NULL}};
    fy_receiver *self = (fy_receiver *)obj;
    PyObject *v[5] = {NULL};
    uint64_t ns;
    if (fy_kwargs(&kw, args, nargs, kwnames, v) < 0 ||
        fy_timeout_arg(v[0], FERRY_WAIT_FOREVER, &ns) < 0)
        return NULL;
    PyObject *copy = v[1] ? v[1] : Py_True, *out = v[2] ? v[2] : Py_None;
    PyObject *stream = v[3] ? v[3] : Py_None;
    int torch = torch_arg(self, v[4]);
    if (torch < 0)
        return NULL;
    fy_consumer *c = open_consumer(self);
    if (!c)
        return NULL;
    fy_wait w;
    fy_wait_start(&w, ns);
    PyObject *result = NULL;
    for (;;) {
        ferry_descriptor *descs = NULL;
        size_t count = 0, from = 0;
        if (next_lease(self, c, &w, &descs, &count) < 0)
            break;
        ferry_status st;
        result = read_lease(c, descs, count, copy, stream, out, torch, ready_wait(&w), &st, &from);
        if (result) {
            free(descs);
            break;
        }
        if (st == FERRY_STALE) { /* acknowledged on this rank's behalf: the next one */
            PyErr_Clear();
            free(descs);
            continue;
        }
        if ((st == FERRY_OK || st == FERRY_TIMEOUT) && self->consumer) {
            /* Not read (out= refused, Ctrl-C, not ready yet): the next recv starts with it. */
            if (from)
                memmove(descs, descs + from, (count - from) * sizeof(*descs));
            if (keep_pending(self, descs, count - from) == 0)
                break;
        } else if (st != FERRY_PRODUCER_GONE) {
            for (size_t i = from; i < count; i++) /* unreadable: give it up */
                ferry_consumer_ack(c->handle, &descs[i]);
        }
        free(descs);
        break;
    }
    Py_BEGIN_ALLOW_THREADS fy_consumer_unref(c);
    Py_END_ALLOW_THREADS return result;
}

/* receive(descriptor, *, copy=True, out=None, stream=None, timeout=None, torch=None): a lease
 * handed over by another channel (Pool.publish's descriptor), read through this receiver's
 * connection: for a remote pool, the only way to read a descriptor. */
static PyObject *receiver_receive(PyObject *obj, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    static fy_keywords kw = {
        .fn = "receive",
        .positional = 1,
        .names = {"descriptor", "copy", "out", "stream", "timeout", "torch", NULL}};
    fy_receiver *self = (fy_receiver *)obj;
    PyObject *v[6] = {NULL};
    uint64_t ns;
    ferry_descriptor d;
    if (fy_kwargs(&kw, args, nargs, kwnames, v) < 0)
        return NULL;
    if (!v[0]) {
        PyErr_SetString(PyExc_TypeError, "receive() missing its required argument 'descriptor'");
        return NULL;
    }
    /* timeout: as ferry.receive's (10 s unless given), not recv's (forever): the lease was
     * sent already, a wait for it ends with the producer's copy. */
    if (fy_descriptor_get(v[0], &d) < 0 || fy_timeout_arg(v[4], FY_DEFAULT_WAIT_NS, &ns) < 0)
        return NULL;
    int torch = torch_arg(self, v[5]);
    if (torch < 0)
        return NULL;
    fy_consumer *c = open_consumer(self);
    if (!c)
        return NULL;
    ferry_status st;
    PyObject *result = fy_receive_leased(c, &d, 1, v[1] ? v[1] : Py_True, v[3] ? v[3] : Py_None,
                                         v[2] ? v[2] : Py_None, torch, ns, 1, &st);
    Py_BEGIN_ALLOW_THREADS fy_consumer_unref(c);
    Py_END_ALLOW_THREADS return result;
}

static PyObject *receiver_ack(PyObject *obj, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"descriptor", "ranks", "lease", NULL};
    PyObject *desc, *ranks = Py_None;
    int lease = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$Op:ack", keywords, &desc, &ranks, &lease))
        return NULL;
    fy_consumer *c = open_consumer((fy_receiver *)obj);
    if (!c)
        return NULL;
    PyObject *result = fy_ack_as(c, desc, ranks, lease);
    Py_BEGIN_ALLOW_THREADS fy_consumer_unref(c);
    Py_END_ALLOW_THREADS return result;
}

static PyObject *receiver_iternext(PyObject *obj)
{
    PyObject *r = receiver_recv(obj, NULL, 0, NULL);
    if (!r && PyErr_ExceptionMatches(fy_ProducerGone))
        PyErr_Clear(); /* StopIteration */
    return r;
}

static PyObject *receiver_fileno(PyObject *obj, PyObject *unused)
{
    fy_receiver *self = (fy_receiver *)obj;
    (void)unused;
    if (self->fd >= 0)
        return PyLong_FromLong(self->fd);
    fy_consumer *c = open_consumer(self);
    if (!c)
        return NULL;
    int fd = -1;
    ferry_status st;
    Py_BEGIN_ALLOW_THREADS st = ferry_consumer_fd(c->handle, &fd);
    Py_END_ALLOW_THREADS if (st == FERRY_OK && self->consumer == c) self->fd = fd;
    Py_BEGIN_ALLOW_THREADS fy_consumer_unref(c);
    Py_END_ALLOW_THREADS if (st != FERRY_OK) return fy_raise(st);
    return PyLong_FromLong(fd);
}

static PyObject *receiver_close(PyObject *obj, PyObject *unused)
{
    (void)unused;
    receiver_close_now((fy_receiver *)obj);
    Py_RETURN_NONE;
}

static PyObject *receiver_enter(PyObject *obj, PyObject *unused)
{
    (void)unused;
    if (!((fy_receiver *)obj)->consumer)
        return closed_error();
    return Py_NewRef(obj);
}

static PyObject *receiver_exit(PyObject *obj, PyObject *args)
{
    (void)args;
    receiver_close_now((fy_receiver *)obj);
    Py_RETURN_FALSE;
}

static PyObject *get_rank(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(((fy_receiver *)obj)->rank);
}

static PyObject *get_device(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromLong(((fy_receiver *)obj)->device);
}

static PyObject *get_address(PyObject *obj, void *closure)
{
    (void)closure;
    PyObject *a = ((fy_receiver *)obj)->address;
    return a ? Py_NewRef(a) : PyUnicode_FromString("");
}

static PyObject *get_closed(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((fy_receiver *)obj)->consumer == NULL);
}

static PyGetSetDef receiver_getset[] = {
    {"rank", get_rank, NULL, "The rank this receiver reads as.", NULL},
    {"device", get_device, NULL, "The GPU its copies go to; -1: host pools only.", NULL},
    {"address", get_address, NULL, "The address of the pool it is connected to.", NULL},
    {"closed", get_closed, NULL, "True once close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define METH_FAST(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef receiver_methods[] = {
    {"recv", METH_FAST(receiver_recv),
     "recv(timeout=None, copy=True, out=None, stream=None, torch=None) -> Received | "
     "list[Received] | out | torch.Tensor\n\n"
     "Takes the next lease sent to this rank and reads it as ferry.receive does: a copy "
     "(acknowledged at once; on GPU pools in stream order), a read-only view with copy=False "
     "(acknowledged when freed), or into out= (a packed lease: a list with one tensor per "
     "part). A packed lease (a list sent) gives a list. timeout: seconds (None: forever); "
     "Ctrl-C ends the wait. Timeout when nothing came, ProducerGone once the producer closed "
     "the pool or died. Leases acknowledged on this rank's behalf are skipped; a lease not "
     "read (out= refused, Ctrl-C) comes first at the next recv. torch=True (None: the "
     "receiver's torch=): torch tensors, from torch's allocator as ferry.receive's torch= "
     "makes them; out= comes back as it is."},
    {"receive", METH_FAST(receiver_receive),
     "receive(descriptor, *, copy=True, out=None, stream=None, timeout=None, torch=None) -> "
     "Received | out | torch.Tensor\n\n"
     "Reads a lease whose descriptor came by a channel of the caller's own (Pool.publish's), "
     "as this receiver's rank and through its connection, as ferry.receive does. A pool on "
     "another host is read this way, by UCX gets (zero-copy views need the pool mapped: "
     "local pools only). timeout: seconds, 10 unless given. Stale if the lease was acknowledged "
     "for this rank already."},
    {"ack", (PyCFunction)(void (*)(void))receiver_ack, METH_VARARGS | METH_KEYWORDS,
     "ack(descriptor, *, ranks=None, lease=False)\n\n"
     "Acknowledges without reading, as ferry.ack does, through this receiver's connection: "
     "for its rank, or for ranks (a range: a group's leader for the group); lease=True: "
     "the whole packed lease through one part."},
    {"fileno", receiver_fileno, METH_NOARGS,
     "fileno() -> int\n\nA file descriptor that becomes readable when a lease may have come "
     "(or the producer closed the pool or died): for select, selectors and event loops. Get "
     "it first (registering a Receiver with selectors does), then recv(timeout=0) until it "
     "raises Timeout (which arms the fd), then wait for the fd (it may wake with nothing to "
     "receive). Closed with the Receiver."},
    {"close", receiver_close, METH_NOARGS,
     "close()\n\nDisconnects: leases taken and not read are acknowledged; views keep what "
     "they need. Closing twice is harmless. The rank stays this process's until it exits."},
    {"__enter__", receiver_enter, METH_NOARGS, NULL},
    {"__exit__", receiver_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Receiver",
    .tp_basicsize = sizeof(fy_receiver),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Receiver(address, rank, device=None, *, torch=False)\n--\n\n"
              "A consumer connected to the pool at address as rank (ferry.connect).",
    .tp_new = PyType_GenericNew,
    .tp_init = receiver_init,
    .tp_dealloc = receiver_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = receiver_iternext,
    .tp_methods = receiver_methods,
    .tp_getset = receiver_getset,
};
