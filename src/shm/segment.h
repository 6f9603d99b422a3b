/* The shared segment as one process maps it: the layout it keeps privately, and one accessor
 * for each kind of word in it (a slot's generation and extent, a ready word, an
 * acknowledgement word, a rank's ring). The header is written (segment.c, the producer at
 * create) and validated (segment.c, a consumer at open) in one place; after that, neither side
 * reads a layout word of the header again.
 *
 * Every index handed to these accessors is checked by the caller against the private layout
 * (slot < max_inflight, rank < consumers); none comes from the shared segment. */
#ifndef FERRY_SHM_SEGMENT_H
#define FERRY_SHM_SEGMENT_H

#include <stdint.h>

#include "common/atomic.h"
#include "ferry.h"
#include "shm/layout.h"

/* One process's mapping of the segment and its private layout. */
typedef struct ferry__shm {
    ferry__shm_layout layout;
    ferry__shm_header *header;
    uint32_t *generations;
    ferry__extent *extents;
    uint8_t *rings; /* rank 0's ring */
} ferry__shm;

/* Producer: the segment's geometry for a validated configuration (the pool region's fields
 * follow at ferry__shm_header_write, once the transport has allocated it). */
void ferry__shm_layout_init(ferry__shm_layout *l, const ferry_pool_config *config);

/* Points s at a segment mapped at base, laid out as s->layout says. */
void ferry__shm_map(ferry__shm *s, void *base);

/* Producer: completes s->layout with the pool region as allocated, writes the header from it
 * and every slot's generation, and publishes the header (its magic, last, with release). */
void ferry__shm_header_write(ferry__shm *s, uint32_t backend, uint64_t memory_size,
                             uint64_t data_start, uint64_t data_size, uint32_t desc_flags,
                             int32_t device, const uint8_t pool_id[16], uint32_t generation);

/* Consumer: validates the header of the segment mapped at base (size bytes) against the
 * descriptor that named it, and on success maps s with the layout it read (once). MISMATCH
 * naming what differs otherwise. The transport's own checks (its placement, the bytes after
 * the header) are the caller's. */
ferry_status ferry__shm_open(ferry__shm *s, void *base, uint64_t size, const ferry_descriptor *d);

/* ---- words of the control table (indexes: they may live in device memory) ---------------- */

static inline uint64_t ferry__shm_ready_word(const ferry__shm_layout *l, uint32_t slot)
{
    return (uint64_t)slot * l->row_words;
}

static inline uint64_t ferry__shm_ack_word(const ferry__shm_layout *l, uint32_t slot, uint32_t rank)
{
    return (uint64_t)slot * l->row_words + 1 + rank;
}

/* ---- a slot's generation and extent ----------------------------------------------------- */

/* The slot's generation word as a reader sees it (acquire). */
static inline uint32_t ferry__shm_generation(const ferry__shm *s, uint32_t slot)
{
    return ferry__load_acquire32(&s->generations[slot]);
}

/* The generation word again, ordered after every earlier read of this thread (the re-check
 * after a copy or an extent read). */
static inline uint32_t ferry__shm_generation_recheck(const ferry__shm *s, uint32_t slot)
{
    return ferry__load_after_reads32(&s->generations[slot]);
}

/* Producer: a new lease of the slot. The generation word goes first: from here on a consumer
 * holding an older descriptor for this slot sees that it is stale. The fence keeps every
 * later store (the extent, the bytes of the new lease) behind it, so that a reader that saw
 * any of them sees the new generation when it checks again. */
static inline void ferry__shm_lease_begin(ferry__shm *s, uint32_t slot, uint32_t generation,
                                          uint64_t offset, uint64_t length)
{
    ferry__store_release32(&s->generations[slot], generation);
    ferry__fence_seqcst();
    ferry__store_relaxed64(&s->extents[slot].offset, offset);
    ferry__store_relaxed64(&s->extents[slot].length, length);
}

/* Producer: marks the slot's lease cancelled (generations never use the top bit), before
 * any store that may let a reader in: the release stores that follow (host words) are
 * ordered after it, and the fence orders it before the device writes of the control words
 * too, so that a reader that sees any of them sees the mark when it checks again. */
static inline void ferry__shm_lease_cancel(ferry__shm *s, uint32_t slot, uint32_t generation)
{
    ferry__store_release32(&s->generations[slot], generation | FERRY_GEN_CANCELLED);
    ferry__fence_seqcst();
}

/* Producer: the slot's lease is over and its slice goes back to the allocator (every rank
 * acknowledged it): readers still copying from the slice must learn it from a word no other
 * process writes, since their own acknowledgement word may say anything. The release store
 * is ordered before any later lease's bytes by that lease's own fence (lease_begin), so a
 * reader that copied a byte of it sees this when it checks again. A cancelled lease keeps
 * its mark. */
static inline void ferry__shm_lease_end(ferry__shm *s, uint32_t slot, uint32_t generation)
{
    if (ferry__load_relaxed32(&s->generations[slot]) == generation)
        ferry__store_release32(&s->generations[slot], FERRY_GEN_OVER);
}

/* Producer: a cancel that could not write its words is undone: the lease lives on. */
static inline void ferry__shm_lease_uncancel(ferry__shm *s, uint32_t slot, uint32_t generation)
{
    ferry__store_release32(&s->generations[slot], generation);
}

/* The extent the slot's lease recorded. Read once the lease is known current; the caller
 * checks the generation again afterwards. */
static inline void ferry__shm_extent(const ferry__shm *s, uint32_t slot, uint64_t *offset,
                                     uint64_t *length)
{
    *offset = ferry__load_relaxed64(&s->extents[slot].offset);
    *length = ferry__load_relaxed64(&s->extents[slot].length);
}

/* ---- rings ------------------------------------------------------------------------------- */

/* Rank r's descriptor ring. */
static inline ferry__ring *ferry__shm_ring(const ferry__shm *s, uint32_t rank)
{
    return (ferry__ring *)(s->rings + (uint64_t)rank * s->layout.ring_stride);
}

#endif
