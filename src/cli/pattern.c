/* The deterministic payload of `ferry bench`: item sizes, base patterns and item stamps.
 *
 * Each item i uses base pattern key = i % ring, a splitmix64 stream keyed by (seed, key),
 * and carries one stamp word keyed by (seed, i) at the start of every BENCH_STAMP_STRIDE
 * bytes. The producer pre-generates the ring once and only stamps per item; consumers
 * generate the same ring themselves and check every byte of what they received. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

uint64_t cli_mix64(uint64_t x)
{
    x += GOLDEN;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t bench_item_size(uint64_t seed, uint64_t lo, uint64_t hi, uint64_t item)
{
    if (lo >= hi)
        return lo;
    uint64_t r = cli_mix64(cli_mix64(seed ^ 0x51ee5eedull) ^ (item * GOLDEN));
    double u = (double)(r >> 11) / (double)((1ull << 53) - 1); /* [0, 1] */
    double v = exp(log((double)lo) + u * (log((double)hi) - log((double)lo)));
    uint64_t s = (uint64_t)llround(v);
    s = s < lo ? lo : s > hi ? hi : s;
    uint64_t s4 = s & ~3ull;
    if (s4 < lo)
        s4 += 4;
    return s4 >= lo && s4 <= hi ? s4 : s;
}

uint32_t bench_item_key(uint64_t item, uint32_t ring)
{
    return (uint32_t)(item % ring);
}

void bench_pattern_fill(uint8_t *buf, uint64_t bytes, uint64_t seed, uint64_t key)
{
    uint64_t state = cli_mix64(seed ^ cli_mix64(key + 0xba5eull));
    uint64_t off = 0;
    for (; off + 8 <= bytes; off += 8) {
        uint64_t w = cli_mix64(state += GOLDEN);
        memcpy(buf + off, &w, 8);
    }
    if (off < bytes) {
        uint64_t w = cli_mix64(state += GOLDEN);
        memcpy(buf + off, &w, bytes - off);
    }
}

static uint64_t stamp_word(uint64_t seed, uint64_t item, uint64_t block)
{
    return cli_mix64(cli_mix64(seed ^ 0x57a3bull) ^ (item * GOLDEN) ^ (block << 40) ^ block);
}

/* Bytes of the stamp at off: 8, or fewer in a last block shorter than that. Every block of
 * the item gets one, so no stamp of an earlier, larger item survives in the buffer. */
static uint64_t stamp_len(uint64_t off, uint64_t size)
{
    return size - off < 8 ? size - off : 8;
}

void bench_pattern_stamp(uint8_t *buf, uint64_t size, uint64_t seed, uint64_t item)
{
    for (uint64_t off = 0; off < size; off += BENCH_STAMP_STRIDE) {
        uint64_t w = stamp_word(seed, item, off / BENCH_STAMP_STRIDE);
        memcpy(buf + off, &w, stamp_len(off, size));
    }
}

static uint64_t first_difference(const uint8_t *a, const uint8_t *b, uint64_t n)
{
    uint64_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* The first byte of got[0, n) that differs from want (got is at base_off in the item). */
static int64_t mismatch(const uint8_t *got, const uint8_t *want, uint64_t base_off, uint64_t n,
                        uint8_t *got_byte, uint8_t *want_byte)
{
    uint64_t i = first_difference(got, want, n);
    *got_byte = got[i];
    *want_byte = want[i];
    return (int64_t)(base_off + i);
}

int64_t bench_pattern_verify(const uint8_t *got, const uint8_t *base, uint64_t size, uint64_t seed,
                             uint64_t item, uint8_t *got_byte, uint8_t *want_byte)
{
    for (uint64_t off = 0; off < size; off += BENCH_STAMP_STRIDE) {
        uint64_t end = size - off < BENCH_STAMP_STRIDE ? size : off + BENCH_STAMP_STRIDE;
        uint64_t n = stamp_len(off, size), from = off + n;
        uint8_t w[8];
        uint64_t v = stamp_word(seed, item, off / BENCH_STAMP_STRIDE);
        memcpy(w, &v, 8);
        if (memcmp(got + off, w, n) != 0)
            return mismatch(got + off, w, off, n, got_byte, want_byte);
        if (from < end && memcmp(got + from, base + from, end - from) != 0)
            return mismatch(got + from, base + from, from, end - from, got_byte, want_byte);
    }
    return -1;
}

int bench_patterns_create(bench_patterns *p, uint32_t count, uint64_t bytes, uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    p->buf = calloc(count, sizeof(*p->buf));
    if (!p->buf)
        return -1;
    p->count = count;
    p->bytes = bytes;
    for (uint32_t k = 0; k < count; k++) {
        p->buf[k] = aligned_alloc(64, (bytes + 63) & ~63ull);
        if (!p->buf[k]) {
            bench_patterns_destroy(p);
            return -1;
        }
        bench_pattern_fill(p->buf[k], bytes, seed, k);
    }
    return 0;
}

void bench_patterns_destroy(bench_patterns *p)
{
    if (p->buf)
        for (uint32_t k = 0; k < p->count; k++)
            free(p->buf[k]);
    free(p->buf);
    memset(p, 0, sizeof(*p));
}
