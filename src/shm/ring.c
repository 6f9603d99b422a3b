/* The descriptor rings, both halves (ring.h). */
#include <string.h>

#include "common/atomic.h"
#include "common/error.h"
#include "common/futex.h"
#include "shm/ring.h"
#include "wire/wire.h"

/* Entries are copied word by word with atomics on both sides: a receiver may read an entry
 * it lost to another thread while a later push rewrites it. */
static void entry_store(uint8_t *entry, const uint8_t *bytes)
{
    for (size_t i = 0; i < FERRY_DESCRIPTOR_SIZE; i += 8) {
        uint64_t w;
        memcpy(&w, bytes + i, 8);
        ferry__store_relaxed64((uint64_t *)(entry + i), w);
    }
}

/* Decodes the entry at position i. */
static ferry_status entry_load(ferry__ring *ring, uint32_t depth, uint32_t i, ferry_descriptor *d)
{
    uint8_t raw[FERRY_DESCRIPTOR_SIZE];
    const uint8_t *entry = ferry__ring_entry(ring, depth, i);
    for (size_t w = 0; w < FERRY_DESCRIPTOR_SIZE; w += 8) {
        uint64_t v = ferry__load_relaxed64((const uint64_t *)(entry + w));
        memcpy(raw + w, &v, 8);
    }
    return ferry_descriptor_decode(raw, sizeof(raw), d);
}

/* ---- the producer's half -------------------------------------------------------------- */

int ferry__ring_head(const ferry__ring_tx *tx, uint32_t *head)
{
    uint32_t h = ferry__load_acquire32(&tx->ring->head);
    if (tx->tail - h > tx->depth)
        return -1;
    *head = h;
    return 0;
}

uint32_t ferry__ring_queued(const ferry__ring_tx *tx)
{
    uint32_t head;
    return ferry__ring_head(tx, &head) == 0 ? tx->tail - head : UINT32_MAX;
}

void ferry__ring_drop(ferry__ring_tx *tx)
{
    /* Whatever head holds (a receiver's compare-and-swap from its old value then fails, and
     * it looks again). */
    ferry__exchange_seqcst32(&tx->ring->head, tx->tail);
}

void ferry__ring_push(ferry__ring_tx *tx, const uint8_t *encoded, uint32_t count, uint32_t slot,
                      uint32_t generation)
{
    for (uint32_t i = 0; i < count; i++) {
        uint32_t at = tx->tail + i;
        entry_store(ferry__ring_entry(tx->ring, tx->depth, at),
                    encoded + (size_t)i * FERRY_DESCRIPTOR_SIZE);
        tx->sent[at % tx->depth] = (ferry__ring_sent){slot, generation};
    }
    tx->tail += count;
    /* seq_cst: the store half of a Dekker pair with a receiver's sleep on tail. */
    ferry__store_seqcst32(&tx->ring->tail, tx->tail);
}

void ferry__ring_each_sent(const ferry__ring_tx *tx, uint32_t from,
                           void (*each)(void *arg, uint32_t slot, uint32_t generation), void *arg)
{
    uint32_t n = tx->tail - from;
    if (n > tx->depth)
        n = tx->depth;
    for (uint32_t i = tx->tail - n; i != tx->tail; i++) {
        const ferry__ring_sent *s = &tx->sent[i % tx->depth];
        each(arg, s->slot, s->generation);
    }
}

int ferry__ring_wake_receivers(ferry__ring *ring, int force)
{
    if (ferry__load_seqcst32(&ring->receivers))
        ferry__futex_wake_all(&ring->tail);
    /* A plain look first: the exchange's write would bounce the line on every push. */
    return force ||
           (ferry__load_seqcst32(&ring->armed) && ferry__exchange_seqcst32(&ring->armed, 0));
}

void ferry__ring_wake_senders(ferry__ring *ring)
{
    if (ferry__load_seqcst32(&ring->senders))
        ferry__futex_wake_all(&ring->head);
}

void ferry__ring_sleep_on_head(ferry__ring *ring, uint32_t seen, uint64_t ns)
{
    ferry__fetch_add_seqcst32(&ring->senders, 1);
    /* seq_cst: an acquire load may be satisfied before the count is raised (LDAPR on Arm
     * passes an earlier store-release), and a receiver's head move in between would then
     * wake nobody. */
    if (ferry__load_seqcst32(&ring->head) == seen)
        ferry__futex_wait(&ring->head, seen, ns);
    ferry__fetch_add_seqcst32(&ring->senders, (uint32_t)-1);
}

void ferry__ring_forget_receivers(ferry__ring *ring)
{
    ferry__store_seqcst32(&ring->receivers, 0);
}

/* ---- the rank's half -------------------------------------------------------------------- */

/* Why the part at position i (p) does not belong to the lease whose first entry is first,
 * or NULL: a part must name the same pool, slot and generation, the same number of parts,
 * and be the i-th. */
static const char *part_mismatch(const ferry_descriptor *first, const ferry_descriptor *p,
                                 uint32_t i)
{
    if (memcmp(p->pool_id, first->pool_id, 16) != 0 || p->slot != first->slot ||
        p->generation != first->generation)
        return "belongs to another lease";
    if (p->part_count != first->part_count || p->part_index != i)
        return "is out of order";
    return NULL;
}

/* Checks the entries of the lease at head (its first entry decoded into descs[0]): MALFORMED
 * if they do not form one lease of k parts; the parts that fit in max are decoded into
 * descs. */
static ferry_status load_parts(const ferry__ring_reader *r, uint32_t head, size_t k,
                               ferry_descriptor *descs, size_t max)
{
    const ferry_descriptor *first = &descs[0];
    if (memcmp(first->pool_id, r->pool_id, 16) != 0 || first->slot >= r->max_inflight ||
        (first->part_count && first->part_index != 0))
        return ferry__fail(FERRY_MALFORMED, "descriptor ring of rank %u holds a foreign entry",
                           r->rank);
    for (size_t i = 1; i < k; i++) {
        ferry_descriptor scratch, *p = i < max ? &descs[i] : &scratch;
        ferry_status st = entry_load(r->ring, r->depth, head + (uint32_t)i, p);
        const char *why = st == FERRY_OK ? part_mismatch(first, p, (uint32_t)i) : NULL;
        if (why)
            st = ferry__fail(FERRY_MALFORMED,
                             "descriptor ring of rank %u holds a torn packed lease: its part %zu "
                             "of %zu %s",
                             r->rank, i, k, why);
        if (st != FERRY_OK)
            return st;
    }
    return FERRY_OK;
}

/* One look at the entries at head: FERRY_OK (the k entries of a current lease), LOOK_SKIP
 * (the k entries of a lease no longer current: take them and look again), or an error to
 * return once the k entries it names are taken off the ring. */
enum { LOOK_SKIP = -2 };

static int look_at_head(const ferry__ring_reader *r, uint32_t head, uint32_t tail,
                        ferry_descriptor *descs, size_t max, size_t *k)
{
    *k = 1;
    ferry_status st = entry_load(r->ring, r->depth, head, &descs[0]);
    if (st != FERRY_OK)
        return st; /* dropped alone: the entries after it are the producer's */
    size_t parts = descs[0].part_count ? descs[0].part_count : 1;
    if (parts > tail - head)
        return ferry__fail(FERRY_MALFORMED,
                           "descriptor ring of rank %u holds a lease of %zu parts, %u queued",
                           r->rank, parts, tail - head);
    st = load_parts(r, head, parts, descs, max);
    if (st != FERRY_OK)
        return st; /* its first entry is dropped alone */
    *k = parts;
    /* What is no longer the rank's to read is skipped before anything is asked of the
     * caller (a cancelled packed lease must not stop a receive of one tensor). */
    return r->current(r->arg, &descs[0]) ? FERRY_OK : LOOK_SKIP;
}

int ferry__ring_advance(ferry__ring *ring, uint32_t head, uint32_t k)
{
    /* seq_cst: the store half of a Dekker pair with a sender's sleep on head. */
    if (!ferry__cas_seqcst32(&ring->head, &head, head + k))
        return 0;
    if (ferry__load_seqcst32(&ring->senders))
        ferry__futex_wake_all(&ring->head);
    return 1;
}

int ferry__ring_peek(const ferry__ring_reader *r, ferry_descriptor *descs, size_t max,
                     size_t *count, uint32_t *at)
{
    ferry__ring *ring = r->ring;
    for (;;) {
        uint32_t head = ferry__load_acquire32(&ring->head);
        uint32_t tail = ferry__load_acquire32(&ring->tail);
        if (head == tail)
            return FERRY__RING_EMPTY;
        if (tail - head > r->depth) {
            if (ferry__load_after_reads32(&ring->head) != head)
                continue; /* head moved on between the two loads */
            return ferry__fail(FERRY_MALFORMED,
                               "descriptor ring of rank %u is corrupt (head %u, tail %u, depth "
                               "%u)",
                               r->rank, head, tail, r->depth);
        }
        size_t k;
        int got = look_at_head(r, head, tail, descs, max, &k);
        if (got == FERRY_OK) {
            *count = k;
            *at = head;
            return FERRY_OK;
        }
        if (!ferry__ring_advance(ring, head, (uint32_t)k))
            continue; /* another thread took them: the copies may be torn */
        if (got != LOOK_SKIP)
            return got;
    }
}

int ferry__ring_take(const ferry__ring_reader *r, ferry_descriptor *descs, size_t max,
                     size_t *count)
{
    for (;;) {
        size_t k;
        uint32_t head;
        int got = ferry__ring_peek(r, descs, max, &k, &head);
        if (got != FERRY_OK)
            return got;
        if (k > max) {
            if (ferry__load_after_reads32(&r->ring->head) != head)
                continue; /* the copies may be torn */
            *count = k;
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "the next lease has %zu tensors; the output holds %zu", k, max);
        }
        if (!ferry__ring_advance(r->ring, head, (uint32_t)k))
            continue; /* another thread took them: the copies may be torn */
        *count = k;
        return FERRY_OK;
    }
}

int ferry__ring_arm(ferry__ring *ring, const uint32_t *closing)
{
    ferry__store_seqcst32(&ring->armed, 1);
    /* A close after the caller's look at the closing flag signalled the fd just drained. */
    return ferry__load_seqcst32(&ring->tail) != ferry__load_seqcst32(&ring->head) ||
           ferry__load_seqcst32(closing);
}

void ferry__ring_sleep_on_tail(ferry__ring *ring, uint64_t ns)
{
    ferry__fetch_add_seqcst32(&ring->receivers, 1);
    uint32_t tail = ferry__load_seqcst32(&ring->tail);
    if (tail == ferry__load_seqcst32(&ring->head))
        ferry__futex_wait(&ring->tail, tail, ns);
    ferry__fetch_add_seqcst32(&ring->receivers, (uint32_t)-1);
}
