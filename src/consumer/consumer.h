/* Consumer side: the process-wide cache of opened pools. */
#ifndef FERRY_CONSUMER_CONSUMER_H
#define FERRY_CONSUMER_CONSUMER_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"
#include "transport/mapping.h"

/* How long calls without a timeout of their own may wait for a pool's broker. */
#define FERRY_OPEN_TIMEOUT_NS 5000000000ull
/* How often a waiting consumer checks that the producer lives: the bound on noticing a dead
 * producer. */
#define FERRY_READY_WAIT_SLICE_NS 10000000ull

struct ferry_consumer {
    uint32_t rank;
    int32_t device; /* for GPU pools; -1 for host pools only */
    pid_t pid;      /* the process that created it */
    /* ferry_consumer_connect (receive.c): the pool it holds a reference on, else NULL. */
    ferry__mapped_pool *bound;
    int lent; /* its rank is given back when it is destroyed (connected by remote address) */
    pthread_mutex_t fd_lock; /* guards the fds below, made by the first ferry_consumer_fd */
    int event_fd;            /* signalled by the producer (-1 until asked for) */
    int poll_fd;             /* epoll set of event_fd and the producer's pidfd */
    int pid_fd;              /* the producer's pidfd, -1 where the kernel has none */
    uint64_t alive_ns;       /* atomic: when a recv last looked at the producer's process */
    /* ferry_consumer_connect to a remote address: the connection its calls on that pool
     * go through (remote/remote.h), else NULL. */
    struct ferry__remote_client *remote;
};

/* ---- consumer.c ------------------------------------------------------------------------ */

/* FERRY_OK if the calling process made the consumer, else FORKED (with a message). */
ferry_status ferry__consumer_owned(const struct ferry_consumer *c);

/* 1 if the pool's producer closed it or died (the pool is then evicted from the cache), 0 if
 * it lives, -1 (SYSTEM, the message set) if that could not be told: an error, never a
 * verdict (the pool's producer is watched through a pidfd held from open, whose look cannot
 * fail; /proc is read only where there is none). */
int ferry__producer_gone(ferry__mapped_pool *p);

/* ---- receive.c ------------------------------------------------------------------------ */

/* Frees what ferry_consumer_connect and ferry_consumer_fd made. */
void ferry__consumer_unbind(struct ferry_consumer *c);

/* ---- cache.c -------------------------------------------------------------------------- */

/* Finds or opens the pool a descriptor names and, unless claim is FERRY__RANK_NONE, makes
 * sure this process holds rank claim of it (RANK_IN_USE if another live process does).
 * Opening waits for the producer's broker until deadline (ferry__now_ns clock) at most. A pool
 * whose producer is gone is found only with allow_gone (to end views by acknowledging).
 * Takes a reference that ferry__cache_release drops. */
ferry_status ferry__cache_acquire(const ferry_descriptor *desc, uint32_t claim, int device,
                                  uint64_t deadline, int allow_gone, ferry__mapped_pool **pool);

/* Makes sure this process holds rank of an open pool (a CLAIM to its broker the first time;
 * RANK_IN_USE if another live process does, MISMATCH for a rank the pool lacks), waiting
 * for the broker until deadline at most. */
ferry_status ferry__cache_claim(ferry__mapped_pool *pool, uint32_t rank, uint64_t deadline);

/* ferry__cache_claim for a consumer that gives the rank back when it is destroyed, as a
 * remote connection's close does (ferry__cache_give_back): unless this process also holds
 * the rank for its life, the last of them to give it back releases it. */
ferry_status ferry__cache_lend(ferry__mapped_pool *pool, uint32_t rank, uint64_t deadline);

/* Gives back a rank ferry__cache_lend claimed: the last one waits for the stream work
 * tracked for the rank to run (FERRY_GIVE_BACK_STREAMS_NS at most), releases the rank at the
 * broker (the producer settles it as it settles a dead holder's; FERRY_GIVE_BACK_TIMEOUT_NS
 * at most) and ends the rank's views; a failure is logged (the rank then stays this
 * process's until it exits). */
void ferry__cache_give_back(ferry__mapped_pool *pool, uint32_t rank);
/* 1 if this process holds rank for its life (it is never given back). */
int ferry__cache_held_for_life(ferry__mapped_pool *pool, uint32_t rank);

#define FERRY_GIVE_BACK_STREAMS_NS (5000ull * 1000 * 1000)
#define FERRY_GIVE_BACK_TIMEOUT_NS (1000ull * 1000 * 1000)

/* Takes one more reference on a pool the caller holds one on. */
void ferry__cache_retain(ferry__mapped_pool *pool);

/* Drops a reference; the mapping goes away with the last one. */
void ferry__cache_release(ferry__mapped_pool *pool);

/* Marks a pool whose producer is gone and drops the cache's reference to it (the caller's
 * stays valid; the pool stays listed, for acknowledgements only, while references last). */
void ferry__cache_evict(ferry__mapped_pool *pool);

/* Number of pools in the cache whose producer is not known to be gone (tests). */
unsigned ferry__cache_size(void);

/* Drops the cache's reference to every pool whose producer is gone. */
void ferry__cache_sweep(void);

#endif
