/* Packed leases acknowledged part by part (parts.h). */
#include <stdlib.h>

#include "common/error.h"
#include "common/parts.h"

/* The parts of one packed lease acknowledged for one rank. */
struct ferry__part_set {
    ferry__part_set *next;
    uint32_t slot, generation, rank, count, done;
    uint64_t bits[]; /* one bit per part */
};

/* Whether s is the set of d's lease and rank. */
static int is_set_of(const ferry__part_set *s, const ferry_descriptor *d, uint32_t rank)
{
    return s->slot == d->slot && s->generation == d->generation && s->rank == rank;
}

ferry_status ferry__parts_fit(const ferry__part_set *list, const ferry_descriptor *d)
{
    for (const ferry__part_set *s = list; s; s = s->next)
        if (s->slot == d->slot && s->generation == d->generation &&
            (d->part_count != s->count || d->part_index >= s->count))
            return ferry__fail(FERRY_MISMATCH,
                               "descriptor part %u of %u does not fit its lease (slot=%u, "
                               "generation=%u), acknowledged as one of %u parts",
                               d->part_index, d->part_count, d->slot, d->generation, s->count);
    return FERRY_OK;
}

int ferry__parts_record(ferry__part_set **list, const ferry_descriptor *d, uint32_t rank)
{
    ferry__part_set **pp = list;
    while (*pp && !is_set_of(*pp, d, rank))
        pp = &(*pp)->next;
    if (!*pp) {
        size_t words = ((size_t)d->part_count + 63) / 64;
        ferry__part_set *s = calloc(1, sizeof(*s) + words * sizeof(uint64_t));
        if (!s)
            return FERRY__PART_NO_MEMORY;
        *s = (ferry__part_set){*list, d->slot, d->generation, rank, d->part_count, 0};
        *list = s;
        pp = list;
    }
    ferry__part_set *s = *pp;
    uint64_t bit = 1ull << (d->part_index % 64), *word = &s->bits[d->part_index / 64];
    if (*word & bit)
        return FERRY__PART_AGAIN;
    *word |= bit;
    if (++s->done < s->count)
        return s->done == 1 ? FERRY__PART_FIRST : FERRY__PART_MORE;
    *pp = s->next;
    free(s);
    return FERRY__PART_LAST;
}

int ferry__parts_has(const ferry__part_set *list, const ferry_descriptor *d, uint32_t rank)
{
    for (const ferry__part_set *s = list; s; s = s->next)
        if (is_set_of(s, d, rank))
            return d->part_index < s->count &&
                   (s->bits[d->part_index / 64] >> (d->part_index % 64) & 1u);
    return 0;
}

void ferry__parts_drop(ferry__part_set **list,
                       int (*over)(void *arg, uint32_t slot, uint32_t generation), void *arg)
{
    while (*list) {
        ferry__part_set *s = *list;
        if (over(arg, s->slot, s->generation)) {
            *list = s->next;
            free(s);
        } else {
            list = &s->next;
        }
    }
}

void ferry__parts_clear(ferry__part_set **list)
{
    while (*list) {
        ferry__part_set *next = (*list)->next;
        free(*list);
        *list = next;
    }
}
