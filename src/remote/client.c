/* Remote consumers, consumer side (remote.h): connecting by remote address, receiving the
 * descriptors the producer forwards, reading leases with one-sided gets, acknowledging.
 *
 * A client is one rank's connection to one remote pool: its TCP connection to the producer
 * (kept open: its end, or a keepalive failure, means the producer is gone), a UCX worker of
 * its own with one endpoint to the producer's worker, and the remote keys of the pool's two
 * regions. Every call holds the client's lock while it uses UCX (the worker is SERIALIZED)
 * and lets it go while it sleeps on the worker's event fd and the connection.
 *
 * A read never hands out another lease's bytes. A lease whose DESC said it is held
 * (FERRY_AM_DESC_HELD) keeps its slice until this process lets it go: by its own
 * acknowledgement, or by FERRY_AM_RELEASED once the producer asked for it back
 * (FERRY_AM_REVOKE, answered only after every read of it returned); the producer frees a
 * hold it asked back without an answer only after the keepalive bound. Such a read checks
 * nothing remote: it takes in what the producer sent before and after its gets, and trusts
 * the hold only if the lease is still held, the connection open and the read took less than
 * half the keepalive bound (a slice asked back is freed a whole bound later at the soonest);
 * otherwise it checks as the others do. Other reads, once the get of the slice ended, read
 * the slot's generation and this rank's acknowledgement word with a second pair of gets; a
 * slot reused or a lease acknowledged on this rank's behalf since (after which the producer
 * may free the slice) ends the read STALE. A small lease of a host pool comes with its bytes
 * inside its DESC (copied and checked by the producer while the lease was this rank's): reads
 * of it into host memory copy them, without a get.
 *
 * Served reads: where UCX would emulate gets (no RMA lane: tcp), a read asks the producer's
 * thread for the bytes instead, whatever the pool's memory and the destination's
 * (FERRY_AM_READ, pieces of FERRY_REMOTE_READ_PIECE, CLIENT_READ_WINDOW at once). Each answer
 * (FERRY_AM_DATA) was checked there after its copy, so no check follows; an answer is written
 * into the destination (a GPU destination: copied there on cl->io) only while its read waits
 * for it (cl->rd), never after the read returned. */
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/parts.h"
#include "common/proc.h"
#include "driver/driver.h"
#include "shm/layout.h"
#include "remote/remote.h"
#include "remote/ucx.h"
#include "wire/remote.h"
#include "wire/wire.h"

/* How long a waiting call spins on the worker before it sleeps on its event fd; a read spins
 * as long again as its bytes take at 16 GB/s: over cuda_ipc they are a copy the GPU makes at
 * up to 1.4 TB/s, over in microseconds, sooner than a sleep on the fd would end. */
#define CLIENT_SPIN_NS           50000ull
#define CLIENT_SPIN_BYTES_PER_NS 16ull
/* The longest sleep between looks at the connection. */
#define CLIENT_SLICE_NS 10000000ull
/* A read's slice is got in pieces of at most this many bytes: each ends within ~170 ms at the
 * slowest rate measured (0.4 GB/s), well within the keepalive bound (2 s at least), so a
 * piece that does not end within it means a producer that serves nothing. (A piece is a get
 * of its own: over cuda_ipc each costs ~12-16 us besides its bytes.) */
#define CLIENT_GET_PIECE (64ull << 20)
/* How often a read polls the ready word of a lease that is not ready yet. */
#define CLIENT_READY_POLL_NS 20000ull
/* How long a served read that ended early waits for the answers still on their way to it. */
#define CLIENT_DRAIN_NS 100000000ull
/* Read requests a served read keeps on their way at once. */
#define CLIENT_READ_WINDOW 4
/* wait_requests' spin_ns for a wait that must not arm the worker (the acknowledgement
 * thread's: a caller asleep on the consumer's fd is woken by what the worker takes in). */
#define CLIENT_NO_ARM UINT64_MAX
/* How long a look at the connection (producer_gone_lately) or a drain of the worker (drain)
 * stands for calls that come soon after: a read or an acknowledgement within it skips the
 * system call. */
#define CLIENT_LOOK_NS 1000000ull
/* How long this rank's own acknowledgements may wait to go out together (one ACKS for up to
 * FERRY_AM_ACKS_MAX): FERRY_REMOTE_ACK_DELAY_US overrides it, 0 sends each at once. */
#define CLIENT_ACK_DELAY_NS 200000ull

/* What this process knows of a slot's current lease. */
typedef struct lease_note {
    uint32_t generation; /* 0: nothing known */
    uint32_t ready;      /* the producer forwarded it, or a read saw its ready word */
    uint64_t offset, length;
    uint32_t inl;  /* 1 + the index of its inline bytes in the client's inl; 0: none */
    uint32_t held; /* its DESC said the producer holds it for this rank */
} lease_note;

/* A served read while it waits for its answers (cl->rd): its pieces of FERRY_REMOTE_READ_PIECE
 * bytes (none for a look at the lease's state), asked for in CLIENT_READ_WINDOW places. */
typedef struct served_read {
    const ferry_descriptor *d;
    uint8_t *dst;         /* NULL: a look (a READ of no bytes, answered with the extent) */
    int gpu;              /* dst is device memory: each piece is copied there on cl->io */
    CUresult copy_failed; /* that copy's error (fail is SERVED_COPY), and its call */
    const char *copy_call;
    uint64_t pieces, asked; /* pieces in all; pieces asked for so far (in order) */
    uint64_t done;          /* pieces answered with their bytes */
    uint64_t heard;         /* when the last answer came */
    uint64_t deadline;      /* BUSY answers past it end the read (TIMEOUT) */
    uint64_t timeout_ns;    /* the caller's, for that message */
    uint32_t fail;          /* what ended it early: a FERRY_AM_DATA_* status (NOT_READY:
                             * only a look's; BUSY: past the deadline), or SERVED_LIE */
    uint64_t value;         /* STALE: the slot's generation as the producer read it */
    uint64_t extent[2];     /* a look's answer, or an OUTSIDE answer's */
    struct {
        uint32_t id; /* the request on its way; 0: none */
        uint64_t piece;
        uint64_t again; /* with id 0: answered BUSY, asked again at this time */
    } at[CLIENT_READ_WINDOW];
} served_read;

enum { SERVED_LIE = FERRY_AM_DATA_STATUSES, SERVED_COPY };

/* The bytes of a lease that came inline: its whole extent. */
typedef struct inline_copy {
    uint32_t slot, generation;
    uint64_t offset, length;
    uint8_t *bytes; /* NULL: an empty place */
} inline_copy;

struct ferry__remote_client {
    pthread_mutex_t lock;
    pid_t owner;
    ferry__ucx_node node;
    ucp_ep_h ep;
    ucp_rkey_h rkey[2];
    int sock;            /* the connection to the producer */
    int poll_fd;         /* epoll of the worker's event fd, sock and wake_fd, for
                          * ferry_consumer_fd */
    int wake_fd;         /* eventfd: the acknowledgement thread took something in */
    int gone;            /* the producer closed the pool, died or fell silent */
    int gpu_reads;       /* UCX reaches GPU memory (cuda transports) */
    uint64_t silence_ns; /* the pool's keepalive bound: no request ending for this long, while
                          * one waits, means the producer fell silent */
    char address[FERRY_REMOTE_ADDRESS_SIZE];
    uint32_t rank;
    int32_t device;
    uint32_t conn_id;
    uint64_t token;
    pid_t producer_pid;
    ferry_descriptor pool; /* the pool-only descriptor: identity, layout, backend */
    uint32_t consumers, max_inflight, row_words, depth;
    uint64_t data_size;
    uint64_t gen_addr, extent_addr, control_addr, data_addr; /* remote addresses */
    int control_rkey, data_rkey;                             /* which region's key */
    /* descriptors forwarded and not taken yet: [in_head, in_tail) */
    ferry_descriptor *inbox;
    uint32_t in_head, in_tail;
    uint32_t taken, reported; /* taken so far; what the producer was told */
    lease_note *notes;        /* by slot */
    uint32_t *my_acks;        /* by slot: the generation this process acknowledged its rank */
    uint32_t *revoked;        /* by slot: the held lease the producer asked back (generation) */
    uint32_t *to_release;     /* by slot: the generation to answer RELEASED for; 0: none */
    uint32_t releases;        /* entries of to_release set */
    ferry__part_set *parts;
    /* Leases may come inline: the pool's data is host memory in region 1. Their bytes are
     * kept in a ring of depth places, a new one taking the oldest's place: at most depth x
     * FERRY_REMOTE_INLINE_MAX bytes. A place is emptied when this rank acknowledges its lease
     * or its slot's note moves on. */
    int inline_ok;
    int marks_partial; /* the control words are in host memory: partly acknowledged leases
                        * are marked (FERRY_AM_ACK_PARTIAL) */
    int served;        /* reads are served by the producer: UCX would emulate gets (no RMA
                        * lane) */
    CUstream io;       /* served reads into GPU memory copy on it (made at the first) */
    uint32_t read_ids; /* the last read request's id */
    served_read *rd;   /* the served read waiting for answers, or NULL */
    inline_copy *inl;
    uint32_t inl_next;
    /* This rank's own acknowledgements, recorded here at once and sent together: when
     * FERRY_AM_ACKS_MAX wait, before another ACK or a RELEASED, when a call finds nothing
     * to take or waits for a lease, at a call's end or inside a call's wait once the first
     * waited ack_delay_ns, and otherwise by the acknowledgement thread ack_delay_ns after
     * the first (a process that makes no further call). */
    uint64_t looked_at;    /* when producer_gone_lately last looked at the connection */
    uint64_t quiet_at;     /* when a progress of the worker last found nothing (drain) */
    uint64_t ack_delay_ns; /* 0: each acknowledgement goes out at once */
    uint32_t acks;         /* waiting: (slot, generation) pairs in ack_payload */
    uint64_t acks_since;   /* when the first of them was made */
    int acks_failed;       /* their last send failed: tried again once they are due */
    uint8_t ack_payload[8 * FERRY_AM_ACKS_MAX];
    pthread_t acker;    /* the acknowledgement thread, made at the first deferred one */
    int acker_on;       /* it runs */
    int acker_stop;     /* it ends at its next wake */
    int acker_timer;    /* timerfd it sleeps on (CLOCK_MONOTONIC, as ferry__now_ns) */
    uint64_t timer_due; /* when the timer fires (0: disarmed) */
};

/* ---- the connection ---------------------------------------------------------------------- */

static ferry_status gone_error(ferry__remote_client *cl)
{
    return ferry__fail(FERRY_PRODUCER_GONE,
                       "producer of the remote pool %.80s (pid %d on its host) closed it, exited "
                       "or fell silent: nothing more comes to rank %u",
                       cl->address, (int)cl->producer_pid, cl->rank);
}

/* 1 once the producer's end of the connection closed or failed (checked without blocking). */
static int producer_gone(ferry__remote_client *cl)
{
    if (cl->gone)
        return 1;
    uint8_t b;
    ssize_t n = recv(cl->sock, &b, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || n > 0)
        cl->gone = 1; /* the producer sends nothing after its welcome: a byte is a violation */
    return cl->gone;
}

/* producer_gone for a call that only reports it (a read, a wait, an acknowledgement): the
 * connection is looked at once every CLIENT_LOOK_NS at most, so a hand-over's calls make one
 * system call between them, not one each. What relies on the connection being open (a held
 * lease's read, held_still) looks itself. */
static int producer_gone_lately(ferry__remote_client *cl)
{
    uint64_t now = ferry__now_ns();
    if (cl->gone || now - cl->looked_at < CLIENT_LOOK_NS)
        return cl->gone;
    cl->looked_at = now;
    return producer_gone(cl);
}

static void set_keepalive(int fd, uint32_t timeout_ms)
{
    int one = 1;
    unsigned ms = timeout_ms;
    int idle = ms >= 5000 ? (int)(ms / 5000) : 1;
    int count = (int)((ms / 1000 > (unsigned)idle ? ms / 1000 - (unsigned)idle : 1));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

static uint64_t left_of(uint64_t deadline)
{
    uint64_t now = ferry__now_ns();
    return deadline > now ? deadline - now : 0;
}

static ferry_status dial(const ferry__remote_address *a, uint64_t deadline, int *out)
{
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)a->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    int rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc != 0)
        return ferry__fail(FERRY_PRODUCER_GONE, "remote pool at %s:%u: %s", a->host, a->port,
                           gai_strerror(rc));
    int fd = -1, err = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            err = 0;
        } else if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            socklen_t len = sizeof(err);
            if (poll(&p, 1, (int)(left_of(deadline) / 1000000ull)) != 1 ||
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = ETIMEDOUT;
        } else {
            err = errno;
        }
        if (err) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return ferry__fail_errno(err == ETIMEDOUT ? FERRY_TIMEOUT : FERRY_PRODUCER_GONE, err,
                                 "no remote pool answers at %s:%u", a->host, a->port);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *out = fd;
    return FERRY_OK;
}

static int io_all(int fd, uint8_t *buf, size_t n, int writing, uint64_t deadline)
{
    while (n) {
        ssize_t k = writing ? send(fd, buf, n, MSG_NOSIGNAL) : recv(fd, buf, n, 0);
        if (k > 0) {
            buf += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EINTR))
            return k == 0 ? -2 : -1;
        uint64_t left = left_of(deadline);
        if (!left)
            return -3;
        struct pollfd p = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        poll(&p, 1, (int)(left / 1000000ull) + 1);
    }
    return 0;
}

static ferry_status io_failed(ferry__remote_client *cl, int rc, const char *what)
{
    if (rc == -3)
        return ferry__fail(FERRY_TIMEOUT, "remote pool %.80s: %s timed out", cl->address, what);
    if (rc == -2)
        return ferry__fail(FERRY_PRODUCER_GONE,
                           "remote pool %.80s closed the connection during %s (its producer "
                           "closed the pool or refused the peer)",
                           cl->address, what);
    return ferry__fail_errno(FERRY_PRODUCER_GONE, errno, "remote pool %.80s: %s failed",
                             cl->address, what);
}

static ferry_status refused(ferry__remote_client *cl, const ferry__refuse *r)
{
    switch (r->status) {
    case FERRY_PERMISSION:
        return ferry__fail(FERRY_PERMISSION,
                           "remote pool %.80s refused the connection: wrong secret or another "
                           "pool (use the address ferry_pool_remote_address gives)",
                           cl->address);
    case FERRY_RANK_IN_USE:
        return ferry__fail(FERRY_RANK_IN_USE,
                           "rank %u is held by live process %u (a rank belongs to one live "
                           "process at a time)",
                           r->rank, r->holder_pid);
    case FERRY_INVALID_ARGUMENT:
        return ferry__fail(FERRY_INVALID_ARGUMENT, "rank %u is not a rank of the remote pool %.80s",
                           r->rank, cl->address);
    case FERRY_TIMEOUT:
        return ferry__fail(FERRY_TIMEOUT,
                           "remote pool %.80s refused the connection: too many connections are "
                           "waiting to be admitted",
                           cl->address);
    default:
        return ferry__fail((ferry_status)r->status, "remote pool %.80s refused rank %u: %s",
                           cl->address, r->rank, ferry_status_str((ferry_status)r->status));
    }
}

static ferry_status say_hello(ferry__remote_client *cl, const ferry__remote_address *a,
                              uint64_t deadline)
{
    /* A hello that claims no rank asks for the pool's description only (the server makes no
     * endpoint): its worker address is one zero byte. */
    static const uint8_t no_worker[1] = {0};
    ferry__hello h = {.rank = cl->rank,
                      .pid = (uint32_t)getpid(),
                      .worker_len = cl->node.address ? (uint32_t)cl->node.address_len : 1,
                      .worker = cl->node.address ? (const uint8_t *)cl->node.address : no_worker};
    memcpy(h.secret, a->secret, 16);
    memcpy(h.pool_id, a->pool_id, 16);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    for (size_t i = 0; i < sizeof(h.host) - 1 && host[i]; i++)
        h.host[i] = host[i] > 0x20 && host[i] < 0x7f ? host[i] : '_';
    uint8_t msg[FERRY_REMOTE_MAX_MESSAGE];
    size_t n = ferry__hello_size(&h);
    ferry_status st = ferry__hello_encode(&h, msg, sizeof(msg));
    if (st != FERRY_OK)
        return st;
    int rc = io_all(cl->sock, msg, n, 1, deadline);
    return rc ? io_failed(cl, rc, "sending the hello") : FERRY_OK;
}

/* Reads the producer's answer: FERRY_OK with *w (pointing into buf), or the refusal. */
static ferry_status hear_answer(ferry__remote_client *cl, uint8_t *buf, uint64_t deadline,
                                ferry__welcome *w)
{
    uint32_t type, size;
    int rc = io_all(cl->sock, buf, FERRY_REMOTE_HEADER, 0, deadline);
    if (rc)
        return io_failed(cl, rc, "waiting for the welcome");
    ferry_status st = ferry__remote_peek(buf, FERRY_REMOTE_HEADER, &type, &size);
    if (st == FERRY_OK && type == FERRY_REMOTE_HELLO)
        st = ferry__fail(FERRY_MALFORMED, "remote pool %.80s answered with a hello", cl->address);
    if (st != FERRY_OK)
        return st;
    rc = io_all(cl->sock, buf + FERRY_REMOTE_HEADER, size - FERRY_REMOTE_HEADER, 0, deadline);
    if (rc)
        return io_failed(cl, rc, "reading the welcome");
    if (type == FERRY_REMOTE_REFUSE) {
        ferry__refuse r;
        st = ferry__refuse_decode(buf, size, &r);
        return st == FERRY_OK ? refused(cl, &r) : st;
    }
    return ferry__welcome_decode(buf, size, w);
}

/* 1 if [offset, offset + bytes) lies in a region of size. */
static int inside(uint64_t offset, uint64_t bytes, uint64_t size)
{
    return offset <= size && bytes <= size - offset;
}

/* Checks the welcome against the pool's own descriptor and the address, and keeps the
 * layout privately. */
static ferry_status take_layout(ferry__remote_client *cl, const ferry__remote_address *a,
                                const ferry__welcome *w)
{
    ferry_descriptor d;
    ferry_status st = ferry_descriptor_decode(w->pool, FERRY_DESCRIPTOR_SIZE, &d);
    if (st != FERRY_OK)
        return ferry__fail_wrap(FERRY_MALFORMED, "remote pool %.80s sent a bad pool descriptor",
                                cl->address);
    uint64_t consumers = d.consumer_count, rows = d.max_inflight;
    uint64_t data_start = ferry__data_start(rows, consumers);
    uint64_t data_size = d.pool_size > data_start ? (d.pool_size - data_start) & ~(uint64_t)255 : 0;
    int ctl = (w->flags & FERRY_WELCOME_CONTROL_IN_POOL) != 0;
    int dat = (w->flags & FERRY_WELCOME_DATA_IN_POOL) != 0;
    const char *why = NULL;
    if (!(d.flags & FERRY_DESC_FLAG_POOL_ONLY) || memcmp(d.pool_id, a->pool_id, 16) != 0)
        why = "it is another pool's";
    else if (cl->rank >= consumers)
        why = "the rank is out of range";
    else if (rows > FERRY_MAX_INFLIGHT) /* checked before anything is sized by it */
        why = "it has more slots than a pool can have";
    else if (!data_size || !inside(w->gen_offset, 4 * rows, w->region_size[0]) ||
             !inside(w->extent_offset, 16 * rows, w->region_size[0]) ||
             !inside(w->control_offset, 4 * rows * (1 + consumers), w->region_size[ctl]) ||
             !inside(w->data_offset, data_size, w->region_size[dat]) || w->ring_depth > 65536)
        why = "its tables do not fit its regions";
    if (why)
        return ferry__fail(FERRY_MISMATCH, "remote pool %.80s sent a layout ferry cannot use: %s",
                           cl->address, why);
    cl->pool = d;
    cl->marks_partial = !ctl;
    cl->consumers = (uint32_t)consumers;
    cl->max_inflight = (uint32_t)rows;
    cl->row_words = (uint32_t)consumers + 1;
    cl->depth = w->ring_depth;
    cl->data_size = data_size;
    cl->gen_addr = w->region_addr[0] + w->gen_offset;
    cl->extent_addr = w->region_addr[0] + w->extent_offset;
    cl->control_addr = w->region_addr[ctl] + w->control_offset;
    cl->data_addr = w->region_addr[dat] + w->data_offset;
    cl->control_rkey = ctl;
    cl->data_rkey = dat;
    cl->inline_ok = !dat;
    cl->conn_id = w->conn_id;
    cl->token = w->token;
    cl->producer_pid = (pid_t)w->producer_pid;
    cl->inbox = calloc(cl->depth, sizeof(*cl->inbox));
    cl->notes = calloc(rows, sizeof(*cl->notes));
    cl->my_acks = calloc(rows, sizeof(*cl->my_acks));
    cl->revoked = calloc(rows, sizeof(*cl->revoked));
    cl->to_release = calloc(rows, sizeof(*cl->to_release));
    cl->inl = calloc(cl->depth, sizeof(*cl->inl));
    if (!cl->inbox || !cl->notes || !cl->my_acks || !cl->revoked || !cl->to_release || !cl->inl)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for a remote pool's bookkeeping");
    return FERRY_OK;
}

/* ---- leases that came inline ---------------------------------------------------------------- */

/* Empties place i of the inline ring (and its note's link to it). */
static void inline_drop(ferry__remote_client *cl, uint32_t i)
{
    inline_copy *e = &cl->inl[i];
    if (!e->bytes)
        return;
    if (cl->notes[e->slot].inl == i + 1)
        cl->notes[e->slot].inl = 0;
    free(e->bytes);
    e->bytes = NULL;
}

/* Lets go of the inline bytes of the lease (slot, generation), if they are kept. */
static void inline_forget(ferry__remote_client *cl, uint32_t slot, uint32_t generation)
{
    uint32_t i = cl->notes[slot].inl;
    if (i && cl->inl[i - 1].generation == generation)
        inline_drop(cl, i - 1);
}

/* Keeps the bytes of a lease that came inline (its extent [offset, +n)) in the oldest place
 * of the ring. Without memory they are not kept: reads then get them. */
static void inline_keep(ferry__remote_client *cl, const ferry_descriptor *d, uint64_t offset,
                        const uint8_t *bytes, uint64_t n)
{
    uint32_t i = cl->inl_next++ % cl->depth;
    inline_drop(cl, i);
    uint8_t *copy = malloc(n);
    if (!copy)
        return;
    memcpy(copy, bytes, n);
    cl->inl[i] = (inline_copy){d->slot, d->generation, offset, n, copy};
    cl->notes[d->slot].inl = i + 1;
}

/* Where d's bytes are among the inline bytes kept of its lease; NULL if they are not. */
static const uint8_t *inline_bytes(const ferry__remote_client *cl, const ferry_descriptor *d)
{
    uint32_t i = cl->notes[d->slot].inl;
    if (!i)
        return NULL;
    const inline_copy *e = &cl->inl[i - 1];
    if (!e->bytes || e->slot != d->slot || e->generation != d->generation ||
        !ferry__range_inside(d->offset, d->length, e->offset, e->length))
        return NULL;
    return e->bytes + (d->offset - e->offset);
}

/* What is known of the slot's lease from here on (held: its DESC said so); inline bytes of
 * an older one go. */
static void note_set(ferry__remote_client *cl, const ferry_descriptor *d, uint64_t offset,
                     uint64_t length, int held)
{
    lease_note *n = &cl->notes[d->slot];
    if (n->inl)
        inline_drop(cl, n->inl - 1);
    *n = (lease_note){d->generation, 1, offset, length, 0, (uint32_t)held};
}

/* 1 if the producer holds d's lease for this rank and has not asked for it back. */
static int held(const ferry__remote_client *cl, const ferry_descriptor *d)
{
    const lease_note *n = &cl->notes[d->slot];
    return n->generation == d->generation && n->held && cl->revoked[d->slot] != d->generation;
}

/* ---- UCX: the endpoint, active messages, gets ------------------------------------------------ */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    ferry__remote_client *cl = arg;
    cl->gone = 1; /* called inside progress, under the client's lock */
}

/* A DESC from the producer: count descriptors of one lease, checked and queued; or one
 * descriptor and the lease's bytes (inline: the decoder checked that they are as many as the
 * extent's length, at most FERRY_REMOTE_INLINE_MAX), never for a pool whose data is GPU
 * memory. They are decoded into the inbox's free places and queued (in_tail moved) only when
 * all pass: no lease is dropped for want of memory (inline bytes that find none are left to
 * reads, which get them). */
static void on_desc(ferry__remote_client *cl, const ferry__am *m, const uint8_t *data, size_t len)
{
    int inl = (m->flags & FERRY_AM_DESC_INLINE) != 0;
    uint32_t k = inl ? 1 : (uint32_t)(len / FERRY_DESCRIPTOR_SIZE);
    if (inl && !cl->inline_ok)
        return; /* the producer broke the protocol: nothing is queued */
    if (k > cl->depth - (cl->in_tail - cl->in_head))
        return; /* more than the window: the producer broke the protocol; nothing is queued */
    const ferry_descriptor *first = &cl->inbox[cl->in_tail % cl->depth];
    for (uint32_t i = 0; i < k; i++) {
        ferry_descriptor *d = &cl->inbox[(cl->in_tail + i) % cl->depth];
        if (ferry_descriptor_decode(data + (size_t)i * FERRY_DESCRIPTOR_SIZE, FERRY_DESCRIPTOR_SIZE,
                                    d) != FERRY_OK ||
            memcmp(d->pool_id, cl->pool.pool_id, 16) != 0 || d->slot >= cl->max_inflight ||
            (d->flags & FERRY_DESC_FLAG_POOL_ONLY) || d->slot != first->slot ||
            d->generation != first->generation || (k > 1 && d->part_index != i) ||
            (k > 1 ? d->part_count != k : d->part_count > 1) ||
            !ferry__range_inside(d->offset, d->length, m->u.desc.offset, m->u.desc.length))
            return; /* in_tail did not move: nothing is queued */
    }
    cl->in_tail += k;
    note_set(cl, first, m->u.desc.offset, m->u.desc.length, (m->flags & FERRY_AM_DESC_HELD) != 0);
    if (inl)
        inline_keep(cl, first, m->u.desc.offset, data + FERRY_DESCRIPTOR_SIZE, m->u.desc.length);
}

static uint64_t piece_length(const served_read *r, uint64_t piece)
{
    uint64_t left = r->dst ? r->d->length - piece * FERRY_REMOTE_READ_PIECE : 0;
    return left < FERRY_REMOTE_READ_PIECE ? left : FERRY_REMOTE_READ_PIECE;
}

/* A DATA from the producer: the answer to a request of the read waiting now, or dropped (an
 * answer to a read that already ended, or a lie). Bytes are written only into that read's
 * destination, only as many as its piece has, and only with status OK. */
static void on_data(ferry__remote_client *cl, const ferry__am *m, const uint8_t *data, size_t len)
{
    served_read *r = cl->rd;
    int i = 0;
    while (r && i < CLIENT_READ_WINDOW && !(r->at[i].id && r->at[i].id == m->u.data.id))
        i++;
    if (!r || i == CLIENT_READ_WINDOW)
        return;
    if (r->fail) { /* ended: its answers are only counted in (serve drains them) */
        r->at[i].id = 0;
        return;
    }
    uint64_t now = ferry__now_ns(), piece = r->at[i].piece;
    int extent = (m->flags & FERRY_AM_DATA_EXTENT) != 0;
    r->heard = now;
    r->at[i].id = 0;
    switch (m->u.data.status) {
    case FERRY_AM_DATA_NOT_READY: /* a look ends (wait_ready asks again); a piece's can't be */
        if (!r->dst) {
            r->fail = FERRY_AM_DATA_NOT_READY;
            return;
        }
        /* fall through */
    case FERRY_AM_DATA_BUSY:
        if (now >= r->deadline)
            r->fail = FERRY_AM_DATA_BUSY;
        else
            r->at[i].again = now + CLIENT_READY_POLL_NS;
        return;
    case FERRY_AM_DATA_STALE:
        r->fail = FERRY_AM_DATA_STALE;
        r->value = m->u.data.value;
        return;
    case FERRY_AM_DATA_FAILED:
        r->fail = FERRY_AM_DATA_FAILED;
        return;
    case FERRY_AM_DATA_OUTSIDE:
        r->fail = FERRY_AM_DATA_OUTSIDE;
        r->extent[0] = ferry__get_le64(data);
        r->extent[1] = ferry__get_le64(data + 8);
        return;
    default: /* OK (the decoder let no other status through) */
        break;
    }
    if (r->dst ? extent || len != piece_length(r, piece) : !extent) {
        r->fail = SERVED_LIE;
        return;
    }
    if (r->dst && r->gpu) {
        const ferry__cuda *cuda;
        (void)ferry__cuda_get(&cuda); /* loaded: the destination was found GPU memory */
        r->copy_call = "cuMemcpyAsync";
        CUresult rc =
            cuda->cuMemcpyAsync((CUdeviceptr)(uintptr_t)(r->dst + piece * FERRY_REMOTE_READ_PIECE),
                                (CUdeviceptr)(uintptr_t)data, len, cl->io);
        if (rc == CUDA_SUCCESS) {
            r->copy_call = "cuStreamSynchronize";
            rc = cuda->cuStreamSynchronize(cl->io);
        }
        if (rc != CUDA_SUCCESS) {
            r->fail = SERVED_COPY;
            r->copy_failed = rc;
            return;
        }
    } else if (r->dst) {
        memcpy(r->dst + piece * FERRY_REMOTE_READ_PIECE, data, len);
    } else {
        r->extent[0] = ferry__get_le64(data);
        r->extent[1] = ferry__get_le64(data + 8);
    }
    r->done++;
}

/* A REVOKE: the producer wants the held lease back (another acknowledged it for this rank, or
 * the producer cancelled it). Reads of it from here check it remotely; RELEASED is answered
 * once the call that is running (a read of it, perhaps) returned (release_all). */
static void on_revoke(ferry__remote_client *cl, const ferry__am *m)
{
    uint32_t slot = m->u.hold.slot;
    if (slot >= cl->max_inflight || !m->u.hold.generation)
        return;
    cl->revoked[slot] = m->u.hold.generation;
    if (!cl->to_release[slot])
        cl->releases++;
    cl->to_release[slot] = m->u.hold.generation;
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_len, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    ferry__remote_client *cl = arg;
    ferry__am m;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        ferry__am_decode(header, header_len, len, &m) != FERRY_OK || m.conn_id != cl->conn_id ||
        ferry__secret_differs((const uint8_t *)&m.token, (const uint8_t *)&cl->token, 8))
        return UCS_OK;
    if (m.type == FERRY_AM_DESC)
        on_desc(cl, &m, data, len);
    else if (m.type == FERRY_AM_DATA)
        on_data(cl, &m, data, len);
    else if (m.type == FERRY_AM_REVOKE)
        on_revoke(cl, &m);
    return UCS_OK;
}

static ferry_status make_ep(ferry__remote_client *cl, const ferry__welcome *w)
{
    const ferry__ucx *u = cl->node.ucx;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)w->worker,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {on_ep_error, cl},
    };
    ferry_status st = ferry__ucx_fds_spare();
    if (st != FERRY_OK)
        return st;
    ucs_status_t rc = u->ucp_ep_create(cl->node.worker, &ep, &cl->ep);
    if (rc != UCS_OK) {
        cl->ep = NULL;
        return ferry__ucx_fail(u, "ucp_ep_create", rc);
    }
    for (int i = 0; i < 2; i++) {
        if (!w->rkey_len[i])
            continue;
        rc = u->ucp_ep_rkey_unpack(cl->ep, w->rkey[i], &cl->rkey[i]);
        if (rc != UCS_OK) {
            cl->rkey[i] = NULL;
            return ferry__ucx_fail(u, "ucp_ep_rkey_unpack", rc);
        }
    }
    return FERRY_OK;
}

/* An active message of another id than ferry's: dropped. */
static ucs_status_t on_other_am(void *arg, const void *header, size_t header_len, void *data,
                                size_t len, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_len, (void)data, (void)len, (void)param;
    return UCS_OK;
}

/* Registered before the hello goes out: the producer may forward descriptors the moment it
 * admits this rank, before its welcome is read here (they wait in the worker until the
 * client progresses it, once it knows its connection). */
static ferry_status set_handler(ferry__remote_client *cl)
{
    return ferry__ucx_node_handlers(&cl->node, FERRY_AM_ID, on_am, on_other_am, cl);
}

/* Progresses until every request of reqs[0, n) is done, sleeping on the worker's event fd
 * once a spin found nothing to do; the connection is looked at every slice. Requests are
 * freed. PRODUCER_GONE (the endpoint is closed by force, which ends the requests) if the
 * producer went away meanwhile. Called with the lock held. */
/* Gives the endpoint up (its requests end, cancelled): the producer is gone or silent. The
 * connection is shut down too, so that a producer that comes back sees this consumer leave
 * and settles its rank, and pollers of the consumer's fd wake up. */
static void abandon(ferry__remote_client *cl)
{
    const ferry__ucx *u = cl->node.ucx;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *close_req = u->ucp_ep_close_nbx(cl->ep, &p);
    cl->ep = NULL;
    /* A forced close ends locally; 100 ms at most all the same (a request freed before it
     * ends is released by UCX when it does). */
    uint64_t until = ferry__now_ns() + 100000000ull;
    while (close_req && !FERRY_UCS_PTR_IS_ERR(close_req) &&
           u->ucp_request_check_status(close_req) == UCS_INPROGRESS && ferry__now_ns() < until)
        u->ucp_worker_progress(cl->node.worker);
    if (close_req && !FERRY_UCS_PTR_IS_ERR(close_req))
        u->ucp_request_free(close_req);
    cl->gone = 1;
    shutdown(cl->sock, SHUT_RDWR);
}

/* Looked at once every CLIENT_SLICE_NS of a wait (*check): the producer is taken for gone if
 * its connection ended, or if nothing (what) ended for the keepalive bound since heard; its
 * endpoint is then given up, and that said once. 1 if the endpoint is given up, now or
 * before. */
static int producer_silent(ferry__remote_client *cl, uint64_t now, uint64_t heard, uint64_t *check,
                           const char *what)
{
    if (now < *check)
        return !cl->ep;
    *check = now + CLIENT_SLICE_NS;
    if (cl->ep && (producer_gone(cl) || now - heard > cl->silence_ns)) {
        if (!cl->gone)
            ferry__log(FERRY_LOG_WARN,
                       "remote pool %.80s: no %s ended for %.0f ms: the producer is taken for "
                       "gone (rank %u)",
                       cl->address, what, (double)(now - heard) / 1e6, cl->rank);
        abandon(cl);
    }
    return !cl->ep;
}

static int acks_due(const ferry__remote_client *cl, uint64_t now);
static ferry_status flush_acks(ferry__remote_client *cl, uint64_t spin_ns);

/* Once a wait that found nothing to do has spun for spin_ns since start, sleeps on the
 * worker's event fd (1 ms at most); with CLIENT_NO_ARM, sleeps 20 us at a time after
 * CLIENT_SPIN_NS, the worker left unarmed. */
static void wait_idle(ferry__remote_client *cl, int busy, uint64_t now, uint64_t start,
                      uint64_t spin_ns)
{
    /* A long wait (a large read) holds the lock: the acknowledgements that fall due during
     * it go from here, not after it. */
    if (acks_due(cl, now))
        flush_acks(cl, CLIENT_SPIN_NS);
    if (busy || now - start <= (spin_ns == CLIENT_NO_ARM ? CLIENT_SPIN_NS : spin_ns))
        return;
    if (spin_ns == CLIENT_NO_ARM) { /* the acknowledgement thread's send: never arms */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    } else if (cl->node.ucx->ucp_worker_arm(cl->node.worker) == UCS_OK) {
        struct pollfd p = {.fd = cl->node.efd, .events = POLLIN};
        poll(&p, 1, 1);
    }
}

/* Waits for requests to end. Not bounded by the caller's timeout (a get in flight writes into
 * the caller's memory until it ends), but by the producer's liveness: its connection ending,
 * or no request ending for the keepalive bound (a stopped producer keeps its TCP connection,
 * and the kernel answers its keepalives). What ends is what counts: the worker's progress
 * says nothing (UCX 1.22 reports progress of its own while the producer is stopped), so a
 * read's slice is got in pieces of CLIENT_GET_PIECE, each ending well within the bound. */
static ferry_status wait_requests(ferry__remote_client *cl, void **reqs, int n, const char *what,
                                  uint64_t spin_ns)
{
    const ferry__ucx *u = cl->node.ucx;
    ucs_status_t first = UCS_OK;
    uint64_t start = ferry__now_ns(), check = start + CLIENT_SLICE_NS, heard = start;
    uint64_t given_up = 0; /* when the endpoint was found given up */
    for (int i = 0; i < n; i++) {
        if (FERRY_UCS_PTR_IS_ERR(reqs[i]) && first == UCS_OK)
            first = FERRY_UCS_PTR_STATUS(reqs[i]);
        if (!reqs[i] || FERRY_UCS_PTR_IS_ERR(reqs[i]))
            continue;
        ucs_status_t st;
        while ((st = u->ucp_request_check_status(reqs[i])) == UCS_INPROGRESS) {
            /* Looked at on every turn, busy or not: UCX 1.22's progress reports work of its
             * own forever while the producer is stopped. */
            int busy = u->ucp_worker_progress(cl->node.worker) != 0;
            uint64_t now = ferry__now_ns();
            producer_silent(cl, now, heard, &check, what);
            /* A forced close ends the endpoint's requests at once (cancelled: UCX purges
             * them); should one not end, it is let go after 100 ms rather than waited for
             * forever (UCX releases a freed request when it ends). */
            if (!cl->ep && !given_up)
                given_up = now;
            if (given_up && now - given_up > 100000000ull)
                break;
            wait_idle(cl, busy, now, start, spin_ns);
        }
        u->ucp_request_free(reqs[i]);
        heard = ferry__now_ns();
        if (st != UCS_OK && first == UCS_OK)
            first = st;
    }
    if (cl->gone || !cl->ep)
        return gone_error(cl);
    if (first != UCS_OK) {
        ferry__ucx_fail(u, what, first);
        return ferry__fail_wrap(FERRY_SYSTEM, "remote pool %.80s", cl->address);
    }
    return FERRY_OK;
}

static void *get(ferry__remote_client *cl, void *dst, uint64_t n, uint64_t raddr, int key,
                 int gpu_dst)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                             .memory_type = gpu_dst ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST};
    return cl->node.ucx->ucp_get_nbx(cl->ep, dst, n, raddr, cl->rkey[key], &p);
}

/* Sends a small active message to the producer (header only, or a short payload), waiting
 * for it to leave; a wait past spin_ns sleeps on the worker's fd (armed). */
static ferry_status send_am_spin(ferry__remote_client *cl, ferry__am *m, const void *payload,
                                 size_t n, uint64_t spin_ns)
{
    if (cl->gone || !cl->ep) /* an endpoint given up during this call takes nothing more */
        return gone_error(cl);
    /* Acknowledgements waiting go before another acknowledgement or a RELEASED: the
     * producer takes what this rank says of its leases in the order it was said. A READ or
     * a TAKEN passes them (neither says anything of a lease). */
    if (cl->acks &&
        (m->type == FERRY_AM_ACK || m->type == FERRY_AM_RELEASED || m->type == FERRY_AM_INFO)) {
        ferry_status st = flush_acks(cl, spin_ns);
        if (st != FERRY_OK)
            return st;
    }
    uint8_t hdr[FERRY_AM_HEADER];
    m->conn_id = cl->conn_id;
    m->token = cl->token;
    ferry__am_encode(m, hdr);
    ucp_request_param_t p = ferry__ucx_am_param();
    void *req =
        cl->node.ucx->ucp_am_send_nbx(cl->ep, FERRY_AM_ID, hdr, sizeof(hdr), payload, n, &p);
    return wait_requests(cl, &req, 1, "ucp_am_send_nbx", spin_ns);
}

static ferry_status send_am(ferry__remote_client *cl, ferry__am *m, const void *payload, size_t n)
{
    return send_am_spin(cl, m, payload, n, CLIENT_SPIN_NS);
}

/* ---- acknowledgements on their way ------------------------------------------------------- */

/* Sets the acknowledgement thread's timer to fire when the acknowledgements waiting are due,
 * unless it fires by then already (it then sets itself again for them). No thread is woken
 * here, and no system call made while the timer is set: a consumer that acknowledges and
 * then calls again before the delay (the flush of that call sends them) costs nothing
 * more. */
static void acker_wake_at_due(ferry__remote_client *cl)
{
    uint64_t due = cl->acks_since + cl->ack_delay_ns;
    if (!cl->acker_on || (cl->timer_due && cl->timer_due <= due))
        return;
    struct itimerspec it = {
        .it_value = {(time_t)(due / 1000000000ull), (long)(due % 1000000000ull)}};
    if (timerfd_settime(cl->acker_timer, TFD_TIMER_ABSTIME, &it, NULL) == 0)
        cl->timer_due = due;
    else /* no timer: each acknowledgement goes out at once from here, what waits at this
          * call's end */
        cl->ack_delay_ns = 0;
}

/* Before a sleep with nothing waiting: the acknowledgement thread's timer is put off (it would
 * wake the thread for nothing). */
static void acker_put_off(ferry__remote_client *cl)
{
    if (!cl->acker_on || !cl->timer_due || cl->acks)
        return;
    struct itimerspec off = {{0, 0}, {0, 0}};
    if (timerfd_settime(cl->acker_timer, 0, &off, NULL) == 0)
        cl->timer_due = 0;
}

/* Sends the acknowledgements waiting, in one ACKS. Where the producer is gone they go with
 * it; any other failure keeps them waiting, to go with the next try (the producer takes an
 * acknowledgement twice as once). */
static ferry_status flush_acks(ferry__remote_client *cl, uint64_t spin_ns)
{
    uint32_t count = cl->acks;
    if (!count)
        return FERRY_OK;
    ferry__am m = {.type = FERRY_AM_ACKS, .u.acks = {count}};
    cl->acks = 0; /* taken first: the send's own wait must not send them again */
    ferry_status st = send_am_spin(cl, &m, cl->ack_payload, 8u * count, spin_ns);
    cl->acks_failed = st != FERRY_OK && !cl->gone && cl->ep;
    if (cl->acks_failed) {
        cl->acks = count;
        cl->acks_since = ferry__now_ns(); /* tried again a delay from now, not at once */
        acker_wake_at_due(cl);
    }
    return st;
}

/* Sends the acknowledgements waiting where a call has nothing else to do (it found nothing
 * to take, or is about to sleep), unless their last send failed and a delay has not passed
 * since: a send that keeps failing is not tried on every turn of a wait. */
static void offer_acks(ferry__remote_client *cl)
{
    if (!cl->acks_failed || acks_due(cl, ferry__now_ns()))
        flush_acks(cl, CLIENT_SPIN_NS);
}

/* 1 once the acknowledgements waiting are due (the first waited ack_delay_ns). */
static int acks_due(const ferry__remote_client *cl, uint64_t now)
{
    return cl->acks && now - cl->acks_since >= cl->ack_delay_ns;
}

/* Wakes a caller asleep on the consumer's fd (the wake fd in poll_fd, drained when the
 * worker is armed again). */
static void ring_poll_fd(ferry__remote_client *cl)
{
    uint64_t one = 1;
    if (write(cl->wake_fd, &one, sizeof(one)) < 0) {
        /* full (already readable) */
    }
}

/* The acknowledgement thread: sends what waits once it is due, for a process that makes no
 * call by then. Its sends never arm the worker, and a descriptor or REVOKE its wait took in
 * wakes the consumer's fd: a caller asleep on it is woken for them as if it had taken them
 * in itself. It answers no REVOKE (answers go at a call's end, after the call's reads). */
static void *acker_main(void *arg)
{
    ferry__remote_client *cl = arg;
    for (;;) {
        /* A second at most: should the timer fail (it cannot, short of memory), what waits
         * and the stop are seen all the same. */
        struct pollfd p = {.fd = cl->acker_timer, .events = POLLIN};
        uint64_t fired;
        if (poll(&p, 1, 1000) < 0 && errno != EINTR) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&cl->lock);
        if (read(cl->acker_timer, &fired, sizeof(fired)) == sizeof(fired))
            cl->timer_due = 0;
        if (cl->acker_stop) {
            pthread_mutex_unlock(&cl->lock);
            break;
        }
        if (acks_due(cl, ferry__now_ns())) {
            uint32_t tail = cl->in_tail, releases = cl->releases;
            int gone = cl->gone;
            flush_acks(cl, CLIENT_NO_ARM);
            if (cl->in_tail != tail || cl->releases != releases || cl->gone != gone)
                ring_poll_fd(cl); /* its wait took them in */
        }
        if (cl->acks) /* a batch begun since the timer was set, or kept by a failed send */
            acker_wake_at_due(cl);
        pthread_mutex_unlock(&cl->lock);
    }
    return NULL;
}

/* Makes the acknowledgement thread (signals blocked: a caller's handlers never run on it); 0
 * if it could not be made. */
static int acker_start(ferry__remote_client *cl)
{
    int err = 0;
    cl->acker_timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (cl->acker_timer < 0) {
        err = errno;
    } else {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        err = pthread_create(&cl->acker, NULL, acker_main, cl);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (err) {
        ferry__log(FERRY_LOG_INFO,
                   "remote pool %.80s: no thread for acknowledgements (%s): each goes out at once",
                   cl->address, strerror(err));
        if (cl->acker_timer >= 0)
            close(cl->acker_timer);
        cl->acker_timer = -1;
        return 0;
    }
    cl->acker_on = 1;
    return 1;
}

/* Stops the acknowledgement thread, after what waits went out. */
static void acker_stop(ferry__remote_client *cl)
{
    pthread_mutex_lock(&cl->lock);
    flush_acks(cl, CLIENT_SPIN_NS);
    cl->acker_stop = 1;
    if (cl->acker_on) { /* fires at once */
        struct itimerspec it = {.it_value = {0, 1}};
        timerfd_settime(cl->acker_timer, 0, &it, NULL);
    }
    pthread_mutex_unlock(&cl->lock);
    if (cl->acker_on) {
        pthread_join(cl->acker, NULL);
        cl->acker_on = 0;
        close(cl->acker_timer);
        cl->acker_timer = -1;
    }
}

/* OK if queue_ack has room: the waiting acknowledgements are all sent first where
 * FERRY_AM_ACKS_MAX wait (a send failed): else its error, and nothing may be recorded. */
static ferry_status room_for_ack(ferry__remote_client *cl)
{
    return cl->acks == FERRY_AM_ACKS_MAX ? flush_acks(cl, CLIENT_SPIN_NS) : FERRY_OK;
}

/* Records this rank's acknowledgement of (slot, generation) to go out with others: at once
 * when FERRY_AM_ACKS_MAX wait, or where no thread could be made to send them in time. */
static ferry_status queue_ack(ferry__remote_client *cl, uint32_t slot, uint32_t generation)
{
    if (cl->gone || !cl->ep)
        return gone_error(cl);
    ferry_status st = room_for_ack(cl);
    if (st != FERRY_OK)
        return st;
    uint8_t *at = cl->ack_payload + 8u * cl->acks;
    ferry__put_le32(at, slot);
    ferry__put_le32(at + 4, generation);
    if (cl->acks++ == 0) {
        cl->acks_since = ferry__now_ns();
        if (!cl->acker_on && !acker_start(cl))
            cl->ack_delay_ns = 0;
        acker_wake_at_due(cl);
    }
    if (cl->acks < FERRY_AM_ACKS_MAX && cl->ack_delay_ns)
        return FERRY_OK;
    /* Sent now; recorded all the same where the send failed but the producer is not gone:
     * it waits for the next try. */
    st = flush_acks(cl, CLIENT_SPIN_NS);
    return cl->gone || !cl->ep ? st : FERRY_OK;
}

/* Answers the producer's REVOKEs with RELEASED, and sends the acknowledgements that are due;
 * -1 if a RELEASED could not be sent (kept for the next call's end; where the producer is
 * gone, its holds went with it). Called at the end of a call, never while a read runs: a
 * lease asked back during a read of it is let go only after that read took in the REVOKE and
 * returned. */
static int release_all(ferry__remote_client *cl)
{
    if (acks_due(cl, ferry__now_ns())) /* and acknowledgements that waited long enough go */
        flush_acks(cl, CLIENT_SPIN_NS);
    while (cl->releases && !cl->gone && cl->ep) {
        for (uint32_t slot = 0; slot < cl->max_inflight && cl->releases; slot++) {
            uint32_t gen = cl->to_release[slot];
            if (!gen)
                continue;
            cl->to_release[slot] = 0;
            cl->releases--;
            ferry__am m = {.type = FERRY_AM_RELEASED, .u.hold = {slot, gen}};
            if (send_am(cl, &m, NULL, 0) != FERRY_OK) {
                if (cl->gone || !cl->ep) /* its holds went with it: cleared below */
                    break;
                cl->to_release[slot] = gen; /* kept for the next call's end */
                cl->releases++;
                return -1;
            }
        }
    }
    if (cl->gone || !cl->ep) {
        memset(cl->to_release, 0, cl->max_inflight * sizeof(*cl->to_release));
        cl->releases = 0;
    }
    return 0;
}

/* Tells the producer how reads go, so that an emulated path is counted and logged there;
 * where gets would be emulated, reads are served (cl->served). */
static void send_info(ferry__remote_client *cl)
{
    char path[FERRY_AM_MAX_INFO];
    int emulated = 0;
    ferry__ucx_ep_rma_path(&cl->node, cl->ep, path, sizeof(path), &emulated);
    /* FERRY_REMOTE_SERVED=0 keeps UCX's emulated gets (a diagnostic: docs/design.md). */
    const char *knob = getenv("FERRY_REMOTE_SERVED");
    cl->served = emulated && !(knob && strcmp(knob, "0") == 0);
    /* Reads by gets ask for held leases, which they read without the check's round trip; a
     * served read is checked by the producer anyway. */
    ferry__am m = {.type = FERRY_AM_INFO,
                   .flags = (uint16_t)((emulated ? FERRY_AM_INFO_EMULATED : 0) |
                                       (cl->served ? 0 : FERRY_AM_INFO_HOLD))};
    send_am(cl, &m, path, strlen(path));
}

static ferry_status make_poll_fd(ferry__remote_client *cl)
{
    struct epoll_event ev = {.events = EPOLLIN};
    cl->poll_fd = epoll_create1(EPOLL_CLOEXEC);
    cl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cl->poll_fd < 0 || cl->wake_fd < 0 ||
        epoll_ctl(cl->poll_fd, EPOLL_CTL_ADD, cl->node.efd, &ev) != 0 ||
        epoll_ctl(cl->poll_fd, EPOLL_CTL_ADD, cl->sock, &ev) != 0 ||
        epoll_ctl(cl->poll_fd, EPOLL_CTL_ADD, cl->wake_fd, &ev) != 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "the poll fd of a remote pool");
    return FERRY_OK;
}

static void gpu_capable(ferry__remote_client *cl)
{
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    cl->gpu_reads = cl->node.ucx->ucp_context_query(cl->node.context, &attr) == UCS_OK &&
                    (attr.memory_types & (1ull << UCS_MEMORY_TYPE_CUDA));
}

/* ---- connect and close ----------------------------------------------------------------------- */

static void client_free(ferry__remote_client *cl)
{
    if (cl->sock >= 0)
        close(cl->sock);
    if (cl->poll_fd >= 0)
        close(cl->poll_fd);
    if (cl->wake_fd >= 0)
        close(cl->wake_fd);
    if (cl->acker_timer >= 0) /* a forked child's copy (the owner closed its own) */
        close(cl->acker_timer);
    ferry__parts_clear(&cl->parts);
    for (uint32_t i = 0; cl->inl && i < cl->depth; i++)
        free(cl->inl[i].bytes);
    free(cl->inl);
    free(cl->inbox);
    free(cl->notes);
    free(cl->my_acks);
    free(cl->revoked);
    free(cl->to_release);
    pthread_mutex_destroy(&cl->lock);
    free(cl);
}

void ferry__remote_close(ferry__remote_client *cl)
{
    if (!cl)
        return;
    if (cl->owner != ferry__proc_self()) {
        ferry__remote_forget_client(cl);
        return;
    }
    acker_stop(cl);
    const ferry__ucx *u = cl->node.ucx;
    for (int i = 0; u && i < 2; i++)
        if (cl->rkey[i])
            u->ucp_rkey_destroy(cl->rkey[i]);
    if (u && cl->ep) {
        /* Flushed, so that acknowledgements sent last make it out; by force once the
         * producer is gone. An endpoint still flushing after a short while goes with the
         * worker. */
        ucp_request_param_t p = {.op_attr_mask = cl->gone ? UCP_OP_ATTR_FIELD_FLAGS : 0,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = u->ucp_ep_close_nbx(cl->ep, &p);
        uint64_t deadline = ferry__deadline(100000000ull);
        if (req && !FERRY_UCS_PTR_IS_ERR(req)) {
            while (u->ucp_request_check_status(req) == UCS_INPROGRESS && ferry__now_ns() < deadline)
                u->ucp_worker_progress(cl->node.worker);
            u->ucp_request_free(req);
        }
    }
    ferry__ucx_node_close(&cl->node);
    const ferry__cuda *cuda;
    if (cl->io && ferry__cuda_get(&cuda) == FERRY_OK &&
        ferry__cuda_use_device(cuda, cl->device) == FERRY_OK)
        cuda->cuStreamDestroy(cl->io);
    /* The connection ends now, though a child this process forked may hold a copy of it
     * (closing ends it only with the last one): the producer releases the rank at once. */
    if (cl->sock >= 0)
        shutdown(cl->sock, SHUT_RDWR);
    client_free(cl);
}

void ferry__remote_forget_client(ferry__remote_client *cl)
{
    if (!cl)
        return;
    client_free(cl); /* the child's copies of the fds and the heap; UCX is the parent's */
}

/* How long this rank's acknowledgements may wait: CLIENT_ACK_DELAY_NS, or
 * FERRY_REMOTE_ACK_DELAY_US (0 to 10000000, 10 s; 0 sends each at once). */
static uint64_t ack_delay(void)
{
    const char *knob = getenv("FERRY_REMOTE_ACK_DELAY_US");
    char *end;
    if (!knob || !*knob)
        return CLIENT_ACK_DELAY_NS;
    errno = 0;
    unsigned long long us = strtoull(knob, &end, 10);
    if (errno || *end || us > 10000000ull || knob[0] == '-') {
        ferry__log(FERRY_LOG_WARN,
                   "FERRY_REMOTE_ACK_DELAY_US=%.32s is not 0 to 10000000: %llu us is used", knob,
                   CLIENT_ACK_DELAY_NS / 1000ull);
        return CLIENT_ACK_DELAY_NS;
    }
    return us * 1000ull;
}

/* Dials, says hello and hears the answer; a producer too busy to listen (TIMEOUT: too many
 * connections waiting for their hello) is asked again until the deadline. */
static ferry_status bootstrap(ferry__remote_client *cl, const ferry__remote_address *a,
                              uint64_t deadline, uint8_t *buf, ferry__welcome *w)
{
    for (;;) {
        ferry_status st = dial(a, deadline, &cl->sock);
        if (st == FERRY_OK)
            st = say_hello(cl, a, deadline);
        if (st == FERRY_OK)
            st = hear_answer(cl, buf, deadline, w);
        if (st != FERRY_TIMEOUT || left_of(deadline) < 20000000ull ||
            !strstr(ferry_last_error(), "refused"))
            return st;
        close(cl->sock);
        cl->sock = -1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}

static ferry_status connect_steps(ferry__remote_client *cl, const ferry__remote_address *a,
                                  uint64_t deadline)
{
    uint8_t *buf = malloc(FERRY_REMOTE_MAX_MESSAGE);
    ferry__welcome w;
    ferry_status st = buf ? ferry__ucx_node_open(&cl->node, "ferry-consumer")
                          : ferry__fail(FERRY_NO_MEMORY, "out of memory connecting");
    if (st == FERRY_OK)
        st = set_handler(cl);
    if (st == FERRY_OK)
        st = bootstrap(cl, a, deadline, buf, &w);
    if (st == FERRY_OK)
        st = take_layout(cl, a, &w);
    if (st == FERRY_OK)
        st = make_ep(cl, &w);
    if (st == FERRY_OK)
        st = make_poll_fd(cl);
    if (st == FERRY_OK) {
        set_keepalive(cl->sock, w.timeout_ms);
        cl->silence_ns = (uint64_t)w.timeout_ms * 1000000ull;
        gpu_capable(cl);
        send_info(cl);
    }
    free(buf);
    return st;
}

ferry_status ferry__remote_connect(const char *address, uint32_t rank, int32_t device,
                                   uint64_t deadline, ferry__remote_client **out)
{
    ferry__remote_address a;
    ferry_status st = ferry__remote_parse(address, &a);
    if (st != FERRY_OK)
        return st;
    ferry__remote_client *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return ferry__fail(FERRY_NO_MEMORY,
                           "out of memory connecting to the remote pool at %.64s:%u", a.host,
                           (unsigned)a.port); /* the address itself carries the secret */
    pthread_mutex_init(&cl->lock, NULL);
    cl->sock = cl->poll_fd = cl->wake_fd = cl->acker_timer = -1;
    cl->owner = ferry__proc_self();
    cl->rank = rank;
    cl->device = device;
    cl->ack_delay_ns = ack_delay();
    ferry__remote_format(&a, cl->address, sizeof(cl->address));
    /* The secret stays out of messages: they name the pool by host, port and identity. */
    char *secret = strrchr(cl->address, '/');
    if (secret)
        *secret = '\0';
    st = connect_steps(cl, &a, deadline);
    if (st != FERRY_OK) {
        ferry__remote_close(cl);
        return st;
    }
    *out = cl;
    return FERRY_OK;
}

/* 1 if sa is a loopback address or one of this network namespace's interfaces (from ifs). */
static int address_here(const struct sockaddr *sa, const struct ifaddrs *ifs)
{
    if (sa->sa_family == AF_INET) {
        const struct in_addr *in = &((const struct sockaddr_in *)sa)->sin_addr;
        if ((ntohl(in->s_addr) >> 24) == 127)
            return 1;
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                memcmp(&((const struct sockaddr_in *)i->ifa_addr)->sin_addr, in, sizeof(*in)) == 0)
                return 1;
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *in6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(in6))
            return 1;
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
                memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, in6, sizeof(*in6)) ==
                    0)
                return 1;
    }
    return 0;
}

/* 1 if host names an address of this host as this network namespace sees it (loopback or one
 * of its interfaces): only such a pool may be on this host. 0 where that cannot be told. */
static int host_here(const char *host)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    struct ifaddrs *ifs = NULL;
    int here = 0;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    if (getifaddrs(&ifs) == 0) {
        for (const struct addrinfo *ai = res; ai && !here; ai = ai->ai_next)
            here = address_here(ai->ai_addr, ifs);
        freeifaddrs(ifs);
    }
    freeaddrinfo(res);
    return here;
}

ferry_status ferry__remote_describe(const char *address, uint64_t deadline, ferry_descriptor *pool)
{
    ferry__remote_address a;
    ferry__welcome w;
    ferry_status st = ferry__remote_parse(address, &a);
    if (st != FERRY_OK)
        return st;
    if (!host_here(a.host))
        return ferry__fail(FERRY_NOT_SUPPORTED, "remote pool at %s:%u is not on this host", a.host,
                           (unsigned)a.port);
    ferry__remote_client *cl = calloc(1, sizeof(*cl));
    uint8_t *buf = malloc(FERRY_REMOTE_MAX_MESSAGE);
    if (!cl || !buf) {
        free(cl);
        free(buf);
        return ferry__fail(FERRY_NO_MEMORY, "out of memory asking %.80s", address);
    }
    cl->sock = -1;
    cl->rank = FERRY__RANK_NONE;
    ferry__remote_format(&a, cl->address, sizeof(cl->address));
    char *secret = strrchr(cl->address, '/');
    if (secret)
        *secret = '\0';
    st = bootstrap(cl, &a, deadline, buf, &w);
    if (st == FERRY_OK &&
        (ferry_descriptor_decode(w.pool, FERRY_DESCRIPTOR_SIZE, pool) != FERRY_OK ||
         !(pool->flags & FERRY_DESC_FLAG_POOL_ONLY) || memcmp(pool->pool_id, a.pool_id, 16) != 0))
        st = ferry__fail(FERRY_MISMATCH, "remote pool %.80s described another pool", cl->address);
    if (cl->sock >= 0)
        close(cl->sock);
    free(buf);
    free(cl);
    return st;
}

int ferry__remote_owns(const ferry__remote_client *cl, const ferry_descriptor *d)
{
    return memcmp(d->pool_id, cl->pool.pool_id, 16) == 0;
}

/* ---- receiving ----------------------------------------------------------------------------- */

/* Tells the producer what was taken, so that it sends more. */
static void report_taken(ferry__remote_client *cl)
{
    if (cl->taken == cl->reported || cl->gone)
        return;
    ferry__am m = {.type = FERRY_AM_TAKEN, .u.taken.taken = cl->taken};
    if (send_am(cl, &m, NULL, 0) == FERRY_OK)
        cl->reported = m.u.taken.taken;
}

/* 1 if this process already acknowledged the lease for its rank. */
static int acked_here(const ferry__remote_client *cl, const ferry_descriptor *d)
{
    return cl->my_acks[d->slot] == d->generation;
}

/* One look at the inbox: FERRY_OK with a lease, TIMEOUT (empty), INVALID_ARGUMENT (too many
 * parts for max; it stays queued). */
static ferry_status take(ferry__remote_client *cl, ferry_descriptor *descs, size_t max,
                         size_t *count)
{
    while (cl->in_head != cl->in_tail) {
        const ferry_descriptor *d0 = &cl->inbox[cl->in_head % cl->depth];
        uint32_t k = d0->part_count ? d0->part_count : 1;
        if (acked_here(cl, d0)) { /* acknowledged already: no longer this rank's to read */
            cl->in_head += k;
            cl->taken += k;
            continue;
        }
        if (k > max) {
            *count = k;
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "the next lease has %u tensors; the output holds %zu", k, max);
        }
        for (uint32_t i = 0; i < k; i++)
            descs[i] = cl->inbox[(cl->in_head + i) % cl->depth];
        cl->in_head += k;
        cl->taken += k;
        if (cl->taken - cl->reported >= cl->depth / 2)
            report_taken(cl);
        *count = k;
        return FERRY_OK;
    }
    return FERRY_TIMEOUT;
}

/* Takes back the acknowledgement thread's ring of the consumer's fd: the caller looks at
 * what it took in next. */
static void drain_wake_fd(ferry__remote_client *cl)
{
    uint64_t rung;
    if (read(cl->wake_fd, &rung, sizeof(rung)) < 0) {
        /* not rung */
    }
}

/* Sleeps until the worker or the connection has news, ns at most; the lock is let go. */
static void sleep_on(ferry__remote_client *cl, uint64_t ns)
{
    struct epoll_event ev;
    pthread_mutex_unlock(&cl->lock);
    epoll_wait(cl->poll_fd, &ev, 1, (int)((ns + 999999ull) / 1000000ull));
    pthread_mutex_lock(&cl->lock);
    drain_wake_fd(cl);
}

/* Progresses the worker and arms it; 1 if it is armed (a sleep on its fd will wake). */
static int progress_and_arm(ferry__remote_client *cl)
{
    const ferry__ucx *u = cl->node.ucx;
    drain_wake_fd(cl);
    while (u->ucp_worker_progress(cl->node.worker)) {
    }
    return u->ucp_worker_arm(cl->node.worker) == UCS_OK;
}

ferry_status ferry__remote_recv(ferry__remote_client *cl, uint64_t timeout_ns,
                                ferry_descriptor *descs, size_t max, size_t *count)
{
    uint64_t start = ferry__now_ns(), deadline = ferry__deadline(timeout_ns);
    ferry_status st;
    pthread_mutex_lock(&cl->lock);
    for (;;) {
        if (producer_gone(cl)) {
            st = gone_error(cl);
            break;
        }
        while (cl->node.ucx->ucp_worker_progress(cl->node.worker)) {
        }
        st = take(cl, descs, max, count);
        if (st != FERRY_TIMEOUT)
            break;
        /* Nothing queued: the producer may be waiting for room, and for held leases it
         * asked back. */
        offer_acks(cl);
        report_taken(cl);
        release_all(cl);
        uint64_t now = ferry__now_ns();
        if (now - start < CLIENT_SPIN_NS && now < deadline) {
            pthread_mutex_unlock(&cl->lock);
            sched_yield();
            pthread_mutex_lock(&cl->lock);
            continue;
        }
        /* Armed last: whatever arrives from here wakes the poll fd (and a caller's poll on
         * it after a TIMEOUT). */
        if (!progress_and_arm(cl) || cl->in_head != cl->in_tail)
            continue;
        if (now >= deadline) {
            st = ferry__fail(FERRY_TIMEOUT, "no lease came for rank %u within %.3f ms", cl->rank,
                             (double)timeout_ns / 1e6);
            break;
        }
        uint64_t left = deadline - now;
        acker_put_off(cl);
        sleep_on(cl, left < CLIENT_SLICE_NS ? left : CLIENT_SLICE_NS);
    }
    release_all(cl);
    pthread_mutex_unlock(&cl->lock);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

ferry_status ferry__remote_fd(ferry__remote_client *cl, int *fd)
{
    pthread_mutex_lock(&cl->lock);
    offer_acks(cl); /* the caller is about to sleep on the fd */
    int failed;
    do /* REVOKEs taken in here are answered here: the fd does not wake for them again */
        failed = release_all(cl);
    while (!progress_and_arm(cl) || (cl->releases && !failed));
    if (cl->in_head != cl->in_tail) /* a lease is there already (taken in before) */
        ring_poll_fd(cl);
    acker_put_off(cl);
    pthread_mutex_unlock(&cl->lock);
    *fd = cl->poll_fd;
    ferry__clear_error();
    return FERRY_OK;
}

/* ---- reading ------------------------------------------------------------------------------- */

static ferry_status check_desc(ferry__remote_client *cl, const ferry_descriptor *d)
{
    if (d->backend != cl->pool.backend || d->consumer_count != cl->consumers ||
        d->max_inflight != cl->max_inflight || d->pool_size != cl->pool.pool_size)
        return ferry__fail(FERRY_MISMATCH, "descriptor disagrees with the remote pool %.80s",
                           cl->address);
    if (d->flags & FERRY_DESC_FLAG_POOL_ONLY)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "a pool-only descriptor names no lease: it can only open the pool");
    if (d->slot >= cl->max_inflight || d->generation == 0 || d->generation > FERRY_GENERATION_MAX)
        return ferry__fail(FERRY_MISMATCH, "descriptor slot %u / generation %u out of range",
                           d->slot, d->generation);
    if (d->offset > cl->data_size || d->length > cl->data_size - d->offset)
        return ferry__fail(FERRY_MISMATCH,
                           "descriptor range [%llu, +%llu) exceeds the pool's %llu data bytes",
                           (unsigned long long)d->offset, (unsigned long long)d->length,
                           (unsigned long long)cl->data_size);
    return FERRY_OK;
}

static ferry_status stale(const ferry_descriptor *d, uint32_t now, uint32_t rank)
{
    if (now == (d->generation | FERRY_GEN_CANCELLED))
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: lease (slot=%u, generation=%u) was cancelled by "
                           "the producer",
                           d->slot, d->generation);
    if (now != d->generation)
        return ferry__fail(FERRY_STALE,
                           "stale descriptor: slot %u now holds generation %u, descriptor has %u",
                           d->slot, now, d->generation);
    return ferry__fail(FERRY_STALE,
                       "stale descriptor: lease (slot=%u, generation=%u) was already "
                       "acknowledged for rank %u",
                       d->slot, d->generation, rank);
}

static ferry_status not_ready(const ferry_descriptor *d, uint64_t timeout_ns)
{
    return ferry__fail(FERRY_TIMEOUT, "lease (slot=%u, generation=%u) not ready after %.3f ms",
                       d->slot, d->generation, (double)timeout_ns / 1e6);
}

/* Asks the producer for a served read's piece, in place i under a new id (0 marks none). */
static ferry_status ask(ferry__remote_client *cl, served_read *r, int i, uint64_t piece)
{
    uint32_t id = ++cl->read_ids ? cl->read_ids : ++cl->read_ids;
    r->at[i].id = id;
    r->at[i].piece = piece;
    r->at[i].again = 0;
    uint8_t offset[8];
    ferry__put_le64(offset, r->d->offset + (r->dst ? piece * FERRY_REMOTE_READ_PIECE : 0));
    ferry__am m = {.type = FERRY_AM_READ,
                   .u.read = {r->d->slot, r->d->generation, id, (uint32_t)piece_length(r, piece)}};
    return send_am(cl, &m, offset, sizeof(offset));
}

/* Runs a served read: asks for its pieces, CLIENT_READ_WINDOW at once (again after a BUSY
 * answer), and progresses until every piece is in or an answer ended it (r->fail; the
 * status served_status makes of it). Bounded as wait_requests is, by the producer's
 * liveness: its connection ending, or no answer for the keepalive bound while requests are
 * on their way. Answers that come after it returned find no read waiting and are dropped.
 * Called with the lock held. */
static ferry_status serve(ferry__remote_client *cl, served_read *r, uint64_t spin_ns)
{
    const ferry__ucx *u = cl->node.ucx;
    ferry_status st = FERRY_OK;
    uint64_t start = ferry__now_ns(), check = start + CLIENT_SLICE_NS;
    r->heard = start;
    cl->rd = r;
    while (st == FERRY_OK && !r->fail && r->done < r->pieces) {
        uint64_t now = ferry__now_ns();
        for (int i = 0; i < CLIENT_READ_WINDOW && st == FERRY_OK && !r->fail; i++) {
            if (r->at[i].id)
                continue;
            if (r->at[i].again && now >= r->at[i].again)
                st = ask(cl, r, i, r->at[i].piece);
            else if (!r->at[i].again && r->asked < r->pieces)
                st = ask(cl, r, i, r->asked++);
        }
        if (st != FERRY_OK || r->fail || r->done == r->pieces)
            break;
        int busy = u->ucp_worker_progress(cl->node.worker) != 0;
        now = ferry__now_ns();
        if (producer_silent(cl, now, r->heard, &check, "answer to a read")) {
            st = gone_error(cl);
            break;
        }
        wait_idle(cl, busy, now, start, spin_ns);
    }
    /* Ended early (an answer's status, a lie, a failed copy): the answers still on their way
     * are taken in (and dropped) before it returns, for a while. A process that leaves at
     * once with several of them unsent made Debian's UCX 1.13 fail an assertion in the
     * producer (docs/design.md, "What UCX does on its own"). */
    uint64_t until = ferry__now_ns() + CLIENT_DRAIN_NS;
    while (st == FERRY_OK && r->fail && cl->ep && !producer_gone(cl) && ferry__now_ns() < until) {
        int waiting = 0;
        for (int i = 0; i < CLIENT_READ_WINDOW; i++)
            waiting |= r->at[i].id != 0;
        if (!waiting)
            break;
        if (!u->ucp_worker_progress(cl->node.worker))
            sched_yield();
    }
    cl->rd = NULL;
    return st;
}

/* What a served read's answers told (r->fail), as the read's status: OK only once every
 * piece came with its bytes. */
static ferry_status served_status(ferry__remote_client *cl, const served_read *r)
{
    ferry_status st;
    switch (r->fail) {
    case 0:
        if (r->done == r->pieces)
            return FERRY_OK;
        break;
    case FERRY_AM_DATA_STALE:
        return stale(r->d, (uint32_t)r->value, cl->rank);
    case FERRY_AM_DATA_OUTSIDE: /* an extent that holds the range is a lie */
        st = ferry__desc_inside_lease(r->d, r->extent[0], r->extent[1]);
        if (st != FERRY_OK)
            return st;
        break;
    case SERVED_COPY: {
        const ferry__cuda *cuda;
        (void)ferry__cuda_get(&cuda);
        st = ferry__cuda_fail(cuda, r->copy_call, r->copy_failed);
        return ferry__fail_wrap(st,
                                "remote pool %.80s: a read of lease (slot=%u, generation=%u) "
                                "into GPU memory",
                                cl->address, r->d->slot, r->d->generation);
    }
    case FERRY_AM_DATA_FAILED:
        return ferry__fail(FERRY_DRIVER,
                           "remote pool %.80s could not copy lease (slot=%u, generation=%u) out "
                           "of its GPU memory for this read (the producer's log says why)",
                           cl->address, r->d->slot, r->d->generation);
    case FERRY_AM_DATA_BUSY:
        return ferry__fail(FERRY_TIMEOUT,
                           "remote pool %.80s: the producer had no room for the answers to a read "
                           "of lease (slot=%u, generation=%u) within %.3f ms (its other consumers "
                           "hold it; the read may be tried again)",
                           cl->address, r->d->slot, r->d->generation, (double)r->timeout_ns / 1e6);
    default:
        break;
    }
    return ferry__fail(FERRY_MISMATCH,
                       "remote pool %.80s answered a read of lease (slot=%u, generation=%u) with "
                       "what ferry cannot use: its producer broke the protocol",
                       cl->address, r->d->slot, r->d->generation);
}

static uint64_t ack_word_addr(const ferry__remote_client *cl, uint32_t slot)
{
    return cl->control_addr + 4ull * ((uint64_t)slot * cl->row_words + 1 + cl->rank);
}

/* One look at the lease with gets: its slot's generation, ready word and extent; the note
 * is set once it is ready. */
static ferry_status look_with_gets(ferry__remote_client *cl, const ferry_descriptor *d)
{
    uint32_t gen = 0, ready = 0;
    uint64_t extent[2] = {0, 0};
    void *reqs[3] = {
        get(cl, &gen, 4, cl->gen_addr + 4ull * d->slot, 0, 0),
        get(cl, &ready, 4, cl->control_addr + 4ull * d->slot * cl->row_words, cl->control_rkey, 0),
        get(cl, extent, 16, cl->extent_addr + 16ull * d->slot, 0, 0),
    };
    ferry_status st = wait_requests(cl, reqs, 3, "ucp_get_nbx", CLIENT_SPIN_NS);
    if (st != FERRY_OK)
        return st;
    if (gen != d->generation)
        return stale(d, gen, cl->rank);
    if (ready == d->generation)
        note_set(cl, d, extent[0], extent[1], 0);
    return FERRY_OK;
}

/* Looks at the lease remotely until it is ready: its generation, ready word and extent, by
 * gets or, where reads are served, by a request of no bytes (answered by the producer's
 * thread: the lease's extent, NOT_READY, or STALE). Sleeps between looks without the lock. */
static ferry_status wait_ready(ferry__remote_client *cl, const ferry_descriptor *d,
                               uint64_t timeout_ns, uint64_t deadline)
{
    lease_note *n = &cl->notes[d->slot];
    while (!(n->generation == d->generation && n->ready)) {
        if (cl->served) { /* a look: a request of no bytes, answered with the extent */
            served_read r = {.d = d, .pieces = 1, .deadline = deadline, .timeout_ns = timeout_ns};
            ferry_status st = serve(cl, &r, CLIENT_SPIN_NS);
            if (st == FERRY_OK && r.fail != FERRY_AM_DATA_NOT_READY) {
                st = served_status(cl, &r);
                if (st == FERRY_OK)
                    note_set(cl, d, r.extent[0], r.extent[1], 0);
            }
            if (st != FERRY_OK)
                return st;
        } else {
            ferry_status st = look_with_gets(cl, d);
            if (st != FERRY_OK)
                return st;
        }
        if (n->generation == d->generation && n->ready)
            break;
        if (ferry__now_ns() >= deadline)
            return not_ready(d, timeout_ns);
        offer_acks(cl); /* the producer may be waiting for room */
        sleep_on(cl, CLIENT_READY_POLL_NS);
        if (producer_gone(cl))
            return gone_error(cl);
    }
    return ferry__desc_inside_lease(d, n->offset, n->length);
}

/* Checks, before anything is read, that the call may go ahead. */
static ferry_status precheck(ferry__remote_client *cl, const ferry_descriptor *d)
{
    ferry_status st = check_desc(cl, d);
    if (st != FERRY_OK)
        return st;
    if (producer_gone_lately(cl))
        return gone_error(cl);
    if (acked_here(cl, d))
        return stale(d, d->generation, cl->rank);
    return FERRY_OK;
}

ferry_status ferry__remote_wait(ferry__remote_client *cl, const ferry_descriptor *d,
                                uint64_t timeout_ns)
{
    pthread_mutex_lock(&cl->lock);
    ferry_status st = precheck(cl, d);
    if (st == FERRY_OK)
        st = wait_ready(cl, d, timeout_ns, ferry__deadline(timeout_ns));
    release_all(cl);
    pthread_mutex_unlock(&cl->lock);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* 1 if dst is memory of a GPU (only a consumer made for a GPU can hand one). */
static int gpu_memory(const ferry__remote_client *cl, const void *dst)
{
    const ferry__cuda *cuda;
    unsigned type = 0;
    if (cl->device < 0 || ferry__cuda_get(&cuda) != FERRY_OK)
        return 0;
    return cuda->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       (CUdeviceptr)(uintptr_t)dst) == CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
}

/* Makes served reads into GPU memory possible on this thread: the consumer's device context
 * current, and the client's copy stream made (once). */
static ferry_status gpu_copies(ferry__remote_client *cl)
{
    const ferry__cuda *cuda;
    ferry_status st = ferry__cuda_get(&cuda);
    if (st == FERRY_OK)
        st = ferry__cuda_use_device(cuda, cl->device);
    if (st == FERRY_OK && !cl->io)
        st = ferry__cuda_io_stream(cuda, &cl->io);
    return st;
}

/* Takes in what the worker holds (a REVOKE among it), 64 rounds of progress at most (UCX
 * 1.22's progress may report work of its own for ever). */
static void drain(ferry__remote_client *cl)
{
    const ferry__ucx *u = cl->node.ucx;
    for (int i = 0; i < 64; i++) {
        uint64_t t = ferry__now_ns();
        if (!u->ucp_worker_progress(cl->node.worker)) {
            cl->quiet_at = t; /* what had come by t is taken in */
            return;
        }
    }
}

/* After a held lease's gets ended: 1 if they read the lease's own bytes. The producer frees
 * a held slice only after this rank let it go (never during a call that reads it), or after
 * the keepalive bound from when it sent its REVOKE, or from when the connection ended (at
 * once only where this side closed it). The worker was drained at since, before the gets,
 * and the lease was held when they began: a REVOKE sent before since by half the bound would
 * have been taken in. So the gets are the lease's if the lease is held still once what came
 * after since is taken in, the connection is open, and less than half the bound passed from
 * since: else the check. */
static int held_still(ferry__remote_client *cl, const ferry_descriptor *d, uint64_t since)
{
    drain(cl);
    return held(cl, d) && !producer_gone(cl) && ferry__now_ns() - since < cl->silence_ns / 2;
}

static ferry_status read_checked(ferry__remote_client *cl, const ferry_descriptor *d, void *dst,
                                 uint64_t timeout_ns)
{
    uint64_t deadline = ferry__deadline(timeout_ns);
    ferry_status st = wait_ready(cl, d, timeout_ns, deadline);
    if (st != FERRY_OK || !d->length)
        return st;
    int gpu = gpu_memory(cl, dst);
    const uint8_t *inl = gpu ? NULL : inline_bytes(cl, d);
    if (inl) {
        /* Copied by the producer while the lease was this rank's and unacknowledged, and
         * checked there after the copy: no get, no check to make here. */
        memcpy(dst, inl, d->length);
        return FERRY_OK;
    }
    if (cl->served) { /* checked by the producer after each piece's copy */
        if (gpu && (st = gpu_copies(cl)) != FERRY_OK)
            return st;
        served_read r = {.d = d,
                         .dst = dst,
                         .gpu = gpu,
                         .pieces =
                             (d->length + FERRY_REMOTE_READ_PIECE - 1) / FERRY_REMOTE_READ_PIECE,
                         .deadline = deadline,
                         .timeout_ns = timeout_ns};
        st = serve(cl, &r, CLIENT_SPIN_NS + d->length / CLIENT_SPIN_BYTES_PER_NS);
        return st == FERRY_OK ? served_status(cl, &r) : st;
    }
    if (gpu && !cl->gpu_reads)
        return ferry__fail(FERRY_NOT_SUPPORTED,
                           "remote pool %.80s: the destination is GPU memory and this process's "
                           "UCX has no CUDA support (install a CUDA-enabled UCX, e.g. pip's "
                           "libucx-cu13, or read into host memory)",
                           cl->address);
    uint32_t gen = 0, ack = 0;
    uint64_t since = 0;
    int was_held = held(cl, d);
    if (was_held) { /* what came before the gets is taken in first */
        since = ferry__now_ns();
        if (since - cl->quiet_at < CLIENT_LOOK_NS) {
            since = cl->quiet_at; /* the last drain (held_still's of the read before) stands */
        } else {
            drain(cl);
            since = cl->quiet_at;
            was_held = held(cl, d);
        }
    }
    uint64_t pieces = (d->length + CLIENT_GET_PIECE - 1) / CLIENT_GET_PIECE;
    void *few[8], **reqs = pieces <= 8 ? few : malloc(pieces * sizeof(*reqs));
    if (!reqs)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for a remote read's requests");
    for (uint64_t i = 0; i < pieces; i++) {
        uint64_t at = i * CLIENT_GET_PIECE, n = d->length - at;
        reqs[i] = get(cl, (uint8_t *)dst + at, n < CLIENT_GET_PIECE ? n : CLIENT_GET_PIECE,
                      cl->data_addr + d->offset + at, cl->data_rkey, gpu);
    }
    /* The checks are read once the slice is in (issued after its gets ended: a fence would
     * order them too, but UCX 1.22's fence waits for the slice inside UCX, where nothing
     * bounds the wait when the producer is stopped). */
    st = wait_requests(cl, reqs, (int)pieces, "ucp_get_nbx",
                       CLIENT_SPIN_NS + d->length / CLIENT_SPIN_BYTES_PER_NS);
    if (reqs != few)
        free(reqs);
    if (st != FERRY_OK)
        return st;
    if (was_held && held_still(cl, d, since))
        return FERRY_OK; /* the slice was this lease's all along */
    void *checks[2] = {get(cl, &gen, 4, cl->gen_addr + 4ull * d->slot, 0, 0),
                       get(cl, &ack, 4, ack_word_addr(cl, d->slot), cl->control_rkey, 0)};
    st = wait_requests(cl, checks, 2, "ucp_get_nbx", CLIENT_SPIN_NS);
    if (st == FERRY_OK && (gen != d->generation || ack == d->generation))
        st = stale(d, gen, cl->rank);
    return st;
}

ferry_status ferry__remote_read(ferry__remote_client *cl, const ferry_descriptor *d, void *dst,
                                size_t dst_size, uint64_t timeout_ns)
{
    if (d->length && !dst)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "destination is NULL");
    if (dst_size < d->length)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "destination holds %zu bytes, tensor has %llu",
                           dst_size, (unsigned long long)d->length);
    pthread_mutex_lock(&cl->lock);
    ferry_status st = precheck(cl, d);
    if (st == FERRY_OK)
        st = read_checked(cl, d, dst, timeout_ns);
    release_all(cl);
    pthread_mutex_unlock(&cl->lock);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* ---- acknowledging ------------------------------------------------------------------------- */

/* Whether a set's lease is over: older than one this rank received in its slot
 * (ferry__parts_drop). Not one this process has no note of yet: a leader acknowledges for
 * other ranks leases its own may get later, or never. */
static int lease_over(void *arg, uint32_t slot, uint32_t generation)
{
    const ferry__remote_client *cl = arg;
    return generation < cl->notes[slot].generation;
}

static ferry_status acked_stale(ferry__remote_client *cl, const ferry_descriptor *d)
{
    return stale(d, d->generation, cl->rank);
}

/* The acknowledgement of ranks [first, first + count) to the producer, recorded for this
 * rank; this rank's alone waits to go out with others (queue_ack). */
static ferry_status send_ack(ferry__remote_client *cl, const ferry_descriptor *d, uint32_t first,
                             uint32_t count)
{
    ferry__am m = {.type = FERRY_AM_ACK, .u.ack = {d->slot, d->generation, first, count}};
    ferry_status st = cl->ack_delay_ns && first == cl->rank && count == 1
                          ? queue_ack(cl, d->slot, d->generation)
                          : send_am(cl, &m, NULL, 0);
    if (st == FERRY_OK && cl->rank >= first && cl->rank - first < count) {
        cl->my_acks[d->slot] = d->generation;
        inline_forget(cl, d->slot, d->generation); /* no longer this rank's to read */
    }
    return st;
}

/* Tests only: called after a partial mark was sent; nonzero makes the client give the
 * endpoint up there, as it does when the producer falls silent during a send. */
int (*ferry__remote_test_after_mark)(void);

/* Tells the producer about ranks [from, from + n) and d's packed lease: acknowledged (their
 * last part), or partly acknowledged (their first part of several: it marks their words, as
 * a local consumer's part does, for consumer_info and the pool-full message). The mark only
 * informs: it is not sent where the control words are on the device (they are not marked
 * there), and a failure to send it fails the call only if the producer is gone. */
static ferry_status send_run(ferry__remote_client *cl, const ferry_descriptor *d, int partial,
                             uint32_t from, uint32_t n)
{
    if (!partial)
        return send_ack(cl, d, from, n);
    if (!cl->marks_partial)
        return FERRY_OK;
    ferry__am m = {.type = FERRY_AM_ACK,
                   .flags = FERRY_AM_ACK_PARTIAL,
                   .u.ack = {d->slot, d->generation, from, n}};
    send_am(cl, &m, NULL, 0);
    int (*hook)(void) = __atomic_load_n(&ferry__remote_test_after_mark, __ATOMIC_ACQUIRE);
    if (hook && hook())
        abandon(cl);
    return cl->gone ? gone_error(cl) : FERRY_OK;
}

/* One part of a packed lease for each rank of the range, as a local consumer counts them: a
 * rank's acknowledgement goes out with its last part, its partial mark with its first; one
 * message for each run of ranks alike. MISMATCH (nothing recorded) if d does not fit its
 * lease. STALE if the part was acknowledged already for every rank of the range, or (strict)
 * for any. A failed send means the producer is gone: what was recorded no longer counts. */
static ferry_status ack_parts(ferry__remote_client *cl, const ferry_descriptor *d, uint32_t first,
                              uint32_t count, int strict)
{
    ferry__parts_drop(&cl->parts, lease_over, cl);
    ferry_status st = ferry__parts_fit(cl->parts, d);
    uint32_t taken = 0, from = 0, n = 0;
    int run = 0; /* the kind of the run of ranks [from, from + n): FERRY__PART_LAST or _FIRST */
    for (uint32_t r = first; r < first + count && st == FERRY_OK; r++) {
        int found = ferry__parts_record(&cl->parts, d, r);
        if (found == FERRY__PART_NO_MEMORY)
            found =
                FERRY__PART_LAST; /* no memory to count parts: the whole lease is acknowledged */
        taken += found != FERRY__PART_AGAIN;
        int kind = found == FERRY__PART_LAST || found == FERRY__PART_FIRST ? found : 0;
        if (n && kind != run) { /* rank r does not extend the run: it goes out */
            st = send_run(cl, d, run == FERRY__PART_FIRST, from, n);
            n = 0;
        }
        if (kind && n++ == 0) {
            from = r;
            run = kind;
        }
    }
    if (st == FERRY_OK && n)
        st = send_run(cl, d, run == FERRY__PART_FIRST, from, n);
    if (st == FERRY_OK && (!taken || (strict && taken < count)))
        st = acked_stale(cl, d);
    return st;
}

ferry_status ferry__remote_ack(ferry__remote_client *cl, const ferry_descriptor *d, uint32_t first,
                               uint32_t count, int strict)
{
    ferry_status st;
    pthread_mutex_lock(&cl->lock);
    if ((st = check_desc(cl, d)) != FERRY_OK)
        goto done;
    if (count == 0 || first >= cl->consumers || count > cl->consumers - first) {
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "rank range [%u, %u) is outside [0, %u)", first,
                         first + count, cl->consumers);
        goto done;
    }
    if (d->part_count && (d->part_index >= d->part_count || d->part_count > cl->depth * 256u)) {
        st = ferry__fail(FERRY_MISMATCH, "descriptor part %u of %u is out of range", d->part_index,
                         d->part_count);
        goto done;
    }
    if (producer_gone_lately(cl)) {
        st = gone_error(cl);
        goto done;
    }
    if ((st = room_for_ack(cl)) != FERRY_OK) /* before a packed part is counted */
        goto done;
    int mine = cl->rank >= first && cl->rank - first < count;
    if (mine && count == 1 && acked_here(cl, d)) {
        st = acked_stale(cl, d);
        goto done;
    }
    if (d->part_count) {
        st = ack_parts(cl, d, first, count, strict);
        goto done;
    }
    st = send_ack(cl, d, first, count);
done:
    release_all(cl);
    pthread_mutex_unlock(&cl->lock);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}
