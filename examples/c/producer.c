/*
 * ferry example, producer side: creates a host pool for one consumer, publishes a few
 * tensors and writes each one's 256-byte descriptor to stdout, then waits until the
 * consumer has acknowledged every tensor and cleans up.
 *
 *     ./producer | ./consumer
 *
 * Tensor i is a 64 x 128 float32 matrix whose element j holds i * 1000 + j.
 */
#define _POSIX_C_SOURCE 200809L /* isatty, nanosleep, SIGPIPE */

#include <ferry.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define TENSORS   4
#define ROWS      64
#define COLS      128
#define SECOND_NS 1000000000ull

static int fail(const char *what, ferry_status st)
{
    fprintf(stderr, "producer: %s: %s: %s\n", what, ferry_status_name(st), ferry_last_error());
    return 1;
}

/* Publishes tensor i and sends its descriptor down stdout. */
static int publish_one(ferry_pool *pool, int i, float *values)
{
    for (int j = 0; j < ROWS * COLS; j++)
        values[j] = (float)(i * 1000 + j);
    ferry_tensor t = {.dtype_code = FERRY_DTYPE_FLOAT,
                      .dtype_bits = 32,
                      .dtype_lanes = 1,
                      .ndim = 2,
                      .shape = {ROWS, COLS}};
    ferry_descriptor desc;
    ferry_status st = ferry_pool_publish(pool, &t, values, SECOND_NS, &desc);
    if (st != FERRY_OK)
        return fail("publish", st);
    uint8_t wire[FERRY_DESCRIPTOR_SIZE];
    st = ferry_descriptor_encode(&desc, wire);
    if (st != FERRY_OK)
        return fail("encode", st);
    if (fwrite(wire, 1, sizeof(wire), stdout) != sizeof(wire) || fflush(stdout) != 0) {
        perror("producer: writing a descriptor");
        return 1;
    }
    fprintf(stderr, "producer: published tensor %d (slot %u, generation %u)\n", i, desc.slot,
            desc.generation);
    return 0;
}

/* Waits until every lease has been acknowledged and reclaimed (or 10 s have passed). */
static int wait_for_acks(ferry_pool *pool)
{
    for (int ms = 0; ms < 10000; ms++) {
        ferry_status st = ferry_pool_reclaim(pool, NULL);
        if (st != FERRY_OK)
            return fail("reclaim", st);
        ferry_pool_stats stats = {.struct_size = sizeof(stats),
                                  .version = FERRY_POOL_STATS_VERSION};
        st = ferry_pool_stats_get(pool, &stats);
        if (st != FERRY_OK)
            return fail("stats", st);
        if (stats.leases_in_flight == 0)
            return 0;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    fprintf(stderr, "producer: the consumer did not acknowledge every tensor within 10 s\n");
    return 1;
}

int main(void)
{
    if (isatty(STDOUT_FILENO)) {
        fprintf(stderr, "producer: stdout is a terminal; run: ./producer | ./consumer\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a consumer that exits early: fwrite fails instead */

    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = 16 << 20;
    cfg.consumer_count = 1;
    ferry_pool *pool;
    ferry_status st = ferry_pool_create(&cfg, &pool);
    if (st != FERRY_OK)
        return fail("create the pool", st);

    int rc = 0;
    float *values = malloc(sizeof(float) * ROWS * COLS);
    if (!values) {
        fprintf(stderr, "producer: out of memory\n");
        rc = 1;
    }
    for (int i = 0; i < TENSORS && rc == 0; i++)
        rc = publish_one(pool, i, values); /* publish copies: values may be reused at once */
    if (fclose(stdout) != 0 && rc == 0) {  /* end of file: the consumer stops reading */
        perror("producer: closing stdout");
        rc = 1;
    }
    if (rc == 0)
        rc = wait_for_acks(pool);
    if (rc == 0)
        fprintf(stderr, "producer: all %d tensors acknowledged\n", TENSORS);
    free(values);
    ferry_pool_destroy(pool);
    return rc;
}
