/* ferry.Descriptor: the 256-byte descriptor of one tensor of a lease (or of a pool only),
 * immutable, hashable and picklable through its wire form. */
#include <string.h>

#include "ferry_py.h"

PyObject *fy_descriptor_new(const ferry_descriptor *d)
{
    fy_descriptor *self = PyObject_New(fy_descriptor, &fy_DescriptorType);
    if (!self)
        return NULL;
    ferry_status st = ferry_descriptor_encode(d, self->wire);
    if (st != FERRY_OK) {
        Py_DECREF(self);
        return fy_raise(st);
    }
    self->desc = *d;
    return (PyObject *)self;
}

/* Descriptor is final: type is always fy_DescriptorType. */
static PyObject *from_wire(PyTypeObject *type, PyObject *data)
{
    (void)type;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    ferry_descriptor d;
    ferry_status st = ferry_descriptor_decode(view.buf, (size_t)view.len, &d);
    PyBuffer_Release(&view);
    if (st != FERRY_OK)
        return fy_raise(st);
    return fy_descriptor_new(&d);
}

int fy_descriptor_get(PyObject *obj, ferry_descriptor *out)
{
    if (PyObject_TypeCheck(obj, &fy_DescriptorType)) {
        *out = ((fy_descriptor *)obj)->desc;
        return 0;
    }
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError, "expected a ferry.Descriptor or its 256 bytes, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *d = from_wire(&fy_DescriptorType, obj);
    if (!d)
        return -1;
    *out = ((fy_descriptor *)d)->desc;
    Py_DECREF(d);
    return 0;
}

static PyObject *descriptor_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"data", NULL};
    PyObject *data;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Descriptor", keywords, &data))
        return NULL;
    return from_wire(type, data);
}

/* Descriptor(data) through vectorcall: the call pickle.loads makes for every descriptor, with
 * no tuple or keyword parsing; other spellings take tp_new's way. */
static PyObject *descriptor_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 1 && !kwnames)
        return from_wire((PyTypeObject *)type, args[0]);
    PyObject *tuple = PyTuple_New(nargs), *kwargs = kwnames ? PyDict_New() : NULL;
    PyObject *result = NULL;
    int ok = tuple && (!kwnames || kwargs);
    for (Py_ssize_t i = 0; ok && i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    for (Py_ssize_t k = 0; ok && kwnames && k < PyTuple_GET_SIZE(kwnames); k++)
        ok = PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) == 0;
    if (ok)
        result = descriptor_tp_new((PyTypeObject *)type, tuple, kwargs);
    Py_XDECREF(tuple);
    Py_XDECREF(kwargs);
    return result;
}

static PyObject *descriptor_from_bytes(PyObject *cls, PyObject *data)
{
    return from_wire((PyTypeObject *)cls, data);
}

static PyObject *wire_bytes(fy_descriptor *self)
{
    return PyBytes_FromStringAndSize((const char *)self->wire, FERRY_DESCRIPTOR_SIZE);
}

static PyObject *descriptor_bytes(PyObject *self, PyObject *unused)
{
    (void)unused;
    return wire_bytes((fy_descriptor *)self);
}

static PyObject *descriptor_reduce(PyObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *wire = wire_bytes((fy_descriptor *)self);
    if (!wire)
        return NULL;
    return Py_BuildValue("(O(N))", (PyObject *)&fy_DescriptorType, wire);
}

static PyObject *descriptor_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &fy_DescriptorType) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    int same =
        memcmp(((fy_descriptor *)a)->wire, ((fy_descriptor *)b)->wire, FERRY_DESCRIPTOR_SIZE) == 0;
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static Py_hash_t descriptor_hash(PyObject *self)
{
    PyObject *wire = wire_bytes((fy_descriptor *)self);
    if (!wire)
        return -1;
    Py_hash_t h = PyObject_Hash(wire);
    Py_DECREF(wire);
    return h;
}

static int pool_only(const ferry_descriptor *d)
{
    return (d->flags & FERRY_DESC_FLAG_POOL_ONLY) != 0;
}

static PyObject *descriptor_repr(PyObject *obj)
{
    const ferry_descriptor *d = &((fy_descriptor *)obj)->desc;
    const char *backend = ferry_backend_name((ferry_backend)d->backend);
    if (pool_only(d))
        return PyUnicode_FromFormat("Descriptor(backend='%s', pool only, consumers=%u)", backend,
                                    (unsigned)d->consumer_count);
    PyObject *shape = fy_shape_tuple(&d->tensor), *dtype = fy_dtype_name(&d->tensor);
    PyObject *repr = NULL;
    if (shape && dtype)
        repr = PyUnicode_FromFormat("Descriptor(backend='%s', slot=%u, generation=%u, "
                                    "shape=%R, dtype='%U', offset=%llu, length=%llu)",
                                    backend, d->slot, d->generation, shape, dtype,
                                    (unsigned long long)d->offset, (unsigned long long)d->length);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    return repr;
}

/* ---- read-only properties ------------------------------------------------------------ */

#define DESC(self) (&((fy_descriptor *)(self))->desc)

static PyObject *get_backend(PyObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(ferry_backend_name((ferry_backend)DESC(self)->backend));
}

static PyObject *get_shape(PyObject *self, void *closure)
{
    (void)closure;
    return fy_shape_tuple(&DESC(self)->tensor);
}

static PyObject *get_dtype(PyObject *self, void *closure)
{
    (void)closure;
    return fy_dtype_name(&DESC(self)->tensor);
}

static PyObject *get_pool_id(PyObject *self, void *closure)
{
    (void)closure;
    return PyBytes_FromStringAndSize((const char *)DESC(self)->pool_id, 16);
}

static PyObject *get_pool_only(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(pool_only(DESC(self)));
}

static PyObject *get_multi(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong((DESC(self)->flags & FERRY_DESC_FLAG_MULTI) != 0);
}

/* Integer fields, by offset into ferry_descriptor and width. */
#define UINT_GETTER(field)                                                                         \
    static PyObject *get_##field(PyObject *self, void *closure)                                    \
    {                                                                                              \
        (void)closure;                                                                             \
        return PyLong_FromUnsignedLongLong((unsigned long long)DESC(self)->field);                 \
    }
UINT_GETTER(slot)
UINT_GETTER(generation)
UINT_GETTER(offset)
UINT_GETTER(length)
UINT_GETTER(consumer_count)
UINT_GETTER(max_inflight)
UINT_GETTER(pool_size)

static PyObject *get_device(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(DESC(self)->device);
}

static PyGetSetDef descriptor_getset[] = {
    {"backend", get_backend, NULL, "Backend of the pool: 'host', 'cuda_ipc' or 'cuda_vmm'.", NULL},
    {"slot", get_slot, NULL, "Control-table row of the lease.", NULL},
    {"generation", get_generation, NULL, "Generation of the lease in its slot.", NULL},
    {"offset", get_offset, NULL, "Byte offset of the tensor from the pool's data start.", NULL},
    {"length", get_length, NULL, "Bytes of the tensor.", NULL},
    {"shape", get_shape, NULL, "Shape of the tensor (tuple).", NULL},
    {"dtype", get_dtype, NULL, "dtype name of the tensor ('float32', 'bfloat16', ...).", NULL},
    {"device", get_device, NULL, "Producer's GPU ordinal; -1 for host pools.", NULL},
    {"pool_id", get_pool_id, NULL, "Random 16-byte identity of the pool.", NULL},
    {"consumer_count", get_consumer_count, NULL, "Ranks that must acknowledge the lease.", NULL},
    {"max_inflight", get_max_inflight, NULL, "Rows of the pool's control table.", NULL},
    {"pool_size", get_pool_size, NULL, "memory_size of the pool.", NULL},
    {"pool_only", get_pool_only, NULL, "Names the pool only, no lease (Pool.describe).", NULL},
    {"multi", get_multi, NULL, "The lease holds several tensors (publish_many).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef descriptor_methods[] = {
    {"from_bytes", descriptor_from_bytes, METH_O | METH_CLASS,
     "from_bytes(data) -> Descriptor\n\nDecodes the 256-byte wire form; a malformed descriptor "
     "raises ValueError with the library's message."},
    {"__bytes__", descriptor_bytes, METH_NOARGS, "The 256-byte wire form."},
    {"__reduce__", descriptor_reduce, METH_NOARGS, "Pickles through the wire form."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject fy_DescriptorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Descriptor",
    .tp_basicsize = sizeof(fy_descriptor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Descriptor(data)\n--\n\n"
              "The descriptor of one published tensor (or, from Pool.describe, of the pool "
              "only): send it to the consumers over any channel. Immutable; bytes(d) is its "
              "256-byte wire form, Descriptor(data) and Descriptor.from_bytes(data) decode it, "
              "and it pickles through it.",
    .tp_new = descriptor_tp_new,
    .tp_vectorcall = descriptor_vectorcall,
    .tp_repr = descriptor_repr,
    .tp_hash = descriptor_hash,
    .tp_richcompare = descriptor_richcompare,
    .tp_methods = descriptor_methods,
    .tp_getset = descriptor_getset,
};
