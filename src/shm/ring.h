/* A rank's descriptor ring, both halves: the producer's push (ferry_pool_send, pool/channel.c)
 * and the rank's pop (ferry_consumer_recv, consumer/receive.c), with the wake-ups each side
 * owes the other, next to the struct they share (ferry__ring, shm/layout.h).
 *
 * The entries [head, tail) are queued; entry i lives at i % depth. The producer alone writes
 * tail and the entries; the rank's process advances head by compare-and-swap, so that threads
 * of one process share a rank: a thread that loses the race drops its copy (which the
 * producer may have been rewriting) and tries again. */
#ifndef FERRY_SHM_RING_H
#define FERRY_SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "shm/layout.h"

/* ---- the producer's half -------------------------------------------------------------- */

/* The lease the producer pushed at one position of a ring. */
typedef struct ferry__ring_sent {
    uint32_t slot;
    uint32_t generation;
} ferry__ring_sent;

/* The producer's own state of one rank's ring. The shared tail is only ever a copy of tail
 * (a stray write into it is mended by the next push); head, which the rank's process writes,
 * is checked against tail before it is used: tail - depth <= head <= tail. */
typedef struct ferry__ring_tx {
    ferry__ring *ring;      /* the shared counters and entries */
    ferry__ring_sent *sent; /* depth records: the lease pushed at each position */
    uint32_t depth;
    uint32_t tail;     /* entries ever pushed */
    uint32_t reserved; /* entries promised to sends in progress (room made, not pushed yet) */
    uint32_t mended;   /* times it was found corrupt and emptied */
} ferry__ring_tx;

/* The receiver's head if it is consistent with tail (0), else -1: the ring is corrupt. */
int ferry__ring_head(const ferry__ring_tx *tx, uint32_t *head);

/* Entries queued, or UINT32_MAX when the ring is corrupt. */
uint32_t ferry__ring_queued(const ferry__ring_tx *tx);

/* Drops every queued entry (a dead rank's, whose process reads nothing any more, or a corrupt
 * ring's): head := tail. */
void ferry__ring_drop(ferry__ring_tx *tx);

/* Queues count encoded descriptors of the lease (slot, generation) (the caller made room for
 * them) and publishes them. */
void ferry__ring_push(ferry__ring_tx *tx, const uint8_t *encoded, uint32_t count, uint32_t slot,
                      uint32_t generation);

/* Calls each for every lease pushed at the positions [from, tail) (at most the last depth;
 * a lease of several parts once per part). */
void ferry__ring_each_sent(const ferry__ring_tx *tx, uint32_t from,
                           void (*each)(void *arg, uint32_t slot, uint32_t generation), void *arg);

/* Wakes the receivers asleep on the tail; 1 if the rank's poll fd is to be signalled (force,
 * or it asked for a signal at this push). */
int ferry__ring_wake_receivers(ferry__ring *ring, int force);

/* Wakes the senders asleep on the head (close: they see the pool closing). */
void ferry__ring_wake_senders(ferry__ring *ring);

/* Sleeps at most ns until the receiver moves head on from seen (the head a look found). */
void ferry__ring_sleep_on_head(ferry__ring *ring, uint32_t seen, uint64_t ns);

/* A new process takes the rank over: a dead one killed in its sleep left its count of
 * sleeping receivers raised (the successor has no thread asleep yet). */
void ferry__ring_forget_receivers(ferry__ring *ring);

/* ---- the rank's half -------------------------------------------------------------------- */

enum { FERRY__RING_EMPTY = -1 };

/* What a receiver knows of its pool, to check the entries it takes. */
typedef struct ferry__ring_reader {
    ferry__ring *ring;
    uint32_t depth;
    uint32_t rank;
    const uint8_t *pool_id;
    uint32_t max_inflight;
    /* 1 if the lease d names is still the rank's to read (its slot holds its generation, the
     * rank has not acknowledged it): leases no longer current are skipped. */
    int (*current)(void *arg, const ferry_descriptor *d);
    void *arg;
} ferry__ring_reader;

/* Looks at the next current lease at head without taking it: FERRY_OK with its parts'
 * number in *count, those that fit in max decoded into descs, and the head they were found
 * at in *at (the copies hold only if ferry__ring_advance from there succeeds); otherwise as
 * ferry__ring_take (what is no longer current, or malformed, is taken off on the way). */
int ferry__ring_peek(const ferry__ring_reader *r, ferry_descriptor *descs, size_t max,
                     size_t *count, uint32_t *at);

/* Moves head from at to at + k: 1, or 0 if head is no longer at (another thread took the
 * entries, or a stray write moved it: the copies made at it may be torn). Wakes the senders
 * waiting for room. */
int ferry__ring_advance(ferry__ring *ring, uint32_t at, uint32_t k);

/* Takes the next current lease's entries at head: FERRY_OK with its descriptors in descs and
 * their number in *count, FERRY__RING_EMPTY, or an error (INVALID_ARGUMENT with *count set to
 * the lease's parts when it has more than max: the entries stay queued; MALFORMED for a
 * corrupt ring or a foreign entry, which is dropped). */
int ferry__ring_take(const ferry__ring_reader *r, ferry_descriptor *descs, size_t max,
                     size_t *count);

/* Asks the producer to signal the poll fd at its next push; 1 if the ring got entries in the
 * meantime or the pool is closing (closing: the header's word), i.e. take again. */
int ferry__ring_arm(ferry__ring *ring, const uint32_t *closing);

/* Sleeps at most ns until the ring's tail moves on. */
void ferry__ring_sleep_on_tail(ferry__ring *ring, uint64_t ns);

#endif
