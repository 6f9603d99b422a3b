/* The results region of `ferry bench`: one memfd the producer creates before it starts its
 * workers, holding the run's parameters, each worker's counters and progress words, and
 * the acknowledgement times of every item in every rank. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

typedef struct region_layout {
    size_t ranks;
    size_t ack[2];
    size_t reclaim;
    size_t total;
} region_layout;

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static region_layout layout_of(const bench_params *p)
{
    region_layout l;
    size_t table = align64((size_t)p->items * (size_t)p->consumers * sizeof(uint64_t));
    l.ranks = align64(sizeof(bench_header));
    l.ack[0] = l.ranks + align64((size_t)p->consumers * sizeof(bench_rank));
    l.ack[1] = l.ack[0] + table;
    l.reclaim = l.ack[1] + table;
    l.total = l.reclaim + align64(((size_t)p->reclaim_rounds + 1) * sizeof(uint64_t));
    return l;
}

static void attach_pointers(bench_region *r)
{
    region_layout l = layout_of(&r->hdr->params);
    uint8_t *b = r->base;
    r->ranks = (bench_rank *)(b + l.ranks);
    r->ack_ns[0] = (uint64_t *)(b + l.ack[0]);
    r->ack_ns[1] = (uint64_t *)(b + l.ack[1]);
    r->reclaim_ack_ns = (uint64_t *)(b + l.reclaim);
}

int bench_region_create(const bench_params *params, bench_region *r)
{
    region_layout l = layout_of(params);
    memset(r, 0, sizeof(*r));
    r->fd = memfd_create("ferry-bench-results", MFD_CLOEXEC);
    if (r->fd < 0 || (r->fd = bench_high_fd(r->fd)) < 0)
        return -1;
    if (ftruncate(r->fd, (off_t)l.total) != 0)
        goto fail;
    r->base = mmap(NULL, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (r->base == MAP_FAILED)
        goto fail;
    r->bytes = l.total;
    r->hdr = r->base;
    r->hdr->params = *params;
    r->hdr->params.magic = BENCH_MAGIC;
    r->hdr->params.region_bytes = l.total;
    attach_pointers(r);
    return 0;
fail:;
    int err = errno;
    close(r->fd);
    r->fd = -1;
    r->base = NULL;
    errno = err;
    return -1;
}

int bench_region_map(int fd, bench_region *r)
{
    struct stat st;
    memset(r, 0, sizeof(*r));
    r->fd = fd;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(bench_header))
        return -1;
    r->base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->base == MAP_FAILED) {
        r->base = NULL;
        return -1;
    }
    r->bytes = (size_t)st.st_size;
    r->hdr = r->base;
    if (r->hdr->params.magic != BENCH_MAGIC || r->hdr->params.region_bytes != r->bytes) {
        bench_region_unmap(r);
        errno = EINVAL;
        return -1;
    }
    attach_pointers(r);
    return 0;
}

void bench_region_unmap(bench_region *r)
{
    if (r->base)
        munmap(r->base, r->bytes);
    if (r->fd >= 0)
        close(r->fd);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

uint64_t *bench_ack_slot(const bench_region *r, int phase, uint64_t item, uint32_t rank)
{
    return &r->ack_ns[phase][item * r->hdr->params.consumers + rank];
}

void bench_note_progress(bench_region *r, int phase, uint32_t rank, uint32_t count)
{
    uint32_t *word = &r->ranks[rank].progress[phase];
    /* Store, then look for a sleeper: paired with the producer's flag-then-load. */
    __atomic_store_n(word, count, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->hdr->producer_waiting, __ATOMIC_SEQ_CST))
        cli_futex_wake(word);
}

const char *bench_phase_name(int phase)
{
    static const char *const names[BENCH_PHASES] = {"ferry", "floor", "reclaim"};
    return phase >= 0 && phase < BENCH_PHASES ? names[phase] : "?";
}
