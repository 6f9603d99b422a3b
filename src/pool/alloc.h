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

/* Index meaning "no node". */
#define FERRY__ALLOC_NIL UINT32_MAX

/* States of a node of the array. */
enum {
    FERRY__ALLOC_UNUSED = 0, /* on the unused-node stack (linked through next) */
    FERRY__ALLOC_FREE = 1,   /* a free extent: in the address list and in the tree */
    FERRY__ALLOC_USED = 2,   /* a live allocation: in the address list; its index is the handle */
};

/* One extent. Links are indices into the node array (FERRY__ALLOC_NIL for none). */
typedef struct ferry__alloc_node {
    uint64_t offset; /* first byte of the extent */
    uint64_t size;   /* bytes of the extent */
    uint32_t prev;   /* previous extent in address order */
    uint32_t next;   /* next extent in address order (next unused node on the stack) */
    union {
        struct {
            uint32_t left; /* tree links (free extents only) */
            uint32_t right;
        };
        uint32_t child[2]; /* child[0] == left, child[1] == right */
    };
    uint32_t parent;
    uint8_t height; /* AVL height of the subtree (1 for a leaf; free extents only) */
    uint8_t state;  /* FERRY__ALLOC_UNUSED / FREE / USED */
} ferry__alloc_node;

/* Largest max_allocs accepted by ferry__alloc_init (node indices stay below NIL). */
#define FERRY__ALLOC_MAX_ALLOCS ((UINT32_MAX - 3u) / 2u)

/* Results of ferry__alloc_check: 0, or the first broken invariant. */
enum {
    FERRY__ALLOC_CHECK_OK = 0,
    FERRY__ALLOC_CHECK_HEADER = -1,       /* inconsistent header fields (granule, capacity) */
    FERRY__ALLOC_CHECK_LINK = -2,         /* address list: bad index, prev/next mismatch, cycle */
    FERRY__ALLOC_CHECK_TILING = -3,       /* extents do not tile [0, size) contiguously */
    FERRY__ALLOC_CHECK_GRANULE = -4,      /* offset or size not a multiple of the granule */
    FERRY__ALLOC_CHECK_ADJACENT = -5,     /* two free extents next to each other */
    FERRY__ALLOC_CHECK_STATE = -6,        /* an unused node in the address list */
    FERRY__ALLOC_CHECK_USED_BYTES = -7,   /* used_bytes differs from the walk */
    FERRY__ALLOC_CHECK_LIVE = -8,         /* live_allocs differs from the walk or exceeds max */
    FERRY__ALLOC_CHECK_STACK = -9,        /* unused stack: bad index, reachable node, cycle */
    FERRY__ALLOC_CHECK_LEAK = -10,        /* a node is neither in the list nor on the stack */
    FERRY__ALLOC_CHECK_TREE_NODE = -11,   /* the tree holds a bad index or a non-free node */
    FERRY__ALLOC_CHECK_TREE_ORDER = -12,  /* tree not ordered by (size, offset) */
    FERRY__ALLOC_CHECK_HEIGHT = -13,      /* a stored height is wrong */
    FERRY__ALLOC_CHECK_BALANCE = -14,     /* a subtree is out of AVL balance */
    FERRY__ALLOC_CHECK_TREE_COUNT = -15,  /* tree size != free_extents != free extents listed */
    FERRY__ALLOC_CHECK_TREE_PARENT = -16, /* a tree node's parent link is wrong */
};

typedef struct ferry__alloc {
    uint64_t size;         /* managed bytes (a multiple of granule) */
    uint64_t granule;      /* power of two, e.g. 256 */
    uint64_t used_bytes;   /* bytes in allocated extents */
    uint32_t max_allocs;   /* most live allocations */
    uint32_t live_allocs;  /* live allocations */
    uint32_t node_cap;     /* nodes in the array (2 * max_allocs + 2) */
    uint32_t free_head;    /* head of the unused-node stack, or NIL */
    uint32_t tree_root;    /* root of the free-extent tree, or NIL */
    uint32_t first;        /* first extent in address order */
    uint32_t free_extents; /* free extents in the tree */
    ferry__alloc_node *nodes;
} ferry__alloc;

/* Initialises an allocator managing size bytes (rounded down to granule) with room for
 * max_allocs live allocations. granule must be a nonzero power of two, the rounded size at
 * least one granule, 1 <= max_allocs <= FERRY__ALLOC_MAX_ALLOCS. NO_MEMORY / INVALID_ARGUMENT
 * on failure, with *a zeroed (ferry__alloc_fini is harmless on it). */
ferry_status ferry__alloc_init(ferry__alloc *a, uint64_t size, uint64_t granule,
                               uint32_t max_allocs);

/* Frees the bookkeeping and zeroes *a; harmless on a zeroed struct (or NULL). */
void ferry__alloc_fini(ferry__alloc *a);

/* Allocates size bytes (size > 0, rounded up to the granule), best fit. Returns POOL_FULL
 * (without setting an error message) when no free extent fits or max_allocs are live; on
 * success *offset is the extent's offset (a multiple of the granule) and *handle names the
 * allocation for ferry__alloc_free. INVALID_ARGUMENT (with a message) for size 0 or a size
 * that overflows when rounded up. The allocation takes the low end of the chosen extent.
 * A handle is a node index: once freed, the same number may name a later allocation. */
ferry_status ferry__alloc_alloc(ferry__alloc *a, uint64_t size, uint64_t *offset, uint32_t *handle);

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
