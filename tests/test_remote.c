/* Remote consumers over UCX, with real processes in real network namespaces: the producer
 * (this process) in one, consumers in another, joined by a veth pair that the test makes and
 * removes (as root; on loopback where namespaces cannot be made). UCX over tcp, as CI has it.
 * Skips (77) where UCX cannot be loaded. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker/broker.h"
#include "driver/driver.h"
#include "ferry.h"
#include "helpers.h"
#include "hold.h"
#include "pool/pool.h"
#include "procs.h"
#include "remote/remote.h"
#include "remote/ucx.h"
#include "wire/remote.h"

#define MS       1000000ull
#define END_SEED 0xe11du

/* ---- the network: two namespaces and a veth pair, or loopback ------------------------- */

static struct {
    int netns;       /* 1: namespaces made; 0: loopback */
    char ns[2][32];  /* producer's, consumers' */
    char dev[2][16]; /* their veth ends */
    char ip[2][32];  /* their addresses */
} net;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Moves this process (single-threaded yet) into a namespace as `ip netns exec` does: its
 * network, and a mount namespace of its own where /sys shows that network's devices (UCX
 * lists them there). */
static int join_netns(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    if (rc == 0)
        rc = unshare(CLONE_NEWNS);
    if (rc == 0)
        rc = mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL);
    if (rc == 0)
        rc = umount2("/sys", MNT_DETACH);
    if (rc == 0)
        rc = mount(name, "/sys", "sysfs", 0, NULL);
    return rc;
}

/* UCX's tcp transport over the test's own interface only (a namespace's loopback would look
 * reachable from the other namespace, which shares the host's identity). */
static void use_device(int side)
{
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", net.netns ? net.dev[side] : "lo", 1);
}

static void net_down(void)
{
    if (!net.netns)
        return;
    sh("ip netns del %s 2>/dev/null", net.ns[0]);
    sh("ip netns del %s 2>/dev/null", net.ns[1]);
}

/* Namespaces of test runs whose process is gone (a crashed run's). */
static void remove_stale_namespaces(void)
{
    DIR *d = opendir("/var/run/netns");
    for (struct dirent *e; d && (e = readdir(d));) {
        int pid = 0;
        if (sscanf(e->d_name, "fyrt-%d-", &pid) == 1 && kill(pid, 0) != 0 && errno == ESRCH)
            sh("ip netns del %s 2>/dev/null", e->d_name);
    }
    if (d)
        closedir(d);
}

static void net_up(void)
{
    int pid = (int)getpid(), x = pid % 250 + 1;
    snprintf(net.ns[0], sizeof(net.ns[0]), "fyrt-%d-a", pid);
    snprintf(net.ns[1], sizeof(net.ns[1]), "fyrt-%d-b", pid);
    snprintf(net.dev[0], sizeof(net.dev[0]), "fya%d", pid);
    snprintf(net.dev[1], sizeof(net.dev[1]), "fyb%d", pid);
    snprintf(net.ip[0], sizeof(net.ip[0]), "10.231.%d.1", x);
    snprintf(net.ip[1], sizeof(net.ip[1]), "10.231.%d.2", x);
    if (getuid() != 0 || sh("command -v ip >/dev/null 2>&1") != 0) {
        strcpy(net.ip[0], "127.0.0.1");
        return;
    }
    remove_stale_namespaces();
    net.netns = 1;
    if (sh("ip netns add %s && ip netns add %s && ip link add %s type veth peer name %s && "
           "ip link set %s netns %s && ip link set %s netns %s && "
           "ip -n %s addr add %s/30 dev %s && ip -n %s addr add %s/30 dev %s && "
           "ip -n %s link set %s up && ip -n %s link set %s up && "
           "ip -n %s link set lo up && ip -n %s link set lo up",
           net.ns[0], net.ns[1], net.dev[0], net.dev[1], net.dev[0], net.ns[0], net.dev[1],
           net.ns[1], net.ns[0], net.ip[0], net.dev[0], net.ns[1], net.ip[1], net.dev[1], net.ns[0],
           net.dev[0], net.ns[1], net.dev[1], net.ns[0], net.ns[1]) != 0 ||
        join_netns(net.ns[0]) != 0 || if_nametoindex(net.dev[0]) == 0) {
        fprintf(stderr, "test_remote: no network namespaces here; on loopback\n");
        sh("ip -n %s addr >&2", net.ns[0]);
        net_down();
        net.netns = 0;
        strcpy(net.ip[0], "127.0.0.1");
    }
}

/* Cuts or mends the link on one side. A mended link is waited for until it runs again: the
 * kernel's link watch delays the change by up to a second after another one, and UCX lists
 * only running devices (the next pool would find none). */
/* Sets a side's link up (waiting up to 3 s until it is) or down: 0, or -1 if it failed. */
static int link_to(int side, int up)
{
    if (sh("ip -n %s link set %s %s", net.ns[side], net.dev[side], up ? "up" : "down") != 0)
        return -1;
    for (int i = 0; up && i < 300; i++) {
        if (sh("ip -n %s link show %s | grep -q 'state UP'", net.ns[side], net.dev[side]) == 0)
            return 0;
        usleep(10000);
    }
    return up ? -1 : 0;
}

static void link_set(int side, int up)
{
    assert_int_equal(link_to(side, up), 0);
}

/* Spawns a helper in the consumers' namespace (side 1) or the producer's (side 0). */
static th_helper spawn_in(int side, const char *role, const char *a, const char *b)
{
    if (net.netns)
        setenv("FERRY_TEST_NETNS", net.ns[side], 1);
    setenv("FERRY_TEST_DEV", net.netns ? net.dev[side] : "lo", 1);
    th_helper h = th_spawn_helper(role, a, b);
    unsetenv("FERRY_TEST_NETNS");
    unsetenv("FERRY_TEST_DEV");
    return h;
}

/* ---- pools and items ------------------------------------------------------------------- */

static ferry_pool *make_pool(uint32_t consumers, int64_t memory, int64_t timeout_us)
{
    char listen[64];
    snprintf(listen, sizeof(listen), "%s:0", net.ip[0]);
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = memory;
    c.consumer_count = consumers;
    c.max_inflight_slices = 256;
    c.channel_depth = 16;
    c.listen = listen;
    c.remote_timeout_us = timeout_us;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&c, &pool) != FERRY_OK)
        fail_msg("pool: %s", ferry_last_error());
    return pool;
}

static void remote_address_of(ferry_pool *pool, char *addr)
{
    assert_int_equal(ferry_pool_remote_address(pool, addr, FERRY_REMOTE_ADDRESS_SIZE), FERRY_OK);
}

static ferry_status send_stamped(ferry_pool *pool, size_t n, uint64_t seed,
                                 const ferry_ranks *ranks, uint64_t timeout_ns)
{
    uint8_t *buf = malloc(n ? n : 1);
    th_stamp(buf, n, seed);
    ferry_tensor t = ferry_tensor_bytes(n);
    const void *src = buf;
    ferry_status st = ferry_pool_send(pool, &t, &src, 1, ranks, NULL, timeout_ns, NULL);
    free(buf);
    return st;
}

static void send_end(ferry_pool *pool, const ferry_ranks *ranks)
{
    if (send_stamped(pool, 64, END_SEED, ranks, 10000 * MS) != FERRY_OK)
        fail_msg("send END: %s", ferry_last_error());
}

/* Spawns a consumer helper and waits until it has connected (or failed to). */
static th_helper spawn_consumer(int side, const char *role, const char *addr, uint32_t rank,
                                ferry_status want)
{
    char r[16];
    snprintf(r, sizeof(r), "%u", rank);
    th_helper h = spawn_in(side, role, addr, r);
    th_msg m;
    assert_int_equal(th_recv_msg(h.fd, &m, 10000), 0);
    if (m.status != (uint32_t)want)
        fail_msg("%s helper connected with %s, expected %s: %s", role,
                 ferry_status_name((ferry_status)m.status), ferry_status_name(want), m.text);
    return h;
}

static uint64_t ms_since(uint64_t t0)
{
    return (ferry_now_ns() - t0) / MS;
}

/* Waits up to ms for the pool to have no lease in flight; the time it took, or fails. */
static uint64_t wait_settled(ferry_pool *pool, uint64_t ms)
{
    uint64_t t0 = ferry_now_ns();
    for (;;) {
        uint64_t reclaimed;
        assert_int_equal(ferry_pool_reclaim(pool, &reclaimed), FERRY_OK);
        if (th_stats(pool).leases_in_flight == 0)
            return ms_since(t0);
        if (ms_since(t0) > ms)
            fail_msg("%llu leases still in flight after %llu ms",
                     (unsigned long long)th_stats(pool).leases_in_flight, (unsigned long long)ms);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The pool's remote server's counters (those ferry_pool_stats does not show). */
static ferry__remote_counts remote_counts(ferry_pool *pool)
{
    ferry__remote_counts rc;
    ferry__remote_server_counts(pool->remote, &rc);
    return rc;
}

/* Releases the held server's thread 5 s from now (and sets *arg to 1) unless *arg is -1 by
 * then. */
static void *hold_release_later(void *arg)
{
    int *rescued = arg;
    for (int i = 0; i < 500; i++) {
        if (__atomic_load_n(rescued, __ATOMIC_ACQUIRE) == -1)
            return NULL;
        usleep(10000);
    }
    int expected = 0;
    if (__atomic_compare_exchange_n(rescued, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        th_hold_release();
    return NULL;
}

/* ---- helper processes ------------------------------------------------------------------ */

/* A helper's connect as rank (made for device), reported to the test: the consumer, or NULL
 * when the connect failed. */
static ferry_consumer *connect_reported(const char *addr, uint32_t rank, int device)
{
    ferry_consumer *c = NULL;
    ferry_status st = ferry_consumer_connect(addr, rank, device, &c);
    th_report(st, 0);
    return st == FERRY_OK ? c : NULL;
}

/* Reads d into buf (cap bytes) and checks every byte against the stamp it begins with
 * (MISMATCH otherwise); *seed (if not NULL) is that stamp's seed. */
static ferry_status read_self_stamped(ferry_consumer *c, const ferry_descriptor *d, uint8_t *buf,
                                      size_t cap, uint64_t timeout_ns, uint64_t *seed)
{
    uint64_t s = 0;
    ferry_status st = ferry_consumer_read(c, d, buf, cap, timeout_ns);
    if (st == FERRY_OK) {
        th_check_stamp(buf, d->length, 0, &s); /* the seed its first bytes carry */
        if (!th_check_stamp(buf, d->length, s, NULL))
            st = FERRY_MISMATCH;
    }
    if (seed)
        *seed = s;
    return st;
}

/* Receives one lease, reads it and checks every byte; acknowledges it if ack. */
static ferry_status take_one(ferry_consumer *c, int ack)
{
    static uint8_t buf[1 << 20];
    ferry_descriptor d;
    size_t k = 0;
    ferry_status st = ferry_consumer_recv(c, 10000 * MS, &d, 1, &k);
    if (st == FERRY_OK)
        st = read_self_stamped(c, &d, buf, sizeof(buf), 5000 * MS, NULL);
    if (st == FERRY_OK && ack)
        st = ferry_consumer_ack(c, &d);
    return st;
}

/* "receiver ADDR RANK": connects, reports, then receives, reads (checking the stamp of every
 * byte) and acknowledges every lease until END or the producer is gone; reports how many it
 * verified. "hold ADDR RANK": receives (without acknowledging) until killed. "gone ADDR RANK":
 * waits in recv and reports the status it ends with and how long it took after the RESULT
 * request (an ITEM message from the test marks the start). */
static int receiver_main(const char *role, const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, -1);
    if (!c)
        return 1;
    ferry_status st;
    uint64_t verified = 0;
    size_t cap = 17u << 20;
    uint8_t *buf = malloc(cap);
    int hold = strcmp(role, "hold") == 0, viewer = strcmp(role, "viewer") == 0;
    for (;;) {
        ferry_descriptor d;
        size_t k = 0;
        st = ferry_consumer_recv(c, 30000 * MS, &d, 1, &k);
        if (st == FERRY_PRODUCER_GONE && !hold)
            break;
        if (st != FERRY_OK)
            break;
        uint64_t seed = 0;
        st = read_self_stamped(c, &d, buf, cap, 5000 * MS, &seed);
        if (st == FERRY_MISMATCH) {
            th_report(FERRY_MISMATCH, verified);
            return 1;
        }
        if (st != FERRY_OK)
            break;
        if (viewer) { /* a view needs the pool mapped here: a consumer of this host's pool */
            const void *v = NULL;
            st = ferry_consumer_view(c, &d, &v, 5000 * MS);
            if (st != FERRY_OK || memcmp(v, buf, d.length) != 0) {
                th_report(st == FERRY_OK ? FERRY_MISMATCH : st, verified);
                return 1;
            }
        }
        if (hold) {
            verified++;
            th_report(FERRY_OK, verified); /* one more held */
            continue;
        }
        st = ferry_consumer_ack(c, &d);
        if (st != FERRY_OK || seed == END_SEED)
            break;
        verified++;
    }
    th_report(st == FERRY_PRODUCER_GONE ? FERRY_OK : st, verified);
    ferry_consumer_destroy(c);
    free(buf);
    return 0;
}

/* "gone ADDR RANK": connects, reports, then sits in recv; reports the status recv ended with
 * and, in count, the milliseconds from the test's ITEM (sent when it killed or cut something)
 * to that end. */
static int gone_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, -1);
    if (!c)
        return 1;
    ferry_status st;
    static uint8_t buf[1 << 16];
    /* The clock starts at the test's ITEM, taken before anything can end the loop (a helper
     * that leaves with it unread resets its channel: the test would lose the RESULT). */
    th_msg go;
    if (th_recv_msg(TH_CHANNEL_FD, &go, 10000) != 0)
        return 1;
    uint64_t start = ferry_now_ns();
    for (;;) {
        ferry_descriptor d;
        size_t k;
        st = ferry_consumer_recv(c, 50 * MS, &d, 1, &k);
        if (st == FERRY_OK) { /* what came before the cut or the kill is read and acknowledged */
            st = ferry_consumer_read(c, &d, buf, sizeof(buf), 5000 * MS);
            if (st == FERRY_OK)
                st = ferry_consumer_ack(c, &d);
        }
        if (st != FERRY_OK && st != FERRY_TIMEOUT)
            break;
    }
    th_report(st, ms_since(start));
    ferry_consumer_destroy(c);
    return 0;
}

/* "stalled ADDR RANK": connects, reports, receives one item and reports; then, at the test's
 * ITEM (sent once it stopped the producer), reads the item with a timeout of 1 s and reports
 * the status the read ended with and, in count, how many milliseconds it took. */
static int stalled_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, -1);
    if (!c)
        return 1;
    ferry_status st;
    static uint8_t buf[1 << 20];
    ferry_descriptor d;
    size_t k;
    st = ferry_consumer_recv(c, 10000 * MS, &d, 1, &k);
    th_report(st, 0);
    th_msg go;
    if (st != FERRY_OK || th_recv_msg(TH_CHANNEL_FD, &go, 10000) != 0)
        return 1;
    uint64_t start = ferry_now_ns();
    st = ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS);
    th_report(st, ms_since(start));
    ferry_consumer_destroy(c);
    return 0;
}

/* What the "acker" helper does after it acknowledged the leases an ITEM asked for. */
enum { ACKER_IDLE = 1, ACKER_RECV = 2, ACKER_LEAVE = 3, ACKER_READ_BIG = 4 };

/* "acker ADDR RANK": connects and reports; then, for each ITEM from the test (seed: how many
 * leases; status: what next), receives that many leases, reads, checks and acknowledges
 * each, reports how many it verified, and then: IDLE, makes no call until the next ITEM;
 * RECV, looks for a lease once (nothing comes); LEAVE, destroys the consumer at once,
 * reports again and ends; READ_BIG, receives one more lease, reports, reads and checks it
 * (without acknowledging it) and reports how many milliseconds the read took. */
static int acker_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, -1);
    if (!c)
        return 1;
    size_t cap = 16u << 20;
    uint8_t *buf = malloc(cap);
    th_msg m;
    while (th_recv_msg(TH_CHANNEL_FD, &m, 30000) == 0) {
        ferry_status st = FERRY_OK;
        uint64_t verified = 0;
        for (uint64_t i = 0; i < m.seed && st == FERRY_OK; i++) {
            st = take_one(c, 1);
            verified += st == FERRY_OK;
        }
        th_report(st, verified);
        if (st != FERRY_OK)
            return 1;
        if (m.status == ACKER_READ_BIG) {
            ferry_descriptor d;
            size_t k = 0;
            st = ferry_consumer_recv(c, 0, &d, 1, &k); /* there already */
            th_report(st, 0);
            uint64_t t0 = ferry_now_ns();
            if (st == FERRY_OK)
                st = read_self_stamped(c, &d, buf, cap, 30000 * MS, NULL);
            th_report(st, ms_since(t0));
            if (st != FERRY_OK)
                return 1;
        }
        if (m.status == ACKER_LEAVE) {
            ferry_consumer_destroy(c);
            th_report(FERRY_OK, 0);
            free(buf);
            return 0;
        }
        if (m.status == ACKER_RECV) {
            ferry_descriptor d;
            size_t k = 0;
            st = ferry_consumer_recv(c, 0, &d, 1, &k); /* a look that finds nothing */
            if (st != FERRY_TIMEOUT) {
                th_report(st == FERRY_OK ? FERRY_MISMATCH : st, 0);
                return 1;
            }
        }
    }
    ferry_consumer_destroy(c);
    free(buf);
    return 0;
}

/* Tests only: the client gives its endpoint up after its next partial mark. */
static int give_up_after_mark(void)
{
    return 1;
}

/* "parts ADDR RANK": connects, reports, receives the three parts of one packed lease and
 * reports how many came; at the test's first ITEM acknowledges part 0 for ranks [0, 2) (as
 * their leader), at its second parts 1 and 2, reporting each time; stays connected until
 * the test's DONE. Other modes:
 * - "parts-after-ack": first acknowledges the whole lease for rank 0 alone, so that rank 0's
 *   partial mark comes after its acknowledgement;
 * - "parts-forged": after part 0, acknowledges a copy of part 1 that claims to be part 150 of
 *   200, and reports that status instead;
 * - "parts-leader": acknowledges through a second consumer, connected as rank 2, which never
 *   receives the lease itself;
 * - "parts-gone": at the first ITEM, acknowledges parts 1 and 2 for rank 1 alone, then part 0
 *   for ranks [0, 2) (a partial mark for rank 0, the acknowledgement of rank 1) with the
 *   endpoint given up after the mark, and reports that status; nothing more. */
static int parts_main(const char *mode, const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, -1), *leader = NULL;
    if (!c)
        return 1;
    ferry_descriptor d[3];
    size_t got = 0;
    ferry_status st = FERRY_OK;
    while (st == FERRY_OK && got < 3) {
        size_t k = 0;
        st = ferry_consumer_recv(c, 10000 * MS, d + got, 3 - got, &k);
        got += k;
    }
    if (st == FERRY_OK && strcmp(mode, "parts-leader") == 0)
        st = ferry_consumer_connect(addr, 2, -1, &leader);
    ferry_consumer *acker = leader ? leader : c;
    th_report(st, got);
    th_msg go;
    if (st == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &go, 10000) == 0) {
        if (strcmp(mode, "parts-after-ack") == 0)
            st = ferry_consumer_ack_lease_range(c, &d[0], 0, 1);
        if (strcmp(mode, "parts-gone") == 0) {
            for (int i = 1; i < 3 && st == FERRY_OK; i++)
                st = ferry_consumer_ack_range(c, &d[i], 1, 1);
            __atomic_store_n(&ferry__remote_test_after_mark, give_up_after_mark, __ATOMIC_RELEASE);
        }
        if (st == FERRY_OK)
            st = ferry_consumer_ack_range(acker, &d[0], 0, 2);
        if (strcmp(mode, "parts-gone") == 0) {
            th_report(st, 1);
            st = FERRY_PRODUCER_GONE; /* nothing more */
        } else if (st == FERRY_OK && strcmp(mode, "parts-forged") == 0) {
            ferry_descriptor forged = d[1];
            forged.part_index = 150;
            forged.part_count = 200;
            th_report(ferry_consumer_ack_range(c, &forged, 0, 2), 1);
        } else {
            th_report(st, 1);
        }
    }
    if (st == FERRY_OK && th_recv_msg(TH_CHANNEL_FD, &go, 10000) == 0) {
        for (int i = 1; i < 3 && st == FERRY_OK; i++)
            st = ferry_consumer_ack_range(acker, &d[i], 0, 2);
        th_report(st, 3);
    }
    th_recv_msg(TH_CHANNEL_FD, &go, 10000);
    ferry_consumer_destroy(leader);
    ferry_consumer_destroy(c);
    return 0;
}

/* "gpu-receiver ADDR RANK": as "receiver", made for GPU 0: even items are read into GPU memory
 * (and copied back to be checked), odd ones into host memory. */
static int gpu_receiver_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, 0);
    if (!c)
        return 1;
    ferry_status st;
    size_t cap = 65u << 20;
    uint8_t *host = malloc(cap);
    void *dev = NULL;
    st = ferry_gpu_alloc(0, cap, &dev);
    uint64_t verified = 0;
    for (uint64_t i = 0; st == FERRY_OK; i++) {
        ferry_descriptor d;
        size_t k = 0;
        st = ferry_consumer_recv(c, 30000 * MS, &d, 1, &k);
        if (st != FERRY_OK)
            break;
        if (i % 2 == 0) {
            st = ferry_consumer_read(c, &d, dev, cap, 5000 * MS);
            if (st == FERRY_OK)
                st = ferry_gpu_copy_async(0, host, dev, d.length, NULL);
            if (st == FERRY_OK)
                st = ferry_gpu_stream_synchronize(0, NULL);
        } else {
            st = ferry_consumer_read(c, &d, host, cap, 5000 * MS);
        }
        uint64_t seed = 0;
        if (st == FERRY_OK) {
            th_check_stamp(host, d.length, 0, &seed);
            if (!th_check_stamp(host, d.length, seed, NULL)) {
                th_report(FERRY_MISMATCH, verified);
                return 1;
            }
            st = ferry_consumer_ack(c, &d);
        }
        if (st != FERRY_OK || seed == END_SEED)
            break;
        verified++;
    }
    th_report(st, verified);
    ferry_gpu_free(0, dev);
    free(host);
    ferry_consumer_destroy(c);
    return 0;
}

/* "cycles ADDR N": connects and closes N times as rank 0; reports OK only if this process's
 * fds, threads and memory after the cycles are what they were after the first ten. */
static int cycles_main(const char *addr, uint64_t n)
{
    int fds0 = 0;
    long threads0 = 0, rss0 = 0;
    for (uint64_t i = 0; i < n; i++) {
        ferry_consumer *c = NULL;
        ferry_status st = ferry_consumer_connect(addr, 0, -1, &c);
        if (st != FERRY_OK) {
            th_report(st, i);
            return 1;
        }
        ferry_consumer_destroy(c);
        if (i == 9) { /* settled in: both sides count from here */
            fds0 = th_count_fds();
            threads0 = th_status_field("Threads:");
            rss0 = th_status_field("VmRSS:");
            th_msg m = {.type = TH_MSG_ITEM};
            th_send_msg(TH_CHANNEL_FD, &m);
            th_recv_msg(TH_CHANNEL_FD, &m, -1); /* the producer counted its own */
        }
    }
    int fds = th_count_fds();
    long threads = th_threads_settled(threads0), rss = th_status_field("VmRSS:");
    char text[256];
    snprintf(text, sizeof(text), "fds %d -> %d, threads %ld -> %ld, rss %ld -> %ld kB", fds0, fds,
             threads0, threads, rss0, rss);
    th_msg m = {.type = TH_MSG_RESULT, .seed = n};
    int flat = fds == fds0 && threads <= threads0 && (th_sanitized() || rss - rss0 < 8192);
    m.status = flat ? FERRY_OK : FERRY_SYSTEM;
    snprintf(m.text, sizeof(m.text), "%s", text);
    th_send_msg(TH_CHANNEL_FD, &m);
    return 0;
}

/* "producer LISTEN -": a pool of 2 ranks listening there; reports its remote address (in the
 * text), sends one item to rank 1 whenever the test sends an ITEM (of 4 KiB, or as many bytes
 * as the ITEM's text says), closes the pool when the test sends DONE (then reports again),
 * and is otherwise killed. */
static int producer_main(const char *ip)
{
    snprintf(net.ip[0], sizeof(net.ip[0]), "%s", ip);
    ferry_pool *pool = make_pool(2, 16 << 20, 2000000);
    th_msg m = {.type = TH_MSG_RESULT, .status = FERRY_OK};
    remote_address_of(pool, m.text);
    th_send_msg(TH_CHANNEL_FD, &m);
    for (;;) {
        th_msg in;
        if (th_recv_msg(TH_CHANNEL_FD, &in, -1) != 0)
            break;
        if (in.type == TH_MSG_DONE) {
            ferry_pool_destroy(pool);
            th_report(FERRY_OK, 0);
            pause();
        }
        ferry_ranks one = {NULL, 1, 1};
        size_t n = in.text[0] ? (size_t)strtoull(in.text, NULL, 10) : 4096;
        send_stamped(pool, n, in.seed, &one, 1000 * MS);
    }
    return 0;
}

/* "symbol NAME -": ferry_ucx_symbol(NAME) in a process of its own (FERRY_UCX_LIBRARY as the
 * test set it); reports its status and message. */
static int symbol_main(const char *name)
{
    void *fn = NULL;
    ferry_status st = ferry_ucx_symbol(name, &fn);
    th_report(st, fn != NULL);
    return 0;
}

/* Forks: the parent waits for the child and exits with its status; the child returns 0
 * (after unshare(CLONE_NEWPID), the child is the new namespace's first process). */
static int in_child_waited(void)
{
    pid_t child = fork();
    if (child < 0)
        return -1;
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        return 0;
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 98);
}

/* "giveback ADDR RANK": connects, reports, receives one lease and reports it (read and
 * checked, not acknowledged). At the test's first ITEM destroys the consumer and reports; at
 * the second connects again as the same rank, reports, then takes one more lease
 * (acknowledged) and reports; at the third destroys that one and reports; lives on until the
 * test's DONE. */
static int giveback_main(const char *addr, uint32_t rank)
{
    ferry_consumer *c = connect_reported(addr, rank, -1);
    if (!c)
        return 1;
    th_report(take_one(c, 0), 1);
    th_msg m;
    if (th_recv_msg(TH_CHANNEL_FD, &m, 10000) != 0)
        return 1;
    ferry_consumer_destroy(c);
    th_report(FERRY_OK, 0);
    if (th_recv_msg(TH_CHANNEL_FD, &m, 10000) != 0 || !(c = connect_reported(addr, rank, -1)))
        return 1;
    th_report(take_one(c, 1), 1);
    if (th_recv_msg(TH_CHANNEL_FD, &m, 10000) != 0)
        return 1;
    ferry_consumer_destroy(c);
    th_report(FERRY_OK, 0);
    th_recv_msg(TH_CHANNEL_FD, &m, 20000);
    return 0;
}

static int helper_main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies takes its helpers along */
    const char *ns = getenv("FERRY_TEST_NETNS"), *dev = getenv("FERRY_TEST_DEV");
    if (ns && join_netns(ns) != 0) {
        th_report(FERRY_SYSTEM, 0);
        return 3;
    }
    if (getenv("FERRY_TEST_NEWPID") && (unshare(CLONE_NEWPID) != 0 || in_child_waited() != 0))
        return 3; /* the helper runs on as pid 1 of a new PID namespace */
    setenv("UCX_TLS", "tcp", 0);
    if (dev)
        setenv("UCX_NET_DEVICES", dev, 1);
    if (argc < 5)
        return 2;
    if (strcmp(argv[2], "giveback") == 0)
        return giveback_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    if (strcmp(argv[2], "symbol") == 0)
        return symbol_main(argv[3]);
    if (strcmp(argv[2], "producer") == 0)
        return producer_main(argv[3]);
    if (strcmp(argv[2], "gone") == 0)
        return gone_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    if (strncmp(argv[2], "parts", 5) == 0)
        return parts_main(argv[2], argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    if (strcmp(argv[2], "stalled") == 0)
        return stalled_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    if (strcmp(argv[2], "gpu-receiver") == 0)
        return gpu_receiver_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    if (strcmp(argv[2], "cycles") == 0)
        return cycles_main(argv[3], strtoull(argv[4], NULL, 10));
    if (strcmp(argv[2], "acker") == 0)
        return acker_main(argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    return receiver_main(argv[2], argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
}

/* ---- tests ------------------------------------------------------------------------------- */

/* Connect before and after the first send; a pool with a local and a remote rank: sends to a
 * list, a range and every rank reach both, byte for byte, and every lease is recycled. */
static void test_local_and_remote_ranks(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(3, 16 << 20, 5000000);
    char raddr[FERRY_REMOTE_ADDRESS_SIZE], laddr[FERRY_ADDRESS_SIZE];
    remote_address_of(pool, raddr);
    assert_int_equal(ferry_pool_address(pool, laddr, sizeof(laddr)), FERRY_OK);
    assert_int_equal(strncmp(raddr, "ferry+ucx://", 12), 0);
    th_helper early = spawn_consumer(1, "receiver", raddr, 1, FERRY_OK);
    th_helper local = spawn_consumer(0, "receiver", laddr, 0, FERRY_OK);
    for (uint64_t i = 0; i < 3; i++) /* rank 2 is not connected yet: queued for it */
        assert_int_equal(send_stamped(pool, 4096 + i, 100 + i, NULL, 5000 * MS), FERRY_OK);
    th_helper late = spawn_consumer(1, "receiver", raddr, 2, FERRY_OK);
    uint32_t list[] = {0, 2};
    ferry_ranks to_list = {list, 0, 2}, to_range = {NULL, 1, 2};
    assert_int_equal(send_stamped(pool, 5000, 200, &to_list, 5000 * MS), FERRY_OK);
    assert_int_equal(send_stamped(pool, 6000, 201, &to_range, 5000 * MS), FERRY_OK);
    assert_int_equal(th_stats(pool).remote_connected, 2);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&local, 10000), 4);
    th_assert_result(th_finish_helper(&early, 10000), 4);
    th_assert_result(th_finish_helper(&late, 10000), 5);
    wait_settled(pool, 5000);
    ferry_pool_stats s = th_stats(pool);
    assert_int_equal(s.remote_admitted, 2);
    assert_true(s.remote_forwarded >= 9);
    assert_int_equal(s.remote_refused, 0);
    ferry_pool_destroy(pool);
}

/* A consumer of a pool on its own host, connected by the remote address, opens the pool
 * through its broker and reads it as a local consumer (a view works: the pool is mapped
 * there), unless FERRY_REMOTE_LOCAL=0; one in another network namespace, where the broker is
 * out of reach, is admitted over UCX. Both get every lease byte for byte; only the UCX ones
 * are admitted by the pool's server. */
static void test_same_host_goes_local(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(3, 16 << 20, 5000000);
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, raddr);
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    th_helper here = spawn_consumer(0, "viewer", raddr, 0, FERRY_OK);
    th_helper there = spawn_consumer(1, net.netns ? "receiver" : "viewer", raddr, 1, FERRY_OK);
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    th_helper over_ucx = spawn_consumer(0, "receiver", raddr, 2, FERRY_OK);
    for (uint64_t i = 0; i < 4; i++)
        assert_int_equal(send_stamped(pool, 4096 << i, 300 + i, NULL, 5000 * MS), FERRY_OK);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&here, 10000), 4);
    th_assert_result(th_finish_helper(&there, 10000), 4);
    th_assert_result(th_finish_helper(&over_ucx, 10000), 4);
    wait_settled(pool, 5000);
    ferry_pool_stats s = th_stats(pool);
    fprintf(stderr, "test_remote: same host: %llu of 3 ranks admitted over UCX (%s)\n",
            (unsigned long long)s.remote_admitted,
            net.netns ? "rank 1 in another network namespace" : "one namespace");
    assert_int_equal(s.remote_admitted, net.netns ? 2 : 1);
    assert_int_equal(s.consumers_attached, 3);
    /* Asked which pool it is only by the consumer whose address is on its host: not the one in
     * the other namespace, nor the one kept on UCX. */
    assert_int_equal(remote_counts(pool).described, net.netns ? 1 : 2);
    ferry_pool_destroy(pool);
}

/* A consumer by remote address on the producer's host that cannot open the pool here goes
 * over UCX: one in a new PID namespace (the producer's pid reads 0 there: its liveness could
 * not be watched) is admitted over UCX and gets every item; a rank out of range, or held by a
 * live process, is answered at once, as the connection would answer it, without one. */
static void test_same_host_falls_back(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 16 << 20, 5000000);
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, raddr);
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    th_helper local = spawn_consumer(0, "receiver", raddr, 0, FERRY_OK);
    th_helper taken = spawn_consumer(0, "receiver", raddr, 0, FERRY_RANK_IN_USE);
    th_reap_helper(&taken);
    th_helper out = spawn_consumer(0, "receiver", raddr, 2, FERRY_INVALID_ARGUMENT);
    th_reap_helper(&out);
    assert_int_equal(th_stats(pool).remote_admitted, 0);
    setenv("FERRY_TEST_NEWPID", "1", 1);
    th_helper unseen = spawn_consumer(0, "receiver", raddr, 1, FERRY_OK);
    unsetenv("FERRY_TEST_NEWPID");
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    for (uint64_t i = 0; i < 3; i++)
        assert_int_equal(send_stamped(pool, 4096 << i, 500 + i, NULL, 5000 * MS), FERRY_OK);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&local, 10000), 3);
    th_assert_result(th_finish_helper(&unseen, 10000), 3);
    wait_settled(pool, 5000);
    assert_int_equal(th_stats(pool).remote_admitted, 1);
    assert_int_equal(remote_counts(pool).described, 4);
    ferry_pool_destroy(pool);
}

/* A consumer by remote address that went local gives its rank back when destroyed, as closing
 * its connection would: the lease it read and never acknowledged is acknowledged on its behalf,
 * the same process may connect as the rank again (and gets what is sent then), and once that
 * one is destroyed too another process takes the rank at once, while the first lives on. */
static void test_same_host_gives_rank_back(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, raddr);
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    th_helper first = spawn_consumer(0, "giveback", raddr, 0, FERRY_OK);
    assert_int_equal(send_stamped(pool, 65536, 700, NULL, 5000 * MS), FERRY_OK);
    th_msg m;
    assert_int_equal(th_recv_msg(first.fd, &m, 10000), 0);
    assert_int_equal(m.status, FERRY_OK);
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    th_helper early = spawn_consumer(0, "receiver", raddr, 0, FERRY_RANK_IN_USE);
    th_reap_helper(&early);
    for (int round = 0; round < 2; round++) {
        th_send_type(first.fd, TH_MSG_ITEM); /* destroy */
        assert_int_equal(th_recv_msg(first.fd, &m, 10000), 0);
        assert_int_equal(m.status, FERRY_OK);
        wait_settled(pool, 5000); /* what it held, acknowledged on its behalf */
        if (round == 1)
            break;
        th_send_type(first.fd, TH_MSG_ITEM); /* the same process, the same rank again */
        assert_int_equal(th_recv_msg(first.fd, &m, 10000), 0);
        assert_int_equal(m.status, FERRY_OK);
        assert_int_equal(send_stamped(pool, 65536, 701, NULL, 5000 * MS), FERRY_OK);
        assert_int_equal(th_recv_msg(first.fd, &m, 10000), 0);
        assert_int_equal(m.status, FERRY_OK);
        assert_int_equal(th_stats(pool).consumers_alive, 1);
    }
    th_helper next = spawn_consumer(0, "receiver", raddr, 0, FERRY_OK);
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    assert_int_equal(send_stamped(pool, 65536, 702, NULL, 5000 * MS), FERRY_OK);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&next, 10000), 1);
    th_send_type(first.fd, TH_MSG_DONE);
    th_reap_helper(&first);
    wait_settled(pool, 5000);
    assert_int_equal(th_stats(pool).remote_admitted, 0);
    ferry_pool_destroy(pool);
}

/* A consumer by remote address on the pool's host, given back (destroyed), has what it read
 * and never acknowledged acknowledged at once, a lease handed over outside the rings
 * (ferry_pool_publish) included, also where the same process takes the rank again before
 * the pool next looks at its ranks. Of several such consumers of one rank in a process the
 * last one gives it back; a consumer by the pool's local address holds it for the process's
 * life, and then none does. */
static void test_given_back_rank_settles_at_once(void **state)
{
    (void)state;
    char listen[64], raddr[FERRY_REMOTE_ADDRESS_SIZE], laddr[FERRY_ADDRESS_SIZE];
    snprintf(listen, sizeof(listen), "%s:0", net.ip[0]);
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_HOST;
    cfg.memory_size = 1 << 20;
    cfg.consumer_count = 1;
    cfg.listen = listen;
    cfg.reclaim_interval_us = 60 * 1000000; /* no look at the ranks during the test */
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&cfg, &pool), FERRY_OK);
    remote_address_of(pool, raddr);
    assert_int_equal(ferry_pool_address(pool, laddr, sizeof(laddr)), FERRY_OK);
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    ferry_consumer *c = NULL, *other = NULL;
    assert_int_equal(ferry_consumer_connect(raddr, 0, -1, &c), FERRY_OK);
    assert_int_equal(remote_counts(pool).admitted, 0); /* opened through the broker */
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    static uint8_t src[65536], dst[65536];
    ferry_tensor t = ferry_tensor_bytes(sizeof(src));
    ferry_descriptor d;
    for (uint64_t round = 0; round < 3; round++) {
        th_stamp(src, sizeof(src), 900 + round);
        assert_int_equal(ferry_pool_publish(pool, &t, src, 1000 * MS, &d), FERRY_OK);
        assert_int_equal(ferry_consumer_read(c, &d, dst, sizeof(dst), 1000 * MS), FERRY_OK);
        assert_true(th_check_stamp(dst, sizeof(dst), 900 + round, NULL));
        assert_int_equal(th_stats(pool).leases_in_flight, 1);
        if (round == 2) { /* a second consumer of the rank, destroyed first: nothing given back */
            assert_int_equal(ferry_consumer_connect(raddr, 0, -1, &other), FERRY_OK);
            ferry_consumer_destroy(other);
            assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
            assert_true(info.alive && info.pid == getpid());
            assert_int_equal(th_stats(pool).leases_in_flight, 1);
        }
        ferry_consumer_destroy(c);
        c = NULL;
        assert_int_equal(ferry_consumer_connect(raddr, 0, -1, &c), FERRY_OK); /* at once */
        wait_settled(pool, 2000);
    }
    /* Held for the process's life by its local address, the rank is not given back. */
    assert_int_equal(ferry_consumer_connect(laddr, 0, -1, &other), FERRY_OK);
    assert_int_equal(ferry_pool_publish(pool, &t, src, 1000 * MS, &d), FERRY_OK);
    assert_int_equal(ferry_consumer_read(c, &d, dst, sizeof(dst), 1000 * MS), FERRY_OK);
    ferry_consumer_destroy(c);
    ferry_consumer_destroy(other);
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_true(info.alive && info.pid == getpid());
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    ferry_pool_destroy(pool);
}

static int warnings_seen;

static void count_warnings(int level, const char *message, void *user)
{
    (void)message;
    (void)user;
    if (level <= FERRY_LOG_WARN)
        __atomic_add_fetch(&warnings_seen, 1, __ATOMIC_RELAXED);
}

/* A consumer by remote address on the pool's host destroyed after its producer ended has
 * nothing to give back: no warning that the rank "stays this process's". */
static void test_give_back_after_producer_quiet(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 1 << 20, 5000000);
    char raddr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, raddr);
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(raddr, 0, -1, &c), FERRY_OK);
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    ferry_pool_destroy(pool);
    warnings_seen = 0;
    ferry_set_log(count_warnings, NULL);
    ferry_consumer_destroy(c);
    ferry_set_log(NULL, NULL);
    assert_int_equal(__atomic_load_n(&warnings_seen, __ATOMIC_RELAXED), 0);
}

/* RELEASE gives a rank back only for the process holding it: one asked by another process
 * (here the test's, which holds no rank) changes nothing, and the holder keeps receiving. */
static void test_release_by_another_process_ignored(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char laddr[FERRY_ADDRESS_SIZE];
    assert_int_equal(ferry_pool_address(pool, laddr, sizeof(laddr)), FERRY_OK);
    th_helper h = spawn_consumer(0, "receiver", laddr, 0, FERRY_OK);
    assert_int_equal(
        ferry__broker_release(pool->broker_name, pool->pool_id, 0, "pool broker", 1000 * MS),
        FERRY_OK);
    ferry_consumer_info info = FERRY_CONSUMER_INFO_INIT;
    assert_int_equal(ferry_pool_consumer_info(pool, 0, &info), FERRY_OK);
    assert_true(info.alive && info.pid == h.pid);
    assert_int_equal(send_stamped(pool, 4096, 800, NULL, 5000 * MS), FERRY_OK);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&h, 10000), 1);
    wait_settled(pool, 5000);
    assert_int_equal(th_stats(pool).acked_for_dead, 0);
    ferry_pool_destroy(pool);
}

/* Many hand-overs of 4 KiB to 16 MiB to a remote rank, every byte checked there. */
static void test_many_hand_overs(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 96 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    th_helper h = spawn_consumer(1, "receiver", addr, 0, FERRY_OK);
    uint64_t n = th_scaled(10000, 300), big = 0;
    uint64_t t0 = ferry_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        /* Mostly small items, every 100th one of 1 to 16 MiB. */
        size_t size = i % 100 == 99 ? (1u << 20) << (i / 100 % 5) : 4096u << (i % 5);
        big += size >= (1u << 20);
        if (send_stamped(pool, size, 1000 + i, NULL, 20000 * MS) != FERRY_OK)
            fail_msg("send %llu: %s", (unsigned long long)i, ferry_last_error());
    }
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&h, 60000), n);
    fprintf(stderr, "test_remote: %llu hand-overs (%llu of 1-16 MiB) in %llu ms\n",
            (unsigned long long)n, (unsigned long long)big, (unsigned long long)ms_since(t0));
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* Sends n leases of the given sizes (n at most the ring's depth), then, once they are on their
 * way (each of the helper's recvs then finds one), asks the acker helper to take the first
 * `take` of them and then the step; waits for its report of those. */
static void acker_ask(ferry_pool *pool, th_helper *h, const size_t *sizes, uint64_t n,
                      uint64_t take, uint32_t step)
{
    uint64_t forwarded = th_stats(pool).remote_forwarded;
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(send_stamped(pool, sizes[i], 500 + i, NULL, 5000 * MS), FERRY_OK);
    for (uint64_t t0 = ferry_now_ns(); th_stats(pool).remote_forwarded < forwarded + n;)
        assert_true(ms_since(t0) < 3000);
    usleep(200000); /* the descriptors in the consumer's inbox */
    th_msg m = {.type = TH_MSG_ITEM, .status = step, .seed = take};
    assert_int_equal(th_send_msg(h->fd, &m), 0);
    assert_int_equal(th_recv_msg(h->fd, &m, 10000), 0);
    th_assert_result(m, take);
}

/* acker_ask with n leases of 4 KiB, all taken. */
static void acker_round(ferry_pool *pool, th_helper *h, uint64_t n, uint32_t step)
{
    size_t sizes[16];
    assert_true(n <= 16);
    for (int i = 0; i < 16; i++)
        sizes[i] = 4096;
    acker_ask(pool, h, sizes, n, n, step);
}

/* A remote rank's own acknowledgements go out together, within FERRY_REMOTE_ACK_DELAY_US (3 s
 * here) of the first: 12 made in a row reach the producer as one message, seconds later,
 * while the consumer makes no call (the client's thread sends them). They go at once when the
 * consumer finds nothing to take, and when it is destroyed (as its own, not acknowledged on
 * a dead rank's behalf). */
static void test_acks_go_out_together(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    setenv("FERRY_REMOTE_ACK_DELAY_US", "3000000", 1);
    th_helper h = spawn_consumer(1, "acker", addr, 0, FERRY_OK);
    unsetenv("FERRY_REMOTE_ACK_DELAY_US");
    uint64_t msgs = remote_counts(pool).ack_messages;
    acker_round(pool, &h, 12, ACKER_IDLE);
    uint64_t took = wait_settled(pool, 10000);
    fprintf(stderr, "test_remote: 12 acknowledgements settled %llu ms after the last\n",
            (unsigned long long)took);
    assert_true(took >= 1000);
    assert_int_equal(remote_counts(pool).ack_messages, msgs + 1);
    acker_round(pool, &h, 4, ACKER_RECV);
    assert_true(wait_settled(pool, 1500) < 1500);
    assert_int_equal(remote_counts(pool).ack_messages, msgs + 2);
    acker_round(pool, &h, 4, ACKER_LEAVE);
    th_assert_result(th_finish_helper(&h, 10000), 0);
    wait_settled(pool, 1000);
    assert_int_equal(remote_counts(pool).ack_messages, msgs + 3);
    assert_int_equal(th_stats(pool).acked_for_dead, 0);
    ferry_pool_destroy(pool);
}

static int unshape(void **state)
{
    (void)state;
    if (net.netns)
        sh("tc -n %s qdisc del dev %s root 2>/dev/null", net.ns[0], net.dev[0]);
    return 0;
}

/* An acknowledgement waits no longer than its delay (20 ms here) when the consumer's next call
 * is a long read: the producer's link slowed to 32 Mbit/s, a rank acknowledges a small lease
 * and then reads 4 MiB (a second): the small one is settled within 500 ms of the read's
 * start, long before the read ends. */
static void test_acks_go_out_during_a_long_read(void **state)
{
    (void)state;
    if (!net.netns)
        skip(); /* no namespaces here: the link cannot be slowed */
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    setenv("FERRY_REMOTE_ACK_DELAY_US", "20000", 1);
    th_helper h = spawn_consumer(1, "acker", addr, 0, FERRY_OK);
    unsetenv("FERRY_REMOTE_ACK_DELAY_US");
    assert_int_equal(sh("tc -n %s qdisc add dev %s root tbf rate 32mbit burst 32kb latency 2000ms",
                        net.ns[0], net.dev[0]),
                     0);
    const size_t sizes[2] = {4096, 4u << 20};
    acker_ask(pool, &h, sizes, 2, 1, ACKER_READ_BIG); /* the small one, acknowledged */
    th_msg m;
    assert_int_equal(th_recv_msg(h.fd, &m, 10000), 0);
    th_assert_result(m, 0); /* the large one, received: its read begins */
    uint64_t t0 = ferry_now_ns(), settled = 0;
    uint64_t reclaimed;
    while (ferry_pool_reclaim(pool, &reclaimed) == FERRY_OK &&
           th_stats(pool).leases_in_flight > 1 && ms_since(t0) < 10000)
        usleep(1000);
    settled = ms_since(t0);
    assert_int_equal(th_recv_msg(h.fd, &m, 30000), 0);
    assert_int_equal(m.status, FERRY_OK);
    fprintf(stderr,
            "test_remote: an acknowledgement settled %llu ms into a read of 4 MiB that took "
            "%llu ms\n",
            (unsigned long long)settled, (unsigned long long)m.seed);
    assert_true(m.seed >= 700); /* the link was slow enough to tell */
    assert_true(settled < 500);
    unshape(NULL);
    acker_round(pool, &h, 0, ACKER_LEAVE);
    th_assert_result(th_finish_helper(&h, 10000), 0);
    ferry_pool_destroy(pool);
}

/* A remote rank killed with leases in flight: acknowledged for within 1 s, and its rank can be
 * taken again by a new consumer, which gets what is sent from then on. */
static void test_consumer_killed(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    th_helper h = spawn_consumer(1, "hold", addr, 0, FERRY_OK);
    for (uint64_t i = 0; i < 4; i++)
        assert_int_equal(send_stamped(pool, 8192, 300 + i, NULL, 5000 * MS), FERRY_OK);
    th_msg m;
    for (int i = 0; i < 4; i++) /* it holds all four, read and not acknowledged */
        assert_int_equal(th_recv_msg(h.fd, &m, 10000), 0);
    assert_int_equal(th_stats(pool).leases_in_flight, 4);
    kill(h.pid, SIGKILL);
    uint64_t t0 = ferry_now_ns();
    th_reap_helper(&h);
    uint64_t took = wait_settled(pool, 1000);
    fprintf(stderr, "test_remote: a killed remote consumer's leases settled in %llu ms\n",
            (unsigned long long)(ms_since(t0)));
    (void)took;
    assert_true(th_stats(pool).acked_for_dead >= 4);
    assert_int_equal(th_stats(pool).remote_connected, 0);
    th_helper again = spawn_consumer(1, "receiver", addr, 0, FERRY_OK);
    assert_int_equal(send_stamped(pool, 4096, 400, NULL, 5000 * MS), FERRY_OK);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&again, 10000), 1);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* Consumers killed while their reads are being answered: one while the producer's thread is
 * held before it copies the first answer (which then goes to a connection that is gone),
 * then three SIGKILLed 1, 4 and 7 ms into a stream of 4 MiB leases (each read in requests of
 * 256 KiB). The producer lives on, its answers to the closed connections go nowhere, each
 * one's leases are settled, and the next consumer of the rank is served byte for byte. */
static void test_consumer_killed_while_reading(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 64 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    th_hold_install();
    th_helper held_one = spawn_consumer(1, "receiver", addr, 0, FERRY_OK);
    th_hold_arm();
    assert_int_equal(send_stamped(pool, 4 << 20, 699, NULL, 5000 * MS), FERRY_OK);
    th_hold_wait(); /* its first request checked, not copied yet */
    kill(held_one.pid, SIGKILL);
    th_reap_helper(&held_one);
    struct timespec gone = {0, 100 * 1000 * 1000}; /* its connection's end reaches the host */
    nanosleep(&gone, NULL);
    th_hold_release();
    wait_settled(pool, 5000);
    for (int i = 0; i < 300 && th_stats(pool).remote_connected; i++)
        usleep(10000);
    assert_int_equal(th_stats(pool).remote_connected, 0);
    th_hold_remove();
    for (int round = 0; round < 3; round++) {
        th_helper h = spawn_consumer(1, "receiver", addr, 0, FERRY_OK);
        for (uint64_t i = 0; i < 4; i++)
            assert_int_equal(send_stamped(pool, 4 << 20, 700 + i, NULL, 5000 * MS), FERRY_OK);
        struct timespec ts = {0, (1 + 3 * round) * 1000 * 1000};
        nanosleep(&ts, NULL);
        kill(h.pid, SIGKILL);
        th_reap_helper(&h);
        wait_settled(pool, 5000);
        /* (its leases may all have been acknowledged before the kill: settled at once) */
        for (int i = 0; i < 300 && th_stats(pool).remote_connected; i++)
            usleep(10000);
        assert_int_equal(th_stats(pool).remote_connected, 0);
    }
    uint64_t served = remote_counts(pool).served;
    fprintf(stderr, "test_remote: 4 consumers killed while reading: %llu read requests answered\n",
            (unsigned long long)served);
    assert_true(served > 0); /* the reads were the producer's to answer, not UCX's */
    th_helper again = spawn_consumer(1, "receiver", addr, 0, FERRY_OK);
    assert_int_equal(send_stamped(pool, 4 << 20, 800, NULL, 5000 * MS), FERRY_OK);
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&again, 10000), 1);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* A rank held by a live remote consumer is refused to a second one, local or remote. */
static void test_rank_in_use(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char raddr[FERRY_REMOTE_ADDRESS_SIZE], laddr[FERRY_ADDRESS_SIZE];
    remote_address_of(pool, raddr);
    assert_int_equal(ferry_pool_address(pool, laddr, sizeof(laddr)), FERRY_OK);
    th_helper h = spawn_consumer(1, "hold", raddr, 0, FERRY_OK);
    th_helper second = spawn_consumer(1, "hold", raddr, 0, FERRY_RANK_IN_USE);
    th_reap_helper(&second);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(laddr, 0, -1, &c), FERRY_RANK_IN_USE);
    assert_non_null(strstr(ferry_last_error(), "is held by live process"));
    kill(h.pid, SIGKILL);
    th_reap_helper(&h);
    assert_true(th_stats(pool).remote_refused >= 1);
    ferry_pool_destroy(pool);
}

/* The producer killed, or closing the pool: a remote receiver gets PRODUCER_GONE within 1 s. */
static void test_producer_gone(void **state)
{
    (void)state;
    for (int closed = 0; closed < 2; closed++) {
        th_helper prod = spawn_in(0, "producer", net.ip[0], "-");
        th_msg m;
        assert_int_equal(th_recv_msg(prod.fd, &m, 10000), 0);
        assert_int_equal(m.status, FERRY_OK);
        char addr[FERRY_REMOTE_ADDRESS_SIZE];
        snprintf(addr, sizeof(addr), "%s", m.text);
        th_helper cons = spawn_consumer(1, "gone", addr, 1, FERRY_OK);
        th_send_type(cons.fd, TH_MSG_ITEM); /* the clock starts */
        if (closed) {
            th_send_type(prod.fd, TH_MSG_DONE);
            assert_int_equal(th_recv_msg(prod.fd, &m, 10000), 0);
        } else {
            kill(prod.pid, SIGKILL);
        }
        th_msg dbg = th_finish_helper(&cons, 10000);
        th_msg r = dbg;
        assert_int_equal(r.status, FERRY_PRODUCER_GONE);
        fprintf(stderr, "test_remote: producer %s: PRODUCER_GONE after %llu ms\n",
                closed ? "closed" : "killed", (unsigned long long)r.seed);
        assert_true(r.seed < 1000);
        kill(prod.pid, SIGKILL);
        th_reap_helper(&prod);
    }
}

/* A producer stopped (SIGSTOP) while a consumer reads: its connection stays up (the kernel
 * answers its keepalives) and the read is never answered. The read ends with PRODUCER_GONE
 * within the pool's keepalive bound (2 s here), instead of waiting for the producer to run
 * again. The producer, run again after the consumer left, finds the read's request and the
 * connection's end waiting, and lives on (the reply of a get UCX emulated, sent to that
 * connection, aborted it in 4 runs of 5: docs/design.md, "What UCX does on its own"), and
 * closes its pool when told. */
static void test_producer_stopped(void **state)
{
    (void)state;
    th_helper prod = spawn_in(0, "producer", net.ip[0], "-");
    th_msg m;
    assert_int_equal(th_recv_msg(prod.fd, &m, 10000), 0);
    assert_int_equal(m.status, FERRY_OK);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    snprintf(addr, sizeof(addr), "%s", m.text);
    th_helper cons = spawn_consumer(1, "stalled", addr, 1, FERRY_OK);
    th_msg item = {.type = TH_MSG_ITEM, .seed = 7};
    snprintf(item.text, sizeof(item.text), "%d", 256 << 10); /* read with gets, not inline */
    assert_int_equal(th_send_msg(prod.fd, &item), 0);
    assert_int_equal(th_recv_msg(cons.fd, &m, 10000), 0); /* received */
    assert_int_equal(m.status, FERRY_OK);
    th_stop_helper(&prod);
    th_send_type(cons.fd, TH_MSG_ITEM);
    int answered = th_recv_msg(cons.fd, &m, 6000);
    th_reap_helper(&cons); /* the consumer left: its connection is closed */
    kill(prod.pid, SIGCONT);
    assert_int_equal(answered, 0); /* it did not wait for the producer to run again */
    fprintf(stderr, "test_remote: producer stopped: %s after %llu ms\n",
            ferry_status_name((ferry_status)m.status), (unsigned long long)m.seed);
    assert_int_equal(m.status, FERRY_PRODUCER_GONE);
    assert_true(m.seed >= 1000 && m.seed < 4000);
    struct timespec ts = {0, 500 * 1000 * 1000}; /* time to answer the read it was sent */
    nanosleep(&ts, NULL);
    th_send_type(prod.fd, TH_MSG_DONE);
    th_msg done = {0};
    int closed = th_recv_msg(prod.fd, &done, 10000);
    kill(prod.pid, SIGKILL); /* it waits in pause() once its pool is closed */
    th_reap_helper(&prod);   /* fails if it died otherwise (an abort inside UCX) */
    assert_int_equal(closed, 0);
    assert_int_equal(done.status, FERRY_OK);
}

/* A pool of two ranks (three for "parts-leader", whose rank 2 gets nothing) with a "parts"
 * helper (of the given mode) as rank 0, the three parts of one lease sent to ranks 0 and 1
 * and received there. */
static ferry_pool *parts_setup(const char *mode, th_helper *h)
{
    ferry_pool *pool = make_pool(strcmp(mode, "parts-leader") == 0 ? 3 : 2, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    *h = spawn_consumer(1, mode, addr, 0, FERRY_OK);
    static uint8_t bytes[3][1000];
    ferry_tensor t[3];
    const void *src[3];
    for (int i = 0; i < 3; i++) {
        th_stamp(bytes[i], sizeof(bytes[i]), 40 + (uint64_t)i);
        t[i] = ferry_tensor_bytes(sizeof(bytes[i]));
        src[i] = bytes[i];
    }
    ferry_ranks two = {NULL, 0, 2};
    assert_int_equal(ferry_pool_send(pool, t, src, 3, &two, NULL, 5000 * MS, NULL), FERRY_OK);
    th_msg m;
    assert_int_equal(th_recv_msg(h->fd, &m, 10000), 0);
    th_assert_result(m, 3);
    assert_int_equal(th_consumer_info(pool, 1).partly_acknowledged, 0);
    return pool;
}

/* Asks the helper for its first step and waits until rank's lease shows partly
 * acknowledged (the mark comes with the server's next turn). */
static void parts_first_step(ferry_pool *pool, th_helper *h, uint32_t rank)
{
    th_msg m;
    th_send_type(h->fd, TH_MSG_ITEM);
    assert_int_equal(th_recv_msg(h->fd, &m, 10000), 0);
    th_assert_result(m, 1);
    uint64_t t0 = ferry_now_ns();
    while (!th_consumer_info(pool, rank).partly_acknowledged && ms_since(t0) < 5000)
        usleep(2000);
}

/* Asks the helper for the other parts: every lease is recycled, nothing marked, no message
 * dropped. */
static void parts_finish(ferry_pool *pool, th_helper *h)
{
    th_msg m;
    th_send_type(h->fd, TH_MSG_ITEM);
    assert_int_equal(th_recv_msg(h->fd, &m, 10000), 0);
    th_assert_result(m, 3);
    wait_settled(pool, 5000);
    for (uint32_t r = 0; r < 2; r++) {
        ferry_consumer_info info = th_consumer_info(pool, r);
        assert_int_equal(info.outstanding, 0);
        assert_int_equal(info.partly_acknowledged, 0);
    }
    assert_int_equal(remote_counts(pool).bad_messages, 0);
    th_send_type(h->fd, TH_MSG_DONE);
    th_reap_helper(h);
    ferry_pool_destroy(pool);
}

static void assert_info(ferry_pool *pool, uint32_t rank, uint64_t outstanding, uint64_t partly)
{
    ferry_consumer_info info = th_consumer_info(pool, rank);
    if (info.outstanding != outstanding || info.partly_acknowledged != partly)
        fail_msg("rank %u: %llu leases outstanding, %llu partly acknowledged; expected %llu and "
                 "%llu",
                 rank, (unsigned long long)info.outstanding,
                 (unsigned long long)info.partly_acknowledged, (unsigned long long)outstanding,
                 (unsigned long long)partly);
}

/* A remote leader acknowledges one part of a packed lease for two ranks: the producer's
 * consumer_info shows the lease partly acknowledged for both, as for a local consumer, and
 * the lease stays in flight until the other parts are acknowledged. */
static void test_parts_marked_partial(void **state)
{
    (void)state;
    th_helper h;
    ferry_pool *pool = parts_setup("parts", &h);
    parts_first_step(pool, &h, 1);
    assert_info(pool, 0, 1, 1);
    assert_info(pool, 1, 1, 1);
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    parts_finish(pool, &h);
}

/* As a local leader may acknowledge a remote rank without the pool's lock: rank 1's word
 * written between the producer's read of it and its mark. */
static void ack_rank_1(ferry_pool *pool, uint32_t slot, uint32_t rank)
{
    if (rank == 1)
        __atomic_store_n(&pool->mem.control[ferry__shm_ack_word(&pool->mem.shm.layout, slot, 1)],
                         pool->slots[slot].generation, __ATOMIC_RELEASE);
}

/* A partial mark never replaces an acknowledgement: not one that came first from the same
 * consumer (rank 0, acknowledged whole, then part 0 for ranks 0 and 1), nor one another
 * process wrote while the producer was about to mark (rank 1, written from the hook). */
static void test_partial_mark_never_over_ack(void **state)
{
    (void)state;
    th_helper h;
    ferry_pool *pool = parts_setup("parts-after-ack", &h);
    parts_first_step(pool, &h, 1);
    assert_info(pool, 0, 0, 0);
    assert_info(pool, 1, 1, 1);
    parts_finish(pool, &h);

    pool = parts_setup("parts", &h);
    __atomic_store_n(&ferry__pool_test_before_mark, ack_rank_1, __ATOMIC_RELEASE);
    parts_first_step(pool, &h, 0);
    __atomic_store_n(&ferry__pool_test_before_mark, NULL, __ATOMIC_RELEASE);
    assert_info(pool, 0, 1, 1);
    assert_info(pool, 1, 0, 0);
    parts_finish(pool, &h);
}

/* A copy of a part that claims another part count than its lease's (part 150 of 200 where
 * this consumer acknowledged part 0 of 3): MISMATCH, nothing recorded (the bits of a part set
 * are sized by the first count), and the real parts still complete the lease. */
static void test_forged_part_count(void **state)
{
    (void)state;
    th_helper h;
    ferry_pool *pool = parts_setup("parts-forged", &h);
    th_msg m;
    th_send_type(h.fd, TH_MSG_ITEM);
    assert_int_equal(th_recv_msg(h.fd, &m, 10000), 0);
    assert_int_equal(m.status, FERRY_MISMATCH);
    assert_non_null(strstr(m.text, "part 150 of 200 does not fit its lease"));
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    parts_finish(pool, &h);
}

/* A leader whose own rank never gets the lease acknowledges its parts for ranks 0 and 1:
 * the lease completes (the parts it counted for one rank are not taken for an old lease's
 * while it counts the next rank's). */
static void test_parts_by_leader_without_the_lease(void **state)
{
    (void)state;
    th_helper h;
    ferry_pool *pool = parts_setup("parts-leader", &h);
    parts_first_step(pool, &h, 1);
    assert_info(pool, 0, 1, 1);
    assert_info(pool, 1, 1, 1);
    parts_finish(pool, &h);
}

/* The producer taken for gone while a partial mark was sent (given up there by the test
 * hook), with an acknowledgement for another rank to follow in the same call: the call ends
 * PRODUCER_GONE, and sends nothing through the endpoint it gave up. */
static void test_gone_during_partial_mark(void **state)
{
    (void)state;
    th_helper h;
    ferry_pool *pool = parts_setup("parts-gone", &h);
    th_msg m;
    th_send_type(h.fd, TH_MSG_ITEM);
    assert_int_equal(th_recv_msg(h.fd, &m, 10000), 0);
    assert_int_equal(m.status, FERRY_PRODUCER_GONE);
    th_send_type(h.fd, TH_MSG_DONE);
    th_reap_helper(&h);
    ferry_pool_destroy(pool);
}

/* After test_link_cut, passed or failed: both links up again, so that a failure there does
 * not fail the tests after it. */
static int links_up(void **state)
{
    (void)state;
    for (int side = 0; net.netns && side < 2; side++)
        if (link_to(side, 1) != 0)
            return -1;
    return 0;
}

/* The link cut on the consumers' side, then on the producer's: the producer releases the
 * silent rank, and the consumer gets PRODUCER_GONE, within the keepalive bound (2 s here). */
static void test_link_cut(void **state)
{
    (void)state;
    if (!net.netns)
        skip(); /* loopback cannot be cut */
    for (int side = 1; side >= 0; side--) {
        ferry_pool *pool = make_pool(1, 16 << 20, 2000000);
        char addr[FERRY_REMOTE_ADDRESS_SIZE];
        remote_address_of(pool, addr);
        th_helper cons = spawn_consumer(1, "gone", addr, 0, FERRY_OK);
        link_set(side, 0);
        th_send_type(cons.fd, TH_MSG_ITEM);
        uint64_t t0 = ferry_now_ns();
        /* sent into the cut: never acknowledged, released with the silent rank */
        assert_int_equal(send_stamped(pool, 4096, 500, NULL, 5000 * MS), FERRY_OK);
        wait_settled(pool, 6000);
        uint64_t producer_ms = ms_since(t0);
        assert_int_equal(th_consumer_info(pool, 0).alive, 0);
        assert_int_equal(th_stats(pool).remote_connected, 0);
        th_msg r = th_finish_helper(&cons, 10000);
        link_set(side, 1);
        fprintf(stderr,
                "test_remote: link cut on the %s side: the producer released the rank after "
                "%llu ms, the consumer got %s after %llu ms\n",
                side ? "consumer's" : "producer's", (unsigned long long)producer_ms,
                ferry_status_name((ferry_status)r.status), (unsigned long long)r.seed);
        assert_int_equal(r.status, FERRY_PRODUCER_GONE);
        assert_true(r.seed < 6000);
        ferry_pool_destroy(pool);
    }
}

/* Bad peers: junk, a wrong version, an oversized header, a wrong secret, a rank out of range,
 * a slow loris and a flood of silent connections. Each is refused and counted, nothing of the
 * pool changes, and a real consumer connects meanwhile. */
static int dial(const char *ip, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* 1 if the producer closed the connection (after any answer it sent) within ms. */
static int closed_by_peer(int fd, int ms)
{
    uint8_t buf[256];
    uint64_t t0 = ferry_now_ns();
    while (ms_since(t0) < (uint64_t)ms) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) == 1) {
            ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN))
                return 1;
        }
    }
    return 0;
}

static void test_bad_peers(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry__remote_address a;
    assert_int_equal(ferry__remote_parse(addr, &a), FERRY_OK);
    const char *ip = net.ip[0];
    /* junk, a wrong version, a header announcing too much */
    uint8_t junk[64];
    th_fill(junk, sizeof(junk), 7);
    ferry__hello h = {.rank = 0, .pid = 1, .worker_len = 8, .worker = junk};
    memcpy(h.secret, a.secret, 16);
    memcpy(h.pool_id, a.pool_id, 16);
    strcpy(h.host, "mallory");
    uint8_t hello[FERRY_REMOTE_MAX_MESSAGE];
    assert_int_equal(ferry__hello_encode(&h, hello, sizeof(hello)), FERRY_OK);
    size_t n = ferry__hello_size(&h);
    uint8_t versioned[256], oversized[16];
    memcpy(versioned, hello, n);
    versioned[4] = 9;
    memcpy(oversized, hello, 16);
    oversized[10] = 0x7f; /* size 8 MiB and more */
    struct {
        const uint8_t *bytes;
        size_t n;
    } bad[] = {{junk, sizeof(junk)}, {versioned, n}, {oversized, sizeof(oversized)}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int fd = dial(ip, a.port);
        assert_int_equal(send(fd, bad[i].bytes, bad[i].n, MSG_NOSIGNAL), (ssize_t)bad[i].n);
        assert_true(closed_by_peer(fd, 3000));
        close(fd);
    }
    /* a wrong secret: the refusal tells nothing but PERMISSION */
    char wrong[FERRY_REMOTE_ADDRESS_SIZE];
    a.secret[0] ^= 1;
    ferry__remote_format(&a, wrong, sizeof(wrong));
    a.secret[0] ^= 1;
    th_helper w = spawn_consumer(1, "receiver", wrong, 0, FERRY_PERMISSION);
    th_reap_helper(&w);
    /* a rank out of range */
    th_helper oor = spawn_consumer(1, "receiver", addr, 7, FERRY_INVALID_ARGUMENT);
    th_reap_helper(&oor);
    /* a slow loris (half a hello) and a flood of silent connections: each refused at its own
     * deadline or at once, while a real consumer is admitted meanwhile */
    int loris = dial(ip, a.port);
    assert_int_equal(send(loris, hello, n / 2, MSG_NOSIGNAL), (ssize_t)(n / 2));
    int flood[80];
    for (int i = 0; i < 80; i++)
        flood[i] = dial(ip, a.port);
    uint64_t t0 = ferry_now_ns();
    th_helper good = spawn_consumer(1, "receiver", addr, 1, FERRY_OK);
    fprintf(stderr, "test_remote: admitted during a flood after %llu ms\n",
            (unsigned long long)ms_since(t0));
    assert_true(closed_by_peer(loris, 3000));
    for (int i = 0; i < 80; i++) {
        assert_true(closed_by_peer(flood[i], 3000));
        close(flood[i]);
    }
    close(loris);
    ferry_ranks one = {NULL, 1, 1};
    send_end(pool, &one);
    th_assert_result(th_finish_helper(&good, 10000), 0);
    ferry_pool_stats s = th_stats(pool);
    /* 3 malformed + secret + rank + loris + 80 flood (silent or refused at once) */
    assert_true(s.remote_refused >= 86);
    assert_int_equal(s.remote_admitted, 1);
    char metrics[1 << 16];
    assert_int_equal(ferry_pool_metrics(pool, NULL, metrics, sizeof(metrics), NULL), FERRY_OK);
    assert_non_null(strstr(metrics, "reason=\"secret\"} 1"));
    assert_non_null(strstr(metrics, "reason=\"malformed\"} 3"));
    assert_non_null(strstr(metrics, "reason=\"rank\"} 1"));
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* A read that the lease's recycling overtook ends STALE, never with another lease's bytes:
 * the producer acknowledges a remote rank's lease on its behalf and leases the slice again
 * while the rank reads it. */
static void test_stale_under_read(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 4 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    /* The test itself is the remote consumer of rank 1 (in the producer's namespace: the
     * network path is the same), so that it can race its own reads. */
    use_device(0);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    ferry_consumer *leader = NULL; /* acknowledges on rank 1's behalf */
    assert_int_equal(ferry_consumer_create(0, &leader), FERRY_OK);
    size_t size = 2u << 20;
    uint8_t *buf = malloc(size);
    uint64_t stale = 0, good = 0;
    ferry_ranks one = {NULL, 1, 1};
    for (uint64_t i = 0; i < th_scaled(40, 10); i++) {
        assert_int_equal(send_stamped(pool, size, 600 + i, &one, 5000 * MS), FERRY_OK);
        ferry_descriptor d;
        size_t k;
        assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
        if (i % 2) { /* overtaken before the read: on its behalf, reclaimed, leased again */
            assert_int_equal(ferry_consumer_ack_range(leader, &d, 1, 1), FERRY_OK);
            wait_settled(pool, 2000);
            ferry_descriptor other;
            uint8_t *junk = malloc(size);
            th_stamp(junk, size, 999);
            ferry_tensor t = ferry_tensor_bytes(size);
            const void *src = junk;
            assert_int_equal(ferry_pool_publish(pool, &t, src, 1000 * MS, &other), FERRY_OK);
            free(junk);
            ferry_status st = ferry_consumer_read(c, &d, buf, size, 1000 * MS);
            assert_int_equal(st, FERRY_STALE);
            ferry_pool_cancel(pool, &other);
            stale++;
        } else {
            assert_int_equal(ferry_consumer_read(c, &d, buf, size, 1000 * MS), FERRY_OK);
            assert_true(th_check_stamp(buf, size, 600 + i, NULL));
            assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
            assert_int_equal(ferry_consumer_ack(c, &d), FERRY_STALE); /* twice: stale */
            good++;
        }
    }
    assert_true(stale > 0 && good > 0);
    free(buf);
    ferry_consumer_destroy(leader);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* Held leases (a consumer that reads by gets: here UCX's emulated gets, FERRY_REMOTE_SERVED=0).
 * A lease the consumer acknowledges itself is freed at once. One a leader acknowledges on its
 * behalf stays in flight until the consumer lets it go: its next call answers the REVOKE, and
 * its read of the lease ends STALE; a cancelled one the same, with the cancellation's message.
 * A consumer that never answers has its hold lapse after the keepalive bound (2 s here), and
 * its read after the slice was leased again ends STALE, never with the new bytes. */
static void test_held_leases(void **state)
{
    (void)state;
    setenv("FERRY_REMOTE_SERVED", "0", 1);
    ferry_pool *pool = make_pool(2, 4 << 20, 2000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    use_device(0);
    ferry_consumer *c = NULL, *leader = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_create(0, &leader), FERRY_OK);
    const size_t size = 256u << 10;
    uint8_t *buf = malloc(size), *junk = malloc(size);
    th_stamp(junk, size, 999);
    ferry_ranks one = {NULL, 1, 1};
    ferry_descriptor d;
    size_t k;
    struct timespec pause = {0, 200 * 1000 * 1000};

    /* read and acknowledged by the consumer itself: freed at once */
    assert_int_equal(send_stamped(pool, size, 700, &one, 5000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
    assert_int_equal(ferry_consumer_read(c, &d, buf, size, 2000 * MS), FERRY_OK);
    assert_true(th_check_stamp(buf, size, 700, NULL));
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
    assert_true(wait_settled(pool, 1000) < 1000);

    /* acknowledged by a leader on its behalf: kept until the consumer lets it go */
    for (int cancel = 0; cancel < 2; cancel++) {
        assert_int_equal(send_stamped(pool, size, 701, &one, 5000 * MS), FERRY_OK);
        assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
        if (cancel)
            assert_int_equal(ferry_pool_cancel(pool, &d), FERRY_OK);
        else
            assert_int_equal(ferry_consumer_ack_range(leader, &d, 1, 1), FERRY_OK);
        uint64_t reclaimed;
        assert_int_equal(ferry_pool_reclaim(pool, &reclaimed), FERRY_OK);
        nanosleep(&pause, NULL);
        assert_int_equal(ferry_pool_reclaim(pool, &reclaimed), FERRY_OK);
        assert_int_equal(th_stats(pool).leases_in_flight, 1);
        /* a publish that needs the slice says who keeps it */
        uint64_t usable = th_stats(pool).usable_bytes;
        uint8_t *big = calloc(1, usable);
        ferry_tensor all = ferry_tensor_bytes(usable);
        const void *from = big;
        ferry_descriptor none;
        assert_int_equal(ferry_pool_publish(pool, &all, from, 50 * MS, &none), FERRY_POOL_FULL);
        assert_non_null(strstr(ferry_last_error(), "remote rank 1 has not let lease"));
        free(big);
        assert_int_equal(ferry_consumer_read(c, &d, buf, size, 2000 * MS), FERRY_STALE);
        assert_non_null(strstr(ferry_last_error(),
                               cancel ? "was cancelled" : "already acknowledged for rank 1"));
        assert_true(wait_settled(pool, 1000) < 1000); /* the read's call let it go */
    }

    /* never answered: the hold lapses, the slice is leased again, the read is STALE */
    assert_int_equal(send_stamped(pool, size, 702, &one, 5000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_range(leader, &d, 1, 1), FERRY_OK);
    uint64_t waited = wait_settled(pool, 6000);
    fprintf(stderr, "test_held_leases: an unanswered hold lapsed after %llu ms\n",
            (unsigned long long)waited);
    assert_true(waited >= 1500);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *src = junk;
    ferry_descriptor other;
    assert_int_equal(ferry_pool_publish(pool, &t, src, 1000 * MS, &other), FERRY_OK);
    assert_int_equal(other.offset, d.offset); /* the same slice, another lease */
    memset(buf, 0, size);
    assert_int_equal(ferry_consumer_read(c, &d, buf, size, 2000 * MS), FERRY_STALE);
    assert_int_equal(ferry_pool_cancel(pool, &other), FERRY_OK);

    free(buf);
    free(junk);
    ferry_consumer_destroy(leader);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
    unsetenv("FERRY_REMOTE_SERVED");
}

/* Small leases travel inline (their bytes in the DESC), larger ones are read with gets: items
 * of sizes around FERRY_REMOTE_INLINE_MAX, mixed, to a consumer in the other namespace, every
 * byte checked there; exactly the small ones went inline. */
static void test_inline_sizes(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    th_helper h = spawn_consumer(1, "receiver", addr, 0, FERRY_OK);
    const size_t T = FERRY_REMOTE_INLINE_MAX;
    const size_t sizes[] = {8,     100, 256,   4095,  4096,      4097,     T - 8,
                            T - 1, T,   T + 1, T + 8, 2 * T + 3, 64 << 10, 1 << 20};
    const size_t k = sizeof(sizes) / sizeof(sizes[0]);
    uint64_t n = 0, small = 0;
    for (size_t round = 0; round < 4; round++) {
        for (size_t i = 0; i < k; i++) {
            size_t size = sizes[(5 * i + 3 * round) % k]; /* each size, in another order */
            small += size <= T;
            if (send_stamped(pool, size, 2000 + n, NULL, 5000 * MS) != FERRY_OK)
                fail_msg("send %zu bytes: %s", size, ferry_last_error());
            n++;
        }
    }
    send_end(pool, NULL); /* 64 bytes: inline too */
    th_assert_result(th_finish_helper(&h, 30000), n);
    ferry__remote_counts rc = remote_counts(pool);
    fprintf(stderr, "test_remote: %llu items of 8 B-1 MiB, %llu inline, all bytes right\n",
            (unsigned long long)n, (unsigned long long)rc.inlined);
    assert_int_equal(rc.forwarded, n + 1);
    assert_int_equal(rc.inlined, small + 1);
    assert_int_equal(rc.inline_stale, 0);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* A read of a lease that came inline is a copy here, without a get: it completes while the
 * producer's server thread (which serves every get over tcp) is held; a later lease, held
 * until then, comes right too. */
static void test_inline_read_without_gets(void **state)
{
    (void)state;
    th_hold_install();
    ferry_pool *pool = make_pool(1, 4 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL; /* this process, so that it can read while the server is held */
    assert_int_equal(ferry_consumer_connect(addr, 0, -1, &c), FERRY_OK);
    ferry_descriptor a, b;
    size_t k;
    assert_int_equal(send_stamped(pool, 4096, 3000, NULL, 5000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &a, 1, &k), FERRY_OK);
    th_hold_arm();
    assert_int_equal(send_stamped(pool, 4096, 3001, NULL, 5000 * MS), FERRY_OK);
    th_hold_wait();
    /* The server's thread is held: a get would wait for it (until released below, 5 s on). */
    pthread_t watchdog;
    int rescued = 0;
    assert_int_equal(pthread_create(&watchdog, NULL, hold_release_later, &rescued), 0);
    uint8_t buf[4096];
    ferry_status st = ferry_consumer_read(c, &a, buf, sizeof(buf), 1000 * MS);
    int released = __atomic_exchange_n(&rescued, -1, __ATOMIC_ACQ_REL); /* 0: still held */
    pthread_join(watchdog, NULL);
    if (!released)
        th_hold_release();
    assert_int_equal(st, FERRY_OK);
    assert_true(th_check_stamp(buf, sizeof(buf), 3000, NULL));
    if (released)
        fail_msg("the read of an inline lease waited for the producer's server thread");
    assert_int_equal(ferry_consumer_ack(c, &a), FERRY_OK);
    assert_int_equal(ferry_consumer_read(c, &a, buf, sizeof(buf), 0), FERRY_STALE); /* acked */
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &b, 1, &k), FERRY_OK);
    assert_int_equal(ferry_consumer_read(c, &b, buf, sizeof(buf), 1000 * MS), FERRY_OK);
    assert_true(th_check_stamp(buf, sizeof(buf), 3001, NULL));
    assert_int_equal(ferry_consumer_ack(c, &b), FERRY_OK);
    assert_int_equal(remote_counts(pool).inlined, 2);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
    th_hold_remove();
}

/* Reads one lease of rank 1 by its descriptor into buf (zeroed first) and checks its stamp. */
static void read_stamped(ferry_consumer *c, const ferry_descriptor *d, uint8_t *buf, uint64_t seed)
{
    memset(buf, 0, d->length);
    ferry_status st = ferry_consumer_read(c, d, buf, d->length, 1000 * MS);
    if (st != FERRY_OK)
        fail_msg("read of %llu bytes: %s", (unsigned long long)d->length, ferry_last_error());
    if (!th_check_stamp(buf, d->length, seed, NULL))
        fail_msg("read of %llu bytes: not the lease's bytes", (unsigned long long)d->length);
}

/* The process's ucp_am_send_nbx, and what the recorder below saw of the active messages sent
 * through the table: how many, and how many did not name their bytes host memory or were not
 * eager. */
static ucs_status_ptr_t (*real_am_send)(ucp_ep_h, unsigned, const void *, size_t, const void *,
                                        size_t, const ucp_request_param_t *);
static unsigned am_sent, am_unnamed;

static ucs_status_ptr_t recording_am_send(ucp_ep_h ep, unsigned id, const void *header,
                                          size_t header_len, const void *payload, size_t n,
                                          const ucp_request_param_t *p)
{
    __atomic_fetch_add(&am_sent, 1, __ATOMIC_RELAXED);
    if (!(p->op_attr_mask & UCP_OP_ATTR_FIELD_MEMORY_TYPE) ||
        p->memory_type != UCS_MEMORY_TYPE_HOST || !(p->op_attr_mask & UCP_OP_ATTR_FIELD_FLAGS) ||
        !(p->flags & UCP_AM_SEND_FLAG_EAGER))
        __atomic_fetch_add(&am_unnamed, 1, __ATOMIC_RELAXED);
    return real_am_send(ep, id, header, header_len, payload, n, p);
}

/* Every active message of both ends (descriptors, served reads' requests and answers,
 * acknowledgements, the consumer's INFO, REVOKE and RELEASED) is sent eagerly with its bytes
 * named host memory: a UCX built with CUDA sends only such a message inline, and looks up the
 * memory of any other up and sends it through its general protocol. Seen through UCX's own
 * table, swapped while no pool uses it. */
static void test_am_sends_name_host_memory(void **state)
{
    (void)state;
    const ferry__ucx *ucx;
    assert_int_equal(ferry__ucx_get(&ucx), FERRY_OK);
    ferry__ucx *table = (ferry__ucx *)ucx; /* the process's table is writable storage */
    real_am_send = table->ucp_am_send_nbx;
    table->ucp_am_send_nbx = recording_am_send;
    am_sent = am_unnamed = 0;

    ferry_pool *pool = make_pool(2, 8 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    ferry_ranks one = {NULL, 1, 1};
    const size_t sizes[] = {4096, FERRY_REMOTE_INLINE_MAX + 1, 3 * FERRY_REMOTE_READ_PIECE};
    uint8_t *buf = malloc(sizes[2]);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        ferry_descriptor d;
        size_t k;
        assert_int_equal(send_stamped(pool, sizes[i], 7000 + i, &one, 5000 * MS), FERRY_OK);
        assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
        read_stamped(c, &d, buf, 7000 + i);
        assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
    }
    free(buf);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);

    table->ucp_am_send_nbx = real_am_send;
    /* 3 DESC, 3 ACK, the INFO, the served reads' requests and answers at least */
    assert_true(__atomic_load_n(&am_sent, __ATOMIC_RELAXED) >= 7);
    assert_int_equal(__atomic_load_n(&am_unnamed, __ATOMIC_RELAXED), 0);
}

/* ACKS sends fail at once (not the producer gone: no memory) while acks_failing is set;
 * counted in acks_tried. */
static int acks_failing;
static unsigned acks_tried;

static ucs_status_ptr_t failing_acks_send(ucp_ep_h ep, unsigned id, const void *header,
                                          size_t header_len, const void *payload, size_t n,
                                          const ucp_request_param_t *p)
{
    ferry__am m;
    if (__atomic_load_n(&acks_failing, __ATOMIC_ACQUIRE) &&
        ferry__am_decode(header, header_len, n, &m) == FERRY_OK && m.type == FERRY_AM_ACKS) {
        __atomic_fetch_add(&acks_tried, 1, __ATOMIC_RELAXED);
        return (ucs_status_ptr_t)(intptr_t)UCS_ERR_NO_MEMORY;
    }
    return real_am_send(ep, id, header, header_len, payload, n, p);
}

/* Clears acks_failing a second from now (a client that held its lock through the failures
 * would otherwise keep the test waiting for ever). */
static void *acks_mend_later(void *arg)
{
    (void)arg;
    usleep(1000000);
    __atomic_store_n(&acks_failing, 0, __ATOMIC_RELEASE);
    return NULL;
}

/* Acknowledgements whose send fails while the producer is there are kept and sent once it
 * works again (a second later): the call that made them answers OK, and the client's
 * acknowledgement thread tries again a delay later (10 ms here), letting go of the client
 * between tries: a look for a lease meanwhile answers at once, and the thread tries ~30 times
 * in 300 ms, not millions; a wait for a lease tries no more often. */
static void test_failed_acks_are_kept(void **state)
{
    (void)state;
    const ferry__ucx *ucx;
    assert_int_equal(ferry__ucx_get(&ucx), FERRY_OK);
    ferry__ucx *table = (ferry__ucx *)ucx;
    real_am_send = table->ucp_am_send_nbx;
    table->ucp_am_send_nbx = failing_acks_send;
    ferry_pool *pool = make_pool(1, 8 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    setenv("FERRY_REMOTE_ACK_DELAY_US", "10000", 1);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 0, -1, &c), FERRY_OK);
    unsetenv("FERRY_REMOTE_ACK_DELAY_US");
    static uint8_t buf[4096];
    ferry_descriptor d;
    size_t k;
    assert_int_equal(send_stamped(pool, 4096, 5, NULL, 5000 * MS), FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
    read_stamped(c, &d, buf, 5);
    __atomic_store_n(&acks_tried, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&acks_failing, 1, __ATOMIC_RELEASE);
    pthread_t mend;
    assert_int_equal(pthread_create(&mend, NULL, acks_mend_later, NULL), 0);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(c, &d), FERRY_STALE); /* recorded here */
    uint64_t t0 = ferry_now_ns();
    while (__atomic_load_n(&acks_tried, __ATOMIC_RELAXED) < 3 && ms_since(t0) < 3000)
        usleep(1000);
    assert_true(__atomic_load_n(&acks_tried, __ATOMIC_RELAXED) >= 3);
    usleep(300000);
    t0 = ferry_now_ns();
    assert_int_equal(ferry_consumer_recv(c, 0, &d, 1, &k), FERRY_TIMEOUT);
    uint64_t look = ms_since(t0);
    unsigned tried = __atomic_load_n(&acks_tried, __ATOMIC_RELAXED);
    fprintf(stderr, "test_remote: %u tries of a failing send; a look took %llu ms\n", tried,
            (unsigned long long)look);
    assert_true(look < 100);
    assert_true(tried < 200);
    /* A wait for a lease that finds none tries again when a delay has passed, not on each
     * turn of its spin or each wake of its sleep. */
    assert_int_equal(ferry_consumer_recv(c, 150 * MS, &d, 1, &k), FERRY_TIMEOUT);
    unsigned waited = __atomic_load_n(&acks_tried, __ATOMIC_RELAXED) - tried;
    fprintf(stderr, "test_remote: %u tries during a 150 ms wait for a lease\n", waited);
    assert_true(waited <= 22); /* one a delay (10 ms): ~15 */
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    pthread_join(mend, NULL);
    wait_settled(pool, 3000); /* sent by the next try */
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
    table->ucp_am_send_nbx = real_am_send;
}

/* A host pool's consumer whose gets UCX would emulate (tcp) has its reads served by the
 * producer's thread, in pieces of FERRY_REMOTE_READ_PIECE: leases from one byte past the inline
 * bound to several pieces, and a packed lease's parts (each a range of its extent), arrive
 * byte for byte, each piece asked for once; nothing is dropped as malformed. */
static void test_served_reads(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 32 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    for (int i = 0; i < 300 && th_stats(pool).remote_emulated != 1; i++)
        usleep(10000); /* the consumer's INFO is on its way */
    assert_int_equal(th_stats(pool).remote_emulated, 1);
    const size_t piece = FERRY_REMOTE_READ_PIECE;
    const size_t sizes[] = {FERRY_REMOTE_INLINE_MAX + 1, piece, piece + 1, 5 * piece + 7};
    uint8_t *buf = malloc(6 * piece);
    ferry_ranks one = {NULL, 1, 1};
    uint64_t served0 = remote_counts(pool).served, pieces = 0;
    ferry_descriptor d[3];
    size_t k;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        assert_int_equal(send_stamped(pool, sizes[i], 6000 + i, &one, 5000 * MS), FERRY_OK);
        assert_int_equal(ferry_consumer_recv(c, 5000 * MS, d, 1, &k), FERRY_OK);
        read_stamped(c, &d[0], buf, 6000 + i);
        assert_int_equal(ferry_consumer_ack(c, &d[0]), FERRY_OK);
        pieces += (sizes[i] + piece - 1) / piece;
    }
    /* three parts of one lease: 100000 bytes, a piece and 5, and 3 */
    static const size_t part[3] = {100000, (1u << 20) + 5, 3};
    uint8_t *src[3];
    ferry_tensor t[3];
    for (int i = 0; i < 3; i++) {
        src[i] = malloc(part[i]);
        th_stamp(src[i], part[i], 6100 + (uint64_t)i);
        t[i] = ferry_tensor_bytes(part[i]);
    }
    assert_int_equal(
        ferry_pool_send(pool, t, (const void *const *)src, 3, &one, NULL, 5000 * MS, NULL),
        FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, d, 3, &k), FERRY_OK);
    assert_int_equal(k, 3);
    for (int i = 0; i < 3; i++) {
        read_stamped(c, &d[i], buf, 6100 + (uint64_t)i);
        pieces += (part[i] + piece - 1) / piece;
        free(src[i]);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(ferry_consumer_ack(c, &d[i]), FERRY_OK);
    ferry__remote_counts rc = remote_counts(pool);
    assert_int_equal(rc.served - served0, pieces);
    assert_int_equal(rc.served_stale, 0);
    assert_int_equal(rc.bad_messages, 0);
    free(buf);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* A consumer whose reads are served (UCX would emulate its gets: tcp) reads into GPU memory
 * too: each answer is copied to the device on a stream of the client's own, so such reads
 * need no CUDA-aware UCX and never run UCX's emulated get (which aborts the producer when the
 * consumer's connection breaks under it: docs/design.md). A host pool; the consumer reads
 * even items into GPU memory (the real driver where there is a GPU, else the fake one) and
 * odd ones into host memory, every byte checked; every piece was served. */
static void test_served_reads_into_gpu_memory(void **state)
{
    (void)state;
    void *probe = NULL;
    int real = ferry_gpu_alloc(0, 256, &probe) == FERRY_OK;
    if (real)
        ferry_gpu_free(0, probe);
    ferry_pool *pool = make_pool(1, 32 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    if (!real) {
        setenv("FERRY_CUDA_DRIVER", FERRY_FAKE_CUDA_PATH, 1);
        setenv("FERRY_FAKE_CUDA_DEVICES", "1", 1);
    }
    th_helper h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
    unsetenv("FERRY_CUDA_DRIVER");
    unsetenv("FERRY_FAKE_CUDA_DEVICES");
    for (int i = 0; i < 300 && th_stats(pool).remote_emulated != 1; i++)
        usleep(10000); /* the consumer's INFO is on its way */
    assert_int_equal(th_stats(pool).remote_emulated, 1);
    const size_t piece = FERRY_REMOTE_READ_PIECE;
    const size_t sizes[] = {4096, 4096, 3 * piece + 5, 3 * piece + 5, piece, 64 << 10};
    uint64_t pieces = 0;
    for (uint64_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        assert_int_equal(send_stamped(pool, sizes[i], 9100 + i, NULL, 10000 * MS), FERRY_OK);
        if (i % 2 == 0 || sizes[i] > FERRY_REMOTE_INLINE_MAX) /* odd small ones came inline */
            pieces += (sizes[i] + piece - 1) / piece;
    }
    send_end(pool, NULL);
    th_assert_result(th_finish_helper(&h, 60000), sizeof(sizes) / sizeof(sizes[0]));
    ferry__remote_counts rc = remote_counts(pool);
    assert_true(rc.served >= pieces);
    assert_int_equal(rc.served_stale, 0);
    assert_int_equal(rc.bad_messages, 0);
    fprintf(stderr, "test_remote: served reads into %s GPU memory, %llu pieces\n",
            real ? "real" : "fake", (unsigned long long)rc.served);
    wait_settled(pool, 5000);
    if (!real) { /* a copy into the destination that fails ends the read with the driver's error */
        setenv("FERRY_CUDA_DRIVER", FERRY_FAKE_CUDA_PATH, 1);
        setenv("FERRY_FAKE_CUDA_FAIL", "cuMemcpyAsync:1:700", 1);
        h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
        unsetenv("FERRY_CUDA_DRIVER");
        unsetenv("FERRY_FAKE_CUDA_FAIL");
        assert_int_equal(send_stamped(pool, 64 << 10, 9200, NULL, 10000 * MS), FERRY_OK);
        th_msg m = th_finish_helper(&h, 20000);
        assert_int_equal(m.status, FERRY_DRIVER);
        assert_int_equal(m.seed, 0);
        if (!strstr(m.text, "into GPU memory: cuMemcpyAsync failed: CUDA_ERROR_ILLEGAL_ADDRESS"))
            fail_msg("unexpected message: %s", m.text);
        wait_settled(pool, 5000); /* its lease is acknowledged for it as it leaves */
    }
    ferry_pool_destroy(pool);
}

/* Served reads of leases this consumer has no DESC of yet look at the lease first (a request
 * of no bytes, answered with its extent): one committed reads byte for byte; one reserved and
 * not committed ends TIMEOUT at the read's timeout, and reads once committed; one
 * acknowledged on the rank's behalf ends STALE with the producer's reason. */
static void test_served_looks(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 8 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL, *leader = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_create(0, &leader), FERRY_OK); /* acks on rank 1's behalf */
    const size_t size = 300000;
    uint8_t *src = malloc(size), *buf = malloc(size);
    th_stamp(src, size, 6200);
    ferry_tensor t = ferry_tensor_bytes(size);
    ferry_descriptor sent, got;
    size_t k;
    ferry_ranks one = {NULL, 1, 1};
    const void *srcs[1] = {src};
    uint64_t served0 = remote_counts(pool).served;
    assert_int_equal(ferry_pool_send(pool, &t, srcs, 1, &one, NULL, 5000 * MS, &sent), FERRY_OK);
    read_stamped(c, &sent, buf, 6200); /* by the producer's descriptor, before any recv */
    /* a look, then the pieces */
    assert_int_equal(remote_counts(pool).served - served0,
                     1 + (size + FERRY_REMOTE_READ_PIECE - 1) / FERRY_REMOTE_READ_PIECE);
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &got, 1, &k), FERRY_OK);
    assert_int_equal(got.generation, sent.generation);
    assert_int_equal(ferry_consumer_ack(c, &got), FERRY_OK);
    /* reserved, not committed: not ready until the read's timeout */
    void *data;
    ferry_descriptor r;
    assert_int_equal(ferry_pool_reserve(pool, &t, 5000 * MS, &data, &r), FERRY_OK);
    th_stamp(data, size, 6201);
    uint64_t t0 = ferry_now_ns();
    assert_int_equal(ferry_consumer_read(c, &r, buf, size, 50 * MS), FERRY_TIMEOUT);
    assert_true(ms_since(t0) >= 50);
    assert_non_null(strstr(ferry_last_error(), "not ready after 50.000 ms"));
    assert_int_equal(ferry_pool_commit(pool, &r), FERRY_OK);
    read_stamped(c, &r, buf, 6201);
    /* acknowledged for both ranks by the leader: the producer says so (this process knows
     * the lease as ready from its look, and acknowledged nothing itself) */
    assert_int_equal(ferry_consumer_ack_range(leader, &r, 0, 2), FERRY_OK);
    uint64_t served1 = remote_counts(pool).served;
    assert_int_equal(ferry_consumer_read(c, &r, buf, size, 1000 * MS), FERRY_STALE);
    assert_non_null(strstr(ferry_last_error(), "stale descriptor"));
    assert_true(remote_counts(pool).served > served1); /* the producer's answer */
    assert_int_equal(remote_counts(pool).bad_messages, 0);
    free(src);
    free(buf);
    ferry_consumer_destroy(leader);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
}

/* A served read whose lease is recycled after the producer checked it and before it copied the
 * bytes (acknowledged on the rank's behalf, reclaimed, the slice leased again with other
 * bytes): the copy is dropped (the slot's generation moved on) and the read ends STALE, never
 * with the other lease's bytes. */
static void test_served_read_recycled_before_copy(void **state)
{
    (void)state;
    th_hold_install();
    ferry_pool *pool = make_pool(2, 4 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL, *leader = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_create(0, &leader), FERRY_OK);
    const size_t size = 64 << 10; /* not inline: read with a request */
    uint8_t *src = malloc(size);
    th_stamp(src, size, 6300);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *srcs[1] = {src};
    ferry_ranks one = {NULL, 1, 1};
    ferry_descriptor sent, other;
    size_t k;
    assert_int_equal(ferry_pool_send(pool, &t, srcs, 1, &one, NULL, 5000 * MS, &sent), FERRY_OK);
    th_reader rd = {.c = c, .buf = calloc(1, size), .n = size};
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &rd.d, 1, &k), FERRY_OK);
    th_hold_arm();
    pthread_t reader;
    assert_int_equal(pthread_create(&reader, NULL, th_read_main, &rd), 0);
    th_hold_wait(); /* the request checked: current and ready; not copied yet */
    assert_int_equal(ferry_consumer_ack_range(leader, &sent, 1, 1), FERRY_OK);
    wait_settled(pool, 2000);
    th_stamp(src, size, 6301);
    assert_int_equal(ferry_pool_publish(pool, &t, src, 1000 * MS, &other), FERRY_OK);
    assert_true(other.offset == sent.offset); /* the same bytes of the pool, other ones now */
    th_hold_release();
    pthread_join(reader, NULL);
    if (rd.st == FERRY_OK && th_check_stamp(rd.buf, size, 6301, NULL))
        fail_msg("a recycled lease read with the next lease's bytes");
    assert_int_equal(rd.st, FERRY_STALE);
    assert_int_equal(remote_counts(pool).served_stale, 1);
    assert_int_equal(ferry_pool_cancel(pool, &other), FERRY_OK);
    free(rd.buf);
    free(src);
    ferry_consumer_destroy(leader);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
    th_hold_remove();
}

/* A small lease whose slot is recycled after the server checked it and before it copied its
 * bytes (acknowledged on the rank's behalf, reclaimed, the slice leased again with other
 * bytes): the copy is dropped (the generation moved on), the DESC goes without bytes, and the
 * read ends STALE, never with the other lease's bytes. */
static void test_inline_recycled_before_copy(void **state)
{
    (void)state;
    th_hold_install();
    ferry_pool *pool = make_pool(2, 4 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL, *leader = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    assert_int_equal(ferry_consumer_create(0, &leader), FERRY_OK); /* acks on rank 1's behalf */
    const size_t size = 4096;
    uint8_t src[4096], buf[4096];
    th_stamp(src, size, 4000);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *srcs[1] = {src};
    ferry_ranks one = {NULL, 1, 1};
    ferry_descriptor sent, other, d;
    th_hold_arm();
    assert_int_equal(ferry_pool_send(pool, &t, srcs, 1, &one, NULL, 5000 * MS, &sent), FERRY_OK);
    th_hold_wait(); /* checked: current and ready; not copied yet */
    assert_int_equal(ferry_consumer_ack_range(leader, &sent, 1, 1), FERRY_OK);
    wait_settled(pool, 2000);
    th_stamp(src, size, 4001);
    assert_int_equal(ferry_pool_publish(pool, &t, src, 1000 * MS, &other), FERRY_OK);
    assert_true(other.offset == sent.offset); /* the same bytes of the pool, other ones now */
    th_hold_release();
    size_t k;
    assert_int_equal(ferry_consumer_recv(c, 5000 * MS, &d, 1, &k), FERRY_OK);
    assert_int_equal(d.slot, sent.slot);
    assert_int_equal(d.generation, sent.generation);
    memset(buf, 0, sizeof(buf));
    ferry_status st = ferry_consumer_read(c, &d, buf, sizeof(buf), 1000 * MS);
    if (st == FERRY_OK && th_check_stamp(buf, size, 4001, NULL))
        fail_msg("a recycled lease read with the next lease's bytes");
    assert_int_equal(st, FERRY_STALE);
    ferry__remote_counts rc = remote_counts(pool);
    assert_int_equal(rc.inline_stale, 1);
    assert_int_equal(rc.inlined, 0);
    assert_int_equal(ferry_pool_cancel(pool, &other), FERRY_OK);
    ferry_consumer_destroy(leader);
    ferry_consumer_destroy(c);
    wait_settled(pool, 5000);
    ferry_pool_destroy(pool);
    th_hold_remove();
}

/* The consumer calls on a remote pool: the poll fd wakes for a lease, a view is refused with
 * the reason, a stream-ordered read completes in its call and acknowledges, wait and
 * ack_range/ack_all work; a packed lease's parts arrive together. */
static void test_remote_calls(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(2, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    ferry_consumer *c = NULL;
    assert_int_equal(ferry_consumer_connect(addr, 1, -1, &c), FERRY_OK);
    int fd = -1;
    assert_int_equal(ferry_consumer_fd(c, &fd), FERRY_OK);
    ferry_descriptor d[4];
    size_t k = 0;
    assert_int_equal(ferry_consumer_recv(c, 0, d, 4, &k), FERRY_TIMEOUT);
    ferry_ranks one = {NULL, 1, 1};
    assert_int_equal(send_stamped(pool, 4096, 700, &one, 5000 * MS), FERRY_OK);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1); /* the poll fd woke for it */
    assert_int_equal(ferry_consumer_recv(c, 1000 * MS, d, 4, &k), FERRY_OK);
    assert_int_equal(k, 1);
    const void *view = NULL;
    assert_int_equal(ferry_consumer_view(c, &d[0], &view, 0), FERRY_NOT_SUPPORTED);
    assert_non_null(strstr(ferry_last_error(), "another host"));
    assert_int_equal(ferry_consumer_wait(c, &d[0], 1000 * MS), FERRY_OK);
    uint8_t buf[4096];
    assert_int_equal(ferry_consumer_read_async(c, &d[0], buf, sizeof(buf), NULL), FERRY_OK);
    assert_true(th_check_stamp(buf, sizeof(buf), 700, NULL));
    assert_int_equal(ferry_consumer_ack(c, &d[0]), FERRY_STALE); /* read_async acknowledged */
    wait_settled(pool, 5000);
    /* a packed lease: its parts together; acknowledged for ranks 0 and 1 by ack_all */
    uint8_t a[1000], b[3000];
    th_stamp(a, sizeof(a), 701);
    th_stamp(b, sizeof(b), 702);
    ferry_tensor t[2] = {ferry_tensor_bytes(sizeof(a)), ferry_tensor_bytes(sizeof(b))};
    const void *srcs[2] = {a, b};
    assert_int_equal(ferry_pool_send(pool, t, srcs, 2, NULL, NULL, 5000 * MS, NULL), FERRY_OK);
    assert_int_equal(ferry_consumer_recv(c, 2000 * MS, d, 1, &k), FERRY_INVALID_ARGUMENT);
    assert_int_equal(k, 2); /* too many parts for one: it stays queued */
    assert_int_equal(ferry_consumer_recv(c, 0, d, 4, &k), FERRY_OK);
    assert_int_equal(k, 2);
    uint8_t out[3000];
    assert_int_equal(ferry_consumer_read(c, &d[1], out, sizeof(out), 0), FERRY_OK);
    assert_true(th_check_stamp(out, sizeof(b), 702, NULL));
    assert_int_equal(ferry_consumer_ack_all(c, &d[1]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_all(c, &d[1]), FERRY_STALE); /* that part: done */
    /* part 0 is still out; the first lease goes once its acknowledgement (an active message,
     * on its way) is in and the reclaimer has looked */
    uint64_t t0 = ferry_now_ns(), reclaimed;
    while (th_stats(pool).leases_in_flight > 1 && ms_since(t0) < 3000)
        assert_int_equal(ferry_pool_reclaim(pool, &reclaimed), FERRY_OK);
    assert_int_equal(th_stats(pool).leases_in_flight, 1);
    assert_int_equal(ferry_consumer_ack_all(c, &d[0]), FERRY_OK);
    wait_settled(pool, 5000); /* the last part released the lease for both ranks */
    ferry_consumer_destroy(c);
    ferry_pool_destroy(pool);
}

/* 1000 connect/close cycles: the consumer's fds, threads and memory stay flat, and so do the
 * producer's fds and threads. */
static void test_connect_close_cycles(void **state)
{
    (void)state;
    ferry_pool *pool = make_pool(1, 16 << 20, 5000000);
    char addr[FERRY_REMOTE_ADDRESS_SIZE], n[32];
    remote_address_of(pool, addr);
    uint64_t cycles = th_scaled(1000, 50);
    snprintf(n, sizeof(n), "%llu", (unsigned long long)cycles);
    th_helper h = spawn_in(1, "cycles", addr, n);
    th_msg m;
    assert_int_equal(th_recv_msg(h.fd, &m, 60000), 0); /* ten cycles done */
    assert_int_equal(m.type, TH_MSG_ITEM);
    uint64_t t0 = ferry_now_ns();
    while (th_stats(pool).remote_connected && ms_since(t0) < 5000)
        usleep(10000);
    int fds0 = th_count_fds();
    long threads0 = th_status_field("Threads:");
    th_send_type(h.fd, TH_MSG_ITEM);
    m = th_finish_helper(&h, 600000);
    fprintf(stderr, "test_remote: %s\n", m.text);
    if (m.status != FERRY_OK)
        fail_msg("%llu cycles: %s: %s", (unsigned long long)m.seed,
                 ferry_status_name((ferry_status)m.status), m.text);
    /* the producer let every connection go */
    t0 = ferry_now_ns();
    while (th_stats(pool).remote_connected && ms_since(t0) < 5000)
        usleep(10000);
    assert_int_equal(th_stats(pool).remote_connected, 0);
    assert_int_equal(th_stats(pool).remote_admitted, cycles);
    /* UCX closes a departed peer's transport socket when it next progresses: one or two may
     * come and go; a leak would grow with the cycles. */
    int fds = th_count_fds();
    fprintf(stderr, "test_remote: the producer's fds %d -> %d over %llu cycles\n", fds0, fds,
            (unsigned long long)cycles);
    assert_true(fds <= fds0 + 2);
    assert_true(th_threads_settled(threads0) <= threads0);
    ferry_pool_destroy(pool);
}

/* A cuda_ipc pool on GPU 0 of memory bytes serving remote consumers, with a device buffer
 * src of src_size for the items' bytes, and UCX_TLS as pip's libucx-cu13 has it; NULL (the
 * test skips, UCX_TLS put back) without a GPU or a UCX with CUDA support. r: that UCX. */
static ferry_pool *gpu_pool_or_skip(int64_t memory, size_t src_size, void **src,
                                    ferry__ucx_report *r)
{
    if (ferry_gpu_alloc(0, src_size, src) != FERRY_OK) {
        fprintf(stderr, "test_remote: no GPU: %s\n", ferry_last_error());
        return NULL;
    }
    setenv("UCX_TLS", "tcp,cuda_copy", 1); /* as pip's libucx-cu13 has them */
    ferry__ucx_report_get(r);              /* with the transports the pool's UCX will have */
    /* Over tcp every read is served, which needs no CUDA in UCX: the fake driver's "device
     * memory" (host memory) registers as UCX's CUDA memory type all the same, so CI runs
     * these with it (test_remote_gpu_fake). A real GPU's memory needs a UCX with CUDA. */
    if (!r->cuda && !getenv("FERRY_FAKE_CUDA_DEVICES")) {
        fprintf(stderr, "test_remote: this UCX (%s) has no CUDA support\n", r->path);
        ferry_gpu_free(0, *src);
        setenv("UCX_TLS", "tcp", 1);
        return NULL;
    }
    if (!r->cuda)
        setenv("UCX_TLS", "tcp", 1); /* (this UCX has no cuda_copy to name) */
    char listen[64];
    snprintf(listen, sizeof(listen), "%s:0", net.ip[0]);
    ferry_pool_config cfg = FERRY_POOL_CONFIG_INIT;
    cfg.backend = FERRY_BACKEND_CUDA_IPC;
    cfg.device = 0;
    cfg.memory_size = memory;
    cfg.consumer_count = 1;
    cfg.listen = listen;
    ferry_pool *pool = NULL;
    if (ferry_pool_create(&cfg, &pool) != FERRY_OK)
        fail_msg("GPU pool: %s", ferry_last_error());
    return pool;
}

/* Sends size bytes stamped with seed from the GPU buffer src (staged in host); with drain,
 * waits until they are acknowledged (src may be written again). */
static void send_gpu_stamped(ferry_pool *pool, void *src, uint8_t *host, size_t size, uint64_t seed,
                             int drain)
{
    th_stamp(host, size, seed);
    assert_int_equal(ferry_gpu_copy_async(0, src, host, size, NULL), FERRY_OK);
    assert_int_equal(ferry_gpu_stream_synchronize(0, NULL), FERRY_OK);
    ferry_tensor t = ferry_tensor_bytes(size);
    const void *s0 = src;
    if (ferry_pool_send(pool, &t, &s0, 1, NULL, NULL, 20000 * MS, NULL) != FERRY_OK)
        fail_msg("send: %s", ferry_last_error());
    if (drain)
        assert_int_equal(ferry_pool_drain(pool, 20000 * MS), FERRY_OK);
}

/* A GPU pool read by a consumer process into GPU memory and into host memory, through UCX's
 * CUDA-aware transports, every byte checked (the GPU machine: scripts/gpu-check carries pip's
 * libucx-cu13; skipped without a GPU or without a UCX that reaches CUDA memory). */
static void test_gpu_pool(void **state)
{
    (void)state;
    void *src = NULL;
    ferry__ucx_report r;
    ferry_pool *pool = gpu_pool_or_skip(256 << 20, 64u << 20, &src, &r);
    if (!pool)
        skip();
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    th_helper h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
    uint8_t *host = malloc(64u << 20);
    uint64_t n = 24;
    for (uint64_t i = 0; i <= n; i++) {
        size_t size = i == n ? 64 : (4096u << (i % 15)); /* 4 KiB to 64 MiB, then END */
        send_gpu_stamped(pool, src, host, size, i == n ? END_SEED : 800 + i, 1);
    }
    th_assert_result(th_finish_helper(&h, 60000), n);
    fprintf(stderr,
            "test_remote: GPU pool read remotely, %llu items of 4 KiB-64 MiB into GPU "
            "and host memory, every byte checked (%s)\n",
            (unsigned long long)n, r.cuda ? r.gpu_read : "served: UCX without CUDA, fake driver");
    free(host);
    ferry_gpu_free(0, src);
    ferry_pool_destroy(pool);
    setenv("UCX_TLS", "tcp", 1);
}

/* The fake driver's control functions in this process (NULL members on the real driver). */
typedef struct fake_control {
    void (*inject)(const char *, int, int);
    unsigned long (*calls)(const char *);
    int (*live)(void);
} fake_control;

static fake_control fake_control_of(void)
{
    fake_control f = {0};
    const ferry__cuda *cuda;
    if (!getenv("FERRY_FAKE_CUDA_DEVICES") || ferry__cuda_get(&cuda) != FERRY_OK)
        return f;
    void *fail = dlsym(cuda->library, "ferry_fake_cuda_fail");
    void *calls = dlsym(cuda->library, "ferry_fake_cuda_calls");
    void *live = dlsym(cuda->library, "ferry_fake_cuda_live_allocations");
    if (fail && calls && live) {
        memcpy(&f.inject, &fail, sizeof(fail));
        memcpy(&f.calls, &calls, sizeof(calls));
        memcpy(&f.live, &live, sizeof(live));
    }
    return f;
}

/* A GPU pool's served reads copy each piece out of device memory into pinned answer buffers,
 * pinned at the first read and unpinned with the pool; a pool that cannot pin them (the
 * fake driver's registration failing) answers through pageable memory, byte for byte all the
 * same. A copy out of the pool that fails, started or waited for, ends the consumer's read
 * DRIVER, the producer unharmed (fake driver only: the injected failures). */
static void test_gpu_pool_pinned_answers(void **state)
{
    (void)state;
    unsigned long pool_unpinned = 0; /* round 0's unregistrations: the pool's own */
    for (int round = 0; round < 2; round++) { /* 0: pinning fails; 1: pinned */
        fake_control f = fake_control_of();
        int live = f.live ? f.live() : 0;
        void *src = NULL;
        ferry__ucx_report r;
        ferry_pool *pool = gpu_pool_or_skip(64 << 20, 8u << 20, &src, &r);
        if (!pool)
            skip();
        unsigned long pinned = f.calls ? f.calls("cuMemHostRegister") : 0;
        unsigned long unpinned = f.calls ? f.calls("cuMemHostUnregister") : 0;
        if (f.inject && round == 0)
            f.inject("cuMemHostRegister", 1, 2 /* CUDA_ERROR_OUT_OF_MEMORY */);
        char addr[FERRY_REMOTE_ADDRESS_SIZE];
        remote_address_of(pool, addr);
        th_helper h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
        uint8_t *host = malloc(8u << 20);
        const size_t sizes[] = {4096, (1u << 20) + 3, 5u << 20, 64};
        for (uint64_t i = 0; i < 4; i++)
            send_gpu_stamped(pool, src, host, sizes[i], i == 3 ? END_SEED : 1200 + i, 1);
        th_assert_result(th_finish_helper(&h, 60000), 3);
        if (f.calls) /* tried once, at the first served read */
            assert_int_equal(f.calls("cuMemHostRegister"), pinned + 1);
        if (f.inject && round == 1) {
            /* the copy fails to start, then to end: each read (of 4 pieces) ends DRIVER, and
             * its consumer leaves at once: having taken in the answers still on their way
             * (without, Debian's UCX 1.13 failed an assertion in the producer in 3-7 runs of
             * 12: uct_iface.h:884 comp->count > 0) */
            const char *calls[] = {"cuMemcpyAsync", "cuStreamSynchronize"};
            th_hold_install();
            for (int i = 0; i < 2; i++) {
                h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
                th_hold_arm();
                send_gpu_stamped(pool, src, host, 1u << 20, 1300 + (uint64_t)i, 0);
                th_hold_wait(); /* the server's first copy of it, about to start */
                f.inject(calls[i], 1, 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */);
                th_hold_release();
                th_msg m = th_finish_helper(&h, 20000);
                assert_int_equal(m.status, FERRY_DRIVER);
                f.inject(calls[i], 0, 0);
                wait_settled(pool, 5000); /* its lease is acknowledged for it as it leaves */
            }
            th_hold_remove();
            h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
            send_gpu_stamped(pool, src, host, (2u << 20) + 1, 1310, 1);
            send_gpu_stamped(pool, src, host, 64, END_SEED, 1);
            th_assert_result(th_finish_helper(&h, 20000), 1);
        }
        free(host);
        ferry_gpu_free(0, src);
        ferry_pool_destroy(pool);
        if (f.calls) { /* unpinned only if pinned (once more than the pool's own): nothing
                        * left of either round */
            unpinned = f.calls("cuMemHostUnregister") - unpinned;
            if (round == 1)
                assert_int_equal(unpinned, pool_unpinned + 1);
            pool_unpinned = unpinned;
            assert_int_equal(f.live(), live);
        }
        setenv("UCX_TLS", "tcp", 1);
    }
}

/* A GPU pool read over tcp (UCX would emulate the gets) is served by the producer's thread,
 * which copies each piece out of device memory: consumers killed while their reads are
 * answered leave the producer running (UCX's own emulated get aborted it on a failed answer),
 * their leases reclaimed; the next consumer reads byte for byte, into GPU and host memory
 * (skipped where test_gpu_pool is). */
static void test_gpu_pool_killed_while_served(void **state)
{
    (void)state;
    void *src = NULL;
    ferry__ucx_report r;
    ferry_pool *pool = gpu_pool_or_skip(64 << 20, 16u << 20, &src, &r);
    if (!pool)
        skip();
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    uint8_t *host = malloc(4u << 20);
    for (int round = 0; round < 3; round++) {
        th_helper h = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
        /* connected first: a real GPU's consumer takes a while to start (CUDA's set-up) */
        for (int i = 0; i < 2000 && !th_stats(pool).remote_connected; i++)
            usleep(10000);
        assert_int_equal(th_stats(pool).remote_connected, 1);
        uint64_t served = remote_counts(pool).served;
        for (uint64_t i = 0; i < 4; i++) /* each from a place of its own: not drained */
            send_gpu_stamped(pool, (uint8_t *)src + (i << 22), host, 4u << 20, 1000 + i, 0);
        /* killed once its reads are under way, a little later each round */
        for (int i = 0; i < 20000 && remote_counts(pool).served == served; i++)
            usleep(100);
        assert_true(remote_counts(pool).served > served);
        struct timespec ts = {0, round * 1000 * 1000};
        nanosleep(&ts, NULL);
        kill(h.pid, SIGKILL);
        th_reap_helper(&h);
        wait_settled(pool, 5000);
        for (int i = 0; i < 300 && th_stats(pool).remote_connected; i++)
            usleep(10000);
        assert_int_equal(th_stats(pool).remote_connected, 0);
    }
    ferry__remote_counts rc = remote_counts(pool);
    fprintf(stderr, "test_remote: 3 GPU pool consumers killed while reading: %llu pieces served\n",
            (unsigned long long)rc.served);
    assert_true(rc.served > 0); /* the producer's to answer, not UCX's */
    th_helper again = spawn_consumer(1, "gpu-receiver", addr, 0, FERRY_OK);
    send_gpu_stamped(pool, src, host, 4u << 20, 1100, 1);
    send_gpu_stamped(pool, src, host, (1u << 20) + 3, 1101, 1);
    send_gpu_stamped(pool, src, host, 64, END_SEED, 1);
    th_assert_result(th_finish_helper(&again, 20000), 2);
    free(host);
    ferry_gpu_free(0, src);
    ferry_pool_destroy(pool);
    setenv("UCX_TLS", "tcp", 1);
}

/* A consumer by remote address on the GPU pool's host that cannot open it here as asked (made
 * for no device: a local consumer of a GPU pool needs one) falls back to UCX and reads into
 * host memory there, every byte checked (the GPU machine; skipped as test_gpu_pool is). */
static void test_gpu_pool_host_reader_falls_back(void **state)
{
    (void)state;
    void *src = NULL;
    ferry__ucx_report r;
    ferry_pool *pool = gpu_pool_or_skip(16 << 20, 1u << 20, &src, &r);
    if (!pool)
        skip();
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    remote_address_of(pool, addr);
    setenv("FERRY_REMOTE_LOCAL", "1", 1);
    th_helper h = spawn_consumer(0, "receiver", addr, 0, FERRY_OK);
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    uint8_t *host = malloc(1u << 20);
    for (uint64_t i = 0; i <= 3; i++) {
        size_t size = i == 3 ? 64 : (4096u << (4 * i)); /* 4 KiB, 64 KiB, 1 MiB, then END */
        send_gpu_stamped(pool, src, host, size, i == 3 ? END_SEED : 900 + i, 1);
    }
    th_assert_result(th_finish_helper(&h, 60000), 3);
    assert_int_equal(th_stats(pool).remote_admitted, 1);
    free(host);
    ferry_gpu_free(0, src);
    ferry_pool_destroy(pool);
    setenv("UCX_TLS", "tcp", 1);
}

/* The remote address and its API: a pool without cfg.listen has none; bad listen addresses
 * and keepalive bounds are refused; an address that is not exactly the printed form is. */
static void test_addresses_and_config(void **state)
{
    (void)state;
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 1 << 20;
    ferry_pool *pool = NULL;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_OK);
    char addr[FERRY_REMOTE_ADDRESS_SIZE];
    assert_int_equal(ferry_pool_remote_address(pool, addr, sizeof(addr)), FERRY_INVALID_ARGUMENT);
    ferry_pool_destroy(pool);
    c.listen = "nonsense";
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_INVALID_ARGUMENT);
    c.listen = "127.0.0.1:0";
    c.remote_timeout_us = 100000;
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "remote_timeout_us"));
    pool = make_pool(1, 1 << 20, 5000000);
    remote_address_of(pool, addr);
    char small[16];
    assert_int_equal(ferry_pool_remote_address(pool, small, sizeof(small)), FERRY_INVALID_ARGUMENT);
    ferry_consumer *cons = NULL;
    char longer[FERRY_REMOTE_ADDRESS_SIZE + 8];
    snprintf(longer, sizeof(longer), "%sx", addr);
    assert_int_equal(ferry_consumer_connect(longer, 0, -1, &cons), FERRY_INVALID_ARGUMENT);
    ferry_pool_destroy(pool);
}

/* ferry_ucx_symbol hands out the entry points of the UCX ferry loaded (libucs's too, which
 * come with libucp), refuses names UCX does not have, and says why where there is no UCX. */
static void test_ucx_symbol(void **state)
{
    (void)state;
    const ferry__ucx *ucx;
    assert_int_equal(ferry__ucx_get(&ucx), FERRY_OK);
    void *fn = NULL;
    assert_int_equal(ferry_ucx_symbol("ucp_get_version", &fn), FERRY_OK);
    void (*version)(unsigned *, unsigned *, unsigned *);
    memcpy(&version, &fn, sizeof(fn));
    unsigned major = 0, minor = 0, release = 0;
    version(&major, &minor, &release);
    assert_int_equal(major, ucx->major);
    assert_int_equal(minor, ucx->minor);
    assert_int_equal(release, ucx->release);
    assert_int_equal(ferry_ucx_symbol("ucs_status_string", &fn), FERRY_OK);
    const char *(*text)(ucs_status_t);
    memcpy(&text, &fn, sizeof(fn));
    assert_string_equal(text(UCS_ERR_NO_MEMORY), ucx->ucs_status_string(UCS_ERR_NO_MEMORY));

    fn = (void *)0x1;
    assert_int_equal(ferry_ucx_symbol("ucp_no_such_call", &fn), FERRY_NOT_SUPPORTED);
    assert_non_null(strstr(ferry_last_error(), "has no ucp_no_such_call"));
    assert_ptr_equal(fn, (void *)0x1);
    assert_int_equal(ferry_ucx_symbol(NULL, &fn), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_ucx_symbol("ucp_get_version", NULL), FERRY_INVALID_ARGUMENT);

    /* No UCX: the load's reason, and no entry point. */
    setenv("FERRY_UCX_LIBRARY", "/nonexistent/libucp.so.0", 1);
    th_helper h = th_spawn_helper("symbol", "ucp_get_version", "-");
    unsetenv("FERRY_UCX_LIBRARY");
    th_msg m = th_finish_helper(&h, 10000);
    assert_int_equal(m.status, FERRY_NOT_SUPPORTED);
    assert_int_equal(m.seed, 0);
    assert_non_null(strstr(m.text, "remote pools need UCX: /nonexistent/libucp.so.0"));
}

static int group_setup(void **state)
{
    (void)state;
    net_up();
    use_device(0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    net_down();
    return 0;
}

/* UCX's memory hooks (libucm, patching madvise and mmap) run inside glibc's thread exit, past
 * the point where ThreadSanitizer's runtime has let the thread go: off under TSan (nothing
 * here needs UCX's registration cache, which they keep true). */
static void ucx_for_sanitizers(void)
{
#if defined(__SANITIZE_THREAD__)
    setenv("UCX_MEM_EVENTS", "no", 0);
    setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 0);
    setenv("UCX_MEM_MALLOC_HOOKS", "no", 0);
#endif
}

int main(int argc, char **argv)
{
    ucx_for_sanitizers();
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    /* The remote path itself is what is tested here, on one host: a consumer of this host's
     * pool would open it locally (test_same_host_goes_local asks for that). */
    setenv("FERRY_REMOTE_LOCAL", "0", 1);
    const ferry__ucx *ucx;
    if (ferry__ucx_get(&ucx) != FERRY_OK) {
        fprintf(stderr, "test_remote: skipped: %s\n", ferry_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_addresses_and_config),
        cmocka_unit_test(test_ucx_symbol),
        cmocka_unit_test(test_local_and_remote_ranks),
        cmocka_unit_test(test_same_host_goes_local),
        cmocka_unit_test(test_same_host_falls_back),
        cmocka_unit_test(test_same_host_gives_rank_back),
        cmocka_unit_test(test_given_back_rank_settles_at_once),
        cmocka_unit_test(test_release_by_another_process_ignored),
        cmocka_unit_test(test_give_back_after_producer_quiet),
        cmocka_unit_test(test_rank_in_use),
        cmocka_unit_test(test_consumer_killed),
        cmocka_unit_test(test_consumer_killed_while_reading),
        cmocka_unit_test(test_producer_gone),
        cmocka_unit_test(test_producer_stopped),
        cmocka_unit_test(test_parts_marked_partial),
        cmocka_unit_test(test_partial_mark_never_over_ack),
        cmocka_unit_test(test_forged_part_count),
        cmocka_unit_test(test_parts_by_leader_without_the_lease),
        cmocka_unit_test(test_gone_during_partial_mark),
        cmocka_unit_test_teardown(test_link_cut, links_up),
        cmocka_unit_test(test_bad_peers),
        cmocka_unit_test(test_stale_under_read),
        cmocka_unit_test(test_held_leases),
        cmocka_unit_test(test_remote_calls),
        cmocka_unit_test(test_inline_sizes),
        cmocka_unit_test(test_inline_read_without_gets),
        cmocka_unit_test(test_inline_recycled_before_copy),
        cmocka_unit_test(test_served_reads),
        cmocka_unit_test(test_am_sends_name_host_memory),
        cmocka_unit_test(test_failed_acks_are_kept),
        cmocka_unit_test(test_served_looks),
        cmocka_unit_test(test_served_reads_into_gpu_memory),
        cmocka_unit_test(test_served_read_recycled_before_copy),
        cmocka_unit_test(test_many_hand_overs),
        cmocka_unit_test(test_acks_go_out_together),
        cmocka_unit_test_teardown(test_acks_go_out_during_a_long_read, unshape),
        cmocka_unit_test(test_connect_close_cycles),
        cmocka_unit_test(test_gpu_pool),
        cmocka_unit_test(test_gpu_pool_host_reader_falls_back),
        cmocka_unit_test(test_gpu_pool_killed_while_served),
        cmocka_unit_test_teardown(test_gpu_pool_pinned_answers, th_hold_undo),
    };
    if (getenv("FERRY_TEST_ONLY")) /* one test, by name (a pattern cmocka matches) */
        cmocka_set_test_filter(getenv("FERRY_TEST_ONLY"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
