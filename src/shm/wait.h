/* The one wait loop behind every blocking call (as liburing's _io_uring_get_cqe serves every
 * way of waiting for a completion): look; if nothing yet, check that the other side lives
 * (at most every check_ns), give up at the deadline, yield for spin_ns, then sleep a slice
 * on whatever the look found, and look again.
 *
 * Its users: a consumer waiting for a lease to be ready (consumer.c), a receiver waiting for
 * its ring (receive.c), a publisher waiting for space (pool.c), a sender waiting for room in a
 * ring and a drain waiting for acknowledgements (channel.c). */
#ifndef FERRY_SHM_WAIT_H
#define FERRY_SHM_WAIT_H

#include <stdint.h>

#include "ferry.h"

/* What look and expired answer to go on waiting (every ferry_status is >= 0). */
#define FERRY__WAIT_AGAIN (-1)

typedef struct ferry__wait {
    /* One look: FERRY__WAIT_AGAIN, or the call's result. */
    int (*look)(void *ctx);
    /* Sleeps at most ns, or until woken by whatever the last look waits for. */
    void (*sleep)(void *ctx, uint64_t ns);
    /* Whether the other side still lives: FERRY_OK, or the error that ends the wait (an
     * error to report, never a verdict, where the check itself failed). NULL: none. */
    ferry_status (*check)(void *ctx);
    /* At the deadline, after a look found nothing: the result, or FERRY__WAIT_AGAIN to look
     * once more. */
    int (*expired)(void *ctx);
    void *ctx;
    uint64_t spin_ns;  /* yields (no sleep) this long after the first look found nothing */
    uint64_t slice_ns; /* the longest sleep */
    uint64_t check_ns; /* check every check_ns, the first time check_ns after the first miss */
} ferry__wait;

/* Waits as w says until deadline (the ferry__now_ns clock), or, when deadline is 0, until
 * timeout_ns after the first look that found nothing (a call whose first look succeeds reads
 * no clock). Returns what look, check or expired answered. */
ferry_status ferry__wait_run(const ferry__wait *w, uint64_t timeout_ns, uint64_t deadline);

#endif
