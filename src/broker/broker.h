/* The pool broker: hands a pool's file descriptor to consumer processes.
 *
 * A broker is a thread of the producer serving an abstract-namespace Unix SOCK_SEQPACKET
 * socket whose name is "ferry." followed by 32 hex digits of a random 128-bit value. Only
 * peers of the producer's uid are served (SO_PEERCRED), and requests naming a rank only from
 * peers whose pid the producer sees (a holder is watched by its pid); others, and any
 * malformed request, are refused and counted. One request per connection, one reply, then the
 * broker closes the connection. Connections are served concurrently: up to 64 wait for their
 * request at once, each for 1 s at most, and none waits behind a silent one. The wire messages are
 * defined in broker.c and docs/wire-format.md. */
#ifndef FERRY_BROKER_BROKER_H
#define FERRY_BROKER_BROKER_H

#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

typedef struct ferry__broker ferry__broker;

/* A pool's address (ferry_pool_address): this prefix, then the broker's name in hex. */
#define FERRY__ADDRESS_PREFIX "ferry:"

/* No rank: what OPEN and DESCRIBE requests name (and callers that claim none: acknowledging
 * on behalf of others, observing). */
#define FERRY__RANK_NONE UINT32_MAX

/* Called on the broker thread for a valid CLAIM request: a peer process claims rank (pid as
 * seen from the producer's pid namespace). Returns FERRY_OK to accept, or FERRY_RANK_IN_USE
 * with *holder set to the live process that holds the rank; the broker replies with that
 * status (and the holder). Must not block. */
typedef ferry_status (*ferry__broker_attach_fn)(void *user, uint32_t rank, pid_t pid,
                                                pid_t *holder);

/* Called on the broker thread for a DESCRIBE request (a consumer connecting by address):
 * writes the pool's encoded pool-only descriptor into out. Must not block. */
typedef ferry_status (*ferry__broker_describe_fn)(void *user, uint8_t out[FERRY_DESCRIPTOR_SIZE]);

/* Called on the broker thread for a NOTIFY request: pid hands over fd (an eventfd) to be
 * signalled when rank's ring gets descriptors. Takes fd in every case (closes it on
 * failure). Returns FERRY_OK, or the refusal to send. Must not block. */
typedef ferry_status (*ferry__broker_notify_fn)(void *user, uint32_t rank, pid_t pid, int fd);

/* Called on the broker thread for a RELEASE request: pid gives rank back (its consumer of the
 * rank was destroyed). Returns FERRY_OK once the rank is free of pid (released now, or not
 * pid's), or the refusal to send. Must not block. */
typedef ferry_status (*ferry__broker_release_fn)(void *user, uint32_t rank, pid_t pid);

typedef struct ferry__broker_config {
    const uint8_t *pool_id;            /* 16 bytes: requests must name it */
    int shared_fd;                     /* the fd handed to consumers (the broker does not own it) */
    uint64_t shared_size;              /* its size in bytes, sent with the fd */
    uint32_t consumer_count;           /* valid ranks are [0, consumer_count) */
    const char *label;                 /* prefix of messages, e.g. "host pool broker" */
    ferry__broker_attach_fn on_attach; /* may be NULL */
    void *user;
    ferry__broker_describe_fn on_describe; /* may be NULL: DESCRIBE gets NOT_SUPPORTED */
    ferry__broker_notify_fn on_notify;     /* may be NULL: NOTIFY gets NOT_SUPPORTED */
    ferry__broker_release_fn on_release;   /* may be NULL: RELEASE gets NOT_SUPPORTED */
} ferry__broker_config;

/* Starts a broker thread on a fresh random name (written to name_out, 16 bytes). On failure
 * nothing is left running and no fd is leaked. */
ferry_status ferry__broker_start(const ferry__broker_config *config, ferry__broker **broker,
                                 uint8_t name_out[16]);

/* Stops the thread, closes the socket and every connection still waiting for its request
 * (their peers see a hang-up), and frees the broker. NULL is a no-op. Idempotent through
 * the pointer being NULLed by the caller. Called in a forked child (any process other than
 * the one that started the broker), it does what ferry__broker_forget does. */
void ferry__broker_stop(ferry__broker *broker);

/* For a forked child: frees the child's copy of the broker, closing the child's copies of
 * the broker's own descriptors (listening socket, stop eventfd, pending connections; not
 * shared_fd, which the broker never owned). It neither signals nor joins the thread, which
 * exists only in the parent and goes on serving there. NULL is a no-op. */
void ferry__broker_forget(ferry__broker *broker);

/* Shuts the listening socket down under the broker's thread, which then latches a failure
 * (tests of the latched-failure paths only). */
int ferry__broker_shutdown_for_tests(ferry__broker *broker);

/* Connections refused so far (other uid, malformed request, unknown pool or rank, rank in
 * use, silent past its deadline, or arriving while 64 connections were pending). */
uint64_t ferry__broker_refused(const ferry__broker *broker);

/* Latched failure of the broker thread (e.g. accept failing for good): FERRY_OK while it is
 * healthy; otherwise the first cause's status, with its message copied into buf. */
ferry_status ferry__broker_error(const ferry__broker *broker, char *buf, size_t buf_size);

/* Client side. Connects to the broker called name and asks for the fd of pool_id (an OPEN:
 * it claims no rank; ferry__broker_claim does, once the caller has opened the pool). On
 * success *fd is the received fd (O_CLOEXEC, owned by the caller), *size its size as the
 * producer sent it, and *producer_pid the producer's pid as seen from this process
 * (SO_PEERCRED). PRODUCER_GONE if nobody listens on name; PERMISSION if refused, and before
 * asking where that pid reads 0 (a producer in a PID namespace not seen from here); SYSTEM with
 * "<label> returned no file descriptor" if the reply carries none, and with EMFILE's text
 * when this process had no descriptor free to take the fd. Every fd received is closed on
 * every error path. Never blocks longer than timeout_ns; with 0 it makes one attempt
 * without waiting. */
ferry_status ferry__broker_request(const uint8_t name[16], const uint8_t pool_id[16],
                                   const char *label, uint64_t timeout_ns, int *fd, uint64_t *size,
                                   pid_t *producer_pid);

/* ferry__broker_request, asking again (every millisecond) while the broker refuses because
 * its table of waiting connections is full and more than 2 ms of timeout_ns are left. */
ferry_status ferry__broker_request_patient(const uint8_t name[16], const uint8_t pool_id[16],
                                           const char *label, uint64_t timeout_ns, int *fd,
                                           uint64_t *size, pid_t *producer_pid);

/* Client side: claims rank of pool_id for the calling process (a CLAIM; the producer's
 * on_attach records it). RANK_IN_USE with "rank R is held by live process P (a rank belongs
 * to one live process at a time)", P as the producer sees it, if another live process holds
 * rank; other errors as for ferry__broker_request (patient as
 * ferry__broker_request_patient). The reply carries no descriptor, so a process short of
 * them fails before it sends the claim (socket), never after the producer recorded it; only
 * a reply that does not come in time leaves that in doubt (the claim is this process's,
 * which may claim again, and is taken over once it exits). */
ferry_status ferry__broker_claim(const uint8_t name[16], const uint8_t pool_id[16], uint32_t rank,
                                 const char *label, uint64_t timeout_ns);

/* Client side: gives rank of pool_id back (a RELEASE; the producer's on_release settles it as
 * it settles a holder that died: what the rank took and never acknowledged is acknowledged
 * on its behalf, and another process may claim it). Errors as for ferry__broker_claim. */
ferry_status ferry__broker_release(const uint8_t name[16], const uint8_t pool_id[16], uint32_t rank,
                                   const char *label, uint64_t timeout_ns);

/* Client side, by the broker's name alone (a pool's address): the pool's encoded pool-only
 * descriptor into desc, and the producer's pid as seen from this process. Patient as
 * ferry__broker_request_patient; errors as for ferry__broker_request. */
ferry_status ferry__broker_describe(const uint8_t name[16], const char *label, uint64_t timeout_ns,
                                    uint8_t desc[FERRY_DESCRIPTOR_SIZE], pid_t *producer_pid);

/* Client side: hands event_fd (the caller keeps its own copy) to the broker, to be signalled
 * when rank's descriptor ring gets entries. The calling process must hold rank. */
ferry_status ferry__broker_notify(const uint8_t name[16], const uint8_t pool_id[16], uint32_t rank,
                                  const char *label, uint64_t timeout_ns, int event_fd);

/* The abstract socket address of a broker name (for tests that connect by hand): writes
 * the sockaddr_un into addr (a struct sockaddr_un *) and returns its length. */
unsigned ferry__broker_address(const uint8_t name[16], void *addr);

#endif
