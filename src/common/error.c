/* Status table, thread-local error messages and logging. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"

#define FERRY_ERROR_MAX 512

static _Thread_local char last_error[FERRY_ERROR_MAX];

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_log_fn log_fn;
static void *log_user;

const char *ferry_status_str(ferry_status status)
{
    switch (status) {
#define FERRY_STATUS_TEXT_(name, value, text)                                                      \
    case FERRY_##name:                                                                             \
        return text;
        FERRY_STATUS_MAP(FERRY_STATUS_TEXT_)
#undef FERRY_STATUS_TEXT_
    }
    return "unknown status";
}

const char *ferry_status_name(ferry_status status)
{
    switch (status) {
#define FERRY_STATUS_NAME_(name, value, text)                                                      \
    case FERRY_##name:                                                                             \
        return #name;
        FERRY_STATUS_MAP(FERRY_STATUS_NAME_)
#undef FERRY_STATUS_NAME_
    }
    return "UNKNOWN";
}

const char *ferry_last_error(void)
{
    return last_error;
}

uint32_t ferry_version_number(void)
{
    return FERRY_VERSION_NUMBER;
}

const char *ferry_version(void)
{
#define FERRY_STR2_(x) #x
#define FERRY_STR_(x)  FERRY_STR2_(x)
    return FERRY_STR_(FERRY_VERSION_MAJOR) "." FERRY_STR_(FERRY_VERSION_MINOR) "." FERRY_STR_(
        FERRY_VERSION_PATCH);
}

void ferry__clear_error(void)
{
    last_error[0] = '\0';
}

/* The message is formatted aside, then copied: an argument may be ferry_last_error() itself. */
ferry_status ferry__fail(ferry_status status, const char *fmt, ...)
{
    char text[FERRY_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    memcpy(last_error, text, strlen(text) + 1);
    return status;
}

ferry_status ferry__fail_errno(ferry_status status, int err, const char *fmt, ...)
{
    char errbuf[128], text[FERRY_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(text))
        snprintf(text + n, sizeof(text) - (size_t)n, ": %s",
                 strerror_r(err, errbuf, sizeof(errbuf)));
    memcpy(last_error, text, strlen(text) + 1);
    return status;
}

ferry_status ferry__fail_wrap(ferry_status status, const char *fmt, ...)
{
    char cause[FERRY_ERROR_MAX];
    snprintf(cause, sizeof(cause), "%s", last_error);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n;
    if (used + 2 < sizeof(last_error)) {
        size_t room = sizeof(last_error) - used - 3, len = strlen(cause);
        memcpy(last_error + used, ": ", 2);
        memcpy(last_error + used + 2, cause, len < room ? len : room);
        last_error[used + 2 + (len < room ? len : room)] = '\0';
    }
    return status;
}

void ferry_set_log(ferry_log_fn fn, void *user)
{
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_lock);
}

void ferry__log(int level, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warning", "info"};
    char line[FERRY_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    if (log_fn)
        log_fn(level, line, log_user);
    else
        fprintf(stderr, "ferry %s: %s\n", names[level < 0 || level > 2 ? 0 : level], line);
    pthread_mutex_unlock(&log_lock);
}
