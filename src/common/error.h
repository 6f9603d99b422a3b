/* Status reporting: the thread-local detailed message behind ferry_last_error(). */
#ifndef FERRY_COMMON_ERROR_H
#define FERRY_COMMON_ERROR_H

#include "ferry.h"

/* Records a formatted message for ferry_last_error() and returns status, so that the
 * place that detects an error reports it in one line: return ferry__fail(...). */
ferry_status ferry__fail(ferry_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Like ferry__fail, appending ": strerror(err)" for a failed system call. */
ferry_status ferry__fail_errno(ferry_status status, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the thread's current message with a formatted context ("<context>: <message>")
 * and returns status. */
ferry_status ferry__fail_wrap(ferry_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears the thread's message (called on entry of public functions that succeed quietly). */
void ferry__clear_error(void);

/* Logging through the callback set by ferry_set_log (stderr by default). */
void ferry__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
