/* Process liveness, robust to pid reuse and to running out of file descriptors: a process is
 * watched through a pidfd held from the moment it is first seen (a poll of it cannot fail
 * for want of descriptors), or, where there is none, named by (pid, start time) and looked
 * up in /proc, an error of which is reported as an error, never as a death. */
#ifndef FERRY_COMMON_PROC_H
#define FERRY_COMMON_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Start time of pid (clock ticks since boot, /proc/<pid>/stat field 22), or 0 if the process
 * does not exist or is a zombie. */
uint64_t ferry__proc_starttime(pid_t pid);

/* A pidfd of pid (close-on-exec), or -1 with errno set (ENOSYS where the kernel has none,
 * EMFILE/ENFILE when this process or the system is out of descriptors). */
int ferry__proc_watch(pid_t pid);

/* Whether pid lives: 1 alive, 0 gone (exited, a zombie, or pid reused by a process that did
 * not start at starttime; 0 = any start), -1 with errno set when it could not tell. With a
 * pidfd (ferry__proc_watch; -1: none) the answer needs no descriptor and cannot fail that
 * way; without one, /proc is read, retried on EINTR. */
int ferry__proc_check(pid_t pid, uint64_t starttime, int pidfd);

/* When pid started, on the CLOCK_MONOTONIC clock of ferry__now_ns, rounded up to the next
 * clock tick of /proc (so that anything stamped before it surely came first); 0 if unknown. */
uint64_t ferry__proc_start_ns(pid_t pid);

/* This process's pid, kept current across fork() (a pthread_atfork child handler): cheap
 * enough for every call that must refuse to run in a forked child. */
pid_t ferry__proc_self(void);

/* Fills buf with n bytes from getrandom(); -1 with errno set if it fails. */
int ferry__random_bytes(void *buf, size_t n);

#endif
