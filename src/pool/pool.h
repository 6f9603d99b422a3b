/* The pool engine's private state (producer side). */
#ifndef FERRY_POOL_POOL_H
#define FERRY_POOL_POOL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker/broker.h"
#include "ferry.h"
#include "pool/alloc.h"
#include "pool/ranks.h"
#include "shm/ring.h"
#include "shm/layout.h"
#include "transport/transport.h"

#define FERRY_NIL UINT32_MAX

/* One control-table row's lease, as the producer tracks it. */
typedef struct ferry__slot {
    uint64_t offset;       /* data offset of the slice */
    uint64_t length;       /* bytes of the lease (all its tensors) */
    uint64_t leased_ns;    /* when the lease was created */
    uint32_t handle;       /* allocator handle of the slice */
    uint32_t generation;   /* generation of the current (or last) lease */
    uint32_t inflight_pos; /* index in ferry_pool.inflight, FERRY_NIL when free */
    uint8_t committed;     /* the ready write was issued */
    uint8_t cancelled;     /* cancelled; freed once its row is complete */
    uint8_t sent;          /* published by ferry_pool_send: its descriptors go through rings */
    uint8_t pushed;        /* ... and they were pushed into the chosen ranks' rings */
    uint8_t mark;          /* scratch of one look at the rings, under the pool lock */
} ferry__slot;

/* A remote rank's hold of a lease's slice (remote.c; docs/design.md, "Held leases"): the
 * slot is not freed while it lasts. */
typedef struct ferry__hold {
    uint32_t generation; /* the lease held (0: none) */
    uint32_t conn;       /* the connection that holds it */
    uint64_t revoked;    /* FERRY_HOLD_GONE: when its REVOKE went to the server (or its
                          * connection ended); it lapses a keepalive bound later */
    uint32_t state;      /* FERRY_HOLD_* */
} ferry__hold;

enum {
    FERRY_HOLD_HELD = 0,  /* held, not asked back */
    FERRY_HOLD_ASKED = 1, /* asked back: its REVOKE waits for the server's thread */
    FERRY_HOLD_GONE = 2,  /* its REVOKE went out (or no one is left to tell): lapses */
};

struct ferry_pool {
    const ferry__transport_ops *ops;
    ferry__pool_memory mem;
    ferry_pool_config config;
    uint64_t memory_size; /* the pool region as the transport allocated it */
    uint64_t data_start;
    uint64_t data_size;
    uint32_t consumers;
    uint32_t max_inflight;
    uint32_t row_words;
    uint8_t pool_id[16];
    uint8_t broker_name[16];
    char broker_label[48]; /* "<transport> pool broker" */
    pid_t pid;

    pthread_mutex_t lock; /* guards everything below */
    ferry__alloc alloc;
    ferry__slot *slots;
    uint32_t *free_slots; /* a FIFO queue of the free slots, so generations wear evenly */
    uint32_t free_head;   /* its first entry */
    uint32_t free_count;
    uint32_t *inflight; /* leased slots */
    uint32_t inflight_count;
    ferry__rank *ranks;   /* ranks.c's alone */
    uint64_t liveness_ns; /* when the ranks' holders were last looked at (ranks.c) */
    ferry_pool_stats stats;
    int warned_full;
    int closing;
    int closed;             /* ferry_pool_close finished */
    int release_at_destroy; /* close kept the memory: a reservation was outstanding */
    ferry_status failed;    /* latched background failure, FERRY_OK while healthy */
    char failure[256];      /* its first cause */
    uint32_t active;        /* publishers inside a publish */
    pthread_cond_t idle_cv;

    /* Descriptor channels (channel.c). */
    pthread_mutex_t notify_lock; /* guards notify_fds */
    int *notify_fds;             /* by rank: the eventfd its poll fd waits on, or -1 */
    uint32_t channel_depth;
    ferry__ring_tx *rings;       /* by rank: the producer's own state of its ring (lock) */
    ferry__ring_sent *ring_sent; /* their records, channel_depth each */

    ferry__broker *broker;
    struct ferry__remote_server *remote; /* consumers on other hosts (cfg.listen), else NULL */
    char remote_address[FERRY_REMOTE_ADDRESS_SIZE]; /* its address, kept after close; else "" */
    ferry__hold *holds;   /* [slot * consumers + rank], remote ranks' holds (NULL: no remote) */
    uint32_t *revoking;   /* by rank, atomic: holds with a REVOKE to send (set under the lock) */
    uint64_t hold_lapse_ns; /* how long an asked-back hold lasts (the keepalive bound) */
    pthread_t reclaimer;
    pthread_cond_t reclaimer_cv;
    int reclaimer_running;
    int stop;
};

/* ---- pool.c --------------------------------------------------------------------------- */

/* Publishes count tensors into one lease (ferry_pool_publish_many_async); when preack is not
 * NULL, the ranks r with preack[r] set are acknowledged for before the lease is marked ready
 * (a send to other ranks, or to dead ones). */
ferry_status ferry__publish(ferry_pool *pool, const ferry_tensor *tensors, const void *const *srcs,
                            size_t count, void *stream, uint64_t timeout_ns,
                            ferry_descriptor *descs, const uint8_t *preack);

/* The pool's entry checks: FERRY_OK and one more active caller (close waits for it) if the
 * pool takes new work; ferry__pool_leave ends it. */
ferry_status ferry__pool_enter(ferry_pool *pool);
void ferry__pool_leave(ferry_pool *pool);
ferry_status ferry__pool_check(ferry_pool *pool, const void *ptr, const char *what);
ferry_status ferry__pool_closing_error(ferry_pool *pool);

/* Latches the pool's first background failure (every later publish fails POOL_FAILED). */
void ferry__latch_locked(ferry_pool *pool, ferry_status status, const char *cause);

/* One look at a pool under one hold of its lock (for metrics.c). */
typedef struct ferry__pool_snapshot {
    uint8_t pool_id[16];
    ferry_backend backend;
    ferry_pool_stats stats;     /* every field of the current version */
    uint32_t consumers;         /* entries of ranks */
    ferry_consumer_info *ranks; /* rank r's info at [r]; the caller frees it (free) */
} ferry__pool_snapshot;

/* Takes a snapshot of the pool's identity, statistics and every rank's info; on failure
 * nothing is left to free. CLOSING once close began (no shared memory is read then). */
ferry_status ferry__pool_snapshot_take(ferry_pool *pool, ferry__pool_snapshot *snap);

/* ---- config.c ------------------------------------------------------------------------- */

/* A caller's config (of any supported version) as the current struct, defaults filled. */
void ferry__config_normalize(const ferry_pool_config *in, ferry_pool_config *out);

/* Validates a configuration for the named transport; *data_start on success. */
ferry_status ferry__config_validate(const ferry_pool_config *config,
                                    const ferry__transport_ops *ops, uint64_t *data_start);

/* ---- channel.c ------------------------------------------------------------------------ */

ferry_status ferry__channel_init(ferry_pool *pool);
/* Wakes every sender and receiver of the rings (close: they see the pool closing). */
void ferry__channel_wake(ferry_pool *pool);
/* Closes the notify fds (destroy, and a forked child's copies). */
void ferry__channel_fini(ferry_pool *pool);
/* Broker callbacks. */
ferry_status ferry__channel_describe(void *pool, uint8_t out[FERRY_DESCRIPTOR_SIZE]);
ferry_status ferry__channel_notify(void *pool, uint32_t rank, pid_t pid, int fd);
/* A new process takes the rank over: the dead one's poll fd is closed and its count of
 * sleeping receivers cleared. */
void ferry__channel_forget_rank_locked(ferry_pool *pool, uint32_t rank);
/* Makes fd the eventfd signalled for rank (the pool owns it from here; -1: none), closing
 * the one it had, and signals it once (for what was queued before it came). */
void ferry__channel_set_notify(ferry_pool *pool, uint32_t rank, int fd);

/* Signals rank's notify fd, if it has one (a remote rank's wakes the remote server for it). */
void ferry__channel_poke(ferry_pool *pool, uint32_t rank);

/* Sets the mark of every lease in flight still queued in rank's ring (its receiver has not
 * taken it); none if the ring is corrupt. */
void ferry__channel_mark_queued_locked(ferry_pool *pool, uint32_t rank);

/* ---- remote.c ------------------------------------------------------------------------- */

/* Starts serving remote consumers when the config has a listen address (a no-op otherwise). */
ferry_status ferry__pool_remote_start(ferry_pool *pool);
/* 1 if a remote rank still holds the slot's lease: the slot is not freed yet. Holds not
 * asked back yet are asked back here (the rank's REVOKE is queued and the server woken);
 * holds asked back a keepalive bound ago lapse. */
int ferry__holds_keep_locked(ferry_pool *pool, uint32_t slot);
/* Describes a hold that keeps a slot from being freed (for POOL_FULL messages) into buf:
 * 1 if there is one. */
int ferry__holds_describe_locked(ferry_pool *pool, char *buf, size_t size);
/* The slot's holds go with its lease (the slot is freed). */
void ferry__holds_clear_locked(ferry_pool *pool, uint32_t slot);
void ferry__holds_fini(ferry_pool *pool);
/* Tests only: called between a remote rank's partial mark's read of its word and its
 * compare-and-swap (pool/remote.c). */
extern void (*ferry__pool_test_before_mark)(ferry_pool *pool, uint32_t slot, uint32_t rank);

/* ---- reclaim.c ------------------------------------------------------------------------ */

/* Frees every leased slot whose row equals its generation; returns how many. */
uint64_t ferry__reclaim_locked(ferry_pool *pool);
/* Checks attached ranks' processes; acknowledges every lease of a dead rank for it. Returns
 * how many acknowledgements were written. */
uint64_t ferry__reap_dead_locked(ferry_pool *pool);
/* Acknowledges for rank every lease in flight that which (NULL: every lease) picks; returns
 * how many acknowledgements were written. The caller synced the control words. */
uint64_t ferry__ack_for_rank_locked(ferry_pool *pool, uint32_t rank,
                                    int (*which)(const ferry_pool *pool, uint32_t slot, void *arg),
                                    void *arg);
/* 1 if every word of the slot's row equals its generation (mem.control in sync) and no
 * remote rank holds the lease any more (ferry__holds_keep_locked). */
int ferry__row_released_locked(ferry_pool *pool, uint32_t slot);
/* Returns a leased slot and its slice to the free lists. */
void ferry__slot_release_locked(ferry_pool *pool, uint32_t slot);
/* Describes who holds the pool (for POOL_FULL messages) into buf. */
void ferry__describe_backlog_locked(ferry_pool *pool, char *buf, size_t size);
ferry_status ferry__reclaimer_start(ferry_pool *pool);
void ferry__reclaimer_stop(ferry_pool *pool);

#endif
