/* Remote consumers: a pool's consumers on other hosts, over UCX (docs/design.md, "Remote
 * consumers"; docs/wire-format.md, "Remote consumers").
 *
 * Producer side (server.c): a thread of the pool's that serves a TCP listener, admits
 * consumers that know the pool's secret (the bootstrap: HELLO, WELCOME), keeps each admitted
 * consumer's TCP connection open as its liveness (EOF or a keepalive failure: the consumer is
 * gone), and forwards what is queued in a remote rank's descriptor ring to its consumer as UCX
 * active messages. Consumers read the pool with one-sided gets; their acknowledgements come
 * back as active messages and are written into the control words by the pool.
 *
 * Consumer side (client.c): connects, reads, acknowledges and receives over the same
 * connection and UCX endpoint. */
#ifndef FERRY_REMOTE_REMOTE_H
#define FERRY_REMOTE_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

/* "ferry+ucx://" */
#define FERRY__REMOTE_PREFIX "ferry+ucx://"

/* The bytes a consumer asks for in one served read request (FERRY_AM_READ_MAX at most): the
 * producer copies a piece while UCX sends the one before, and four are on their way at once.
 * Chosen by measurement (docs/BENCHMARKS.md, "Served reads"). */
#define FERRY_REMOTE_READ_PIECE (256u << 10)

/* The keepalive bound when the config sets none. */
#define FERRY_REMOTE_TIMEOUT_DEFAULT_NS 5000000000ull

/* A parsed remote address: ferry+ucx://HOST:PORT/<pool id: 32 hex>/<secret: 32 hex> (HOST an
 * IPv4 address, a bracketed IPv6 address or a host name). */
typedef struct ferry__remote_address {
    char host[256];
    uint16_t port;
    uint8_t pool_id[16];
    uint8_t secret[16];
} ferry__remote_address;

/* 1 if text starts like a remote address (the caller then parses it). */
int ferry__remote_is_address(const char *text);

/* Parses a remote address; INVALID_ARGUMENT unless it is exactly the printed form. */
ferry_status ferry__remote_parse(const char *text, ferry__remote_address *out);

/* Prints a remote address into buf (size >= FERRY_REMOTE_ADDRESS_SIZE). */
void ferry__remote_format(const ferry__remote_address *a, char *buf, size_t size);

/* ---- producer side ---------------------------------------------------------------------- */

typedef struct ferry__remote_server ferry__remote_server;

/* What the server asks of its pool. Called from the server's thread, never under a lock of
 * the pool's (the pool may take its own); the server holds none of its locks that the pool's
 * own calls into the server take. */
typedef struct ferry__remote_hooks {
    void *user;
    /* A remote consumer (connection conn_id, process pid on host) claims rank: FERRY_OK, or
     * RANK_IN_USE with *holder the live holder's pid, or another refusal (its message set). */
    ferry_status (*attach)(void *user, uint32_t rank, uint32_t conn_id, pid_t pid, const char *host,
                           pid_t *holder);
    /* The connection that held rank is gone (its process exited, its host or link fell
     * silent, or it broke the protocol): the rank's leases are acknowledged on its behalf.
     * Its holds go at once where its peer closed the connection (lapse 0), else they lapse
     * a keepalive bound later (a consumer still alive behind a silent link may be reading). */
    void (*detach)(void *user, uint32_t rank, uint32_t conn_id, int lapse);
    /* The lease (slot, generation) as the producer knows it: FERRY_OK with its ready state
     * and the extent of its slice; STALE if it is no longer current for rank (its slot moved
     * on, it was cancelled, or rank's acknowledgement is written); CLOSING once the pool
     * closes (its connections end soon after). */
    ferry_status (*lease)(void *user, uint32_t slot, uint32_t generation, uint32_t rank, int *ready,
                          uint64_t *offset, uint64_t *length);
    /* Acknowledges the lease (slot, generation) for ranks [first, first + count) on behalf
     * of a remote consumer (rank, on connection conn_id), or with partial set marks it partly
     * acknowledged for them (some parts of a packed lease; nothing where a rank's
     * acknowledgement is written). Nothing if the lease is no longer current. A whole
     * acknowledgement that covers the sender's own rank ends the sender's hold. */
    void (*ack)(void *user, uint32_t slot, uint32_t generation, uint32_t first, uint32_t count,
                int partial, uint32_t rank, uint32_t conn_id);
    /* Holds the lease (slot, generation) for rank (connection conn_id) before its DESC goes:
     * 1 if held (it is current and not acknowledged for rank), 0 if not. The pool frees the
     * slice only after the rank's own acknowledgement or release, or once the hold, asked
     * back, lapses. */
    int (*hold)(void *user, uint32_t slot, uint32_t generation, uint32_t rank, uint32_t conn_id);
    /* The consumer let the held lease go (FERRY_AM_RELEASED). */
    void (*release)(void *user, uint32_t slot, uint32_t generation, uint32_t rank,
                    uint32_t conn_id);
    /* Holds of rank's (connection conn_id) the pool asks back: up to max (slot, generation)
     * pairs, each told once. The pool signals the rank's notify fd when there are some. */
    uint32_t (*revokes)(void *user, uint32_t rank, uint32_t conn_id, uint32_t (*out)[2],
                        uint32_t max);
    /* Hands rank's notify eventfd to the pool (-1: take it back); the pool signals it when
     * the rank's ring gets entries, as for a local consumer's poll fd. */
    void (*notify)(void *user, uint32_t rank, int fd);
} ferry__remote_hooks;

/* A memory region of the pool that remote consumers read. */
typedef struct ferry__remote_region {
    void *base;
    uint64_t size;
    int gpu; /* GPU memory (of config->device) */
} ferry__remote_region;

typedef struct ferry__remote_config {
    const char *listen;  /* "HOST:PORT"; port 0 takes any free port */
    uint64_t timeout_ns; /* keepalive bound */
    const char *label;   /* "host pool", in messages */
    int device;          /* the pool's GPU (-1: host memory) */
    uint8_t pool_id[16];
    uint8_t pool_desc[FERRY_DESCRIPTOR_SIZE]; /* encoded pool-only descriptor */
    uint32_t consumers;
    uint32_t max_inflight;
    uint32_t ring_depth;
    /* The rings in the segment: rank r's is at rings + r * ring_stride. */
    uint8_t *rings;
    uint64_t ring_stride;
    /* Region 1 is the shared segment (host memory); region 2 the device pool, if any. */
    ferry__remote_region region[2];
    uint32_t welcome_flags; /* FERRY_WELCOME_CONTROL_IN_POOL, FERRY_WELCOME_DATA_IN_POOL */
    uint64_t gen_offset, extent_offset, control_offset, data_offset;
    ferry__remote_hooks hooks;
} ferry__remote_config;

/* Registers the regions with UCX, opens the listener and starts the server's thread. On
 * failure nothing is left behind (the message says why: no UCX, the address in use, ...). */
ferry_status ferry__remote_start(const ferry__remote_config *config, ferry__remote_server **out);

/* Stops admitting, closes every consumer's connection (they see PRODUCER_GONE), stops the
 * thread and releases everything. NULL is a no-op. */
void ferry__remote_stop(ferry__remote_server *server);

/* In a forked child: closes the child's copies of the server's fds and frees its memory,
 * touching neither the thread nor UCX. NULL is a no-op. */
void ferry__remote_forget(ferry__remote_server *server);

/* The pool's remote address (FERRY_REMOTE_ADDRESS_SIZE bytes at most). */
const char *ferry__remote_server_address(const ferry__remote_server *server);

/* Counters for stats and metrics. */
typedef struct ferry__remote_counts {
    uint64_t refused;       /* bootstrap refusals, every reason */
    uint64_t refused_by[8]; /* by reason, FERRY_REMOTE_REFUSED_* */
    uint64_t admitted;      /* consumers admitted so far */
    uint64_t connected;     /* consumers connected now */
    uint64_t emulated;      /* of those, reading over emulated RMA (each counted once) */
    uint64_t forwarded;     /* descriptors sent */
    uint64_t bad_messages;  /* active messages dropped as malformed or forged */
    uint64_t inlined;       /* leases sent with their bytes in the DESC */
    uint64_t inline_stale;  /* bytes copied for that and dropped: the lease moved on */
    uint64_t described;     /* hellos that claimed no rank, answered with the pool's description */
    uint64_t served;        /* read requests answered (FERRY_AM_DATA, counted before it goes) */
    uint64_t served_stale;  /* of those, bytes copied and dropped: the lease moved on */
    uint64_t revoked;       /* held leases asked back (FERRY_AM_REVOKE sent) */
    uint64_t released;      /* held leases let go (FERRY_AM_RELEASED received) */
    uint64_t ack_messages;  /* acknowledgement messages taken: ACK (partial marks too) and
                             * ACKS, one each */
} ferry__remote_counts;

enum {
    FERRY_REMOTE_REFUSED_MALFORMED, /* not a well-formed HELLO (junk, wrong version, size) */
    FERRY_REMOTE_REFUSED_SECRET,    /* wrong secret or another pool's identity */
    FERRY_REMOTE_REFUSED_RANK,      /* rank out of range or held by a live process */
    FERRY_REMOTE_REFUSED_SILENT,    /* no whole HELLO before the deadline */
    FERRY_REMOTE_REFUSED_FLOOD,     /* too many connections waiting for their HELLO */
    FERRY_REMOTE_REFUSED_ERROR,     /* an error while admitting (UCX, memory, closing) */
    FERRY_REMOTE_REFUSED_REASONS,
};

/* Names of the reasons above, for metrics ("malformed", "secret", ...). */
extern const char *const ferry__remote_refused_names[FERRY_REMOTE_REFUSED_REASONS];

void ferry__remote_server_counts(ferry__remote_server *server, ferry__remote_counts *counts);

/* Tests only (tests/test_remote.c): when set, a server's thread calls it between its check of
 * a small lease and its copy of the lease's bytes into the DESC, with the lease's slot and
 * generation. Set before the pool is made and cleared after it is destroyed; NULL in every
 * other program. */
extern void (*ferry__remote_test_before_copy)(uint32_t slot, uint32_t generation);
/* Tests only: called by a consumer after it sent a partial mark; nonzero makes it give the
 * endpoint up there, as when the producer falls silent during a send (client.c). */
extern int (*ferry__remote_test_after_mark)(void);

/* ---- consumer side ---------------------------------------------------------------------- */

typedef struct ferry__remote_client ferry__remote_client;

/* Connects to the pool at a remote address as rank (device: where GPU reads land, -1 for
 * host): the bootstrap, the UCX endpoint, the remote keys. deadline on ferry__now_ns. */
ferry_status ferry__remote_connect(const char *address, uint32_t rank, int32_t device,
                                   uint64_t deadline, ferry__remote_client **out);

/* The pool-only descriptor of the pool at a remote address, as its server tells it to a
 * hello that claims no rank (the connection then ends; no UCX on either side). NOT_SUPPORTED,
 * without asking, where the address's host is not this one's (neither loopback nor an
 * address of an interface in this network namespace). */
ferry_status ferry__remote_describe(const char *address, uint64_t deadline, ferry_descriptor *pool);

/* Closes the connection (the producer acknowledges what this rank held) and frees it. */
void ferry__remote_close(ferry__remote_client *client);

/* In a forked child: frees the child's copy without a word to the producer or to UCX. */
void ferry__remote_forget_client(ferry__remote_client *client);

/* 1 if the descriptor names the client's pool. */
int ferry__remote_owns(const ferry__remote_client *client, const ferry_descriptor *desc);

/* The consumer calls on a remote pool (consumer.c and receive.c dispatch to these). */
ferry_status ferry__remote_recv(ferry__remote_client *client, uint64_t timeout_ns,
                                ferry_descriptor *descs, size_t max, size_t *count);
ferry_status ferry__remote_wait(ferry__remote_client *client, const ferry_descriptor *desc,
                                uint64_t timeout_ns);
ferry_status ferry__remote_read(ferry__remote_client *client, const ferry_descriptor *desc,
                                void *dst, size_t dst_size, uint64_t timeout_ns);
ferry_status ferry__remote_ack(ferry__remote_client *client, const ferry_descriptor *desc,
                               uint32_t first, uint32_t count, int strict);
ferry_status ferry__remote_fd(ferry__remote_client *client, int *fd);

#endif
