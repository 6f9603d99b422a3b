/* CRC-32C (Castagnoli): the SSE4.2 crc32 instruction where the CPU has it, otherwise
 * byte-at-a-time with a 256-entry table built once on first use. */
#include <pthread.h>
#include <string.h>

#include "wire/wire.h"

#define CRC32C_POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static uint32_t crc_of_byte(uint32_t byte)
{
    uint32_t c = byte;
    for (int bit = 0; bit < 8; bit++)
        c = (c & 1u) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    return c;
}

static int crc_use_hw;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++)
        crc_table[i] = crc_of_byte(i);
#if defined(__x86_64__)
    crc_use_hw = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(const uint8_t *p, size_t len)
{
    uint64_t crc = 0xFFFFFFFFu;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = __builtin_ia32_crc32di(crc, v);
    }
    uint32_t c = (uint32_t)crc;
    for (; len; p++, len--)
        c = __builtin_ia32_crc32qi(c, *p);
    return c ^ 0xFFFFFFFFu;
}
#endif

uint32_t ferry__crc32c_table(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t crc = 0xFFFFFFFFu;
    pthread_once(&crc_once, crc_table_init);
    for (size_t i = 0; i < len; i++)
        crc = crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

uint32_t ferry__crc32c(const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_table_init);
#if defined(__x86_64__)
    if (crc_use_hw)
        return crc_hw(buf, len);
#endif
    return ferry__crc32c_table(buf, len);
}
