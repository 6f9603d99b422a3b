/* The ferry phase of `ferry bench`: publish every item into the pool and hand its
 * descriptor to every consumer. */
#include <string.h>

#include "cli/cli.h"

const uint8_t *bench_stage_item(bench_run *run, uint64_t item, uint64_t *size)
{
    const bench_params *p = &run->params;
    uint8_t *buf = run->patterns.buf[bench_item_key(item, run->patterns.count)];
    *size = bench_item_size(p->seed, p->size_lo, p->size_hi, item);
    bench_pattern_stamp(buf, *size, p->seed, item);
    return buf;
}

static void fill_msg(bench_msg *m, uint32_t type, const bench_run *run, uint64_t item,
                     uint64_t size)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->item = item;
    m->seed = run->params.seed;
    m->size = size;
}

static int publish_item(bench_run *run, uint64_t item)
{
    uint64_t size;
    const uint8_t *src = bench_stage_item(run, item, &size);
    ferry_tensor t = ferry_tensor_bytes(size);
    ferry_descriptor d;
    bench_msg m;
    /* The item's bytes are ready: the handoff starts here. */
    uint64_t t0 = cli_now_ns();
    if (ferry_pool_publish(run->pool, &t, src, run->params.timeout_ns, &d) != FERRY_OK)
        return bench_fail(run, "publishing item %llu (%llu bytes) failed: %s",
                          (unsigned long long)item, (unsigned long long)size, ferry_last_error());
    fill_msg(&m, BENCH_MSG_FERRY, run, item, size);
    if (ferry_descriptor_encode(&d, m.desc) != FERRY_OK)
        return bench_fail(run, "encoding the descriptor of item %llu failed: %s",
                          (unsigned long long)item, ferry_last_error());
    run->publish_ns[BENCH_PHASE_FERRY][item] = t0;
    if (bench_send(run, run->consumers, &m) != 0)
        return -1;
    bench_progress(run, BENCH_PHASE_FERRY, size);
    return 0;
}

int bench_pool_full_events(bench_run *run, uint64_t *events)
{
    ferry_pool_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    s.version = FERRY_POOL_STATS_VERSION;
    if (ferry_pool_stats_get(run->pool, &s) != FERRY_OK)
        return bench_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
    *events = s.pool_full_events;
    return 0;
}

int bench_ferry_chunk(bench_run *run, uint64_t begin, uint64_t end)
{
    bench_chunk_start(run);
    for (uint64_t i = begin; i < end; i++)
        if (publish_item(run, i) != 0 || bench_check_workers_often(run) != 0)
            return -1;
    if (bench_wait_progress(run, BENCH_PHASE_FERRY, run->consumers, end, NULL) != 0)
        return -1;
    bench_chunk_end(run, BENCH_PHASE_FERRY);
    return 0;
}
