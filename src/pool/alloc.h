/* Best-fit extent allocator over an offset range [0, size).
 *
 * The managed memory is never touched: bookkeeping (extent nodes, an address-ordered list
 * and a balanced tree of free extents keyed by (size, offset)) lives in arrays allocated at
 * init. Allocation picks the smallest free extent that fits (lowest offset among equals),
 * splits it, and freeing merges with free neighbours. Both are O(log n). Offsets and sizes
 * are multiples of the allocator's granule. Not thread-safe: the pool serialises calls. */
#ifndef FERRY_POOL_ALLOC_H
#define FERRY_POOL_ALLOC_H

#include <stdint.h>

#include "ferry.h"

typedef struct ferry__alloc_node ferry__alloc_node;

typedef struct ferry__alloc {
    uint64_t size;          /* managed bytes (a multiple of granule) */
    uint64_t granule;       /* power of two, e.g. 256 */
    uint64_t used_bytes;    /* bytes in allocated extents */
    uint32_t max_allocs;    /* most live allocations */
    uint32_t live_allocs;   /* live allocations */
    uint32_t node_cap;      /* nodes in the array (2 * max_allocs + 2) */
    uint32_t free_head;     /* head of the unused-node stack, or NIL */
    uint32_t tree_root;     /* root of the free-extent tree, or NIL */
    uint32_t first;         /* first extent in address order */
    uint32_t free_extents;  /* free extents in the tree */
    ferry__alloc_node *nodes;
} ferry__alloc;

/* Initialises an allocator managing size bytes (rounded down to granule) with room for
 * max_allocs live allocations. NO_MEMORY / INVALID_ARGUMENT on failure. */
ferry_status ferry__alloc_init(ferry__alloc *a, uint64_t size, uint64_t granule,
                               uint32_t max_allocs);

/* Frees the bookkeeping. */
void ferry__alloc_fini(ferry__alloc *a);

/* Allocates size bytes (size > 0, rounded up to the granule), best fit. Returns POOL_FULL
 * (without setting an error message) when no free extent fits or max_allocs are live; on
 * success *offset is the extent's offset (a multiple of the granule) and *handle names the
 * allocation for ferry__alloc_free. */
ferry_status ferry__alloc_alloc(ferry__alloc *a, uint64_t size, uint64_t *offset,
                                uint32_t *handle);

/* Frees an allocation by its handle, merging with free neighbours. INVALID_ARGUMENT (with a
 * message) if handle does not name a live allocation; nothing changes then. O(log n). */
ferry_status ferry__alloc_free(ferry__alloc *a, uint32_t handle);

/* Size in bytes of the live allocation named by handle (0 if none). O(1). */
uint64_t ferry__alloc_size_of(const ferry__alloc *a, uint32_t handle);

/* Largest free extent in bytes. O(log n). */
uint64_t ferry__alloc_largest_free(const ferry__alloc *a);

/* Walks the whole structure and checks every invariant: extents tile [0, size) in address
 * order, no two free extents are adjacent, the tree holds exactly the free extents, is
 * ordered by (size, offset) and balanced, and the counters match. Returns 0 if all hold,
 * otherwise a negative number naming the first broken invariant (and writes it to the
 * thread's error message). */
int ferry__alloc_check(const ferry__alloc *a);

#endif
