#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "procs.h"

extern char **environ;

int th_send_msg(int fd, const th_msg *m)
{
    return send(fd, m, sizeof(*m), MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -1;
}

int th_recv_msg(int fd, th_msg *m, int timeout_ms)
{
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return recv(fd, m, sizeof(*m), 0) == (ssize_t)sizeof(*m) ? 0 : -1;
}

th_helper th_spawn_helper(const char *role, const char *arg1, const char *arg2)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], TH_CHANNEL_FD);
    /* Under a user-mode emulator (the aarch64 check runs the tests in qemu-user, which does
     * not follow an exec of a foreign binary), the helper runs in the emulator too. */
    char *emulator = getenv("FERRY_TEST_EMULATOR");
    char *argv[] = {emulator, exe, "--helper", (char *)role, (char *)arg1, (char *)arg2, NULL};
    char **args = emulator && *emulator ? argv : argv + 1;
    th_helper h = {.fd = sv[0]};
    assert_int_equal(posix_spawnp(&h.pid, args[0], &fa, NULL, args, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    return h;
}

void th_send_item(int fd, const ferry_descriptor *d, uint64_t seed, uint32_t flags)
{
    th_msg m = {.type = TH_MSG_ITEM, .seed = seed, .status = flags};
    assert_int_equal(ferry_descriptor_encode(d, m.desc), FERRY_OK);
    assert_int_equal(th_send_msg(fd, &m), 0);
}

void th_send_type(int fd, uint32_t type)
{
    th_msg m = {.type = type};
    assert_int_equal(th_send_msg(fd, &m), 0);
}

th_msg th_finish_helper(th_helper *h, int timeout_ms)
{
    th_msg m = {0};
    if (th_recv_msg(h->fd, &m, timeout_ms) != 0 || m.type != TH_MSG_RESULT)
        m.status = 0xdead;
    th_reap_helper(h);
    return m;
}

void th_reap_helper(th_helper *h)
{
    int status = 0;
    pid_t got;
    while ((got = waitpid(h->pid, &status, 0)) < 0 && errno == EINTR)
        ;
    close(h->fd);
    assert_int_equal(got, h->pid);
    /* A helper ends by exiting (its status, when it matters, is in its RESULT) or by the
     * signal a test killed it with; an abort or a crash is a sanitizer's report (the sanitizer
     * builds run with abort_on_error) or a bug of its own, and TSan exits 66: either would
     * otherwise pass unseen, the helper's output being all there is of it. */
    if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL && WTERMSIG(status) != SIGTERM)
        fail_msg("helper %d died by signal %d (%s): a sanitizer's report or a crash above",
                 (int)h->pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 66)
        fail_msg("helper %d exited 66 (ThreadSanitizer's exit code: a report above)", (int)h->pid);
}

void th_stop_helper(const th_helper *h)
{
    int status = 0;
    assert_int_equal(kill(h->pid, SIGSTOP), 0);
    assert_int_equal(waitpid(h->pid, &status, WUNTRACED), h->pid);
    assert_true(WIFSTOPPED(status));
}

void th_assert_result(th_msg m, uint64_t count)
{
    if (m.status != FERRY_OK)
        fail_msg("helper failed with %u: %s", m.status, m.text);
    assert_int_equal(m.seed, count);
}

int th_stuck_producer(const ferry_pool_config *config)
{
    ferry_pool *pool;
    ferry_tensor t = ferry_tensor_bytes(4096);
    void *data;
    ferry_descriptor d;
    if (ferry_pool_create(config, &pool) != FERRY_OK ||
        ferry_pool_reserve(pool, &t, 0, &data, &d) != FERRY_OK)
        return 1;
    th_msg m = {.type = TH_MSG_ITEM};
    ferry_descriptor_encode(&d, m.desc);
    th_send_msg(TH_CHANNEL_FD, &m);
    for (;;)
        pause();
}

ferry_pool_stats th_stats(ferry_pool *pool)
{
    ferry_pool_stats s = {.struct_size = sizeof(s), .version = FERRY_POOL_STATS_VERSION};
    assert_int_equal(ferry_pool_stats_get(pool, &s), FERRY_OK);
    return s;
}

void *th_read_main(void *arg)
{
    th_reader *r = arg;
    __atomic_store_n(&r->started, 1, __ATOMIC_RELEASE);
    r->st = ferry_consumer_read(r->c, &r->d, r->buf, r->n, 10000000000ull);
    return NULL;
}

ferry_descriptor th_reserve_backwards(ferry_pool *pool, const uint8_t *src, size_t n,
                                      uint64_t timeout_ns)
{
    ferry_tensor t = ferry_tensor_bytes(n);
    void *data;
    ferry_descriptor d;
    assert_int_equal(ferry_pool_reserve(pool, &t, timeout_ns, &data, &d), FERRY_OK);
    const size_t chunk = 64 << 10;
    for (size_t end = n; end > 0;) {
        size_t start = end > chunk ? end - chunk : 0;
        memcpy((uint8_t *)data + start, src + start, end - start);
        end = start;
    }
    assert_int_equal(ferry_pool_commit(pool, &d), FERRY_OK);
    return d;
}

ferry_consumer_info th_consumer_info(ferry_pool *pool, uint32_t rank)
{
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, rank, &info), FERRY_OK);
    return info;
}

void th_wait_drained(ferry_pool *pool)
{
    uint64_t n;
    for (int i = 0; i < 5000 && th_stats(pool).leases_in_flight; i++) {
        ferry_pool_reclaim(pool, &n);
        usleep(1000);
    }
    assert_int_equal(th_stats(pool).leases_in_flight, 0);
}

void th_report(uint32_t status, uint64_t count)
{
    th_msg m = {.type = TH_MSG_RESULT, .status = status, .seed = count};
    snprintf(m.text, sizeof(m.text), "%s", ferry_last_error());
    th_send_msg(TH_CHANNEL_FD, &m);
}

pid_t th_fork_holder(int *release)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(p[1]);
        char b;
        while (read(p[0], &b, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    close(p[0]);
    *release = p[1];
    return child;
}

void th_holder_exit(pid_t child, int release)
{
    close(release);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
