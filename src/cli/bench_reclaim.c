/* The reclaim-delay phase of `ferry bench`: how soon an acknowledged slice is reusable when
 * the pool needs it. A pool of one slot and one consumer (rank 0): the producer publishes
 * round k, sends it, and at once publishes round k + 1, which must wait for the ack of k.
 * Rank 0 reads k, sleeps 0-200 us, notes t_ack and acknowledges. The delay of a round is
 * the moment the blocked publish returns minus t_ack; rounds whose publish found the slot
 * already free (no pool-full event) are not counted. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define RECLAIM_POOL_BYTES (1ll << 20)

static int stats_full(bench_run *run, ferry_pool *pool, uint64_t *events)
{
    ferry_pool_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    s.version = FERRY_POOL_STATS_VERSION;
    if (ferry_pool_stats_get(pool, &s) != FERRY_OK)
        return bench_fail(run, "reading the reclaim pool's statistics failed: %s",
                          ferry_last_error());
    *events = s.pool_full_events;
    return 0;
}

static int create_reclaim_pool(bench_run *run, ferry_pool **pool)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = run->backend;
    c.memory_size = RECLAIM_POOL_BYTES;
    c.consumer_count = 1;
    c.max_inflight_slices = 1;
    c.reclaim_interval_us = run->opt->reclaim_interval_us;
    if (ferry_pool_create(&c, pool) != FERRY_OK)
        return bench_fail(run, "creating the reclaim pool failed: %s", ferry_last_error());
    return 0;
}

/* Publishes one round and sends it to rank 0; *blocked and *t_ret tell how it went. *full
 * holds the pool's pool_full_events (read after the previous publish, so that nothing slow
 * runs between sending a round and publishing the next). */
static int reclaim_round(bench_run *run, ferry_pool *pool, uint64_t round, uint64_t *full,
                         int *blocked, uint64_t *t_ret)
{
    const bench_params *p = &run->params;
    uint8_t *buf = run->patterns.buf[bench_item_key(round, run->patterns.count)];
    ferry_tensor t = ferry_tensor_bytes(p->reclaim_item);
    ferry_descriptor d;
    bench_msg m;
    uint64_t after;
    bench_pattern_stamp(buf, p->reclaim_item, p->seed, round);
    if (ferry_pool_publish(pool, &t, buf, p->timeout_ns, &d) != FERRY_OK)
        return bench_fail(run, "reclaim round %llu: publish failed: %s", (unsigned long long)round,
                          ferry_last_error());
    *t_ret = cli_now_ns();
    if (stats_full(run, pool, &after) != 0)
        return -1;
    *blocked = after > *full;
    *full = after;
    memset(&m, 0, sizeof(m));
    m.type = BENCH_MSG_RECLAIM;
    m.item = round;
    m.seed = p->seed;
    m.size = p->reclaim_item;
    if (ferry_descriptor_encode(&d, m.desc) != FERRY_OK)
        return bench_fail(run, "encoding a reclaim descriptor failed: %s", ferry_last_error());
    return bench_send(run, 1, &m);
}

static int reclaim_rounds(bench_run *run, ferry_pool *pool, uint64_t *delays, size_t *n)
{
    uint64_t rounds = run->params.reclaim_rounds, full = 0;
    if (stats_full(run, pool, &full) != 0)
        return -1;
    for (uint64_t r = 0; r <= rounds; r++) {
        int blocked = 0;
        uint64_t t_ret = 0;
        if (reclaim_round(run, pool, r, &full, &blocked, &t_ret) != 0)
            return -1;
        /* Round r's lease could only be created after rank 0 acknowledged round r - 1
         * (t_ack is 0 only if the pool acknowledged for a dead rank 0). */
        uint64_t t_ack =
            r > 0 ? __atomic_load_n(&run->region.reclaim_ack_ns[r - 1], __ATOMIC_ACQUIRE) : 0;
        if (blocked && t_ack && t_ret > t_ack)
            delays[(*n)++] = t_ret - t_ack;
        if (bench_check_workers_often(run) != 0)
            return -1;
    }
    return bench_wait_progress(run, BENCH_PHASE_RECLAIM, 1, rounds + 1, NULL);
}

int bench_reclaim_phase(bench_run *run)
{
    ferry_pool *pool = NULL;
    size_t n = 0;
    uint64_t *delays = calloc(run->params.reclaim_rounds + 1, sizeof(*delays));
    if (!delays)
        return bench_fail(run, "out of memory for the reclaim phase");
    bench_mute_library_log(1); /* this pool is full by design at every round */
    int rc = create_reclaim_pool(run, &pool);
    if (rc == 0)
        rc = reclaim_rounds(run, pool, delays, &n);
    ferry_pool_destroy(pool);
    bench_mute_library_log(0);
    if (rc == 0) {
        run->reclaim.ran = 1;
        run->reclaim.rounds = n;
        run->reclaim.errors = run->region.ranks[0].errors[BENCH_PHASE_RECLAIM];
        cli_p50_p99_us(delays, n, &run->reclaim.p50_us, &run->reclaim.p99_us);
    }
    free(delays);
    return rc;
}
