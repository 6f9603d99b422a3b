/* The GPU bench's payload patterns, the spans a stream consumer samples, and the few CUDA
 * helpers both the producer and its workers use. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench_gpu.h"
#include "common/error.h"

#define GOLDEN       0x9e3779b97f4a7c15ull
#define SAMPLE       4096ull
#define SAMPLE_CHUNK (8ull << 20)
#define WHOLE_MAX    (1ull << 20)
#define FILL_STAGE   (16ull << 20) /* host staging for filling device buffers */
#define QUERY_SPIN   64            /* cuStreamQuery polls before the first short sleep */

/* ---- patterns ------------------------------------------------------------------------------ */

static uint64_t pattern_base(uint64_t seed, uint64_t key)
{
    return cli_mix64(seed ^ cli_mix64(key + 0x6b657967707531ull));
}

static uint64_t pattern_word(uint64_t base, uint64_t index)
{
    return cli_mix64(base + index * GOLDEN);
}

void gb_pattern_fill(uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed, uint64_t key)
{
    uint64_t base = pattern_base(seed, key);
    for (uint64_t i = 0; i < len;) {
        uint64_t at = off + i, w = pattern_word(base, at / 8), skip = at % 8;
        uint64_t n = 8 - skip < len - i ? 8 - skip : len - i;
        memcpy(buf + i, (const uint8_t *)&w + skip, n);
        i += n;
    }
}

int64_t gb_pattern_check(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t seed,
                         uint64_t key, uint8_t *got, uint8_t *want)
{
    uint64_t base = pattern_base(seed, key);
    for (uint64_t i = 0; i < len;) {
        uint64_t at = off + i, w = pattern_word(base, at / 8), skip = at % 8;
        uint64_t n = 8 - skip < len - i ? 8 - skip : len - i;
        const uint8_t *expect = (const uint8_t *)&w + skip;
        if (memcmp(buf + i, expect, n) != 0) {
            uint64_t k = 0;
            while (buf[i + k] == expect[k])
                k++;
            *got = buf[i + k];
            *want = expect[k];
            return (int64_t)(at + k);
        }
        i += n;
    }
    return -1;
}

uint64_t gb_next_key(uint64_t prev, uint64_t seed, uint64_t item)
{
    uint64_t step = 1 + cli_mix64(seed ^ (item * GOLDEN) ^ 0x6b6579ull) % (GB_KEYS - 1);
    return (prev + step) % GB_KEYS;
}

/* ---- sampled spans ------------------------------------------------------------------------- */

uint32_t gb_sample_spans(uint64_t seed, uint64_t item, uint64_t size, gb_span *spans)
{
    if (size <= WHOLE_MAX) {
        spans[0] = (gb_span){0, size};
        return 1;
    }
    uint32_t n = 0, most = GB_MAX_SPANS - 2;
    uint64_t chunk = SAMPLE_CHUNK;
    if ((size + chunk - 1) / chunk > most)
        chunk = (size + most - 1) / most;
    spans[n++] = (gb_span){0, SAMPLE};
    spans[n++] = (gb_span){size - SAMPLE, SAMPLE};
    for (uint64_t c = 0; c * chunk < size; c++) {
        uint64_t start = c * chunk, room = size - start < chunk ? size - start : chunk;
        if (room < SAMPLE)
            break;
        uint64_t r = cli_mix64(seed ^ cli_mix64(item * GOLDEN + c)) % (room - SAMPLE + 1);
        spans[n++] = (gb_span){start + (r & ~7ull), SAMPLE};
    }
    return n;
}

uint64_t gb_sample_bytes(uint64_t size)
{
    gb_span spans[GB_MAX_SPANS];
    uint32_t n = gb_sample_spans(0, 0, size, spans);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += spans[i].len;
    return total;
}

/* ---- CUDA helpers -------------------------------------------------------------------------- */

uint64_t gb_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

ferry_status gb_stream_wait(const ferry__cuda *cu, CUstream s, uint64_t timeout_ns,
                            const char *what)
{
    uint64_t start = cli_now_ns();
    for (unsigned spins = 0;; spins++) {
        CUresult rc = cu->cuStreamQuery(s);
        if (rc == CUDA_SUCCESS)
            return FERRY_OK;
        if (rc != CUDA_ERROR_NOT_READY)
            return ferry__cuda_fail(cu, "cuStreamQuery", rc);
        if (cli_now_ns() - start >= timeout_ns)
            return ferry__fail(FERRY_TIMEOUT, "%s did not finish within %llu ms", what,
                               (unsigned long long)(timeout_ns / 1000000));
        if (spins < QUERY_SPIN)
            sched_yield();
        else
            cli_sleep_ns(20000);
    }
}

ferry_status gb_fill_device(const ferry__cuda *cu, CUdeviceptr dst, uint64_t bytes, uint64_t seed,
                            uint64_t key)
{
    uint64_t stage = bytes < FILL_STAGE ? bytes : FILL_STAGE;
    uint8_t *buf = malloc(stage ? stage : 1);
    if (!buf)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory filling a device buffer");
    for (uint64_t off = 0; off < bytes; off += stage) {
        uint64_t n = bytes - off < stage ? bytes - off : stage;
        gb_pattern_fill(buf, off, n, seed, key);
        CUresult rc = cu->cuMemcpy(dst + off, (CUdeviceptr)(uintptr_t)buf, n);
        if (rc != CUDA_SUCCESS) {
            free(buf);
            return ferry__cuda_fail(cu, "cuMemcpy", rc);
        }
    }
    free(buf);
    return FERRY_OK;
}

ferry_status gb_register_flags(const ferry__cuda *cu, gb_region *r, CUdeviceptr *dev)
{
    FERRY_CU_TRY(
        cu, cuMemHostRegister,
        (r->flags, GB_FLAG_BYTES, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    CUresult rc = cu->cuMemHostGetDevicePointer(dev, r->flags, 0);
    if (rc != CUDA_SUCCESS) {
        cu->cuMemHostUnregister(r->flags);
        return ferry__cuda_fail(cu, "cuMemHostGetDevicePointer", rc);
    }
    return FERRY_OK;
}

ferry_status gb_alloc(const ferry__cuda *cu, CUdeviceptr *p, uint64_t bytes)
{
    FERRY_CU_TRY(cu, cuMemAlloc, (p, (size_t)bytes));
    return FERRY_OK;
}

void gb_free(const ferry__cuda *cu, CUdeviceptr *p)
{
    if (*p)
        cu->cuMemFree(*p);
    *p = 0;
}
