/* Channels, consumer side: connecting by address, taking descriptors from the rank's ring,
 * and the pollable fd (ferry.h, "Channels").
 *
 * A ring's entries [head, tail) are queued. A receiver copies the entries at head, then
 * advances head by compare-and-swap: a thread that lost the race drops its copy (which the
 * producer may have been rewriting) and tries again, so that threads of one process share a
 * rank's ring and each lease goes to one of them. */
#include <errno.h>
#include <sched.h>
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
#include "common/futex.h"
#include "common/proc.h"
#include "consumer/consumer.h"
#include "driver/driver.h"
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

ferry_status ferry_consumer_connect(const char *address, uint32_t rank, int32_t device,
                                    ferry_consumer **out)
{
    FERRY_CUDA_BOUNDARY;
    uint8_t name[16];
    ferry_descriptor d;
    ferry_consumer *c = NULL;
    ferry__mapped_pool *p = NULL;
    uint64_t deadline = ferry__deadline(FERRY_OPEN_TIMEOUT_NS);
    ferry_status st = out ? parse_address(address, name)
                          : ferry__fail(FERRY_INVALID_ARGUMENT, "consumer output pointer is NULL");
    if (st == FERRY_OK)
        st = describe(name, address, deadline, &d);
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
        st = ferry__cache_claim(p, rank, deadline);
    if (st != FERRY_OK) {
        if (p)
            ferry__cache_release(p);
        ferry_consumer_destroy(c);
        return st;
    }
    c->bound = p;
    *out = c;
    ferry__clear_error();
    return FERRY_OK;
}

void ferry__consumer_unbind(ferry_consumer *c)
{
    /* In a forked child the pool's bookkeeping is the parent's (the child's cache starts
     * empty): only the child's copies of the fds go. */
    if (c->bound && c->pid == ferry__proc_self())
        ferry__cache_release(c->bound);
    c->bound = NULL;
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
    if (!c->bound)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "consumer of rank %u was not connected to a pool (make it with "
                           "ferry_consumer_connect)",
                           c->rank);
    return FERRY_OK;
}

/* ---- taking descriptors ---------------------------------------------------------------- */

enum { TAKE_EMPTY = -1 };

static ferry__ring *my_ring(const ferry_consumer *c)
{
    return ferry__ring_of(c->bound->header, c->rank);
}

/* Decodes the entry at position i (copied word by word: see entry_store in channel.c). */
static ferry_status entry_load(ferry__ring *ring, uint32_t depth, uint32_t i, ferry_descriptor *d)
{
    uint8_t raw[FERRY_DESCRIPTOR_SIZE];
    const uint8_t *entry = ferry__ring_entry(ring, depth, i);
    for (size_t w = 0; w < FERRY_DESCRIPTOR_SIZE; w += 8) {
        uint64_t v = ferry__load_relaxed64((const uint64_t *)(entry + w));
        memcpy(raw + w, &v, 8);
    }
    return ferry_descriptor_decode(raw, sizeof(raw), d);
}

/* 1 if the lease is still this rank's to read: its slot holds its generation and the rank's
 * acknowledgement (as this process can know it cheaply) is not written. */
static int current(const ferry_consumer *c, ferry__mapped_pool *p, const ferry_descriptor *d)
{
    uint32_t ack = 0;
    if (ferry__load_acquire32(&p->generations[d->slot]) != d->generation)
        return 0;
    return p->place->load_ack(p, c->device, d->slot, c->rank, &ack) != FERRY_OK ||
           ack != d->generation;
}

/* One attempt at the entries at head: FERRY_OK with the lease's descriptors, TAKE_EMPTY, or
 * an error (the entries stay queued). *skipped counts leases dropped as no longer current. */
static int take(ferry_consumer *c, ferry_descriptor *descs, size_t max, size_t *count)
{
    ferry__mapped_pool *p = c->bound;
    ferry__ring *ring = my_ring(c);
    uint32_t depth = p->header->ring_depth;
    for (;;) {
        uint32_t head = ferry__load_acquire32(&ring->head);
        uint32_t tail = ferry__load_acquire32(&ring->tail);
        if (head == tail)
            return TAKE_EMPTY;
        if (tail - head > depth) {
            if (ferry__load_after_reads32(&ring->head) != head)
                continue; /* head moved on between the two loads */
            return ferry__fail(FERRY_MALFORMED,
                               "descriptor ring of rank %u is corrupt (head %u, tail %u, depth "
                               "%u)",
                               c->rank, head, tail, depth);
        }
        ferry_status st = entry_load(ring, depth, head, &descs[0]);
        size_t k = st == FERRY_OK && descs[0].part_count ? descs[0].part_count : 1;
        if (st == FERRY_OK && (k > tail - head || memcmp(descs[0].pool_id, p->pool_id, 16) != 0 ||
                               descs[0].slot >= p->max_inflight)) {
            st = ferry__fail(FERRY_MALFORMED, "descriptor ring of rank %u holds a foreign entry",
                             c->rank);
            k = 1; /* dropped alone: the entries after it are the producer's */
        }
        if (st == FERRY_OK && k > max) {
            if (ferry__load_after_reads32(&ring->head) != head)
                continue;
            *count = k;
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "the next lease has %zu tensors; the output holds %zu", k, max);
        }
        for (size_t i = 1; i < k && st == FERRY_OK; i++)
            st = entry_load(ring, depth, head + (uint32_t)i, &descs[i]);
        /* seq_cst: the store half of a Dekker pair with a sender's sleep on head. */
        if (!ferry__cas_seqcst32(&ring->head, &head, head + (uint32_t)k))
            continue; /* another thread took them: the copies may be torn */
        if (ferry__load_seqcst32(&ring->senders))
            ferry__futex_wake_all(&ring->head);
        if (st != FERRY_OK)
            return st;
        if (!current(c, p, &descs[0]))
            continue;
        *count = k;
        return FERRY_OK;
    }
}

/* Asks the producer to signal the poll fd at its next send; 1 if the ring got entries in the
 * meantime (take again). */
static int arm(ferry_consumer *c)
{
    ferry__ring *ring = my_ring(c);
    int efd = __atomic_load_n(&c->event_fd, __ATOMIC_ACQUIRE);
    if (efd < 0)
        return 0;
    uint64_t drained;
    while (read(efd, &drained, sizeof(drained)) > 0) {
    }
    ferry__store_seqcst32(&ring->armed, 1);
    /* A close after the caller's look at the closing flag signalled the fd just drained. */
    return ferry__load_seqcst32(&ring->tail) != ferry__load_seqcst32(&ring->head) ||
           ferry__load_seqcst32(&c->bound->header->closing);
}

static ferry_status gone(const ferry_consumer *c)
{
    return ferry__fail(FERRY_PRODUCER_GONE,
                       "producer of the pool (pid %d) closed it or exited: nothing more comes "
                       "to rank %u",
                       (int)c->bound->producer_pid, c->rank);
}

/* Sleeps until the ring's tail moves on, ns at most. */
static void sleep_on_tail(ferry__ring *ring, uint64_t ns)
{
    ferry__fetch_add_seqcst32(&ring->receivers, 1);
    uint32_t tail = ferry__load_seqcst32(&ring->tail);
    if (tail == ferry__load_seqcst32(&ring->head))
        ferry__futex_wait(&ring->tail, tail, ns);
    ferry__fetch_add_seqcst32(&ring->receivers, (uint32_t)-1);
}

ferry_status ferry_consumer_recv(ferry_consumer *c, uint64_t timeout_ns, ferry_descriptor *descs,
                                 size_t max, size_t *count)
{
    ferry_status st = check_bound(c);
    if (st == FERRY_OK && (!descs || !count || max == 0))
        st = ferry__fail(FERRY_INVALID_ARGUMENT, "recv needs descriptor room and a count output");
    if (st != FERRY_OK)
        return st;
    ferry__mapped_pool *p = c->bound;
    /* The clock is read once the ring is found empty: usually a lease is queued. */
    uint64_t deadline = 0, start = 0, next_check = 0;
    for (;;) {
        if (ferry__load_acquire32(&p->header->closing) || ferry__load_acquire32(&p->gone))
            return gone(c);
        int got = take(c, descs, max, count);
        if (got == FERRY_OK) {
            ferry__clear_error();
            return FERRY_OK;
        }
        if (got != TAKE_EMPTY)
            return (ferry_status)got;
        uint64_t now = ferry__now_ns();
        if (!start) {
            start = now;
            deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
            next_check = now + FERRY_READY_WAIT_SLICE_NS;
        }
        /* /proc is read at most every slice, also across calls that do not wait (an event
         * loop's recv after its fd woke for the producer's exit). */
        uint64_t seen = __atomic_load_n(&c->alive_ns, __ATOMIC_RELAXED);
        if (now >= next_check || (now >= deadline && now - seen >= FERRY_READY_WAIT_SLICE_NS)) {
            __atomic_store_n(&c->alive_ns, now, __ATOMIC_RELAXED);
            if (ferry__producer_gone(p))
                return gone(c);
            next_check = now + FERRY_READY_WAIT_SLICE_NS;
        }
        if (now >= deadline) {
            if (arm(c))
                continue;
            return ferry__fail(FERRY_TIMEOUT, "no lease came for rank %u within %.3f ms", c->rank,
                               (double)timeout_ns / 1e6);
        }
        if (now - start < FERRY_RECV_SPIN_NS) {
            sched_yield();
            continue;
        }
        uint64_t left = deadline - now, slice = next_check - now;
        sleep_on_tail(my_ring(c), left < slice ? left : slice);
    }
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
