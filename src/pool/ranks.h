/* Rank liveness, the producer's side (ranks.c): who holds each rank of a pool, whether it
 * lives, the verdict that it died and its reversal when a successor takes the rank over.
 * Every question "is rank r attached, alive, dead" is answered here, for reclaim, send,
 * drain, statistics, consumer_info, metrics and the broker.
 *
 * A rank is held by a holder of some kind: a local process that claimed the rank through the
 * pool's broker, or a remote consumer admitted by the remote server, whose liveness is its
 * connection. Only the few functions of ranks.c that switch on the kind (holder_check,
 * holder_describe, holder_is, holder_release) look inside a holder.
 *
 * Functions whose names end in _locked are called under the pool lock. */
#ifndef FERRY_POOL_RANKS_H
#define FERRY_POOL_RANKS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

typedef enum ferry__holder_kind {
    FERRY__HOLDER_NONE = 0, /* nobody attached yet */
    FERRY__HOLDER_PROCESS,  /* a process of this machine, claimed through the broker */
    FERRY__HOLDER_REMOTE,   /* a consumer on another host, admitted by the remote server: it
                             * lives while its connection does (remote/server.c) */
} ferry__holder_kind;

/* Who holds one rank. */
typedef struct ferry__holder {
    ferry__holder_kind kind;
    pid_t pid;          /* PROCESS: as the producer sees it */
    uint64_t starttime; /* PROCESS: guards against pid reuse (0: unknown) */
    int pidfd;          /* PROCESS: held from attach; -1 where none could be had */
    uint32_t conn;      /* REMOTE: the connection's id */
    int gone;           /* REMOTE: its connection ended; PROCESS: it gave the rank back */
    char host[64];      /* REMOTE: its host name (pid is its pid there) */
} ferry__holder;

/* Bytes of a holder's description (ferry__rank_describe_locked). */
#define FERRY__HOLDER_TEXT 128

/* What the pool knows of one rank. */
typedef struct ferry__rank {
    ferry__holder holder;
    int dead;   /* verdict: the holder is gone; its acknowledgements are written on its behalf
                 * until a successor attaches (the reversal) */
    int warned; /* the death was logged */
} ferry__rank;

/* What a look at a rank's holder found. */
typedef enum ferry__liveness {
    FERRY__RANK_FREE,    /* nobody attached yet */
    FERRY__RANK_ALIVE,   /* its holder lives */
    FERRY__RANK_DEAD,    /* its holder is gone */
    FERRY__RANK_UNKNOWN, /* the look failed (out of file descriptors): no verdict */
} ferry__liveness;

/* The pool's table of ranks (pool->ranks), all free; fini releases it. */
ferry_status ferry__ranks_init(ferry_pool *pool);
void ferry__ranks_fini(ferry_pool *pool);

/* Broker callback (ferry__broker_attach_fn): pid claims rank. FERRY_OK for the holder itself,
 * a free rank, or a successor of a dead holder (whose leases in flight are settled first,
 * under the same hold of the lock); RANK_IN_USE with *holder while the holder lives; SYSTEM
 * when the producer cannot watch the claimant or cannot tell whether the holder lives (out of
 * file descriptors: logged, never taken for a death). */
ferry_status ferry__ranks_attach(void *pool, uint32_t rank, pid_t pid, pid_t *holder);

/* Broker callback (ferry__broker_release_fn): pid gives rank back. If pid holds it, the
 * verdict is given now, as for a holder that died (its leases are acknowledged on its behalf
 * when reclaim reaps the rank or a successor takes it over); FERRY_OK either way. */
ferry_status ferry__ranks_release(void *pool, uint32_t rank, pid_t pid);

/* Remote server callbacks (remote/remote.h hooks): connection conn, of process pid on host,
 * claims rank (as ferry__ranks_attach: RANK_IN_USE with *holder while another holder lives);
 * the connection that held rank ended (the verdict is given at once). */
ferry_status ferry__ranks_attach_remote(ferry_pool *pool, uint32_t rank, uint32_t conn, pid_t pid,
                                        const char *host, pid_t *holder);
void ferry__ranks_detach_remote(ferry_pool *pool, uint32_t rank, uint32_t conn);

/* Looks at the attached holders (when a look is due: at most every reclaim interval, and at
 * most every 10 ms) and gives the verdict on those found gone (a look that fails gives
 * none). 1 if any rank is dead. */
int ferry__ranks_look_locked(ferry_pool *pool);

/* The verdict as last given: 1 if rank's holder was found gone and nobody took it over. */
int ferry__rank_dead_locked(const ferry_pool *pool, uint32_t rank);

/* A look now at rank's holder (no verdict is given). */
ferry__liveness ferry__rank_liveness_locked(const ferry_pool *pool, uint32_t rank);

/* 1 if process pid holds rank and lives (who may hand the rank a poll fd). */
int ferry__rank_held_by_locked(const ferry_pool *pool, uint32_t rank, pid_t pid);

/* Describes rank's holder for messages: "pid P, alive", "pid P, dead", "pid 0, not attached
 * yet", "pid P, liveness unknown: <why>". */
void ferry__rank_describe_locked(const ferry_pool *pool, uint32_t rank, char *buf, size_t size);

/* Logs, once per death, that rank's holder is gone and acked leases were acknowledged for
 * it (the reclaimer's reaping). */
void ferry__rank_note_reaped_locked(ferry_pool *pool, uint32_t rank, uint64_t acked);

/* Fills the attached, pid and alive fields of *info for rank (alive unless found dead: an
 * unknown liveness is no verdict). */
void ferry__rank_info_locked(const ferry_pool *pool, uint32_t rank, ferry_consumer_info *info);

/* Ranks attached at least once, and those whose holder is not found dead. */
void ferry__ranks_count_locked(const ferry_pool *pool, uint64_t *attached, uint64_t *alive);

#endif
