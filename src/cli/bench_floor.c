/* The floor of `ferry bench`: the same processes, channel, messages and verification, but
 * a plain shared ring of fixed slots instead of ferry's pool. The producer copies item i
 * into slot i % K and may reuse a slot once every consumer's progress word says it has
 * finished with the item that last held it; it sleeps on that word (futex) when it must
 * wait. Whatever ferry costs above this is ferry's overhead. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/cli.h"

uint64_t bench_floor_slots(int64_t pool_size, uint64_t slot_bytes, int64_t max_inflight)
{
    uint64_t k = pool_size > 0 ? (uint64_t)pool_size / slot_bytes : 0;
    if (max_inflight > 0 && k > (uint64_t)max_inflight)
        k = (uint64_t)max_inflight;
    return k < 2 ? 2 : k;
}

int bench_floor_create(bench_run *run)
{
    size_t bytes = (size_t)run->params.floor_bytes;
    int fd = memfd_create("ferry-bench-floor", MFD_CLOEXEC);
    if (fd < 0 || (fd = bench_high_fd(fd)) < 0)
        return bench_fail(run, "memfd for the floor failed: %s", strerror(errno));
    run->floor_fd = fd;
    if (ftruncate(fd, (off_t)bytes) != 0)
        return bench_fail(run, "sizing the floor ring to %zu bytes failed: %s", bytes,
                          strerror(errno));
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return bench_fail(run, "mapping the floor ring failed: %s", strerror(errno));
    run->floor_ring = p;
    return 0;
}

void bench_floor_destroy(bench_run *run)
{
    if (run->floor_ring)
        munmap(run->floor_ring, (size_t)run->params.floor_bytes);
    if (run->floor_fd >= 0)
        close(run->floor_fd);
    run->floor_ring = NULL;
    run->floor_fd = -1;
}

static int floor_item(bench_run *run, uint64_t item)
{
    const bench_params *p = &run->params;
    uint64_t size, slot = item % p->floor_slots;
    const uint8_t *src = bench_stage_item(run, item, &size);
    int waited = 0;
    bench_msg m;
    uint64_t t0 = cli_now_ns();
    /* The slot last held item - K: every consumer must be done with it. */
    if (item >= p->floor_slots && bench_wait_progress(run, BENCH_PHASE_FLOOR, run->consumers,
                                                      item - p->floor_slots + 1, &waited) != 0)
        return -1;
    memcpy(run->floor_ring + slot * p->floor_slot_bytes, src, size);
    memset(&m, 0, sizeof(m));
    m.type = BENCH_MSG_FLOOR;
    m.item = item;
    m.seed = p->seed;
    m.size = size;
    m.slot = slot;
    run->publish_ns[BENCH_PHASE_FLOOR][item] = t0;
    run->floor_waits += (uint64_t)waited;
    if (bench_send(run, run->consumers, &m) != 0)
        return -1;
    bench_progress(run, BENCH_PHASE_FLOOR, size);
    return 0;
}

int bench_floor_chunk(bench_run *run, uint64_t begin, uint64_t end)
{
    bench_chunk_start(run);
    for (uint64_t i = begin; i < end; i++)
        if (floor_item(run, i) != 0 || bench_check_workers_often(run) != 0)
            return -1;
    if (bench_wait_progress(run, BENCH_PHASE_FLOOR, run->consumers, end, NULL) != 0)
        return -1;
    bench_chunk_end(run, BENCH_PHASE_FLOOR);
    return 0;
}
