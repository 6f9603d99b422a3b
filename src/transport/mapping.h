/* A pool as one consumer process maps it, and where its control words live.
 *
 * The consumer side of every transport works on a ferry__mapped_pool: the shared segment's
 * layout (set when the pool is opened), the transport's own per-process state (priv), and
 * the placement of the control words (host shared memory, or the device pool). The
 * consumer's cache owns the entry (its references, claims, views and packed-lease parts). */
#ifndef FERRY_TRANSPORT_MAPPING_H
#define FERRY_TRANSPORT_MAPPING_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/parts.h"
#include "ferry.h"
#include "shm/segment.h"

struct ferry__pool_memory;

typedef struct ferry__transport_ops ferry__transport_ops;
typedef struct ferry__placement ferry__placement;

/* One pool mapped into this process. Its references: the cache's own (while it is listed),
 * one for each consumer call in progress, and one for each view handed out and not yet
 * acknowledged; consumer objects hold none, so that a pool whose producer is gone is unmapped
 * once its calls and views are done. Fields other than refs, gone, attached, viewed and the
 * part sets are immutable once the entry is published in the cache; consumers, max_inflight,
 * row_words, memory_size, data_size, backend and flags are shm.layout's, copied at open. */
typedef struct ferry__mapped_pool {
    struct ferry__mapped_pool *next;
    uint8_t pool_id[16];
    uint8_t broker[16];
    int refs;      /* cache lock */
    uint32_t gone; /* atomic: producer found gone */
    void *base;
    uint64_t size;
    ferry__shm shm; /* the segment at base, with the layout validated and kept at open */
    const ferry__transport_ops *ops; /* the pool's transport, consumer side */
    const ferry__placement *place;   /* where its control words live */
    uint32_t *control; /* the control words in the segment (host placement), else NULL */
    uint8_t *data;     /* the data in the segment (host transport), else NULL */
    uint32_t backend;
    uint8_t flags; /* FERRY_DESC_FLAG_DEVICE_CONTROL */
    uint8_t handle[64];
    void *priv; /* the transport's per-process state (GPU pools: mappings per device) */
    uint32_t consumers;
    uint32_t max_inflight;
    uint32_t row_words;
    uint64_t memory_size;
    uint64_t data_size;
    pid_t producer_pid; /* as seen from this process */
    uint64_t producer_start;
    int producer_fd;   /* the producer's pidfd, held from open (-1 where none could be had) */
    uint8_t *attached; /* one byte per rank: held, lent or not (cache.c); cache lock */
    uint32_t *lent;    /* per rank: consumers that give it back when destroyed (written under
                        * the cache lock; read atomically to track their stream work) */
    uint32_t *giving;  /* per rank: the give-backs begun (cache lock): only the latest ends */
    pthread_mutex_t claim_lock; /* orders claims and releases at the broker */
    uint32_t open_rank;         /* the rank that opened the pool (asks the CUDA VMM fd broker) */
    uint32_t *my_acks;          /* control words on the device: the acknowledgements this process
                                 * wrote, by slot and rank (atomic), so that refusing an already
                                 * acknowledged lease costs no device read */
    uint32_t *viewed;           /* by slot and rank, the generation of a view holding a reference
                                 * (0: none); allocated on the first view (atomic words) */
    pthread_mutex_t parts_lock; /* guards parts */
    ferry__part_set *parts;     /* packed leases acknowledged part by part, in progress */
} ferry__mapped_pool;

/* Where a pool's control words live, for both sides of the contract: one table for words in
 * host shared memory, one for words in the device pool, shared by every transport. */
struct ferry__placement {
    const char *name; /* "host", "device" */
    /* consumer side: device is the consumer's */
    ferry_status (*open)(ferry__mapped_pool *p); /* per-process bookkeeping at open */
    void (*close)(ferry__mapped_pool *p);
    ferry_status (*load)(ferry__mapped_pool *p, int device, uint64_t word, uint32_t *value);
    /* A rank's acknowledgement as this process can know it cheaply: the word itself where
     * the CPU sees it, else this process's record of the acknowledgements it wrote. */
    ferry_status (*load_ack)(ferry__mapped_pool *p, int device, uint32_t slot, uint32_t rank,
                             uint32_t *value);
    /* Writes value into word if it still holds *expected (*done = 1); otherwise *done = 0 and
     * *expected is what it holds. Words on the device have no host compare-and-swap: a plain
     * store (*done = 1). */
    ferry_status (*replace)(ferry__mapped_pool *p, int device, uint64_t word, uint32_t *expected,
                            uint32_t value, int *done);
    /* 1 if replace is a compare-and-swap (a word it writes may be one other processes race
     * on: the partial marks of packed leases), 0 if a plain store. */
    int replace_compares;
    /* Records an acknowledgement this process wrote or enqueued. */
    void (*note_ack)(ferry__mapped_pool *p, uint32_t slot, uint32_t rank, uint32_t generation);
    /* 1 if the CPU sees word == value now, at no device cost; 0 if not or if it cannot tell. */
    int (*seen)(const ferry__mapped_pool *p, uint64_t word, uint32_t value);
    /* Sleeps at most ns while word holds seen (a futex where producers wake sleepers). */
    void (*sleep)(ferry__mapped_pool *p, uint64_t word, uint32_t seen, uint64_t ns);
    /* producer side */
    ferry_status (*write_words)(struct ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                uint32_t value);
    ferry_status (*sync)(struct ferry__pool_memory *mem); /* the CPU's view up to date */
};

extern const ferry__placement ferry__host_placement;
extern const ferry__placement ferry__device_placement;

/* The consumer cache's sweep (consumer/cache.c): drops the pools whose producer is gone, for
 * a transport whose open may be blocked by a stale mapping of one. */
void ferry__cache_sweep(void);

#endif
