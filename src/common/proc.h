/* Process liveness, robust to pid reuse: a process is named by (pid, start time). */
#ifndef FERRY_COMMON_PROC_H
#define FERRY_COMMON_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Start time of pid (clock ticks since boot, /proc/<pid>/stat field 22), or 0 if the process
 * does not exist or is a zombie. */
uint64_t ferry__proc_starttime(pid_t pid);

/* 1 if pid is alive (running, not a zombie) and started at starttime (0 = any start). */
int ferry__proc_alive(pid_t pid, uint64_t starttime);

/* When pid started, on the CLOCK_MONOTONIC clock of ferry__now_ns, rounded up to the next
 * clock tick of /proc (so that anything stamped before it surely came first); 0 if unknown. */
uint64_t ferry__proc_start_ns(pid_t pid);

/* This process's pid, kept current across fork() (a pthread_atfork child handler): cheap
 * enough for every call that must refuse to run in a forked child. */
pid_t ferry__proc_self(void);

/* Fills buf with n bytes from getrandom(); -1 with errno set if it fails. */
int ferry__random_bytes(void *buf, size_t n);

#endif
