/* The DLPack ABI (version 1.1), written from the public specification: the structures that
 * producers and consumers exchange through "dltensor" / "dltensor_versioned" capsules. Field
 * order and enumerator values are the specification's. 1.1 added the float8/float6/float4
 * type codes; the structures are those of 1.0. */
#ifndef FERRY_PY_DLPACK_H
#define FERRY_PY_DLPACK_H

#include <stdint.h>

#define FY_DLPACK_MAJOR 1
#define FY_DLPACK_MINOR 1

/* DLManagedTensorVersioned.flags */
#define FY_DLPACK_FLAG_READ_ONLY (1ull << 0)
#define FY_DLPACK_FLAG_IS_COPIED (1ull << 1)

/* Capsule names: unused (owned by the capsule) and used (taken by a consumer). */
#define FY_CAPSULE_LEGACY         "dltensor"
#define FY_CAPSULE_LEGACY_USED    "used_dltensor"
#define FY_CAPSULE_VERSIONED      "dltensor_versioned"
#define FY_CAPSULE_VERSIONED_USED "used_dltensor_versioned"

/* DLDeviceType: the values ferry meets. */
enum {
    FY_DL_CPU = 1,
    FY_DL_CUDA = 2,
    FY_DL_CUDA_HOST = 3,
    FY_DL_ROCM = 10,
    FY_DL_CUDA_MANAGED = 13,
};

/* DLDataTypeCode (DLPack 1.1). 0-6 are FERRY_DTYPE_*; the float8 codes have 8 bits, the
 * float6 ones 6 and float4 4 (a lane each: sub-byte types are packed, lanes * bits a whole
 * number of bytes in ferry). */
enum {
    FY_DL_INT = 0,
    FY_DL_UINT = 1,
    FY_DL_FLOAT = 2,
    FY_DL_OPAQUE_HANDLE = 3,
    FY_DL_BFLOAT = 4,
    FY_DL_COMPLEX = 5,
    FY_DL_BOOL = 6,
    FY_DL_FLOAT8_E3M4 = 7,
    FY_DL_FLOAT8_E4M3 = 8,
    FY_DL_FLOAT8_E4M3B11FNUZ = 9,
    FY_DL_FLOAT8_E4M3FN = 10,
    FY_DL_FLOAT8_E4M3FNUZ = 11,
    FY_DL_FLOAT8_E5M2 = 12,
    FY_DL_FLOAT8_E5M2FNUZ = 13,
    FY_DL_FLOAT8_E8M0FNU = 14,
    FY_DL_FLOAT6_E2M3FN = 15,
    FY_DL_FLOAT6_E3M2FN = 16,
    FY_DL_FLOAT4_E2M1FN = 17,
};

typedef struct DLDevice {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct DLDataType {
    uint8_t code; /* FERRY_DTYPE_* are the DLDataTypeCode values */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct DLTensor {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct DLPackVersion {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif
