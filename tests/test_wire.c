/* The descriptor wire format (docs/wire-format.md): encoder, decoder, CRC-32C, tensors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "ferry.h"
#include "wire/wire.h"

#define DSIZE    FERRY_DESCRIPTOR_SIZE
#define SENTINEL 0xA5

/* ---- fixtures ------------------------------------------------------------------------ */

/* The worked example of docs/wire-format.md, byte for byte. */
static const uint8_t example_bytes[DSIZE] = {
    0x46, 0x52, 0x59, 0x44, 0x01, 0x00, 0x00, 0x01, 0x01, 0x02, 0x02, 0x00, 0x40, 0x00, 0x00, 0x00,
    0x05, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x60, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
    0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf,
    0x92, 0x10, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x8f, 0x7a, 0xb8, 0xa4,
};

static ferry_descriptor example_desc(void)
{
    ferry_descriptor d;
    memset(&d, 0, sizeof(d));
    d.backend = FERRY_BACKEND_HOST;
    d.flags = FERRY_DESC_FLAG_MULTI;
    d.consumer_count = 2;
    d.max_inflight = 64;
    d.slot = 5;
    d.generation = 3;
    d.offset = 4096;
    d.length = 96;
    d.pool_size = 1u << 20;
    for (int i = 0; i < 16; i++) {
        d.pool_id[i] = (uint8_t)(0xa0 + i);
        d.broker[i] = (uint8_t)(0xb0 + i);
    }
    d.producer_pid = 4242;
    d.device = -1;
    d.tensor.dtype_code = FERRY_DTYPE_FLOAT;
    d.tensor.dtype_bits = 32;
    d.tensor.dtype_lanes = 1;
    d.tensor.ndim = 3;
    d.tensor.shape[0] = 2;
    d.tensor.shape[1] = 3;
    d.tensor.shape[2] = 4;
    return d;
}

static void assert_tensor_equal(const ferry_tensor *a, const ferry_tensor *b)
{
    assert_int_equal(a->dtype_code, b->dtype_code);
    assert_int_equal(a->dtype_bits, b->dtype_bits);
    assert_int_equal(a->dtype_lanes, b->dtype_lanes);
    assert_int_equal(a->ndim, b->ndim);
    for (int i = 0; i < FERRY_MAX_NDIM; i++)
        assert_int_equal(a->shape[i], b->shape[i]);
}

static void assert_desc_equal(const ferry_descriptor *a, const ferry_descriptor *b)
{
    assert_int_equal(a->backend, b->backend);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->consumer_count, b->consumer_count);
    assert_int_equal(a->max_inflight, b->max_inflight);
    assert_int_equal(a->slot, b->slot);
    assert_int_equal(a->generation, b->generation);
    assert_int_equal(a->offset, b->offset);
    assert_int_equal(a->length, b->length);
    assert_int_equal(a->pool_size, b->pool_size);
    assert_memory_equal(a->pool_id, b->pool_id, sizeof(a->pool_id));
    assert_memory_equal(a->broker, b->broker, sizeof(a->broker));
    assert_int_equal(a->producer_pid, b->producer_pid);
    assert_int_equal(a->device, b->device);
    assert_memory_equal(a->handle, b->handle, sizeof(a->handle));
    assert_tensor_equal(&a->tensor, &b->tensor);
}

/* Recomputes the checksum, so that a field rule rather than the CRC rejects a change. */
static void reseal(uint8_t *b)
{
    ferry__put_le32(b + 252, ferry__crc32c(b, 252));
}

/* Decodes len bytes expecting MALFORMED and an untouched output; checks the message. */
static void expect_malformed_len(const uint8_t *b, size_t len, const char *needle)
{
    ferry_descriptor out, sentinel;
    memset(&out, SENTINEL, sizeof(out));
    memset(&sentinel, SENTINEL, sizeof(sentinel));
    assert_int_equal(ferry_descriptor_decode(b, len, &out), FERRY_MALFORMED);
    assert_memory_equal(&out, &sentinel, sizeof(out));
    if (needle && !strstr(ferry_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", ferry_last_error(), needle);
}

static void expect_malformed(const uint8_t *b, const char *needle)
{
    expect_malformed_len(b, DSIZE, needle);
}

/* ---- random valid descriptors ---------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

static void rng_bytes(uint64_t *s, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_next(s);
}

static void random_dtype(uint64_t *s, ferry_tensor *t)
{
    static const uint16_t lane_step[8] = {1, 8, 4, 8, 2, 8, 4, 8}; /* 8 / gcd(bits, 8) */
    t->dtype_code = (uint8_t)rng_below(s, FERRY_DTYPE_BOOL + 1);
    t->dtype_bits = (uint8_t)(1 + rng_below(s, 255));
    t->dtype_lanes = (uint16_t)(lane_step[t->dtype_bits % 8] * (1 + rng_below(s, 4)));
    if (t->dtype_code == FERRY_DTYPE_BOOL)
        t->dtype_bits = 8;
}

static void random_tensor(uint64_t *s, ferry_tensor *t)
{
    random_dtype(s, t);
    t->ndim = (uint8_t)rng_below(s, FERRY_MAX_NDIM + 1);
    for (int i = 0; i < t->ndim; i++)
        t->shape[i] = rng_below(s, 16) == 0 ? 0 : (int64_t)(1 + rng_below(s, 6));
}

static void random_identity(uint64_t *s, ferry_descriptor *d)
{
    rng_bytes(s, d->pool_id, sizeof(d->pool_id));
    d->pool_id[rng_below(s, 16)] |= 1;
    d->producer_pid = (uint32_t)rng_next(s);
    if (d->backend == FERRY_BACKEND_HOST) {
        rng_bytes(s, d->broker, sizeof(d->broker));
        d->broker[rng_below(s, 16)] |= 1;
        d->device = -1;
        d->flags = (uint8_t)(rng_next(s) & FERRY_DESC_FLAG_MULTI);
        return;
    }
    if (rng_below(s, 2))
        rng_bytes(s, d->broker, sizeof(d->broker));
    rng_bytes(s, d->handle, sizeof(d->handle));
    d->device = (int32_t)rng_below(s, 8);
    d->flags = (uint8_t)(rng_next(s) & (FERRY_DESC_FLAG_DEVICE_CONTROL | FERRY_DESC_FLAG_MULTI));
}

static void random_lease(uint64_t *s, ferry_descriptor *d)
{
    d->consumer_count = (uint16_t)(1 + rng_below(s, 0xFFFF));
    d->max_inflight = rng_below(s, 8) == 0 ? UINT32_MAX : (uint32_t)(1 + rng_below(s, 1u << 20));
    d->slot = (uint32_t)rng_below(s, d->max_inflight);
    d->generation = (uint32_t)(1 + rng_below(s, 0x7FFFFFFF));
}

static ferry_descriptor random_desc(uint64_t *s)
{
    ferry_descriptor d;
    uint64_t nbytes;
    memset(&d, 0, sizeof(d));
    d.backend = (uint8_t)(1 + rng_below(s, 3));
    random_lease(s, &d);
    random_identity(s, &d);
    random_tensor(s, &d.tensor);
    assert_int_equal(ferry_tensor_nbytes(&d.tensor, &nbytes), FERRY_OK);
    d.length = nbytes;
    d.offset = ferry__tensor_elem_bytes(&d.tensor) * rng_below(s, 1u << 20);
    d.pool_size = d.offset + d.length + rng_below(s, 1u << 20) + 1;
    return d;
}

/* ---- CRC and byte order -------------------------------------------------------------- */

static void test_crc32c_vectors(void **state)
{
    (void)state;
    uint8_t buf[32];
    assert_int_equal(ferry__crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(ferry__crc32c("", 0), 0);
    memset(buf, 0, sizeof(buf)); /* RFC 3720, B.4 */
    assert_int_equal(ferry__crc32c(buf, sizeof(buf)), 0x8A9136AAu);
    memset(buf, 0xFF, sizeof(buf));
    assert_int_equal(ferry__crc32c(buf, sizeof(buf)), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(ferry__crc32c(buf, sizeof(buf)), 0x46DD794Eu);
    assert_int_equal(ferry__crc32c_table("123456789", 9), 0xE3069283u);
}

/* The hardware path (where the CPU has one) and the table agree at every length and
 * alignment. */
static void test_crc32c_paths_agree(void **state)
{
    (void)state;
    uint8_t buf[300];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    for (size_t start = 0; start < 9; start++)
        for (size_t len = 0; start + len <= sizeof(buf); len += 1 + len / 8)
            assert_int_equal(ferry__crc32c(buf + start, len),
                             ferry__crc32c_table(buf + start, len));
}

/* Where the CPU is known to have CRC-32C instructions (the aarch64 check runs under an
 * emulated CPU that has the CRC32 extension and sets FERRY_TEST_EXPECT_HW_CRC=1), the
 * hardware path is the one taken, so that the test above compared it with the table. */
static void test_crc32c_hw_path(void **state)
{
    (void)state;
    const char *expect = getenv("FERRY_TEST_EXPECT_HW_CRC");
    print_message("CRC-32C path: %s\n", ferry__crc32c_uses_hw() ? "hardware" : "table");
    if (expect && strcmp(expect, "1") == 0)
        assert_int_equal(ferry__crc32c_uses_hw(), 1);
}

static void test_byte_order(void **state)
{
    (void)state;
    uint8_t b[8];
    static const uint8_t want[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    ferry__put_le64(b, 0x0102030405060708ull);
    assert_memory_equal(b, want, 8);
    assert_int_equal(ferry__get_le64(b), 0x0102030405060708ull);
    assert_int_equal(ferry__get_le32(b), 0x05060708u);
    assert_int_equal(ferry__get_le16(b), 0x0708u);
    ferry__put_le32(b, 0xDEADBEEFu);
    assert_int_equal(b[0], 0xEF);
    assert_int_equal(b[3], 0xDE);
    ferry__put_le16(b, 0xCAFEu);
    assert_int_equal(b[0], 0xFE);
    assert_int_equal(b[1], 0xCA);
}

/* ---- encode / decode of valid descriptors --------------------------------------------- */

static void test_worked_example(void **state)
{
    (void)state;
    ferry_descriptor d = example_desc(), back;
    uint8_t b[DSIZE];
    assert_int_equal(ferry_descriptor_encode(&d, b), FERRY_OK);
    assert_memory_equal(b, example_bytes, DSIZE);
    assert_int_equal(ferry_descriptor_decode(example_bytes, DSIZE, &back), FERRY_OK);
    assert_string_equal(ferry_last_error(), "");
    assert_desc_equal(&back, &d);
}

static void round_trip(const ferry_descriptor *d)
{
    uint8_t b[DSIZE], again[DSIZE];
    ferry_descriptor back;
    if (ferry_descriptor_encode(d, b) != FERRY_OK)
        fail_msg("encode: %s", ferry_last_error());
    if (ferry_descriptor_decode(b, DSIZE, &back) != FERRY_OK)
        fail_msg("decode: %s", ferry_last_error());
    assert_desc_equal(&back, d);
    assert_int_equal(ferry_descriptor_encode(&back, again), FERRY_OK);
    assert_memory_equal(again, b, DSIZE);
}

static void test_round_trip_random(void **state)
{
    (void)state;
    uint64_t seed = 0x5EED0F00DULL;
    for (int i = 0; i < 20000; i++) {
        ferry_descriptor d = random_desc(&seed);
        round_trip(&d);
    }
}

static void test_round_trip_edges(void **state)
{
    (void)state;
    ferry_descriptor d = example_desc();
    d.tensor.ndim = 0; /* scalar */
    memset(d.tensor.shape, 0, sizeof(d.tensor.shape));
    d.length = 4;
    round_trip(&d);
    d.tensor.ndim = 3; /* empty tensor at the very end of the pool, huge other dims */
    d.tensor.shape[0] = INT64_MAX;
    d.tensor.shape[2] = INT64_MAX;
    d.length = 0;
    d.offset = d.pool_size;
    round_trip(&d);
    d = example_desc();
    d.generation = 0x7FFFFFFF;
    d.max_inflight = UINT32_MAX;
    d.slot = UINT32_MAX - 1;
    d.consumer_count = UINT16_MAX;
    d.offset = d.pool_size - d.length; /* exactly fills the pool */
    round_trip(&d);
}

static void test_round_trip_gpu(void **state)
{
    (void)state;
    ferry_descriptor d = example_desc();
    d.backend = FERRY_BACKEND_CUDA_VMM;
    d.flags = FERRY_DESC_FLAG_DEVICE_CONTROL | FERRY_DESC_FLAG_MULTI;
    memset(d.broker, 0, sizeof(d.broker)); /* allowed for GPU backends */
    memset(d.handle, 0xEE, sizeof(d.handle));
    d.device = 0;
    round_trip(&d);
    d.backend = FERRY_BACKEND_CUDA_IPC;
    d.device = INT32_MAX;
    round_trip(&d);
}

/* ---- envelope rejections ------------------------------------------------------------- */

static void test_reject_lengths(void **state)
{
    (void)state;
    uint8_t b[DSIZE + 1];
    memcpy(b, example_bytes, DSIZE);
    b[DSIZE] = 0;
    for (size_t len = 0; len < DSIZE; len++)
        expect_malformed_len(b, len, NULL);
    expect_malformed_len(b, DSIZE + 1, "got 257 bytes, expected 256");
    expect_malformed_len(b, 255, "got 255 bytes, expected 256");
    expect_malformed_len(b, 0, "got 0 bytes");
}

static void test_reject_bit_flips(void **state)
{
    (void)state;
    uint8_t b[DSIZE];
    for (int bit = 0; bit < DSIZE * 8; bit++) {
        memcpy(b, example_bytes, DSIZE);
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        expect_malformed(b, NULL);
    }
}

static void test_reject_checksum(void **state)
{
    (void)state;
    uint8_t b[DSIZE];
    memcpy(b, example_bytes, DSIZE);
    b[100] ^= 0x10; /* inside the handle: only the checksum can notice */
    expect_malformed(b, "descriptor checksum mismatch: stored 0xa4b87a8f, computed 0x");
    memcpy(b, example_bytes, DSIZE);
    b[255] ^= 0x01;
    expect_malformed(b, "stored 0xa5b87a8f, computed 0xa4b87a8f");
}

static void test_reject_envelope_fields(void **state)
{
    (void)state;
    uint8_t b[DSIZE];
    memcpy(b, example_bytes, DSIZE);
    b[3] = 'E';
    reseal(b);
    expect_malformed(b, "magic mismatch: got 46 52 59 45");
    static const uint16_t versions[] = {0, 2, 0x100, 0xFFFF};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        memcpy(b, example_bytes, DSIZE);
        ferry__put_le16(b + 4, versions[i]);
        reseal(b);
        expect_malformed(b, "version");
    }
    static const uint16_t sizes[] = {0, 255, 257, 512, 1};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        memcpy(b, example_bytes, DSIZE);
        ferry__put_le16(b + 6, sizes[i]);
        reseal(b);
        expect_malformed(b, "size field");
    }
}

static void test_reject_reserved(void **state)
{
    (void)state;
    uint8_t b[DSIZE];
    for (int off = 157; off < 252; off++) {
        if (off == 160)
            off = 232; /* skip the shape and the parts */
        memcpy(b, example_bytes, DSIZE);
        b[off] = 0x40;
        reseal(b);
        char needle[64];
        snprintf(needle, sizeof(needle), "reserved byte at offset %d is 0x40", off);
        expect_malformed(b, needle);
    }
}

/* ---- field-rule rejections (valid checksum) ------------------------------------------ */

struct patch {
    unsigned off, width; /* width 1, 2, 4 or 8; 0 ends the list */
    uint64_t value;
};

struct field_case {
    const char *needle;
    struct patch p[3];
};

#define SHAPE(i) (160 + 8 * (i))

static const struct field_case field_cases[] = {
    {"part 0 of 2 is invalid", {{9, 1, 0}, {228, 4, 2}}},              /* parts without MULTI */
    {"part 2 of 2 is invalid", {{9, 1, 2}, {224, 4, 2}, {228, 4, 2}}}, /* index >= count */
    {"part 0 of 1 is invalid", {{9, 1, 2}, {228, 4, 1}}},              /* one part is no pack */
    {"part 1 of 0 is invalid", {{9, 1, 2}, {224, 4, 1}}}, /* an index without a count */
    {"backend 0 is invalid", {{8, 1, 0}}},
    {"backend 4 is invalid", {{8, 1, 4}}},
    {"backend 255 is invalid", {{8, 1, 255}}},
    {"flags 0x12 have unknown bits 0x10", {{9, 1, 0x12}}},
    {"unknown bits 0x80", {{9, 1, 0x80}}},
    {"pool-only descriptor must have no lease", {{9, 1, 0x04}}},
    {"DEVICE_CONTROL or FABRIC is set for the host backend", {{9, 1, 0x01}}},
    {"DEVICE_CONTROL or FABRIC is set for the host backend", {{9, 1, 0x08}}},
    {"consumer_count is 0", {{10, 2, 0}}},
    {"max_inflight is 0", {{12, 4, 0}}},
    {"slot 64 is not below max_inflight 64", {{16, 4, 64}}},
    {"slot 4294967295 is not below", {{16, 4, UINT32_MAX}}},
    {"generation 0 is out of range", {{20, 4, 0}}},
    {"generation 2147483648 is out of range", {{20, 4, 0x80000000u}}},
    {"generation 4294967295 is out of range", {{20, 4, UINT32_MAX}}},
    {"offset 4098 is not a multiple of the element size 4", {{24, 8, 4098}}},
    {"length 95 does not match the tensor size 96", {{32, 8, 95}}},
    {"length 0 does not match", {{32, 8, 0}}},
    {"offset 1048484 + length 96 exceeds pool_size 1048576", {{24, 8, 1048484}}},
    {"exceeds pool_size", {{24, 8, 0xFFFFFFFFFFFFFFE0ull}}},
    {"exceeds pool_size", {{24, 8, 0xFFFFFFFFFFFFFFC0ull}, {40, 8, UINT64_MAX}}},
    {"exceeds pool_size 95", {{24, 8, 0}, {40, 8, 95}}},
    {"pool_size is 0", {{40, 8, 0}}},
    {"pool_id is all zero", {{48, 8, 0}, {56, 8, 0}}},
    {"broker name is all zero", {{64, 8, 0}, {72, 8, 0}}},
    {"device 0 must be -1 for the host backend", {{84, 4, 0}}},
    {"device -2 must be -1", {{84, 4, 0xFFFFFFFEu}}},
    {"handle is not all zero", {{88 + 63, 1, 1}}},
    {"handle is not all zero", {{88, 1, 0x80}}},
    {"device -1 is negative for backend cuda_ipc", {{8, 1, 2}}},
    {"device -5 is negative for backend cuda_vmm", {{8, 1, 3}, {84, 4, 0xFFFFFFFBu}}},
    {"dtype code 18 is unknown", {{152, 1, 18}}},
    {"dtype code 10 has 16 bits (expected 8)", {{152, 1, 10}, {153, 1, 16}}}, /* float8 */
    {"dtype code 255 is unknown", {{152, 1, 255}}},
    {"dtype bits is 0", {{153, 1, 0}}},
    {"dtype lanes is 0", {{154, 2, 0}}},
    {"bits*lanes = 12*1 is not a multiple of 8", {{153, 1, 12}}},
    {"bool dtype has 16 bits", {{152, 1, 6}, {153, 1, 16}}},
    {"bool dtype has 1 bits", {{152, 1, 6}, {153, 1, 1}, {154, 2, 8}}},
    {"ndim 9 exceeds 8", {{156, 1, 9}}},
    {"ndim 255 exceeds 8", {{156, 1, 255}}},
    {"shape[3] = 1 beyond ndim 3 is not zero", {{SHAPE(3), 8, 1}}},
    {"shape[7] = -1 beyond ndim 3", {{SHAPE(7), 8, UINT64_MAX}}},
    {"shape[0] = 5 beyond ndim 0", {{156, 1, 0}, {SHAPE(0), 8, 5}}},
    {"dimension 1 is negative (-3)", {{SHAPE(1), 8, (uint64_t)-3}}},
    {"dimension 0 is negative", {{SHAPE(0), 8, 0x8000000000000000ull}}},
    {"size overflows 64 bits", {{SHAPE(0), 8, 1ull << 32}, {SHAPE(1), 8, 1ull << 32}}},
    {"size overflows 64 bits", {{SHAPE(2), 8, INT64_MAX}}},
};

static void apply_patch(uint8_t *b, const struct patch *p)
{
    switch (p->width) {
    case 1:
        b[p->off] = (uint8_t)p->value;
        break;
    case 2:
        ferry__put_le16(b + p->off, (uint16_t)p->value);
        break;
    case 4:
        ferry__put_le32(b + p->off, (uint32_t)p->value);
        break;
    default:
        ferry__put_le64(b + p->off, p->value);
    }
}

static void test_reject_field_rules(void **state)
{
    (void)state;
    uint8_t b[DSIZE];
    for (size_t i = 0; i < sizeof(field_cases) / sizeof(field_cases[0]); i++) {
        memcpy(b, example_bytes, DSIZE);
        for (int k = 0; k < 3 && field_cases[i].p[k].width; k++)
            apply_patch(b, &field_cases[i].p[k]);
        reseal(b);
        expect_malformed(b, field_cases[i].needle);
    }
}

/* A decoded descriptor that breaks a rule would also be refused by the encoder. */
static void test_encode_rejects(void **state)
{
    (void)state;
    uint8_t b[DSIZE], sentinel[DSIZE];
    memset(sentinel, SENTINEL, DSIZE);
    for (int c = 0; c < 5; c++) {
        ferry_descriptor d = example_desc();
        if (c == 0)
            d.backend = FERRY_BACKEND_AUTO;
        else if (c == 1)
            d.generation = 0;
        else if (c == 2)
            d.length = 97;
        else if (c == 3)
            d.tensor.shape[5] = 2;
        else
            d.tensor.ndim = 9;
        memset(b, SENTINEL, DSIZE);
        assert_int_equal(ferry_descriptor_encode(&d, b), FERRY_INVALID_ARGUMENT);
        assert_memory_equal(b, sentinel, DSIZE);
        assert_non_null(strstr(ferry_last_error(), "descriptor "));
    }
}

static void test_null_arguments(void **state)
{
    (void)state;
    ferry_descriptor d = example_desc();
    uint8_t b[DSIZE];
    assert_int_equal(ferry_descriptor_encode(NULL, b), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_descriptor_encode(&d, NULL), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_descriptor_decode(NULL, DSIZE, &d), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_descriptor_decode(example_bytes, DSIZE, NULL), FERRY_INVALID_ARGUMENT);
}

/* ---- tensors and backends ------------------------------------------------------------ */

static ferry_tensor make_tensor(uint8_t code, uint8_t bits, uint16_t lanes, int ndim,
                                const int64_t *shape)
{
    ferry_tensor t;
    memset(&t, 0, sizeof(t));
    t.dtype_code = code;
    t.dtype_bits = bits;
    t.dtype_lanes = lanes;
    t.ndim = (uint8_t)ndim;
    for (int i = 0; i < ndim && i < FERRY_MAX_NDIM; i++)
        t.shape[i] = shape[i];
    return t;
}

static uint64_t nbytes_ok(ferry_tensor t)
{
    uint64_t n = 0;
    if (ferry_tensor_nbytes(&t, &n) != FERRY_OK)
        fail_msg("nbytes: %s", ferry_last_error());
    return n;
}

static void nbytes_bad(ferry_tensor t, const char *needle)
{
    uint64_t n = 12345;
    assert_int_equal(ferry_tensor_nbytes(&t, &n), FERRY_INVALID_ARGUMENT);
    assert_int_equal(n, 12345);
    if (!strstr(ferry_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", ferry_last_error(), needle);
}

static void test_tensor_bytes(void **state)
{
    (void)state;
    ferry_tensor t = ferry_tensor_bytes(1000);
    assert_int_equal(t.dtype_code, FERRY_DTYPE_UINT);
    assert_int_equal(t.dtype_bits, 8);
    assert_int_equal(t.dtype_lanes, 1);
    assert_int_equal(t.ndim, 1);
    assert_int_equal(t.shape[0], 1000);
    for (int i = 1; i < FERRY_MAX_NDIM; i++)
        assert_int_equal(t.shape[i], 0);
    assert_int_equal(nbytes_ok(t), 1000);
    assert_int_equal(nbytes_ok(ferry_tensor_bytes(0)), 0);
    assert_int_equal(nbytes_ok(ferry_tensor_bytes(INT64_MAX)), INT64_MAX);
    nbytes_bad(ferry_tensor_bytes(UINT64_MAX), "negative");
}

static void test_tensor_nbytes(void **state)
{
    (void)state;
    static const int64_t s234[] = {2, 3, 4}, s0[] = {5, 0, INT64_MAX}, sbig[] = {INT64_MAX, 2};
    static const int64_t s8[] = {1, 2, 3, 4, 1, 2, 3, 4};
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_FLOAT, 32, 1, 3, s234)), 96);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_FLOAT, 32, 1, 0, NULL)), 4);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_COMPLEX, 64, 2, 3, s234)), 384);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_INT, 4, 2, 3, s234)), 24);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_BOOL, 8, 1, 8, s8)), 576);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_BFLOAT, 16, 1, 3, s0)), 0);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_UINT, 8, 1, 2, sbig)), UINT64_MAX - 1);
    assert_string_equal(ferry_last_error(), "");
}

static void test_tensor_nbytes_errors(void **state)
{
    (void)state;
    static const int64_t s234[] = {2, 3, 4}, sneg[] = {2, -1}, sbig[] = {INT64_MAX, 2};
    static const int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1};
    static const int64_t s61[] = {1ll << 61};
    ferry_tensor t9 = make_tensor(FERRY_DTYPE_UINT, 8, 1, 8, s9);
    t9.ndim = 9;
    nbytes_bad(t9, "ndim 9 exceeds 8");
    nbytes_bad(make_tensor(FERRY_DTYPE_FLOAT, 32, 1, 2, sneg), "dimension 1 is negative (-1)");
    nbytes_bad(make_tensor(FERRY_DTYPE_FLOAT, 0, 1, 3, s234), "bits is 0");
    nbytes_bad(make_tensor(FERRY_DTYPE_FLOAT, 32, 0, 3, s234), "lanes is 0");
    nbytes_bad(make_tensor(FERRY_DTYPE_INT, 4, 1, 3, s234), "not a multiple of 8");
    nbytes_bad(make_tensor(FERRY_DTYPE_INT, 12, 3, 3, s234), "not a multiple of 8");
    nbytes_bad(make_tensor(18, 8, 1, 3, s234), "dtype code 18 is unknown");
    nbytes_bad(make_tensor(FERRY_DTYPE_FLOAT6_E2M3FN, 8, 1, 3, s234),
               "dtype code 15 has 8 bits (expected 6)");
    nbytes_bad(make_tensor(FERRY_DTYPE_FLOAT4_E2M1FN, 4, 1, 3, s234), "is not a multiple of 8");
    /* DLPack 1.1's float8 codes, and float4 two to a byte (lanes 2). */
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_FLOAT8_E4M3FN, 8, 1, 3, s234)), 24);
    assert_int_equal(nbytes_ok(make_tensor(FERRY_DTYPE_FLOAT4_E2M1FN, 4, 2, 3, s234)), 24);
    nbytes_bad(make_tensor(FERRY_DTYPE_BOOL, 1, 8, 3, s234), "bool dtype has 1 bits");
    nbytes_bad(make_tensor(FERRY_DTYPE_UINT, 16, 1, 2, sbig), "overflows");
    nbytes_bad(make_tensor(FERRY_DTYPE_UINT, 64, 1, 1, s61), "overflows");
    uint64_t n;
    ferry_tensor t = ferry_tensor_bytes(1);
    assert_int_equal(ferry_tensor_nbytes(NULL, &n), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_tensor_nbytes(&t, NULL), FERRY_INVALID_ARGUMENT);
}

static void test_backend_names(void **state)
{
    (void)state;
    static const char *const names[] = {"auto", "host", "cuda_ipc", "cuda_vmm"};
    for (int i = 0; i < 4; i++) {
        ferry_backend b = (ferry_backend)99;
        assert_string_equal(ferry_backend_name((ferry_backend)i), names[i]);
        assert_int_equal(ferry_backend_parse(names[i], &b), FERRY_OK);
        assert_int_equal(b, i);
    }
    assert_null(ferry_backend_name((ferry_backend)4));
    assert_null(ferry_backend_name((ferry_backend)-1));
    ferry_backend b = FERRY_BACKEND_CUDA_VMM;
    assert_int_equal(ferry_backend_parse("HOST", &b), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_backend_parse("", &b), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_backend_parse("cuda", &b), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "unknown backend \"cuda\""));
    assert_int_equal(b, FERRY_BACKEND_CUDA_VMM);
    assert_int_equal(ferry_backend_parse(NULL, &b), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_backend_parse("host", NULL), FERRY_INVALID_ARGUMENT);
}

/* ---- the seed corpus (written by scripts/gen-descriptor-corpus.py) -------------------- */

/* tests/corpus/descriptor, found next to this source file. */
static int corpus_dir(char *dir, size_t size)
{
    const char *slash = strrchr(__FILE__, '/');
    int n = slash ? snprintf(dir, size, "%.*s/corpus/descriptor", (int)(slash - __FILE__), __FILE__)
                  : snprintf(dir, size, "corpus/descriptor");
    return n > 0 && (size_t)n < size;
}

static void check_corpus_file(const char *dir, const char *name)
{
    char path[4096 + 512];
    uint8_t buf[1024];
    ferry_descriptor d;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    ferry_status st = ferry_descriptor_decode(buf, n, &d);
    if (strncmp(name, "valid-", 6) == 0 && st != FERRY_OK)
        fail_msg("%s: %s", name, ferry_last_error());
    if (strncmp(name, "invalid-", 8) == 0 && st != FERRY_MALFORMED)
        fail_msg("%s decoded (status %d)", name, st);
    if (strcmp(name, "valid-host-example.bin") == 0)
        assert_memory_equal(buf, example_bytes, DSIZE);
}

static void test_seed_corpus(void **state)
{
    (void)state;
    char dir[4096];
    DIR *d = NULL;
    struct dirent *e;
    int count = 0;
    if (!corpus_dir(dir, sizeof(dir)) || !(d = opendir(dir))) {
        print_message("corpus not found next to %s; skipped\n", __FILE__);
        skip();
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        check_corpus_file(dir, e->d_name);
        count++;
    }
    closedir(d);
    assert_true(count >= 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),       cmocka_unit_test(test_crc32c_paths_agree),
        cmocka_unit_test(test_crc32c_hw_path),       cmocka_unit_test(test_byte_order),
        cmocka_unit_test(test_worked_example),       cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_round_trip_edges),     cmocka_unit_test(test_round_trip_gpu),
        cmocka_unit_test(test_reject_lengths),       cmocka_unit_test(test_reject_bit_flips),
        cmocka_unit_test(test_reject_checksum),      cmocka_unit_test(test_reject_envelope_fields),
        cmocka_unit_test(test_reject_reserved),      cmocka_unit_test(test_reject_field_rules),
        cmocka_unit_test(test_encode_rejects),       cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_tensor_bytes),         cmocka_unit_test(test_tensor_nbytes),
        cmocka_unit_test(test_tensor_nbytes_errors), cmocka_unit_test(test_backend_names),
        cmocka_unit_test(test_seed_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
