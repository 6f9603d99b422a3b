/* Helper processes of the multi-process tests: the test binary re-runs itself with
 * "--helper ROLE ARG ARG", and the two talk over a SOCK_SEQPACKET pair that the helper finds
 * on fd TH_CHANNEL_FD. Messages are fixed-size records. */
#ifndef FERRY_TESTS_PROCS_H
#define FERRY_TESTS_PROCS_H

#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

#define TH_CHANNEL_FD 3

enum { TH_MSG_ITEM = 1, TH_MSG_DONE = 2, TH_MSG_RESULT = 3 };

/* An ITEM whose status is TH_ITEM_NOACK is read but not acknowledged. */
#define TH_ITEM_NOACK 1u

typedef struct th_msg {
    uint32_t type;
    uint32_t status; /* ITEM: flags; RESULT: a ferry_status */
    uint64_t seed;   /* ITEM: pattern seed; RESULT: items verified */
    uint8_t desc[FERRY_DESCRIPTOR_SIZE];
    char text[256]; /* RESULT: ferry_last_error() of a failure */
} th_msg;

typedef struct th_helper {
    pid_t pid;
    int fd; /* the test's end of the channel */
} th_helper;

int th_send_msg(int fd, const th_msg *m);
int th_recv_msg(int fd, th_msg *m, int timeout_ms);

/* Test side (cmocka asserts on failure). */
th_helper th_spawn_helper(const char *role, const char *arg1, const char *arg2);
void th_send_item(int fd, const ferry_descriptor *d, uint64_t seed, uint32_t flags);
void th_send_type(int fd, uint32_t type);
/* Waits for the helper's RESULT (status 0xdead if none came) and its exit. */
th_msg th_finish_helper(th_helper *h, int timeout_ms);
/* Waits for a helper's exit (one that was killed). */
void th_reap_helper(th_helper *h);
/* Stops a helper (SIGSTOP) and returns once every thread of it has stopped: kill() alone
 * returns before that, and a thread may still run for a moment. SIGCONT lets it go on. */
void th_stop_helper(const th_helper *h);
/* Fails the test unless the result is OK with count items. */
void th_assert_result(th_msg m, uint64_t count);

/* A forked child that does not exec holds a copy of every fd of its parent until it exits:
 * th_fork_holder makes one that exits once *release is closed (th_holder_exit, which waits
 * for its clean exit). */
pid_t th_fork_holder(int *release);
void th_holder_exit(pid_t child, int release);

/* The pool's statistics (the test fails if they cannot be read). */
ferry_pool_stats th_stats(ferry_pool *pool);
/* A read on a thread of its own (th_read_main): r->st is its status once the thread ends;
 * r->started (atomic) is 1 once it is about to read. */
typedef struct th_reader {
    ferry_consumer *c;
    ferry_descriptor d;
    uint8_t *buf;
    size_t n;
    int started;
    ferry_status st;
} th_reader;

/* pthread body: ferry_consumer_read of r->d into r->buf with a timeout of 10 s. */
void *th_read_main(void *arg);

/* Publishes n bytes of src as a reservation (waiting up to timeout_ns for room) written back
 * to front, as a zero-copy writer may fill its slice in any order: its bytes land ahead of a
 * reader still in the slice's front. */
ferry_descriptor th_reserve_backwards(ferry_pool *pool, const uint8_t *src, size_t n,
                                      uint64_t timeout_ns);

/* What the pool knows of rank (the test fails if it cannot be read). */
ferry_consumer_info th_consumer_info(ferry_pool *pool, uint32_t rank);
/* Reclaims until no lease is in flight (at most ~5 s), then asserts it. */
void th_wait_drained(ferry_pool *pool);

/* Helper side: sends RESULT with ferry_last_error(). */
void th_report(uint32_t status, uint64_t count);

/* Helper side: a producer that creates a pool from config, reserves a 4 KiB lease it never
 * commits, sends its descriptor as an ITEM and sleeps until it is killed. Returns 1 only if
 * it could not get that far. */
int th_stuck_producer(const ferry_pool_config *config);

#endif
