/* Worker processes of the benchmarks: the ferry binary re-executed with its channel and
 * shared regions on fixed descriptors (3, 4, ...), never a bare fork() of a process that
 * already runs a pool's threads. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"

extern char **environ;

int bench_high_fd(int fd)
{
    int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    int err = errno;
    close(fd);
    errno = err;
    return nfd;
}

int cli_channel(int *parent, int *child)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return errno;
    *parent = bench_high_fd(sv[0]);
    *child = bench_high_fd(sv[1]);
    if (*parent >= 0 && *child >= 0)
        return 0;
    int err = errno;
    if (*parent >= 0)
        close(*parent);
    if (*child >= 0)
        close(*child);
    *parent = *child = -1;
    return err;
}

int cli_spawn_self(char *const argv[], const int *fds, int nfds, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (int i = 0; i < nfds; i++)
        if (fds[i] >= 0)
            posix_spawn_file_actions_adddup2(&fa, fds[i], 3 + i);
    int err = posix_spawn(pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return err;
}

int cli_recv_record(int sock, void *record, size_t size, char *why, size_t why_size)
{
    for (;;) {
        ssize_t n = recv(sock, record, size, 0);
        if (n == (ssize_t)size)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            snprintf(why, why_size, "the producer closed the channel before the end of the run");
        else if (n < 0)
            snprintf(why, why_size, "receiving from the producer failed: %s", strerror(errno));
        else
            snprintf(why, why_size, "message of %zd bytes (expected %zu)", n, size);
        return -1;
    }
}

void cli_exit_reason(int wstatus, char *buf, size_t size)
{
    if (WIFSIGNALED(wstatus))
        snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(wstatus),
                 strsignal(WTERMSIG(wstatus)));
    else
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(wstatus));
}
