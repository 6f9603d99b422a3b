/* Packed leases acknowledged part by part, as a consumer process counts them: for each lease
 * (slot, generation) and rank, the parts acknowledged so far, in a list that the caller owns
 * and locks. Both consumers keep one, a mapped pool's (consumer/consumer.c) and a remote
 * pool's (remote/client.c); each drops the sets of leases that are over as it can tell. */
#ifndef FERRY_COMMON_PARTS_H
#define FERRY_COMMON_PARTS_H

#include <stdint.h>

#include "ferry.h"

typedef struct ferry__part_set ferry__part_set;

/* What ferry__parts_record found. */
enum {
    FERRY__PART_AGAIN = -1,    /* that part was acknowledged already */
    FERRY__PART_MORE = 0,      /* parts remain, and some were acknowledged before */
    FERRY__PART_LAST = 1,      /* the lease is complete for the rank: its word is written now */
    FERRY__PART_FIRST = 2,     /* the rank's first part of several: parts remain */
    FERRY__PART_NO_MEMORY = 3, /* no memory to count the rank's parts: nothing recorded */
};

/* MISMATCH (its message set) unless d's part fits the part count the list counts d's lease
 * by: that of the first part acknowledged, for any rank, while parts of the lease are counted.
 * A descriptor is never trusted with memory (a set is sized by that count), and a range is
 * checked before its first rank is recorded. */
ferry_status ferry__parts_fit(const ferry__part_set *list, const ferry_descriptor *d);

/* Records that rank acknowledged part d->part_index of d's lease (FERRY__PART_*); d fits
 * (ferry__parts_fit) and its part_index is below its part_count. A set whose lease is
 * complete is freed. */
int ferry__parts_record(ferry__part_set **list, const ferry_descriptor *d, uint32_t rank);

/* 1 if part d->part_index of d's lease is recorded as acknowledged for rank. */
int ferry__parts_has(const ferry__part_set *list, const ferry_descriptor *d, uint32_t rank);

/* Drops the sets whose lease over(arg, slot, generation) says is over. */
void ferry__parts_drop(ferry__part_set **list,
                       int (*over)(void *arg, uint32_t slot, uint32_t generation), void *arg);

/* Frees every set. */
void ferry__parts_clear(ferry__part_set **list);

#endif
