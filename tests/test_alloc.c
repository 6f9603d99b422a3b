/* Tests of the pool's best-fit extent allocator (src/pool/alloc.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "pool/alloc.h"

#define G        256u /* granule of the deterministic tests */
#define NIL      FERRY__ALLOC_NIL
#define SENTINEL "sentinel message"

/* ------------------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------------------- */

static void must_init(ferry__alloc *a, uint64_t size, uint64_t granule, uint32_t max_allocs)
{
    assert_int_equal(ferry__alloc_init(a, size, granule, max_allocs), FERRY_OK);
    assert_int_equal(ferry__alloc_check(a), 0);
}

/* Allocates size bytes, expects them at offset expect; returns the handle. */
static uint32_t must_alloc(ferry__alloc *a, uint64_t size, uint64_t expect)
{
    uint64_t off = UINT64_MAX;
    uint32_t h = NIL;
    assert_int_equal(ferry__alloc_alloc(a, size, &off, &h), FERRY_OK);
    assert_int_equal(off, expect);
    assert_true(h < a->node_cap);
    assert_int_equal(ferry__alloc_check(a), 0);
    return h;
}

static void must_free(ferry__alloc *a, uint32_t h)
{
    assert_int_equal(ferry__alloc_free(a, h), FERRY_OK);
    assert_int_equal(ferry__alloc_check(a), 0);
}

/* Expects POOL_FULL, outputs untouched and no error message written. */
static void must_be_full(ferry__alloc *a, uint64_t size)
{
    uint64_t off = 12345;
    uint32_t h = 678;
    ferry__fail(FERRY_OK, SENTINEL);
    assert_int_equal(ferry__alloc_alloc(a, size, &off, &h), FERRY_POOL_FULL);
    assert_int_equal(off, 12345);
    assert_int_equal(h, 678);
    assert_string_equal(ferry_last_error(), SENTINEL);
    assert_int_equal(ferry__alloc_check(a), 0);
}

static void expect_error(ferry_status got, ferry_status want, const char *needle)
{
    assert_int_equal(got, want);
    if (strstr(ferry_last_error(), needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", ferry_last_error(), needle);
}

static void assert_zeroed(const ferry__alloc *a)
{
    ferry__alloc zero;
    memset(&zero, 0, sizeof(zero));
    assert_memory_equal(a, &zero, sizeof(zero));
}

/* A copy of an allocator's header and node array, to prove that nothing changed. */
typedef struct snapshot {
    ferry__alloc head;
    ferry__alloc_node *nodes;
} snapshot;

static void snap_take(snapshot *s, const ferry__alloc *a)
{
    s->head = *a;
    s->nodes = malloc(a->node_cap * sizeof(*s->nodes));
    assert_non_null(s->nodes);
    memcpy(s->nodes, a->nodes, a->node_cap * sizeof(*s->nodes));
}

static void snap_assert_same(const snapshot *s, const ferry__alloc *a)
{
    assert_memory_equal(&s->head, a, sizeof(*a));
    assert_memory_equal(s->nodes, a->nodes, a->node_cap * sizeof(*s->nodes));
}

static void snap_restore(const snapshot *s, ferry__alloc *a)
{
    ferry__alloc_node *nodes = a->nodes;
    memcpy(nodes, s->nodes, s->head.node_cap * sizeof(*nodes));
    *a = s->head;
    a->nodes = nodes;
}

/* ------------------------------------------------------------------------------------
 * init / fini
 * ---------------------------------------------------------------------------------- */

static void test_init_rejects_bad_granule(void **state)
{
    (void)state;
    ferry__alloc a;
    expect_error(ferry__alloc_init(&a, 1 << 20, 0, 4), FERRY_INVALID_ARGUMENT,
                 "granule 0 is not a nonzero power of two");
    assert_zeroed(&a);
    expect_error(ferry__alloc_init(&a, 1 << 20, 3, 4), FERRY_INVALID_ARGUMENT,
                 "granule 3 is not a nonzero power of two");
    expect_error(ferry__alloc_init(&a, 1 << 20, 384, 4), FERRY_INVALID_ARGUMENT, "granule 384");
    assert_zeroed(&a);
    ferry__alloc_fini(&a);
}

static void test_init_rejects_small_size(void **state)
{
    (void)state;
    ferry__alloc a;
    expect_error(ferry__alloc_init(&a, 0, G, 4), FERRY_INVALID_ARGUMENT,
                 "size 0 is smaller than one granule (256 bytes)");
    expect_error(ferry__alloc_init(&a, G - 1, G, 4), FERRY_INVALID_ARGUMENT,
                 "size 255 is smaller than one granule");
    assert_zeroed(&a);
    must_init(&a, G, G, 1);
    assert_int_equal(a.size, G);
    ferry__alloc_fini(&a);
}

static void test_init_rejects_bad_max_allocs(void **state)
{
    (void)state;
    ferry__alloc a;
    expect_error(ferry__alloc_init(&a, 1 << 20, G, 0), FERRY_INVALID_ARGUMENT,
                 "max_allocs must be at least 1");
    expect_error(ferry__alloc_init(&a, 1 << 20, G, FERRY__ALLOC_MAX_ALLOCS + 1),
                 FERRY_INVALID_ARGUMENT, "exceeds the limit");
    expect_error(ferry__alloc_init(&a, 1 << 20, G, UINT32_MAX), FERRY_INVALID_ARGUMENT,
                 "max_allocs 4294967295 exceeds");
    assert_zeroed(&a);
    expect_error(ferry__alloc_init(NULL, 1 << 20, G, 1), FERRY_INVALID_ARGUMENT, "NULL");
}

static void test_init_layout(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 1000, G, 4);
    assert_int_equal(a.size, 768);
    assert_int_equal(a.granule, G);
    assert_int_equal(a.node_cap, 10);
    assert_int_equal(a.max_allocs, 4);
    assert_int_equal(a.live_allocs, 0);
    assert_int_equal(a.used_bytes, 0);
    assert_int_equal(a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&a), 768);
    assert_int_equal(a.nodes[a.first].offset, 0);
    assert_int_equal(a.nodes[a.first].size, 768);
    assert_int_equal(a.nodes[a.first].next, NIL);
    ferry__alloc_fini(&a);
    assert_zeroed(&a);
}

static void test_fini_harmless(void **state)
{
    (void)state;
    ferry__alloc a;
    memset(&a, 0, sizeof(a));
    ferry__alloc_fini(&a);
    ferry__alloc_fini(&a);
    ferry__alloc_fini(NULL);
    assert_zeroed(&a);
    /* A zeroed allocator refuses everything without crashing. */
    uint64_t off = 5;
    uint32_t h = 6;
    ferry__fail(FERRY_OK, SENTINEL);
    assert_int_equal(ferry__alloc_alloc(&a, 1, &off, &h), FERRY_POOL_FULL);
    assert_string_equal(ferry_last_error(), SENTINEL);
    assert_int_equal(off, 5);
    assert_int_equal(h, 6);
    expect_error(ferry__alloc_free(&a, 0), FERRY_INVALID_ARGUMENT, "out of range");
    assert_int_equal(ferry__alloc_size_of(&a, 0), 0);
    assert_int_equal(ferry__alloc_largest_free(&a), 0);
    assert_int_equal(ferry__alloc_check(&a), FERRY__ALLOC_CHECK_HEADER);
}

/* ------------------------------------------------------------------------------------
 * Placement
 * ---------------------------------------------------------------------------------- */

static void test_simple_sequence(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 16 * G, G, 8);
    uint32_t h0 = must_alloc(&a, 100, 0);
    uint32_t h1 = must_alloc(&a, G, G);
    uint32_t h2 = must_alloc(&a, G + 1, 2 * G);
    uint32_t h3 = must_alloc(&a, 1, 4 * G);
    assert_int_equal(ferry__alloc_size_of(&a, h0), G);
    assert_int_equal(ferry__alloc_size_of(&a, h1), G);
    assert_int_equal(ferry__alloc_size_of(&a, h2), 2 * G);
    assert_int_equal(ferry__alloc_size_of(&a, h3), G);
    assert_int_equal(a.used_bytes, 5 * G);
    assert_int_equal(a.live_allocs, 4);
    assert_int_equal(a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&a), 11 * G);
    must_alloc(&a, 11 * G, 5 * G);
    assert_int_equal(a.free_extents, 0);
    assert_int_equal(ferry__alloc_largest_free(&a), 0);
    must_be_full(&a, 1);
    ferry__alloc_fini(&a);
}

static void test_split_takes_low_end(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 8 * G, G, 4);
    must_alloc(&a, 3 * G, 0);
    assert_int_equal(a.free_extents, 1);
    uint32_t rest = a.tree_root;
    assert_int_equal(a.nodes[rest].offset, 3 * G);
    assert_int_equal(a.nodes[rest].size, 5 * G);
    assert_int_equal(ferry__alloc_largest_free(&a), 5 * G);
    must_alloc(&a, 5 * G, 3 * G);
    ferry__alloc_fini(&a);
}

static void test_best_fit_choice(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 64 * G, G, 16);
    uint32_t ha = must_alloc(&a, 3 * G, 0);
    must_alloc(&a, G, 3 * G);
    uint32_t hc = must_alloc(&a, G, 4 * G);
    must_alloc(&a, G, 5 * G);
    uint32_t he = must_alloc(&a, 2 * G, 6 * G);
    must_alloc(&a, G, 8 * G);
    uint32_t hg = must_alloc(&a, 2 * G, 9 * G);
    must_alloc(&a, G, 11 * G);
    must_free(&a, ha); /* hole 3G at 0 */
    must_free(&a, hc); /* hole 1G at 4G */
    must_free(&a, he); /* hole 2G at 6G */
    must_free(&a, hg); /* hole 2G at 9G; tail 52G at 12G */
    assert_int_equal(a.free_extents, 5);
    assert_int_equal(ferry__alloc_largest_free(&a), 52 * G);
    must_alloc(&a, G, 4 * G);     /* the smallest hole, not the first */
    must_alloc(&a, 2 * G, 6 * G); /* lowest of two equal holes */
    must_alloc(&a, 2 * G, 9 * G);
    must_alloc(&a, 1, 0); /* only 3G and 52G left: 3G wins, split low */
    assert_int_equal(a.free_extents, 2);
    must_alloc(&a, 2 * G, G); /* the 2G remainder of the 3G hole */
    assert_int_equal(a.free_extents, 1);
    must_be_full(&a, 52 * G + 1);
    must_alloc(&a, 52 * G, 12 * G);
    assert_int_equal(a.free_extents, 0);
    assert_int_equal(ferry__alloc_largest_free(&a), 0);
    assert_int_equal(a.used_bytes, 64 * G);
    ferry__alloc_fini(&a);
}

static void test_equal_holes_lowest_offset(void **state)
{
    (void)state;
    ferry__alloc a;
    uint32_t h[16];
    must_init(&a, 16 * G, G, 16);
    for (uint32_t i = 0; i < 16; i++)
        h[i] = must_alloc(&a, G, i * G);
    /* Free every other granule, from the top down, so tree insertion order differs from
     * address order. */
    for (uint32_t i = 16; i-- > 0;)
        if (i % 2 == 1)
            must_free(&a, h[i]);
    assert_int_equal(a.free_extents, 8);
    for (uint32_t i = 1; i < 16; i += 2)
        h[i] = must_alloc(&a, G, i * G);
    must_be_full(&a, 1);
    ferry__alloc_fini(&a);
}

/* ------------------------------------------------------------------------------------
 * Merging
 * ---------------------------------------------------------------------------------- */

static void test_merge_restores_full_extent(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 16 * G, G, 8);
    uint32_t ha = must_alloc(&a, 4 * G, 0);
    uint32_t hb = must_alloc(&a, 4 * G, 4 * G);
    uint32_t hc = must_alloc(&a, 4 * G, 8 * G);
    uint32_t hd = must_alloc(&a, 4 * G, 12 * G);
    assert_int_equal(a.free_extents, 0);
    must_free(&a, hb); /* no free neighbour */
    assert_int_equal(a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&a), 4 * G);
    must_free(&a, ha); /* merges with the next extent only */
    assert_int_equal(a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&a), 8 * G);
    must_free(&a, hd); /* last extent, previous one used */
    assert_int_equal(a.free_extents, 2);
    assert_int_equal(ferry__alloc_largest_free(&a), 8 * G);
    must_free(&a, hc); /* merges both ways */
    assert_int_equal(a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&a), 16 * G);
    assert_int_equal(a.live_allocs, 0);
    assert_int_equal(a.used_bytes, 0);
    assert_int_equal(a.nodes[a.first].size, 16 * G);
    assert_int_equal(a.nodes[a.first].next, NIL);
    assert_int_equal(a.tree_root, a.first);
    must_alloc(&a, 16 * G, 0);
    ferry__alloc_fini(&a);
}

static void test_merge_with_previous(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 16 * G, G, 8);
    uint32_t ha = must_alloc(&a, 2 * G, 0);
    uint32_t hb = must_alloc(&a, 3 * G, 2 * G);
    must_alloc(&a, G, 5 * G);
    must_free(&a, ha);
    assert_int_equal(a.free_extents, 2);
    must_free(&a, hb); /* merges with the previous extent only */
    assert_int_equal(a.free_extents, 2);
    assert_int_equal(ferry__alloc_largest_free(&a), 10 * G);
    must_alloc(&a, 5 * G, 0); /* the 5G hole fits exactly, better than the 10G tail */
    assert_int_equal(a.free_extents, 1);
    ferry__alloc_fini(&a);
}

/* ------------------------------------------------------------------------------------
 * Errors and POOL_FULL
 * ---------------------------------------------------------------------------------- */

static void test_alloc_rejects_bad_sizes(void **state)
{
    (void)state;
    ferry__alloc a;
    snapshot s;
    uint64_t off = 7;
    uint32_t h = 9;
    must_init(&a, 16 * G, G, 4);
    must_alloc(&a, G, 0);
    snap_take(&s, &a);
    expect_error(ferry__alloc_alloc(&a, 0, &off, &h), FERRY_INVALID_ARGUMENT,
                 "cannot allocate 0 bytes");
    expect_error(ferry__alloc_alloc(&a, UINT64_MAX, &off, &h), FERRY_INVALID_ARGUMENT,
                 "size 18446744073709551615 overflows when rounded up to the granule");
    expect_error(ferry__alloc_alloc(&a, UINT64_MAX - G + 2, &off, &h), FERRY_INVALID_ARGUMENT,
                 "overflows");
    assert_int_equal(off, 7);
    assert_int_equal(h, 9);
    snap_assert_same(&s, &a);
    must_be_full(&a, UINT64_MAX - G + 1); /* rounds to a representable, too large size */
    must_be_full(&a, 15 * G + 1);
    snap_assert_same(&s, &a);
    free(s.nodes);
    ferry__alloc_fini(&a);
}

static void test_pool_full_at_max_allocs(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 1 << 20, G, 3);
    uint32_t h0 = must_alloc(&a, 1, 0);
    must_alloc(&a, 1, G);
    must_alloc(&a, 1, 2 * G);
    must_be_full(&a, 1);
    assert_int_equal(a.live_allocs, 3);
    must_free(&a, h0);
    must_alloc(&a, 1, 0);
    must_be_full(&a, 1);
    ferry__alloc_fini(&a);

    must_init(&a, 4 * G, G, 1);
    uint32_t h = must_alloc(&a, G, 0);
    must_be_full(&a, G);
    must_free(&a, h);
    must_alloc(&a, 4 * G, 0);
    ferry__alloc_fini(&a);
}

static void test_pool_full_no_fit(void **state)
{
    (void)state;
    ferry__alloc a;
    uint32_t h[4];
    must_init(&a, 4 * G, G, 8);
    must_be_full(&a, 5 * G);
    must_be_full(&a, 4 * G + 1);
    for (uint32_t i = 0; i < 4; i++)
        h[i] = must_alloc(&a, G, i * G);
    must_free(&a, h[0]);
    must_free(&a, h[2]);
    assert_int_equal(a.free_extents, 2);
    assert_int_equal(ferry__alloc_largest_free(&a), G);
    must_be_full(&a, 2 * G); /* 2G free, but not in one piece */
    must_alloc(&a, G, 0);
    must_alloc(&a, G, 2 * G);
    must_be_full(&a, 1);
    ferry__alloc_fini(&a);
}

static void test_free_rejects_bad_handles(void **state)
{
    (void)state;
    ferry__alloc a;
    snapshot s;
    must_init(&a, 16 * G, G, 4);
    uint32_t h0 = must_alloc(&a, G, 0);
    uint32_t h1 = must_alloc(&a, G, G);
    uint32_t free_node = a.tree_root;
    uint32_t unused_node = a.free_head;
    snap_take(&s, &a);
    expect_error(ferry__alloc_free(&a, a.node_cap), FERRY_INVALID_ARGUMENT,
                 "handle 10 is out of range (10 nodes)");
    expect_error(ferry__alloc_free(&a, UINT32_MAX), FERRY_INVALID_ARGUMENT, "out of range");
    expect_error(ferry__alloc_free(&a, free_node), FERRY_INVALID_ARGUMENT,
                 "does not name a live allocation");
    expect_error(ferry__alloc_free(&a, unused_node), FERRY_INVALID_ARGUMENT,
                 "does not name a live allocation");
    snap_assert_same(&s, &a);
    free(s.nodes);

    must_free(&a, h1); /* merges with the tail */
    snap_take(&s, &a);
    expect_error(ferry__alloc_free(&a, h1), FERRY_INVALID_ARGUMENT,
                 "does not name a live allocation (double free?)");
    snap_assert_same(&s, &a);
    free(s.nodes);

    must_free(&a, h0);
    snap_take(&s, &a);
    expect_error(ferry__alloc_free(&a, h0), FERRY_INVALID_ARGUMENT, "double free");
    expect_error(ferry__alloc_free(&a, h1), FERRY_INVALID_ARGUMENT, "double free");
    snap_assert_same(&s, &a);
    free(s.nodes);
    assert_int_equal(a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&a), 16 * G);
    ferry__alloc_fini(&a);
}

static void test_size_of(void **state)
{
    (void)state;
    ferry__alloc a;
    must_init(&a, 16 * G, G, 4);
    uint32_t h = must_alloc(&a, 3 * G - 5, 0);
    assert_int_equal(ferry__alloc_size_of(&a, h), 3 * G);
    assert_int_equal(ferry__alloc_size_of(&a, a.tree_root), 0); /* a free extent */
    assert_int_equal(ferry__alloc_size_of(&a, a.node_cap), 0);
    assert_int_equal(ferry__alloc_size_of(&a, UINT32_MAX), 0);
    must_free(&a, h);
    assert_int_equal(ferry__alloc_size_of(&a, h), 0);
    ferry__alloc_fini(&a);
}

static void test_huge_pool(void **state)
{
    (void)state;
    ferry__alloc a;
    const uint64_t g = 4096;
    must_init(&a, UINT64_MAX, g, 4);
    assert_int_equal(a.size, UINT64_MAX - (g - 1));
    uint32_t h0 = must_alloc(&a, UINT64_MAX / 2, 0);
    uint64_t half = (UINT64_MAX / 2 + g - 1) & ~(g - 1);
    assert_int_equal(ferry__alloc_size_of(&a, h0), half);
    must_be_full(&a, a.size - half + 1);
    must_alloc(&a, a.size - half, half);
    must_free(&a, h0);
    assert_int_equal(ferry__alloc_largest_free(&a), half);
    ferry__alloc_fini(&a);
}

/* ------------------------------------------------------------------------------------
 * The invariant check itself must catch corruption
 * ---------------------------------------------------------------------------------- */

/* Free extents of a, in address order, into out (at most max); returns how many. */
static uint32_t list_free_nodes(const ferry__alloc *a, uint32_t *out, uint32_t max)
{
    uint32_t k = 0;
    for (uint32_t x = a->first; x != NIL; x = a->nodes[x].next)
        if (a->nodes[x].state == FERRY__ALLOC_FREE && k < max)
            out[k++] = x;
    return k;
}

/* Expects the corrupted allocator to fail the check with code, then restores it. */
static void corrupt_expect(ferry__alloc *a, const snapshot *s, int code, const char *what)
{
    int rc = ferry__alloc_check(a);
    if (rc != code)
        fail_msg("%s: check returned %d, expected %d (%s)", what, rc, code, ferry_last_error());
    assert_non_null(strstr(ferry_last_error(), "allocator check failed"));
    snap_restore(s, a);
    assert_int_equal(ferry__alloc_check(a), 0);
}

/* Rebuilds the 3-node tree as a right-leaning chain with correct heights. */
static void make_chain(ferry__alloc *a, const uint32_t f[3])
{
    ferry__alloc_node *n = a->nodes;
    a->tree_root = f[0];
    for (int i = 0; i < 3; i++) {
        n[f[i]].left = NIL;
        n[f[i]].right = i < 2 ? f[i + 1] : NIL;
        n[f[i]].parent = i > 0 ? f[i - 1] : NIL;
        n[f[i]].height = (uint8_t)(3 - i);
    }
}

static void test_check_detects_corruption(void **state)
{
    (void)state;
    ferry__alloc a;
    snapshot s;
    uint32_t h[8], f[3];
    must_init(&a, 16 * G, G, 8);
    /* Extents: F1 U F2 U U F3(tail), with sizes 1G, 1G, 2G, 1G, 1G, 10G. */
    h[0] = must_alloc(&a, G, 0);
    h[1] = must_alloc(&a, G, G);
    h[2] = must_alloc(&a, 2 * G, 2 * G);
    h[3] = must_alloc(&a, G, 4 * G);
    h[4] = must_alloc(&a, G, 5 * G);
    must_free(&a, h[0]);
    must_free(&a, h[2]);
    assert_int_equal(list_free_nodes(&a, f, 3), 3); /* keys ascend: (1G,0) (2G,2G) (10G,6G) */
    assert_int_equal(a.free_extents, 3);
    assert_int_equal(a.tree_root, f[1]);
    snap_take(&s, &a);
    ferry__alloc_node *n = a.nodes;

    a.granule = 3;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_HEADER, "a.granule = 3");
    a.node_cap++;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_HEADER, "a.node_cap++");
    n[h[3]].prev = h[1];
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_LINK, "n[h[3]].prev = h[1]");
    n[h[4]].next = h[1]; /* cycle back */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_LINK, "n[h[4]].next = h[1]");
    n[h[1]].size += G;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TILING, "n[h[1]].size += G");
    n[f[2]].size -= G; /* the tail no longer reaches size */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TILING, "n[f[2]].size -= G");
    n[h[1]].size += 1;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_GRANULE, "n[h[1]].size += 1");
    n[h[1]].state = FERRY__ALLOC_FREE; /* between two free extents */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_ADJACENT, "n[h[1]].state = FERRY__ALLOC_FREE");
    n[h[3]].state = FERRY__ALLOC_UNUSED;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_STATE, "n[h[3]].state = FERRY__ALLOC_UNUSED");
    a.used_bytes += G;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_USED_BYTES, "a.used_bytes += G");
    a.live_allocs--;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_LIVE, "a.live_allocs--");
    n[a.free_head].state = FERRY__ALLOC_USED;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_STACK, "n[a.free_head].state = FERRY__ALLOC_USED");
    n[a.free_head].next = a.free_head; /* stack cycle */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_STACK, "n[a.free_head].next = a.free_head");
    a.free_head = n[a.free_head].next; /* one unused node leaked */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_LEAK, "a.free_head = n[a.free_head].next");
    n[f[1]].left = h[1]; /* a used extent in the tree */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_NODE, "n[f[1]].left = h[1]");
    a.tree_root = a.node_cap + 3;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_NODE, "a.tree_root = a.node_cap + 3");
    n[f[1]].left = f[2]; /* children swapped */
    n[f[1]].right = f[0];
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_ORDER,
                   "n[f[1]].left = f[2]; n[f[1]].right = f[0]");
    n[f[1]].height = 3;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_HEIGHT, "n[f[1]].height = 3");
    make_chain(&a, f);
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_BALANCE, "make_chain(&a, f)");
    a.free_extents++;
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_COUNT, "a.free_extents++");
    n[f[1]].right = NIL; /* the tail extent dropped from the tree */
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_COUNT, "n[f[1]].right = NIL");
    n[f[2]].parent = f[0];
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_PARENT, "n[f[2]].parent = f[0]");
    n[f[1]].parent = f[1];
    corrupt_expect(&a, &s, FERRY__ALLOC_CHECK_TREE_PARENT, "n[f[1]].parent = f[1]");
    assert_int_equal(ferry__alloc_check(NULL), FERRY__ALLOC_CHECK_HEADER);
    free(s.nodes);
    ferry__alloc_fini(&a);
}

/* ------------------------------------------------------------------------------------
 * Random operation sequences against a shadow model
 * ---------------------------------------------------------------------------------- */

typedef struct rnd_cfg {
    uint64_t seed;
    uint64_t granule;
    uint32_t granules;   /* pool size in granules */
    uint32_t max_allocs; /* live allocations */
    uint32_t ops;
    uint32_t big; /* largest request in granules */
} rnd_cfg;

typedef struct live_rec {
    uint32_t handle;
    uint32_t first; /* first granule */
    uint32_t count; /* granules */
} live_rec;

typedef struct model {
    rnd_cfg cfg;
    ferry__alloc a;
    uint8_t *owned;     /* per granule: 1 if inside a live allocation */
    uint8_t *is_handle; /* per node: 1 if a live handle */
    live_rec *live;
    uint32_t nlive;
    uint64_t used;
    uint64_t rng;
    uint64_t pool_full;
} model;

/* What a scan of the shadow finds. */
typedef struct shadow_scan {
    uint32_t best;    /* first granule of the best fit, UINT32_MAX if none */
    uint32_t largest; /* longest free run, in granules */
    uint32_t runs;    /* maximal free runs */
} shadow_scan;

static uint64_t rnd_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rnd_below(uint64_t *s, uint64_t n)
{
    return rnd_next(s) % n;
}

/* Scans the shadow for the best fit of need granules (0: none wanted). */
static shadow_scan shadow_find(const model *m, uint32_t need)
{
    shadow_scan r = {UINT32_MAX, 0, 0};
    uint32_t best_len = UINT32_MAX;
    uint32_t i = 0, n = m->cfg.granules;
    while (i < n) {
        if (m->owned[i]) {
            i++;
            continue;
        }
        uint32_t start = i;
        while (i < n && !m->owned[i])
            i++;
        uint32_t len = i - start;
        r.runs++;
        if (len > r.largest)
            r.largest = len;
        if (need != 0 && len >= need && len < best_len) {
            best_len = len;
            r.best = start;
        }
    }
    return r;
}

/* A request size in bytes: mostly small, some medium, a few large; not granule-aligned. */
static uint64_t random_size(model *m)
{
    uint64_t g = m->cfg.granule, r = rnd_below(&m->rng, 100);
    uint64_t max_g = r < 60 ? 4 : r < 90 ? 32 : m->cfg.big;
    return 1 + rnd_below(&m->rng, max_g * g);
}

static void model_alloc(model *m)
{
    uint64_t size = random_size(m), g = m->cfg.granule, off = 0;
    uint32_t need = (uint32_t)((size + g - 1) / g), h = NIL;
    shadow_scan sc = shadow_find(m, need);
    ferry_status st = ferry__alloc_alloc(&m->a, size, &off, &h);
    if (m->nlive == m->cfg.max_allocs || sc.best == UINT32_MAX) {
        assert_int_equal(st, FERRY_POOL_FULL);
        assert_string_equal(ferry_last_error(), SENTINEL);
        m->pool_full++;
        return;
    }
    assert_int_equal(st, FERRY_OK);
    assert_int_equal(off, (uint64_t)sc.best * g); /* the best fit, lowest offset */
    assert_true(off % g == 0 && off + (uint64_t)need * g <= m->a.size);
    assert_true(h < m->a.node_cap);
    assert_false(m->is_handle[h]);
    assert_int_equal(ferry__alloc_size_of(&m->a, h), (uint64_t)need * g);
    for (uint32_t i = sc.best; i < sc.best + need; i++) {
        assert_false(m->owned[i]); /* no overlap with a live allocation */
        m->owned[i] = 1;
    }
    m->is_handle[h] = 1;
    m->live[m->nlive++] = (live_rec){h, sc.best, need};
    m->used += (uint64_t)need * g;
}

static void model_free(model *m)
{
    uint32_t k = (uint32_t)rnd_below(&m->rng, m->nlive);
    live_rec r = m->live[k];
    assert_int_equal(ferry__alloc_free(&m->a, r.handle), FERRY_OK);
    for (uint32_t i = r.first; i < r.first + r.count; i++)
        m->owned[i] = 0;
    m->is_handle[r.handle] = 0;
    m->live[k] = m->live[--m->nlive];
    m->used -= (uint64_t)r.count * m->cfg.granule;
}

/* Frees a handle that names no live allocation: refused, nothing changes. */
static void model_bad_free(model *m)
{
    uint32_t h = (uint32_t)rnd_below(&m->rng, m->a.node_cap + 4);
    if (h < m->a.node_cap && m->is_handle[h])
        return;
    uint32_t live = m->a.live_allocs, extents = m->a.free_extents;
    assert_int_equal(ferry__alloc_free(&m->a, h), FERRY_INVALID_ARGUMENT);
    assert_int_equal(m->a.live_allocs, live);
    assert_int_equal(m->a.free_extents, extents);
    ferry__fail(FERRY_OK, SENTINEL);
}

static void model_verify(model *m)
{
    if (ferry__alloc_check(&m->a) != 0)
        fail_msg("%s", ferry_last_error());
    shadow_scan sc = shadow_find(m, 0);
    assert_int_equal(m->a.live_allocs, m->nlive);
    assert_int_equal(m->a.used_bytes, m->used);
    assert_int_equal(m->a.free_extents, sc.runs); /* every free run is one merged extent */
    assert_int_equal(ferry__alloc_largest_free(&m->a), (uint64_t)sc.largest * m->cfg.granule);
}

/* One operation; phases of 5000 operations lean towards allocating or freeing. */
static void model_step(model *m, uint32_t i)
{
    uint64_t r = rnd_below(&m->rng, 1000);
    uint64_t alloc_per_mille = (i / 5000) % 2 == 0 ? 650 : 350;
    if (r < 10)
        model_bad_free(m);
    else if (m->nlive == 0 || r < 10 + alloc_per_mille)
        model_alloc(m);
    else
        model_free(m);
    model_verify(m);
}

static void model_run(const rnd_cfg *cfg)
{
    model m;
    memset(&m, 0, sizeof(m));
    m.cfg = *cfg;
    m.rng = cfg->seed;
    must_init(&m.a, (uint64_t)cfg->granules * cfg->granule, cfg->granule, cfg->max_allocs);
    m.owned = calloc(cfg->granules, 1);
    m.is_handle = calloc(m.a.node_cap, 1);
    m.live = calloc(cfg->max_allocs, sizeof(*m.live));
    assert_true(m.owned && m.is_handle && m.live);
    ferry__fail(FERRY_OK, SENTINEL);
    for (uint32_t i = 0; i < cfg->ops; i++)
        model_step(&m, i);
    assert_true(m.pool_full > 0); /* the sequence reached the limits */
    while (m.nlive > 0) {
        model_free(&m);
        model_verify(&m);
    }
    assert_int_equal(m.a.free_extents, 1);
    assert_int_equal(ferry__alloc_largest_free(&m.a), m.a.size);
    ferry__alloc_fini(&m.a);
    free(m.owned);
    free(m.is_handle);
    free(m.live);
}

static void test_random_mixed(void **state)
{
    (void)state;
    const rnd_cfg cfg = {1, 256, 1024, 64, 200000, 128};
    model_run(&cfg);
}

static void test_random_tight_max_allocs(void **state)
{
    (void)state;
    const rnd_cfg cfg = {2, 64, 512, 8, 100000, 64};
    model_run(&cfg);
}

static void test_random_granule_one(void **state)
{
    (void)state;
    const rnd_cfg cfg = {3, 1, 300, 24, 100000, 40};
    model_run(&cfg);
}

static void test_random_many_extents(void **state)
{
    (void)state;
    const rnd_cfg cfg = {4, 4096, 4096, 512, 30000, 64};
    model_run(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects_bad_granule),
        cmocka_unit_test(test_init_rejects_small_size),
        cmocka_unit_test(test_init_rejects_bad_max_allocs),
        cmocka_unit_test(test_init_layout),
        cmocka_unit_test(test_fini_harmless),
        cmocka_unit_test(test_simple_sequence),
        cmocka_unit_test(test_split_takes_low_end),
        cmocka_unit_test(test_best_fit_choice),
        cmocka_unit_test(test_equal_holes_lowest_offset),
        cmocka_unit_test(test_merge_restores_full_extent),
        cmocka_unit_test(test_merge_with_previous),
        cmocka_unit_test(test_alloc_rejects_bad_sizes),
        cmocka_unit_test(test_pool_full_at_max_allocs),
        cmocka_unit_test(test_pool_full_no_fit),
        cmocka_unit_test(test_free_rejects_bad_handles),
        cmocka_unit_test(test_size_of),
        cmocka_unit_test(test_huge_pool),
        cmocka_unit_test(test_check_detects_corruption),
        cmocka_unit_test(test_random_mixed),
        cmocka_unit_test(test_random_tight_max_allocs),
        cmocka_unit_test(test_random_granule_one),
        cmocka_unit_test(test_random_many_extents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
