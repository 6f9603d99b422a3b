/* ferry.receive and ferry.receive_many: wait for a lease, then copy it into memory the result
 * owns (acknowledging at once), into the caller's tensors (out=), into tensors of torch's
 * allocator (torch=True), or view it in place (acknowledging when the view is freed).
 * The wait comes first, on the CPU and in slices (Ctrl-C ends it; a dead producer gives
 * ProducerGone, not a stream blocked forever): it also checks every descriptor against the
 * pool, before anything is allocated for it. Then host pools read on the CPU, GPU pools
 * enqueue the read on the caller's stream, into stream-ordered memory (ferry_gpu_alloc_async:
 * no driver allocation, no wait for the device). Every descriptor consumed is acknowledged:
 * the parts of a packed lease one by one (the library acknowledges the lease for the rank
 * once this process acknowledged all of them). */
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

typedef struct recv_call {
    ferry_descriptor *descs;
    size_t count;
    fy_consumer *consumer;
    int gpu, copy;
    int32_t device;
    void *stream;
    uint64_t timeout_ns;
    fy_payload **out; /* count entries */
    fy_import *into;  /* out= or torch=: memory read into (no payload), count entries */
    void *owner;      /* torch=, GPU: the stream torch's tensors belong to, when it is not
                       * stream (ordered around the copies); owned: set */
    int owned;
    int sliced; /* the wait took several slices */
} recv_call;

static fy_payload *payload_new(const recv_call *c, size_t i)
{
    fy_payload *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->refs = 1;
    p->kind =
        c->gpu ? (c->copy ? FY_GPU_COPY : FY_GPU_VIEW) : (c->copy ? FY_HOST_COPY : FY_HOST_VIEW);
    p->tensor = c->descs[i].tensor;
    p->nbytes = c->descs[i].length;
    p->device = c->gpu ? (DLDevice){FY_DL_CUDA, c->device} : (DLDevice){FY_DL_CPU, 0};
    p->recv_stream = c->stream;
    return p;
}

/* Frees what a failed receive made (no acknowledgement: the caller may try again). */
static void discard(recv_call *c)
{
    for (size_t i = 0; i < c->count; i++) {
        fy_payload *p = c->out[i];
        if (!p)
            continue;
        if (p->kind == FY_HOST_COPY)
            fy_host_buffer_free(p->buffer, p->buffer_size);
        else if (p->kind == FY_GPU_COPY)
            fy_cuda_free_async(p->device.device_id, p->buffer, c->stream);
        free(p);
        c->out[i] = NULL;
    }
}

static ferry_status alloc_payloads(recv_call *c)
{
    for (size_t i = 0; i < c->count; i++) {
        fy_payload *p = c->out[i] = payload_new(c, i);
        if (!p)
            return FERRY_NO_MEMORY;
        if (p->kind == FY_GPU_COPY) {
            ferry_status st = fy_cuda_alloc_async(c->device, p->nbytes, c->stream, &p->buffer);
            if (st != FERRY_OK)
                return st;
        } else if (p->kind == FY_HOST_COPY) {
            if (!(p->buffer = fy_host_buffer(p->nbytes, &p->buffer_size)))
                return FERRY_NO_MEMORY;
        }
        p->data = p->buffer;
    }
    return FERRY_OK;
}

/* ---- host pools ---------------------------------------------------------------------- */

/* Host copies acknowledge once read; STALE: acknowledged for this rank meanwhile. */
static ferry_status host_ack(ferry_consumer *h, const ferry_descriptor *d)
{
    ferry_status st = ferry_consumer_ack(h, d);
    return st == FERRY_STALE ? FERRY_OK : st;
}

/* Where part i is copied to: the caller's (or torch's) memory, or the payload's. */
static void *destination(const recv_call *c, size_t i)
{
    return c->into ? (void *)c->into[i].data : c->out[i]->buffer;
}

/* Reads run once the lease is ready: they wait no more. */
static ferry_status host_copy(recv_call *c)
{
    ferry_consumer *h = c->consumer->handle;
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < c->count && st == FERRY_OK; i++)
        st = ferry_consumer_read(h, &c->descs[i], destination(c, i), (size_t)c->descs[i].length,
                                 FERRY_NO_WAIT);
    for (size_t i = 0; i < c->count && st == FERRY_OK; i++)
        st = host_ack(h, &c->descs[i]);
    return st;
}

static ferry_status host_view(recv_call *c)
{
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < c->count && st == FERRY_OK; i++) {
        const void *data = NULL;
        st = ferry_consumer_view(c->consumer->handle, &c->descs[i], &data, FERRY_NO_WAIT);
        c->out[i]->data = (void *)data;
    }
    return st;
}

/* ---- GPU pools: enqueued on the stream ----------------------------------------------- */

static ferry_status gpu_copy(recv_call *c)
{
    ferry_consumer *h = c->consumer->handle;
    if (c->count == 1)
        return ferry_consumer_read_async(h, &c->descs[0], destination(c, 0),
                                         (size_t)c->descs[0].length, c->stream);
    /* One lease, several tensors: copy every one, then acknowledge every one (STALE: that
     * part was acknowledged for this rank already). */
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < c->count && st == FERRY_OK; i++) {
        const void *src = NULL;
        st = ferry_consumer_view_async(h, &c->descs[i], c->stream, &src);
        if (st == FERRY_OK)
            st = fy_cuda_copy_async(c->device, destination(c, i), src, c->descs[i].length,
                                    c->stream);
    }
    for (size_t i = 0; i < c->count && st == FERRY_OK; i++) {
        st = ferry_consumer_ack_async(h, &c->descs[i], c->stream);
        st = st == FERRY_STALE ? FERRY_OK : st;
    }
    return st;
}

static ferry_status gpu_view(recv_call *c)
{
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < c->count && st == FERRY_OK; i++) {
        const void *data = NULL;
        st = ferry_consumer_view_async(c->consumer->handle, &c->descs[i], c->stream, &data);
        c->out[i]->data = (void *)data;
    }
    return st;
}

/* out= or torch=: the copies go into that memory; the acknowledgement follows them (on the
 * stream for GPU pools, at once for host pools). torch's tensors belong to torch's current
 * stream: when the copies run on another, it waits for the work enqueued there so far (the
 * memory's previous users) and torch's stream then waits for the copies. */
static ferry_status receive_into(recv_call *c)
{
    if (!c->gpu)
        return host_copy(c);
    ferry_status st = FERRY_OK;
    if (c->owned)
        st = fy_cuda_order(c->device, c->owner, c->stream);
    if (st == FERRY_OK)
        st = gpu_copy(c);
    if (st == FERRY_OK && c->owned)
        st = fy_cuda_order(c->device, c->stream, c->owner);
    return st;
}

/* Waits up to wait_ns for the lease, then checks every other descriptor of it against the
 * pool (the library refuses one whose range is not its lease's: MISMATCH). */
static ferry_status wait_lease(recv_call *c, uint64_t wait_ns)
{
    ferry_consumer *h = c->consumer->handle;
    ferry_status st = ferry_consumer_wait(h, &c->descs[0], wait_ns);
    for (size_t i = 1; i < c->count && st == FERRY_OK; i++)
        st = ferry_consumer_wait(h, &c->descs[i], FERRY_NO_WAIT);
    return st;
}

/* Once the lease is ready and its descriptors checked. */
static ferry_status receive_ready(recv_call *c)
{
    if (c->into)
        return receive_into(c);
    ferry_status st = alloc_payloads(c);
    if (st == FERRY_OK && c->gpu)
        st = c->copy ? gpu_copy(c) : gpu_view(c);
    else if (st == FERRY_OK)
        st = c->copy ? host_copy(c) : host_view(c);
    if (st != FERRY_OK)
        discard(c);
    return st;
}

/* Gives every payload but host copies a lease of its own part: views acknowledge their part
 * when freed, GPU copies keep the consumer (and its mapping) alive. */
static ferry_status attach_leases(recv_call *c)
{
    if ((!c->gpu && c->copy) || c->into)
        return FERRY_OK;
    for (size_t i = 0; i < c->count; i++) {
        fy_lease *lease = fy_lease_new(c->consumer, &c->descs[i], !c->copy);
        if (!lease) {
            for (size_t j = 0; j < i; j++) { /* nothing acknowledged: the caller may retry */
                fy_lease_forget(c->out[j]->lease);
                c->out[j]->lease = NULL;
            }
            discard(c);
            return FERRY_NO_MEMORY;
        }
        c->out[i]->lease = lease;
    }
    return FERRY_OK;
}

/* One attempt, without the GIL: TIMEOUT when the lease was not ready within wait_ns. */
static ferry_status run(recv_call *c, uint64_t wait_ns)
{
    ferry_status st = wait_lease(c, wait_ns);
    if (st == FERRY_OK)
        st = receive_ready(c);
    if (st == FERRY_OK)
        st = attach_leases(c);
    return st;
}

static ferry_status run_slice(void *c, uint64_t slice_ns)
{
    return run(c, slice_ns);
}

/* run, waiting in slices: returns -1 with the exception of a signal handler (nothing was
 * read or acknowledged), else 0 with *status. */
static int run_sliced(recv_call *c, ferry_status *status)
{
    fy_wait w;
    fy_wait_start(&w, c->timeout_ns);
    int rc = fy_wait_call(&w, run_slice, c, status);
    c->sliced = w.sliced;
    return rc;
}

/* ---- arguments and results ------------------------------------------------------------ */

static int same_lease(const ferry_descriptor *a, const ferry_descriptor *b)
{
    return memcmp(a->pool_id, b->pool_id, 16) == 0 && a->slot == b->slot &&
           a->generation == b->generation;
}

static int parse_descs(PyObject *const *items, size_t count, ferry_descriptor *descs)
{
    for (size_t i = 0; i < count; i++) {
        if (fy_descriptor_get(items[i], &descs[i]) < 0)
            return -1;
        if (i && !same_lease(&descs[0], &descs[i])) {
            PyErr_SetString(PyExc_ValueError,
                            "receive_many takes the descriptors of one publish_many (one lease)");
            return -1;
        }
    }
    return 0;
}

/* The options of a receive; NULL (not given) or Py_None means the default. */
typedef struct recv_args {
    PyObject *rank, *device, *copy, *stream, *timeout, *out, *torch;
    uint64_t timeout_ns; /* instead of timeout when has_timeout_ns */
    int has_timeout_ns;
    int check_only; /* only check the arguments (out= above all): read nothing */
} recv_args;

static int no_arg(PyObject *obj)
{
    return obj == NULL || obj == Py_None;
}

/* A flag: NULL (not given) is dflt. 0 or 1, or -1 with an exception. */
static int flag_arg(PyObject *obj, int dflt)
{
    if (!obj)
        return dflt;
    if (obj == Py_True || obj == Py_False)
        return obj == Py_True;
    return PyObject_IsTrue(obj);
}

static int parse_options(const recv_args *a, recv_call *c)
{
    int copy = flag_arg(a->copy, 1);
    if (copy < 0 || fy_consumer_device(&c->descs[0], a->device, &c->device) < 0 ||
        (!a->has_timeout_ns &&
         fy_timeout_arg(a->timeout, FY_DEFAULT_WAIT_NS, &c->timeout_ns) < 0) ||
        (c->gpu && fy_stream_arg(a->stream, &c->stream) < 0))
        return -1;
    if (a->has_timeout_ns)
        c->timeout_ns = a->timeout_ns;
    c->copy = copy;
    if (!no_arg(a->out) && !copy) {
        PyErr_SetString(PyExc_ValueError,
                        "out= receives a copy: it cannot be combined with copy=False");
        return -1;
    }
    return 0;
}

/* out=: the caller's tensor, C-contiguous and writable, of the descriptor's dtype and element
 * count (any shape). Its device is the consumer's unless device= says otherwise. */
static int take_out(const recv_args *a, recv_call *c, fy_import *into, int fixed_device)
{
    if (fy_import_writable(a->out, !c->gpu, c->stream, into) < 0)
        return -1;
    const ferry_tensor *want = &c->descs[0].tensor, *got = &into->tensor;
    if (got->dtype_code != want->dtype_code || got->dtype_bits != want->dtype_bits ||
        got->dtype_lanes != want->dtype_lanes ||
        fy_tensor_elements(got) != fy_tensor_elements(want)) {
        PyObject *have = fy_dtype_name(got), *need = fy_dtype_name(want);
        if (have && need)
            PyErr_Format(PyExc_ValueError,
                         "out= holds %llu elements of %U; the tensor received has %llu of %U",
                         (unsigned long long)fy_tensor_elements(got), have,
                         (unsigned long long)fy_tensor_elements(want), need);
        Py_XDECREF(have);
        Py_XDECREF(need);
        fy_import_release(into);
        return -1;
    }
    if (c->gpu && !fixed_device && no_arg(a->device) && into->device_type == FY_DL_CUDA)
        c->device = into->device_id;
    c->into = into;
    return 0;
}

/* torch=True: tensors from torch's allocator for every part, on the consumer's device (the CPU
 * for host pools), read into as out= is. A GPU receive runs on torch's current stream unless
 * stream= names another (then ordered around it). 1 when made; 0 without an exception when
 * torch has no dtype of the lease (the results are then converted with torch.from_dlpack);
 * -1 with an exception. */
static int torch_outs(const recv_args *a, recv_call *c, fy_import *into)
{
    void *current = NULL;
    if (c->gpu && fy_torch_current_stream(c->device, &current) == 0) {
        if (no_arg(a->stream))
            c->stream = current;
        else if (fy_stream_key(c->stream) != fy_stream_key(current)) {
            c->owner = current;
            c->owned = 1;
        }
    }
    size_t made = 0;
    int rc = 1;
    for (; made < c->count && rc == 1; made++)
        rc = fy_torch_empty(&c->descs[made].tensor, c->gpu ? c->device : -1, &into[made]);
    if (rc == 1) {
        c->into = into;
        return 1;
    }
    for (size_t i = 0; i + 1 < made; i++) /* the last one made nothing */
        fy_import_release(&into[i]);
    return rc;
}

/* The tensors read into (out=: the caller's one; torch=: a tensor, or a list for
 * receive_many and packed leases). */
static PyObject *into_results(recv_call *c, const recv_args *a, int single)
{
    if (!no_arg(a->out))
        return Py_NewRef(a->out);
    if (single)
        return Py_NewRef(c->into[0].owner);
    PyObject *list = PyList_New((Py_ssize_t)c->count);
    for (size_t i = 0; list && i < c->count; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i, Py_NewRef(c->into[i].owner));
    return list;
}

/* Received objects (torch: converted with torch.from_dlpack), one or a list. */
static PyObject *results(recv_call *c, PyObject *const *items, int single, int torch)
{
    PyObject *list = single ? NULL : PyList_New((Py_ssize_t)c->count);
    PyObject *first = NULL;
    for (size_t i = 0; i < c->count; i++) {
        PyObject *desc =
            items && PyObject_TypeCheck(items[i], &fy_DescriptorType) ? items[i] : NULL;
        PyObject *r = fy_received_new(c->out[i], &c->descs[i], desc); /* owns the payload */
        c->out[i] = NULL;
        if (r && torch) {
            PyObject *t = fy_torch_from_dlpack(r);
            Py_SETREF(r, t);
        }
        if (single) {
            first = r;
        } else if (list && r) {
            PyList_SET_ITEM(list, (Py_ssize_t)i, r);
        } else {
            Py_XDECREF(r);
            Py_CLEAR(list);
        }
    }
    return single ? first : list;
}

/* What receive returns: the error, the tensors read into, or the Received objects. */
static PyObject *finish(ferry_status st, recv_call *c, PyObject *const *items, const recv_args *a,
                        int single, int torch)
{
    if (st == FERRY_TIMEOUT && c->sliced) {
        /* The library's message, for the whole wait rather than its last slice. */
        char message[128];
        snprintf(message, sizeof(message), "lease (slot=%u, generation=%u) not ready after %.3f ms",
                 c->descs[0].slot, c->descs[0].generation, (double)c->timeout_ns / 1e6);
        return fy_raise_as(NULL, st, message);
    }
    if (st != FERRY_OK)
        return fy_raise(st);
    if (c->into)
        return into_results(c, a, single);
    return results(c, items, single, torch);
}

/* Checks a receiver's consumer against the lease: a GPU lease needs a receiver connected for a
 * GPU. 0, or -1 with ValueError. */
static int check_given(const fy_consumer *given, const recv_call *c)
{
    if (!given || !c->gpu || given->device >= 0)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "the lease is in GPU memory (a pool on device %d) but this Receiver was "
                 "connected for host pools only: connect with device= (the GPU its copies "
                 "go to)",
                 (int)c->descs[0].device);
    return -1;
}

/* The receive of count decoded descriptors of one lease (descs, which the call copies) as
 * rank, through consumer (NULL: the cache's consumer of rank on the device the options name;
 * given: its device, also for out=). items: the Descriptor objects to hand back, or NULL.
 * *status (may be NULL) gets the library's status of a failed receive, FERRY_OK for other
 * failures (an argument refused: nothing read or acknowledged). */
static PyObject *receive_descs(const ferry_descriptor *descs, size_t count, PyObject *const *items,
                               const recv_args *a, fy_consumer *given, uint32_t rank, int single,
                               ferry_status *status)
{
    recv_call c;
    memset(&c, 0, sizeof(c));
    if (status)
        *status = FERRY_OK;
    c.count = count;
    c.descs = PyMem_Calloc(count, sizeof(*c.descs));
    c.out = PyMem_Calloc(count, sizeof(*c.out));
    fy_import *into = PyMem_Calloc(count, sizeof(*into));
    PyObject *result = NULL;
    int torch = 0;
    if (!c.descs || !c.out || !into) {
        PyErr_NoMemory();
        goto free_arrays;
    }
    memcpy(c.descs, descs, count * sizeof(*descs));
    c.gpu = c.descs[0].device >= 0; /* the pool's data is on a GPU */
    if (parse_options(a, &c) < 0 || check_given(given, &c) < 0 ||
        (torch = flag_arg(a->torch, 0)) < 0)
        goto free_arrays;
    if (given)
        c.device = c.gpu ? given->device : -1;
    if (!no_arg(a->out) && take_out(a, &c, into, given != NULL) < 0)
        goto free_arrays;
    if (a->check_only) {
        result = Py_NewRef(Py_None);
        goto free_arrays;
    }
    if (torch && c.copy && no_arg(a->out)) {
        int made = torch_outs(a, &c, into);
        if (made < 0)
            goto free_arrays;
        torch = !made; /* made: torch's tensors already; else converted at the end */
    }
    if (given)
        fy_consumer_ref(c.consumer = given);
    else if (!(c.consumer = fy_consumer_get(rank, c.device)))
        goto free_arrays;
    ferry_status st;
    if (run_sliced(&c, &st) == 0) {
        result = finish(st, &c, items, a, single, torch);
        if (!result && status)
            *status = st;
    }
    for (size_t i = 0; i < count; i++) /* left over only if results failed early */
        fy_payload_release(c.out[i]);
free_arrays:
    for (size_t i = 0; c.into && i < count; i++)
        fy_import_release(&c.into[i]);
    fy_consumer_unref(c.consumer);
    PyMem_Free(into);
    PyMem_Free(c.descs);
    PyMem_Free(c.out);
    return result;
}

static PyObject *receive_items(PyObject *const *items, size_t count, const recv_args *a, int single)
{
    ferry_descriptor one, *descs = count == 1 ? &one : PyMem_Calloc(count, sizeof(*descs));
    uint32_t rank = 0;
    if (!descs)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    if (parse_descs(items, count, descs) == 0 && fy_rank_arg(a->rank, &rank) == 0)
        result = receive_descs(descs, count, items, a, NULL, rank, single, NULL);
    if (descs != &one)
        PyMem_Free(descs);
    return result;
}

PyObject *fy_receive_leased(fy_consumer *consumer, const ferry_descriptor *descs, size_t count,
                            PyObject *copy, PyObject *stream, PyObject *out, int torch,
                            uint64_t timeout_ns, int single, ferry_status *status)
{
    recv_args a = {NULL,       NULL, copy, stream, NULL, out, torch ? Py_True : Py_False,
                   timeout_ns, 1,    0};
    return receive_descs(descs, count, NULL, &a, consumer, consumer->rank, single, status);
}

int fy_receive_check_out(fy_consumer *consumer, const ferry_descriptor *desc, PyObject *stream,
                         PyObject *out)
{
    recv_args a = {NULL, NULL, Py_True, stream, NULL, out, Py_False, 0, 1, 1};
    PyObject *r = receive_descs(desc, 1, NULL, &a, consumer, consumer->rank, 1, NULL);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* receive(descriptor, *, rank, device=None, copy=True, stream=None, timeout=None, out=None,
 * torch=False) and receive_many(descriptors, *, ...): the same keywords but out. */
enum { K_DESC, K_RANK, K_DEVICE, K_COPY, K_STREAM, K_TIMEOUT, K_TORCH, K_OUT, K_COUNT };

static int recv_kwargs(fy_keywords *kw, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       recv_args *a, PyObject **first)
{
    PyObject *v[K_COUNT] = {NULL};
    if (fy_kwargs(kw, args, nargs, kwnames, v) < 0)
        return -1;
    if (!v[K_DESC]) {
        PyErr_Format(PyExc_TypeError, "%s() missing its required argument '%s'", kw->fn,
                     kw->names[K_DESC]);
        return -1;
    }
    if (!v[K_RANK]) {
        PyErr_Format(PyExc_TypeError, "%s() needs rank= (this consumer's rank)", kw->fn);
        return -1;
    }
    *a = (recv_args){v[K_RANK], v[K_DEVICE], v[K_COPY], v[K_STREAM], v[K_TIMEOUT],
                     v[K_OUT],  v[K_TORCH],  0,         0,           0};
    *first = v[K_DESC];
    return 0;
}

PyObject *fy_receive(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static fy_keywords kw = {.fn = "receive",
                             .positional = 1,
                             .names = {"descriptor", "rank", "device", "copy", "stream", "timeout",
                                       "torch", "out", NULL}};
    recv_args a;
    PyObject *desc;
    (void)module;
    if (recv_kwargs(&kw, args, nargs, kwnames, &a, &desc) < 0)
        return NULL;
    return receive_items(&desc, 1, &a, 1);
}

PyObject *fy_receive_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    static fy_keywords kw = {
        .fn = "receive_many",
        .positional = 1,
        .names = {"descriptors", "rank", "device", "copy", "stream", "timeout", "torch", NULL}};
    recv_args a;
    PyObject *descs;
    (void)module;
    if (recv_kwargs(&kw, args, nargs, kwnames, &a, &descs) < 0)
        return NULL;
    /* A tuple of its own: the items are used after waits that release the GIL. */
    PyObject *seq = fy_tuple_arg(descs, "receive_many takes a sequence of descriptors");
    if (!seq)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject *result = NULL;
    if (n == 0)
        PyErr_SetString(PyExc_ValueError, "receive_many needs at least one descriptor");
    else
        result = receive_items(&PyTuple_GET_ITEM(seq, 0), (size_t)n, &a, 0);
    Py_DECREF(seq);
    return result;
}
