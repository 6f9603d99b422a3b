/* The remote wire format (docs/wire-format.md, "Remote consumers"): the bootstrap messages a
 * remote consumer and a producer exchange over TCP (HELLO, WELCOME, REFUSE), and the headers
 * of the UCX active messages that carry descriptors and acknowledgements afterwards.
 *
 * Every message starts with the same 16 bytes: magic "FRYU", version, type, total size,
 * reserved zero. Fields are fixed-width little-endian; variable parts (a UCX worker address,
 * packed remote keys) follow the fixed part, each padded to 8 bytes, with their lengths in the
 * fixed part. Decoders check every length against the message's size and against the bounds
 * below before they look at a byte of it, and reject nonzero reserved fields. */
#ifndef FERRY_WIRE_REMOTE_H
#define FERRY_WIRE_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define FERRY_REMOTE_MAGIC 0x55595246u /* "FRYU" */
/* Version 2: a DESC may carry its lease's bytes (FERRY_AM_DESC_INLINE). Version 3: an ACK
 * may mark a packed lease partly acknowledged (FERRY_AM_ACK_PARTIAL). Version 4: a consumer
 * whose gets UCX would emulate asks the producer for bytes (FERRY_AM_READ, answered by
 * FERRY_AM_DATA). Version 5: a DESC may say that the producer holds the lease's slice for the
 * rank until the rank lets it go (FERRY_AM_DESC_HELD, FERRY_AM_REVOKE, FERRY_AM_RELEASED). A
 * peer of another version would drop such a message, so peers of different versions refuse
 * each other at the bootstrap. Version 6: a DATA may say FAILED. Version 7: a consumer's own
 * acknowledgements may go out several at once (FERRY_AM_ACKS). */
#define FERRY_REMOTE_VERSION 7u
#define FERRY_REMOTE_HEADER  16u
/* The largest UCX worker address and packed remote key ferry accepts (a worker address over
 * several RDMA devices is a few hundred bytes; keys are tens). */
#define FERRY_REMOTE_MAX_BLOB 4096u
/* No bootstrap message is larger. */
#define FERRY_REMOTE_MAX_MESSAGE 16384u
#define FERRY_REMOTE_HOST_SIZE   64u

enum ferry__remote_type {
    FERRY_REMOTE_HELLO = 1,   /* consumer -> producer, over TCP */
    FERRY_REMOTE_WELCOME = 2, /* producer -> consumer, over TCP: admitted */
    FERRY_REMOTE_REFUSE = 3,  /* producer -> consumer, over TCP: refused */
};

/* A consumer asks to be admitted: the secret of the pool's remote address, the pool's
 * identity, the rank it claims, and its UCX worker's address. */
typedef struct ferry__hello {
    uint8_t secret[16];
    uint8_t pool_id[16];
    uint32_t rank;                     /* FERRY__RANK_NONE (0xFFFFFFFF): claims no rank */
    uint32_t pid;                      /* the consumer's pid on its host (diagnostics) */
    char host[FERRY_REMOTE_HOST_SIZE]; /* its host name (diagnostics), NUL-terminated */
    uint32_t worker_len;
    const uint8_t *worker; /* decode: points into the decoded buffer */
} ferry__hello;

#define FERRY_WELCOME_CONTROL_IN_POOL 0x1u /* control words are in region 2 (else region 1) */
#define FERRY_WELCOME_DATA_IN_POOL    0x2u /* the data is in region 2 (else region 1) */
#define FERRY_WELCOME_FLAGS_KNOWN     0x3u

/* The producer admits a consumer: what it needs to read the pool with one-sided gets and to
 * talk to the producer's UCX worker. Region 1 is the pool's shared host segment; region 2,
 * when there is one, the device pool. Offsets are from each region's start. */
typedef struct ferry__welcome {
    uint32_t conn_id;        /* the connection, named in every later message */
    uint32_t producer_pid;   /* diagnostics */
    uint64_t token;          /* the connection's secret token, in every later message */
    uint32_t timeout_ms;     /* the keepalive bound both sides apply to the connection */
    uint32_t ring_depth;     /* descriptors the producer sends ahead of the consumer's takes */
    uint32_t flags;          /* FERRY_WELCOME_* */
    uint64_t region_addr[2]; /* remote addresses of the two regions */
    uint64_t region_size[2]; /* their sizes (region 2: 0 when there is none) */
    uint64_t gen_offset;     /* slot generation table, region 1 */
    uint64_t extent_offset;  /* slot extent table, region 1 */
    uint64_t control_offset; /* control table, region 1 or 2 */
    uint64_t data_offset;    /* data, region 1 or 2 */
    uint8_t pool[FERRY_DESCRIPTOR_SIZE]; /* the pool's encoded pool-only descriptor */
    uint32_t worker_len, rkey_len[2];
    const uint8_t *worker; /* decode: point into the decoded buffer */
    const uint8_t *rkey[2];
} ferry__welcome;

/* The producer refuses a consumer: the status (PERMISSION for a wrong secret, MISMATCH for
 * another pool, INVALID_ARGUMENT for a rank out of range, RANK_IN_USE, CLOSING, ...) and for
 * RANK_IN_USE the holder's pid as the producer sees it. Nothing else is told. */
typedef struct ferry__refuse {
    uint32_t status;
    uint32_t rank;
    uint32_t holder_pid;
} ferry__refuse;

/* Bytes of a message's encoding (0 if a length is out of bounds). */
size_t ferry__hello_size(const ferry__hello *m);
size_t ferry__welcome_size(const ferry__welcome *m);
#define FERRY_REFUSE_SIZE (FERRY_REMOTE_HEADER + 16u)

/* Encoders write exactly the size above into out (size bytes available); INVALID_ARGUMENT if
 * a field is out of bounds or out is too small. */
ferry_status ferry__hello_encode(const ferry__hello *m, uint8_t *out, size_t size);
ferry_status ferry__welcome_encode(const ferry__welcome *m, uint8_t *out, size_t size);
ferry_status ferry__refuse_encode(const ferry__refuse *m, uint8_t *out, size_t size);

/* The type and total size a message's first FERRY_REMOTE_HEADER bytes announce: MALFORMED
 * for a bad magic, version, type, reserved bits or a size out of bounds for the type. */
ferry_status ferry__remote_peek(const uint8_t *buf, size_t len, uint32_t *type, uint32_t *size);

/* Decoders take exactly one whole message (len bytes) and fail MALFORMED, leaving *m
 * untouched, for anything off: wrong type or size, lengths out of bounds or disagreeing with
 * the size, nonzero padding or reserved fields, an unterminated host name. Pointers in *m
 * point into buf. */
ferry_status ferry__hello_decode(const uint8_t *buf, size_t len, ferry__hello *m);
ferry_status ferry__welcome_decode(const uint8_t *buf, size_t len, ferry__welcome *m);
ferry_status ferry__refuse_decode(const uint8_t *buf, size_t len, ferry__refuse *m);

/* ---- active messages (UCX) after admission --------------------------------------------- */

#define FERRY_AM_ID       0x46u /* the one UCX active-message id ferry uses */
#define FERRY_AM_HEADER   32u
#define FERRY_AM_MAX_INFO 256u

/* DESC flags: the lease's bytes follow its one descriptor (a host pool's lease of at most
 * FERRY_REMOTE_INLINE_MAX bytes; docs/wire-format.md, "Active messages"). */
#define FERRY_AM_DESC_INLINE 0x1u
/* DESC flags: the producer holds the lease's slice for this rank (docs/design.md, "Held
 * leases"): it frees it only after the rank's own acknowledgement or RELEASED, or, once it
 * asked for it (REVOKE), after the keepalive bound. */
#define FERRY_AM_DESC_HELD 0x2u
/* INFO flags: the consumer's reads of host memory are emulated (UCX has no RMA lane to the
 * producer); it asks for held leases (it reads by gets, which need the check otherwise). */
#define FERRY_AM_INFO_EMULATED 0x1u
#define FERRY_AM_INFO_HOLD     0x2u
/* The largest lease whose bytes travel inside its DESC: a read of it is then a copy on the
 * consumer's host instead of gets (each a round trip through the producer's thread where UCX
 * emulates them). Chosen by measurement (docs/BENCHMARKS.md, "Remote consumers"); a
 * consumer keeps at most ring depth x this many bytes. */
#define FERRY_REMOTE_INLINE_MAX 16384u
/* ACK flags: the ranks acknowledged some parts of the packed lease and others remain; the
 * producer marks their words generation | FERRY_ACK_PARTIAL, as a local consumer does. */
#define FERRY_AM_ACK_PARTIAL 0x1u
/* The most leases one ACKS acknowledges (its payload: 8 bytes for each). */
#define FERRY_AM_ACKS_MAX 64u
/* The most bytes one READ asks for (a DATA answer carries them in one message). */
#define FERRY_AM_READ_MAX (1u << 20)
/* DATA flags: the payload is the lease's extent (offset, length: 16 bytes), not its bytes. */
#define FERRY_AM_DATA_EXTENT 0x1u

/* What a DATA answers (u.data.status). */
enum ferry__am_data_status {
    FERRY_AM_DATA_OK = 0,        /* the bytes asked for (the extent for a READ of none) */
    FERRY_AM_DATA_STALE = 1,     /* the lease is no longer the rank's; value: the slot's
                                  * generation now */
    FERRY_AM_DATA_NOT_READY = 2, /* the lease is not ready yet: ask again */
    FERRY_AM_DATA_OUTSIDE = 3,   /* the range is not inside the lease (payload: its extent) */
    FERRY_AM_DATA_BUSY = 4,      /* the producer has too many bytes on their way: ask again */
    FERRY_AM_DATA_FAILED = 5,    /* the producer could not copy the bytes out of its (GPU)
                                  * memory: the read fails (version 6) */
};
#define FERRY_AM_DATA_STATUSES 6u

enum ferry__am_type {
    FERRY_AM_DESC = 1,     /* producer -> consumer: count encoded descriptors of one lease */
    FERRY_AM_ACK = 2,      /* consumer -> producer: acknowledge a lease for ranks */
    FERRY_AM_TAKEN = 3,    /* consumer -> producer: descriptors taken so far */
    FERRY_AM_INFO = 4,     /* consumer -> producer: how its reads go (text payload) */
    FERRY_AM_READ = 5,     /* consumer -> producer: bytes of a lease (payload: their offset) */
    FERRY_AM_DATA = 6,     /* producer -> consumer: a READ's answer */
    FERRY_AM_REVOKE = 7,   /* producer -> consumer: let the held lease go (acknowledged for
                            * the rank by another, or cancelled) */
    FERRY_AM_RELEASED = 8, /* consumer -> producer: no read of the held lease is on its way,
                            * and none will be made without a check */
    FERRY_AM_ACKS = 9,     /* consumer -> producer: acknowledge leases for the connection's
                            * rank (payload: count x (u32 slot, u32 generation)) */
};

/* The 32-byte header of every active message. */
typedef struct ferry__am {
    uint16_t type;
    uint16_t flags; /* INFO: FERRY_AM_INFO_*; DESC: FERRY_AM_DESC_*; ACK:
                     * FERRY_AM_ACK_PARTIAL; DATA: FERRY_AM_DATA_EXTENT; 0 otherwise */
    uint32_t conn_id;
    uint64_t token;
    union {
        struct { /* DESC: the lease's extent (offset, length) and the descriptor count */
            uint64_t offset, length;
        } desc;
        struct { /* ACK */
            uint32_t slot, generation, first, count;
        } ack;
        struct { /* TAKEN: descriptors taken since admission (mod 2^32) */
            uint32_t taken;
        } taken;
        struct { /* READ: length bytes of lease (slot, generation), from the data offset in
                  * the 8-byte payload; id names the answer */
            uint32_t slot, generation, id, length;
        } read;
        struct { /* DATA: the answer to READ id */
            uint32_t id, status;
            uint64_t value; /* STALE: the slot's generation now; else 0 */
        } data;
        struct { /* REVOKE, RELEASED: the held lease */
            uint32_t slot, generation;
        } hold;
        struct { /* ACKS: how many leases the payload names */
            uint32_t count;
        } acks;
    } u;
} ferry__am;

void ferry__am_encode(const ferry__am *m, uint8_t out[FERRY_AM_HEADER]);

/* MALFORMED unless len is FERRY_AM_HEADER, the type is known, reserved fields are zero and
 * payload_len fits the type (DESC: 1 to 65535 whole descriptors, or with
 * FERRY_AM_DESC_INLINE exactly one descriptor and the extent's length, 1 to
 * FERRY_REMOTE_INLINE_MAX bytes; FERRY_AM_DESC_HELD with either; INFO: at most FERRY_AM_MAX_INFO
 * bytes; READ: 8 bytes, and a length of at most FERRY_AM_READ_MAX; DATA: a known status, with
 * FERRY_AM_DATA_EXTENT (OK or OUTSIDE) 16 bytes, OK without it at most FERRY_AM_READ_MAX bytes,
 * others none; ACKS: a count of 1 to FERRY_AM_ACKS_MAX, 8 bytes of payload for each, no flags;
 * others: none, no flags, and REVOKE and RELEASED the rest of their body zero). Whether a DATA
 * carries as many bytes as its READ asked for is the reader's check. */
ferry_status ferry__am_decode(const uint8_t *buf, size_t len, size_t payload_len, ferry__am *m);

/* Compares n bytes in time that does not depend on where they differ: 0 if equal. */
int ferry__secret_differs(const uint8_t *a, const uint8_t *b, size_t n);

#endif
