/* Channels, consumer side: connecting by address, taking descriptors from the rank's ring
 * (shm/ring.c holds both halves of the ring), and the pollable fd (ferry.h, "Channels"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/proc.h"
#include "consumer/consumer.h"
#include "remote/remote.h"
#include "driver/driver.h"
#include "shm/ring.h"
#include "shm/wait.h"
#include "shm/signal.h"
#include "transport/transport.h"
#include "wire/wire.h"

/* How long a receiver yields before it sleeps on the ring: a sender is usually microseconds
 * away in a busy server, and a futex sleep and wake cost more than that. */
#define FERRY_RECV_SPIN_NS 50000ull

static void close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Only the form ferry_pool_address prints: the prefix and 32 lowercase hex digits. */
static int printed_form(const char *address)
{
    size_t prefix = strlen(FERRY__ADDRESS_PREFIX);
    if (strncmp(address, FERRY__ADDRESS_PREFIX, prefix) != 0 || strlen(address) != prefix + 32)
        return 0;
    for (const char *c = address + prefix; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return 0;
    return 1;
}

static ferry_status parse_address(const char *address, uint8_t name[16])
{
    if (!address)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "address is NULL");
    if (!printed_form(address) ||
        ferry__hex_get(address + strlen(FERRY__ADDRESS_PREFIX), 16, name) != 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "'%.80s' is not a ferry address (ferry: and 32 hex digits, as "
                           "ferry_pool_address gives)",
                           address);
    return FERRY_OK;
}

/* The pool-only descriptor of the pool at the broker called name. */
static ferry_status describe(const uint8_t name[16], const char *address, uint64_t deadline,
                             ferry_descriptor *d)
{
    uint8_t buf[FERRY_DESCRIPTOR_SIZE];
    pid_t ppid;
    uint64_t now = ferry__now_ns();
    ferry_status st = ferry__broker_describe(name, "pool broker",
                                             deadline > now ? deadline - now : 0, buf, &ppid);
    if (st == FERRY_PRODUCER_GONE)
        return ferry__fail_wrap(FERRY_PRODUCER_GONE,
                                "no pool serves %s (its producer closed it or exited)", address);
    if (st != FERRY_OK)
        return st;
    st = ferry_descriptor_decode(buf, sizeof(buf), d);
    if (st == FERRY_OK &&
        (!(d->flags & FERRY_DESC_FLAG_POOL_ONLY) || memcmp(d->broker, name, 16) != 0))
        st = ferry__fail(FERRY_MISMATCH, "the broker at %s described another pool", address);
    return st;
}

/* Opens the pool whose broker is called name and claims rank: the consumer of a pool on this
 * host. pool_id (NULL: any) is the identity the pool must have; lend: the rank is given back
 * when the consumer is destroyed (else held while the process lives). */
static ferry_status connect_local(const uint8_t name[16], const uint8_t *pool_id,
                                  const char *address, uint32_t rank, int32_t device, int lend,
                                  uint64_t deadline, ferry_consumer **out)
{
    ferry_descriptor d;
    ferry_consumer *c = NULL;
    ferry__mapped_pool *p = NULL;
    ferry_status st = describe(name, address, deadline, &d);
    if (st == FERRY_OK && pool_id && memcmp(d.pool_id, pool_id, 16) != 0)
        st = ferry__fail(FERRY_MISMATCH, "the broker of %.80s described another pool", address);
    if (st == FERRY_OK && rank >= d.consumer_count)
        st = ferry__fail(FERRY_INVALID_ARGUMENT,
                         "rank %u is not a rank of the pool at %s, "
                         "which has ranks 0 to %u",
                         rank, address, d.consumer_count - 1u);
    if (st == FERRY_OK)
        st = ferry_consumer_create_on(rank, device, &c);
    if (st == FERRY_OK)
        st = ferry__cache_acquire(&d, FERRY__RANK_NONE, device, deadline, 0, &p);
    if (st == FERRY_OK)
        st = p->ops->view_map(p, device, deadline);
    if (st == FERRY_OK) /* last: a connect that fails holds no rank */
        st = lend ? ferry__cache_lend(p, rank, deadline) : ferry__cache_claim(p, rank, deadline);
    if (st != FERRY_OK) {
        if (p)
            ferry__cache_release(p);
        ferry_consumer_destroy(c);
        return st;
    }
    c->bound = p;
    c->lent = lend;
    *out = c;
    ferry__clear_error();
    return FERRY_OK;
}

/* Whether a remote address of a pool on this host is read through the pool's own mapping
 * (FERRY_REMOTE_LOCAL=0: always over UCX). */
static int local_allowed(void)
{
    const char *v = getenv("FERRY_REMOTE_LOCAL");
    return !v || strcmp(v, "0") != 0;
}

/* A consumer by a pool's remote address. A pool on this host (the address names one of its
 * interfaces) is opened as a local consumer opens it: its server says which pool it is (a
 * connection that claims no rank, closed at once), and where the pool's broker answers here
 * with that pool, the rank is claimed there and every call after is a local one (the gets,
 * checks and acknowledgements over UCX cost a round trip each that the mapping does not);
 * destroying the consumer gives the rank back, as closing its connection would. Otherwise
 * the remote server admits it and the connection carries its calls (remote/client.c): where
 * the broker is out of reach (another network namespace), refuses this process (another
 * user, another PID namespace), or the pool cannot be opened here as asked (CUDA IPC refused,
 * a device it does not see, device -1 for a GPU pool). Only a rank out of range or held by a
 * live process is answered at once, as the connection would answer it. */
static ferry_status connect_remote(const char *address, uint32_t rank, int32_t device,
                                   ferry_consumer **out)
{
    ferry_consumer *c = NULL;
    ferry_descriptor pool;
    uint64_t deadline = ferry__deadline(FERRY_OPEN_TIMEOUT_NS);
    ferry_status st;
    if (local_allowed() && ferry__remote_describe(address, deadline, &pool) == FERRY_OK) {
        char label[FERRY_REMOTE_ADDRESS_SIZE]; /* the secret stays out of messages */
        snprintf(label, sizeof(label), "%s", address);
        char *secret = strrchr(label, '/');
        if (secret)
            *secret = '\0';
        if (rank >= pool.consumer_count)
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "rank %u is not a rank of the pool at %s, which has ranks 0 to %u",
                               rank, label, pool.consumer_count - 1u);
        st = connect_local(pool.broker, pool.pool_id, label, rank, device, 1, deadline, out);
        if (st == FERRY_OK) {
            ferry__log(FERRY_LOG_INFO,
                       "remote pool %.80s is on this host: rank %u reads it through its own "
                       "mapping (FERRY_REMOTE_LOCAL=0: over UCX)",
                       label, rank);
            return FERRY_OK;
        }
        if (st == FERRY_RANK_IN_USE)
            return st;
        ferry__log(FERRY_LOG_INFO, "remote pool %.80s: not opened on this host (%s): over UCX",
                   label, ferry_last_error());
    }
    st = ferry_consumer_create_on(rank, device, &c);
    if (st == FERRY_OK)
        st = ferry__remote_connect(address, rank, device, deadline, &c->remote);
    if (st != FERRY_OK) {
        ferry_consumer_destroy(c);
        return st;
    }
    *out = c;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry_consumer_connect(const char *address, uint32_t rank, int32_t device,
                                    ferry_consumer **out)
{
    FERRY_CUDA_BOUNDARY;
    if (out && ferry__remote_is_address(address))
        return connect_remote(address, rank, device, out);
    uint8_t name[16];
    ferry_status st = out ? parse_address(address, name)
                          : ferry__fail(FERRY_INVALID_ARGUMENT, "consumer output pointer is NULL");
    if (st != FERRY_OK)
        return st;
    return connect_local(name, NULL, address, rank, device, 0,
                         ferry__deadline(FERRY_OPEN_TIMEOUT_NS), out);
}

void ferry__consumer_unbind(ferry_consumer *c)
{
    /* In a forked child the pool's bookkeeping is the parent's (the child's cache starts
     * empty): only the child's copies of the fds go. */
    if (c->bound && c->pid == ferry__proc_self()) {
        if (c->lent)
            ferry__cache_give_back(c->bound, c->rank);
        ferry__cache_release(c->bound);
    }
    c->bound = NULL;
    ferry__remote_close(c->remote); /* in a forked child: the child's copies only */
    c->remote = NULL;
    int fds[3] = {c->poll_fd, c->event_fd, c->pid_fd};
    close_fds(fds, 3);
    c->poll_fd = c->event_fd = c->pid_fd = -1;
}

static ferry_status check_bound(const ferry_consumer *c)
{
    if (!c)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer is NULL");
    ferry_status st = ferry__consumer_owned(c);
    if (st != FERRY_OK)
        return st;
    if (!c->bound && !c->remote)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "consumer of rank %u was not connected to a pool (make it with "
                           "ferry_consumer_connect)",
                           c->rank);
    return FERRY_OK;
}

/* ---- taking descriptors ---------------------------------------------------------------- */

static ferry__ring *my_ring(const ferry_consumer *c)
{
    return ferry__shm_ring(&c->bound->shm, c->rank);
}

/* 1 if the lease is still this rank's to read: its slot holds its generation and the rank's
 * acknowledgement (as this process can know it cheaply) is not written. */
static int current(void *arg, const ferry_descriptor *d)
{
    const ferry_consumer *c = arg;
    ferry__mapped_pool *p = c->bound;
    uint32_t ack = 0;
    if (ferry__shm_generation(&p->shm, d->slot) != d->generation)
        return 0;
    return p->place->load_ack(p, c->device, d->slot, c->rank, &ack) != FERRY_OK ||
           ack != d->generation;
}

/* The next lease queued for the rank that is still its to read: FERRY_OK with its
 * descriptors, FERRY__RING_EMPTY, or an error (the entries stay queued). */
static int take(ferry_consumer *c, ferry_descriptor *descs, size_t max, size_t *count)
{
    ferry__mapped_pool *p = c->bound;
    ferry__ring_reader r = {
        .ring = my_ring(c),
        .depth = p->shm.layout.ring_depth,
        .rank = c->rank,
        .pool_id = p->pool_id,
        .max_inflight = p->max_inflight,
        .current = current,
        .arg = c,
    };
    return ferry__ring_take(&r, descs, max, count);
}

/* Asks the producer to signal the poll fd at its next send; 1 if the ring got entries in the
 * meantime (take again). */
static int arm(ferry_consumer *c)
{
    int efd = __atomic_load_n(&c->event_fd, __ATOMIC_ACQUIRE);
    if (efd < 0)
        return 0;
    uint64_t drained;
    while (read(efd, &drained, sizeof(drained)) > 0) {
    }
    return ferry__ring_arm(my_ring(c), &c->bound->shm.header->closing);
}

static ferry_status gone(const ferry_consumer *c)
{
    return ferry__fail(FERRY_PRODUCER_GONE,
                       "producer of the pool (pid %d) closed it or exited: nothing more comes "
                       "to rank %u",
                       (int)c->bound->producer_pid, c->rank);
}

/* A receiver's wait for its ring (ferry__wait_run). */
typedef struct recv_wait {
    ferry_consumer *c;
    ferry_descriptor *descs;
    size_t max;
    size_t *count;
    uint64_t timeout_ns;
} recv_wait;

static int recv_look(void *arg)
{
    recv_wait *w = arg;
    ferry__mapped_pool *p = w->c->bound;
    if (ferry__shm_closing(&p->shm) || ferry__load_acquire32(&p->gone))
        return gone(w->c);
    int got = take(w->c, w->descs, w->max, w->count);
    return got == FERRY__RING_EMPTY ? FERRY__WAIT_AGAIN : got;
}

static void recv_sleep(void *arg, uint64_t ns)
{
    recv_wait *w = arg;
    ferry__ring_sleep_on_tail(my_ring(w->c), ns);
}

/* /proc is read at most every slice, also across calls that do not wait (an event loop's
 * recv after its fd woke for the producer's exit): c->alive_ns says when it last was. */
static ferry_status recv_check(void *arg)
{
    recv_wait *w = arg;
    __atomic_store_n(&w->c->alive_ns, ferry__now_ns(), __ATOMIC_RELAXED);
    int g = ferry__producer_gone(w->c->bound);
    return g > 0 ? gone(w->c) : g < 0 ? FERRY_SYSTEM : FERRY_OK;
}

static int recv_expired(void *arg)
{
    recv_wait *w = arg;
    uint64_t seen = __atomic_load_n(&w->c->alive_ns, __ATOMIC_RELAXED);
    if (ferry__now_ns() - seen >= FERRY_READY_WAIT_SLICE_NS) {
        ferry_status st = recv_check(w);
        if (st != FERRY_OK)
            return st;
    }
    if (arm(w->c))
        return FERRY__WAIT_AGAIN;
    return ferry__fail(FERRY_TIMEOUT, "no lease came for rank %u within %.3f ms", w->c->rank,
                       (double)w->timeout_ns / 1e6);
}

ferry_status ferry_consumer_recv(ferry_consumer *c, uint64_t timeout_ns, ferry_descriptor *descs,
                                 size_t max, size_t *count)
{
    ferry_status st = check_bound(c);
    if (st == FERRY_OK && (!descs || !count || max == 0))
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "recv needs descriptor room and a count output");
    if (st != FERRY_OK)
        return st;
    if (c->remote)
        return ferry__remote_recv(c->remote, timeout_ns, descs, max, count);
    recv_wait rw = {.c = c, .descs = descs, .max = max, .count = count, .timeout_ns = timeout_ns};
    ferry__wait w = {
        .look = recv_look,
        .sleep = recv_sleep,
        .check = recv_check,
        .expired = recv_expired,
        .ctx = &rw,
        .spin_ns = FERRY_RECV_SPIN_NS,
        .slice_ns = UINT64_MAX, /* the liveness check bounds every sleep */
        .check_ns = FERRY_READY_WAIT_SLICE_NS,
    };
    /* The clock is read once the ring is found empty: usually a lease is queued. */
    st = ferry__wait_run(&w, timeout_ns, 0);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

/* ---- the poll fd ---------------------------------------------------------------------- */

static int pidfd_of(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* The epoll set the caller polls: the eventfd the producer signals, and the producer's pidfd
 * (readable once it exits) where the kernel has pidfds. Published in c once the producer
 * took the eventfd; nothing is left behind on failure. */
static ferry_status make_fds(ferry_consumer *c)
{
    ferry__mapped_pool *p = c->bound;
    struct epoll_event ev = {.events = EPOLLIN};
    int fds[3] = {-1, -1, -1}; /* poll, event, pid */
    ferry_status st = FERRY_OK;
    fds[1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    fds[0] = fds[1] < 0 ? -1 : epoll_create1(EPOLL_CLOEXEC);
    if (fds[0] < 0 || epoll_ctl(fds[0], EPOLL_CTL_ADD, fds[1], &ev) != 0)
        st =
            ferry__fail_errno(FERRY_SYSTEM, errno, "making the poll fd of rank %u failed", c->rank);
    if (st == FERRY_OK)
        fds[2] = pidfd_of(p->producer_pid);
    if (st == FERRY_OK && fds[2] >= 0 && epoll_ctl(fds[0], EPOLL_CTL_ADD, fds[2], &ev) != 0)
        st = ferry__fail_errno(FERRY_SYSTEM, errno, "watching the producer (pid %d) failed",
                               (int)p->producer_pid);
    /* Armed before the producer has the fd: a send from then on signals it, and the
     * producer signals it for whatever was queued before it took it. */
    ferry__store_seqcst32(&my_ring(c)->armed, 1);
    if (st == FERRY_OK)
        st = ferry__broker_notify(p->broker, p->pool_id, c->rank, "pool broker",
                                  FERRY_OPEN_TIMEOUT_NS, fds[1]);
    if (st != FERRY_OK) {
        close_fds(fds, 3);
        return st;
    }
    c->poll_fd = fds[0];
    c->pid_fd = fds[2];
    __atomic_store_n(&c->event_fd, fds[1], __ATOMIC_RELEASE);
    return FERRY_OK;
}

ferry_status ferry_consumer_fd(ferry_consumer *c, int *fd)
{
    ferry_status st = check_bound(c);
    if (st == FERRY_OK && !fd)
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "fd output is NULL");
    if (st != FERRY_OK)
        return st;
    if (c->remote)
        return ferry__remote_fd(c->remote, fd);
    pthread_mutex_lock(&c->fd_lock);
    if (c->poll_fd < 0)
        st = make_fds(c);
    int out = c->poll_fd;
    pthread_mutex_unlock(&c->fd_lock);
    if (st != FERRY_OK)
        return st;
    *fd = out;
    ferry__clear_error();
    return FERRY_OK;
}
