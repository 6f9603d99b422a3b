/* --mode stream: the peer floor, what a consumer on another GPU can read from the producer's
 * GPU with no pool logic.
 *
 * For each distinct consumer GPU other than the producer's, the first rank on it times, after
 * GB_FLOOR_WARMUP untimed copies, gb_floor_copies() back-to-back cuMemcpyAsync of the item size
 * from the producer's floor buffer into its own buffer, on its own stream, with CLOCK_MONOTONIC
 * around one bounded wait for the stream. It opens that buffer through CUDA IPC with
 * CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, the way a ferry consumer maps the pool, so the copy takes
 * the path a consumer's read takes: the consumer GPU pulling over the link with peer access
 * enabled. (A copy between two GPUs in one process without cuCtxEnablePeerAccess, which the
 * driver layer does not load, would be staged through host memory.) GPUs are timed one after
 * the other, never concurrently. Reported as bytes read: size * copies / seconds. */
#include <string.h>

#include "cli/bench_gpu.h"

/* ---- the producer ------------------------------------------------------------------------- */

int gb_has_remote(const gb_run *run)
{
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->opt->devices[r] != run->opt->producer_device)
            return 1;
    return 0;
}

/* Whether rank is the first one on a GPU other than the producer's. */
static int times_peer_floor(const gb_run *run, uint32_t rank)
{
    int64_t device = run->opt->devices[rank];
    if (device == run->opt->producer_device)
        return 0;
    for (uint32_t r = 0; r < rank; r++)
        if (run->opt->devices[r] == device)
            return 0;
    return 1;
}

static int peer_floor(gb_run *run, gb_row *row, uint32_t rank)
{
    gb_msg m;
    memset(&m, 0, sizeof(m));
    m.type = GB_MSG_PEER;
    m.key = rank;
    m.iter = gb_floor_copies(run->opt, row->size);
    m.size = row->size;
    if (gb_send(run, run->consumers, &m) != 0 || gb_wait_progress(run, run->consumers, m.seq) != 0)
        return -1;
    const gb_rank *c = &run->region.ranks[rank];
    gb_peer *p = &row->peers[row->npeers++];
    p->device = (int)run->opt->devices[rank];
    p->copies = c->peer_copies;
    p->seconds = (double)c->peer_ns / 1e9;
    p->gbps = c->peer_ns ? (double)row->size * (double)c->peer_copies / (double)c->peer_ns : 0;
    return 0;
}

int gb_peer_floors(gb_run *run, gb_row *row)
{
    row->npeers = 0;
    for (uint32_t r = 0; r < run->consumers; r++)
        if (times_peer_floor(run, r) && peer_floor(run, row, r) != 0)
            return -1;
    return 0;
}

/* ---- the consumer ------------------------------------------------------------------------- */

static int peer_copies(gb_ws *w, uint64_t size, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        CUresult rc = w->cu->cuMemcpyAsync(w->dst, w->peer, size, w->stream);
        if (rc != CUDA_SUCCESS) {
            ferry__cuda_fail(w->cu, "cuMemcpyAsync", rc);
            return gw_fail(w, "the peer floor: %s", ferry_last_error());
        }
    }
    return gw_sync(w, "the peer floor");
}

int gw_on_peer(gb_ws *w, const gb_msg *m)
{
    if (m->key != w->rank)
        return 0;
    if (!w->p.has_floor || w->consumer || m->size > w->p.max_item || m->iter == 0)
        return gw_fail(w, "a peer floor the run did not prepare for");
    if (!w->peer && gw_open_floor(w) != 0)
        return -1;
    if (peer_copies(w, m->size, GB_FLOOR_WARMUP) != 0)
        return -1;
    uint64_t t0 = cli_now_ns();
    if (peer_copies(w, m->size, m->iter) != 0)
        return -1;
    w->me->peer_ns = cli_now_ns() - t0;
    w->me->peer_copies = m->iter;
    return 0;
}
