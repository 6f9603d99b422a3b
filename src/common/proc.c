#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/proc.h"

enum { STAT_OK = 0, STAT_GONE = 1, STAT_FAILED = -1 };

/* Reads the stat file of pid's thread-group leader, /proc/<pid>/task/<pid>/stat: STAT_OK,
 * STAT_GONE (no such process), or STAT_FAILED with errno set (it could not be read: EMFILE,
 * ENFILE, ENOMEM, EINTR...). The kernel fills that file as /proc/<pid>/stat (the same state
 * and start time), and user-mode emulators (qemu-user, which runs the aarch64 check) pass it
 * through, where they fake /proc/<pid>/stat for the calling process with a start time of
 * their own per thread. The command name may hold spaces and parentheses, so fields are
 * counted from the last ')'. */
static int proc_stat(pid_t pid, char *state, uint64_t *starttime)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? STAT_GONE : STAT_FAILED;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    int err = errno;
    close(fd);
    if (n < 0 && err != ESRCH) {
        errno = err;
        return STAT_FAILED;
    }
    if (n <= 0)
        return STAT_GONE; /* it exited between the open and the read */
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') {
        errno = EIO;
        return STAT_FAILED;
    }
    *state = p[2];
    /* After ") S " come fields 4.. ; starttime is field 22. */
    p += 3;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    if (!p) {
        errno = EIO;
        return STAT_FAILED;
    }
    *starttime = strtoull(p, NULL, 10);
    return STAT_OK;
}

static int exited(char state)
{
    return state == 'Z' || state == 'X' || state == 'x';
}

uint64_t ferry__proc_starttime(pid_t pid)
{
    char state;
    uint64_t start;
    if (pid <= 0 || proc_stat(pid, &state, &start) != STAT_OK || exited(state))
        return 0;
    return start ? start : 1;
}

int ferry__proc_watch(pid_t pid)
{
#ifdef SYS_pidfd_open
    if (pid <= 0) {
        errno = ESRCH;
        return -1;
    }
    return (int)syscall(SYS_pidfd_open, pid, 0); /* close-on-exec */
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* A pidfd is readable once its process has exited. */
static int check_pidfd(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    return n == 0;
}

int ferry__proc_check(pid_t pid, uint64_t starttime, int pidfd)
{
    if (pidfd >= 0)
        return check_pidfd(pidfd);
    if (pid <= 0)
        return 0;
    for (int tries = 0;; tries++) {
        char state;
        uint64_t start;
        int st = proc_stat(pid, &state, &start);
        if (st == STAT_OK)
            return !exited(state) && (starttime == 0 || (start ? start : 1) == starttime);
        if (st == STAT_GONE)
            return 0;
        if ((errno != EINTR && errno != EAGAIN) || tries == 3)
            return -1;
    }
}

static pid_t self_pid;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void self_after_fork(void)
{
    __atomic_store_n(&self_pid, getpid(), __ATOMIC_RELAXED);
}

static void self_init(void)
{
    __atomic_store_n(&self_pid, getpid(), __ATOMIC_RELAXED);
    pthread_atfork(NULL, NULL, self_after_fork);
}

pid_t ferry__proc_self(void)
{
    pthread_once(&self_once, self_init);
    return __atomic_load_n(&self_pid, __ATOMIC_RELAXED);
}

int ferry__random_bytes(void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t got = getrandom((uint8_t *)buf + done, n - done, 0);
        if (got < 0 && errno != EINTR)
            return -1;
        if (got > 0)
            done += (size_t)got;
    }
    return 0;
}

/* Seconds since boot as /proc counts them (the clock of a process's start time). */
static uint64_t uptime_ns(void)
{
    char buf[64];
    int fd = open("/proc/uptime", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *dot;
    uint64_t sec = strtoull(buf, &dot, 10), frac = 0, scale = 1000000000ull;
    if (*dot == '.')
        for (char *c = dot + 1; *c >= '0' && *c <= '9' && scale > 1; c++)
            frac += (uint64_t)(*c - '0') * (scale /= 10);
    return sec * 1000000000ull + frac;
}

/* The process's age on /proc's own clock, carried over to CLOCK_MONOTONIC: the two clocks
 * may differ by suspended (or, in a virtual machine, restored-from-snapshot) time. */
uint64_t ferry__proc_start_ns(pid_t pid)
{
    uint64_t ticks = ferry__proc_starttime(pid);
    long hz = sysconf(_SC_CLK_TCK);
    uint64_t up = uptime_ns();
    if (!ticks || hz <= 0 || !up)
        return 0;
    uint64_t tick = 1000000000ull / (uint64_t)hz;
    uint64_t started = ticks * tick, now = ferry__now_ns();
    if (started > up + tick)
        return 0; /* inconsistent readings: unknown */
    uint64_t age = started < up ? up - started : 0;
    /* Rounded up by a tick each way (both /proc readings are truncated): anything stamped
     * before the result surely came before the process. */
    return age + 2 * tick < now ? now - age + 2 * tick : 0;
}
