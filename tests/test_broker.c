/* The pool broker: fd hand-off to real processes, refusals, client errors, fd hygiene,
 * concurrent connections, rank claims, fork and client timeouts. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "broker/broker.h"
#include "common/clock.h"
#include "helpers.h"
#include "procs.h"

#define LABEL        "test broker"
#define POOL_SIZE    (1u << 20)
#define POOL_SEED    42
#define CONSUMERS    4
#define TIMEOUT_NS   (5ull * 1000000000ull)
#define MAX_ATTACHES 64
#define REQUEST_SIZE 32
#define REPLY_SIZE   24
#define NOBODY       65534
#define EXIT_NO_DROP 77
#define MS           1000000ull
#define PERMISSION_TEXT                                                                            \
    LABEL " refused the request: permission denied (it serves processes of its own user, and "     \
          "names ranks only to those it can see: in its PID namespace or one below it)"

/* ------------------------------------------------------------------------------------
 * Fixture: a memfd with known content served by a broker of CONSUMERS ranks
 * ---------------------------------------------------------------------------------- */

typedef struct attach_log {
    pthread_mutex_t lock;
    ferry_status answer; /* what record_attach returns (FERRY_OK unless a test sets it) */
    pid_t holder;        /* and the holder it reports with it */
    unsigned count;
    uint32_t rank[MAX_ATTACHES];
    pid_t pid[MAX_ATTACHES];
    unsigned releases; /* RELEASE requests, and the last one's rank and pid */
    uint32_t release_rank;
    pid_t release_pid;
} attach_log;

typedef struct fixture {
    int memfd;
    uint8_t pool_id[16];
    uint8_t name[16];
    ferry__broker *broker;
    attach_log log;
} fixture;

static ferry_status record_attach(void *user, uint32_t rank, pid_t pid, pid_t *holder)
{
    attach_log *log = user;
    pthread_mutex_lock(&log->lock);
    if (log->count < MAX_ATTACHES) {
        log->rank[log->count] = rank;
        log->pid[log->count] = pid;
    }
    log->count++;
    ferry_status answer = log->answer;
    if (answer != FERRY_OK)
        *holder = log->holder;
    pthread_mutex_unlock(&log->lock);
    return answer;
}

static ferry_status record_release(void *user, uint32_t rank, pid_t pid)
{
    attach_log *log = user;
    pthread_mutex_lock(&log->lock);
    log->releases++;
    log->release_rank = rank;
    log->release_pid = pid;
    pthread_mutex_unlock(&log->lock);
    return FERRY_OK;
}

/* Makes the fixture's on_attach answer status (with holder) from now on. */
static void set_attach_answer(fixture *f, ferry_status status, pid_t holder)
{
    pthread_mutex_lock(&f->log.lock);
    f->log.answer = status;
    f->log.holder = holder;
    pthread_mutex_unlock(&f->log.lock);
}

static unsigned attach_count(fixture *f)
{
    pthread_mutex_lock(&f->log.lock);
    unsigned n = f->log.count;
    pthread_mutex_unlock(&f->log.lock);
    return n;
}

static void random_bytes(uint8_t *buf, size_t n)
{
    assert_int_equal(getrandom(buf, n, 0), (ssize_t)n);
}

static int make_memfd(size_t size, uint64_t seed)
{
    int fd = memfd_create("ferry-test-pool", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    th_fill(p, size, seed);
    munmap(p, size);
    return fd;
}

static ferry__broker_config fixture_config(fixture *f)
{
    ferry__broker_config config = {f->pool_id,    f->memfd, POOL_SIZE, CONSUMERS, LABEL,
                                   record_attach, &f->log,  NULL,      NULL,      record_release};
    return config;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    pthread_mutex_init(&f->log.lock, NULL);
    random_bytes(f->pool_id, sizeof(f->pool_id));
    f->memfd = make_memfd(POOL_SIZE, POOL_SEED);
    ferry__broker_config config = fixture_config(f);
    assert_int_equal(ferry__broker_start(&config, &f->broker, f->name), FERRY_OK);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    ferry__broker_stop(f->broker);
    close(f->memfd);
    pthread_mutex_destroy(&f->log.lock);
    free(f);
    return 0;
}

/* ------------------------------------------------------------------------------------
 * Helpers: raw sockets, hand-made messages, fd counting
 * ---------------------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* An OPEN request (valid with rank FERRY__RANK_NONE), written byte by byte as
 * docs/wire-format.md describes it. */
static void make_request(uint8_t out[REQUEST_SIZE], const uint8_t pool_id[16], uint32_t rank)
{
    memcpy(out, "FRYB", 4);
    out[4] = 3; /* version */
    out[5] = 0;
    out[6] = 1; /* type OPEN */
    out[7] = 0;
    memcpy(out + 8, pool_id, 16);
    put32(out + 24, rank);
    put32(out + 28, 0);
}

/* A CLAIM request of rank. */
static void make_claim(uint8_t out[REQUEST_SIZE], const uint8_t pool_id[16], uint32_t rank)
{
    make_request(out, pool_id, rank);
    out[6] = 4; /* type CLAIM */
}

static int raw_connect(const uint8_t name[16])
{
    struct sockaddr_un addr;
    unsigned len = ferry__broker_address(name, &addr);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    assert_int_equal(connect(s, (struct sockaddr *)&addr, len), 0);
    return s;
}

/* Sends len bytes with nfds descriptors (at most 4) in one SCM_RIGHTS message. */
static void raw_send_fds(int s, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 4)];
    } control;
    struct iovec iov = {(void *)buf, len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    assert_true(nfds <= 4);
    if (nfds > 0) {
        memset(&control, 0, sizeof(control));
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    assert_int_equal(sendmsg(s, &msg, MSG_NOSIGNAL), (ssize_t)len);
}

static void raw_send(int s, const void *buf, size_t len, int fd_to_pass)
{
    raw_send_fds(s, buf, len, &fd_to_pass, fd_to_pass >= 0);
}

/* Waits up to wait_ms for the broker's reply on s; returns its length (-1: none came) and
 * the first descriptor it carried in *fd (-1 if none; any others are closed, counted in
 * *nfds). */
static ssize_t raw_receive(int s, uint8_t *buf, size_t size, int wait_ms, int *fd, int *nfds)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 4)];
    } control;
    struct iovec iov = {buf, size};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    struct pollfd p = {s, POLLIN, 0};

    *fd = -1;
    *nfds = 0;
    if (poll(&p, 1, wait_ms) != 1)
        return -1;
    memset(&control, 0, sizeof(control));
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); n >= 0 && c; c = CMSG_NXTHDR(&msg, c)) {
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*fd < 0)
                *fd = got;
            else
                close(got);
            (*nfds)++;
        }
    }
    return n;
}

/* Sends len bytes (plus nfds descriptors) over a fresh raw connection and returns the
 * status of the broker's reply, checking that the reply is well formed and carries no fd
 * unless it grants an OPEN (whose fd is closed). */
static int raw_exchange_fds(const uint8_t name[16], const void *buf, size_t len, const int *fds,
                            size_t nfds_sent)
{
    uint8_t reply[64];
    int fd, nfds;
    int s = raw_connect(name);
    raw_send_fds(s, buf, len, fds, nfds_sent);
    ssize_t n = raw_receive(s, reply, sizeof(reply), 5000, &fd, &nfds);
    close(s);
    assert_true(n == REPLY_SIZE || n == REPLY_SIZE + 256); /* a DESCRIBE granted: + 256 */
    assert_memory_equal(reply, "FRYR", 4);
    assert_int_equal(reply[4] | (reply[5] << 8), 3);
    int status = reply[6] | (reply[7] << 8);
    int open_request = len > 6 && ((const uint8_t *)buf)[6] == 1;
    assert_int_equal(nfds, status == FERRY_OK && open_request ? 1 : 0); /* OPEN granted: the fd */
    if (fd >= 0)
        close(fd);
    return status;
}

static int raw_exchange(const uint8_t name[16], const void *buf, size_t len, int fd_to_pass)
{
    return raw_exchange_fds(name, buf, len, &fd_to_pass, fd_to_pass >= 0);
}

/* A listening socket on a fresh random abstract name that nobody accepts from. */
static int make_listener_with_backlog(uint8_t name[16], int backlog)
{
    struct sockaddr_un addr;
    random_bytes(name, 16);
    unsigned len = ferry__broker_address(name, &addr);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    assert_int_equal(bind(s, (struct sockaddr *)&addr, len), 0);
    assert_int_equal(listen(s, backlog), 0);
    return s;
}

static int make_listener(uint8_t name[16])
{
    return make_listener_with_backlog(name, 8);
}

static int count_fds(void)
{
    int n = th_count_fds();
    assert_true(n >= 0);
    return n;
}

/* Waits (5 s at most) until this process has want descriptors open, as count_fds counts
 * them: the broker's accepted connections are descriptors of this, its producer's,
 * process. Returns whether the count got there. */
static int wait_fd_count(int want)
{
    for (int i = 0; i < 5000; i++) {
        if (count_fds() == want)
            return 1;
        poll(NULL, 0, 1);
    }
    return 0;
}

static int wait_child(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Opens the pool and, unless rank is FERRY__RANK_NONE, claims rank, as a consumer does; the
 * fd is closed (and *fd -1) when the claim is refused. */
static int request(fixture *f, const uint8_t *pool_id, uint32_t rank, int *fd)
{
    uint64_t size;
    pid_t pid;
    ferry_status st = ferry__broker_request(f->name, pool_id, LABEL, TIMEOUT_NS, fd, &size, &pid);
    if (st == FERRY_OK && rank != FERRY__RANK_NONE)
        st = ferry__broker_claim(f->name, pool_id, rank, LABEL, TIMEOUT_NS);
    if (st != FERRY_OK && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return st;
}

/* ------------------------------------------------------------------------------------
 * Hand-off
 * ---------------------------------------------------------------------------------- */

/* In a child: requests the pool as rank, maps the fd and checks the content. */
static int child_open_and_check(const fixture *f, uint32_t rank)
{
    int fd = -1;
    uint64_t size = 0;
    pid_t producer = 0;
    ferry_status st =
        ferry__broker_request(f->name, f->pool_id, LABEL, TIMEOUT_NS, &fd, &size, &producer);
    if (st == FERRY_OK)
        st = ferry__broker_claim(f->name, f->pool_id, rank, LABEL, TIMEOUT_NS);
    if (st != FERRY_OK)
        return 1;
    if (size != POOL_SIZE || producer != getppid())
        return 1;
    if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
        return 1;
    void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return 1;
    int ok = th_check(p, size, POOL_SEED);
    munmap(p, size);
    return ok ? 0 : 1;
}

static void test_handoff_to_child(void **state)
{
    fixture *f = *state;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(child_open_and_check(f, 2));
    assert_int_equal(wait_child(child), 0);
    assert_int_equal(attach_count(f), 1);
    assert_int_equal(f->log.rank[0], 2);
    assert_int_equal(f->log.pid[0], child);
    assert_int_equal(ferry__broker_refused(f->broker), 0);
}

static void test_many_children_at_once(void **state)
{
    fixture *f = *state;
    enum { CHILDREN = 8 };
    pid_t pids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(child_open_and_check(f, (uint32_t)(i % CONSUMERS)));
    }
    for (int i = 0; i < CHILDREN; i++)
        assert_int_equal(wait_child(pids[i]), 0);
    assert_int_equal(attach_count(f), CHILDREN);
    for (int i = 0; i < CHILDREN; i++) {
        int found = 0;
        for (int j = 0; j < CHILDREN; j++)
            found += f->log.pid[j] == pids[i] && f->log.rank[j] == (uint32_t)(i % CONSUMERS);
        assert_int_equal(found, 1);
    }
}

static void test_received_fd_is_cloexec(void **state)
{
    fixture *f = *state;
    int fd = -1;
    uint64_t size = 0;
    pid_t producer = 0;
    struct stat a, b;

    assert_int_equal(
        ferry__broker_request(f->name, f->pool_id, LABEL, TIMEOUT_NS, &fd, &size, &producer),
        FERRY_OK);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    assert_int_equal(size, POOL_SIZE);
    assert_int_equal(producer, getpid());
    assert_int_equal(fstat(fd, &a), 0);
    assert_int_equal(fstat(f->memfd, &b), 0);
    assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
    close(fd);
    assert_int_equal(attach_count(f), 0); /* an OPEN claims nothing */
    assert_int_equal(ferry__broker_claim(f->name, f->pool_id, CONSUMERS - 1, LABEL, TIMEOUT_NS),
                     FERRY_OK);
    assert_int_equal(attach_count(f), 1);
    assert_int_equal(f->log.rank[0], CONSUMERS - 1);
    assert_int_equal(f->log.pid[0], getpid());
}

static void test_hand_made_request_and_reply_bytes(void **state)
{
    fixture *f = *state;
    uint8_t req[REQUEST_SIZE], reply[64];
    int fd, nfds;

    make_request(req, f->pool_id, FERRY__RANK_NONE);
    int s = raw_connect(f->name);
    raw_send(s, req, sizeof(req), -1);
    ssize_t n = raw_receive(s, reply, sizeof(reply), 5000, &fd, &nfds);
    close(s);
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(nfds, 1);
    assert_true(fd >= 0);
    close(fd);
    assert_memory_equal(reply, "FRYR", 4);
    assert_int_equal(reply[4], 3);
    assert_int_equal(reply[5], 0);
    assert_int_equal(reply[6], 0);
    assert_int_equal(reply[7], 0);
    assert_int_equal(get64(reply + 8), POOL_SIZE);
    assert_int_equal(get64(reply + 16), 0);
    assert_int_equal(attach_count(f), 0);

    /* A CLAIM: granted with status 0, size 0, detail 0 and no descriptor. */
    make_claim(req, f->pool_id, 1);
    s = raw_connect(f->name);
    raw_send(s, req, sizeof(req), -1);
    n = raw_receive(s, reply, sizeof(reply), 5000, &fd, &nfds);
    close(s);
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(nfds, 0);
    assert_memory_equal(reply, "FRYR\x03\x00\x00\x00", 8);
    assert_int_equal(get64(reply + 8), 0);
    assert_int_equal(get64(reply + 16), 0);
    assert_int_equal(attach_count(f), 1);
    assert_int_equal(f->log.rank[0], 1);
    assert_int_equal(f->log.pid[0], getpid());
}

/* ------------------------------------------------------------------------------------
 * Refusals
 * ---------------------------------------------------------------------------------- */

static void test_wrong_pool_id(void **state)
{
    fixture *f = *state;
    uint8_t other[16];
    int fd = -1;

    memcpy(other, f->pool_id, 16);
    other[15] ^= 1;
    assert_int_equal(request(f, other, 0, &fd), FERRY_MISMATCH);
    assert_int_equal(fd, -1);
    assert_string_equal(ferry_last_error(),
                        LABEL " refused the request: descriptor does not match the pool");
    assert_int_equal(ferry__broker_refused(f->broker), 1);
    assert_int_equal(attach_count(f), 0);
}

static void test_rank_out_of_range(void **state)
{
    fixture *f = *state;
    int fd = -1;

    assert_int_equal(request(f, f->pool_id, CONSUMERS, &fd), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), 1);
    assert_int_equal(request(f, f->pool_id, FERRY__RANK_NONE - 1, &fd), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), 2);
    assert_int_equal(fd, -1);
    assert_int_equal(request(f, f->pool_id, CONSUMERS - 1, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(attach_count(f), 1);
}

static void test_malformed_requests(void **state)
{
    fixture *f = *state;
    uint8_t good[REQUEST_SIZE], bad[REQUEST_SIZE + 8];
    int pipe_fds[2];
    uint64_t refused = 0;
    int fds_before = count_fds();

    make_request(good, f->pool_id, FERRY__RANK_NONE);
    assert_int_equal(raw_exchange(f->name, good, 0, -1), FERRY_INVALID_ARGUMENT); /* empty */
    assert_int_equal(raw_exchange(f->name, good, REQUEST_SIZE - 1, -1), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), refused += 2);

    memcpy(bad, good, REQUEST_SIZE);
    memset(bad + REQUEST_SIZE, 0, 8);
    assert_int_equal(raw_exchange(f->name, bad, REQUEST_SIZE + 1, -1), FERRY_INVALID_ARGUMENT);
    assert_int_equal(raw_exchange(f->name, bad, REQUEST_SIZE + 8, -1), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), refused += 2);

    static const struct {
        size_t offset;
        uint8_t value;
    } corruptions[] = {
        {0, 'X'},   /* magic */
        {3, 'R'},   /* magic "FRYR": a reply is not a request */
        {4, 2},     /* version 2, the previous one */
        {4, 4},     /* version */
        {5, 1},     /* version, high byte */
        {6, 2},     /* type */
        {6, 5},     /* type: none after CLAIM */
        {7, 1},     /* type, high byte */
        {24, 0},    /* an OPEN naming a rank (0): only a CLAIM claims */
        {28, 1},    /* reserved */
        {31, 0x80}, /* reserved, last byte */
    };
    for (size_t i = 0; i < sizeof(corruptions) / sizeof(corruptions[0]); i++) {
        memcpy(bad, good, REQUEST_SIZE);
        bad[corruptions[i].offset] = corruptions[i].value;
        assert_int_equal(raw_exchange(f->name, bad, REQUEST_SIZE, -1), FERRY_INVALID_ARGUMENT);
        assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    }

    /* A valid request carrying a descriptor: refused, and the broker closes its copy. */
    assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
    assert_int_equal(raw_exchange(f->name, good, REQUEST_SIZE, pipe_fds[0]),
                     FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    assert_int_equal(raw_exchange(f->name, good, 0, pipe_fds[1]), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    /* Nor with two: OPEN and DESCRIBE carry none, NOTIFY exactly one. */
    assert_int_equal(raw_exchange_fds(f->name, good, REQUEST_SIZE, pipe_fds, 2),
                     FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    uint8_t describe[REQUEST_SIZE];
    make_request(describe, (const uint8_t[16]){0}, UINT32_MAX);
    describe[6] = 2; /* type DESCRIBE */
    for (size_t n = 1; n <= 2; n++) {
        assert_int_equal(raw_exchange_fds(f->name, describe, REQUEST_SIZE, pipe_fds, n),
                         FERRY_INVALID_ARGUMENT);
        assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    }
    assert_int_equal(raw_exchange(f->name, describe, REQUEST_SIZE, -1), FERRY_NOT_SUPPORTED);
    assert_int_equal(ferry__broker_refused(f->broker), ++refused); /* no describer here */
    close(pipe_fds[0]);
    close(pipe_fds[1]);

    /* A CLAIM naming no rank, or carrying a descriptor. */
    make_claim(bad, f->pool_id, FERRY__RANK_NONE);
    assert_int_equal(raw_exchange(f->name, bad, REQUEST_SIZE, -1), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    make_claim(bad, f->pool_id, 0);
    assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
    assert_int_equal(raw_exchange(f->name, bad, REQUEST_SIZE, pipe_fds[0]), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_refused(f->broker), ++refused);
    close(pipe_fds[0]);
    close(pipe_fds[1]);

    /* Still serving, and nothing attached on the way. */
    assert_int_equal(attach_count(f), 0);
    assert_int_equal(raw_exchange(f->name, good, REQUEST_SIZE, -1), FERRY_OK);
    assert_int_equal(raw_exchange(f->name, bad, REQUEST_SIZE, -1), FERRY_OK);
    int fd = -1;
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(attach_count(f), 2);
    assert_int_equal(ferry__broker_refused(f->broker), refused);
    /* The broker closes each connection after replying; give it a moment, then compare. */
    for (int i = 0; i < 1000 && count_fds() != fds_before; i++)
        poll(NULL, 0, 1);
    assert_int_equal(count_fds(), fds_before);
}

static void test_silent_peer_is_refused(void **state)
{
    fixture *f = *state;
    uint8_t reply[64];
    int fd, nfds;

    uint64_t start = ferry__now_ns();
    int s = raw_connect(f->name);
    ssize_t n = raw_receive(s, reply, sizeof(reply), 5000, &fd, &nfds);
    close(s);
    uint64_t elapsed = ferry__now_ns() - start;
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(nfds, 0);
    assert_int_equal(reply[6] | (reply[7] << 8), FERRY_TIMEOUT);
    assert_true(elapsed >= 900 * MS && elapsed < 4000 * MS);
    assert_int_equal(ferry__broker_refused(f->broker), 1);

    int got = -1;
    assert_int_equal(request(f, f->pool_id, 0, &got), FERRY_OK);
    close(got);
}

/* In a child: becomes nobody, then asks; exits 0 if refused with PERMISSION. */
static int child_as_nobody(const fixture *f)
{
    int fd = -1;
    uint64_t size;
    pid_t producer;
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
        return EXIT_NO_DROP;
    ferry_status st =
        ferry__broker_request(f->name, f->pool_id, LABEL, TIMEOUT_NS, &fd, &size, &producer);
    if (st != FERRY_PERMISSION || fd != -1)
        return 1;
    return strcmp(ferry_last_error(), PERMISSION_TEXT) == 0 ? 0 : 2;
}

static void test_other_uid_refused(void **state)
{
    fixture *f = *state;
    if (geteuid() != 0)
        skip();
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(child_as_nobody(f));
    int code = wait_child(child);
    if (code == EXIT_NO_DROP)
        skip();
    assert_int_equal(code, 0);
    assert_int_equal(ferry__broker_refused(f->broker), 1);
    assert_int_equal(attach_count(f), 0);
}

/* ------------------------------------------------------------------------------------
 * Client errors
 * ---------------------------------------------------------------------------------- */

static void test_nobody_listening(void **state)
{
    (void)state;
    uint8_t name[16], pool_id[16] = {0};
    int fd = -1;
    uint64_t size = 7;
    pid_t pid = 7;

    random_bytes(name, sizeof(name));
    assert_int_equal(ferry__broker_request(name, pool_id, LABEL, TIMEOUT_NS, &fd, &size, &pid),
                     FERRY_PRODUCER_GONE);
    assert_non_null(strstr(ferry_last_error(), LABEL " is not reachable: "));
    assert_int_equal(fd, -1);
    assert_int_equal(size, 7);
    assert_int_equal(pid, 7);
}

static void test_timeout_when_nobody_answers(void **state)
{
    (void)state;
    uint8_t name[16], pool_id[16] = {0};
    int fd = -1;
    uint64_t size;
    pid_t pid;
    int listener = make_listener(name);

    uint64_t start = ferry__now_ns();
    assert_int_equal(ferry__broker_request(name, pool_id, LABEL, 200 * MS, &fd, &size, &pid),
                     FERRY_TIMEOUT);
    uint64_t elapsed = ferry__now_ns() - start;
    assert_true(elapsed >= 200 * MS);
    assert_true(elapsed < 1500 * MS);
    assert_string_equal(ferry_last_error(), LABEL " did not reply within 200 ms");
    assert_int_equal(fd, -1);

    /* "Do not wait" fails at once. */
    start = ferry__now_ns();
    assert_int_equal(ferry__broker_request(name, pool_id, LABEL, 0, &fd, &size, &pid),
                     FERRY_TIMEOUT);
    assert_true(ferry__now_ns() - start < 100 * MS);
    close(listener);
}

/* A fake broker: accepts one connection, reads the request, sends a scripted reply. */
typedef struct fake_server {
    int listener;
    uint8_t reply[64];
    size_t reply_len;
    int nfds;    /* descriptors attached to the reply (dups of /dev/null) */
    int got_len; /* length of the request it read */
} fake_server;

static void *fake_server_main(void *arg)
{
    fake_server *fs = arg;
    int conn = accept4(fs->listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0)
        return NULL;
    uint8_t req[64];
    fs->got_len = (int)recv(conn, req, sizeof(req), 0);
    int fds[4];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(fds))];
    } control;
    struct iovec iov = {fs->reply, fs->reply_len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    for (int i = 0; i < fs->nfds; i++)
        fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fs->nfds > 0) {
        memset(&control, 0, sizeof(control));
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)fs->nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)fs->nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)fs->nfds);
    }
    sendmsg(conn, &msg, MSG_NOSIGNAL);
    for (int i = 0; i < fs->nfds; i++)
        close(fds[i]);
    close(conn);
    return NULL;
}

static void make_reply(uint8_t out[REPLY_SIZE], uint16_t status, uint64_t size)
{
    memcpy(out, "FRYR", 4);
    out[4] = 3;
    out[5] = 0;
    out[6] = (uint8_t)status;
    out[7] = (uint8_t)(status >> 8);
    for (int i = 0; i < 8; i++)
        out[8 + i] = (uint8_t)(size >> (8 * i));
    memset(out + 16, 0, 8);
}

/* Writes the reply's detail field (offset 16). */
static void set_detail(uint8_t reply[REPLY_SIZE], uint64_t detail)
{
    for (int i = 0; i < 8; i++)
        reply[16 + i] = (uint8_t)(detail >> (8 * i));
}

/* Runs one request against a fake broker sending reply (len bytes, nfds descriptors): a
 * CLAIM of rank, or an OPEN for FERRY__RANK_NONE; returns the client's status. */
static ferry_status against_fake_as(const uint8_t *reply, size_t len, int nfds, uint32_t rank,
                                    int *fd)
{
    fake_server fs = {.reply_len = len, .nfds = nfds, .got_len = -1};
    uint8_t name[16], pool_id[16] = {1, 2, 3};
    uint64_t size;
    pid_t pid;
    pthread_t thread;

    memcpy(fs.reply, reply, len);
    fs.listener = make_listener(name);
    assert_int_equal(pthread_create(&thread, NULL, fake_server_main, &fs), 0);
    ferry_status st =
        rank != FERRY__RANK_NONE
            ? ferry__broker_claim(name, pool_id, rank, LABEL, TIMEOUT_NS)
            : ferry__broker_request(name, pool_id, LABEL, TIMEOUT_NS, fd, &size, &pid);
    assert_int_equal(pthread_join(thread, NULL), 0);
    close(fs.listener);
    assert_int_equal(fs.got_len, REQUEST_SIZE);
    if (st == FERRY_OK && rank == FERRY__RANK_NONE)
        assert_int_equal(size, 12345);
    return st;
}

static ferry_status against_fake(const uint8_t *reply, size_t len, int nfds, int *fd)
{
    return against_fake_as(reply, len, nfds, FERRY__RANK_NONE, fd);
}

static void test_reply_without_fd(void **state)
{
    (void)state;
    uint8_t reply[REPLY_SIZE];
    int fd = -1;

    make_reply(reply, FERRY_OK, 12345);
    assert_int_equal(against_fake(reply, sizeof(reply), 0, &fd), FERRY_SYSTEM);
    assert_string_equal(ferry_last_error(), "test broker returned no file descriptor");
    assert_int_equal(fd, -1);
}

static void test_bad_replies(void **state)
{
    (void)state;
    uint8_t reply[REPLY_SIZE + 8] = {0};
    int fd = -1;
    int fds_before = count_fds();

    /* The fake itself works: one fd, OK. */
    make_reply(reply, FERRY_OK, 12345);
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_OK);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    fd = -1;

    /* Two descriptors: both closed, failure. */
    assert_int_equal(against_fake(reply, REPLY_SIZE, 2, &fd), FERRY_SYSTEM);
    assert_non_null(strstr(ferry_last_error(), "2 file descriptors"));
    /* Short and long replies, with a descriptor each. */
    assert_int_equal(against_fake(reply, REPLY_SIZE - 1, 1, &fd), FERRY_SYSTEM);
    assert_int_equal(against_fake(reply, REPLY_SIZE + 8, 1, &fd), FERRY_SYSTEM);
    /* Bad magic, and versions 2 (the previous one) and 4. */
    reply[0] = 'X';
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_SYSTEM);
    assert_non_null(strstr(ferry_last_error(), "malformed reply"));
    make_reply(reply, FERRY_OK, 12345);
    reply[4] = 2;
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_SYSTEM);
    reply[4] = 4;
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_SYSTEM);
    /* A granted reply with a nonzero detail (first and last byte). */
    make_reply(reply, FERRY_OK, 12345);
    reply[16] = 1;
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_SYSTEM);
    assert_string_equal(ferry_last_error(),
                        LABEL " sent a malformed reply: a size or detail field its status does "
                              "not allow");
    make_reply(reply, FERRY_OK, 12345);
    reply[23] = 1;
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_SYSTEM);
    /* A refusal with a detail, or with a size. */
    make_reply(reply, FERRY_PERMISSION, 0);
    set_detail(reply, 1);
    assert_int_equal(against_fake(reply, REPLY_SIZE, 0, &fd), FERRY_SYSTEM);
    make_reply(reply, FERRY_PERMISSION, 4096);
    assert_int_equal(against_fake(reply, REPLY_SIZE, 0, &fd), FERRY_SYSTEM);
    /* A refusal is passed through; an unknown status is malformed. */
    make_reply(reply, FERRY_PERMISSION, 0);
    assert_int_equal(against_fake(reply, REPLY_SIZE, 0, &fd), FERRY_PERMISSION);
    assert_string_equal(ferry_last_error(), PERMISSION_TEXT);
    assert_int_equal(against_fake(reply, REPLY_SIZE, 1, &fd), FERRY_SYSTEM);
    make_reply(reply, 999, 0);
    assert_int_equal(against_fake(reply, REPLY_SIZE, 0, &fd), FERRY_SYSTEM);
    assert_int_equal(fd, -1);
    assert_int_equal(count_fds(), fds_before);
}

/* ------------------------------------------------------------------------------------
 * Start, stop, latched errors, names
 * ---------------------------------------------------------------------------------- */

static void test_start_validation(void **state)
{
    (void)state;
    uint8_t pool_id[16] = {0}, name[16];
    ferry__broker *sentinel = (ferry__broker *)(uintptr_t)0x1;
    ferry__broker *b = sentinel;
    ferry__broker_config good = {pool_id, 0, 4096, 1, LABEL, NULL, NULL, NULL, NULL, NULL};
    ferry__broker_config c;

    assert_int_equal(ferry__broker_start(NULL, &b, name), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_start(&good, NULL, name), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry__broker_start(&good, &b, NULL), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(),
                        "broker start: config, broker and name_out must not be NULL");
    c = good;
    c.label = NULL;
    assert_int_equal(ferry__broker_start(&c, &b, name), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), "broker start: label is NULL");
    c = good;
    c.pool_id = NULL;
    assert_int_equal(ferry__broker_start(&c, &b, name), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), LABEL ": pool_id is NULL");
    c = good;
    c.shared_fd = -1;
    assert_int_equal(ferry__broker_start(&c, &b, name), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), LABEL ": shared_fd -1 is not a file descriptor");
    c = good;
    c.consumer_count = 0;
    assert_int_equal(ferry__broker_start(&c, &b, name), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), LABEL ": consumer_count must be at least 1");
    assert_ptr_equal(b, sentinel);
}

static void test_stop_idle_and_null(void **state)
{
    (void)state;
    uint8_t pool_id[16] = {0}, name[16];
    ferry__broker *b = NULL;
    ferry__broker_config config = {pool_id, 0, 4096, 1, LABEL, NULL, NULL, NULL, NULL, NULL};
    char buf[64] = "x";

    assert_int_equal(ferry__broker_start(&config, &b, name), FERRY_OK);
    assert_non_null(b);
    assert_int_equal(ferry__broker_error(b, buf, sizeof(buf)), FERRY_OK);
    assert_string_equal(buf, "");
    assert_int_equal(ferry__broker_refused(b), 0);
    uint64_t start = ferry__now_ns();
    ferry__broker_stop(b);
    assert_true(ferry__now_ns() - start < 500 * MS);
    b = NULL;
    ferry__broker_stop(b);
    ferry__broker_stop(NULL);
    assert_int_equal(ferry__broker_refused(NULL), 0);
    assert_int_equal(ferry__broker_error(NULL, buf, sizeof(buf)), FERRY_OK);

    /* Nobody listens on a stopped broker's name. */
    int fd = -1;
    uint64_t size;
    pid_t pid;
    assert_int_equal(ferry__broker_request(name, pool_id, LABEL, TIMEOUT_NS, &fd, &size, &pid),
                     FERRY_PRODUCER_GONE);
}

/* Stopping does not wait out a peer that connected and stays silent. */
static void test_stop_with_silent_peer(void **state)
{
    fixture *f = *state;
    int s = raw_connect(f->name);
    poll(NULL, 0, 50); /* let the broker accept it and wait for its request */
    uint64_t start = ferry__now_ns();
    ferry__broker_stop(f->broker);
    f->broker = NULL;
    assert_true(ferry__now_ns() - start < 500 * MS);
    close(s);
}

/* A broker stopped while a child its process forked (and did not exec) still holds the
 * listening socket: its name takes no more requests (PRODUCER_GONE at once), rather than
 * queueing them unanswered until the clients' timeouts. */
static void test_stop_while_a_child_holds_the_listener(void **state)
{
    fixture *f = *state;
    int release;
    pid_t child = th_fork_holder(&release);
    ferry__broker_stop(f->broker);
    f->broker = NULL;
    int fd = -1;
    uint64_t start = ferry__now_ns();
    ferry_status st = request(f, f->pool_id, 0, &fd);
    uint64_t took = ferry__now_ns() - start;
    th_holder_exit(child, release);
    assert_int_equal(st, FERRY_PRODUCER_GONE);
    assert_int_equal(fd, -1);
    assert_true(took < 500 * MS);
}

static void test_fd_leaks(void **state)
{
    (void)state;
    int before = count_fds();
    {
        fixture *f;
        void *st;
        uint8_t wrong[16] = {0}, req[REQUEST_SIZE], name[16];
        int fd, pipe_fds[2];
        uint64_t size;
        pid_t pid;

        setup(&st);
        f = st;
        for (int i = 0; i < 5; i++) {
            assert_int_equal(request(f, f->pool_id, (uint32_t)i % CONSUMERS, &fd), FERRY_OK);
            close(fd);
        }
        assert_int_equal(request(f, wrong, 0, &fd), FERRY_MISMATCH);
        assert_int_equal(request(f, f->pool_id, CONSUMERS, &fd), FERRY_INVALID_ARGUMENT);
        make_request(req, f->pool_id, FERRY__RANK_NONE);
        assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
        assert_int_equal(raw_exchange(f->name, req, sizeof(req), pipe_fds[0]),
                         FERRY_INVALID_ARGUMENT);
        assert_int_equal(raw_exchange(f->name, req, sizeof(req) - 1, -1), FERRY_INVALID_ARGUMENT);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        random_bytes(name, sizeof(name));
        assert_int_equal(
            ferry__broker_request(name, f->pool_id, LABEL, TIMEOUT_NS, &fd, &size, &pid),
            FERRY_PRODUCER_GONE);
        int listener = make_listener(name);
        assert_int_equal(ferry__broker_request(name, f->pool_id, LABEL, 20 * MS, &fd, &size, &pid),
                         FERRY_TIMEOUT);
        close(listener);
        assert_int_equal(ferry__broker_refused(f->broker), 4);
        teardown(&st);
    }
    assert_int_equal(count_fds(), before);
}

/* The broker's listening socket, found among this process's descriptors by its name. */
static int find_listener(const uint8_t name[16])
{
    struct sockaddr_un want;
    unsigned want_len = ferry__broker_address(name, &want);
    for (int fd = 0; fd < 4096; fd++) {
        struct sockaddr_un got;
        socklen_t len = sizeof(got);
        int listening = 0;
        socklen_t optlen = sizeof(listening);
        if (getsockname(fd, (struct sockaddr *)&got, &len) != 0 || len != want_len ||
            memcmp(&got, &want, len) != 0)
            continue;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) == 0 && listening)
            return fd;
    }
    return -1;
}

/* Polls the broker until its error latches (5 s at most); returns the status. */
static ferry_status wait_latched(fixture *f, char *buf, size_t size)
{
    uint64_t deadline = ferry__now_ns() + 5000 * MS;
    ferry_status st;
    while ((st = ferry__broker_error(f->broker, buf, size)) == FERRY_OK &&
           ferry__now_ns() < deadline)
        poll(NULL, 0, 1);
    return st;
}

static void test_latched_hangup(void **state)
{
    fixture *f = *state;
    char buf[256];
    int fd = -1;

    /* Sabotage: shut the listening socket down under the broker. */
    int listener = find_listener(f->name);
    assert_true(listener >= 0);
    assert_int_equal(shutdown(listener, SHUT_RDWR), 0);
    assert_int_equal(wait_latched(f, buf, sizeof(buf)), FERRY_SYSTEM);
    assert_string_equal(buf, LABEL " failed: listening socket: hung up");
    /* A truncated copy stays a string. */
    char small[8];
    assert_int_equal(ferry__broker_error(f->broker, small, sizeof(small)), FERRY_SYSTEM);
    assert_string_equal(small, "test br");
    /* The name is released: clients fail fast instead of waiting for a reply. */
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_PRODUCER_GONE);
    assert_int_equal(fd, -1);
}

static void test_latched_accept_failure(void **state)
{
    fixture *f = *state;
    char buf[256];
    int pipe_fds[2];

    /* Sabotage: put a readable pipe where the listening socket was; accept fails on it. */
    int listener = find_listener(f->name);
    assert_true(listener >= 0);
    assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
    assert_int_equal(write(pipe_fds[1], "x", 1), 1);
    /* The raw system call: TSan would rightly call this dup2 a race with the broker thread's
     * use of the descriptor, which is the point of the sabotage. */
    assert_int_equal(syscall(SYS_dup3, pipe_fds[0], listener, O_CLOEXEC), listener);
    /* A broker already sleeping in poll() on the old socket wakes on a connection. */
    struct sockaddr_un addr;
    unsigned len = ferry__broker_address(f->name, &addr);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    (void)connect(s, (struct sockaddr *)&addr, len);
    assert_int_equal(wait_latched(f, buf, sizeof(buf)), FERRY_SYSTEM);
    assert_string_equal(buf, LABEL " failed: accept: Socket operation on non-socket");
    /* Latched once: the first cause stays. */
    assert_int_equal(ferry__broker_error(f->broker, buf, sizeof(buf)), FERRY_SYSTEM);
    assert_string_equal(buf, LABEL " failed: accept: Socket operation on non-socket");
    close(s);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    /* The broker closes its copy (the dup2 target) itself, right after latching. */
    for (int i = 0; i < 5000 && fcntl(listener, F_GETFD) != -1; i++)
        poll(NULL, 0, 1);
    assert_int_equal(fcntl(listener, F_GETFD), -1);
}

/* Lowest descriptor number not in use: with RLIMIT_NOFILE there, no descriptor can be
 * opened. */
static int lowest_free_fd(void)
{
    int fd = dup(0);
    assert_true(fd >= 0);
    close(fd);
    return fd;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* accept failing with EMFILE is transient: the broker backs off without spinning, then
 * serves the connection once descriptors are available again. */
static void test_backoff_on_fd_exhaustion(void **state)
{
    fixture *f = *state;
    struct rlimit saved, low;
    struct sockaddr_un addr;
    uint8_t req[REQUEST_SIZE], reply[64];
    int fd, nfds;

    make_claim(req, f->pool_id, 1);
    unsigned len = ferry__broker_address(f->name, &addr);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    low = saved;
    low.rlim_cur = (rlim_t)lowest_free_fd();
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    int connected = connect(s, (struct sockaddr *)&addr, len);
    ssize_t sent = send(s, req, sizeof(req), MSG_NOSIGNAL);
    uint64_t cpu0 = cpu_ns();
    poll(NULL, 0, 200);
    uint64_t cpu = cpu_ns() - cpu0;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
    assert_int_equal(connected, 0);
    assert_int_equal(sent, REQUEST_SIZE);
    assert_true(cpu < 100 * MS); /* a spinning broker would burn the whole 200 ms */

    ssize_t n = raw_receive(s, reply, sizeof(reply), 5000, &fd, &nfds);
    close(s);
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(reply[6] | (reply[7] << 8), FERRY_OK);
    assert_int_equal(nfds, 0);
    assert_int_equal(fd, -1);
    assert_int_equal(attach_count(f), 1);
    assert_int_equal(ferry__broker_refused(f->broker), 0);
}

/* In a child: becomes nobody, then serves one request as a fake broker handing /dev/null. */
static int child_fake_broker_as_nobody(const uint8_t name[16], int ready_fd)
{
    uint8_t reply[REPLY_SIZE];
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
        return EXIT_NO_DROP;
    fake_server fs = {.reply_len = REPLY_SIZE, .nfds = 1};
    struct sockaddr_un addr;
    unsigned len = ferry__broker_address(name, &addr);
    fs.listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fs.listener < 0 || bind(fs.listener, (struct sockaddr *)&addr, len) != 0 ||
        listen(fs.listener, 1) != 0)
        return 1;
    make_reply(reply, FERRY_OK, 12345);
    memcpy(fs.reply, reply, REPLY_SIZE);
    if (write(ready_fd, "r", 1) != 1)
        return 1;
    fake_server_main(&fs);
    return fs.got_len == REQUEST_SIZE ? 0 : 1;
}

static void test_broker_of_other_uid_rejected(void **state)
{
    (void)state;
    uint8_t name[16], pool_id[16] = {0};
    int ready[2], fd = -1;
    char c;
    uint64_t size;
    pid_t pid;

    if (geteuid() != 0)
        skip();
    random_bytes(name, sizeof(name));
    int fds_before = count_fds();
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(child_fake_broker_as_nobody(name, ready[1]));
    close(ready[1]);
    ssize_t got = read(ready[0], &c, 1);
    close(ready[0]);
    if (got != 1) {
        assert_int_equal(wait_child(child), EXIT_NO_DROP);
        skip();
    }
    assert_int_equal(ferry__broker_request(name, pool_id, LABEL, TIMEOUT_NS, &fd, &size, &pid),
                     FERRY_PERMISSION);
    assert_non_null(strstr(ferry_last_error(), LABEL " belongs to uid 65534"));
    assert_int_equal(fd, -1);
    assert_int_equal(wait_child(child), 0);
    assert_int_equal(count_fds(), fds_before);
}

static void test_names_and_address(void **state)
{
    fixture *f = *state;
    struct sockaddr_un addr;
    char expect[40] = "ferry.";

    for (int i = 0; i < 16; i++)
        snprintf(expect + 6 + 2 * i, 3, "%02x", f->name[i]);
    unsigned len = ferry__broker_address(f->name, &addr);
    assert_int_equal(len, offsetof(struct sockaddr_un, sun_path) + 1 + 6 + 32);
    assert_int_equal(addr.sun_family, AF_UNIX);
    assert_int_equal(addr.sun_path[0], 0);
    assert_memory_equal(addr.sun_path + 1, expect, 38);

    /* A second broker gets another name, and both serve. */
    fixture g = {.memfd = f->memfd};
    pthread_mutex_init(&g.log.lock, NULL);
    memcpy(g.pool_id, f->pool_id, 16);
    ferry__broker_config config = fixture_config(&g);
    assert_int_equal(ferry__broker_start(&config, &g.broker, g.name), FERRY_OK);
    assert_memory_not_equal(g.name, f->name, 16);
    int fd = -1;
    assert_int_equal(request(&g, g.pool_id, 0, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_OK);
    close(fd);
    ferry__broker_stop(g.broker);
    assert_int_equal(g.log.count, 1);
    assert_int_equal(attach_count(f), 1);
    pthread_mutex_destroy(&g.log.lock);
}

/* ------------------------------------------------------------------------------------
 * Concurrent connections
 * ---------------------------------------------------------------------------------- */

/* Waits (5 s at most) for a reply on each of count sockets; records when each came (0 if
 * none) and its status (-1 if none, or a hang-up without a reply). */
static void receive_all(const int *socks, int count, uint64_t *arrived, int *status)
{
    uint64_t deadline = ferry__now_ns() + 5000 * MS;
    int left = count;

    for (int i = 0; i < count; i++) {
        arrived[i] = 0;
        status[i] = -1;
    }
    while (left > 0 && ferry__now_ns() < deadline) {
        struct pollfd p[64];
        int which[64], n = 0;
        for (int i = 0; i < count && n < 64; i++)
            if (arrived[i] == 0) {
                p[n] = (struct pollfd){socks[i], POLLIN, 0};
                which[n++] = i;
            }
        if (poll(p, (nfds_t)n, 100) <= 0)
            continue;
        uint64_t now = ferry__now_ns();
        for (int k = 0; k < n; k++) {
            uint8_t reply[64];
            int fd, nfds, i = which[k];
            if (!p[k].revents)
                continue;
            ssize_t got = raw_receive(socks[i], reply, sizeof(reply), 0, &fd, &nfds);
            assert_int_equal(nfds, 0);
            arrived[i] = now;
            status[i] = got == REPLY_SIZE ? (reply[6] | (reply[7] << 8)) : -1;
            left--;
        }
    }
}

/* Hole 15: silent same-uid peers must not delay a real consumer (the broker used to serve
 * one connection at a time, waiting 1 s for each). */
static void test_silent_peers_do_not_delay_others(void **state)
{
    fixture *f = *state;
    enum { SILENT = 8 };
    int peers[SILENT], status[SILENT], fd = -1;
    uint64_t connected[SILENT], arrived[SILENT];
    int before = count_fds();

    for (int i = 0; i < SILENT; i++) {
        peers[i] = raw_connect(f->name);
        connected[i] = ferry__now_ns();
    }
    (void)wait_fd_count(before + 2 * SILENT); /* the broker holds them all */
    uint64_t start = ferry__now_ns();
    assert_int_equal(request(f, f->pool_id, 1, &fd), FERRY_OK);
    uint64_t elapsed = ferry__now_ns() - start;
    close(fd);
    assert_true(elapsed < 200 * MS);
    assert_int_equal(attach_count(f), 1);
    assert_int_equal(ferry__broker_refused(f->broker), 0);

    /* Each is refused at its own deadline, 1 s after it connected, not one after another. */
    receive_all(peers, SILENT, arrived, status);
    for (int i = 0; i < SILENT; i++) {
        close(peers[i]);
        assert_int_equal(status[i], FERRY_TIMEOUT);
        assert_true(arrived[i] - connected[i] >= 900 * MS);
        assert_true(arrived[i] - connected[i] < 2000 * MS);
    }
    assert_int_equal(ferry__broker_refused(f->broker), SILENT);
    assert_true(wait_fd_count(before));
}

/* Peers connecting 300 ms apart are refused 300 ms apart, each about 1 s after it came. */
static void test_silent_peers_refused_at_own_deadline(void **state)
{
    fixture *f = *state;
    enum { SILENT = 4 };
    int peers[SILENT], status[SILENT];
    uint64_t connected[SILENT], arrived[SILENT];

    for (int i = 0; i < SILENT; i++) {
        if (i > 0)
            poll(NULL, 0, 300);
        peers[i] = raw_connect(f->name);
        connected[i] = ferry__now_ns();
    }
    receive_all(peers, SILENT, arrived, status);
    for (int i = 0; i < SILENT; i++) {
        close(peers[i]);
        assert_int_equal(status[i], FERRY_TIMEOUT);
        assert_true(arrived[i] - connected[i] >= 900 * MS);
        assert_true(arrived[i] - connected[i] < 1600 * MS);
    }
    assert_int_equal(ferry__broker_refused(f->broker), SILENT);
}

/* With 64 connections pending, the next one is refused at once; the broker serves again as
 * soon as the table has room. */
static void test_full_table_refuses_at_once(void **state)
{
    fixture *f = *state;
    enum { TABLE = 64 };
    int peers[TABLE], fd = -1, got, nfds;
    uint8_t reply[64];
    int before = count_fds();

    for (int i = 0; i < TABLE; i++)
        peers[i] = raw_connect(f->name);
    assert_true(wait_fd_count(before + 2 * TABLE));

    uint64_t start = ferry__now_ns();
    int extra = raw_connect(f->name);
    ssize_t n = raw_receive(extra, reply, sizeof(reply), 5000, &got, &nfds);
    close(extra);
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(nfds, 0);
    assert_int_equal(reply[6] | (reply[7] << 8), FERRY_TIMEOUT);
    assert_true(ferry__now_ns() - start < 500 * MS);
    assert_int_equal(ferry__broker_refused(f->broker), 1);
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_TIMEOUT);
    assert_string_equal(ferry_last_error(), LABEL " refused the request: timed out");
    assert_int_equal(fd, -1);
    assert_int_equal(ferry__broker_refused(f->broker), 2);

    /* Peers that hang up are answered (an empty request) and closed at once. */
    for (int i = 0; i < TABLE; i++)
        close(peers[i]);
    assert_true(wait_fd_count(before));
    assert_int_equal(ferry__broker_refused(f->broker), 2 + TABLE);
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(attach_count(f), 1);
}

/* Stopping closes every pending connection at once, without a reply. */
static void test_stop_closes_pending(void **state)
{
    fixture *f = *state;
    enum { SILENT = 4 };
    int peers[SILENT], got, nfds;
    uint8_t reply[64];
    int before = count_fds();

    for (int i = 0; i < SILENT; i++)
        peers[i] = raw_connect(f->name);
    assert_true(wait_fd_count(before + 2 * SILENT));
    uint64_t start = ferry__now_ns();
    ferry__broker_stop(f->broker);
    f->broker = NULL;
    assert_true(ferry__now_ns() - start < 500 * MS);
    assert_int_equal(count_fds(), before + SILENT - 2); /* and the listener and eventfd */
    for (int i = 0; i < SILENT; i++) {
        ssize_t n = raw_receive(peers[i], reply, sizeof(reply), 1000, &got, &nfds);
        close(peers[i]);
        assert_true(n <= 0);
        assert_int_equal(nfds, 0);
    }
}

/* ------------------------------------------------------------------------------------
 * Rank claims
 * ---------------------------------------------------------------------------------- */

static void test_rank_none_opens_without_attach(void **state)
{
    fixture *f = *state;
    int fd = -1;
    struct stat a, b;

    assert_int_equal(request(f, f->pool_id, FERRY__RANK_NONE, &fd), FERRY_OK);
    assert_int_equal(fstat(fd, &a), 0);
    assert_int_equal(fstat(f->memfd, &b), 0);
    assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
    close(fd);
    /* Even while on_attach would refuse: it is not asked. */
    set_attach_answer(f, FERRY_RANK_IN_USE, 4242);
    assert_int_equal(request(f, f->pool_id, FERRY__RANK_NONE, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(attach_count(f), 0);
    assert_int_equal(ferry__broker_refused(f->broker), 0);
}

/* A RELEASE reaches on_release with the rank and the peer's pid; a rank the pool lacks is
 * refused before it; a broker without on_release answers NOT_SUPPORTED. */
static void test_release(void **state)
{
    fixture *f = *state;
    assert_int_equal(ferry__broker_release(f->name, f->pool_id, 2, LABEL, TIMEOUT_NS), FERRY_OK);
    pthread_mutex_lock(&f->log.lock);
    assert_int_equal(f->log.releases, 1);
    assert_int_equal(f->log.release_rank, 2);
    assert_int_equal(f->log.release_pid, getpid());
    pthread_mutex_unlock(&f->log.lock);
    assert_int_equal(ferry__broker_release(f->name, f->pool_id, CONSUMERS, LABEL, TIMEOUT_NS),
                     FERRY_INVALID_ARGUMENT);
    assert_int_equal(
        ferry__broker_release(f->name, f->pool_id, FERRY__RANK_NONE, LABEL, TIMEOUT_NS),
        FERRY_INVALID_ARGUMENT);
    pthread_mutex_lock(&f->log.lock);
    assert_int_equal(f->log.releases, 1);
    pthread_mutex_unlock(&f->log.lock);
    assert_int_equal(attach_count(f), 0);

    uint8_t name[16];
    ferry__broker *b = NULL;
    ferry__broker_config bare = fixture_config(f);
    bare.on_release = NULL;
    assert_int_equal(ferry__broker_start(&bare, &b, name), FERRY_OK);
    assert_int_equal(ferry__broker_release(name, f->pool_id, 1, LABEL, TIMEOUT_NS),
                     FERRY_NOT_SUPPORTED);
    ferry__broker_stop(b);
}

/* Runs fn in a process of a new PID namespace (a grandchild: pid 1 there), with arg; its exit
 * status, or -1 (and the reason printed) where this process may not make one. */
static int in_new_pid_namespace(int (*fn)(void *), void *arg)
{
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        if (unshare(CLONE_NEWPID) != 0) {
            char why = (char)errno;
            (void)!write(ready[1], &why, 1);
            _exit(0);
        }
        close(ready[1]);
        pid_t inner = fork();
        if (inner == 0)
            _exit(fn(arg));
        int status = 0;
        if (inner < 0 || waitpid(inner, &status, 0) != inner || !WIFEXITED(status))
            _exit(99);
        _exit(WEXITSTATUS(status));
    }
    close(ready[1]);
    char why = 0;
    ssize_t n = read(ready[0], &why, 1);
    close(ready[0]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    if (n == 1) {
        fprintf(stderr, "test_broker: no new PID namespace here (unshare: %s)\n", strerror(why));
        return -1;
    }
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* In a new PID namespace: a claim of the fixture's rank 1 fails before it is sent, since the
 * producer (the test process, above that namespace) reads as pid 0 there. */
static int claim_unseen_producer(void *arg)
{
    fixture *f = arg;
    ferry_status st = ferry__broker_claim(f->name, f->pool_id, 1, LABEL, TIMEOUT_NS);
    if (st != FERRY_PERMISSION || !strstr(ferry_last_error(), "another PID namespace")) {
        fprintf(stderr, "claim from a new PID namespace: %s: %s\n", ferry_status_name(st),
                ferry_last_error());
        return 1;
    }
    return 0;
}

/* In a new PID namespace: a broker of its own serving the fixture's memfd; its name goes to
 * the pipe, then it serves until the pipe's other end closes. */
typedef struct unseen_broker {
    fixture *f;
    int name_pipe[2], stop_pipe[2];
} unseen_broker;

static int serve_unseen(void *arg)
{
    unseen_broker *u = arg;
    uint8_t name[16];
    ferry__broker *b = NULL;
    ferry__broker_config config = fixture_config(u->f);
    if (ferry__broker_start(&config, &b, name) != FERRY_OK ||
        write(u->name_pipe[1], name, sizeof(name)) != (ssize_t)sizeof(name))
        return 1;
    char c;
    while (read(u->stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    ferry__broker_stop(b);
    return 0;
}

/* A claim from a PID namespace where the producer is not seen fails at the claimant, before
 * anything is sent: the broker records nothing. */
static void test_pid_namespaces(void **state)
{
    fixture *f = *state;
    int rc = in_new_pid_namespace(claim_unseen_producer, f);
    if (rc < 0)
        skip();
    assert_int_equal(rc, 0);
    assert_int_equal(attach_count(f), 0);
}

/* The fixture without its broker: for a test that forks a broker of its own while the test
 * process has no thread (a fork of a threaded process may not start threads under TSan). */
static int setup_no_broker(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    pthread_mutex_init(&f->log.lock, NULL);
    random_bytes(f->pool_id, sizeof(f->pool_id));
    f->memfd = make_memfd(POOL_SIZE, POOL_SEED);
    *state = f;
    return 0;
}

/* A broker in a PID namespace below the test process cannot see the test process's pid: it
 * refuses every request naming a rank (CLAIM, RELEASE, NOTIFY) with PERMISSION, while opening
 * the pool (no rank) still works. */
static void test_unseen_claimant_refused(void **state)
{
    fixture *f = *state;
    unseen_broker u = {.f = f};
    assert_int_equal(pipe(u.name_pipe), 0);
    assert_int_equal(pipe(u.stop_pipe), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(u.name_pipe[0]);
        close(u.stop_pipe[1]); /* the broker serves until the test closes its end */
        _exit(in_new_pid_namespace(serve_unseen, &u) == 0 ? 0 : 1);
    }
    close(u.name_pipe[1]);
    close(u.stop_pipe[0]);
    uint8_t name[16];
    ssize_t got = read(u.name_pipe[0], name, sizeof(name));
    close(u.name_pipe[0]);
    if (got != (ssize_t)sizeof(name)) { /* no new PID namespace here: the child said why */
        close(u.stop_pipe[1]);
        int status = 0;
        assert_int_equal(waitpid(child, &status, 0), child);
        skip();
    }
    assert_int_equal(ferry__broker_claim(name, f->pool_id, 1, LABEL, TIMEOUT_NS), FERRY_PERMISSION);
    assert_non_null(strstr(ferry_last_error(), "names ranks only to those it can see"));
    assert_string_equal(ferry_last_error(), PERMISSION_TEXT);
    assert_int_equal(ferry__broker_release(name, f->pool_id, 1, LABEL, TIMEOUT_NS),
                     FERRY_PERMISSION);
    assert_string_equal(ferry_last_error(), PERMISSION_TEXT);
    int event_fd = eventfd(0, EFD_CLOEXEC);
    assert_true(event_fd >= 0);
    int before = count_fds();
    assert_int_equal(ferry__broker_notify(name, f->pool_id, 1, LABEL, TIMEOUT_NS, event_fd),
                     FERRY_PERMISSION);
    assert_string_equal(ferry_last_error(), PERMISSION_TEXT);
    assert_int_equal(count_fds(), before);
    close(event_fd);
    int fd = -1;
    uint64_t size = 0;
    pid_t producer = 0;
    assert_int_equal(
        ferry__broker_request(name, f->pool_id, LABEL, TIMEOUT_NS, &fd, &size, &producer),
        FERRY_OK);
    assert_true(fd >= 0 && producer > 0 && size == POOL_SIZE);
    close(fd);
    close(u.stop_pipe[1]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_rank_in_use(void **state)
{
    fixture *f = *state;
    uint8_t req[REQUEST_SIZE], reply[64];
    int fd = -1, got, nfds;
    int before = count_fds();

    set_attach_answer(f, FERRY_RANK_IN_USE, 4242);
    assert_int_equal(request(f, f->pool_id, 2, &fd), FERRY_RANK_IN_USE);
    assert_string_equal(ferry_last_error(), "rank 2 is held by live process 4242 (a rank belongs "
                                            "to one live process at a time)");
    assert_int_equal(fd, -1);
    assert_int_equal(ferry__broker_refused(f->broker), 1);
    assert_int_equal(attach_count(f), 1);
    assert_int_equal(f->log.rank[0], 2);
    assert_int_equal(f->log.pid[0], getpid());

    /* The bytes: status 17, size 0, detail the holder's pid, no descriptor. */
    make_claim(req, f->pool_id, 3);
    int s = raw_connect(f->name);
    raw_send(s, req, sizeof(req), -1);
    ssize_t n = raw_receive(s, reply, sizeof(reply), 5000, &got, &nfds);
    close(s);
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(nfds, 0);
    assert_int_equal(reply[6] | (reply[7] << 8), FERRY_RANK_IN_USE);
    assert_int_equal(get64(reply + 8), 0);
    assert_int_equal(get64(reply + 16), 4242);
    assert_true(wait_fd_count(before));

    /* Another refusal of the callback is passed on; RANK_IN_USE without a holder is not. */
    set_attach_answer(f, FERRY_CLOSING, 0);
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_CLOSING);
    assert_string_equal(ferry_last_error(), LABEL " refused the request: pool is closing");
    set_attach_answer(f, FERRY_RANK_IN_USE, 0);
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_SYSTEM);
    assert_int_equal(fd, -1);
    set_attach_answer(f, FERRY_OK, 0);
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(ferry__broker_refused(f->broker), 4);
    assert_true(wait_fd_count(before));
}

/* The client's checks of a RANK_IN_USE reply, against a fake broker. */
static void test_rank_in_use_replies(void **state)
{
    (void)state;
    uint8_t reply[REPLY_SIZE];
    int fd = -1;
    int fds_before = count_fds();

    make_reply(reply, FERRY_RANK_IN_USE, 0);
    set_detail(reply, 4242);
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 0, 3, &fd), FERRY_RANK_IN_USE);
    assert_string_equal(ferry_last_error(), "rank 3 is held by live process 4242 (a rank belongs "
                                            "to one live process at a time)");
    /* With a descriptor, with a size, or in answer to a request claiming no rank. */
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 1, 3, &fd), FERRY_SYSTEM);
    assert_non_null(strstr(ferry_last_error(), "malformed reply"));
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 0, FERRY__RANK_NONE, &fd), FERRY_SYSTEM);
    make_reply(reply, FERRY_RANK_IN_USE, 4096);
    set_detail(reply, 4242);
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 0, 3, &fd), FERRY_SYSTEM);
    /* No holder, or one that is no pid. */
    make_reply(reply, FERRY_RANK_IN_USE, 0);
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 0, 3, &fd), FERRY_SYSTEM);
    set_detail(reply, 0x80000000u);
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 0, 3, &fd), FERRY_SYSTEM);
    set_detail(reply, 1ull << 32 | 4242);
    assert_int_equal(against_fake_as(reply, REPLY_SIZE, 0, 3, &fd), FERRY_SYSTEM);
    assert_int_equal(fd, -1);
    assert_int_equal(count_fds(), fds_before);
}

/* ------------------------------------------------------------------------------------
 * Fork
 * ---------------------------------------------------------------------------------- */

/* In a child: forgets the broker (or, with stop, stops it as a child would by mistake);
 * exits 0 if exactly its listener, eventfd and one pending connection were closed. */
static int child_forget(ferry__broker *broker, int stop)
{
    int before = count_fds();
    if (stop)
        ferry__broker_stop(broker);
    else
        ferry__broker_forget(broker);
    ferry__broker_forget(NULL);
    return count_fds() == before - 3 ? 0 : 1;
}

static void test_forget_in_forked_child(void **state)
{
    fixture *f = *state;
    int fd = -1, got, nfds;
    uint8_t reply[64];
    int before = count_fds();

    /* One silent peer pending; one request served after it, so that it is in the table. */
    int silent = raw_connect(f->name);
    uint64_t connected = ferry__now_ns();
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_OK);
    close(fd);
    assert_true(wait_fd_count(before + 2));
    for (int stop = 0; stop < 2; stop++) {
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0)
            _exit(child_forget(f->broker, stop));
        assert_int_equal(wait_child(child), 0);
    }

    /* The parent's broker goes on: it serves, and still times its pending peer out. */
    assert_int_equal(request(f, f->pool_id, 1, &fd), FERRY_OK);
    close(fd);
    assert_int_equal(attach_count(f), 2);
    ssize_t n = raw_receive(silent, reply, sizeof(reply), 5000, &got, &nfds);
    close(silent);
    assert_int_equal(n, REPLY_SIZE);
    assert_int_equal(reply[6] | (reply[7] << 8), FERRY_TIMEOUT);
    assert_true(ferry__now_ns() - connected >= 900 * MS);
    assert_true(wait_fd_count(before));
}

/* ------------------------------------------------------------------------------------
 * Client timeouts
 * ---------------------------------------------------------------------------------- */

/* Times one request to name with timeout_ns; checks TIMEOUT with message. */
static uint64_t timed_timeout(const uint8_t name[16], uint64_t timeout_ns, const char *message)
{
    uint8_t pool_id[16] = {0};
    int fd = -1;
    uint64_t size;
    pid_t pid;
    uint64_t start = ferry__now_ns();
    ferry_status st = ferry__broker_request(name, pool_id, LABEL, timeout_ns, &fd, &size, &pid);
    uint64_t elapsed = ferry__now_ns() - start;
    assert_int_equal(st, FERRY_TIMEOUT);
    assert_string_equal(ferry_last_error(), message);
    assert_int_equal(fd, -1);
    return elapsed;
}

static void test_timeout_is_prompt(void **state)
{
    (void)state;
    uint8_t name[16];
    int fillers[64], filled = 0;
    int fds_before = count_fds();

    /* A broker that accepts nothing: the connection is queued, the reply never comes. */
    int listener = make_listener(name);
    uint64_t t = timed_timeout(name, 100 * MS, LABEL " did not reply within 100 ms");
    assert_true(t >= 100 * MS && t < 300 * MS);
    assert_true(timed_timeout(name, 0, LABEL " did not reply within 0 ms") < 50 * MS);
    close(listener);

    /* A broker whose backlog is full: connect itself cannot complete. */
    listener = make_listener_with_backlog(name, 0);
    struct sockaddr_un addr;
    unsigned len = ferry__broker_address(name, &addr);
    while (filled < 64) {
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(s >= 0);
        if (connect(s, (struct sockaddr *)&addr, len) != 0) {
            assert_int_equal(errno, EAGAIN);
            close(s);
            break;
        }
        fillers[filled++] = s;
    }
    assert_true(filled < 64);
    t = timed_timeout(name, 100 * MS, LABEL " did not accept the connection within 100 ms");
    assert_true(t >= 100 * MS && t < 300 * MS);
    assert_true(timed_timeout(name, 0, LABEL " did not accept the connection within 0 ms") <
                50 * MS);
    for (int i = 0; i < filled; i++)
        close(fillers[i]);
    close(listener);
    assert_int_equal(count_fds(), fds_before);
}

/* A timeout of 0 against a live broker: one attempt, no waiting, nothing left behind. */
static void test_zero_timeout_makes_one_attempt(void **state)
{
    fixture *f = *state;
    int fd = -1;
    uint64_t size;
    pid_t pid;
    int before = count_fds();

    uint64_t start = ferry__now_ns();
    ferry_status st = ferry__broker_request(f->name, f->pool_id, LABEL, 0, &fd, &size, &pid);
    assert_true(ferry__now_ns() - start < 50 * MS);
    assert_true(st == FERRY_TIMEOUT || st == FERRY_OK);
    if (st == FERRY_OK)
        close(fd);
    assert_true(wait_fd_count(before));
    assert_int_equal(request(f, f->pool_id, 0, &fd), FERRY_OK);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_handoff_to_child, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_children_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_received_fd_is_cloexec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hand_made_request_and_reply_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_pool_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rank_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_peer_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_uid_refused, setup, teardown),
        cmocka_unit_test(test_nobody_listening),
        cmocka_unit_test(test_timeout_when_nobody_answers),
        cmocka_unit_test(test_reply_without_fd),
        cmocka_unit_test(test_bad_replies),
        cmocka_unit_test(test_start_validation),
        cmocka_unit_test(test_stop_idle_and_null),
        cmocka_unit_test_setup_teardown(test_stop_with_silent_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_while_a_child_holds_the_listener, setup,
                                        teardown),
        cmocka_unit_test(test_fd_leaks),
        cmocka_unit_test_setup_teardown(test_latched_hangup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latched_accept_failure, setup, teardown),
        cmocka_unit_test(test_broker_of_other_uid_rejected),
        cmocka_unit_test_setup_teardown(test_backoff_on_fd_exhaustion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_and_address, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_peers_do_not_delay_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_peers_refused_at_own_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_table_refuses_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_closes_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rank_none_opens_without_attach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rank_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pid_namespaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unseen_claimant_refused, setup_no_broker, teardown),
        cmocka_unit_test(test_rank_in_use_replies),
        cmocka_unit_test_setup_teardown(test_forget_in_forked_child, setup, teardown),
        cmocka_unit_test(test_timeout_is_prompt),
        cmocka_unit_test_setup_teardown(test_zero_timeout_makes_one_attempt, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
