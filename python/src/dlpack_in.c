/* Taking tensors from DLPack producers (numpy, torch, cupy, ...): ask for a versioned capsule
 * first and fall back to the legacy protocol, take ownership of the managed tensor by
 * renaming the capsule, and check that ferry can copy it as it is. */
#include <string.h>

#include "ferry_py.h"

/* (device_type, device_id) of obj, from __dlpack_device__ (CPU if it has none). */
static int source_device(PyObject *obj, int32_t *type, int32_t *id)
{
    *type = FY_DL_CPU;
    *id = 0;
    PyObject *dev = PyObject_VectorcallMethod(fy_name(FY_NAME_DLPACK_DEVICE), &obj,
                                              1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!dev) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear(); /* no __dlpack_device__: host memory */
        return 0;
    }
    int t = 0, i = 0, ok = fy_int_pair(dev, &t, &i);
    if (!ok)
        ok = PyArg_ParseTuple(dev, "ii:__dlpack_device__", &t, &i); /* says what is wrong */
    Py_DECREF(dev);
    *type = t;
    *id = i;
    return ok ? 0 : -1;
}

/* The stream argument of __dlpack__ for a CUDA tensor read or written on stream: -1 (no
 * ordering asked for) when it is torch's current stream already, else the stream. torch's
 * __dlpack__ orders streams in Python and takes ~15 us longer when given one, even the
 * stream the tensor is on. */
static PyObject *dlpack_stream_arg(PyObject *obj, int32_t device_id, void *stream)
{
    if (fy_torch_on_stream(obj, device_id, stream))
        return PyLong_FromLong(-1);
    return fy_stream_for_dlpack(stream);
}

static int check_device(int32_t type, int host_only)
{
    int host_memory = type == FY_DL_CPU || type == FY_DL_CUDA_HOST || type == FY_DL_CUDA_MANAGED;
    if (host_memory || (!host_only && type == FY_DL_CUDA))
        return 0;
    if (host_only && type == FY_DL_CUDA)
        PyErr_SetString(PyExc_ValueError,
                        "a host pool needs CPU data: the tensor is in CUDA device memory (publish "
                        "it to a cuda_ipc or cuda_vmm pool, or copy it to the CPU first)");
    else
        PyErr_Format(PyExc_ValueError, "ferry cannot read tensors of DLPack device type %d",
                     (int)type);
    return -1;
}

/* obj.__dlpack__(stream=..., max_version=(1, 0)), or the legacy call for producers that do
 * not know max_version (vectorcalls with interned keyword names: this runs at every publish
 * and receive into out= of a tensor without torch's fast path). */
static PyObject *call_dlpack(PyObject *obj, PyObject *stream)
{
    static PyObject *names_both, *names_stream, *version;
    if (!names_both &&
        (!(names_both = PyTuple_Pack(2, fy_name(FY_NAME_STREAM), fy_name(FY_NAME_MAX_VERSION))) ||
         !(names_stream = PyTuple_Pack(1, fy_name(FY_NAME_STREAM))) ||
         !(version = Py_BuildValue("(ii)", FY_DLPACK_MAJOR, FY_DLPACK_MINOR))))
        return NULL;
    PyObject *args[3] = {obj, stream, version};
    PyObject *capsule = PyObject_VectorcallMethod(fy_name(FY_NAME_DLPACK), args,
                                                  1 | PY_VECTORCALL_ARGUMENTS_OFFSET, names_both);
    if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyObject *legacy[2] = {obj, stream};
        capsule = PyObject_VectorcallMethod(fy_name(FY_NAME_DLPACK), legacy,
                                            1 | PY_VECTORCALL_ARGUMENTS_OFFSET, names_stream);
    }
    if (!capsule && PyErr_ExceptionMatches(PyExc_AttributeError) &&
        !PyObject_HasAttr(obj, fy_name(FY_NAME_DLPACK))) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError,
                            "ferry publishes objects with __dlpack__ (numpy arrays, torch or "
                            "cupy tensors), got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    return capsule;
}

static int check_contiguous(const DLTensor *dl)
{
    if (!dl->strides)
        return 0;
    for (int i = 0; i < dl->ndim; i++)
        if (dl->shape[i] == 0)
            return 0; /* no elements: any strides will do */
    int64_t expected = 1;
    for (int i = dl->ndim - 1; i >= 0; i--) {
        if (dl->shape[i] != 1 && dl->strides[i] != expected) {
            PyErr_SetString(PyExc_ValueError,
                            "ferry publishes C-contiguous tensors only (make it contiguous "
                            "first, e.g. numpy.ascontiguousarray or tensor.contiguous())");
            return -1;
        }
        expected *= dl->shape[i];
    }
    return 0;
}

/* Fills t from the DLTensor: dtype, shape (at most FERRY_MAX_NDIM dimensions). */
static int describe(const DLTensor *dl, ferry_tensor *t)
{
    memset(t, 0, sizeof(*t));
    if (dl->ndim < 0 || dl->ndim > FERRY_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "the tensor has %d dimensions; ferry supports at most %d",
                     (int)dl->ndim, FERRY_MAX_NDIM);
        return -1;
    }
    t->dtype_code = dl->dtype.code;
    t->dtype_bits = dl->dtype.bits;
    t->dtype_lanes = dl->dtype.lanes;
    t->ndim = (uint8_t)dl->ndim;
    for (int i = 0; i < dl->ndim; i++)
        t->shape[i] = dl->shape[i];
    uint64_t nbytes;
    ferry_status st = ferry_tensor_nbytes(t, &nbytes); /* the library's dtype and shape rules */
    if (st != FERRY_OK) {
        fy_raise(st);
        return -1;
    }
    return check_contiguous(dl);
}

/* The DLTensor of a capsule still owned by it; NULL with an exception. */
static const DLTensor *capsule_tensor(PyObject *capsule, int *versioned, void **managed)
{
    *versioned = PyCapsule_IsValid(capsule, FY_CAPSULE_VERSIONED);
    if (*versioned) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, FY_CAPSULE_VERSIONED);
        *managed = m;
        if (m->version.major == FY_DLPACK_MAJOR)
            return &m->dl_tensor;
        PyErr_Format(PyExc_BufferError, "DLPack version %u.%u is not supported (1.x is)",
                     m->version.major, m->version.minor);
        return NULL;
    }
    if (PyCapsule_IsValid(capsule, FY_CAPSULE_LEGACY)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, FY_CAPSULE_LEGACY);
        *managed = m;
        return &m->dl_tensor;
    }
    PyErr_SetString(PyExc_TypeError,
                    "__dlpack__ returned no \"dltensor\" or \"dltensor_versioned\" capsule");
    return NULL;
}

/* Checks the capsule's tensor and takes it over (renaming the capsule "used_..."). */
static int take(PyObject *capsule, int host_only, int writable, fy_import *out)
{
    int versioned;
    void *managed;
    const DLTensor *dl = capsule_tensor(capsule, &versioned, &managed);
    if (!dl || check_device(dl->device.device_type, host_only) < 0 ||
        describe(dl, &out->tensor) < 0)
        return -1;
    if (writable && versioned &&
        (((DLManagedTensorVersioned *)managed)->flags & FY_DLPACK_FLAG_READ_ONLY)) {
        PyErr_SetString(PyExc_ValueError, "out= is read-only: ferry needs memory it can write");
        return -1;
    }
    if (PyCapsule_SetName(capsule, versioned ? FY_CAPSULE_VERSIONED_USED : FY_CAPSULE_LEGACY_USED) <
        0)
        return -1;
    out->managed = managed;
    out->versioned = versioned;
    out->data = (const uint8_t *)dl->data + dl->byte_offset;
    out->device_type = dl->device.device_type;
    out->device_id = dl->device.device_id;
    return 0;
}

static int import_take(PyObject *obj, int host_only, int writable, void *stream, fy_import *out)
{
    int32_t type, id;
    memset(out, 0, sizeof(*out));
    if (!host_only && fy_torch_take(obj, stream, out))
        return 0;
    if (source_device(obj, &type, &id) < 0 || check_device(type, host_only) < 0)
        return -1;
    PyObject *stream_arg =
        type == FY_DL_CUDA ? dlpack_stream_arg(obj, id, stream) : Py_NewRef(Py_None);
    int restore = type == FY_DL_CUDA ? fy_torch_device_enter(obj, id) : -1;
    PyObject *capsule = stream_arg ? call_dlpack(obj, stream_arg) : NULL;
    fy_torch_device_exit(restore);
    Py_XDECREF(stream_arg);
    if (!capsule)
        return -1;
    int rc = take(capsule, host_only, writable, out);
    Py_DECREF(capsule); /* a capsule not taken calls its producer's deleter */
    if (rc == 0 && type == FY_DL_CUDA)
        fy_torch_learn(obj, &out->tensor); /* the next tensor of its dtype takes the fast path */
    return rc;
}

int fy_import_take(PyObject *obj, int host_only, void *stream, fy_import *out)
{
    return import_take(obj, host_only, 0, stream, out);
}

int fy_import_writable(PyObject *obj, int host_only, void *stream, fy_import *out)
{
    return import_take(obj, host_only, 1, stream, out);
}

void fy_import_release(fy_import *imp)
{
    Py_CLEAR(imp->owner);
    if (!imp->managed)
        return;
    if (imp->versioned) {
        DLManagedTensorVersioned *m = imp->managed;
        if (m->deleter)
            m->deleter(m);
    } else {
        DLManagedTensor *m = imp->managed;
        if (m->deleter)
            m->deleter(m);
    }
    imp->managed = NULL;
}
