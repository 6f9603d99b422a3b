/* CRC-32C (Castagnoli): the CPU's CRC-32C instructions where it has them (x86-64: SSE4.2
 * crc32; aarch64: the CRC32 extension's crc32c*, optional in Armv8.0, found through
 * getauxval(AT_HWCAP)), otherwise byte-at-a-time with a 256-entry table built once on first
 * use. Both hardware paths compute the same reflected CRC as the table. */
#include <pthread.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1ul << 7) /* arch/arm64/include/uapi/asm/hwcap.h */
#endif
#endif

#include "wire/wire.h"

#define CRC32C_POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed */

/* The hardware path: its target attribute and its 8-byte and 1-byte steps (the compilers'
 * builtins: clang's arm_acle.h declares __crc32cd only where the whole file is built for the
 * CRC32 extension). The 8-byte step reads little-endian words. */
#if defined(__x86_64__)
#define CRC_HW_TARGET  "sse4.2"
#define CRC_HW_8(c, v) ((uint32_t)__builtin_ia32_crc32di(c, v))
#define CRC_HW_1(c, b) __builtin_ia32_crc32qi(c, b)
#elif defined(__aarch64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && defined(__clang__)
#define CRC_HW_TARGET  "crc"
#define CRC_HW_8(c, v) __builtin_arm_crc32cd(c, v)
#define CRC_HW_1(c, b) __builtin_arm_crc32cb(c, b)
#elif defined(__aarch64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CRC_HW_TARGET  "+crc"
#define CRC_HW_8(c, v) __builtin_aarch64_crc32cx(c, v)
#define CRC_HW_1(c, b) __builtin_aarch64_crc32cb(c, b)
#endif

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static uint32_t crc_of_byte(uint32_t byte)
{
    uint32_t c = byte;
    for (int bit = 0; bit < 8; bit++)
        c = (c & 1u) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    return c;
}

#ifdef CRC_HW_TARGET
static int crc_use_hw;

/* Whether this CPU has the instructions crc_hw uses. */
static int crc_hw_supported(void)
{
#if defined(__x86_64__)
    return __builtin_cpu_supports("sse4.2");
#else
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
}

/* 8 bytes at a time, then the tail byte by byte (both instruction sets reflect the
 * polynomial as the table does, so the intermediate values agree). */
__attribute__((target(CRC_HW_TARGET))) static uint32_t crc_hw(const uint8_t *p, size_t len)
{
    uint32_t c = 0xFFFFFFFFu;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = CRC_HW_8(c, v);
    }
    for (; len; p++, len--)
        c = CRC_HW_1(c, *p);
    return c ^ 0xFFFFFFFFu;
}
#endif

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++)
        crc_table[i] = crc_of_byte(i);
#ifdef CRC_HW_TARGET
    crc_use_hw = crc_hw_supported();
#endif
}

uint32_t ferry__crc32c_table(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t crc = 0xFFFFFFFFu;
    pthread_once(&crc_once, crc_table_init);
    for (size_t i = 0; i < len; i++)
        crc = crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

int ferry__crc32c_uses_hw(void)
{
    pthread_once(&crc_once, crc_table_init);
#ifdef CRC_HW_TARGET
    return crc_use_hw;
#else
    return 0;
#endif
}

uint32_t ferry__crc32c(const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_table_init);
#ifdef CRC_HW_TARGET
    if (crc_use_hw)
        return crc_hw(buf, len);
#endif
    return ferry__crc32c_table(buf, len);
}
