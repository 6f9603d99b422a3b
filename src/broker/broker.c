/* The pool broker (broker.h): a producer thread handing the pool's fd to consumers.
 *
 * Wire messages (little-endian, fixed size; docs/wire-format.md, "Broker messages"):
 *
 *   request, 32 bytes, consumer -> broker
 *     0  u32  magic     "FRYB"
 *     4  u16  version   3
 *     6  u16  type      1 (OPEN), 2 (DESCRIBE), 3 (NOTIFY) or 4 (CLAIM)
 *     8  u8[16] pool_id  zero for DESCRIBE (the peer knows only the broker's name)
 *     24 u32  rank      NOTIFY, CLAIM: < consumer_count; OPEN, DESCRIBE: 0xFFFFFFFF
 *                       (FERRY__RANK_NONE)
 *     28 u32  reserved  0
 *   NOTIFY carries one eventfd in SCM_RIGHTS (the rank's poll fd), the others none.
 *
 *   reply, 24 bytes, broker -> consumer (OPEN: one fd in SCM_RIGHTS iff status is OK)
 *     0  u32  magic     "FRYR"
 *     4  u16  version   3
 *     6  u16  status    ferry_status (0 = OK)
 *     8  u64  size      OPEN: shared_size; otherwise 0 (0 in a refusal)
 *     16 u64  detail    RANK_IN_USE: the holder's pid (1..INT32_MAX); otherwise 0
 *   followed, for a DESCRIBE whose status is OK, by the pool's encoded pool-only descriptor
 *   (FERRY_DESCRIPTOR_SIZE bytes).
 *
 * Version 1 had no RANK_NONE and a reserved zero where version 2 has detail; version 2's
 * OPEN claimed the rank it named, before the peer had the fd (a peer out of descriptors kept
 * a claim it could not use); version 3 claims with CLAIM, which a consumer sends once it has
 * opened the pool. No side accepts another version.
 *
 * The thread is one poll() loop over the stop eventfd, the listening socket and a table of
 * up to BROKER_MAX_PENDING accepted connections waiting for their request, each with its
 * own deadline: a connection is served the moment its request arrives, a silent one is
 * refused at its own deadline, and none waits behind another.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "wire/wire.h"

#define BROKER_REQUEST_MAGIC 0x42595246u /* bytes "FRYB" read as a little-endian u32 */
#define BROKER_REPLY_MAGIC   0x52595246u /* bytes "FRYR" read as a little-endian u32 */
#define BROKER_VERSION       3u
#define BROKER_TYPE_OPEN     1u
#define BROKER_TYPE_DESCRIBE 2u
#define BROKER_TYPE_NOTIFY   3u
#define BROKER_TYPE_CLAIM    4u
#define BROKER_TYPE_RELEASE  5u
#define BROKER_REQUEST_SIZE  32
#define BROKER_REPLY_SIZE    24
#define BROKER_DESCRIBE_SIZE (BROKER_REPLY_SIZE + FERRY_DESCRIPTOR_SIZE)
#define BROKER_ID_SIZE       16
#define BROKER_NAME_PREFIX   "ferry."
#define BROKER_HEX_SIZE      (2 * BROKER_ID_SIZE + 1)

#define BROKER_REQUEST_WAIT_MS 1000 /* how long a connected peer may stay silent */
#define BROKER_MAX_PENDING     64   /* accepted connections waiting for their request */
#define BROKER_POLL_FIRST_CONN 2    /* poll slots: stop eventfd, listener, then connections */
#define BROKER_BACKOFF_MS      10   /* pause after a transient accept failure */
#define BROKER_RETRY_MS        1    /* client: pause before retrying a full backlog */
#define BROKER_PATIENT_LEFT_MS 2    /* client: the least time left to ask a full table again */
#define BROKER_BIND_ATTEMPTS   8    /* fresh random names tried on EADDRINUSE */
#define BROKER_MAX_FDS         8    /* SCM_RIGHTS room when receiving (excess: MSG_CTRUNC) */
#define BROKER_ERROR_MAX       256

/* States of the latched error: written once by the broker thread, read by any thread. */
enum { LATCH_HEALTHY = 0, LATCH_WRITING = 1, LATCH_SET = 2 };

typedef struct broker_request {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint8_t pool_id[BROKER_ID_SIZE];
    uint32_t rank;
    uint32_t reserved;
} broker_request;

typedef struct broker_reply {
    uint32_t magic;
    uint16_t version;
    uint16_t status;
    uint64_t size;
    uint64_t detail;
} broker_reply;

/* An accepted connection waiting for its request. fd is -1 in a free slot; it is written
 * with release order (and a slot freed before its fd is closed) so that the table a forked
 * child inherits never names a descriptor already closed (ferry__broker_forget). A
 * connection accepted at the very moment of a fork may not be in the child's table yet:
 * the child then keeps that one copy (close-on-exec). */
typedef struct broker_conn {
    int fd;
    pid_t pid;         /* the peer's, from SO_PEERCRED at accept */
    uint64_t deadline; /* refused with FERRY_TIMEOUT if no request arrived by then */
} broker_conn;

struct ferry__broker {
    uint8_t pool_id[BROKER_ID_SIZE];
    uint8_t name[BROKER_ID_SIZE];
    int shared_fd;
    uint64_t shared_size;
    uint32_t consumer_count;
    ferry__broker_attach_fn on_attach;
    ferry__broker_describe_fn on_describe;
    ferry__broker_notify_fn on_notify;
    ferry__broker_release_fn on_release;
    void *user;
    int listen_fd; /* atomic: -1 once the thread closed it after a latched error */
    int stop_fd;   /* eventfd: readable once ferry__broker_stop was called */
    pid_t owner;   /* the process that started the thread */
    pthread_t thread;
    broker_conn pending[BROKER_MAX_PENDING]; /* the thread's (and a forked child's) only */
    unsigned pending_count;
    uint64_t refused;   /* atomic */
    uint64_t transient; /* atomic: accept failures backed off from */
    int latch;          /* atomic: LATCH_* */
    ferry_status error_status;
    char error_msg[BROKER_ERROR_MAX];
    char label[]; /* copy of config->label */
};

/* A control buffer with room for BROKER_MAX_FDS descriptors, aligned for cmsghdr. */
typedef union broker_control {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * BROKER_MAX_FDS)];
} broker_control;

/* One client call: what the steps of a request share. */
typedef struct broker_call {
    int sock;
    const char *label;
    uint16_t type;
    uint32_t rank;
    uint64_t deadline;
    uint64_t timeout_ns;
    int send_fd;      /* NOTIFY: the fd to hand over */
    uint8_t *payload; /* DESCRIBE: FERRY_DESCRIPTOR_SIZE bytes out */
    int patient;      /* a broker refusing because its table is full is asked again */
    char hex[BROKER_HEX_SIZE];
} broker_call;

/* A control buffer with room for one descriptor, aligned for cmsghdr. */
typedef union one_fd_control {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
} one_fd_control;

/* Makes msg carry fd in SCM_RIGHTS (control is msg's buffer from then on). */
static void attach_fd(struct msghdr *msg, one_fd_control *control, int fd)
{
    memset(control, 0, sizeof(*control));
    msg->msg_control = control->buf;
    msg->msg_controllen = sizeof(control->buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
}

/* ------------------------------------------------------------------------------------
 * Byte helpers and message codecs
 * ---------------------------------------------------------------------------------- */

/* The wire format's byte-order helpers (src/wire/wire.h). */
#define put_le16 ferry__put_le16
#define put_le32 ferry__put_le32
#define put_le64 ferry__put_le64
#define get_le16 ferry__get_le16
#define get_le32 ferry__get_le32
#define get_le64 ferry__get_le64

static void encode_request(const broker_request *req, uint8_t out[BROKER_REQUEST_SIZE])
{
    put_le32(out, req->magic);
    put_le16(out + 4, req->version);
    put_le16(out + 6, req->type);
    memcpy(out + 8, req->pool_id, BROKER_ID_SIZE);
    put_le32(out + 24, req->rank);
    put_le32(out + 28, req->reserved);
}

static void decode_request(const uint8_t in[BROKER_REQUEST_SIZE], broker_request *req)
{
    req->magic = get_le32(in);
    req->version = get_le16(in + 4);
    req->type = get_le16(in + 6);
    memcpy(req->pool_id, in + 8, BROKER_ID_SIZE);
    req->rank = get_le32(in + 24);
    req->reserved = get_le32(in + 28);
}

static void encode_reply(const broker_reply *rep, uint8_t out[BROKER_REPLY_SIZE])
{
    put_le32(out, rep->magic);
    put_le16(out + 4, rep->version);
    put_le16(out + 6, rep->status);
    put_le64(out + 8, rep->size);
    put_le64(out + 16, rep->detail);
}

static void decode_reply(const uint8_t in[BROKER_REPLY_SIZE], broker_reply *rep)
{
    rep->magic = get_le32(in);
    rep->version = get_le16(in + 4);
    rep->status = get_le16(in + 6);
    rep->size = get_le64(in + 8);
    rep->detail = get_le64(in + 16);
}

/* ------------------------------------------------------------------------------------
 * Shared helpers
 * ---------------------------------------------------------------------------------- */

static void format_hex(const uint8_t id[BROKER_ID_SIZE], char out[BROKER_HEX_SIZE])
{
    ferry__hex_put(id, BROKER_ID_SIZE, out);
}

unsigned ferry__broker_address(const uint8_t name[16], void *addr)
{
    struct sockaddr_un *sa = addr;
    char hex[BROKER_HEX_SIZE];

    format_hex(name, hex);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    /* Abstract namespace: sun_path[0] is 0 and the name is not NUL-terminated. */
    memcpy(sa->sun_path + 1, BROKER_NAME_PREFIX, strlen(BROKER_NAME_PREFIX));
    memcpy(sa->sun_path + 1 + strlen(BROKER_NAME_PREFIX), hex, 2 * BROKER_ID_SIZE);
    return (unsigned)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(BROKER_NAME_PREFIX) +
                      2 * BROKER_ID_SIZE);
}

/* Milliseconds for poll() until deadline: rounded up, -1 for "forever", 0 once passed. */
static int remaining_ms(uint64_t deadline)
{
    if (deadline == UINT64_MAX)
        return -1;
    uint64_t now = ferry__now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static uint64_t ns_to_ms_ceil(uint64_t ns)
{
    return ns / 1000000u + (ns % 1000000u != 0);
}

static void close_fds(const int *fds, size_t count)
{
    for (size_t i = 0; i < count; i++)
        close(fds[i]);
}

/* Collects the descriptors of every SCM_RIGHTS message of msg into fds (at most
 * BROKER_MAX_FDS: the control buffer holds no more). Returns whether msg carried any other
 * kind of control message. */
static bool collect_fds(struct msghdr *msg, int fds[BROKER_MAX_FDS], size_t *count)
{
    bool other = false;
    *count = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            other = true;
            continue;
        }
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n && *count < BROKER_MAX_FDS; i++)
            memcpy(&fds[(*count)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    return other;
}

/* Receives one message into buf without blocking; every descriptor it carried lands in fds
 * (close-on-exec). Returns recvmsg's result (errno set when negative). */
static ssize_t receive_message(int sock, void *buf, size_t size, struct msghdr *msg,
                               broker_control *control, int fds[BROKER_MAX_FDS], size_t *nfds,
                               bool *other_control)
{
    struct iovec iov = {buf, size};
    ssize_t n;

    memset(msg, 0, sizeof(*msg));
    memset(control, 0, sizeof(*control));
    msg->msg_iov = &iov;
    msg->msg_iovlen = 1;
    msg->msg_control = control->buf;
    msg->msg_controllen = sizeof(control->buf);
    do
        n = recvmsg(sock, msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    *nfds = 0;
    *other_control = false;
    if (n >= 0)
        *other_control = collect_fds(msg, fds, nfds);
    msg->msg_iov = NULL; /* iov is local */
    return n;
}

static bool known_status(unsigned value)
{
    switch (value) {
#define BROKER_STATUS_CASE_(name, val, text) case val:
        FERRY_STATUS_MAP(BROKER_STATUS_CASE_)
#undef BROKER_STATUS_CASE_
        return true;
    default:
        return false;
    }
}

/* ------------------------------------------------------------------------------------
 * Broker thread
 * ---------------------------------------------------------------------------------- */

/* Records the thread's first unrecoverable failure as "<label> failed: <what>: <detail>". */
static void latch_error(ferry__broker *b, const char *what, const char *detail)
{
    int expected = LATCH_HEALTHY;
    if (!__atomic_compare_exchange_n(&b->latch, &expected, LATCH_WRITING, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return;
    b->error_status = FERRY_SYSTEM;
    snprintf(b->error_msg, sizeof(b->error_msg), "%s failed: %s: %s", b->label, what, detail);
    __atomic_store_n(&b->latch, LATCH_SET, __ATOMIC_RELEASE);
}

static void latch_errno(ferry__broker *b, const char *what, int err)
{
    char errbuf[128];
    latch_error(b, what, strerror_r(err, errbuf, sizeof(errbuf)));
}

/* The listening socket reported an error or a hang-up: it will never accept again. */
static void latch_listener(ferry__broker *b, short revents)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (revents & POLLNVAL)
        err = EBADF;
    else if ((revents & POLLERR) && getsockopt(b->listen_fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err != 0)
        latch_errno(b, "listening socket", err);
    else
        latch_error(b, "listening socket", "hung up");
}

/* After a latched failure or at stop: frees the name so that new clients fail fast
 * (ECONNREFUSED) instead of timing out. Shut down first: closing ends a socket only with its
 * last reference, and a child this process forked holds one until it execs or exits. The
 * slot is cleared before the close, so that neither ferry__broker_shutdown_for_tests nor a
 * forked child's ferry__broker_forget can see a descriptor number that is already closed. */
static void release_listener(ferry__broker *b)
{
    int fd = b->listen_fd;
    if (fd < 0)
        return;
    __atomic_store_n(&b->listen_fd, -1, __ATOMIC_RELEASE);
    shutdown(fd, SHUT_RDWR);
    close(fd);
}

/* Sends a reply, with fd in SCM_RIGHTS when fd >= 0 and payload (FERRY_DESCRIPTOR_SIZE
 * bytes) after it when not NULL. Never blocks and never raises SIGPIPE; a peer that cannot
 * take the reply simply does not get it. */
static void send_reply(int conn, ferry_status status, uint64_t size, uint64_t detail, int fd,
                       const uint8_t *payload)
{
    broker_reply rep = {BROKER_REPLY_MAGIC, BROKER_VERSION, (uint16_t)status, size, detail};
    uint8_t buf[BROKER_DESCRIBE_SIZE];
    one_fd_control control;
    struct iovec iov = {buf, payload ? BROKER_DESCRIBE_SIZE : BROKER_REPLY_SIZE};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n;

    encode_reply(&rep, buf);
    if (payload)
        memcpy(buf + BROKER_REPLY_SIZE, payload, FERRY_DESCRIPTOR_SIZE);
    if (fd >= 0)
        attach_fd(&msg, &control, fd);
    do
        n = sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
}

/* Sends a refusal (detail: the holder's pid for RANK_IN_USE, else 0) and counts it. */
static void refuse(ferry__broker *b, int conn, ferry_status status, pid_t detail)
{
    __atomic_fetch_add(&b->refused, 1, __ATOMIC_RELAXED);
    send_reply(conn, status, 0, (uint64_t)detail, -1, NULL);
}

/* Whether a request of type names a rank (NOTIFY, CLAIM, RELEASE) or none (OPEN, DESCRIBE). */
static bool names_rank(uint16_t type)
{
    return type == BROKER_TYPE_NOTIFY || type == BROKER_TYPE_CLAIM || type == BROKER_TYPE_RELEASE;
}

static ferry_status check_request(const ferry__broker *b, const uint8_t *buf, broker_request *req)
{
    static const uint8_t zero[BROKER_ID_SIZE];
    decode_request(buf, req);
    if (req->magic != BROKER_REQUEST_MAGIC || req->version != BROKER_VERSION ||
        req->type < BROKER_TYPE_OPEN || req->type > BROKER_TYPE_RELEASE || req->reserved != 0)
        return FERRY_INVALID_ARGUMENT;
    if (req->type == BROKER_TYPE_DESCRIBE)
        return memcmp(req->pool_id, zero, BROKER_ID_SIZE) == 0 && req->rank == FERRY__RANK_NONE
                   ? FERRY_OK
                   : FERRY_INVALID_ARGUMENT;
    if (memcmp(req->pool_id, b->pool_id, BROKER_ID_SIZE) != 0)
        return FERRY_MISMATCH;
    if (names_rank(req->type) ? req->rank >= b->consumer_count : req->rank != FERRY__RANK_NONE)
        return FERRY_INVALID_ARGUMENT;
    return FERRY_OK;
}

/* Reads and validates the one request of a connection. A message of any other length, or
 * carrying other control data, is invalid; a NOTIFY must carry exactly one descriptor, which
 * lands in *fd (the caller's from then on), and the other types none (whatever came is
 * closed). */
static ferry_status read_request(const ferry__broker *b, int conn, broker_request *req, int *fd)
{
    uint8_t buf[BROKER_REQUEST_SIZE + 1]; /* one more byte to see a longer message */
    broker_control control;
    struct msghdr msg;
    int fds[BROKER_MAX_FDS];
    size_t nfds;
    bool other;

    ssize_t n = receive_message(conn, buf, sizeof(buf), &msg, &control, fds, &nfds, &other);
    if (n < 0)
        return FERRY_INVALID_ARGUMENT;
    ferry_status status = FERRY_INVALID_ARGUMENT;
    if (!other && !(msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) && n == BROKER_REQUEST_SIZE)
        status = check_request(b, buf, req);
    if (status == FERRY_OK && nfds != (req->type == BROKER_TYPE_NOTIFY ? 1u : 0u))
        status = FERRY_INVALID_ARGUMENT;
    if (status == FERRY_OK && nfds == 1) {
        *fd = fds[0];
        return FERRY_OK;
    }
    close_fds(fds, nfds);
    return status;
}

/* Asks on_attach whether pid may hold rank. Returns FERRY_OK, or the refusal to send:
 * RANK_IN_USE with *holder set, another status the callback chose, or SYSTEM when the
 * callback broke its contract (an unknown status, or RANK_IN_USE without a holder). */
static ferry_status claim_rank(ferry__broker *b, uint32_t rank, pid_t pid, pid_t *holder)
{
    pid_t who = 0;
    if (!b->on_attach)
        return FERRY_OK;
    ferry_status status = b->on_attach(b->user, rank, pid, &who);
    if (status == FERRY_OK)
        return FERRY_OK;
    if (status == FERRY_RANK_IN_USE && who > 0) {
        *holder = who;
        return FERRY_RANK_IN_USE;
    }
    if (status == FERRY_RANK_IN_USE || !known_status((unsigned)status))
        return FERRY_SYSTEM;
    return status;
}

/* Closes a pending connection and frees its slot (the slot first: see broker_conn). */
static void conn_close(ferry__broker *b, broker_conn *c)
{
    int fd = c->fd;
    __atomic_store_n(&c->fd, -1, __ATOMIC_RELEASE);
    close(fd);
    b->pending_count--;
}

/* A callback's status as the broker may send it: SYSTEM for one outside the status list. */
static ferry_status sendable(ferry_status status)
{
    return known_status((unsigned)status) ? status : FERRY_SYSTEM;
}

/* Serves a connection whose request has arrived (or that hung up), then closes it. */
static void conn_serve(ferry__broker *b, broker_conn *c)
{
    broker_request req = {0};
    uint8_t desc[FERRY_DESCRIPTOR_SIZE];
    pid_t holder = 0;
    int fd = -1;

    ferry_status status = read_request(b, c->fd, &req, &fd);
    /* A rank's holder is watched by its pid: a peer whose pid reads 0 here (a process of
     * another PID namespace, not below this one) cannot hold or be told of one. */
    if (status == FERRY_OK && names_rank(req.type) && c->pid <= 0) {
        status = FERRY_PERMISSION;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    if (status == FERRY_OK && req.type == BROKER_TYPE_CLAIM)
        status = claim_rank(b, req.rank, c->pid, &holder);
    if (status == FERRY_OK && req.type == BROKER_TYPE_RELEASE)
        status = b->on_release ? sendable(b->on_release(b->user, req.rank, c->pid))
                               : FERRY_NOT_SUPPORTED;
    if (status == FERRY_OK && req.type == BROKER_TYPE_DESCRIBE)
        status = b->on_describe ? sendable(b->on_describe(b->user, desc)) : FERRY_NOT_SUPPORTED;
    if (status == FERRY_OK && req.type == BROKER_TYPE_NOTIFY) {
        status = b->on_notify ? sendable(b->on_notify(b->user, req.rank, c->pid, fd))
                              : FERRY_NOT_SUPPORTED;
        if (!b->on_notify)
            close(fd);
    }
    if (status != FERRY_OK)
        refuse(b, c->fd, status, holder);
    else if (req.type == BROKER_TYPE_OPEN)
        send_reply(c->fd, FERRY_OK, b->shared_size, 0, b->shared_fd, NULL);
    else
        send_reply(c->fd, FERRY_OK, 0, 0, -1, req.type == BROKER_TYPE_DESCRIBE ? desc : NULL);
    conn_close(b, c);
}

/* Closes every pending connection without a reply (their peers see the hang-up). Also run
 * by ferry__broker_forget in a forked child, on the child's copies. */
static void close_pending(ferry__broker *b)
{
    for (unsigned i = 0; i < BROKER_MAX_PENDING; i++) {
        int fd = __atomic_load_n(&b->pending[i].fd, __ATOMIC_ACQUIRE);
        if (fd < 0)
            continue;
        __atomic_store_n(&b->pending[i].fd, -1, __ATOMIC_RELEASE);
        close(fd);
    }
    b->pending_count = 0;
}

/* Takes in a freshly accepted connection: a peer of another uid is refused at once without
 * reading its request, and so is anybody while the table is full; the others wait in the
 * table for their request. */
static void admit(ferry__broker *b, int conn)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);

    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred))
        refuse(b, conn, FERRY_SYSTEM, 0);
    else if (cred.uid != geteuid())
        refuse(b, conn, FERRY_PERMISSION, 0);
    else if (b->pending_count == BROKER_MAX_PENDING)
        refuse(b, conn, FERRY_TIMEOUT, 0);
    else {
        for (unsigned i = 0; i < BROKER_MAX_PENDING; i++) {
            broker_conn *c = &b->pending[i];
            if (c->fd >= 0)
                continue;
            c->pid = cred.pid;
            c->deadline = ferry__deadline((uint64_t)BROKER_REQUEST_WAIT_MS * 1000000u);
            __atomic_store_n(&c->fd, conn, __ATOMIC_RELEASE);
            b->pending_count++;
            return;
        }
    }
    close(conn);
}

enum { ACCEPT_DONE, ACCEPT_BACK_OFF, ACCEPT_FAILED };

/* Accepts one connection into the table. */
static int accept_one(ferry__broker *b)
{
    int conn = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn >= 0) {
        admit(b, conn);
        return ACCEPT_DONE;
    }
    switch (errno) {
    case EINTR:
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case ECONNABORTED:
    case EPROTO:
        return ACCEPT_DONE;
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case ENOMEM:
        __atomic_fetch_add(&b->transient, 1, __ATOMIC_RELAXED);
        return ACCEPT_BACK_OFF;
    default:
        latch_errno(b, "accept", errno);
        return ACCEPT_FAILED;
    }
}

/* One round of the loop: the poll set, which connection each slot is, and the backoff. */
typedef struct broker_loop {
    struct pollfd fds[BROKER_POLL_FIRST_CONN + BROKER_MAX_PENDING];
    broker_conn *conn[BROKER_POLL_FIRST_CONN + BROKER_MAX_PENDING];
    nfds_t count;
    uint64_t backoff_until; /* 0: not backing off */
} broker_loop;

/* Fills the poll set: the stop eventfd, the listener (-1, ignored by poll, once released or
 * while backing off) and every pending connection. Returns the earliest time to wake up. */
static uint64_t loop_prepare(ferry__broker *b, broker_loop *loop, uint64_t now)
{
    uint64_t wake = UINT64_MAX;
    if (loop->backoff_until != 0 && now >= loop->backoff_until)
        loop->backoff_until = 0;
    if (loop->backoff_until != 0)
        wake = loop->backoff_until;
    loop->fds[0] = (struct pollfd){b->stop_fd, POLLIN, 0};
    loop->fds[1] = (struct pollfd){loop->backoff_until ? -1 : b->listen_fd, POLLIN, 0};
    loop->count = BROKER_POLL_FIRST_CONN;
    for (unsigned i = 0; i < BROKER_MAX_PENDING; i++) {
        broker_conn *c = &b->pending[i];
        if (c->fd < 0)
            continue;
        loop->conn[loop->count] = c;
        loop->fds[loop->count++] = (struct pollfd){c->fd, POLLIN, 0};
        if (c->deadline < wake)
            wake = c->deadline;
    }
    return wake;
}

enum { EVENT_READY, EVENT_STOP, EVENT_FAILED };

/* Blocks until the broker is stopped, something is readable, or the earliest deadline. */
static int loop_wait(ferry__broker *b, broker_loop *loop)
{
    uint64_t wake = loop_prepare(b, loop, ferry__now_ns());
    int n = poll(loop->fds, loop->count, remaining_ms(wake));
    if (n < 0 && errno == EINTR)
        return EVENT_READY;
    if (n < 0) {
        latch_errno(b, "poll", errno);
        return EVENT_FAILED;
    }
    return loop->fds[0].revents ? EVENT_STOP : EVENT_READY;
}

/* Serves every connection whose request arrived, then refuses those past their deadline. */
static void serve_pending(ferry__broker *b, broker_loop *loop)
{
    for (nfds_t i = BROKER_POLL_FIRST_CONN; i < loop->count; i++)
        if (loop->fds[i].revents)
            conn_serve(b, loop->conn[i]);
    uint64_t now = ferry__now_ns();
    for (unsigned i = 0; i < BROKER_MAX_PENDING; i++) {
        broker_conn *c = &b->pending[i];
        if (c->fd >= 0 && now >= c->deadline) {
            refuse(b, c->fd, FERRY_TIMEOUT, 0);
            conn_close(b, c);
        }
    }
}

/* Handles the listener's events: a connection to accept, or a failure that latches. */
static void serve_listener(ferry__broker *b, broker_loop *loop)
{
    short revents = loop->fds[1].revents;
    if (revents & (POLLERR | POLLHUP | POLLNVAL)) {
        latch_listener(b, revents);
        release_listener(b);
        return;
    }
    if (!(revents & POLLIN))
        return;
    int accepted = accept_one(b);
    if (accepted == ACCEPT_FAILED)
        release_listener(b);
    else if (accepted == ACCEPT_BACK_OFF)
        loop->backoff_until = ferry__deadline((uint64_t)BROKER_BACKOFF_MS * 1000000u);
}

/* Runs until stopped. After a latched failure it no longer listens but still serves (or
 * times out) the connections already accepted, then ends. */
static void *broker_main(void *arg)
{
    ferry__broker *b = arg;
    broker_loop loop = {.count = 0};

    while (b->listen_fd >= 0 || b->pending_count > 0) {
        int event = loop_wait(b, &loop);
        if (event != EVENT_READY)
            break;
        serve_pending(b, &loop);
        serve_listener(b, &loop);
    }
    release_listener(b);
    close_pending(b);
    return NULL;
}

/* ------------------------------------------------------------------------------------
 * Start and stop
 * ---------------------------------------------------------------------------------- */

static ferry_status check_config(const ferry__broker_config *config, ferry__broker **broker,
                                 const uint8_t *name_out)
{
    if (!config || !broker || !name_out)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "broker start: config, broker and name_out must not be NULL");
    if (!config->label)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "broker start: label is NULL");
    if (!config->pool_id)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "%s: pool_id is NULL", config->label);
    if (config->shared_fd < 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "%s: shared_fd %d is not a file descriptor",
                           config->label, config->shared_fd);
    if (config->consumer_count < 1)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "%s: consumer_count must be at least 1",
                           config->label);
    return FERRY_OK;
}

static ferry__broker *broker_new(const ferry__broker_config *config)
{
    size_t label_size = strlen(config->label) + 1;
    ferry__broker *b = calloc(1, sizeof(*b) + label_size);
    if (!b)
        return NULL;
    memcpy(b->pool_id, config->pool_id, BROKER_ID_SIZE);
    b->shared_fd = config->shared_fd;
    b->shared_size = config->shared_size;
    b->consumer_count = config->consumer_count;
    b->on_attach = config->on_attach;
    b->on_describe = config->on_describe;
    b->on_notify = config->on_notify;
    b->on_release = config->on_release;
    b->user = config->user;
    b->listen_fd = -1;
    b->stop_fd = -1;
    b->owner = getpid();
    for (unsigned i = 0; i < BROKER_MAX_PENDING; i++)
        b->pending[i].fd = -1;
    memcpy(b->label, config->label, label_size);
    return b;
}

/* Binds the listening socket to a fresh random name, retrying on a (very unlikely) clash. */
static ferry_status bind_random(ferry__broker *b)
{
    for (int attempt = 1;; attempt++) {
        struct sockaddr_un addr;
        char hex[BROKER_HEX_SIZE];
        if (ferry__random_bytes(b->name, sizeof(b->name)) != 0)
            return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: getrandom", b->label);
        unsigned len = ferry__broker_address(b->name, &addr);
        if (bind(b->listen_fd, (const struct sockaddr *)&addr, len) == 0)
            return FERRY_OK;
        if (errno == EADDRINUSE && attempt < BROKER_BIND_ATTEMPTS)
            continue;
        format_hex(b->name, hex);
        return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: bind to @" BROKER_NAME_PREFIX "%s",
                                 b->label, hex);
    }
}

/* Starts the thread with every signal blocked: signals are for the application's threads. */
static ferry_status start_thread(ferry__broker *b)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&b->thread, NULL, broker_main, b);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0)
        return ferry__fail_errno(FERRY_SYSTEM, err, "%s: pthread_create", b->label);
    return FERRY_OK;
}

ferry_status ferry__broker_start(const ferry__broker_config *config, ferry__broker **broker,
                                 uint8_t name_out[16])
{
    ferry_status status = check_config(config, broker, name_out);
    if (status != FERRY_OK)
        return status;
    ferry__broker *b = broker_new(config);
    if (!b)
        return ferry__fail(FERRY_NO_MEMORY, "%s: out of memory", config->label);

    b->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (b->listen_fd < 0) {
        status = ferry__fail_errno(FERRY_SYSTEM, errno, "%s: socket", b->label);
        goto free_broker;
    }
    status = bind_random(b);
    if (status != FERRY_OK)
        goto close_socket;
    if (listen(b->listen_fd, SOMAXCONN) != 0) {
        status = ferry__fail_errno(FERRY_SYSTEM, errno, "%s: listen", b->label);
        goto close_socket;
    }
    b->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (b->stop_fd < 0) {
        status = ferry__fail_errno(FERRY_SYSTEM, errno, "%s: eventfd", b->label);
        goto close_socket;
    }
    status = start_thread(b);
    if (status != FERRY_OK)
        goto close_eventfd;

    memcpy(name_out, b->name, BROKER_ID_SIZE);
    *broker = b;
    return FERRY_OK;

close_eventfd:
    close(b->stop_fd);
close_socket:
    close(b->listen_fd);
free_broker:
    free(b);
    return status;
}

void ferry__broker_stop(ferry__broker *broker)
{
    uint64_t one = 1;
    ssize_t n;

    if (!broker)
        return;
    if (getpid() != broker->owner) {
        /* A forked child: the thread is the parent's, and so is the eventfd's counter. */
        ferry__broker_forget(broker);
        return;
    }
    do
        n = write(broker->stop_fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
    pthread_join(broker->thread, NULL);
    close(broker->stop_fd);
    free(broker);
}

void ferry__broker_forget(ferry__broker *broker)
{
    if (!broker)
        return;
    close_pending(broker);
    int listen_fd = __atomic_load_n(&broker->listen_fd, __ATOMIC_ACQUIRE);
    if (listen_fd >= 0)
        close(listen_fd);
    close(broker->stop_fd);
    free(broker);
}

int ferry__broker_shutdown_for_tests(ferry__broker *broker)
{
    int fd = __atomic_load_n(&broker->listen_fd, __ATOMIC_ACQUIRE);
    return fd < 0 ? -1 : shutdown(fd, SHUT_RDWR);
}

uint64_t ferry__broker_refused(const ferry__broker *broker)
{
    return broker ? __atomic_load_n(&broker->refused, __ATOMIC_RELAXED) : 0;
}

ferry_status ferry__broker_error(const ferry__broker *broker, char *buf, size_t buf_size)
{
    ferry_status status = FERRY_OK;
    const char *message = "";

    if (broker && __atomic_load_n(&broker->latch, __ATOMIC_ACQUIRE) == LATCH_SET) {
        status = broker->error_status;
        message = broker->error_msg;
    }
    if (buf && buf_size > 0 && status != FERRY_OK)
        snprintf(buf, buf_size, "%s", message);
    else if (buf && buf_size > 0) /* healthy: asked on every publish, nothing to format */
        buf[0] = '\0';
    return status;
}

/* ------------------------------------------------------------------------------------
 * Client
 * ---------------------------------------------------------------------------------- */

/* The time left until deadline, for ppoll: NULL for "forever", zero once it has passed. */
static const struct timespec *time_left(uint64_t deadline, struct timespec *ts)
{
    if (deadline == UINT64_MAX)
        return NULL;
    uint64_t now = ferry__now_ns();
    uint64_t left = now >= deadline ? 0 : deadline - now;
    ts->tv_sec = (time_t)(left / 1000000000u);
    ts->tv_nsec = (long)(left % 1000000000u);
    return ts;
}

/* Waits for events on sock, never past deadline. Returns 1 when sock is ready (or has an
 * error or a hang-up to report), 0 at the deadline, -1 with errno set on failure. */
static int wait_until(int sock, short events, uint64_t deadline)
{
    for (;;) {
        struct timespec ts;
        struct pollfd p = {sock, events, 0};
        int n = ppoll(&p, 1, time_left(deadline, &ts), NULL);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
        if (n == 0 && ferry__now_ns() >= deadline)
            return 0;
    }
}

/* Sleeps BROKER_RETRY_MS, or less where the deadline comes first. */
static void pause_until(uint64_t deadline)
{
    struct timespec ts = {0, BROKER_RETRY_MS * 1000000L}, left;
    const struct timespec *limit = time_left(deadline, &left);
    if (limit && limit->tv_sec == 0 && limit->tv_nsec < ts.tv_nsec)
        ts = *limit;
    nanosleep(&ts, NULL);
}

static ferry_status call_timeout(const broker_call *c, const char *what)
{
    return ferry__fail(FERRY_TIMEOUT, "%s did not %s within %llu ms", c->label, what,
                       (unsigned long long)ns_to_ms_ceil(c->timeout_ns));
}

/* Connects without blocking; a full backlog is retried until the deadline (one attempt
 * when the deadline has already passed). */
static ferry_status call_connect(const broker_call *c, const uint8_t name[16])
{
    struct sockaddr_un addr;
    unsigned len = ferry__broker_address(name, &addr);

    for (;;) {
        if (connect(c->sock, (const struct sockaddr *)&addr, len) == 0 || errno == EISCONN)
            return FERRY_OK;
        int err = errno;
        if (err == ECONNREFUSED || err == ENOENT)
            return ferry__fail_errno(FERRY_PRODUCER_GONE, err,
                                     "%s is not reachable: connect to @" BROKER_NAME_PREFIX "%s",
                                     c->label, c->hex);
        if (err != EAGAIN && err != EINTR)
            return ferry__fail_errno(FERRY_SYSTEM, err, "%s: connect to @" BROKER_NAME_PREFIX "%s",
                                     c->label, c->hex);
        if (ferry__now_ns() >= c->deadline)
            return call_timeout(c, "accept the connection");
        pause_until(c->deadline); /* backlog full: try again shortly */
    }
}

static ferry_status call_peer(const broker_call *c, struct ucred *cred)
{
    socklen_t len = sizeof(*cred);
    if (getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: getsockopt(SO_PEERCRED)", c->label);
    return FERRY_OK;
}

/* The broker serves only its own uid; symmetrically, accept a pool only from our uid (a
 * name squatted by another user must not hand us its memory). */
static ferry_status call_check_owner(const broker_call *c, const struct ucred *cred, int fd)
{
    if (cred->uid == geteuid())
        return FERRY_OK;
    close(fd);
    return ferry__fail(FERRY_PERMISSION, "%s belongs to uid %u, not to this process's uid %u",
                       c->label, (unsigned)cred->uid, (unsigned)geteuid());
}

/* Sends the request (with c->send_fd in SCM_RIGHTS when it is one), waiting (until the
 * deadline) for room if the socket has none. */
static ferry_status call_send(const broker_call *c, const uint8_t pool_id[16])
{
    broker_request req = {BROKER_REQUEST_MAGIC, BROKER_VERSION, c->type, {0}, c->rank, 0};
    uint8_t buf[BROKER_REQUEST_SIZE];
    one_fd_control control;
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

    if (pool_id)
        memcpy(req.pool_id, pool_id, BROKER_ID_SIZE);
    encode_request(&req, buf);
    if (c->send_fd >= 0)
        attach_fd(&msg, &control, c->send_fd);
    for (;;) {
        ssize_t n = sendmsg(c->sock, &msg, MSG_NOSIGNAL);
        if (n == (ssize_t)sizeof(buf))
            return FERRY_OK;
        int err = n < 0 ? errno : EMSGSIZE;
        /* A broker that refuses us before reading (other uid) may already have replied and
         * closed: its reply is still queued here. */
        if (err == EPIPE || err == ECONNRESET)
            return FERRY_OK;
        if (err != EINTR && err != EAGAIN)
            return ferry__fail_errno(FERRY_SYSTEM, err, "%s: send", c->label);
        int ready = err == EAGAIN ? wait_until(c->sock, POLLOUT, c->deadline) : 1;
        if (ready == 0)
            return call_timeout(c, "take the request");
        if (ready < 0)
            return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: poll", c->label);
    }
}

static ferry_status call_wait(const broker_call *c)
{
    int ready = wait_until(c->sock, POLLIN, c->deadline);
    if (ready > 0)
        return FERRY_OK; /* data, hang-up or error: recvmsg tells which */
    if (ready < 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: poll", c->label);
    return call_timeout(c, "reply");
}

static ferry_status malformed_reply(const broker_call *c, const char *why)
{
    return ferry__fail(FERRY_SYSTEM, "%s sent a malformed reply: %s", c->label, why);
}

/* Whether size and detail hold what the status allows: detail is the holder's pid for
 * RANK_IN_USE (which only a request claiming a rank can get) and 0 otherwise; a refusal
 * has size 0. */
static bool fields_valid(const broker_call *c, const broker_reply *rep)
{
    if (rep->status != FERRY_OK && rep->size != 0)
        return false;
    if (rep->status != FERRY_RANK_IN_USE)
        return rep->detail == 0;
    return c->rank != FERRY__RANK_NONE && rep->detail >= 1 && rep->detail <= INT32_MAX;
}

/* The error for a well-formed refusal. */
static ferry_status refusal(const broker_call *c, const broker_reply *rep)
{
    if (rep->status == FERRY_RANK_IN_USE)
        return ferry__fail(FERRY_RANK_IN_USE,
                           "rank %u is held by live process %lld (a rank belongs to one live "
                           "process at a time)",
                           (unsigned)c->rank, (long long)rep->detail);
    if (rep->status == FERRY_PERMISSION)
        return ferry__fail(FERRY_PERMISSION,
                           "%s refused the request: permission denied (it serves processes of "
                           "its own user, and names ranks only to those it can see: in its PID "
                           "namespace or one below it)",
                           c->label);
    return ferry__fail((ferry_status)rep->status, "%s refused the request: %s", c->label,
                       ferry_status_str((ferry_status)rep->status));
}

/* Validates the fields of a reply of the right length that carried nfds descriptors. */
static ferry_status check_fields(const broker_call *c, const uint8_t *buf, size_t nfds,
                                 uint64_t *size)
{
    broker_reply rep;

    decode_reply(buf, &rep);
    if (rep.magic != BROKER_REPLY_MAGIC || rep.version != BROKER_VERSION)
        return malformed_reply(c, "bad magic or version");
    if (!known_status(rep.status))
        return malformed_reply(c, "unknown status");
    if (!fields_valid(c, &rep))
        return malformed_reply(c, "a size or detail field its status does not allow");
    if (rep.status != FERRY_OK && nfds > 0)
        return malformed_reply(c, "a refusal carrying file descriptors");
    if (rep.status != FERRY_OK)
        return refusal(c, &rep);
    if (c->type != BROKER_TYPE_OPEN) {
        if (nfds != 0 || rep.size != 0)
            return malformed_reply(c, "file descriptors or a size in a reply that has none");
        return FERRY_OK;
    }
    if (nfds == 0)
        return ferry__fail(FERRY_SYSTEM, "%s returned no file descriptor", c->label);
    if (nfds > 1)
        return ferry__fail(FERRY_SYSTEM, "%s returned %zu file descriptors instead of one",
                           c->label, nfds);
    *size = rep.size;
    return FERRY_OK;
}

/* Control data was cut (MSG_CTRUNC). The room was there for more descriptors than a reply
 * carries, so the kernel could not install one: recvmsg does not say why, and the reason is
 * nearly always that this process has no descriptor free. A probe for one tells. */
static ferry_status truncated_reply(const broker_call *c)
{
    int probe = fcntl(c->sock, F_DUPFD_CLOEXEC, 0);
    int err = errno;
    if (probe >= 0) {
        close(probe);
        return malformed_reply(c, "more control data than expected");
    }
    return ferry__fail_errno(FERRY_SYSTEM, err,
                             "%s sent the pool's file descriptor, but this process could not "
                             "take it%s",
                             c->label,
                             err == EMFILE ? " (EMFILE: it is at its limit of open files)" : "");
}

/* Validates a received reply (n bytes) that carried nfds descriptors. */
static ferry_status check_reply(const broker_call *c, const struct msghdr *msg, ssize_t n,
                                const uint8_t *buf, size_t nfds, uint64_t *size)
{
    if (msg->msg_flags & MSG_CTRUNC)
        return truncated_reply(c);
    if (n == 0 && nfds == 0)
        return ferry__fail(FERRY_PRODUCER_GONE, "%s closed the connection without replying",
                           c->label);
    /* Only a DESCRIBE granted carries the descriptor after the reply. */
    int described = c->type == BROKER_TYPE_DESCRIBE && n >= 8 && get_le16(buf + 6) == FERRY_OK;
    if ((msg->msg_flags & MSG_TRUNC) || n != (described ? BROKER_DESCRIBE_SIZE : BROKER_REPLY_SIZE))
        return malformed_reply(c, "wrong length");
    ferry_status status = check_fields(c, buf, nfds, size);
    if (status == FERRY_OK && described)
        memcpy(c->payload, buf + BROKER_REPLY_SIZE, FERRY_DESCRIPTOR_SIZE);
    return status;
}

static ferry_status call_receive(const broker_call *c, int *fd, uint64_t *size)
{
    uint8_t buf[BROKER_DESCRIBE_SIZE + 1]; /* one more byte to see a longer message */
    broker_control control;
    struct msghdr msg;
    int fds[BROKER_MAX_FDS];
    size_t nfds;
    bool other;

    ssize_t n = receive_message(c->sock, buf, sizeof(buf), &msg, &control, fds, &nfds, &other);
    /* A broker that closed without reading our request (other uid) leaves ECONNRESET
     * pending, reported once, ahead of its queued reply: read again to get the reply. */
    if (n < 0 && errno == ECONNRESET)
        n = receive_message(c->sock, buf, sizeof(buf), &msg, &control, fds, &nfds, &other);
    if (n < 0 && errno == ECONNRESET)
        return ferry__fail(FERRY_PRODUCER_GONE, "%s closed the connection without replying",
                           c->label);
    if (n < 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: recvmsg", c->label);
    ferry_status status = other ? malformed_reply(c, "unexpected control message")
                                : check_reply(c, &msg, n, buf, nfds, size);
    if (status != FERRY_OK) {
        close_fds(fds, nfds);
        return status;
    }
    *fd = nfds ? fds[0] : -1;
    return FERRY_OK;
}

static ferry_status call_exchange(const broker_call *c, const uint8_t name[16],
                                  const uint8_t pool_id[16], int *fd, uint64_t *size, pid_t *pid)
{
    struct ucred cred;
    ferry_status status = call_connect(c, name);
    if (status == FERRY_OK)
        status = call_peer(c, &cred);
    if (status == FERRY_OK && cred.pid <= 0) /* before the request: nothing is claimed */
        status = ferry__fail(FERRY_PERMISSION,
                             "%s: the producer is a process of another PID namespace, not seen "
                             "from this one (its pid reads 0 here): its liveness cannot be "
                             "watched from here",
                             c->label);
    if (status == FERRY_OK)
        status = call_send(c, pool_id);
    if (status == FERRY_OK)
        status = call_wait(c);
    if (status == FERRY_OK)
        status = call_receive(c, fd, size);
    if (status == FERRY_OK)
        status = call_check_owner(c, &cred, *fd); /* closes *fd when it refuses */
    if (status == FERRY_OK)
        *pid = cred.pid;
    return status;
}

/* One request of any type, on a fresh connection each attempt. A broker whose table of
 * waiting connections is full refuses at once (TIMEOUT): a patient call asks again shortly,
 * while more than BROKER_PATIENT_LEFT_MS of its time is left. */
static ferry_status call_run(broker_call *call, const uint8_t name[16], const uint8_t pool_id[16],
                             int *fd, uint64_t *size, pid_t *pid)
{
    format_hex(name, call->hex);
    for (;;) {
        call->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (call->sock < 0)
            return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: socket", call->label);
        ferry_status status = call_exchange(call, name, pool_id, fd, size, pid);
        close(call->sock);
        uint64_t now = ferry__now_ns();
        if (!call->patient || status != FERRY_TIMEOUT || now >= call->deadline ||
            call->deadline - now < BROKER_PATIENT_LEFT_MS * 1000000ull)
            return status;
        pause_until(call->deadline);
    }
}

/* A client call's fixed part: no fd to hand over, no payload, impatient. */
static broker_call call_new(const char *label, uint16_t type, uint32_t rank, uint64_t timeout_ns)
{
    return (broker_call){.sock = -1,
                         .label = label,
                         .type = type,
                         .rank = rank,
                         .deadline = ferry__deadline(timeout_ns),
                         .timeout_ns = timeout_ns,
                         .send_fd = -1};
}

static ferry_status request_open(const uint8_t name[16], const uint8_t pool_id[16],
                                 const char *label, uint64_t timeout_ns, int patient, int *fd,
                                 uint64_t *size, pid_t *producer_pid)
{
    broker_call call = call_new(label, BROKER_TYPE_OPEN, FERRY__RANK_NONE, timeout_ns);
    int got_fd = -1;
    uint64_t got_size = 0;
    pid_t got_pid = 0;

    if (!name || !pool_id || !label || !fd || !size || !producer_pid)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "broker request: NULL argument");
    call.patient = patient;
    ferry_status status = call_run(&call, name, pool_id, &got_fd, &got_size, &got_pid);
    if (status != FERRY_OK)
        return status;
    *fd = got_fd;
    *size = got_size;
    *producer_pid = got_pid;
    return FERRY_OK;
}

ferry_status ferry__broker_request(const uint8_t name[16], const uint8_t pool_id[16],
                                   const char *label, uint64_t timeout_ns, int *fd, uint64_t *size,
                                   pid_t *producer_pid)
{
    return request_open(name, pool_id, label, timeout_ns, 0, fd, size, producer_pid);
}

ferry_status ferry__broker_request_patient(const uint8_t name[16], const uint8_t pool_id[16],
                                           const char *label, uint64_t timeout_ns, int *fd,
                                           uint64_t *size, pid_t *producer_pid)
{
    return request_open(name, pool_id, label, timeout_ns, 1, fd, size, producer_pid);
}

/* A patient request naming rank (CLAIM, RELEASE), which carries no descriptor back. */
static ferry_status rank_call(uint16_t type, const char *what, const uint8_t name[16],
                              const uint8_t pool_id[16], uint32_t rank, const char *label,
                              uint64_t timeout_ns)
{
    broker_call call = call_new(label, type, rank, timeout_ns);
    int fd = -1;
    uint64_t size = 0;
    pid_t pid = 0;
    if (!name || !pool_id || !label || rank == FERRY__RANK_NONE)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "broker %s: NULL argument or no rank", what);
    call.patient = 1;
    return call_run(&call, name, pool_id, &fd, &size, &pid);
}

ferry_status ferry__broker_claim(const uint8_t name[16], const uint8_t pool_id[16], uint32_t rank,
                                 const char *label, uint64_t timeout_ns)
{
    return rank_call(BROKER_TYPE_CLAIM, "claim", name, pool_id, rank, label, timeout_ns);
}

ferry_status ferry__broker_release(const uint8_t name[16], const uint8_t pool_id[16], uint32_t rank,
                                   const char *label, uint64_t timeout_ns)
{
    return rank_call(BROKER_TYPE_RELEASE, "release", name, pool_id, rank, label, timeout_ns);
}

ferry_status ferry__broker_describe(const uint8_t name[16], const char *label, uint64_t timeout_ns,
                                    uint8_t desc[FERRY_DESCRIPTOR_SIZE], pid_t *producer_pid)
{
    broker_call call = call_new(label, BROKER_TYPE_DESCRIBE, FERRY__RANK_NONE, timeout_ns);
    int fd = -1;
    uint64_t size = 0;
    call.payload = desc;
    call.patient = 1;
    return call_run(&call, name, NULL, &fd, &size, producer_pid);
}

ferry_status ferry__broker_notify(const uint8_t name[16], const uint8_t pool_id[16], uint32_t rank,
                                  const char *label, uint64_t timeout_ns, int event_fd)
{
    broker_call call = call_new(label, BROKER_TYPE_NOTIFY, rank, timeout_ns);
    int fd = -1;
    uint64_t size = 0;
    pid_t pid = 0;
    call.send_fd = event_fd;
    return call_run(&call, name, pool_id, &fd, &size, &pid);
}
