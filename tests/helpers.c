#include <string.h>

#include "helpers.h"

static uint64_t th_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

void th_fill(void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1, v;
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v = th_next(&s);
        memcpy(p + i, &v, 8);
    }
    v = th_next(&s);
    memcpy(p + i, &v, n - i);
}

int th_check(const void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1, v;
    const unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v = th_next(&s);
        if (memcmp(p + i, &v, 8) != 0)
            return 0;
    }
    v = th_next(&s);
    return memcmp(p + i, &v, n - i) == 0;
}
