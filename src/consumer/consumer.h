/* Consumer side: the process-wide cache of opened pools. */
#ifndef FERRY_CONSUMER_CONSUMER_H
#define FERRY_CONSUMER_CONSUMER_H

#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"
#include "pool/layout.h"

/* One pool mapped into this process. Fields other than refs/gone are immutable once the
 * entry is published in the cache. */
typedef struct ferry__mapped_pool {
    struct ferry__mapped_pool *next;
    uint8_t pool_id[16];
    uint8_t broker[16];
    int refs;      /* cache lock */
    uint32_t gone; /* atomic: producer found gone */
    void *base;
    uint64_t size;
    ferry__shm_header *header;
    uint32_t *generations;
    uint32_t *control;
    uint8_t *data;
    uint32_t consumers;
    uint32_t max_inflight;
    uint32_t row_words;
    uint64_t memory_size;
    uint64_t data_size;
    pid_t producer_pid; /* as seen from this process */
    uint64_t producer_start;
    uint8_t *attached; /* one byte per rank; cache lock */
} ferry__mapped_pool;

/* Finds or opens the pool a descriptor names and makes sure rank is attached to it. Takes a
 * reference that ferry__cache_release drops. */
ferry_status ferry__cache_acquire(const ferry_descriptor *desc, uint32_t rank,
                                  ferry__mapped_pool **pool);

/* Drops a reference; the mapping goes away with the last one. */
void ferry__cache_release(ferry__mapped_pool *pool);

/* Removes a pool whose producer is gone from the cache (held references stay valid). */
void ferry__cache_evict(ferry__mapped_pool *pool);

/* Number of pools in the cache (tests). */
unsigned ferry__cache_size(void);

#endif
