/* The shared segment every process of a pool maps: header, slot generations, pool region.
 *
 *   segment:  [ header | slot generations (u32 x max_inflight) | pad to 8 |
 *               slot extents (u64 offset, u64 length) x max_inflight | pad to 64 |
 *               descriptor rings, one per rank | pad to page ]                     header_bytes
 *             [ pool region: control table | pad to 256 | data ]                     memory_size
 *
 * The pool region is laid out as BRIEF.md describes: a control table of max_inflight rows
 * of (1 + consumer_count) 32-bit words, [ready, ack_0 .. ack_{n-1}], then the data, which
 * starts at the control table's size rounded up to 256 bytes. A slot's generation word is
 * written by the producer before anything else of a new lease, so that consumers can tell
 * a reused slot from the one their descriptor names; the slot's extent (the bytes of the data
 * region its lease holds) follows, so that consumers refuse a descriptor whose range is not
 * inside its own lease.
 *
 * Each rank's descriptor ring (ferry_pool_send / ferry_consumer_recv) is a ferry__ring of
 * counters followed by ring_depth entries of FERRY_DESCRIPTOR_SIZE bytes, each an encoded
 * descriptor. The producer alone writes tail and the entries; the rank's process advances
 * head. Entry i lives at index i % ring_depth; the entries [head, tail) are queued. */
#ifndef FERRY_SHM_LAYOUT_H
#define FERRY_SHM_LAYOUT_H

#include <stdint.h>

#include "ferry.h"

#define FERRY_SHM_MAGIC      0x4d485346u /* "FSHM" */
#define FERRY_SHM_VERSION    3u
#define FERRY_DATA_ALIGN     256u
#define FERRY_GENERATION_MAX 0x7fffffffu
/* Set in a slot's generation word when its lease was cancelled: generations never use the top
 * bit, so consumers tell a cancelled lease from a live one without reading control words
 * (which may live on the device). */
#define FERRY_GEN_CANCELLED 0x80000000u
/* A slot's generation word once its lease is over and its slice freed (a lease never has
 * generation 0): a reader whose slice was reused under another slot sees it. */
#define FERRY_GEN_OVER 0u
/* The largest pool a producer makes and a consumer accepts (config.c, segment.c). */
#define FERRY_MAX_CONSUMERS 65535
#define FERRY_MAX_INFLIGHT  (1 << 24)
#define FERRY_MAX_DEPTH     (1 << 16)
/* An acknowledgement word holding generation | FERRY_ACK_PARTIAL: a consumer acknowledged some
 * parts of that packed lease for the rank, not all (the producer names such leases in
 * consumer_info and in the pool-full message). It never equals a generation, so to every
 * reader that compares the word with one it is "not acknowledged"; written by compare-and-swap
 * from the value read only, so it never replaces an acknowledgement. */
#define FERRY_ACK_PARTIAL 0x80000000u

typedef struct ferry__shm_header {
    uint32_t magic;
    uint32_t version;
    uint64_t header_bytes; /* offset of the pool region in the segment */
    uint8_t pool_id[16];
    uint32_t backend;
    uint32_t consumer_count;
    uint32_t max_inflight;
    uint32_t row_words;   /* 1 + consumer_count */
    uint64_t memory_size; /* bytes of the pool region */
    uint64_t data_start;  /* data offset inside the pool region */
    uint64_t data_size;   /* memory_size - data_start */
    uint64_t gen_offset;  /* offset of the slot generation table in the segment */
    /* Words below are shared and only touched through common/atomic.h. */
    uint32_t closing;          /* 1 once the producer destroys the pool */
    uint32_t consumer_waiters; /* consumers sleeping on a ready word */
    uint32_t producer_waiters; /* publishers sleeping on ack_seq */
    uint32_t ack_seq;          /* bumped after every acknowledgement or cancel */
    uint32_t desc_flags;       /* FERRY_DESC_FLAG_DEVICE_CONTROL when control is on the GPU */
    int32_t device;            /* the pool's device, -1 for host memory */
    uint64_t extent_offset;    /* offset of the slot extent table in the segment */
    uint64_t ring_offset;      /* offset of rank 0's descriptor ring in the segment */
    uint32_t ring_depth;       /* entries of each ring */
    uint32_t reserved;
} ferry__shm_header;

/* One rank's descriptor ring: counters on their own cache lines, then the entries. The
 * counters only grow (mod 2^32); tail - head is the number of queued entries. */
typedef struct ferry__ring {
    uint32_t tail; /* entries ever enqueued (producer); receivers sleep on it */
    uint32_t pad0[15];
    uint32_t head; /* entries ever dequeued (the rank's process); full senders sleep on it */
    uint32_t pad1[15];
    uint32_t receivers; /* receivers sleeping on tail */
    uint32_t senders;   /* senders sleeping on head */
    uint32_t armed;     /* 1: the rank's poll fd asks for a signal at the next enqueue */
    uint32_t pad2[13];
} ferry__ring;
_Static_assert(sizeof(ferry__ring) == 192, "ring counters are three cache lines");

/* One slot's extent: written by the producer after the slot's generation word and before
 * its ready word; read by consumers through ferry__load_relaxed64. */
typedef struct ferry__extent {
    uint64_t offset; /* data offset of the lease's slice */
    uint64_t length; /* bytes of the lease (all its tensors) */
} ferry__extent;

/* The segment's layout as one side keeps it, privately: computed from the configuration at
 * create (producer), read once from a validated header at open (consumer). Nothing reads the
 * header's layout words again: every process of the pool can write them. */
typedef struct ferry__shm_layout {
    uint32_t backend;
    uint32_t consumers;
    uint32_t max_inflight;
    uint32_t row_words; /* 1 + consumers */
    uint32_t ring_depth;
    uint32_t desc_flags; /* FERRY_DESC_FLAG_DEVICE_CONTROL when control is on the GPU */
    int32_t device;      /* the pool's device, -1 for host memory */
    uint64_t header_bytes;
    uint64_t gen_offset;
    uint64_t extent_offset;
    uint64_t ring_offset;
    uint64_t ring_stride; /* bytes of one rank's ring */
    uint64_t memory_size; /* bytes of the pool region */
    uint64_t data_start;  /* data offset inside the pool region */
    uint64_t data_size;   /* usable data bytes (memory_size - data_start, 256-byte multiple) */
} ferry__shm_layout;

/* Bytes of the control table for a configuration. */
static inline uint64_t ferry__control_bytes(uint64_t max_inflight, uint64_t consumers)
{
    return max_inflight * (1 + consumers) * sizeof(uint32_t);
}

/* Offset of the data inside the pool region: the control table rounded up to 256. */
static inline uint64_t ferry__data_start(uint64_t max_inflight, uint64_t consumers)
{
    uint64_t c = ferry__control_bytes(max_inflight, consumers);
    return (c + FERRY_DATA_ALIGN - 1) & ~(uint64_t)(FERRY_DATA_ALIGN - 1);
}

/* The slot generation table follows the header at this offset. */
#define FERRY_GEN_TABLE_OFFSET 256u
_Static_assert(sizeof(ferry__shm_header) <= FERRY_GEN_TABLE_OFFSET, "header too large");

/* The slot extent table follows the generations, 8-byte aligned. */
static inline uint64_t ferry__extent_offset(uint64_t max_inflight)
{
    uint64_t b = FERRY_GEN_TABLE_OFFSET + max_inflight * sizeof(uint32_t);
    return (b + 7) & ~(uint64_t)7;
}

/* The descriptor rings follow the extents, 64-byte aligned. */
static inline uint64_t ferry__ring_offset(uint64_t max_inflight)
{
    uint64_t b = ferry__extent_offset(max_inflight) + max_inflight * sizeof(ferry__extent);
    return (b + 63) & ~(uint64_t)63;
}

/* Bytes of one rank's ring: counters and depth entries (a multiple of 64). */
static inline uint64_t ferry__ring_stride(uint64_t depth)
{
    return sizeof(ferry__ring) + depth * FERRY_DESCRIPTOR_SIZE;
}

/* Bytes of the segment before the pool region (page multiple). */
static inline uint64_t ferry__header_bytes(uint64_t max_inflight, uint64_t consumers,
                                           uint64_t depth)
{
    uint64_t b = ferry__ring_offset(max_inflight) + consumers * ferry__ring_stride(depth);
    return (b + 4095) & ~(uint64_t)4095;
}

static inline uint64_t ferry__header_bytes_of(const ferry_pool_config *config)
{
    return ferry__header_bytes((uint64_t)config->max_inflight_slices,
                               (uint64_t)config->consumer_count, (uint64_t)config->channel_depth);
}

/* Entry i of a ring of depth entries. */
static inline uint8_t *ferry__ring_entry(ferry__ring *ring, uint32_t depth, uint32_t i)
{
    return (uint8_t *)(ring + 1) + (uint64_t)(i % depth) * FERRY_DESCRIPTOR_SIZE;
}

#endif
