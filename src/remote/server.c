/* Remote consumers, producer side (remote.h): the listener, the bootstrap, the admitted
 * consumers' connections, and forwarding their rings' descriptors as active messages.
 *
 * One thread serves everything, in one epoll loop over: the listening socket; the
 * connections waiting for their HELLO (each with its own deadline, at most
 * SERVER_MAX_PENDING of them); the admitted connections (kept open for liveness: EOF, an
 * error or a keepalive failure means the consumer is gone); each admitted rank's notify
 * eventfd (signalled by senders, as a local consumer's poll fd is); the UCX worker's event
 * fd; and a wake-up eventfd for stop. Only this thread calls UCX on the server's worker, so
 * that remote reads emulated over active messages (tcp) are served whenever they arrive.
 *
 * Forwarding: an admitted rank's descriptor ring in the shared segment is consumed by this
 * thread with the receiver's half of the ring (shm/ring.c), as a local consumer's process
 * consumes it: each lease at head is checked as a consumer checks it (well formed, this
 * pool's, its parts in order, current), taken once it is ready and the window has room, and
 * sent as one FERRY_AM_DESC per lease, with the lease's extent. At most ring_depth
 * descriptors are on their way to one consumer; its FERRY_AM_TAKEN messages open the window
 * again. A small lease of a host pool travels inline: its bytes follow its descriptor in the
 * DESC (copy_inline), so that the consumer reads it without a get.
 *
 * Served reads: a consumer whose gets UCX would emulate (tcp) asks this thread for a host
 * pool's bytes instead (FERRY_AM_READ). Each request is queued by the active-message handler
 * and answered after the round of progress (serve_reads): the lease checked through the pool,
 * the bytes copied as for an inline DESC and kept only if the slot's generation still holds
 * them, then sent in one FERRY_AM_DATA. UCX's own emulation of a get would copy them too, but
 * sends its answer on a path that aborts the process when the consumer's connection broke
 * meanwhile (docs/design.md, "What UCX does on its own"); ferry's sends end in on_sent. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/futex.h"
#include "common/proc.h"
#include "driver/driver.h"
#include "shm/layout.h"
#include "shm/ring.h"
#include "remote/remote.h"
#include "remote/ucx.h"
#include "wire/remote.h"
#include "wire/wire.h"

/* Connections waiting for their HELLO at once; more are refused at once. */
#define SERVER_MAX_PENDING 64
/* How long a connection has to send its whole HELLO. */
#define SERVER_HELLO_NS 1000000000ull
/* How long a consumer whose connection ended has for what it sent over UCX before it left
 * (its last acknowledgements) to arrive: dropped at once when its endpoint fails too. */
#define SERVER_LEAVE_NS 100000000ull
/* How long the listener is left alone after accept failed for want of fds or memory (the
 * connection waits in the backlog meanwhile; a level-triggered listener would spin). */
#define SERVER_ACCEPT_PAUSE_NS 50000000ull
/* How often a rank whose next lease is not ready yet (a GPU stream still copying) is looked
 * at again. */
#define SERVER_READY_POLL_NS 50000ull
/* Read requests one connection may have queued: a consumer has CLIENT_READ_WINDOW (4) on
 * their way at once, and a read that ended early leaves at most 3 behind it, answered before
 * the next read's. More are dropped and counted as bad messages. */
#define SERVER_READS_QUEUED 16
/* Bytes of read answers UCX may hold at once (not sent yet), for one rank and for all. A
 * consumer has CLIENT_READ_WINDOW pieces on their way (1 MiB), and a read that ended early
 * leaves at most 3 more: a rank over its budget asks far beyond that, or takes none of its
 * answers, and is answered nothing more until they go. Bytes beyond the server's budget are
 * answered BUSY and asked again. */
#define SERVER_SERVED_RANK_MAX (16ull << 20)
#define SERVER_SERVED_MAX      (256ull << 20)
/* A GPU pool's read answers of a piece at most go in buffers of pinned memory, this many
 * (4 MiB): its consumers' windows, several times over. More at once are malloc'd. */
#define SERVER_PINNED_SLOTS 16u

const char *const ferry__remote_refused_names[FERRY_REMOTE_REFUSED_REASONS] = {
    "malformed", "secret", "rank", "silent", "flood", "error",
};

enum conn_state { CONN_HELLO, CONN_ADMITTED };

/* A read request as it came (FERRY_AM_READ), checked for form only. */
typedef struct read_req {
    uint32_t slot, generation, id, length;
    uint64_t offset;
} read_req;

typedef struct conn {
    struct conn *next;
    int fd;
    int warned_copy; /* a read's failed copy out of a GPU pool was logged */
    enum conn_state state;
    uint64_t deadline; /* CONN_HELLO */
    uint8_t *buf;      /* CONN_HELLO: the HELLO so far */
    size_t have;
    /* CONN_ADMITTED */
    uint32_t id;
    uint64_t token;
    uint32_t rank;
    int notify_fd; /* the rank's notify eventfd (the pool holds a duplicate) */
    ucp_ep_h ep;
    uint32_t sent;    /* descriptors sent since admission */
    uint32_t taken;   /* descriptors the consumer took, as it last said */
    int not_ready;    /* the ring's next lease is not ready: look again soon */
    int failed;       /* UCX reported the endpoint failed, or the peer broke the protocol */
    int emulated;     /* it said its reads are emulated (counted once, while it is connected) */
    int hold;         /* it asked for held leases (it reads by gets) */
    uint64_t leaving; /* its connection ended: dropped at this time (or when UCX says so) */
    int closed;       /* its peer closed the connection (EOF): the consumer is gone or gave
                       * the pool up, and reads nothing more */
    read_req reads[SERVER_READS_QUEUED]; /* read requests to answer after this round */
    uint32_t nreads;
    pid_t pid;
    char host[FERRY_REMOTE_HOST_SIZE];
} conn;

struct ferry__remote_server {
    ferry__remote_config cfg;
    char label[64];
    pid_t owner;
    ferry__ucx_node node;
    ucp_mem_h memh[2];
    void *rkey[2];
    size_t rkey_len[2];
    uint8_t secret[16];
    char address[FERRY_REMOTE_ADDRESS_SIZE];
    int listen_fd, epoll_fd, wake_fd;
    pthread_t thread;
    int running;
    int stop;    /* atomic */
    conn *conns; /* the thread's */
    unsigned pending;
    uint32_t next_id;
    conn **by_rank;       /* admitted connections by rank (thread) */
    pthread_mutex_t lock; /* guards counts */
    ferry__remote_counts counts;
    ferry_descriptor *descs; /* the lease the thread forwards (ring_depth parts at most) */
    /* The pool's slot generations, and its data when leases can travel inline (host memory
     * in region 1, which this thread reads as a local consumer would); else NULL. A GPU
     * pool's data (device memory of cfg.device, served reads only) is at gpu_data, copied on
     * io, a stream of the thread's own made at the first served read. */
    uint32_t *generations;
    const uint8_t *inline_data;
    const uint8_t *gpu_data;
    CUstream io;
    /* The thread's (and, once it ended, release's): a GPU pool's answer buffers in pinned
     * memory (made at the first served read; pinned_tried once that was tried) and the
     * slots free among them. */
    uint8_t *pinned;
    int pinned_tried;
    uint32_t pinned_free[SERVER_PINNED_SLOTS];
    uint32_t npinned_free;
    int warned_emulated;
    /* The thread's: when the listener is watched again (0: it is), and whether accept's
     * failure was told. */
    uint64_t accept_paused;
    unsigned warned_accept;
    int inflight;          /* atomic: sends UCX has not completed yet */
    uint64_t served_bytes; /* atomic: bytes of read answers among them (headers included) */
    uint64_t *rank_served; /* atomic, by rank: the same, of each rank's connections */
};

/* epoll tags besides connection pointers (which are never this small). */
enum { TAG_LISTEN = 1, TAG_WAKE = 2, TAG_UCX = 3, TAG_NOTIFY_BIT = 1 };

/* ---- small helpers -------------------------------------------------------------------------- */

static void count_refused(ferry__remote_server *s, int reason)
{
    pthread_mutex_lock(&s->lock);
    s->counts.refused++;
    s->counts.refused_by[reason]++;
    pthread_mutex_unlock(&s->lock);
}

static void count_add(ferry__remote_server *s, uint64_t *field, int64_t delta)
{
    pthread_mutex_lock(&s->lock);
    *field += (uint64_t)delta;
    pthread_mutex_unlock(&s->lock);
}

static int epoll_add(int epfd, int fd, uint64_t tag, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.u64 = tag};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

/* Keepalive on a connection: a peer that falls silent (host down, link cut) is declared gone
 * within about timeout_ns, also while nothing is being sent. */
static void set_keepalive(int fd, uint64_t timeout_ns)
{
    int one = 1;
    unsigned ms = (unsigned)(timeout_ns / 1000000ull);
    int idle = ms >= 5000 ? (int)(ms / 5000) : 1;
    int count = (int)((ms / 1000 > (unsigned)idle ? ms / 1000 - (unsigned)idle : 1));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Writes all of buf to a non-blocking socket before deadline; 0 on success. */
static int write_all(int fd, const uint8_t *buf, size_t n, uint64_t deadline)
{
    while (n) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
        if (w > 0) {
            buf += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        uint64_t now = ferry__now_ns();
        if (now >= deadline)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
    }
    return 0;
}

/* ---- the listener and the address ------------------------------------------------------------ */

/* Splits "HOST:PORT" / "[HOST]:PORT" (port may be 0). */
static ferry_status split_listen(const char *listen, char *host, size_t host_size, char *port,
                                 size_t port_size)
{
    const char *colon = strrchr(listen, ':');
    const char *h = listen;
    size_t hn;
    if (listen[0] == '[') {
        const char *close = strchr(listen, ']');
        if (!close || close[1] != ':')
            colon = NULL;
        h = listen + 1;
        hn = close ? (size_t)(close - h) : 0;
    } else {
        hn = colon ? (size_t)(colon - listen) : 0;
    }
    if (!colon || hn == 0 || hn >= host_size || !colon[1] || strlen(colon + 1) >= port_size ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "listen address '%.100s' is not HOST:PORT (port 0: any free port)",
                           listen);
    memcpy(host, h, hn);
    host[hn] = '\0';
    snprintf(port, port_size, "%s", colon + 1);
    return FERRY_OK;
}

static ferry_status bind_listener(const char *host, const char *port, int *out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "listen address %s:%s: %s", host, port,
                           gai_strerror(rc));
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
                        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0)) {
            err = errno;
            close(fd);
            fd = -1;
        } else if (fd < 0) {
            err = errno;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return ferry__fail_errno(FERRY_SYSTEM, err, "listening on %s:%s failed", host, port);
    *out = fd;
    return FERRY_OK;
}

static int wildcard(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || strcmp(host, "*") == 0;
}

/* A host name consumers can reach a wildcard listener at: the first address of an interface
 * that is up and not loopback (IPv4 first), else loopback. */
static void reachable_host(int family, char *buf, size_t size)
{
    struct ifaddrs *ifs = NULL, *pick = NULL;
    snprintf(buf, size, family == AF_INET6 ? "::1" : "127.0.0.1");
    if (getifaddrs(&ifs) != 0)
        return;
    for (int pass = 0; pass < 2 && !pick; pass++) {
        int want = pass == 0 ? AF_INET : AF_INET6;
        if (family == AF_INET && want == AF_INET6)
            break;
        for (struct ifaddrs *i = ifs; i && !pick; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == want && !(i->ifa_flags & 0x8 /*LOOPBACK*/))
                pick = i;
    }
    if (pick) {
        void *a = pick->ifa_addr->sa_family == AF_INET
                      ? (void *)&((struct sockaddr_in *)pick->ifa_addr)->sin_addr
                      : (void *)&((struct sockaddr_in6 *)pick->ifa_addr)->sin6_addr;
        inet_ntop(pick->ifa_addr->sa_family, a, buf, (socklen_t)size);
    }
    freeifaddrs(ifs);
}

static void make_address(ferry__remote_server *s, const char *host)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    ferry__remote_address a;
    memset(&a, 0, sizeof(a));
    getsockname(s->listen_fd, (struct sockaddr *)&ss, &len);
    a.port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    if (wildcard(host))
        reachable_host(ss.ss_family, a.host, sizeof(a.host));
    else
        snprintf(a.host, sizeof(a.host), "%s", host);
    memcpy(a.pool_id, s->cfg.pool_id, 16);
    memcpy(a.secret, s->secret, 16);
    ferry__remote_format(&a, s->address, sizeof(s->address));
}

/* ---- UCX: memory, endpoints, active messages --------------------------------------------------
 */

static ferry_status map_region(ferry__remote_server *s, int i)
{
    const ferry__ucx *u = s->node.ucx;
    const ferry__remote_region *r = &s->cfg.region[i];
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = r->base,
        .length = r->size,
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_READ,
        .memory_type = r->gpu ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
    };
    ucs_status_t rc = u->ucp_mem_map(s->node.context, &mp, &s->memh[i]);
    if (rc != UCS_OK) {
        s->memh[i] = NULL;
        ferry__ucx_fail(u, "ucp_mem_map", rc);
        return ferry__fail_wrap(FERRY_SYSTEM,
                                "%s: registering its %s memory (%llu bytes) with "
                                "UCX failed",
                                s->label, r->gpu ? "GPU" : "host", (unsigned long long)r->size);
    }
    rc = u->ucp_rkey_pack(s->node.context, s->memh[i], &s->rkey[i], &s->rkey_len[i]);
    if (rc != UCS_OK) {
        s->rkey[i] = NULL;
        return ferry__ucx_fail(u, "ucp_rkey_pack", rc);
    }
    if (s->rkey_len[i] == 0 || s->rkey_len[i] > FERRY_REMOTE_MAX_BLOB)
        return ferry__fail(FERRY_SYSTEM, "%s: UCX packed a remote key of %zu bytes", s->label,
                           s->rkey_len[i]);
    return FERRY_OK;
}

static void unmap_regions(ferry__remote_server *s)
{
    const ferry__ucx *u = s->node.ucx;
    for (int i = 0; i < 2; i++) {
        if (s->rkey[i])
            u->ucp_rkey_buffer_release(s->rkey[i]);
        if (s->memh[i])
            u->ucp_mem_unmap(s->node.context, s->memh[i]);
        s->rkey[i] = NULL;
        s->memh[i] = NULL;
    }
}

/* Waits for a UCX request the thread made (progressing the worker). */
static ucs_status_t wait_request(ferry__remote_server *s, void *req)
{
    const ferry__ucx *u = s->node.ucx;
    if (req == NULL)
        return UCS_OK;
    if (FERRY_UCS_PTR_IS_ERR(req))
        return FERRY_UCS_PTR_STATUS(req);
    ucs_status_t st;
    while ((st = u->ucp_request_check_status(req)) == UCS_INPROGRESS)
        u->ucp_worker_progress(s->node.worker);
    u->ucp_request_free(req);
    return st;
}

static void close_ep(ferry__remote_server *s, ucp_ep_h ep)
{
    if (!ep)
        return;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    wait_request(s, s->node.ucx->ucp_ep_close_nbx(ep, &p));
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    conn *c = arg;
    c->failed = 1; /* the thread detaches it after this round of progress */
}

/* A send's buffer: freed with the request when UCX completes it (or at once when the send
 * completed in the call). */
typedef struct am_buf {
    ferry__remote_server *server;
    uint64_t served;      /* bytes of a read's answer it is (header included); 0: not one */
    uint64_t *rank_count; /* where they count for their rank (the server's, not a conn's) */
    int32_t slot;         /* its slot of the server's pinned buffers; -1: malloc'd */
    uint8_t bytes[];
} am_buf;

/* Room for an answer of a whole piece, header included, in the pinned buffers (mapped on
 * their own, and not into a forked child: the child has none to release). */
#define SERVER_PINNED_STRIDE                                                                       \
    ((sizeof(am_buf) + FERRY_AM_HEADER + FERRY_REMOTE_READ_PIECE + 4095u) & ~(size_t)4095u)
#define SERVER_PINNED_SIZE ((size_t)SERVER_PINNED_SLOTS * SERVER_PINNED_STRIDE)

static void am_buf_free(am_buf *b)
{
    ferry__remote_server *s = b->server;
    if (b->slot >= 0)
        s->pinned_free[s->npinned_free++] = (uint32_t)b->slot;
    else
        free(b);
}

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    (void)status; /* a failed send fails its endpoint too: the error callback tells */
    am_buf *b = user_data;
    __atomic_fetch_sub(&b->server->inflight, 1, __ATOMIC_RELAXED);
    if (b->served) {
        __atomic_fetch_sub(&b->server->served_bytes, b->served, __ATOMIC_RELAXED);
        __atomic_fetch_sub(b->rank_count, b->served, __ATOMIC_RELAXED);
    }
    b->server->node.ucx->ucp_request_free(request);
    am_buf_free(b);
}

static am_buf *am_buf_init(am_buf *b, ferry__remote_server *s, int32_t slot)
{
    b->server = s;
    b->served = 0;
    b->rank_count = NULL;
    b->slot = slot;
    return b;
}

/* A send's buffer with room for the header and n bytes of payload; NULL without memory. */
static am_buf *am_buf_new(ferry__remote_server *s, size_t n)
{
    am_buf *b = malloc(sizeof(*b) + FERRY_AM_HEADER + n);
    return b ? am_buf_init(b, s, -1) : NULL;
}

/* The pinned buffers, made once: registered with the driver (portable: any context may
 * copy into them). 0 if they could not be: answers then go in malloc'd memory, which the
 * driver stages a copy into pageable memory through, one at a time. */
static int make_pinned(ferry__remote_server *s)
{
    if (s->pinned_tried)
        return s->pinned != NULL;
    s->pinned_tried = 1;
    const ferry__cuda *cuda;
    void *m = mmap(NULL, SERVER_PINNED_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    uint8_t *p = m == MAP_FAILED ? NULL : m;
    ferry_status st = FERRY_OK;
    if (!p)
        st = ferry__fail_errno(FERRY_NO_MEMORY, errno, "mmap of %zu bytes",
                               (size_t)SERVER_PINNED_SIZE);
    else if (madvise(p, SERVER_PINNED_SIZE, MADV_DONTFORK) != 0)
        st = ferry__fail_errno(FERRY_SYSTEM, errno, "madvise(MADV_DONTFORK)");
    else
        st = ferry__cuda_get(&cuda);
    if (st == FERRY_OK) {
        CUresult rc = cuda->cuMemHostRegister(p, SERVER_PINNED_SIZE, CU_MEMHOSTREGISTER_PORTABLE);
        if (rc != CUDA_SUCCESS)
            st = ferry__cuda_fail(cuda, "cuMemHostRegister", rc);
    }
    if (st != FERRY_OK) {
        if (p)
            munmap(p, SERVER_PINNED_SIZE);
        ferry__log(FERRY_LOG_INFO,
                   "%s: served reads copy out of device memory into pageable memory (pinned "
                   "buffers: %s)",
                   s->label, ferry_last_error());
        return 0;
    }
    s->pinned = p;
    for (uint32_t i = 0; i < SERVER_PINNED_SLOTS; i++)
        s->pinned_free[i] = SERVER_PINNED_SLOTS - 1 - i;
    s->npinned_free = SERVER_PINNED_SLOTS;
    return 1;
}

/* A buffer for an answer of n of the pool's bytes: a GPU pool's in pinned memory where a
 * buffer is free (the copy out of device memory then runs at the copy engine's speed, and
 * several run at once), else malloc'd; NULL without memory. */
static am_buf *answer_buf_new(ferry__remote_server *s, size_t n)
{
    if (!s->gpu_data || n > FERRY_REMOTE_READ_PIECE || !make_pinned(s) || !s->npinned_free)
        return am_buf_new(s, n);
    uint32_t slot = s->pinned_free[--s->npinned_free];
    return am_buf_init((am_buf *)(s->pinned + (size_t)slot * SERVER_PINNED_STRIDE), s,
                       (int32_t)slot);
}

/* Sends one active message: m's header and the n bytes of payload already in b (which UCX
 * owns from here: freed when the send completes, or at once). */
static int am_send(ferry__remote_server *s, conn *c, const ferry__am *m, am_buf *b, size_t n)
{
    const ferry__ucx *u = s->node.ucx;
    ferry__am_encode(m, b->bytes);
    ucp_request_param_t p = ferry__ucx_am_param();
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = on_sent;
    p.user_data = b;
    void *req = u->ucp_am_send_nbx(c->ep, FERRY_AM_ID, b->bytes, FERRY_AM_HEADER,
                                   b->bytes + FERRY_AM_HEADER, n, &p);
    if (req == NULL || FERRY_UCS_PTR_IS_ERR(req)) {
        am_buf_free(b);
        return req == NULL ? 0 : -1;
    }
    __atomic_fetch_add(&s->inflight, 1, __ATOMIC_RELAXED); /* on_sent frees it */
    if (b->served) {
        __atomic_fetch_add(&s->served_bytes, b->served, __ATOMIC_RELAXED);
        __atomic_fetch_add(b->rank_count, b->served, __ATOMIC_RELAXED);
    }
    return 0;
}

static conn *admitted(ferry__remote_server *s, uint32_t id, uint64_t token)
{
    uint32_t rank = id & 0xffffu;
    if (rank >= s->cfg.consumers)
        return NULL;
    conn *c = s->by_rank[rank];
    if (!c || c->id != id ||
        ferry__secret_differs((const uint8_t *)&c->token, (const uint8_t *)&token, sizeof(token)))
        return NULL;
    return c;
}

static void forward(ferry__remote_server *s, conn *c);

static void on_info(ferry__remote_server *s, conn *c, const ferry__am *m, const char *text,
                    size_t n)
{
    char path[FERRY_AM_MAX_INFO + 1];
    size_t k = 0;
    for (size_t i = 0; i < n && k < FERRY_AM_MAX_INFO; i++)
        path[k++] = text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
    path[k] = '\0';
    c->hold = (m->flags & FERRY_AM_INFO_HOLD) != 0;
    if (!(m->flags & FERRY_AM_INFO_EMULATED) || c->emulated)
        return;
    c->emulated = 1;
    count_add(s, &s->counts.emulated, 1);
    if (!__atomic_exchange_n(&s->warned_emulated, 1, __ATOMIC_RELAXED))
        ferry__log(FERRY_LOG_WARN,
                   "%s: remote rank %u (host %s, pid %d) reads the pool %s: every read is served "
                   "by the producer's thread (counted in remote_emulated; warned once)",
                   s->label, c->rank, c->host, (int)c->pid, path);
}

/* The connection's own acknowledgements of count leases (payload: slot, generation each),
 * each as an ACK of the connection's rank alone; a message naming a slot out of range is
 * dropped whole. */
static void on_acks(ferry__remote_server *s, conn *c, uint32_t count, const uint8_t *payload)
{
    for (uint32_t i = 0; i < count; i++)
        if (ferry__get_le32(payload + 8 * i) >= s->cfg.max_inflight) {
            count_add(s, &s->counts.bad_messages, 1);
            return;
        }
    count_add(s, &s->counts.ack_messages, 1);
    for (uint32_t i = 0; i < count; i++)
        s->cfg.hooks.ack(s->cfg.hooks.user, ferry__get_le32(payload + 8 * i),
                         ferry__get_le32(payload + 8 * i + 4), c->rank, 1, 0, c->rank, c->id);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_len, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    ferry__remote_server *s = arg;
    ferry__am m;
    conn *c = NULL;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        ferry__am_decode(header, header_len, len, &m) != FERRY_OK || m.type == FERRY_AM_DESC ||
        m.type == FERRY_AM_DATA || m.type == FERRY_AM_REVOKE ||
        !(c = admitted(s, m.conn_id, m.token))) {
        count_add(s, &s->counts.bad_messages, 1);
        return UCS_OK;
    }
    switch (m.type) {
    case FERRY_AM_ACK:
        if (m.u.ack.slot < s->cfg.max_inflight && m.u.ack.count &&
            m.u.ack.first < s->cfg.consumers && m.u.ack.count <= s->cfg.consumers - m.u.ack.first) {
            count_add(s, &s->counts.ack_messages, 1);
            s->cfg.hooks.ack(s->cfg.hooks.user, m.u.ack.slot, m.u.ack.generation, m.u.ack.first,
                             m.u.ack.count, m.flags & FERRY_AM_ACK_PARTIAL, c->rank, c->id);
        } else {
            count_add(s, &s->counts.bad_messages, 1);
        }
        break;
    case FERRY_AM_ACKS:
        on_acks(s, c, m.u.acks.count, data);
        break;
    case FERRY_AM_TAKEN:
        /* The consumer can only have taken what was sent: a count beyond that is a lie. */
        if (m.u.taken.taken - c->taken <= c->sent - c->taken)
            c->taken = m.u.taken.taken;
        else
            count_add(s, &s->counts.bad_messages, 1);
        break;
    case FERRY_AM_INFO:
        on_info(s, c, &m, data, len);
        break;
    case FERRY_AM_RELEASED:
        if (m.u.hold.slot < s->cfg.max_inflight) {
            count_add(s, &s->counts.released, 1);
            s->cfg.hooks.release(s->cfg.hooks.user, m.u.hold.slot, m.u.hold.generation, c->rank,
                                 c->id);
        } else {
            count_add(s, &s->counts.bad_messages, 1);
        }
        break;
    case FERRY_AM_READ:
        /* Only the pool's own bytes are served (inline_data or gpu_data), and only as many
         * requests as a consumer asks at once are kept. */
        if ((s->inline_data || s->gpu_data) && m.u.read.slot < s->cfg.max_inflight &&
            c->nreads < SERVER_READS_QUEUED) {
            read_req *r = &c->reads[c->nreads++];
            *r = (read_req){m.u.read.slot, m.u.read.generation, m.u.read.id, m.u.read.length,
                            ferry__get_le64(data)};
        } else {
            count_add(s, &s->counts.bad_messages, 1);
        }
        break;
    default:
        break;
    }
    return UCS_OK;
}

/* ---- forwarding a rank's ring -----------------------------------------------------------------
 */

static ferry__ring *ring_of(ferry__remote_server *s, uint32_t rank)
{
    return (ferry__ring *)(s->cfg.rings + (uint64_t)rank * s->cfg.ring_stride);
}

/* The lease at a ring's head, as the pool described it. */
typedef struct lease_at {
    int ready; /* it may be forwarded now */
    uint32_t slot, generation;
    uint64_t offset, length; /* its extent */
} lease_at;

/* What a look at a rank's ring asks the pool of the lease at head (ferry__ring_reader's
 * current): whether it is still the rank's, with its state in *l. */
typedef struct lease_look {
    ferry__remote_server *s;
    conn *c;
    lease_at *l;
} lease_look;

static int lease_current(void *arg, const ferry_descriptor *d)
{
    lease_look *look = arg;
    lease_at *l = look->l;
    ferry__remote_server *s = look->s;
    if (d->flags & FERRY_DESC_FLAG_POOL_ONLY)
        return 0;
    l->slot = d->slot;
    l->generation = d->generation;
    return s->cfg.hooks.lease(s->cfg.hooks.user, d->slot, d->generation, look->c->rank, &l->ready,
                              &l->offset, &l->length) == FERRY_OK;
}

void (*ferry__remote_test_before_copy)(uint32_t slot, uint32_t generation);

/* Reads n bytes of the pool's host memory as a local consumer's copy does, with relaxed
 * loads (the producer's threads may be writing a recycled slice meanwhile: the generation
 * check after the copy tells). Slices start 256-aligned. */
static void copy_relaxed(uint8_t *dst, const uint8_t *src, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = ferry__load_relaxed64((const uint64_t *)(src + i));
        memcpy(dst + i, &v, 8);
    }
    for (; i < n; i++)
        dst[i] = __atomic_load_n(src + i, __ATOMIC_RELAXED);
}

/* Copies a small lease's bytes into its DESC (out): 1 if they are the lease's. The lease was
 * current and ready when look_at asked the pool (under its lock, after the ready word's
 * acquire); the copy is kept only if the slot's generation still holds it afterwards, read
 * as a local reader's re-check reads it (ferry__shm_generation_recheck: every load of the
 * copy before it). A slice freed meanwhile had its slot's generation set to
 * FERRY_GEN_OVER before any later lease's fence and bytes, and a cancelled lease carries the
 * cancelled mark: a copy that saw any byte of another lease sees the generation changed. */
static int copy_inline(ferry__remote_server *s, const lease_at *l, uint8_t *out)
{
    if (ferry__remote_test_before_copy)
        ferry__remote_test_before_copy(l->slot, l->generation);
    copy_relaxed(out, s->inline_data + l->offset, l->length);
    if (ferry__load_after_reads32(&s->generations[l->slot]) == l->generation)
        return 1;
    count_add(s, &s->counts.inline_stale, 1);
    return 0;
}

/* Sends a lease's DESC: its entries and, for a small lease (one descriptor, at most
 * FERRY_REMOTE_INLINE_MAX bytes) of a host pool, its bytes (without them if the lease moved
 * on while they were copied: the consumer's gets then find it STALE). */
static int send_desc(ferry__remote_server *s, conn *c, const lease_at *l, uint32_t k)
{
    size_t n = (size_t)k * FERRY_DESCRIPTOR_SIZE;
    int inl = s->inline_data && k == 1 && l->length && l->length <= FERRY_REMOTE_INLINE_MAX;
    am_buf *b = am_buf_new(s, n + (inl ? l->length : 0));
    if (!b)
        return -1;
    for (uint32_t i = 0; i < k; i++)
        if (ferry_descriptor_encode(&s->descs[i], b->bytes + FERRY_AM_HEADER +
                                                      (size_t)i * FERRY_DESCRIPTOR_SIZE) !=
            FERRY_OK) {
            am_buf_free(b);
            return -1;
        }
    ferry__am m = {.type = FERRY_AM_DESC,
                   .conn_id = c->id,
                   .token = c->token,
                   .u.desc = {l->offset, l->length}};
    /* Held before it goes: the consumer may read it without a check from the moment it
     * comes. */
    if (c->hold && s->cfg.hooks.hold(s->cfg.hooks.user, l->slot, l->generation, c->rank, c->id))
        m.flags |= FERRY_AM_DESC_HELD;
    if (inl && copy_inline(s, l, b->bytes + FERRY_AM_HEADER + n)) {
        m.flags |= FERRY_AM_DESC_INLINE;
        n += l->length;
        count_add(s, &s->counts.inlined, 1);
    }
    return am_send(s, c, &m, b, n);
}

/* A read's answer while it is made (serve_reads): its header, buffer and payload's size;
 * bytes: the payload is the lease's bytes (else its extent, or nothing); copying: they are
 * being copied out of device memory on io. */
typedef struct answer {
    ferry__am m;
    am_buf *b;
    size_t n;
    int bytes, copying;
    const read_req *r;
} answer;

/* Logs a failed copy out of a GPU pool (the first of each connection); the read is answered
 * FAILED and ends DRIVER at the consumer. */
static void copy_failed(ferry__remote_server *s, conn *c)
{
    if (c->warned_copy)
        return;
    c->warned_copy = 1;
    ferry__log(FERRY_LOG_WARN, "%s: a read of remote rank %u failed: the copy out of the pool: %s",
               s->label, c->rank, ferry_last_error());
}

/* Starts copying n bytes of a GPU pool's data at offset into dst on the thread's own stream,
 * in the pool's device context (current on this thread); waited for by serve_reads. */
static ferry_status copy_from_gpu(ferry__remote_server *s, void *dst, uint64_t offset, uint64_t n)
{
    const ferry__cuda *cuda;
    ferry_status st = ferry__cuda_get(&cuda);
    if (st == FERRY_OK && !s->io)
        st = ferry__cuda_io_stream(cuda, &s->io);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(cuda, cuMemcpyAsync,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)(s->gpu_data + offset), n,
                  s->io));
    return FERRY_OK;
}

/* Begins the answer to one read request: the lease must be the rank's and ready (the pool
 * says, under its lock, after the ready word's acquire) and the range inside its extent; a
 * host pool's bytes are copied, a GPU pool's copy is started (answer_end checks them). A
 * request of no bytes is answered with the lease's extent. 0 if it is answered nothing: a
 * closing pool answers nothing (the consumer hears its connection end: PRODUCER_GONE), and a
 * request beyond its rank's budget (what UCX has not sent yet, and the answers before it in
 * this round, ahead) is counted as a bad message (its consumer asks far beyond its window,
 * or takes none of its answers); bytes beyond the server's budget, or without memory, are
 * answered BUSY. */
static int answer_begin(ferry__remote_server *s, conn *c, const read_req *r, uint64_t ahead,
                        answer *a)
{
    *a = (answer){.m = {.type = FERRY_AM_DATA,
                        .conn_id = c->id,
                        .token = c->token,
                        .u.data = {.id = r->id, .status = FERRY_AM_DATA_OK}},
                  .r = r};
    int ready = 0;
    uint64_t off = 0, len = 0;
    ferry_status ls =
        s->cfg.hooks.lease(s->cfg.hooks.user, r->slot, r->generation, c->rank, &ready, &off, &len);
    if (ls == FERRY_CLOSING)
        return 0;
    int inside = ferry__range_inside(r->offset, r->length, off, len);
    if (ls != FERRY_OK) {
        a->m.u.data.status = FERRY_AM_DATA_STALE;
    } else if (!ready) {
        a->m.u.data.status = FERRY_AM_DATA_NOT_READY;
    } else if (!inside || !r->length) {
        a->m.u.data.status = inside ? FERRY_AM_DATA_OK : FERRY_AM_DATA_OUTSIDE;
        a->m.flags = FERRY_AM_DATA_EXTENT;
        a->n = 16;
    } else {
        a->n = r->length;
        a->bytes = 1;
    }
    if (__atomic_load_n(&s->rank_served[c->rank], __ATOMIC_RELAXED) + ahead + FERRY_AM_HEADER +
            a->n >
        SERVER_SERVED_RANK_MAX) {
        count_add(s, &s->counts.bad_messages, 1);
        return 0;
    }
    if (!a->bytes || __atomic_load_n(&s->served_bytes, __ATOMIC_RELAXED) + ahead +
                             FERRY_AM_HEADER + a->n <=
                         SERVER_SERVED_MAX)
        a->b = a->bytes ? answer_buf_new(s, a->n) : am_buf_new(s, a->n);
    if (!a->b && a->bytes) { /* no room, or no memory, for the bytes: asked again */
        a->m.u.data.status = FERRY_AM_DATA_BUSY;
        a->n = 0;
        a->bytes = 0;
        a->b = am_buf_new(s, 0);
    }
    if (!a->b)
        return 0; /* not even a header: unanswered, the consumer takes the producer for gone */
    uint8_t *payload = a->b->bytes + FERRY_AM_HEADER;
    if (a->m.flags == FERRY_AM_DATA_EXTENT) {
        ferry__put_le64(payload, off);
        ferry__put_le64(payload + 8, len);
    }
    if (a->bytes) {
        if (ferry__remote_test_before_copy)
            ferry__remote_test_before_copy(r->slot, r->generation);
        if (!s->gpu_data) {
            copy_relaxed(payload, s->inline_data + r->offset, r->length);
        } else if (copy_from_gpu(s, payload, r->offset, r->length) == FERRY_OK) {
            a->copying = 1;
        } else {
            copy_failed(s, c);
            a->m.u.data.status = FERRY_AM_DATA_FAILED;
            a->n = 0;
            a->bytes = 0;
        }
    }
    return 1;
}

/* Ends an answer and sends it: its bytes (copied, and a GPU pool's copy waited for; failed:
 * FAILED) are kept only if the slot's generation still holds the lease afterwards, as
 * copy_inline keeps a DESC's. */
static void answer_end(ferry__remote_server *s, conn *c, answer *a, int failed)
{
    const read_req *r = a->r;
    if (a->bytes && failed) {
        a->m.u.data.status = FERRY_AM_DATA_FAILED;
        a->n = 0;
    } else if (a->bytes && ferry__load_after_reads32(&s->generations[r->slot]) != r->generation) {
        a->m.u.data.status = FERRY_AM_DATA_STALE;
        a->n = 0;
        count_add(s, &s->counts.served_stale, 1);
    }
    if (a->m.u.data.status == FERRY_AM_DATA_STALE)
        a->m.u.data.value = __atomic_load_n(&s->generations[r->slot], __ATOMIC_ACQUIRE);
    a->b->served = FERRY_AM_HEADER + a->n;
    a->b->rank_count = &s->rank_served[c->rank];
    count_add(s, &s->counts.served, 1); /* before the consumer can hear it */
    if (am_send(s, c, &a->m, a->b, a->n) != 0)
        c->failed = 1;
}

/* Answers the read requests queued in this round's progress, in order; a connection that
 * ended (its consumer left) is answered nothing. A GPU pool's copies are all started first
 * and waited for once: into pinned buffers they run one after another on the copy engine
 * while nothing waits for each. */
static void serve_reads(ferry__remote_server *s, conn *c)
{
    answer a[SERVER_READS_QUEUED];
    uint32_t k = 0;
    uint64_t ahead = 0;
    int copies = 0;
    for (uint32_t i = 0; i < c->nreads && !c->failed && !c->leaving; i++)
        if (answer_begin(s, c, &c->reads[i], ahead, &a[k])) {
            ahead += FERRY_AM_HEADER + a[k].n;
            copies += a[k++].copying;
        }
    c->nreads = 0;
    int failed = 0;
    const ferry__cuda *cuda;
    if (copies) {
        CUresult rc = CUDA_SUCCESS;
        if (ferry__cuda_get(&cuda) != FERRY_OK ||
            (rc = cuda->cuStreamSynchronize(s->io)) != CUDA_SUCCESS) {
            if (rc != CUDA_SUCCESS)
                ferry__cuda_fail(cuda, "cuStreamSynchronize", rc);
            copy_failed(s, c);
            failed = 1;
        }
    }
    for (uint32_t i = 0; i < k; i++) {
        if (c->failed)
            am_buf_free(a[i].b); /* a send failed: the endpoint goes, and its answers */
        else
            answer_end(s, c, &a[i], failed && a[i].copying);
    }
}

/* Asks the consumer to let go of the held leases the pool wants back (FERRY_AM_REVOKE): sent
 * after the DESCs of the same leases, on the same endpoint. */
static void send_revokes(ferry__remote_server *s, conn *c)
{
    uint32_t got[32][2], n;
    while (!c->failed && !c->leaving &&
           (n = s->cfg.hooks.revokes(s->cfg.hooks.user, c->rank, c->id, got, 32)) > 0) {
        for (uint32_t i = 0; i < n && !c->failed; i++) {
            am_buf *b = am_buf_new(s, 0);
            ferry__am m = {.type = FERRY_AM_REVOKE,
                           .conn_id = c->id,
                           .token = c->token,
                           .u.hold = {got[i][0], got[i][1]}};
            if (!b || am_send(s, c, &m, b, 0) != 0) {
                c->failed = 1; /* unasked, its holds lapse when it is dropped */
                break;
            }
            count_add(s, &s->counts.revoked, 1);
        }
    }
}

/* Sends what the rank's ring holds, as far as the consumer's window and readiness allow. The
 * ring is read as a local receiver reads it (shm/ring.c): the lease at head is looked at,
 * checked and, once forwarded, taken. */
static void forward(ferry__remote_server *s, conn *c)
{
    static const uint32_t never = 0; /* the pool's closing ends this thread instead */
    ferry__ring *ring = ring_of(s, c->rank);
    uint32_t depth = s->cfg.ring_depth;
    lease_at l;
    lease_look look = {s, c, &l};
    ferry__ring_reader r = {.ring = ring,
                            .depth = depth,
                            .rank = c->rank,
                            .pool_id = s->cfg.pool_id,
                            .max_inflight = s->cfg.max_inflight,
                            .current = lease_current,
                            .arg = &look};
    c->not_ready = 0;
    while (!c->failed && !c->leaving) {
        size_t k;
        uint32_t head, before = ferry__load_acquire32(&ring->head);
        int got = ferry__ring_peek(&r, s->descs, depth, &k, &head);
        if (got == FERRY__RING_EMPTY) {
            if (ferry__ring_arm(ring, &never))
                continue; /* entries came in meanwhile */
            break;
        }
        if (got != FERRY_OK) { /* a stray write into the ring */
            count_add(s, &s->counts.bad_messages, 1);
            if (ferry__load_acquire32(&ring->head) != before)
                continue;     /* what was malformed was taken off */
            c->not_ready = 1; /* a corrupt ring, until the producer mends it: look again soon */
            break;
        }
        if (!l.ready) {
            c->not_ready = 1;
            break;
        }
        if (depth - (c->sent - c->taken) < k)
            break; /* the consumer's window is full: its TAKEN opens it again */
        if (!ferry__ring_advance(ring, head, (uint32_t)k))
            continue;
        if (send_desc(s, c, &l, (uint32_t)k) != 0) {
            c->failed = 1;
            break;
        }
        c->sent += (uint32_t)k;
        count_add(s, &s->counts.forwarded, k);
    }
}

/* ---- connections ------------------------------------------------------------------------------
 */

static void conn_free(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->notify_fd >= 0)
        close(c->notify_fd);
    free(c->buf);
    free(c);
}

static void unlink_conn(ferry__remote_server *s, conn *c)
{
    for (conn **pp = &s->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            return;
        }
}

/* 1 if the consumer closed its end of the connection (EOF, seen before or now): it reads
 * nothing more (its process exited, or it closed the pool or gave it up), so its holds may
 * go at once. A connection that failed otherwise (a reset, which a box between the hosts may
 * send too, UCX's error, a keepalive timeout, a broken protocol) may have a live consumer
 * behind it, whose holds lapse a keepalive bound later. */
static int peer_closed(conn *c)
{
    uint8_t b;
    return c->closed || recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* A connection that is done: closed, its endpoint closed, its rank (if it held one) handed
 * back to the pool as dead. tell_pool is 0 when the whole server stops. */
static void drop_conn(ferry__remote_server *s, conn *c, int tell_pool)
{
    unlink_conn(s, c);
    if (c->state == CONN_HELLO) {
        s->pending--;
    } else {
        s->by_rank[c->rank] = NULL;
        /* Counted out before the pool hears it: whoever sees the rank dead (consumer_info,
         * its leases settled) sees it no longer connected. */
        count_add(s, &s->counts.connected, -1);
        if (c->emulated)
            count_add(s, &s->counts.emulated, -1);
        if (tell_pool) {
            s->cfg.hooks.notify(s->cfg.hooks.user, c->rank, -1);
            s->cfg.hooks.detach(s->cfg.hooks.user, c->rank, c->id, !peer_closed(c));
        }
        close_ep(s, c->ep);
    }
    /* Closing ends the socket only with its last reference, and a child this process forked
     * holds one until it execs or exits: the socket leaves the epoll first (an event would
     * name a connection freed here) and is shut down, so that the consumer hears the end
     * now. Not in conn_free: a forked child frees its copies with it. */
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    shutdown(c->fd, SHUT_RDWR);
    conn_free(c);
}

static void refuse(ferry__remote_server *s, conn *c, int reason, ferry_status status, uint32_t rank,
                   pid_t holder)
{
    uint8_t msg[FERRY_REFUSE_SIZE];
    ferry__refuse r = {.status = (uint32_t)status, .rank = rank, .holder_pid = (uint32_t)holder};
    /* The consumer hears only the status: the cause of an error of the producer's is told
     * here (what failed set it on this thread). */
    if (reason == FERRY_REMOTE_REFUSED_ERROR)
        ferry__log(FERRY_LOG_WARN, "%s: refused remote rank %u (host %s, pid %d): %s", s->label,
                   rank, c->host, (int)c->pid, ferry_last_error());
    /* Counted before the peer hears it: whoever was refused finds the refusal in the stats. */
    count_refused(s, reason);
    if (ferry__refuse_encode(&r, msg, sizeof(msg)) == FERRY_OK)
        write_all(c->fd, msg, sizeof(msg), ferry__now_ns() + 100000000ull);
}

static ferry_status make_ep(ferry__remote_server *s, conn *c, const ferry__hello *h)
{
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)h->worker,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {on_ep_error, c},
    };
    ferry_status st = ferry__ucx_fds_spare();
    if (st != FERRY_OK)
        return st;
    ucs_status_t rc = s->node.ucx->ucp_ep_create(s->node.worker, &ep, &c->ep);
    if (rc != UCS_OK) {
        c->ep = NULL;
        return ferry__ucx_fail(s->node.ucx, "ucp_ep_create", rc);
    }
    return FERRY_OK;
}

static ferry_status send_welcome(ferry__remote_server *s, conn *c)
{
    const ferry__remote_config *cfg = &s->cfg;
    ferry__welcome w = {
        .conn_id = c->id,
        .producer_pid = (uint32_t)getpid(),
        .token = c->token,
        .timeout_ms = (uint32_t)(cfg->timeout_ns / 1000000ull),
        .ring_depth = cfg->ring_depth,
        .flags = cfg->welcome_flags,
        .gen_offset = cfg->gen_offset,
        .extent_offset = cfg->extent_offset,
        .control_offset = cfg->control_offset,
        .data_offset = cfg->data_offset,
        .worker_len = (uint32_t)s->node.address_len,
        .worker = (const uint8_t *)s->node.address,
    };
    for (int i = 0; i < 2; i++) {
        w.region_addr[i] = (uint64_t)(uintptr_t)cfg->region[i].base;
        w.region_size[i] = cfg->region[i].size;
        w.rkey_len[i] = (uint32_t)s->rkey_len[i];
        w.rkey[i] = s->rkey[i];
    }
    memcpy(w.pool, cfg->pool_desc, FERRY_DESCRIPTOR_SIZE);
    size_t n = ferry__welcome_size(&w);
    uint8_t *msg = n ? malloc(n) : NULL;
    ferry_status st = msg ? ferry__welcome_encode(&w, msg, n)
                          : ferry__fail(FERRY_NO_MEMORY, "%s: no memory for a welcome", s->label);
    if (st == FERRY_OK && write_all(c->fd, msg, n, ferry__now_ns() + SERVER_HELLO_NS) != 0)
        st = ferry__fail_errno(FERRY_SYSTEM, errno, "%s: sending the welcome failed", s->label);
    free(msg);
    return st;
}

/* Gives the admitted rank a notify eventfd: the pool signals it when the ring gets entries. */
static ferry_status make_notify(ferry__remote_server *s, conn *c)
{
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int dup = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0 ||
        epoll_add(s->epoll_fd, fd, ((uint64_t)c->rank << 1) | TAG_NOTIFY_BIT, EPOLLIN) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        if (dup >= 0)
            close(dup);
        return ferry__fail_errno(FERRY_SYSTEM, err, "%s: a notify fd for rank %u", s->label,
                                 c->rank);
    }
    c->notify_fd = fd;
    s->cfg.hooks.notify(s->cfg.hooks.user, c->rank, dup); /* the pool owns dup from here */
    return FERRY_OK;
}

/* A whole HELLO arrived: admit or refuse. 0 if the connection stays (admitted). */
static int on_hello(ferry__remote_server *s, conn *c)
{
    ferry__hello h;
    pid_t holder = 0;
    if (ferry__hello_decode(c->buf, c->have, &h) != FERRY_OK) {
        count_refused(s, FERRY_REMOTE_REFUSED_MALFORMED);
        return -1;
    }
    int foreign = ferry__secret_differs(h.pool_id, s->cfg.pool_id, 16);
    if (ferry__secret_differs(h.secret, s->secret, 16) | foreign) {
        refuse(s, c, FERRY_REMOTE_REFUSED_SECRET, FERRY_PERMISSION, 0, 0);
        return -1;
    }
    if (h.rank == FERRY__RANK_NONE) {
        /* A consumer of this host asks which pool this is, to open it through its broker:
         * the welcome, which admits nothing (no connection id, no token, no endpoint), and
         * the connection ends. */
        c->id = 0;
        c->token = 0;
        count_add(s, &s->counts.described, 1);
        if (send_welcome(s, c) != FERRY_OK)
            ferry__log(FERRY_LOG_WARN, "%s; a pool's description was not sent", ferry_last_error());
        return -1;
    }
    if (h.rank >= s->cfg.consumers || s->by_rank[h.rank]) {
        refuse(s, c, FERRY_REMOTE_REFUSED_RANK,
               h.rank >= s->cfg.consumers ? FERRY_INVALID_ARGUMENT : FERRY_RANK_IN_USE, h.rank, 0);
        return -1;
    }
    c->id = h.rank | (++s->next_id << 16);
    c->rank = h.rank;
    c->pid = (pid_t)h.pid;
    memcpy(c->host, h.host, sizeof(c->host));
    ferry_status st = ferry__random_bytes(&c->token, sizeof(c->token)) == 0
                          ? make_ep(s, c, &h)
                          : ferry__fail_errno(FERRY_SYSTEM, errno, "getrandom failed");
    if (st != FERRY_OK) {
        refuse(s, c, FERRY_REMOTE_REFUSED_ERROR, st, h.rank, 0);
        return -1;
    }
    st = s->cfg.hooks.attach(s->cfg.hooks.user, h.rank, c->id, c->pid, c->host, &holder);
    if (st != FERRY_OK) {
        refuse(s, c,
               st == FERRY_RANK_IN_USE ? FERRY_REMOTE_REFUSED_RANK : FERRY_REMOTE_REFUSED_ERROR, st,
               h.rank, holder);
        close_ep(s, c->ep);
        c->ep = NULL;
        return -1;
    }
    /* From here the rank is the connection's: a failure hands it back as dead. */
    s->pending--;
    c->state = CONN_ADMITTED;
    s->by_rank[c->rank] = c;
    free(c->buf);
    c->buf = NULL;
    count_add(s, &s->counts.admitted, 1);
    count_add(s, &s->counts.connected, 1);
    if (make_notify(s, c) != FERRY_OK || send_welcome(s, c) != FERRY_OK) {
        ferry__log(FERRY_LOG_WARN, "%s; rank %u is released", ferry_last_error(), c->rank);
        return 1;
    }
    set_keepalive(c->fd, s->cfg.timeout_ns);
    forward(s, c);
    return 0;
}

/* An admitted consumer's connection ended (it closed, died, or its host fell silent). What
 * it sent over UCX before that (its last acknowledgements, maybe for other ranks too) may
 * still wait in the worker, unordered with the end of another connection: it is taken
 * first, and the consumer is dropped once its endpoint fails as well (its worker closed after
 * its last message) or SERVER_LEAVE_NS later. */
static void on_left(ferry__remote_server *s, conn *c)
{
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    while (s->node.ucx->ucp_worker_progress(s->node.worker)) {
    }
    if (c->failed)
        drop_conn(s, c, 1);
    else
        c->leaving = ferry__now_ns() + SERVER_LEAVE_NS;
}

/* 0 if the peer of a whole HELLO is still there, silent, waiting for the answer; otherwise
 * the connection is dropped. A peer that left already (a consumer that gave up while its
 * connection waited in the backlog, or died) is not admitted: its rank would be released as
 * dead at once, the leases queued for it acknowledged on behalf of nobody. */
static int still_there(ferry__remote_server *s, conn *c)
{
    uint8_t b;
    ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    count_refused(s, FERRY_REMOTE_REFUSED_MALFORMED); /* gone, or bytes after its hello */
    drop_conn(s, c, 0);
    return -1;
}

/* Bytes arrived on a connection waiting for its HELLO (or on an admitted one: EOF, an error,
 * or a byte it should not have sent). */
static void on_readable(ferry__remote_server *s, conn *c)
{
    if (c->state == CONN_ADMITTED) {
        uint8_t b;
        ssize_t n = recv(c->fd, &b, 1, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (n > 0) {
            count_add(s, &s->counts.bad_messages, 1);
            drop_conn(s, c, 1); /* talking out of turn */
        } else {
            c->closed = n == 0;
            on_left(s, c); /* EOF, reset, keepalive timeout */
        }
        return;
    }
    uint32_t type = 0, size = FERRY_REMOTE_HEADER;
    if (c->have >= FERRY_REMOTE_HEADER)
        ferry__remote_peek(c->buf, c->have, &type, &size); /* checked when the header came */
    ssize_t n = recv(c->fd, c->buf + c->have, size - c->have, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        count_refused(s, FERRY_REMOTE_REFUSED_MALFORMED); /* closed before a whole HELLO */
        drop_conn(s, c, 0);
        return;
    }
    c->have += (size_t)n;
    if (c->have < FERRY_REMOTE_HEADER)
        return;
    /* The header is judged the moment it is whole: a bad one is not waited on. */
    if (ferry__remote_peek(c->buf, c->have, &type, &size) != FERRY_OK ||
        type != FERRY_REMOTE_HELLO) {
        count_refused(s, FERRY_REMOTE_REFUSED_MALFORMED);
        drop_conn(s, c, 0);
        return;
    }
    if (c->have < size || still_there(s, c) != 0)
        return;
    int rc = on_hello(s, c);
    if (rc != 0)
        drop_conn(s, c, rc > 0);
}

/* Too many connections are waiting for their HELLO: this one is told to come back (a real
 * consumer asks again until its deadline; the silent ones make room at theirs). */
static void refuse_busy(ferry__remote_server *s, int fd)
{
    uint8_t msg[FERRY_REFUSE_SIZE];
    ferry__refuse r = {.status = FERRY_TIMEOUT, .rank = 0, .holder_pid = 0};
    count_refused(s, FERRY_REMOTE_REFUSED_FLOOD); /* before the peer hears it, as refuse() */
    if (ferry__refuse_encode(&r, msg, sizeof(msg)) == FERRY_OK &&
        send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
        /* a peer that cannot take 32 bytes now does not get them */
    }
    close(fd);
}

/* Watches the listener again (paused: 0) or leaves it alone for a while (1). */
static void listener_pause(ferry__remote_server *s, int paused)
{
    struct epoll_event ev = {.events = paused ? 0 : EPOLLIN, .data.u64 = TAG_LISTEN};
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_MOD, s->listen_fd, &ev) == 0)
        s->accept_paused = paused ? ferry__now_ns() + SERVER_ACCEPT_PAUSE_NS : 0;
}

static void on_accept(ferry__remote_server *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == ECONNABORTED)
            continue;
        if (fd < 0 && errno != EAGAIN && errno != EINTR) {
            /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog */
            if (!s->warned_accept++)
                ferry__log(FERRY_LOG_WARN,
                           "%s: accepting a remote consumer failed (%s): connections wait until "
                           "it can (warned once)",
                           s->label, strerror(errno));
            listener_pause(s, 1);
        }
        if (fd < 0)
            return;
        if (s->pending >= SERVER_MAX_PENDING) {
            refuse_busy(s, fd);
            continue;
        }
        conn *c = calloc(1, sizeof(*c));
        uint8_t *buf = c ? malloc(FERRY_REMOTE_MAX_MESSAGE) : NULL;
        if (!buf || epoll_add(s->epoll_fd, fd, (uint64_t)(uintptr_t)c, EPOLLIN | EPOLLRDHUP)) {
            count_refused(s, FERRY_REMOTE_REFUSED_ERROR);
            close(fd);
            free(buf);
            free(c);
            continue;
        }
        c->fd = fd;
        c->notify_fd = -1;
        c->buf = buf;
        c->state = CONN_HELLO;
        c->deadline = ferry__now_ns() + SERVER_HELLO_NS;
        c->next = s->conns;
        s->conns = c;
        s->pending++;
    }
}

/* ---- the thread ---------------------------------------------------------------------------------
 */

/* Drops silent and failed connections; returns how long the loop may sleep (ms, -1: until an
 * event). */
static int sweep(ferry__remote_server *s)
{
    uint64_t now = ferry__now_ns(), next = UINT64_MAX;
    conn *c = s->conns;
    while (c) {
        conn *n = c->next;
        if (c->state == CONN_HELLO && now >= c->deadline) {
            count_refused(s, FERRY_REMOTE_REFUSED_SILENT);
            drop_conn(s, c, 0);
        } else if (c->state == CONN_ADMITTED && (c->failed || (c->leaving && now >= c->leaving))) {
            drop_conn(s, c, 1);
        } else {
            if (c->state == CONN_HELLO && c->deadline < next)
                next = c->deadline;
            if (c->leaving && c->leaving < next)
                next = c->leaving;
            if (c->state == CONN_ADMITTED && c->not_ready)
                forward(s, c);
            if (c->state == CONN_ADMITTED && c->not_ready && now + SERVER_READY_POLL_NS < next)
                next = now + SERVER_READY_POLL_NS;
        }
        c = n;
    }
    if (s->accept_paused && now >= s->accept_paused)
        listener_pause(s, 0);
    if (s->accept_paused && s->accept_paused < next)
        next = s->accept_paused;
    /* Sends in flight may need the worker to push them out (a full socket). */
    if (__atomic_load_n(&s->inflight, __ATOMIC_RELAXED) && now + 1000000ull < next)
        next = now + 1000000ull;
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)((next - now + 999999ull) / 1000000ull);
}

static void on_event(ferry__remote_server *s, uint64_t tag)
{
    if (tag == TAG_LISTEN) {
        on_accept(s);
    } else if (tag == TAG_WAKE) {
        uint64_t v;
        while (read(s->wake_fd, &v, sizeof(v)) > 0) {
        }
    } else if (tag == TAG_UCX) {
        /* drained below, every round */
    } else if (tag & TAG_NOTIFY_BIT) {
        conn *c = s->by_rank[tag >> 1];
        uint64_t v;
        if (c) {
            while (read(c->notify_fd, &v, sizeof(v)) > 0) {
            }
            forward(s, c);
            send_revokes(s, c);
        }
    } else {
        on_readable(s, (conn *)(uintptr_t)tag);
    }
}

static void *server_main(void *arg)
{
    ferry__remote_server *s = arg;
    const ferry__cuda *cuda;
    /* Emulated gets of GPU memory are served here: the pool's device context is current. */
    if (s->cfg.device >= 0 && ferry__cuda_get(&cuda) == FERRY_OK)
        ferry__cuda_use_device(cuda, s->cfg.device);
    struct epoll_event ev[32];
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        /* Active messages (acknowledgements, TAKEN opening windows) and endpoint failures
         * first, then what they made possible; the worker is armed last, so that anything
         * arriving after this round wakes the epoll. */
        while (s->node.ucx->ucp_worker_progress(s->node.worker)) {
        }
        for (uint32_t r = 0; r < s->cfg.consumers; r++)
            if (s->by_rank[r] && !s->by_rank[r]->failed) {
                serve_reads(s, s->by_rank[r]);
                forward(s, s->by_rank[r]);
                send_revokes(s, s->by_rank[r]);
            }
        int timeout = sweep(s);
        /* Requests that came in while sweep progressed the worker (closing an endpoint) are
         * answered in the next round, not after the next event. */
        for (uint32_t r = 0; r < s->cfg.consumers && timeout != 0; r++)
            if (s->by_rank[r] && s->by_rank[r]->nreads)
                timeout = 0;
        if (s->node.ucx->ucp_worker_arm(s->node.worker) == UCS_ERR_BUSY)
            continue;
        int n = epoll_wait(s->epoll_fd, ev, 32, timeout);
        for (int i = 0; i < n; i++)
            on_event(s, ev[i].data.u64);
    }
    while (s->conns)
        drop_conn(s, s->conns, 0);
    if (s->io && ferry__cuda_get(&cuda) == FERRY_OK)
        cuda->cuStreamDestroy(s->io);
    return NULL;
}

/* ---- start and stop
 * ------------------------------------------------------------------------------ */

static ferry_status open_fds(ferry__remote_server *s, const char *host, const char *port)
{
    ferry_status st = bind_listener(host, port, &s->listen_fd);
    if (st != FERRY_OK)
        return st;
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->epoll_fd < 0 || s->wake_fd < 0 ||
        epoll_add(s->epoll_fd, s->listen_fd, TAG_LISTEN, EPOLLIN) != 0 ||
        epoll_add(s->epoll_fd, s->wake_fd, TAG_WAKE, EPOLLIN) != 0 ||
        epoll_add(s->epoll_fd, s->node.efd, TAG_UCX, EPOLLIN) != 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "%s: the remote server's event loop",
                                 s->label);
    return FERRY_OK;
}

/* An active message of another id than ferry's: dropped, counted. */
static ucs_status_t on_other_am(void *arg, const void *header, size_t header_len, void *data,
                                size_t len, const ucp_am_recv_param_t *param)
{
    (void)header, (void)header_len, (void)data, (void)len, (void)param;
    ferry__remote_server *s = arg;
    count_add(s, &s->counts.bad_messages, 1);
    return UCS_OK;
}

static ferry_status set_am_handler(ferry__remote_server *s)
{
    return ferry__ucx_node_handlers(&s->node, FERRY_AM_ID, on_am, on_other_am, s);
}

/* The pinned answer buffers, once UCX is done with them (its worker closed): unregistered
 * in the pool's context, then unmapped; kept if they cannot be unregistered (pages the
 * driver still takes for pinned are not handed back). */
static void free_pinned(ferry__remote_server *s)
{
    const ferry__cuda *cuda;
    if (s->pinned && ferry__cuda_get(&cuda) == FERRY_OK &&
        ferry__cuda_use_device(cuda, s->cfg.device) == FERRY_OK &&
        cuda->cuMemHostUnregister(s->pinned) == CUDA_SUCCESS)
        munmap(s->pinned, SERVER_PINNED_SIZE);
    s->pinned = NULL;
}

static void release(ferry__remote_server *s)
{
    if (s->node.ucx)
        unmap_regions(s);
    ferry__ucx_node_close(&s->node);
    free_pinned(s);
    if (s->listen_fd >= 0) {
        shutdown(s->listen_fd, SHUT_RDWR); /* no longer listening, whoever holds a copy */
        close(s->listen_fd);
    }
    if (s->epoll_fd >= 0)
        close(s->epoll_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    pthread_mutex_destroy(&s->lock);
    free(s->descs);
    free(s->by_rank);
    free(s->rank_served);
    free(s);
}

static ferry_status start_steps(ferry__remote_server *s)
{
    char host[256], port[16];
    ferry_status st = split_listen(s->cfg.listen, host, sizeof(host), port, sizeof(port));
    if (st == FERRY_OK && ferry__random_bytes(s->secret, sizeof(s->secret)) != 0)
        st = ferry__fail_errno(FERRY_SYSTEM, errno, "getrandom failed");
    if (st == FERRY_OK)
        st = ferry__ucx_node_open(&s->node, "ferry-producer");
    if (st == FERRY_OK && s->cfg.device >= 0) {
        const ferry__cuda *cuda;
        st = ferry__cuda_get(&cuda);
        if (st == FERRY_OK)
            st = ferry__cuda_use_device(cuda, s->cfg.device);
    }
    for (int i = 0; i < 2 && st == FERRY_OK; i++)
        if (s->cfg.region[i].size)
            st = map_region(s, i);
    if (st == FERRY_OK)
        st = set_am_handler(s);
    if (st == FERRY_OK)
        st = open_fds(s, host, port);
    if (st == FERRY_OK)
        make_address(s, host);
    return st;
}

/* Where the thread finds the generations, and the data it serves: a host pool's in its
 * shared segment (region 1), host memory mapped in this process, whose small leases also
 * travel inline; a GPU pool's in region 2, device memory of cfg.device, never inline. */
static void data_source(ferry__remote_server *s)
{
    const ferry__remote_config *cfg = &s->cfg;
    uint8_t *segment = cfg->region[0].base;
    s->generations = (uint32_t *)(segment + cfg->gen_offset);
    if (!(cfg->welcome_flags & FERRY_WELCOME_DATA_IN_POOL) && !cfg->region[0].gpu)
        s->inline_data = segment + cfg->data_offset;
    else if ((cfg->welcome_flags & FERRY_WELCOME_DATA_IN_POOL) && cfg->region[1].gpu &&
             cfg->device >= 0)
        s->gpu_data = (const uint8_t *)cfg->region[1].base + cfg->data_offset;
}

ferry_status ferry__remote_start(const ferry__remote_config *config, ferry__remote_server **out)
{
    ferry__remote_server *s = calloc(1, sizeof(*s));
    if (!s)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory for the remote server");
    s->cfg = *config;
    s->cfg.listen = NULL;
    s->listen_fd = s->epoll_fd = s->wake_fd = -1;
    s->owner = ferry__proc_self();
    snprintf(s->label, sizeof(s->label), "%s", config->label);
    pthread_mutex_init(&s->lock, NULL);
    s->cfg.listen = config->listen;
    data_source(s);
    s->by_rank = calloc(config->consumers, sizeof(*s->by_rank));
    s->rank_served = calloc(config->consumers, sizeof(*s->rank_served));
    s->descs = malloc((size_t)config->ring_depth * sizeof(*s->descs));
    ferry_status st = s->by_rank && s->rank_served && s->descs
                          ? start_steps(s)
                          : ferry__fail(FERRY_NO_MEMORY, "out of memory for the remote server");
    s->cfg.listen = NULL; /* the caller's string is not kept */
    if (st == FERRY_OK) {
        int err = pthread_create(&s->thread, NULL, server_main, s);
        if (err)
            st = ferry__fail_errno(FERRY_SYSTEM, err, "%s: starting the remote server failed",
                                   s->label);
    }
    if (st != FERRY_OK) {
        release(s);
        return st;
    }
    s->running = 1;
    *out = s;
    return FERRY_OK;
}

void ferry__remote_stop(ferry__remote_server *s)
{
    if (!s)
        return;
    if (s->owner != ferry__proc_self()) {
        ferry__remote_forget(s);
        return;
    }
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof(one)) < 0) {
        /* the eventfd cannot be full: the thread reads it every round */
    }
    if (s->running)
        pthread_join(s->thread, NULL);
    release(s);
}

void ferry__remote_forget(ferry__remote_server *s)
{
    if (!s)
        return;
    for (conn *c = s->conns; c;) {
        conn *n = c->next;
        conn_free(c);
        c = n;
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->epoll_fd >= 0)
        close(s->epoll_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    /* s->pinned is not the child's: mapped MADV_DONTFORK, the range may hold something else
     * here */
    free(s->descs);
    free(s->by_rank);
    free(s->rank_served);
    free(s);
}

const char *ferry__remote_server_address(const ferry__remote_server *s)
{
    return s->address;
}

void ferry__remote_server_counts(ferry__remote_server *s, ferry__remote_counts *counts)
{
    pthread_mutex_lock(&s->lock);
    *counts = s->counts;
    pthread_mutex_unlock(&s->lock);
}
