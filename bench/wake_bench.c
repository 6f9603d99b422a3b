/* Wake-up micro-benchmark: what waking N sleeping receiver processes costs the sender, one
 * futex wake per receiver's word (what ferry_pool_send does: every rank's receivers sleep on
 * their own ring's tail) against one wake of all of them (every receiver asleep on one shared
 * word, FUTEX_WAIT_BITSET with its rank's bit, woken by one FUTEX_WAKE_BITSET).
 *
 * N child processes (fork) sleep; each round the parent waits until all are asleep, stamps,
 * moves the words and wakes them, stamps again (the sender's cost), and waits until every
 * child has stamped the moment it ran again (the last one's stamp less the first stamp: when
 * the last receiver runs). The two kinds alternate in chunks of --chunk rounds in one run.
 *
 * Usage: ferry-wake-bench [--waiters N] [--rounds N] [--chunk N] [--json] */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/atomic.h"
#include "common/clock.h"

#define MAX_WAITERS 32
enum { PER_WORD, ONE_WORD, KINDS };
static const char *const kind_names[KINDS] = {"per-word", "one-word"};

/* One waiter's words, a cache line each as a ring's counters are. */
typedef struct waiter {
    uint32_t word; /* PER_WORD: the round it may run (the ring's tail) */
    uint32_t pad0[15];
    uint32_t asleep; /* the round it is about to sleep for (1-based) */
    uint32_t pad1[3];
    uint64_t stamp; /* when it ran again */
    uint32_t pad2[10];
} waiter;

typedef struct shared {
    uint32_t bell; /* ONE_WORD: the round the waiters may run */
    uint32_t quit;
    uint32_t pad[14];
    waiter w[MAX_WAITERS];
} shared;
_Static_assert(sizeof(waiter) == 128, "a waiter is two cache lines");

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts, uint32_t bits)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, bits);
}

/* The kind of a round (from 1), as both sides compute it. */
static uint32_t kind_of(uint32_t round, uint32_t chunk)
{
    return ((round - 1) / chunk) % KINDS;
}

/* A child: for each round, says it is about to sleep and sleeps until its round comes. */
static void waiter_run(shared *s, uint32_t me, uint32_t rounds, uint32_t chunk)
{
    waiter *w = &s->w[me];
    for (uint32_t round = 1; round <= rounds; round++) {
        int deadline = 0;
        for (;;) {
            if (ferry__load_seqcst32(&s->quit))
                return;
            uint32_t kind = kind_of(round, chunk);
            uint32_t *word = kind == PER_WORD ? &w->word : &s->bell;
            ferry__store_seqcst32(&w->asleep, round);
            if (ferry__load_seqcst32(word) == round)
                break;
            /* bounded: a parent that is gone ends the child within seconds */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += 1;
            long r = kind == PER_WORD
                         ? futex(word, FUTEX_WAIT, round - 1, &(struct timespec){1, 0}, 0)
                         : futex(word, FUTEX_WAIT_BITSET, round - 1, &ts, 1u << me);
            if (r < 0 && errno == ETIMEDOUT && ++deadline > 10)
                return;
        }
        ferry__store_release64(&w->stamp, ferry__now_ns());
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, uint32_t n, double p)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return v[(uint32_t)((n - 1) * p)];
}

static int all_asleep(shared *s, uint32_t n, uint32_t round)
{
    for (uint32_t i = 0; i < n; i++)
        if (ferry__load_seqcst32(&s->w[i].asleep) != round)
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    uint32_t n = 4, rounds = 4000, chunk = 100;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json"))
            json = 1;
        else if (i + 1 < argc && !strcmp(a, "--waiters"))
            n = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(a, "--rounds"))
            rounds = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(a, "--chunk"))
            chunk = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr,
                    "usage: ferry-wake-bench [--waiters 1-%d] [--rounds N] [--chunk N] [--json]\n",
                    MAX_WAITERS);
            return 2;
        }
    }
    if (n < 1 || n > MAX_WAITERS || rounds < 2 * chunk || chunk < 1) {
        fprintf(stderr, "ferry-wake-bench: --waiters 1-%d, --rounds at least 2 --chunk\n",
                MAX_WAITERS);
        return 2;
    }
    shared *s = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    double *cost[KINDS], *last[KINDS];
    uint32_t got[KINDS] = {0, 0};
    for (int k = 0; k < KINDS; k++) {
        cost[k] = calloc(rounds, sizeof(double));
        last[k] = calloc(rounds, sizeof(double));
    }
    if (s == MAP_FAILED || !cost[0] || !cost[1] || !last[0] || !last[1]) {
        perror("ferry-wake-bench");
        return 1;
    }
    pid_t pids[MAX_WAITERS];
    for (uint32_t i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            waiter_run(s, i, rounds, chunk);
            _exit(0);
        }
    }
    int failed = 0;
    for (uint32_t round = 1; round <= rounds && !failed; round++) {
        uint32_t kind = kind_of(round, chunk);
        /* every waiter on its way to sleep for this round, then a moment to get there */
        uint64_t give_up = ferry__now_ns() + 5000000000ull;
        while (!all_asleep(s, n, round) && (sched_yield(), 1))
            if (ferry__now_ns() > give_up) {
                fprintf(stderr, "ferry-wake-bench: a waiter did not come back\n");
                failed = 1;
                break;
            }
        if (failed)
            break;
        usleep(200);
        uint64_t t0 = ferry__now_ns();
        if (kind == PER_WORD) {
            for (uint32_t i = 0; i < n; i++) {
                ferry__store_seqcst32(&s->w[i].word, round);
                futex(&s->w[i].word, FUTEX_WAKE, INT_MAX, NULL, 0);
            }
        } else {
            ferry__store_seqcst32(&s->bell, round);
            futex(&s->bell, FUTEX_WAKE_BITSET, INT_MAX, NULL, n == 32 ? ~0u : (1u << n) - 1);
        }
        uint64_t t1 = ferry__now_ns(), latest = 0;
        for (uint32_t i = 0; i < n && !failed; i++) {
            uint64_t at;
            while ((at = ferry__load_acquire64(&s->w[i].stamp)) < t0 && (sched_yield(), 1))
                if (ferry__now_ns() > give_up) {
                    fprintf(stderr, "ferry-wake-bench: a waiter was not woken\n");
                    failed = 1;
                    break;
                }
            latest = at > latest ? at : latest;
        }
        if (round > chunk) { /* the first chunk warms up */
            cost[kind][got[kind]] = (double)(t1 - t0) / 1e3;
            last[kind][got[kind]++] = (double)(latest - t0) / 1e3;
        }
    }
    ferry__store_seqcst32(&s->quit, 1);
    futex(&s->bell, FUTEX_WAKE, INT_MAX, NULL, 0);
    for (uint32_t i = 0; i < n; i++) {
        futex(&s->w[i].word, FUTEX_WAKE, INT_MAX, NULL, 0);
        waitpid(pids[i], NULL, 0);
    }
    if (failed || !got[0] || !got[1])
        return 1;
    double c50[KINDS], c99[KINDS], l50[KINDS], l99[KINDS];
    for (int k = 0; k < KINDS; k++) {
        c50[k] = pct(cost[k], got[k], 0.5);
        c99[k] = pct(cost[k], got[k], 0.99);
        l50[k] = pct(last[k], got[k], 0.5);
        l99[k] = pct(last[k], got[k], 0.99);
    }
    if (json) {
        printf("{\"waiters\": %u, \"rounds\": %u", n, got[0]);
        for (int k = 0; k < KINDS; k++)
            printf(", \"%s\": {\"wake_p50_us\": %.3f, \"wake_p99_us\": %.3f, \"last_p50_us\": "
                   "%.3f, \"last_p99_us\": %.3f}",
                   kind_names[k], c50[k], c99[k], l50[k], l99[k]);
        printf(", \"wake_ratio\": %.3f, \"last_ratio\": %.3f}\n", c50[ONE_WORD] / c50[PER_WORD],
               l50[ONE_WORD] / l50[PER_WORD]);
    } else {
        printf("%u waiters, %u rounds of each kind; microseconds from the sender's first stamp\n",
               n, got[0]);
        printf("%-9s %14s %14s %14s %14s\n", "kind", "wake p50", "wake p99", "last runs p50",
               "last runs p99");
        for (int k = 0; k < KINDS; k++)
            printf("%-9s %14.2f %14.2f %14.2f %14.2f\n", kind_names[k], c50[k], c99[k], l50[k],
                   l99[k]);
        printf("one-word/per-word p50: wake %.3f, last runs %.3f\n",
               c50[ONE_WORD] / c50[PER_WORD], l50[ONE_WORD] / l50[PER_WORD]);
    }
    return 0;
}
