/* The shared segment every process of a pool maps: header, slot generations, pool region.
 *
 *   segment:  [ header | slot generations (u32 x max_inflight) | pad to 8 |
 *               slot extents (u64 offset, u64 length) x max_inflight | pad to page ]  header_bytes
 *             [ pool region: control table | pad to 256 | data ]                     memory_size
 *
 * The pool region is laid out as BRIEF.md describes: a control table of max_inflight rows
 * of (1 + consumer_count) 32-bit words, [ready, ack_0 .. ack_{n-1}], then the data, which
 * starts at the control table's size rounded up to 256 bytes. A slot's generation word is
 * written by the producer before anything else of a new lease, so that consumers can tell
 * a reused slot from the one their descriptor names; the slot's extent (the bytes of the data
 * region its lease holds) follows, so that consumers refuse a descriptor whose range is not
 * inside its own lease. */
#ifndef FERRY_POOL_LAYOUT_H
#define FERRY_POOL_LAYOUT_H

#include <stdint.h>

#include "ferry.h"

#define FERRY_SHM_MAGIC      0x4d485346u /* "FSHM" */
#define FERRY_SHM_VERSION    2u
#define FERRY_DATA_ALIGN     256u
#define FERRY_GENERATION_MAX 0x7fffffffu
/* Set in a slot's generation word when its lease was cancelled: generations never use the top
 * bit, so consumers tell a cancelled lease from a live one without reading control words
 * (which may live on the device). */
#define FERRY_GEN_CANCELLED 0x80000000u

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
} ferry__shm_header;

/* One slot's extent: written by the producer after the slot's generation word and before
 * its ready word; read by consumers through ferry__load_relaxed64. */
typedef struct ferry__extent {
    uint64_t offset; /* data offset of the lease's slice */
    uint64_t length; /* bytes of the lease (all its tensors) */
} ferry__extent;

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
#define FERRY_GEN_TABLE_OFFSET 128u
_Static_assert(sizeof(ferry__shm_header) <= FERRY_GEN_TABLE_OFFSET, "header too large");

/* The slot extent table follows the generations, 8-byte aligned. */
static inline uint64_t ferry__extent_offset(uint64_t max_inflight)
{
    uint64_t b = FERRY_GEN_TABLE_OFFSET + max_inflight * sizeof(uint32_t);
    return (b + 7) & ~(uint64_t)7;
}

/* Bytes of the segment before the pool region (page multiple). */
static inline uint64_t ferry__header_bytes(uint64_t max_inflight)
{
    uint64_t b = ferry__extent_offset(max_inflight) + max_inflight * sizeof(ferry__extent);
    return (b + 4095) & ~(uint64_t)4095;
}

static inline uint32_t *ferry__row(uint32_t *control, uint32_t row_words, uint32_t slot)
{
    return control + (uint64_t)slot * row_words;
}

#endif
