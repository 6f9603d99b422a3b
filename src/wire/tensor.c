/* Tensor metadata: dtype rules, byte size with overflow checks, backend names. */
#include <string.h>

#include "common/error.h"
#include "wire/wire.h"

static const char *const backend_names[] = {"auto", "host", "cuda_ipc", "cuda_vmm"};

#define BACKEND_COUNT (sizeof(backend_names) / sizeof(backend_names[0]))

/* A size above INT64_MAX cannot be a dimension: it becomes -1, which ferry_tensor_nbytes and
 * publish then reject, rather than a silently smaller tensor. */
ferry_tensor ferry_tensor_bytes(uint64_t n)
{
    ferry_tensor t;
    memset(&t, 0, sizeof(t));
    t.dtype_code = FERRY_DTYPE_UINT;
    t.dtype_bits = 8;
    t.dtype_lanes = 1;
    t.ndim = 1;
    t.shape[0] = n > (uint64_t)INT64_MAX ? -1 : (int64_t)n;
    return t;
}

/* The bits a DLPack 1.1 low-precision float code names; 0 for codes of any width. */
static unsigned fixed_bits(unsigned code)
{
    if (code >= FERRY_DTYPE_FLOAT8_E3M4 && code <= FERRY_DTYPE_FLOAT8_E8M0FNU)
        return 8;
    if (code == FERRY_DTYPE_FLOAT6_E2M3FN || code == FERRY_DTYPE_FLOAT6_E3M2FN)
        return 6;
    return code == FERRY_DTYPE_FLOAT4_E2M1FN ? 4 : 0;
}

static ferry_status check_dtype(const ferry_tensor *t, ferry_status status, const char *what)
{
    uint32_t bits_lanes = (uint32_t)t->dtype_bits * t->dtype_lanes;
    if (t->dtype_code > FERRY_DTYPE_LAST)
        return ferry__fail(status, "%s dtype code %u is unknown (expected 0..%d)", what,
                           t->dtype_code, FERRY_DTYPE_LAST);
    unsigned fixed = fixed_bits(t->dtype_code);
    if (fixed && t->dtype_bits != fixed)
        return ferry__fail(status, "%s dtype code %u has %u bits (expected %u)", what,
                           t->dtype_code, t->dtype_bits, fixed);
    if (t->dtype_bits == 0)
        return ferry__fail(status, "%s dtype bits is 0", what);
    if (t->dtype_lanes == 0)
        return ferry__fail(status, "%s dtype lanes is 0", what);
    if (t->dtype_code == FERRY_DTYPE_BOOL && t->dtype_bits != 8)
        return ferry__fail(status, "%s bool dtype has %u bits (expected 8)", what, t->dtype_bits);
    if (bits_lanes % 8u != 0)
        return ferry__fail(status, "%s dtype bits*lanes = %u*%u is not a multiple of 8", what,
                           t->dtype_bits, t->dtype_lanes);
    return FERRY_OK;
}

/* Checks ndim and the signs of shape[0, ndim); *has_zero tells whether a dimension is 0. */
static ferry_status check_shape(const ferry_tensor *t, ferry_status status, const char *what,
                                int *has_zero)
{
    *has_zero = 0;
    if (t->ndim > FERRY_MAX_NDIM)
        return ferry__fail(status, "%s ndim %u exceeds %d", what, t->ndim, FERRY_MAX_NDIM);
    for (unsigned i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return ferry__fail(status, "%s dimension %u is negative (%lld)", what, i,
                               (long long)t->shape[i]);
        if (t->shape[i] == 0)
            *has_zero = 1;
    }
    return FERRY_OK;
}

/* Multiplies *acc by factor; returns 0 (leaving *acc alone) if the product overflows. */
static int mul_checked(uint64_t *acc, uint64_t factor)
{
    if (factor != 0 && *acc > UINT64_MAX / factor)
        return 0;
    *acc *= factor;
    return 1;
}

ferry_status ferry__tensor_size(const ferry_tensor *tensor, ferry_status status, const char *what,
                                uint64_t *nbytes)
{
    int has_zero;
    ferry_status st = check_dtype(tensor, status, what);
    if (st == FERRY_OK)
        st = check_shape(tensor, status, what, &has_zero);
    if (st != FERRY_OK)
        return st;
    if (has_zero) {
        *nbytes = 0;
        return FERRY_OK;
    }
    uint64_t size = ferry__tensor_elem_bytes(tensor);
    for (unsigned i = 0; i < tensor->ndim; i++)
        if (!mul_checked(&size, (uint64_t)tensor->shape[i]))
            return ferry__fail(status, "%s size overflows 64 bits (at dimension %u)", what, i);
    *nbytes = size;
    return FERRY_OK;
}

ferry_status ferry_tensor_nbytes(const ferry_tensor *tensor, uint64_t *nbytes)
{
    uint64_t size;
    if (!tensor || !nbytes)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "ferry_tensor_nbytes: %s is NULL",
                           !tensor ? "tensor" : "nbytes");
    ferry_status st = ferry__tensor_size(tensor, FERRY_INVALID_ARGUMENT, "tensor", &size);
    if (st != FERRY_OK)
        return st;
    ferry__clear_error();
    *nbytes = size;
    return FERRY_OK;
}

const char *ferry_backend_name(ferry_backend backend)
{
    if ((unsigned)backend >= BACKEND_COUNT)
        return NULL;
    return backend_names[backend];
}

ferry_status ferry_backend_parse(const char *name, ferry_backend *backend)
{
    if (!name || !backend)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "ferry_backend_parse: %s is NULL",
                           !name ? "name" : "backend");
    for (unsigned i = 0; i < BACKEND_COUNT; i++) {
        if (strcmp(name, backend_names[i]) == 0) {
            ferry__clear_error();
            *backend = (ferry_backend)i;
            return FERRY_OK;
        }
    }
    return ferry__fail(FERRY_INVALID_ARGUMENT,
                       "unknown backend \"%s\" (expected auto, host, cuda_ipc or cuda_vmm)", name);
}
