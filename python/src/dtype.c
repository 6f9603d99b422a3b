/* dtype names and shapes. A dtype is named after its DLPack code and bits ("float32",
 * "bfloat16", "uint8", "complex64", "opaque64"), "bool" for the 8-bit boolean, with "x<lanes>"
 * appended for vector types ("float32x4"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

static const char *const code_names[] = {
    [FERRY_DTYPE_INT] = "int",       [FERRY_DTYPE_UINT] = "uint",
    [FERRY_DTYPE_FLOAT] = "float",   [FERRY_DTYPE_OPAQUE_HANDLE] = "opaque",
    [FERRY_DTYPE_BFLOAT] = "bfloat", [FERRY_DTYPE_COMPLEX] = "complex",
    [FERRY_DTYPE_BOOL] = "bool",
};

#define CODE_COUNT (sizeof(code_names) / sizeof(code_names[0]))

PyObject *fy_dtype_name(const ferry_tensor *t)
{
    char name[64], lanes[16] = "";
    if (t->dtype_lanes != 1)
        snprintf(lanes, sizeof(lanes), "x%u", t->dtype_lanes);
    if (t->dtype_code == FERRY_DTYPE_BOOL && t->dtype_bits == 8)
        snprintf(name, sizeof(name), "bool%s", lanes);
    else if (t->dtype_code < CODE_COUNT)
        snprintf(name, sizeof(name), "%s%u%s", code_names[t->dtype_code], t->dtype_bits, lanes);
    else
        snprintf(name, sizeof(name), "code%u_%u%s", t->dtype_code, t->dtype_bits, lanes);
    return PyUnicode_FromString(name);
}

/* Parses an unsigned decimal number at *p (advancing it); -1 if there is none or it exceeds
 * max. */
static long parse_number(const char **p, long max)
{
    const char *s = *p;
    long value = 0;
    if (*s < '0' || *s > '9')
        return -1;
    while (*s >= '0' && *s <= '9') {
        value = value * 10 + (*s++ - '0');
        if (value > max)
            return -1;
    }
    *p = s;
    return value;
}

/* The code whose name starts name (the longest match: "bfloat" before "float"). */
static int parse_code(const char **p)
{
    int best = -1;
    size_t best_len = 0;
    for (size_t c = 0; c < CODE_COUNT; c++) {
        size_t len = strlen(code_names[c]);
        if (len > best_len && strncmp(*p, code_names[c], len) == 0) {
            best = (int)c;
            best_len = len;
        }
    }
    *p += best_len;
    return best;
}

static int parse_lanes(const char **p)
{
    if (**p != 'x')
        return 1;
    (*p)++;
    long lanes = parse_number(p, UINT16_MAX);
    return lanes <= 0 ? -1 : (int)lanes;
}

static int unknown_dtype(const char *name)
{
    PyErr_Format(PyExc_ValueError,
                 "unknown dtype \"%s\" (expected a name such as float32, bfloat16, int64, "
                 "uint8, bool or complex64)",
                 name);
    return -1;
}

int fy_dtype_parse(const char *name, ferry_tensor *t)
{
    const char *p = name;
    int code = parse_code(&p);
    long bits = code == FERRY_DTYPE_BOOL ? 8 : code < 0 ? -1 : parse_number(&p, UINT8_MAX);
    int lanes = bits > 0 ? parse_lanes(&p) : -1;
    if (code < 0 || bits <= 0 || lanes <= 0 || *p != '\0')
        return unknown_dtype(name);
    t->dtype_code = (uint8_t)code;
    t->dtype_bits = (uint8_t)bits;
    t->dtype_lanes = (uint16_t)lanes;
    return 0;
}

static int shape_item(PyObject *item, unsigned i, ferry_tensor *t)
{
    long long dim = PyLong_AsLongLong(item);
    if (dim == -1 && PyErr_Occurred())
        return -1;
    if (dim < 0) {
        PyErr_Format(PyExc_ValueError, "dimension %u of the shape is negative (%lld)", i, dim);
        return -1;
    }
    t->shape[i] = dim;
    return 0;
}

int fy_shape_parse(PyObject *shape, ferry_tensor *t)
{
    memset(t->shape, 0, sizeof(t->shape));
    if (PyLong_Check(shape)) {
        t->ndim = 1;
        return shape_item(shape, 0, t);
    }
    PyObject *seq = PySequence_Fast(shape, "shape must be an int or a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int rc = 0;
    if (n > FERRY_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "shape has %zd dimensions; ferry supports at most %d", n,
                     FERRY_MAX_NDIM);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
        rc = shape_item(PySequence_Fast_GET_ITEM(seq, i), (unsigned)i, t);
    Py_DECREF(seq);
    t->ndim = (uint8_t)n;
    return rc;
}

PyObject *fy_shape_tuple(const ferry_tensor *t)
{
    unsigned ndim = t->ndim <= FERRY_MAX_NDIM ? t->ndim : FERRY_MAX_NDIM;
    PyObject *tuple = PyTuple_New(ndim);
    for (unsigned i = 0; tuple && i < ndim; i++) {
        PyObject *dim = PyLong_FromLongLong(t->shape[i]);
        if (!dim) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, i, dim);
    }
    return tuple;
}

uint64_t fy_tensor_elements(const ferry_tensor *t)
{
    uint64_t n = 1;
    for (unsigned i = 0; i < t->ndim && i < FERRY_MAX_NDIM; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}
