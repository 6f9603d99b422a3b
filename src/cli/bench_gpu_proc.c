/* The producer's side of the GPU bench's worker processes: the results region, starting the
 * workers, the channel, liveness, progress waits and the end of the run. No wait here is
 * without a limit, and every one of them notices a worker that died or failed. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/bench_gpu.h"

#define CHECK_PERIOD_NS 2000000ull    /* liveness checks during hot loops */
#define POLL_SLICE_MS   10            /* longest single sleep on a full channel */
#define REAP_GRACE_NS   1000000000ull /* how long a worker that closed its channel may take */

int gb_fail(gb_run *run, const char *fmt, ...)
{
    if (!run->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(run->error, sizeof(run->error), fmt, ap);
        va_end(ap);
        run->failed = 1;
    }
    return -1;
}

/* ---- the region: page 0 parameters, then the flag words, then one record per rank ------ */

#define RANKS_AT (GB_PAGE + GB_FLAG_BYTES)

static size_t region_size(uint32_t consumers)
{
    return RANKS_AT + (size_t)consumers * sizeof(gb_rank);
}

static void attach(gb_region *r)
{
    r->params = r->base;
    r->flags = (uint32_t *)((uint8_t *)r->base + GB_PAGE);
    r->ranks = (gb_rank *)((uint8_t *)r->base + RANKS_AT);
}

int gb_region_create(const gb_params *p, gb_region *r)
{
    size_t bytes = region_size(p->consumers);
    memset(r, 0, sizeof(*r));
    r->fd = memfd_create("ferry-bench-gpu", MFD_CLOEXEC);
    if (r->fd < 0 || (r->fd = bench_high_fd(r->fd)) < 0 || ftruncate(r->fd, (off_t)bytes) != 0)
        return -1;
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (base == MAP_FAILED)
        return -1;
    r->base = base;
    r->bytes = bytes;
    attach(r);
    *r->params = *p;
    r->params->magic = GB_MAGIC;
    r->params->region_bytes = bytes;
    return 0;
}

int gb_region_map(int fd, gb_region *r)
{
    struct stat st;
    memset(r, 0, sizeof(*r));
    r->fd = fd;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < RANKS_AT)
        return -1;
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return -1;
    r->base = base;
    r->bytes = (size_t)st.st_size;
    attach(r);
    if (r->params->magic != GB_MAGIC || r->params->region_bytes != r->bytes ||
        r->params->consumers > GB_MAX_RANKS || region_size(r->params->consumers) != r->bytes) {
        gb_region_unmap(r);
        errno = EINVAL;
        return -1;
    }
    return 0;
}

void gb_region_unmap(gb_region *r)
{
    if (r->base)
        munmap(r->base, r->bytes);
    if (r->fd >= 0)
        close(r->fd);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

/* ---- starting the workers ------------------------------------------------------------------ */

static int spawn_one(gb_run *run, uint32_t rank, int child_sock)
{
    char rank_text[16];
    snprintf(rank_text, sizeof(rank_text), "%u", rank);
    char *argv[] = {"ferry", "bench-gpu-worker", "--rank", rank_text, "--fd",
                    "3",     "--results-fd",     "4",      NULL};
    int fds[2] = {child_sock, run->region.fd};
    pid_t pid;
    int err = cli_spawn_self(argv, fds, 2, &pid);
    if (err)
        return gb_fail(run, "starting consumer rank %u failed: %s", rank, strerror(err));
    run->workers[rank].pid = pid;
    run->workers[rank].running = 1;
    return 0;
}

int gb_spawn_workers(gb_run *run)
{
    for (uint32_t r = 0; r < run->consumers; r++) {
        int child = -1, err = cli_channel(&run->workers[r].sock, &child);
        int rc = err ? gb_fail(run, "the channel of consumer rank %u: %s", r, strerror(err))
                     : spawn_one(run, r, child);
        if (child >= 0)
            close(child);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* ---- liveness ------------------------------------------------------------------------------- */

static const char *rank_message(const gb_run *run, uint32_t rank)
{
    const char *m = run->region.ranks[rank].message;
    return m[0] ? m : "no message";
}

static int worker_died(gb_run *run, uint32_t rank)
{
    const gb_worker *w = &run->workers[rank];
    char why[96];
    cli_exit_reason(w->wstatus, why, sizeof(why));
    if (WIFSIGNALED(w->wstatus))
        return gb_fail(run, "consumer rank %u (pid %d) %s", rank, (int)w->pid, why);
    return gb_fail(run, "consumer rank %u (pid %d) %s before the end: %s", rank, (int)w->pid, why,
                   rank_message(run, rank));
}

static int reap(gb_run *run, uint32_t rank, int flags)
{
    gb_worker *w = &run->workers[rank];
    if (!w->running || waitpid(w->pid, &w->wstatus, flags) != w->pid)
        return 0;
    w->running = 0;
    return 1;
}

static uint32_t rank_state(const gb_run *run, uint32_t rank)
{
    return __atomic_load_n(&run->region.ranks[rank].state, __ATOMIC_ACQUIRE);
}

int gb_check_workers(gb_run *run)
{
    run->last_check_ns = cli_now_ns();
    for (uint32_t r = 0; r < run->consumers; r++) {
        if (rank_state(run, r) == GB_FAILED)
            return gb_fail(run, "consumer rank %u failed: %s", r, rank_message(run, r));
        if (reap(run, r, WNOHANG))
            return worker_died(run, r);
    }
    return run->failed ? -1 : 0;
}

int gb_check_workers_often(gb_run *run)
{
    if (cli_now_ns() - run->last_check_ns < CHECK_PERIOD_NS)
        return run->failed ? -1 : 0;
    return gb_check_workers(run);
}

int gb_wait_ready(gb_run *run)
{
    uint64_t deadline = cli_now_ns() + run->region.params->timeout_ns;
    for (uint32_t r = 0; r < run->consumers; r++) {
        while (rank_state(run, r) == GB_STARTING) {
            if (gb_check_workers(run) != 0)
                return -1;
            if (cli_now_ns() >= deadline)
                return gb_fail(run, "consumer rank %u did not start within %llu ms", r,
                               (unsigned long long)(run->region.params->timeout_ns / 1000000));
            cli_sleep_ns(200000);
        }
    }
    return gb_check_workers(run);
}

/* ---- the channel ---------------------------------------------------------------------------- */

static int channel_broken(gb_run *run, uint32_t rank, int err)
{
    uint64_t deadline = cli_now_ns() + REAP_GRACE_NS;
    while (cli_now_ns() < deadline) {
        if (reap(run, rank, WNOHANG))
            return worker_died(run, rank);
        cli_sleep_ns(1000000);
    }
    return gb_fail(run, "sending to consumer rank %u failed: %s", rank, strerror(err));
}

static int send_one(gb_run *run, uint32_t rank, const gb_msg *msg)
{
    uint64_t deadline = cli_now_ns() + run->region.params->timeout_ns;
    int sock = run->workers[rank].sock;
    for (;;) {
        ssize_t n = send(sock, msg, sizeof(*msg), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n == (ssize_t)sizeof(*msg))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n >= 0 || errno != EAGAIN)
            return channel_broken(run, rank, n < 0 ? errno : EMSGSIZE);
        if (gb_check_workers(run) != 0)
            return -1;
        if (cli_now_ns() >= deadline)
            return gb_fail(run, "consumer rank %u took no message for %llu ms", rank,
                           (unsigned long long)(run->region.params->timeout_ns / 1000000));
        struct pollfd pfd = {.fd = sock, .events = POLLOUT};
        poll(&pfd, 1, POLL_SLICE_MS);
    }
}

int gb_send(gb_run *run, uint32_t nranks, gb_msg *msg)
{
    msg->seq = ++run->seq;
    for (uint32_t r = 0; r < nranks; r++)
        if (send_one(run, r, msg) != 0)
            return -1;
    return 0;
}

int gb_wait_progress(gb_run *run, uint32_t nranks, uint64_t seq)
{
    uint64_t deadline = cli_now_ns() + run->region.params->timeout_ns;
    for (uint32_t r = 0; r < nranks; r++) {
        uint64_t *word = &run->region.ranks[r].progress;
        while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < seq) {
            if (gb_check_workers_often(run) != 0)
                return -1;
            if (cli_now_ns() >= deadline)
                return gb_fail(run,
                               "consumer rank %u did not finish message %llu within %llu ms "
                               "(it is at %llu)",
                               r, (unsigned long long)seq,
                               (unsigned long long)(run->region.params->timeout_ns / 1000000),
                               (unsigned long long)__atomic_load_n(word, __ATOMIC_ACQUIRE));
            cli_sleep_ns(20000);
        }
    }
    return gb_check_workers(run);
}

int gb_phase_begin(gb_run *run, uint32_t nranks)
{
    gb_msg m;
    memset(&m, 0, sizeof(m));
    m.type = GB_MSG_BEGIN;
    return gb_send(run, nranks, &m);
}

int gb_phase_end(gb_run *run, uint32_t nranks)
{
    gb_msg m;
    memset(&m, 0, sizeof(m));
    m.type = GB_MSG_END;
    if (gb_send(run, nranks, &m) != 0)
        return -1;
    return gb_wait_progress(run, nranks, m.seq);
}

void gb_counters(const gb_run *run, uint64_t *verified, uint64_t *errors)
{
    *verified = *errors = 0;
    for (uint32_t r = 0; r < run->consumers; r++) {
        *verified += __atomic_load_n(&run->region.ranks[r].verified, __ATOMIC_ACQUIRE);
        *errors += __atomic_load_n(&run->region.ranks[r].errors, __ATOMIC_ACQUIRE);
    }
}

/* ---- the end -------------------------------------------------------------------------------- */

static int wait_exits(gb_run *run)
{
    uint64_t deadline = cli_now_ns() + run->region.params->timeout_ns;
    for (uint32_t r = 0; r < run->consumers; r++) {
        while (run->workers[r].running && !reap(run, r, WNOHANG)) {
            if (cli_now_ns() >= deadline)
                return gb_fail(run, "consumer rank %u (pid %d) did not exit after the run", r,
                               (int)run->workers[r].pid);
            cli_sleep_ns(1000000);
        }
        const gb_worker *w = &run->workers[r];
        /* Exit 1 with DONE: verification errors, counted in the report. */
        if (!WIFEXITED(w->wstatus) || rank_state(run, r) != GB_DONE || WEXITSTATUS(w->wstatus) > 1)
            return worker_died(run, r);
    }
    return 0;
}

int gb_finish_workers(gb_run *run)
{
    gb_msg m;
    memset(&m, 0, sizeof(m));
    m.type = GB_MSG_DONE;
    if (gb_send(run, run->consumers, &m) != 0)
        return -1;
    return wait_exits(run);
}

void gb_kill_workers(gb_run *run)
{
    for (uint32_t r = 0; r < run->consumers; r++) {
        if (!run->workers[r].running)
            continue;
        kill(run->workers[r].pid, SIGKILL);
        reap(run, r, 0);
    }
}
