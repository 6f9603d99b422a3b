/* Descriptor encoder and decoder: the 256-byte little-endian format of docs/wire-format.md. */
#include <string.h>

#include "common/error.h"
#include "shm/layout.h"
#include "wire/wire.h"

#define DESC_VERSION 1u

/* Byte offsets of the fields (docs/wire-format.md, "Layout"). */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_SIZE = 6,
    OFF_BACKEND = 8,
    OFF_FLAGS = 9,
    OFF_CONSUMERS = 10,
    OFF_MAX_INFLIGHT = 12,
    OFF_SLOT = 16,
    OFF_GENERATION = 20,
    OFF_OFFSET = 24,
    OFF_LENGTH = 32,
    OFF_POOL_SIZE = 40,
    OFF_POOL_ID = 48,
    OFF_BROKER = 64,
    OFF_PID = 80,
    OFF_DEVICE = 84,
    OFF_HANDLE = 88,
    OFF_DTYPE_CODE = 152,
    OFF_DTYPE_BITS = 153,
    OFF_DTYPE_LANES = 154,
    OFF_NDIM = 156,
    OFF_RESERVED_A = 157,
    OFF_SHAPE = 160,
    OFF_PART_INDEX = 224,
    OFF_PART_COUNT = 228,
    OFF_RESERVED_B = 232,
    OFF_CHECKSUM = 252,
};

_Static_assert(OFF_CHECKSUM + 4 == FERRY_DESCRIPTOR_SIZE, "checksum ends the descriptor");
_Static_assert(OFF_SHAPE + 8 * FERRY_MAX_NDIM == OFF_PART_INDEX, "shape layout");
_Static_assert(OFF_HANDLE + sizeof(((ferry_descriptor *)0)->handle) == OFF_DTYPE_CODE,
               "handle layout");


static const uint8_t desc_magic[4] = {0x46, 0x52, 0x59, 0x44}; /* "FRYD" */

/* Reserved byte ranges: [start, end). */
static const struct {
    unsigned start, end;
} reserved_ranges[] = {{OFF_RESERVED_A, OFF_SHAPE}, {OFF_RESERVED_B, OFF_CHECKSUM}};

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

/* ---- field rules, shared by encode (INVALID_ARGUMENT) and decode (MALFORMED) ---------- */

/* A descriptor that names a pool but no lease (ferry_pool_describe), for opening early. */
static ferry_status check_pool_only(const ferry_descriptor *d, ferry_status st)
{
    if (d->flags & FERRY_DESC_FLAG_MULTI || d->slot || d->generation || d->offset || d->length)
        return ferry__fail(st,
                           "pool-only descriptor must have no lease (flags 0x%02x, slot %u, "
                           "generation %u, offset %llu, length %llu)",
                           d->flags, d->slot, d->generation, (unsigned long long)d->offset,
                           (unsigned long long)d->length);
    return FERRY_OK;
}

static ferry_status check_lease(const ferry_descriptor *d, ferry_status st)
{
    if (d->backend < FERRY_BACKEND_HOST || d->backend > FERRY_BACKEND_CUDA_VMM)
        return ferry__fail(st,
                           "descriptor backend %u is invalid (expected 1 host, 2 cuda_ipc or "
                           "3 cuda_vmm)",
                           d->backend);
    if (d->flags & ~FERRY_DESC_FLAGS_KNOWN)
        return ferry__fail(st, "descriptor flags 0x%02x have unknown bits 0x%02x", d->flags,
                           d->flags & ~FERRY_DESC_FLAGS_KNOWN & 0xFFu);
    if (d->consumer_count == 0)
        return ferry__fail(st, "descriptor consumer_count is 0 (must be at least 1)");
    if (d->max_inflight == 0)
        return ferry__fail(st, "descriptor max_inflight is 0 (must be at least 1)");
    if (d->slot >= d->max_inflight)
        return ferry__fail(st, "descriptor slot %u is not below max_inflight %u", d->slot,
                           d->max_inflight);
    if (d->flags & FERRY_DESC_FLAG_POOL_ONLY)
        return check_pool_only(d, st);
    if (d->generation == 0 || d->generation > FERRY_GENERATION_MAX)
        return ferry__fail(st, "descriptor generation %u is out of range (1..0x%x)", d->generation,
                           FERRY_GENERATION_MAX);
    return FERRY_OK;
}

static ferry_status check_host_identity(const ferry_descriptor *d, ferry_status st)
{
    if (d->flags & (FERRY_DESC_FLAG_DEVICE_CONTROL | FERRY_DESC_FLAG_FABRIC))
        return ferry__fail(st, "descriptor flag DEVICE_CONTROL or FABRIC is set for the host "
                               "backend");
    if (all_zero(d->broker, sizeof(d->broker)))
        return ferry__fail(st, "descriptor broker name is all zero (required for the host "
                               "backend)");
    if (d->device != -1)
        return ferry__fail(st, "descriptor device %d must be -1 for the host backend",
                           (int)d->device);
    if (!all_zero(d->handle, sizeof(d->handle)))
        return ferry__fail(st, "descriptor handle is not all zero for the host backend");
    return FERRY_OK;
}

static ferry_status check_identity(const ferry_descriptor *d, ferry_status st)
{
    if (all_zero(d->pool_id, sizeof(d->pool_id)))
        return ferry__fail(st, "descriptor pool_id is all zero");
    if (d->backend == FERRY_BACKEND_HOST)
        return check_host_identity(d, st);
    if (d->device < 0)
        return ferry__fail(st, "descriptor device %d is negative for backend %s", (int)d->device,
                           ferry_backend_name((ferry_backend)d->backend));
    if ((d->flags & FERRY_DESC_FLAG_FABRIC) && d->backend != FERRY_BACKEND_CUDA_VMM)
        return ferry__fail(st, "descriptor flag FABRIC is set for backend %s",
                           ferry_backend_name((ferry_backend)d->backend));
    return FERRY_OK;
}

static ferry_status check_unused_dims(const ferry_tensor *t, ferry_status st)
{
    for (unsigned i = t->ndim; i < FERRY_MAX_NDIM; i++)
        if (t->shape[i] != 0)
            return ferry__fail(st, "descriptor shape[%u] = %lld beyond ndim %u is not zero", i,
                               (long long)t->shape[i], t->ndim);
    return FERRY_OK;
}

static ferry_status check_extent(const ferry_descriptor *d, ferry_status st)
{
    uint64_t elem = ferry__tensor_elem_bytes(&d->tensor);
    if (d->offset % elem != 0)
        return ferry__fail(st, "descriptor offset %llu is not a multiple of the element size %llu",
                           (unsigned long long)d->offset, (unsigned long long)elem);
    if (d->pool_size == 0)
        return ferry__fail(st, "descriptor pool_size is 0 (must be at least 1)");
    if (d->length > d->pool_size || d->offset > d->pool_size - d->length)
        return ferry__fail(st, "descriptor offset %llu + length %llu exceeds pool_size %llu",
                           (unsigned long long)d->offset, (unsigned long long)d->length,
                           (unsigned long long)d->pool_size);
    return FERRY_OK;
}

static ferry_status check_tensor(const ferry_descriptor *d, ferry_status st)
{
    uint64_t nbytes;
    ferry_status rc = ferry__tensor_size(&d->tensor, st, "descriptor tensor", &nbytes);
    if (rc != FERRY_OK)
        return rc;
    rc = check_unused_dims(&d->tensor, st);
    if (rc != FERRY_OK)
        return rc;
    if (d->length != nbytes)
        return ferry__fail(st, "descriptor length %llu does not match the tensor size %llu",
                           (unsigned long long)d->length, (unsigned long long)nbytes);
    return check_extent(d, st);
}

/* Parts of a packed lease: both 0 (one tensor, or a packed lease acknowledged as a whole),
 * or, with MULTI, part_index < part_count with part_count >= 2. */
static ferry_status check_parts(const ferry_descriptor *d, ferry_status st)
{
    if (d->part_count == 0 && d->part_index == 0)
        return FERRY_OK;
    if (!(d->flags & FERRY_DESC_FLAG_MULTI) || d->part_count < 2 ||
        d->part_index >= d->part_count)
        return ferry__fail(st,
                           "descriptor part %u of %u is invalid (parts need the MULTI flag, "
                           "part_count >= 2 and part_index < part_count)",
                           d->part_index, d->part_count);
    return FERRY_OK;
}

/* Every rule of docs/wire-format.md that a decoded struct can break; st is the status of a
 * rejection. */
static ferry_status check_fields(const ferry_descriptor *d, ferry_status st)
{
    ferry_status rc = check_lease(d, st);
    if (rc == FERRY_OK)
        rc = check_identity(d, st);
    if (rc == FERRY_OK)
        rc = check_tensor(d, st);
    if (rc == FERRY_OK)
        rc = check_parts(d, st);
    return rc;
}

/* ---- encode ------------------------------------------------------------------------- */

static void put_tensor(uint8_t *out, const ferry_tensor *t)
{
    out[OFF_DTYPE_CODE] = t->dtype_code;
    out[OFF_DTYPE_BITS] = t->dtype_bits;
    ferry__put_le16(out + OFF_DTYPE_LANES, t->dtype_lanes);
    out[OFF_NDIM] = t->ndim;
    for (unsigned i = 0; i < FERRY_MAX_NDIM; i++)
        ferry__put_le64(out + OFF_SHAPE + 8 * i, (uint64_t)t->shape[i]);
}

static void put_fields(uint8_t *out, const ferry_descriptor *d)
{
    memcpy(out + OFF_MAGIC, desc_magic, sizeof(desc_magic));
    ferry__put_le16(out + OFF_VERSION, DESC_VERSION);
    ferry__put_le16(out + OFF_SIZE, FERRY_DESCRIPTOR_SIZE);
    out[OFF_BACKEND] = d->backend;
    out[OFF_FLAGS] = d->flags;
    ferry__put_le16(out + OFF_CONSUMERS, d->consumer_count);
    ferry__put_le32(out + OFF_MAX_INFLIGHT, d->max_inflight);
    ferry__put_le32(out + OFF_SLOT, d->slot);
    ferry__put_le32(out + OFF_GENERATION, d->generation);
    ferry__put_le64(out + OFF_OFFSET, d->offset);
    ferry__put_le64(out + OFF_LENGTH, d->length);
    ferry__put_le64(out + OFF_POOL_SIZE, d->pool_size);
    memcpy(out + OFF_POOL_ID, d->pool_id, sizeof(d->pool_id));
    memcpy(out + OFF_BROKER, d->broker, sizeof(d->broker));
    ferry__put_le32(out + OFF_PID, d->producer_pid);
    ferry__put_le32(out + OFF_DEVICE, (uint32_t)d->device);
    memcpy(out + OFF_HANDLE, d->handle, sizeof(d->handle));
    put_tensor(out, &d->tensor);
    ferry__put_le32(out + OFF_PART_INDEX, d->part_index);
    ferry__put_le32(out + OFF_PART_COUNT, d->part_count);
}

ferry_status ferry_descriptor_encode(const ferry_descriptor *desc,
                                     uint8_t out[FERRY_DESCRIPTOR_SIZE])
{
    if (!desc || !out)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "ferry_descriptor_encode: %s is NULL",
                           !desc ? "desc" : "out");
    ferry_status rc = check_fields(desc, FERRY_INVALID_ARGUMENT);
    if (rc != FERRY_OK)
        return rc;
    memset(out, 0, FERRY_DESCRIPTOR_SIZE);
    put_fields(out, desc);
    ferry__put_le32(out + OFF_CHECKSUM, ferry__crc32c(out, OFF_CHECKSUM));
    ferry__clear_error();
    return FERRY_OK;
}

/* ---- decode ------------------------------------------------------------------------- */

/* Length, magic, version, size and checksum: is this a version-1 descriptor at all? */
static ferry_status check_envelope(const uint8_t *p, size_t len)
{
    if (len != FERRY_DESCRIPTOR_SIZE)
        return ferry__fail(FERRY_MALFORMED, "descriptor length: got %zu bytes, expected %d", len,
                           FERRY_DESCRIPTOR_SIZE);
    if (memcmp(p + OFF_MAGIC, desc_magic, sizeof(desc_magic)) != 0)
        return ferry__fail(FERRY_MALFORMED,
                           "descriptor magic mismatch: got %02x %02x %02x %02x, expected 46 52 "
                           "59 44 (\"FRYD\")",
                           p[0], p[1], p[2], p[3]);
    uint16_t version = ferry__get_le16(p + OFF_VERSION);
    if (version != DESC_VERSION)
        return ferry__fail(FERRY_MALFORMED, "descriptor version %u is not supported (expected %u)",
                           version, DESC_VERSION);
    uint16_t size = ferry__get_le16(p + OFF_SIZE);
    if (size != FERRY_DESCRIPTOR_SIZE)
        return ferry__fail(FERRY_MALFORMED, "descriptor size field %u is wrong (expected %d)", size,
                           FERRY_DESCRIPTOR_SIZE);
    uint32_t stored = ferry__get_le32(p + OFF_CHECKSUM);
    uint32_t computed = ferry__crc32c(p, OFF_CHECKSUM);
    if (stored != computed)
        return ferry__fail(FERRY_MALFORMED,
                           "descriptor checksum mismatch: stored 0x%08x, computed 0x%08x", stored,
                           computed);
    return FERRY_OK;
}

static ferry_status check_reserved(const uint8_t *p)
{
    for (size_t r = 0; r < sizeof(reserved_ranges) / sizeof(reserved_ranges[0]); r++)
        for (unsigned i = reserved_ranges[r].start; i < reserved_ranges[r].end; i++)
            if (p[i] != 0)
                return ferry__fail(FERRY_MALFORMED,
                                   "descriptor reserved byte at offset %u is 0x%02x (must be 0)", i,
                                   p[i]);
    return FERRY_OK;
}

static void get_tensor(const uint8_t *p, ferry_tensor *t)
{
    t->dtype_code = p[OFF_DTYPE_CODE];
    t->dtype_bits = p[OFF_DTYPE_BITS];
    t->dtype_lanes = ferry__get_le16(p + OFF_DTYPE_LANES);
    t->ndim = p[OFF_NDIM];
    for (unsigned i = 0; i < FERRY_MAX_NDIM; i++)
        t->shape[i] = (int64_t)ferry__get_le64(p + OFF_SHAPE + 8 * i);
}

static void get_fields(const uint8_t *p, ferry_descriptor *d)
{
    d->backend = p[OFF_BACKEND];
    d->flags = p[OFF_FLAGS];
    d->consumer_count = ferry__get_le16(p + OFF_CONSUMERS);
    d->max_inflight = ferry__get_le32(p + OFF_MAX_INFLIGHT);
    d->slot = ferry__get_le32(p + OFF_SLOT);
    d->generation = ferry__get_le32(p + OFF_GENERATION);
    d->offset = ferry__get_le64(p + OFF_OFFSET);
    d->length = ferry__get_le64(p + OFF_LENGTH);
    d->pool_size = ferry__get_le64(p + OFF_POOL_SIZE);
    memcpy(d->pool_id, p + OFF_POOL_ID, sizeof(d->pool_id));
    memcpy(d->broker, p + OFF_BROKER, sizeof(d->broker));
    d->producer_pid = ferry__get_le32(p + OFF_PID);
    d->device = (int32_t)ferry__get_le32(p + OFF_DEVICE);
    memcpy(d->handle, p + OFF_HANDLE, sizeof(d->handle));
    get_tensor(p, &d->tensor);
    d->part_index = ferry__get_le32(p + OFF_PART_INDEX);
    d->part_count = ferry__get_le32(p + OFF_PART_COUNT);
}

ferry_status ferry_descriptor_decode(const void *buf, size_t len, ferry_descriptor *desc)
{
    ferry_descriptor d;
    if (!buf || !desc)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "ferry_descriptor_decode: %s is NULL",
                           !buf ? "buf" : "desc");
    ferry_status rc = check_envelope(buf, len);
    if (rc == FERRY_OK)
        rc = check_reserved(buf);
    if (rc != FERRY_OK)
        return rc;
    memset(&d, 0, sizeof(d));
    get_fields(buf, &d);
    rc = check_fields(&d, FERRY_MALFORMED);
    if (rc != FERRY_OK)
        return rc;
    ferry__clear_error();
    *desc = d;
    return FERRY_OK;
}

ferry_status ferry__desc_inside_lease(const ferry_descriptor *d, uint64_t offset, uint64_t length)
{
    if (ferry__range_inside(d->offset, d->length, offset, length))
        return FERRY_OK;
    return ferry__fail(FERRY_MISMATCH,
                       "descriptor range [%llu, +%llu) is not inside its lease (slot=%u, "
                       "generation=%u), which holds [%llu, +%llu)",
                       (unsigned long long)d->offset, (unsigned long long)d->length, d->slot,
                       d->generation, (unsigned long long)offset, (unsigned long long)length);
}
