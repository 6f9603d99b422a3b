/* Consumer side: the process-wide cache of opened pools. */
#ifndef FERRY_CONSUMER_CONSUMER_H
#define FERRY_CONSUMER_CONSUMER_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"
#include "pool/layout.h"

typedef struct ferry__gpu_pool ferry__gpu_pool;

typedef struct ferry__part_set ferry__part_set;

/* One pool mapped into this process. Its references: the cache's own (while it is listed),
 * one for each consumer call in progress, and one for each view handed out and not yet
 * acknowledged; consumer objects hold none, so that a pool whose producer is gone is unmapped
 * once its calls and views are done. Fields other than refs, gone, attached, viewed and the
 * part sets are immutable once the entry is published in the cache. */
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
    ferry__extent *extents; /* each slot's lease extent, written by the producer */
    uint32_t *control; /* CPU view of the control words; NULL when they live on the device */
    uint8_t *data;     /* CPU view of the data; NULL for GPU pools */
    uint32_t backend;
    uint8_t flags; /* FERRY_DESC_FLAG_DEVICE_CONTROL */
    uint8_t handle[64];
    ferry__gpu_pool *gpu; /* GPU pools: per-device mappings (gpu.c) */
    uint32_t consumers;
    uint32_t max_inflight;
    uint32_t row_words;
    uint64_t memory_size;
    uint64_t data_size;
    pid_t producer_pid; /* as seen from this process */
    uint64_t producer_start;
    uint8_t *attached;  /* one byte per rank; cache lock */
    uint32_t open_rank; /* the rank that opened the pool (asks the CUDA VMM fd broker) */
    uint32_t *my_acks;  /* control words on the device: the acknowledgements this process
                         * wrote, by slot and rank (atomic), so that refusing an already
                         * acknowledged lease costs no device read */
    uint32_t *viewed;   /* by slot and rank, the generation of a view holding a reference
                         * (0: none); allocated on the first view (atomic words) */
    pthread_mutex_t parts_lock; /* guards parts */
    ferry__part_set *parts;     /* packed leases acknowledged part by part, in progress */
} ferry__mapped_pool;

/* Finds or opens the pool a descriptor names and, unless claim is FERRY__RANK_NONE, makes
 * sure this process holds rank claim of it (RANK_IN_USE if another live process does).
 * Opening waits for the producer's broker until deadline (ferry__now_ns clock) at most. A pool
 * whose producer is gone is found only with allow_gone (to end views by acknowledging).
 * Takes a reference that ferry__cache_release drops. */
ferry_status ferry__cache_acquire(const ferry_descriptor *desc, uint32_t claim, int device,
                                  uint64_t deadline, int allow_gone, ferry__mapped_pool **pool);

/* Takes one more reference on a pool the caller holds one on. */
void ferry__cache_retain(ferry__mapped_pool *pool);

/* Drops a reference; the mapping goes away with the last one. */
void ferry__cache_release(ferry__mapped_pool *pool);

/* Marks a pool whose producer is gone and drops the cache's reference to it (the caller's
 * stays valid; the pool stays listed, for acknowledgements only, while references last). */
void ferry__cache_evict(ferry__mapped_pool *pool);

/* Number of pools in the cache whose producer is not known to be gone (tests). */
unsigned ferry__cache_size(void);

/* Drops the cache's reference to every pool whose producer is gone. */
void ferry__cache_sweep(void);

/* gpu.c: GPU pools as a consumer sees them. Every function takes the consumer's device. */
/* At open, with the consumer's device current: registers the segment. */
ferry_status ferry__gpu_attach(ferry__mapped_pool *pool, int device);
/* Opens the pool's memory on device once (the producer's own mapping in its own process);
 * a CUDA VMM POSIX fd is asked of its broker until deadline at most. */
ferry_status ferry__gpu_map(ferry__mapped_pool *pool, int device, uint64_t deadline);
void ferry__gpu_detach(ferry__mapped_pool *pool);
ferry_status ferry__gpu_load(ferry__mapped_pool *pool, int device, uint64_t word, uint32_t *value);
ferry_status ferry__gpu_store(ferry__mapped_pool *pool, int device, uint64_t word, uint32_t value);
ferry_status ferry__gpu_copy_out(ferry__mapped_pool *pool, int device, uint64_t offset, void *dst,
                                 uint64_t n);
ferry_status ferry__gpu_enqueue_wait(ferry__mapped_pool *pool, int device, uint64_t word,
                                     uint32_t value, void *stream);
ferry_status ferry__gpu_enqueue_copy(ferry__mapped_pool *pool, int device, uint64_t offset,
                                     void *dst, uint64_t n, void *stream);
ferry_status ferry__gpu_enqueue_store(ferry__mapped_pool *pool, int device, uint64_t word,
                                      uint32_t value, void *stream);
ferry_status ferry__gpu_data(ferry__mapped_pool *pool, int device, uint64_t offset,
                             const void **data);

#endif
