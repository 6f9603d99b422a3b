/* The benchmark harness: the results region, the worker processes (started by re-executing
 * this binary, never a bare fork() of a process that runs a pool's threads), the channel,
 * liveness, progress waits and the end of a run; and the worker's side of the same. No wait
 * here is without a limit, and every one of them notices a worker that died or failed. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define MAGIC           0x6665727279424e43ull /* "ferryBNC" */
#define CHECK_PERIOD_NS 2000000ull            /* liveness checks during hot loops */
#define SLICE_NS        10000000ull           /* longest single sleep before re-checking */
#define REAP_GRACE_NS   1000000000ull /* how long a worker that closed its channel may take */
#define RANKS_AT        (BENCH_PAGE + BENCH_FLAG_BYTES)

extern char **environ;

int run_fail(bench_run *run, const char *fmt, ...)
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

/* The mode's tables start on a page of their own. */
static size_t tables_at(uint32_t consumers)
{
    size_t end = RANKS_AT + (size_t)consumers * sizeof(bench_rank);
    return (end + BENCH_PAGE - 1) & ~(size_t)(BENCH_PAGE - 1);
}

/* Makes fd close-on-exec and numbered at least 10 (the spawn's dup2 to 3 and 4 never meets it). */
static int high_fd(int fd)
{
    int nfd = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 10), err = errno;
    if (fd >= 0)
        close(fd);
    errno = err;
    return nfd;
}

/* Maps the region in fd, checking that it is one of ours and whole: 0, or -1 with errno. */
static int region_map(int fd, bench_region *r)
{
    struct stat st;
    r->fd = fd;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < RANKS_AT)
        return -1;
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return -1;
    r->base = r->p = base;
    r->bytes = (size_t)st.st_size;
    if (r->p->magic != MAGIC || r->p->region_bytes != r->bytes ||
        r->p->consumers > BENCH_MAX_RANKS ||
        tables_at(r->p->consumers) + r->p->table_bytes != r->bytes) {
        errno = EINVAL;
        return -1;
    }
    r->flags = (uint32_t *)((uint8_t *)base + BENCH_PAGE);
    r->ranks = (bench_rank *)((uint8_t *)base + RANKS_AT);
    r->tables = (uint8_t *)base + tables_at(r->p->consumers);
    return 0;
}

/* The producer's region: the params, the rest zero, mapped as the workers map it. */
static int region_create(bench_run *run)
{
    bench_params *p = &run->params;
    p->magic = MAGIC;
    p->consumers = run->consumers;
    p->producer_pid = (int32_t)getpid();
    p->region_bytes = tables_at(run->consumers) + p->table_bytes;
    int fd = run->region.fd = high_fd(memfd_create("ferry-bench", MFD_CLOEXEC));
    if (fd < 0 || ftruncate(fd, (off_t)p->region_bytes) != 0 ||
        pwrite(fd, p, sizeof(*p), 0) != (ssize_t)sizeof(*p))
        return run_fail(run, "creating the results region of %llu bytes failed: %s",
                        (unsigned long long)p->region_bytes, strerror(errno));
    if (region_map(fd, &run->region) != 0)
        return run_fail(run, "mapping the results region of %llu bytes failed: %s",
                        (unsigned long long)p->region_bytes, strerror(errno));
    return 0;
}

/* The worker command: this binary as `ferry bench-worker` (rank, channel 3, region 4), or,
 * for workers in a network namespace of their own, the same wrapped in `ip netns exec NAME`
 * (which then executes it: the worker is still this process's child). */
static int worker_argv(bench_run *run, char *exe, size_t exe_size, char *rank_text, char **argv)
{
    char *tail[] = {"bench-worker", "--rank", rank_text, "--fd", "3", "--results-fd", "4", NULL};
    int n = 0;
    if (run->params.netns[0]) {
        ssize_t len = readlink("/proc/self/exe", exe, exe_size - 1);
        if (len <= 0)
            return run_fail(run, "finding this program for ip netns exec failed: %s",
                            strerror(errno));
        exe[len] = '\0';
        argv[n++] = "ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = run->params.netns;
    }
    argv[n++] = run->params.netns[0] ? exe : "ferry";
    memcpy(argv + n, tail, sizeof(tail));
    return 0;
}

/* Every consumer gets a SOCK_SEQPACKET channel; its end and the region become descriptors 3
 * and 4 of `ferry bench-worker`. */
static int spawn_workers(bench_run *run)
{
    char rank_text[16], exe[4096], *argv[16];
    const char *ns = run->params.netns;
    if (worker_argv(run, exe, sizeof(exe), rank_text, argv) != 0)
        return -1;
    for (uint32_t r = 0; r < run->consumers; r++) {
        bench_child *c = &run->children[r];
        int sv[2] = {-1, -1}, err;
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) {
            sv[0] = high_fd(sv[0]);
            sv[1] = high_fd(sv[1]);
        }
        c->sock = sv[0];
        if (sv[0] < 0 || sv[1] < 0) {
            err = errno;
            if (sv[1] >= 0)
                close(sv[1]);
            return run_fail(run, "the channel of consumer rank %u: %s", r, strerror(err));
        }
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
        posix_spawn_file_actions_adddup2(&fa, run->region.fd, 4);
        snprintf(rank_text, sizeof(rank_text), "%u", r);
        err = ns[0] ? posix_spawnp(&c->pid, "ip", &fa, NULL, argv, environ)
                    : posix_spawn(&c->pid, "/proc/self/exe", &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        close(sv[1]);
        if (err)
            return run_fail(run, "starting consumer rank %u%s%s failed: %s", r,
                            ns[0] ? " with ip netns exec " : "", ns, strerror(err));
        c->running = 1;
    }
    return 0;
}

static const char *rank_message(const bench_run *run, uint32_t rank)
{
    const char *m = run->region.ranks[rank].message;
    return m[0] ? m : "no message";
}

static int worker_died(bench_run *run, uint32_t rank)
{
    const bench_child *c = &run->children[rank];
    if (WIFSIGNALED(c->wstatus))
        return run_fail(run, "consumer rank %u (pid %d) was killed by signal %d (%s)", rank,
                        (int)c->pid, WTERMSIG(c->wstatus), strsignal(WTERMSIG(c->wstatus)));
    return run_fail(run, "consumer rank %u (pid %d) exited with status %d before the end: %s", rank,
                    (int)c->pid, WEXITSTATUS(c->wstatus), rank_message(run, rank));
}

static int reap(bench_run *run, uint32_t rank, int flags)
{
    bench_child *c = &run->children[rank];
    if (!c->running || waitpid(c->pid, &c->wstatus, flags) != c->pid)
        return 0;
    c->running = 0;
    return 1;
}

static uint32_t rank_state(const bench_run *run, uint32_t rank)
{
    return __atomic_load_n(&run->region.ranks[rank].state, __ATOMIC_ACQUIRE);
}

int run_check(bench_run *run)
{
    run->last_check_ns = ferry_now_ns();
    for (uint32_t r = 0; r < run->consumers; r++) {
        if (rank_state(run, r) == STATE_FAILED)
            return run_fail(run, "consumer rank %u failed: %s", r, rank_message(run, r));
        if (reap(run, r, WNOHANG))
            return worker_died(run, r);
    }
    return run->failed ? -1 : 0;
}

int run_check_often(bench_run *run)
{
    if (ferry_now_ns() - run->last_check_ns < CHECK_PERIOD_NS)
        return run->failed ? -1 : 0;
    return run_check(run);
}

/* One turn of every wait that ends at deadline: the liveness check (with check set), then a nap
 * of nap_ns, woken early by room to send on fd (poll ignores fd < 0). Nonzero: the run failed
 * or the time is up; the caller's run_fail then names the wait unless the run had failed. */
static int tick(bench_run *run, uint64_t deadline, int check, uint64_t nap_ns, int fd)
{
    if ((check && run_check(run) != 0) || ferry_now_ns() >= deadline)
        return -1;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap_ns};
    ppoll(&pfd, 1, &ts, NULL);
    return 0;
}

static int wait_ready(bench_run *run)
{
    uint64_t deadline = ferry_now_ns() + run->params.timeout_ns;
    for (uint32_t r = 0; r < run->consumers; r++)
        while (rank_state(run, r) == STATE_STARTING)
            if (tick(run, deadline, 1, 200000, -1) != 0)
                return run_fail(run, "consumer rank %u did not start within %llu ms", r,
                                (unsigned long long)(run->params.timeout_ns / 1000000));
    return run_check(run);
}

int harness_start(bench_run *run)
{
    if (region_create(run) != 0 || spawn_workers(run) != 0)
        return -1;
    return wait_ready(run);
}

/* A worker that closed its channel is given a moment to exit, so that the report says why. */
static int channel_broken(bench_run *run, uint32_t rank, int err)
{
    uint64_t deadline = ferry_now_ns() + REAP_GRACE_NS;
    while (!reap(run, rank, WNOHANG))
        if (tick(run, deadline, 0, 1000000, -1) != 0)
            return run_fail(run, "sending to consumer rank %u failed: %s", rank, strerror(err));
    return worker_died(run, rank);
}

static int send_one(bench_run *run, uint32_t rank, const bench_msg *msg)
{
    uint64_t deadline = ferry_now_ns() + run->params.timeout_ns;
    int sock = run->children[rank].sock;
    for (;;) {
        ssize_t n = send(sock, msg, sizeof(*msg), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n == (ssize_t)sizeof(*msg))
            return 0;
        if (n >= 0 || (errno != EAGAIN && errno != EINTR))
            return channel_broken(run, rank, n < 0 ? errno : EMSGSIZE);
        if (tick(run, deadline, 1, SLICE_NS, sock) != 0)
            return run_fail(run, "consumer rank %u took no message for %llu ms", rank,
                            (unsigned long long)(run->params.timeout_ns / 1000000));
    }
}

int run_send(bench_run *run, uint32_t nranks, bench_msg *msg)
{
    msg->seq = ++run->seq;
    for (uint32_t r = 0; r < nranks; r++)
        if (send_one(run, r, msg) != 0)
            return -1;
    return 0;
}

int run_send_type(bench_run *run, uint32_t nranks, uint32_t type)
{
    bench_msg m = {.type = type, .seed = run->params.seed};
    return run_send(run, nranks, &m);
}

static uint32_t slowest(const bench_run *run, int phase, uint32_t nranks, uint32_t *seen)
{
    uint32_t worst = 0, low = UINT32_MAX;
    for (uint32_t r = 0; r < nranks; r++) {
        uint32_t v = __atomic_load_n(&run->region.ranks[r].progress[phase], __ATOMIC_ACQUIRE);
        if (v < low) {
            low = v;
            worst = r;
        }
    }
    *seen = low;
    return worst;
}

/* Sleeps until rank's progress word moves past what it was (or a slice passes). */
static void sleep_on(bench_run *run, int phase, uint32_t rank, uint64_t need)
{
    uint32_t *word = &run->region.ranks[rank].progress[phase];
    uint32_t *flag = &run->region.p->producer_waiting;
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    uint32_t now = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (now < need)
        ferry_futex_wait(word, now, SLICE_NS);
    __atomic_store_n(flag, 0, __ATOMIC_SEQ_CST);
}

int run_wait(bench_run *run, int phase, uint32_t nranks, uint64_t need, int *waited)
{
    uint32_t seen, last_seen = UINT32_MAX;
    uint64_t deadline = 0;
    int ignored;
    if (!waited)
        waited = &ignored;
    for (*waited = 0;; *waited = 1) {
        uint32_t r = slowest(run, phase, nranks, &seen);
        if (seen >= need)
            return run_check_often(run);
        if (seen != last_seen) { /* progress: the limit starts again */
            last_seen = seen;
            deadline = ferry_now_ns() + run->params.timeout_ns;
        }
        if (run_check_often(run) != 0 || ferry_now_ns() >= deadline)
            return run_fail(run, "consumer rank %u made no progress for %llu ms (%u of %llu done)",
                            r, (unsigned long long)(run->params.timeout_ns / 1000000), seen,
                            (unsigned long long)need);
        sleep_on(run, phase, r, need);
    }
}

int run_rounds(bench_run *run, uint64_t n, uint64_t rounds, int kinds,
               int (*fn)(bench_run *run, int kind, uint64_t begin, uint64_t end))
{
    for (uint64_t c = 0; c < rounds; c++)
        for (int k = 0; k < kinds; k++)
            if (fn(run, k, n * c / rounds, n * (c + 1) / rounds) != 0)
                return -1;
    return 0;
}

int run_phase_end(bench_run *run, uint32_t nranks)
{
    if (run_send_type(run, nranks, MSG_END) != 0)
        return -1;
    return run_wait(run, 0, nranks, run->seq, NULL);
}

void run_counters(const bench_run *run, uint64_t *verified, uint64_t *errors)
{
    *verified = *errors = 0;
    for (uint32_t r = 0; r < run->consumers; r++)
        for (int ph = 0; ph < BENCH_PHASES; ph++) {
            *verified += __atomic_load_n(&run->region.ranks[r].verified[ph], __ATOMIC_ACQUIRE);
            *errors += __atomic_load_n(&run->region.ranks[r].errors[ph], __ATOMIC_ACQUIRE);
        }
}

ferry_status run_pool_stats(ferry_pool *pool, ferry_pool_stats *s)
{
    memset(s, 0, sizeof(*s));
    s->struct_size = sizeof(*s);
    s->version = FERRY_POOL_STATS_VERSION;
    return ferry_pool_stats_get(pool, s);
}

void run_library_log(int level, const char *message, void *muted)
{
    if (level == FERRY_LOG_ERROR || !*(const int *)muted)
        fprintf(stderr, "ferry bench: library: %s\n", message);
}

int run_full_events(bench_run *run, ferry_pool *pool, uint64_t *events)
{
    ferry_pool_stats s;
    if (run_pool_stats(pool, &s) != FERRY_OK)
        return run_fail(run, "reading the pool's statistics failed: %s", ferry_last_error());
    *events = s.pool_full_events;
    return 0;
}

ferry_pool_config run_pool_config(const bench_opts *o)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = o->backend;
    c.memory_size = o->pool_size;
    c.consumer_count = o->consumers;
    c.max_inflight_slices = o->max_inflight;
    c.reclaim_interval_us = o->reclaim_interval_us;
    return c;
}

int run_check_fits(bench_run *run, ferry_pool *pool, uint64_t max_item)
{
    ferry_pool_stats s;
    char item[32], size[32];
    if (run_pool_stats(pool, &s) != FERRY_OK)
        return run_fail(run, "%s", ferry_last_error());
    if (max_item <= s.usable_bytes)
        return 0;
    cli_format_size(max_item, item, sizeof(item));
    cli_format_size((uint64_t)run->opt->pool_size, size, sizeof(size));
    return run_fail(run,
                    "items of up to %s (%llu bytes) do not fit in the pool: --pool-size %s leaves "
                    "%llu usable bytes after its control table; raise --pool-size or lower "
                    "--item-size",
                    item, (unsigned long long)max_item, size, (unsigned long long)s.usable_bytes);
}

int harness_finish(bench_run *run)
{
    if (run_send_type(run, run->consumers, MSG_DONE) != 0)
        return -1;
    uint64_t deadline = ferry_now_ns() + run->params.timeout_ns;
    for (uint32_t r = 0; r < run->consumers; r++) {
        const bench_child *c = &run->children[r];
        while (c->running && !reap(run, r, WNOHANG))
            if (tick(run, deadline, 0, 1000000, -1) != 0)
                return run_fail(run, "consumer rank %u (pid %d) did not exit after the run", r,
                                (int)c->pid);
        /* Exit 1 with DONE: verification errors, counted in the report. */
        if (!WIFEXITED(c->wstatus) || rank_state(run, r) != STATE_DONE ||
            WEXITSTATUS(c->wstatus) > 1)
            return worker_died(run, r);
    }
    return 0;
}

void harness_kill(bench_run *run)
{
    for (uint32_t r = 0; r < run->consumers; r++)
        if (run->children[r].running) {
            kill(run->children[r].pid, SIGKILL);
            reap(run, r, 0);
        }
}

void harness_close(bench_run *run)
{
    harness_kill(run);
    for (uint32_t r = 0; r < BENCH_MAX_RANKS; r++)
        if (run->children[r].sock >= 0)
            close(run->children[r].sock);
    if (run->region.base)
        munmap(run->region.base, run->region.bytes);
    if (run->region.fd >= 0)
        close(run->region.fd);
}

/* The first message a worker notes goes to its rank's slot (stderr before the region). */
static void note(bench_worker *w, const char *fmt, va_list ap)
{
    char text[BENCH_MESSAGE_MAX];
    vsnprintf(text, sizeof(text), fmt, ap);
    if (!w->me)
        fprintf(stderr, "ferry bench-worker rank %u: %s\n", w->rank, text);
    else if (!w->me->message[0])
        memcpy(w->me->message, text, sizeof(text));
}

int worker_fail(bench_worker *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(w, fmt, ap);
    va_end(ap);
    if (w->me)
        __atomic_store_n(&w->me->state, STATE_FAILED, __ATOMIC_RELEASE);
    return -1;
}

void worker_error(bench_worker *w, int phase, const char *fmt, ...)
{
    va_list ap;
    __atomic_add_fetch(&w->me->errors[phase], 1, __ATOMIC_RELEASE);
    va_start(ap, fmt);
    note(w, fmt, ap);
    va_end(ap);
}

int worker_decode(bench_worker *w, const bench_msg *m, uint64_t room, ferry_descriptor *d)
{
    if (ferry_descriptor_decode(m->desc, FERRY_DESCRIPTOR_SIZE, d) != FERRY_OK)
        return worker_fail(w, "item %llu: ferry_descriptor_decode: %s", (unsigned long long)m->item,
                           ferry_last_error());
    if (d->length != m->size || m->size > room)
        return worker_fail(w,
                           "item %llu: descriptor of %llu bytes, message of %llu bytes (buffers "
                           "hold %llu bytes)",
                           (unsigned long long)m->item, (unsigned long long)d->length,
                           (unsigned long long)m->size, (unsigned long long)room);
    return 0;
}

void worker_progress(bench_worker *w, int phase, uint32_t value)
{
    uint32_t *word = &w->me->progress[phase];
    /* Store, then look for a sleeper: paired with the producer's flag-then-load. */
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&w->region.p->producer_waiting, __ATOMIC_SEQ_CST))
        ferry_futex_wake(word);
}

/* Blocks for the next message: a worker dies with its producer (PR_SET_PDEATHSIG), and the
 * producer's end of the channel closes when it gives up, so this wait too has an end. */
static int receive(bench_worker *w, bench_msg *m)
{
    ssize_t n;
    do
        n = recv(w->sock, m, sizeof(*m), 0);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(*m))
        return 0;
    if (n == 0)
        return worker_fail(w, "the producer closed the channel before the end of the run");
    if (n < 0)
        return worker_fail(w, "receiving from the producer failed: %s", strerror(errno));
    return worker_fail(w, "message of %zd bytes (expected %zu)", n, sizeof(*m));
}

/* Serves messages until DONE: exit 0 when every check passed, 1 otherwise. */
static int serve(bench_worker *w)
{
    bench_msg m;
    for (;;) {
        if (receive(w, &m) != 0)
            return CLI_EXIT_FAIL;
        if (m.type == MSG_DONE) {
            uint64_t errors = 0;
            for (int ph = 0; ph < BENCH_PHASES; ph++)
                errors += w->me->errors[ph];
            __atomic_store_n(&w->me->state, STATE_DONE, __ATOMIC_RELEASE);
            return errors ? CLI_EXIT_FAIL : CLI_EXIT_OK;
        }
        if (w->mode->worker_handle(w, &m) != 0)
            return CLI_EXIT_FAIL;
        if (w->mode->progress_by_seq)
            worker_progress(w, 0, (uint32_t)m.seq);
    }
}

int worker_serve(bench_worker *w, const bench_mode *const *modes, size_t nmodes)
{
    if (region_map(w->region.fd, &w->region) != 0)
        return worker_fail(w, "mapping the results region failed: %s", strerror(errno));
    w->p = *w->region.p;
    if (w->p.mode >= nmodes)
        return worker_fail(w, "mode %u is not a mode", w->p.mode);
    w->mode = modes[w->p.mode];
    if (w->rank >= w->p.consumers)
        return worker_fail(w, "rank %u is outside the run's %u consumers", w->rank, w->p.consumers);
    w->me = &w->region.ranks[w->rank];
    if (getppid() != (pid_t)w->p.producer_pid) /* it died before PR_SET_PDEATHSIG took */
        return worker_fail(w, "the producer (pid %d) is gone", (int)w->p.producer_pid);
    int rc = CLI_EXIT_FAIL;
    if (w->mode->worker_init(w) == 0) {
        __atomic_store_n(&w->me->state, STATE_READY, __ATOMIC_RELEASE);
        rc = serve(w);
    }
    w->mode->worker_release(w, rc == CLI_EXIT_OK || w->me->state == STATE_DONE);
    return rc;
}
