/* dtype names and shapes. A dtype is named after its DLPack code: with its bits for the codes
 * of several widths ("float32", "bfloat16", "uint8", "complex64", "opaque64"), as DLPack 1.1
 * names it for the codes of one width ("bool", "float8_e4m3fn", "float6_e2m3fn",
 * "float4_e2m1fn"), with "x<lanes>" appended for vector types ("float32x4"; "_x<lanes>" is
 * read too: torch's "float4_e2m1fn_x2"). A code ferry has no name for reads "code<N>_<bits>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

static const struct code_name {
    const char *name;
    uint8_t bits; /* 0: the name is followed by the bits; else the code's only width */
} codes[] = {
    [FY_DL_INT] = {"int", 0},
    [FY_DL_UINT] = {"uint", 0},
    [FY_DL_FLOAT] = {"float", 0},
    [FY_DL_OPAQUE_HANDLE] = {"opaque", 0},
    [FY_DL_BFLOAT] = {"bfloat", 0},
    [FY_DL_COMPLEX] = {"complex", 0},
    [FY_DL_BOOL] = {"bool", 8},
    [FY_DL_FLOAT8_E3M4] = {"float8_e3m4", 8},
    [FY_DL_FLOAT8_E4M3] = {"float8_e4m3", 8},
    [FY_DL_FLOAT8_E4M3B11FNUZ] = {"float8_e4m3b11fnuz", 8},
    [FY_DL_FLOAT8_E4M3FN] = {"float8_e4m3fn", 8},
    [FY_DL_FLOAT8_E4M3FNUZ] = {"float8_e4m3fnuz", 8},
    [FY_DL_FLOAT8_E5M2] = {"float8_e5m2", 8},
    [FY_DL_FLOAT8_E5M2FNUZ] = {"float8_e5m2fnuz", 8},
    [FY_DL_FLOAT8_E8M0FNU] = {"float8_e8m0fnu", 8},
    [FY_DL_FLOAT6_E2M3FN] = {"float6_e2m3fn", 6},
    [FY_DL_FLOAT6_E3M2FN] = {"float6_e3m2fn", 6},
    [FY_DL_FLOAT4_E2M1FN] = {"float4_e2m1fn", 4},
};

#define CODE_COUNT (sizeof(codes) / sizeof(codes[0]))

PyObject *fy_dtype_name(const ferry_tensor *t)
{
    char name[64], lanes[16] = "";
    if (t->dtype_lanes != 1)
        snprintf(lanes, sizeof(lanes), "x%u", t->dtype_lanes);
    const struct code_name *c = t->dtype_code < CODE_COUNT ? &codes[t->dtype_code] : NULL;
    if (c && c->bits == t->dtype_bits)
        snprintf(name, sizeof(name), "%s%s", c->name, lanes);
    else if (c && c->bits == 0)
        snprintf(name, sizeof(name), "%s%u%s", c->name, t->dtype_bits, lanes);
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

/* The code whose name starts name (the longest match: "bfloat" before "float",
 * "float8_e4m3fn" before "float8_e4m3"), or "code<N>_". */
static int parse_code(const char **p)
{
    if (strncmp(*p, "code", 4) == 0) {
        const char *s = *p + 4;
        long code = parse_number(&s, UINT8_MAX);
        if (code < 0 || *s != '_')
            return -1;
        *p = s + 1;
        return (int)code;
    }
    int best = -1;
    size_t best_len = 0;
    for (size_t c = 0; c < CODE_COUNT; c++) {
        size_t len = strlen(codes[c].name);
        if (len > best_len && strncmp(*p, codes[c].name, len) == 0) {
            best = (int)c;
            best_len = len;
        }
    }
    *p += best_len;
    return best;
}

/* The bits after the name: implied by codes of one width, else a number. */
static long parse_bits(const char **p, const char *name, int code)
{
    if (code < 0)
        return -1;
    if ((size_t)code < CODE_COUNT && codes[code].bits && strncmp(name, "code", 4) != 0)
        return codes[code].bits;
    return parse_number(p, UINT8_MAX);
}

static int parse_lanes(const char **p)
{
    if ((*p)[0] == '_' && (*p)[1] == 'x')
        (*p)++;
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
                 "uint8, bool, complex64 or float8_e4m3fn)",
                 name);
    return -1;
}

int fy_dtype_parse(const char *name, ferry_tensor *t)
{
    const char *p = name;
    int code = parse_code(&p);
    long bits = parse_bits(&p, name, code);
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
