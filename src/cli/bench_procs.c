/* The producer's side of its worker processes: starting them, the channel, liveness,
 * progress waits and the end of the run. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"

#define CHECK_PERIOD_NS 5000000ull    /* liveness checks during hot loops */
#define SLEEP_SLICE_NS  10000000ull   /* longest single sleep before re-checking workers */
#define REAP_GRACE_NS   1000000000ull /* how long a worker that closed its channel may take */

int bench_fail(bench_run *run, const char *fmt, ...)
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

static int spawn_one(bench_run *run, uint32_t rank, int child_sock)
{
    char rank_text[16];
    snprintf(rank_text, sizeof(rank_text), "%u", rank);
    char *argv[] = {
        "ferry", "bench-worker", "--rank", rank_text,    "--fd",
        "3",     "--results-fd", "4",      "--floor-fd", run->floor_fd >= 0 ? "5" : "-1",
        NULL};
    int fds[3] = {child_sock, run->region.fd, run->floor_fd};
    pid_t pid;
    int err = cli_spawn_self(argv, fds, 3, &pid);
    if (err)
        return bench_fail(run, "starting consumer rank %u failed: %s", rank, strerror(err));
    run->workers[rank].pid = pid;
    run->workers[rank].running = 1;
    return 0;
}

static int make_channel(bench_run *run, uint32_t rank, int *child_sock)
{
    int err = cli_channel(&run->workers[rank].sock, child_sock);
    if (err)
        return bench_fail(run, "the channel of consumer rank %u: %s", rank, strerror(err));
    return 0;
}

int bench_spawn_workers(bench_run *run)
{
    for (uint32_t r = 0; r < run->consumers; r++) {
        int child_sock = -1;
        int rc = make_channel(run, r, &child_sock);
        if (rc == 0)
            rc = spawn_one(run, r, child_sock);
        if (child_sock >= 0)
            close(child_sock);
        if (rc != 0)
            return -1;
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
    const bench_worker *w = &run->workers[rank];
    char why[96];
    cli_exit_reason(w->wstatus, why, sizeof(why));
    if (WIFSIGNALED(w->wstatus))
        return bench_fail(run, "consumer rank %u (pid %d) %s", rank, (int)w->pid, why);
    return bench_fail(run, "consumer rank %u (pid %d) %s before the end: %s", rank, (int)w->pid,
                      why, rank_message(run, rank));
}

/* Reaps rank if it exited; returns 1 if it did. */
static int reap(bench_run *run, uint32_t rank, int flags)
{
    bench_worker *w = &run->workers[rank];
    if (!w->running)
        return 0;
    pid_t got = waitpid(w->pid, &w->wstatus, flags);
    if (got != w->pid)
        return 0;
    w->running = 0;
    return 1;
}

int bench_check_workers(bench_run *run)
{
    run->last_check_ns = cli_now_ns();
    for (uint32_t r = 0; r < run->consumers; r++)
        if (reap(run, r, WNOHANG))
            return worker_died(run, r);
    return run->failed ? -1 : 0;
}

int bench_check_workers_often(bench_run *run)
{
    if (cli_now_ns() - run->last_check_ns < CHECK_PERIOD_NS)
        return 0;
    return bench_check_workers(run);
}

/* The peer of rank's channel is gone: report why the worker died if it did. */
static int channel_broken(bench_run *run, uint32_t rank, int err)
{
    uint64_t deadline = cli_now_ns() + REAP_GRACE_NS;
    while (cli_now_ns() < deadline) {
        if (reap(run, rank, WNOHANG))
            return worker_died(run, rank);
        cli_sleep_ns(1000000);
    }
    return bench_fail(run, "sending to consumer rank %u failed: %s", rank, strerror(err));
}

static int send_one(bench_run *run, uint32_t rank, const bench_msg *msg)
{
    uint64_t deadline = cli_now_ns() + run->params.timeout_ns;
    int sock = run->workers[rank].sock;
    for (;;) {
        ssize_t n = send(sock, msg, sizeof(*msg), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n == (ssize_t)sizeof(*msg))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n >= 0 || errno != EAGAIN)
            return channel_broken(run, rank, n < 0 ? errno : EMSGSIZE);
        if (bench_check_workers(run) != 0)
            return -1;
        if (cli_now_ns() >= deadline)
            return bench_fail(run, "consumer rank %u took no message for %llu ms", rank,
                              (unsigned long long)(run->params.timeout_ns / 1000000ull));
        struct pollfd pfd = {.fd = sock, .events = POLLOUT};
        poll(&pfd, 1, (int)(SLEEP_SLICE_NS / 1000000ull));
    }
}

int bench_send(bench_run *run, uint32_t nranks, const bench_msg *msg)
{
    for (uint32_t r = 0; r < nranks; r++)
        if (send_one(run, r, msg) != 0)
            return -1;
    return 0;
}

static int first_state(const bench_run *run, uint32_t state)
{
    for (uint32_t r = 0; r < run->consumers; r++)
        if (__atomic_load_n(&run->region.ranks[r].state, __ATOMIC_ACQUIRE) == state)
            return (int)r;
    return -1;
}

int bench_wait_ready(bench_run *run)
{
    uint64_t deadline = cli_now_ns() + run->params.timeout_ns;
    while (first_state(run, BENCH_STATE_STARTING) >= 0) {
        int failed = first_state(run, BENCH_STATE_FAILED);
        if (failed >= 0)
            return bench_fail(run, "consumer rank %d failed to start: %s", failed,
                              rank_message(run, (uint32_t)failed));
        if (bench_check_workers(run) != 0)
            return -1;
        if (cli_now_ns() >= deadline)
            return bench_fail(run, "consumer rank %d did not start within %llu ms",
                              first_state(run, BENCH_STATE_STARTING),
                              (unsigned long long)(run->params.timeout_ns / 1000000ull));
        cli_sleep_ns(200000);
    }
    return 0;
}

/* Judges a worker that exited at the end: DONE with status 0 (all verified) or 1 (errors
 * counted in the report); anything else fails the run. */
static int judge_exit(bench_run *run, uint32_t rank)
{
    const bench_worker *w = &run->workers[rank];
    uint32_t state = run->region.ranks[rank].state;
    if (WIFEXITED(w->wstatus) && state == BENCH_STATE_DONE && WEXITSTATUS(w->wstatus) <= 1)
        return 0;
    return worker_died(run, rank);
}

static int wait_exits(bench_run *run)
{
    uint64_t deadline = cli_now_ns() + run->params.timeout_ns;
    for (uint32_t r = 0; r < run->consumers; r++) {
        while (run->workers[r].running && !reap(run, r, WNOHANG)) {
            if (cli_now_ns() >= deadline)
                return bench_fail(run, "consumer rank %u (pid %d) did not exit after the run", r,
                                  (int)run->workers[r].pid);
            cli_sleep_ns(1000000);
        }
        if (judge_exit(run, r) != 0)
            return -1;
    }
    return 0;
}

int bench_finish_workers(bench_run *run)
{
    bench_msg msg;
    memset(&msg, 0, sizeof(msg));
    msg.type = BENCH_MSG_DONE;
    msg.seed = run->params.seed;
    if (bench_send(run, run->consumers, &msg) != 0)
        return -1;
    return wait_exits(run);
}

void bench_kill_workers(bench_run *run)
{
    for (uint32_t r = 0; run->workers && r < run->consumers; r++) {
        if (!run->workers[r].running)
            continue;
        kill(run->workers[r].pid, SIGKILL);
        reap(run, r, 0);
    }
}
