/* Best-fit extent allocator (see alloc.h).
 *
 * Every extent, free or used, is a node of one array allocated at init. The extents form a
 * doubly linked list in address order, so that a freed extent finds its neighbours in O(1).
 * Free extents are also kept in an AVL tree keyed by (size, offset): the best fit is the
 * leftmost node whose size is large enough, the largest free extent the rightmost node.
 * Nodes not holding an extent sit on a stack linked through their next field. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "pool/alloc.h"

#define NIL FERRY__ALLOC_NIL

/* The deepest tree the check walks before calling it cyclic: an AVL tree of 2^32 nodes is
 * less than 1.45 * 33 levels deep. */
#define CHECK_MAX_DEPTH 64u

typedef ferry__alloc_node node_t;

/* ------------------------------------------------------------------------------------
 * AVL tree of free extents, keyed by (size, offset), with parent links
 * ---------------------------------------------------------------------------------- */

/* Height of the subtree at x (0 for NIL), without a branch: node 0 always exists. */
static unsigned tree_height(const node_t *n, uint32_t x)
{
    uint32_t safe = x != NIL ? x : 0u;
    return n[safe].height & (0u - (unsigned)(x != NIL));
}

static void tree_fix_height(node_t *n, uint32_t x)
{
    unsigned hl = tree_height(n, n[x].left);
    unsigned hr = tree_height(n, n[x].right);
    n[x].height = (uint8_t)(1u + (hl > hr ? hl : hr));
}

static int tree_balance(const node_t *n, uint32_t x)
{
    return (int)tree_height(n, n[x].left) - (int)tree_height(n, n[x].right);
}

/* Whether the key (size, offset) is strictly smaller than node y's key (branch-free). */
static int key_less_kv(const node_t *n, uint64_t size, uint64_t offset, uint32_t y)
{
    return (size < n[y].size) | ((size == n[y].size) & (offset < n[y].offset));
}

/* Whether node x's key is strictly smaller than node y's. */
static int key_less(const node_t *n, uint32_t x, uint32_t y)
{
    return key_less_kv(n, n[x].size, n[x].offset, y);
}

/* Makes c the child of p that old was (the root if p is NIL), and p the parent of c. */
static void tree_set_child(ferry__alloc *a, uint32_t p, uint32_t old, uint32_t c)
{
    node_t *n = a->nodes;
    if (p == NIL)
        a->tree_root = c;
    else
        n[p].child[n[p].right == old] = c;
    if (c != NIL)
        n[c].parent = p;
}

static uint32_t rotate_right(ferry__alloc *a, uint32_t x)
{
    node_t *n = a->nodes;
    uint32_t y = n[x].left, b = n[y].right;
    tree_set_child(a, n[x].parent, x, y);
    n[x].left = b;
    if (b != NIL)
        n[b].parent = x;
    n[y].right = x;
    n[x].parent = y;
    tree_fix_height(n, x);
    tree_fix_height(n, y);
    return y;
}

static uint32_t rotate_left(ferry__alloc *a, uint32_t x)
{
    node_t *n = a->nodes;
    uint32_t y = n[x].right, b = n[y].left;
    tree_set_child(a, n[x].parent, x, y);
    n[x].right = b;
    if (b != NIL)
        n[b].parent = x;
    n[y].left = x;
    n[x].parent = y;
    tree_fix_height(n, x);
    tree_fix_height(n, y);
    return y;
}

/* Rotates the subtree at x, out of balance with child heights hl and hr, back into
 * balance; returns its new root. */
static uint32_t tree_rotate(ferry__alloc *a, uint32_t x, unsigned hl, unsigned hr)
{
    node_t *n = a->nodes;
    if (hl > hr) {
        if (tree_balance(n, n[x].left) < 0)
            rotate_left(a, n[x].left);
        return rotate_right(a, x);
    }
    if (tree_balance(n, n[x].right) > 0)
        rotate_right(a, n[x].right);
    return rotate_left(a, x);
}

/* Rebalances from x up to the root after x's subtree changed below it, stopping at the
 * first subtree that keeps its height. */
static void tree_retrace(ferry__alloc *a, uint32_t x)
{
    node_t *n = a->nodes;
    while (x != NIL) {
        unsigned hl = tree_height(n, n[x].left), hr = tree_height(n, n[x].right);
        unsigned old = n[x].height;
        uint32_t up = n[x].parent;
        if (hl > hr + 1 || hr > hl + 1)
            x = tree_rotate(a, x, hl, hr);
        else
            n[x].height = (uint8_t)(1u + (hl > hr ? hl : hr));
        if (n[x].height == old)
            return;
        x = up;
    }
}

static void tree_insert(ferry__alloc *a, uint32_t x)
{
    node_t *n = a->nodes;
    uint32_t p = NIL, cur = a->tree_root;
    unsigned dir = 0;
    while (cur != NIL) {
        p = cur;
        dir = !key_less(n, x, cur);
        cur = n[cur].child[dir];
    }
    n[x].left = NIL;
    n[x].right = NIL;
    n[x].parent = p;
    n[x].height = 1;
    if (p == NIL)
        a->tree_root = x;
    else
        n[p].child[dir] = x;
    tree_retrace(a, p);
}

/* Puts x's in-order successor (x has two children) in x's place; returns the node where
 * retracing starts. */
static uint32_t tree_splice_successor(ferry__alloc *a, uint32_t x)
{
    node_t *n = a->nodes;
    uint32_t r = n[x].right, s = r, start = r;
    while (n[s].left != NIL)
        s = n[s].left;
    if (s != r) {
        start = n[s].parent;
        tree_set_child(a, start, s, n[s].right);
        n[s].right = r;
        n[r].parent = s;
    }
    n[s].left = n[x].left;
    n[n[x].left].parent = s;
    n[s].height = n[x].height;
    tree_set_child(a, n[x].parent, x, s);
    return start;
}

/* Removes node x from the tree; needs only its links, not its key. */
static void tree_remove(ferry__alloc *a, uint32_t x)
{
    node_t *n = a->nodes;
    uint32_t start = n[x].parent;
    if (n[x].left == NIL)
        tree_set_child(a, start, x, n[x].right);
    else if (n[x].right == NIL)
        tree_set_child(a, start, x, n[x].left);
    else
        start = tree_splice_successor(a, x);
    n[x].left = NIL;
    n[x].right = NIL;
    n[x].parent = NIL;
    tree_retrace(a, start);
}

/* In-order successor of x, or NIL. */
static uint32_t tree_next(const node_t *n, uint32_t x)
{
    if (n[x].right != NIL) {
        x = n[x].right;
        while (n[x].left != NIL)
            x = n[x].left;
        return x;
    }
    uint32_t p = n[x].parent;
    while (p != NIL && n[p].right == x) {
        x = p;
        p = n[p].parent;
    }
    return p;
}

/* Gives free extent x the key (size, offset); moves it in the tree unless keep_place (the
 * caller has checked that the new key keeps x's place in the order). */
static void tree_set_key(ferry__alloc *a, uint32_t x, uint64_t size, uint64_t offset,
                         int keep_place)
{
    node_t *n = a->nodes;
    if (!keep_place)
        tree_remove(a, x);
    n[x].size = size;
    n[x].offset = offset;
    if (!keep_place)
        tree_insert(a, x);
}

/* The smallest free extent of at least need bytes, lowest offset among equals; or NIL.
 * *pred gets its in-order predecessor: the last node where the descent went right (below
 * the result, the descent only goes right, to the largest node of its left subtree). */
static uint32_t tree_best_fit(const node_t *n, uint32_t x, uint64_t need, uint32_t *pred)
{
    uint32_t best = NIL, last_right = NIL;
    while (x != NIL) {
        unsigned fits = n[x].size >= need;
        best = fits ? x : best;
        last_right = fits ? last_right : x;
        x = n[x].child[!fits];
    }
    *pred = last_right;
    return best;
}

/* ------------------------------------------------------------------------------------
 * Node stack, address list, free set
 * ---------------------------------------------------------------------------------- */

static uint32_t node_pop(ferry__alloc *a)
{
    uint32_t x = a->free_head;
    if (x != NIL)
        a->free_head = a->nodes[x].next;
    return x;
}

static void node_push(ferry__alloc *a, uint32_t x)
{
    node_t *nd = &a->nodes[x];
    nd->offset = 0;
    nd->size = 0;
    nd->prev = NIL;
    nd->left = NIL;
    nd->right = NIL;
    nd->parent = NIL;
    nd->height = 0;
    nd->state = FERRY__ALLOC_UNUSED;
    nd->next = a->free_head;
    a->free_head = x;
}

/* Links y into the address list right before x. */
static void list_insert_before(ferry__alloc *a, uint32_t x, uint32_t y)
{
    node_t *n = a->nodes;
    uint32_t p = n[x].prev;
    n[y].prev = p;
    n[y].next = x;
    if (p != NIL)
        n[p].next = y;
    else
        a->first = y;
    n[x].prev = y;
}

/* Unlinks y from the address list and returns its node to the stack. */
static void list_drop(ferry__alloc *a, uint32_t y)
{
    node_t *n = a->nodes;
    uint32_t p = n[y].prev, q = n[y].next;
    if (p != NIL)
        n[p].next = q;
    else
        a->first = q;
    if (q != NIL)
        n[q].prev = p;
    node_push(a, y);
}

static void free_set_insert(ferry__alloc *a, uint32_t x)
{
    a->nodes[x].state = FERRY__ALLOC_FREE;
    tree_insert(a, x);
    a->free_extents++;
}

static void free_set_remove(ferry__alloc *a, uint32_t x)
{
    tree_remove(a, x);
    a->free_extents--;
}

/* Takes need bytes from the low end of free extent x, whose in-order predecessor in the
 * tree is pred; returns the allocation's node, or NIL if none is left for the remainder. */
static uint32_t take_low_end(ferry__alloc *a, uint32_t x, uint32_t pred, uint64_t need)
{
    node_t *n = a->nodes;
    if (n[x].size == need) {
        free_set_remove(a, x);
        return x;
    }
    uint32_t y = node_pop(a);
    if (y == NIL)
        return NIL;
    n[y].offset = n[x].offset;
    n[y].size = need;
    list_insert_before(a, x, y);
    uint64_t size = n[x].size - need, offset = n[x].offset + need;
    tree_set_key(a, x, size, offset, pred == NIL || !key_less_kv(n, size, offset, pred));
    return y;
}

/* Merges the extent x being freed with its free neighbours p and/or q (NIL if used). The
 * neighbour that is already in the tree survives. */
static void merge_free(ferry__alloc *a, uint32_t x, uint32_t p, uint32_t q)
{
    node_t *n = a->nodes;
    uint32_t keep = p != NIL ? p : q;
    uint64_t offset = p != NIL ? n[p].offset : n[x].offset;
    uint64_t size = n[x].size + (p != NIL ? n[p].size : 0) + (q != NIL ? n[q].size : 0);
    if (p != NIL && q != NIL) {
        free_set_remove(a, q);
        list_drop(a, q);
    }
    list_drop(a, x);
    uint32_t succ = tree_next(n, keep);
    tree_set_key(a, keep, size, offset, succ == NIL || key_less_kv(n, size, offset, succ));
}

/* ------------------------------------------------------------------------------------
 * Public functions
 * ---------------------------------------------------------------------------------- */

static ferry_status init_check_args(uint64_t size, uint64_t granule, uint32_t max_allocs)
{
    if (granule == 0 || (granule & (granule - 1)) != 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "allocator: granule %" PRIu64 " is not a nonzero power of two", granule);
    if ((size & ~(granule - 1)) < granule)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "allocator: size %" PRIu64 " is smaller than one granule (%" PRIu64
                           " bytes)",
                           size, granule);
    if (max_allocs == 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "allocator: max_allocs must be at least 1");
    if (max_allocs > FERRY__ALLOC_MAX_ALLOCS)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "allocator: max_allocs %" PRIu32 " exceeds the limit %" PRIu32,
                           max_allocs, (uint32_t)FERRY__ALLOC_MAX_ALLOCS);
    return FERRY_OK;
}

/* Puts every node but node 0 on the unused stack, in index order. */
static void init_stack(ferry__alloc *a)
{
    for (uint32_t i = a->node_cap; i-- > 1;)
        node_push(a, i);
}

ferry_status ferry__alloc_init(ferry__alloc *a, uint64_t size, uint64_t granule,
                               uint32_t max_allocs)
{
    if (a == NULL)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "allocator: NULL allocator");
    memset(a, 0, sizeof(*a));
    ferry_status st = init_check_args(size, granule, max_allocs);
    if (st != FERRY_OK)
        return st;
    uint32_t cap = 2u * max_allocs + 2u;
    node_t *n = calloc(cap, sizeof(*n));
    if (n == NULL)
        return ferry__fail(FERRY_NO_MEMORY,
                           "allocator: cannot allocate %" PRIu32 " bookkeeping nodes", cap);
    a->size = size & ~(granule - 1);
    a->granule = granule;
    a->max_allocs = max_allocs;
    a->node_cap = cap;
    a->nodes = n;
    a->free_head = NIL;
    a->tree_root = NIL;
    init_stack(a);
    n[0].offset = 0;
    n[0].size = a->size;
    n[0].prev = NIL;
    n[0].next = NIL;
    a->first = 0;
    free_set_insert(a, 0);
    return FERRY_OK;
}

void ferry__alloc_fini(ferry__alloc *a)
{
    if (a == NULL)
        return;
    free(a->nodes);
    memset(a, 0, sizeof(*a));
}

ferry_status ferry__alloc_alloc(ferry__alloc *a, uint64_t size, uint64_t *offset, uint32_t *handle)
{
    if (size == 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "allocator: cannot allocate 0 bytes");
    if (a->live_allocs >= a->max_allocs)
        return FERRY_POOL_FULL;
    uint64_t mask = a->granule - 1;
    if (size > UINT64_MAX - mask)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "allocator: size %" PRIu64 " overflows when rounded up to the granule"
                           " (%" PRIu64 " bytes)",
                           size, a->granule);
    uint64_t need = (size + mask) & ~mask;
    uint32_t pred;
    uint32_t x = tree_best_fit(a->nodes, a->tree_root, need, &pred);
    if (x == NIL)
        return FERRY_POOL_FULL;
    uint32_t y = take_low_end(a, x, pred, need);
    if (y == NIL)
        return FERRY_POOL_FULL;
    a->nodes[y].state = FERRY__ALLOC_USED;
    a->used_bytes += need;
    a->live_allocs++;
    *offset = a->nodes[y].offset;
    *handle = y;
    return FERRY_OK;
}

ferry_status ferry__alloc_free(ferry__alloc *a, uint32_t handle)
{
    if (handle >= a->node_cap)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "allocator: handle %" PRIu32 " is out of range (%" PRIu32 " nodes)",
                           handle, a->node_cap);
    node_t *n = a->nodes;
    if (n[handle].state != FERRY__ALLOC_USED)
        return ferry__fail(
            FERRY_INVALID_ARGUMENT,
            "allocator: handle %" PRIu32 " does not name a live allocation (double free?)", handle);
    uint32_t p = n[handle].prev, q = n[handle].next;
    a->used_bytes -= n[handle].size;
    a->live_allocs--;
    if (p != NIL && n[p].state != FERRY__ALLOC_FREE)
        p = NIL;
    if (q != NIL && n[q].state != FERRY__ALLOC_FREE)
        q = NIL;
    if (p == NIL && q == NIL)
        free_set_insert(a, handle);
    else
        merge_free(a, handle, p, q);
    return FERRY_OK;
}

uint64_t ferry__alloc_size_of(const ferry__alloc *a, uint32_t handle)
{
    if (handle >= a->node_cap || a->nodes[handle].state != FERRY__ALLOC_USED)
        return 0;
    return a->nodes[handle].size;
}

uint64_t ferry__alloc_largest_free(const ferry__alloc *a)
{
    uint32_t x = a->tree_root;
    if (x == NIL || a->nodes == NULL)
        return 0;
    while (a->nodes[x].right != NIL)
        x = a->nodes[x].right;
    return a->nodes[x].size;
}

/* ------------------------------------------------------------------------------------
 * Invariant check
 * ---------------------------------------------------------------------------------- */

/* What the walk of the address list counted. */
typedef struct check_walk {
    uint64_t used_bytes;
    uint32_t live;
    uint32_t free_count;
    uint32_t listed;
} check_walk;

/* In-order state of the tree walk. */
typedef struct check_tree_walk {
    uint32_t count;
    uint32_t last;
} check_tree_walk;

static int check_bad(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int check_bad(int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ferry__fail(FERRY_POOL_FAILED, "allocator check failed (%d): %s", code, msg);
    return code;
}

static int check_header(const ferry__alloc *a)
{
    if (a == NULL || a->nodes == NULL || a->max_allocs == 0 ||
        a->max_allocs > FERRY__ALLOC_MAX_ALLOCS || a->node_cap != 2u * a->max_allocs + 2u)
        return check_bad(FERRY__ALLOC_CHECK_HEADER, "no node array or bad capacity");
    if (a->granule == 0 || (a->granule & (a->granule - 1)) != 0)
        return check_bad(FERRY__ALLOC_CHECK_HEADER, "granule %" PRIu64 " not a power of two",
                         a->granule);
    if (a->size < a->granule || (a->size & (a->granule - 1)) != 0)
        return check_bad(FERRY__ALLOC_CHECK_HEADER,
                         "size %" PRIu64 " not a nonzero multiple of the granule", a->size);
    return 0;
}

/* Checks extent x, which the walk expects at offset expect after extent prev. */
static int check_extent(const ferry__alloc *a, uint32_t x, uint32_t prev, uint64_t expect)
{
    const node_t *n = a->nodes;
    if (n[x].state != FERRY__ALLOC_FREE && n[x].state != FERRY__ALLOC_USED)
        return check_bad(FERRY__ALLOC_CHECK_STATE, "node %" PRIu32 " in the list has state %u", x,
                         (unsigned)n[x].state);
    if (((n[x].offset | n[x].size) & (a->granule - 1)) != 0)
        return check_bad(FERRY__ALLOC_CHECK_GRANULE,
                         "extent %" PRIu32 " [%" PRIu64 ", +%" PRIu64 ") not granule-aligned", x,
                         n[x].offset, n[x].size);
    if (n[x].offset != expect || n[x].size == 0 || n[x].size > a->size - expect)
        return check_bad(FERRY__ALLOC_CHECK_TILING,
                         "extent %" PRIu32 " [%" PRIu64 ", +%" PRIu64 ") expected at %" PRIu64, x,
                         n[x].offset, n[x].size, expect);
    if (n[x].state == FERRY__ALLOC_FREE && prev != NIL && n[prev].state == FERRY__ALLOC_FREE)
        return check_bad(FERRY__ALLOC_CHECK_ADJACENT,
                         "free extents %" PRIu32 " and %" PRIu32 " are adjacent", prev, x);
    return 0;
}

static int check_counters(const ferry__alloc *a, const check_walk *w, uint64_t end)
{
    if (end != a->size)
        return check_bad(FERRY__ALLOC_CHECK_TILING,
                         "extents end at %" PRIu64 ", not at size %" PRIu64, end, a->size);
    if (w->used_bytes != a->used_bytes)
        return check_bad(FERRY__ALLOC_CHECK_USED_BYTES,
                         "used_bytes %" PRIu64 " but used extents hold %" PRIu64, a->used_bytes,
                         w->used_bytes);
    if (w->live != a->live_allocs || a->live_allocs > a->max_allocs)
        return check_bad(FERRY__ALLOC_CHECK_LIVE,
                         "live_allocs %" PRIu32 " (max %" PRIu32 ") but %" PRIu32 " used extents",
                         a->live_allocs, a->max_allocs, w->live);
    return 0;
}

static int check_list(const ferry__alloc *a, check_walk *w)
{
    const node_t *n = a->nodes;
    uint64_t expect = 0;
    uint32_t prev = NIL;
    for (uint32_t x = a->first; x != NIL; prev = x, x = n[x].next) {
        if (x >= a->node_cap || w->listed >= a->node_cap || n[x].prev != prev)
            return check_bad(FERRY__ALLOC_CHECK_LINK,
                             "bad link to node %" PRIu32 " after node %" PRIu32, x, prev);
        int rc = check_extent(a, x, prev, expect);
        if (rc != 0)
            return rc;
        expect += n[x].size;
        w->listed++;
        if (n[x].state == FERRY__ALLOC_USED) {
            w->live++;
            w->used_bytes += n[x].size;
        } else {
            w->free_count++;
        }
    }
    return check_counters(a, w, expect);
}

/* The stack holds only unused nodes (so none of the list's), and the two hold every node. */
static int check_stack(const ferry__alloc *a, const check_walk *w)
{
    const node_t *n = a->nodes;
    uint32_t count = 0;
    for (uint32_t x = a->free_head; x != NIL; x = n[x].next) {
        if (x >= a->node_cap || count >= a->node_cap)
            return check_bad(FERRY__ALLOC_CHECK_STACK,
                             "unused stack: bad index %" PRIu32 " or cycle", x);
        if (n[x].state != FERRY__ALLOC_UNUSED)
            return check_bad(FERRY__ALLOC_CHECK_STACK,
                             "node %" PRIu32 " is on the unused stack and in the list", x);
        count++;
    }
    if (count + w->listed != a->node_cap)
        return check_bad(FERRY__ALLOC_CHECK_LEAK,
                         "%" PRIu32 " listed + %" PRIu32 " unused nodes != %" PRIu32, w->listed,
                         count, a->node_cap);
    return 0;
}

/* Visits node x in order: after its left subtree, before its right one. */
static int check_tree_visit(const ferry__alloc *a, uint32_t x, check_tree_walk *t)
{
    if (t->last != NIL && !key_less(a->nodes, t->last, x))
        return check_bad(FERRY__ALLOC_CHECK_TREE_ORDER,
                         "tree node %" PRIu32 " not after node %" PRIu32 " by (size, offset)", x,
                         t->last);
    if (t->count >= a->node_cap)
        return check_bad(FERRY__ALLOC_CHECK_TREE_COUNT, "tree has too many nodes");
    t->last = x;
    t->count++;
    return 0;
}

static int check_tree_node(const ferry__alloc *a, uint32_t x, uint32_t parent, unsigned depth)
{
    if (x >= a->node_cap || depth > CHECK_MAX_DEPTH)
        return check_bad(FERRY__ALLOC_CHECK_TREE_NODE,
                         "tree: bad index %" PRIu32 " or depth %u (cycle?)", x, depth);
    if (a->nodes[x].state != FERRY__ALLOC_FREE)
        return check_bad(FERRY__ALLOC_CHECK_TREE_NODE,
                         "tree node %" PRIu32 " is not a free extent (state %u)", x,
                         (unsigned)a->nodes[x].state);
    if (a->nodes[x].parent != parent)
        return check_bad(FERRY__ALLOC_CHECK_TREE_PARENT,
                         "tree node %" PRIu32 " has parent %" PRIu32 ", not %" PRIu32, x,
                         a->nodes[x].parent, parent);
    return 0;
}

/* Checks the subtree at x, whose parent is parent; *height gets its height. */
static int check_subtree(const ferry__alloc *a, uint32_t x, uint32_t parent, unsigned depth,
                         check_tree_walk *t, unsigned *height)
{
    unsigned hl = 0, hr = 0;
    *height = 0;
    if (x == NIL)
        return 0;
    int rc = check_tree_node(a, x, parent, depth);
    if (rc == 0)
        rc = check_subtree(a, a->nodes[x].left, x, depth + 1, t, &hl);
    if (rc == 0)
        rc = check_tree_visit(a, x, t);
    if (rc == 0)
        rc = check_subtree(a, a->nodes[x].right, x, depth + 1, t, &hr);
    if (rc != 0)
        return rc;
    *height = 1u + (hl > hr ? hl : hr);
    if (a->nodes[x].height != *height)
        return check_bad(FERRY__ALLOC_CHECK_HEIGHT, "tree node %" PRIu32 " has height %u, not %u",
                         x, (unsigned)a->nodes[x].height, *height);
    if (hl > hr + 1 || hr > hl + 1)
        return check_bad(FERRY__ALLOC_CHECK_BALANCE,
                         "tree node %" PRIu32 " out of balance (%u vs %u)", x, hl, hr);
    return 0;
}

static int check_tree(const ferry__alloc *a, const check_walk *w)
{
    check_tree_walk t = {0, NIL};
    unsigned height;
    int rc = check_subtree(a, a->tree_root, NIL, 0, &t, &height);
    if (rc != 0)
        return rc;
    if (t.count != a->free_extents || w->free_count != a->free_extents)
        return check_bad(FERRY__ALLOC_CHECK_TREE_COUNT,
                         "tree holds %" PRIu32 ", free_extents %" PRIu32 ", list has %" PRIu32,
                         t.count, a->free_extents, w->free_count);
    return 0;
}

int ferry__alloc_check(const ferry__alloc *a)
{
    check_walk w = {0, 0, 0, 0};
    int rc = check_header(a);
    if (rc == 0)
        rc = check_list(a, &w);
    if (rc == 0)
        rc = check_stack(a, &w);
    if (rc == 0)
        rc = check_tree(a, &w);
    return rc;
}
