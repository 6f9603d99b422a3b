/* Handing tensors to DLPack consumers: __dlpack__'s arguments, and capsules over memory that
 * ferry holds. The managed tensor carries its own shape and strides and a release callback
 * that runs once, from the consumer's deleter or from the destructor of a capsule nobody
 * consumed. */
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

typedef struct fy_managed {
    union {
        DLManagedTensorVersioned versioned;
        DLManagedTensor legacy;
    } m;
    int versioned;
    int64_t shape[FERRY_MAX_NDIM];
    int64_t strides[FERRY_MAX_NDIM];
    void (*release)(void *ctx);
    void *ctx;
} fy_managed;

static void managed_free(fy_managed *m)
{
    if (m->release)
        m->release(m->ctx);
    free(m);
}

static void deleter_versioned(DLManagedTensorVersioned *self)
{
    managed_free(self->manager_ctx);
}

static void deleter_legacy(DLManagedTensor *self)
{
    managed_free(self->manager_ctx);
}

/* Runs when the capsule dies: the tensor is ours still unless a consumer renamed it. */
static void capsule_destructor(PyObject *capsule)
{
    if (PyCapsule_IsValid(capsule, FY_CAPSULE_VERSIONED)) {
        DLManagedTensorVersioned *t = PyCapsule_GetPointer(capsule, FY_CAPSULE_VERSIONED);
        t->deleter(t);
    } else if (PyCapsule_IsValid(capsule, FY_CAPSULE_LEGACY)) {
        DLManagedTensor *t = PyCapsule_GetPointer(capsule, FY_CAPSULE_LEGACY);
        t->deleter(t);
    }
}

/* Row-major strides, in elements. */
static void fill_layout(fy_managed *m, const ferry_tensor *t)
{
    int64_t stride = 1;
    for (int i = (int)t->ndim - 1; i >= 0; i--) {
        m->shape[i] = t->shape[i];
        m->strides[i] = stride;
        stride *= t->shape[i] > 0 ? t->shape[i] : 1;
    }
}

static void fill_tensor(DLTensor *dl, fy_managed *m, void *data, DLDevice device,
                        const ferry_tensor *t)
{
    dl->data = data;
    dl->device = device;
    dl->ndim = t->ndim;
    dl->dtype.code = t->dtype_code;
    dl->dtype.bits = t->dtype_bits;
    dl->dtype.lanes = t->dtype_lanes;
    dl->shape = m->shape;
    dl->strides = m->strides;
    dl->byte_offset = 0;
}

PyObject *fy_export(void *data, DLDevice device, const ferry_tensor *t, int readonly, int versioned,
                    void (*release)(void *), void *ctx)
{
    fy_managed *m = calloc(1, sizeof(*m));
    if (!m)
        return PyErr_NoMemory();
    m->versioned = versioned;
    m->release = release;
    m->ctx = ctx;
    fill_layout(m, t);
    if (versioned) {
        m->m.versioned.version = (DLPackVersion){FY_DLPACK_MAJOR, FY_DLPACK_MINOR};
        m->m.versioned.manager_ctx = m;
        m->m.versioned.deleter = deleter_versioned;
        m->m.versioned.flags = readonly ? FY_DLPACK_FLAG_READ_ONLY : 0;
        fill_tensor(&m->m.versioned.dl_tensor, m, data, device, t);
    } else {
        m->m.legacy.manager_ctx = m;
        m->m.legacy.deleter = deleter_legacy;
        fill_tensor(&m->m.legacy.dl_tensor, m, data, device, t);
    }
    PyObject *capsule = PyCapsule_New(&m->m, versioned ? FY_CAPSULE_VERSIONED : FY_CAPSULE_LEGACY,
                                      capsule_destructor);
    if (!capsule) {
        m->release = NULL; /* the caller still owns ctx */
        free(m);
    }
    return capsule;
}

PyObject *fy_device_tuple(DLDevice device)
{
    return Py_BuildValue("(ii)", device.device_type, device.device_id);
}

/* ---- __dlpack__'s keyword arguments -------------------------------------------------- */

static int parse_max_version(PyObject *max_version, int *versioned)
{
    *versioned = 0;
    if (!max_version || max_version == Py_None)
        return 0;
    if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2) {
        PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
        return -1;
    }
    long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
    if (major == -1 && PyErr_Occurred())
        return -1;
    *versioned = major >= FY_DLPACK_MAJOR;
    return 0;
}

static int check_dl_device(PyObject *dl_device, DLDevice device)
{
    if (!dl_device || dl_device == Py_None)
        return 0;
    int type, id;
    if (!PyArg_ParseTuple(dl_device, "ii:dl_device", &type, &id))
        return -1;
    if (type != device.device_type || id != device.device_id) {
        PyErr_Format(PyExc_BufferError,
                     "the tensor is on DLPack device (%d, %d) and cannot be exported to "
                     "(%d, %d)",
                     device.device_type, device.device_id, type, id);
        return -1;
    }
    return 0;
}

static int check_copy(PyObject *copy)
{
    if (!copy || copy == Py_None)
        return 0;
    int wanted = PyObject_IsTrue(copy);
    if (wanted < 0)
        return -1;
    if (wanted) {
        PyErr_SetString(PyExc_BufferError,
                        "ferry exports its memory without copying (copy=True is not supported); "
                        "copy the consumer's array instead");
        return -1;
    }
    return 0;
}

static int parse_stream(PyObject *stream, fy_export_args *out)
{
    out->stream_is_none = !stream || stream == Py_None;
    out->has_stream = 0;
    if (out->stream_is_none)
        return 0;
    long long value = PyLong_AsLongLong(stream);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value == -1)
        return 0; /* the consumer asks for no synchronisation */
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "stream %lld is not a stream", value);
        return -1;
    }
    out->has_stream = 1;
    out->stream = value == 0 ? 1u : (uintptr_t)value; /* 0 is ambiguous: the legacy stream */
    return 0;
}

int fy_export_args_parse(PyObject *args, PyObject *kwargs, DLDevice device, fy_export_args *out)
{
    static char *keywords[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", keywords, &stream,
                                     &max_version, &dl_device, &copy))
        return -1;
    memset(out, 0, sizeof(*out));
    if (parse_max_version(max_version, &out->versioned) < 0 ||
        check_dl_device(dl_device, device) < 0 || check_copy(copy) < 0)
        return -1;
    if (device.device_type == FY_DL_CPU && !(stream == Py_None || PyLong_Check(stream))) {
        PyErr_SetString(PyExc_TypeError, "stream must be None or an int");
        return -1;
    }
    return device.device_type == FY_DL_CPU ? 0 : parse_stream(stream, out);
}
