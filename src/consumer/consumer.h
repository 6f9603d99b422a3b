/* Consumer side: the process-wide cache of opened pools. */
#ifndef FERRY_CONSUMER_CONSUMER_H
#define FERRY_CONSUMER_CONSUMER_H

#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"
#include "pool/layout.h"

typedef struct ferry__gpu_pool ferry__gpu_pool;

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
} ferry__mapped_pool;

/* Finds or opens the pool a descriptor names and makes sure rank is attached to it. Takes a
 * reference that ferry__cache_release drops. */
ferry_status ferry__cache_acquire(const ferry_descriptor *desc, uint32_t rank, int device,
                                  ferry__mapped_pool **pool);

/* Drops a reference; the mapping goes away with the last one. */
void ferry__cache_release(ferry__mapped_pool *pool);

/* Removes a pool whose producer is gone from the cache (held references stay valid). */
void ferry__cache_evict(ferry__mapped_pool *pool);

/* Number of pools in the cache (tests). */
unsigned ferry__cache_size(void);

/* Drops the cache's reference to every pool whose producer is gone. */
void ferry__cache_sweep(void);

/* gpu.c: GPU pools as a consumer sees them. Every function takes the consumer's device. */
/* At open, with the consumer's device current: registers the segment. */
ferry_status ferry__gpu_attach(ferry__mapped_pool *pool, int device);
ferry_status ferry__gpu_map(ferry__mapped_pool *pool, int device); /* opens the IPC handle once */
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
