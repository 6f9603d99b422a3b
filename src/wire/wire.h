/* Wire helpers: CRC-32C, explicit little-endian byte order and the shared tensor rules. */
#ifndef FERRY_WIRE_WIRE_H
#define FERRY_WIRE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

/* CRC-32C (Castagnoli, reflected 0x82F63B78, init and final xor 0xFFFFFFFF) of buf. */
uint32_t ferry__crc32c(const void *buf, size_t len);

/* The portable table-driven CRC-32C (what ferry__crc32c falls back to). */
uint32_t ferry__crc32c_table(const void *buf, size_t len);

/* 1 if ferry__crc32c uses the CPU's CRC-32C instructions (SSE4.2 on x86-64, the CRC32
 * extension on aarch64), 0 if it uses the table. */
int ferry__crc32c_uses_hw(void);

/* Checks a tensor's dtype and shape[0, ndim) and computes its size in bytes. On failure
 * returns status (with a message naming the problem, prefixed by what) and leaves *nbytes
 * untouched. Entries of shape from ndim on are not looked at. */
ferry_status ferry__tensor_size(const ferry_tensor *tensor, ferry_status status, const char *what,
                                uint64_t *nbytes);

/* 1 if [offset, offset + length) lies inside [outer, outer + outer_length), computed without
 * overflow for any values. */
static inline int ferry__range_inside(uint64_t offset, uint64_t length, uint64_t outer,
                                      uint64_t outer_length)
{
    return offset >= outer && length <= outer_length && offset - outer <= outer_length - length;
}

/* FERRY_OK if the descriptor's range lies inside its lease's extent [offset, offset + length);
 * else MISMATCH, naming both (a forged or corrupted descriptor). */
ferry_status ferry__desc_inside_lease(const ferry_descriptor *d, uint64_t offset, uint64_t length);

/* Bytes of one element of a tensor whose dtype passed ferry__tensor_size. */
static inline uint64_t ferry__tensor_elem_bytes(const ferry_tensor *tensor)
{
    return (uint64_t)tensor->dtype_bits * tensor->dtype_lanes / 8u;
}

static inline void ferry__put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void ferry__put_le32(uint8_t *p, uint32_t v)
{
    ferry__put_le16(p, (uint16_t)v);
    ferry__put_le16(p + 2, (uint16_t)(v >> 16));
}

static inline void ferry__put_le64(uint8_t *p, uint64_t v)
{
    ferry__put_le32(p, (uint32_t)v);
    ferry__put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t ferry__get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t ferry__get_le32(const uint8_t *p)
{
    return (uint32_t)ferry__get_le16(p) | (uint32_t)ferry__get_le16(p + 2) << 16;
}

static inline uint64_t ferry__get_le64(const uint8_t *p)
{
    return (uint64_t)ferry__get_le32(p) | (uint64_t)ferry__get_le32(p + 4) << 32;
}

/* Lowercase hex of n bytes into out (2n digits and a NUL). */
static inline void ferry__hex_put(const uint8_t *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 0x0f];
    }
    out[2 * n] = '\0';
}

static inline int ferry__hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Parses exactly 2n hex digits of text into bytes; 0 on success, -1 otherwise. */
static inline int ferry__hex_get(const char *text, size_t n, uint8_t *bytes)
{
    for (size_t i = 0; i < n; i++) {
        int hi = ferry__hex_digit(text[2 * i]),
            lo = hi < 0 ? -1 : ferry__hex_digit(text[2 * i + 1]);
        if (lo < 0)
            return -1;
        bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

#endif
