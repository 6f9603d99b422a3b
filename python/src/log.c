/* ferry's log lines through Python's logging (logger "ferry"), installed with ferry_set_log when
 * the module is imported and removed at exit (atexit: later lines go to stderr again).
 *
 * The library logs from any thread, holding its own locks and usually without the GIL, so the
 * callback never calls Python: it queues the line. Lines logged by a thread inside a hold (a
 * publish or reserve) are delivered when the hold ends, by that thread with the GIL; the others
 * by Python's main thread soon after (Py_AddPendingCall), or by the next hold that ends. A hold
 * whose call raised PoolFull drops the library's once-per-pool "pool full" warning: the caller
 * has the exception, with the same message, and the line would say it twice. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

typedef struct fy_log_line {
    struct fy_log_line *next;
    int level;
    char text[];
} fy_log_line;

/* The text by which the pool-full warning is known (src/pool/pool.c). */
#define POOL_FULL_MARK "(publishers get POOL_FULL or wait; warned once)"

/* At most this many lines wait for the main thread; more are counted and dropped. */
#define QUEUE_MAX 256

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static fy_log_line *queue_first, **queue_last = &queue_first;
static unsigned queue_len, queue_dropped;
static int flush_scheduled;

static _Thread_local fy_log_hold *current_hold;

static void append(fy_log_line ***last, fy_log_line *line)
{
    line->next = NULL;
    **last = line;
    *last = &line->next;
}

static int flush_pending(void *unused);

static void enqueue(fy_log_line *line)
{
    int schedule = 0;
    pthread_mutex_lock(&queue_lock);
    if (queue_len >= QUEUE_MAX) {
        queue_dropped++;
        free(line);
    } else {
        append(&queue_last, line);
        queue_len++;
    }
    if (!flush_scheduled)
        schedule = flush_scheduled = 1;
    pthread_mutex_unlock(&queue_lock);
    if (schedule && Py_AddPendingCall(flush_pending, NULL) < 0) {
        pthread_mutex_lock(&queue_lock);
        flush_scheduled = 0; /* the next hold that ends delivers them */
        pthread_mutex_unlock(&queue_lock);
    }
}

/* ferry_log_fn: any thread, no GIL, under the library's log lock. */
static void on_log(int level, const char *message, void *user)
{
    (void)user;
    size_t n = strlen(message);
    fy_log_line *line = malloc(sizeof(*line) + n + 1);
    if (!line)
        return;
    line->level = level;
    memcpy(line->text, message, n + 1);
    if (current_hold)
        append(&current_hold->last, line);
    else
        enqueue(line);
}

static int python_level(int level)
{
    switch (level) {
    case FERRY_LOG_ERROR:
        return 40; /* logging.ERROR */
    case FERRY_LOG_WARN:
        return 30; /* logging.WARNING */
    default:
        return 20; /* logging.INFO */
    }
}

/* Hands the lines to logging.getLogger("ferry") and frees them; keeps the caller's exception. */
static void deliver(fy_log_line *line, unsigned dropped)
{
    if (!line && !dropped)
        return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "ferry") : NULL;
    if (logger && dropped) {
        PyObject *r = PyObject_CallMethod(logger, "log", "iss", 30, "%s",
                                          "some of ferry's log lines were dropped (too many "
                                          "at once)");
        Py_XDECREF(r);
    }
    while (line) {
        fy_log_line *next = line->next;
        if (logger) {
            PyObject *r =
                PyObject_CallMethod(logger, "log", "iss", python_level(line->level), "%s", line->text);
            if (!r)
                PyErr_WriteUnraisable(logger);
            Py_XDECREF(r);
        }
        free(line);
        line = next;
    }
    if (!logger)
        PyErr_WriteUnraisable(NULL);
    Py_XDECREF(logger);
    Py_XDECREF(logging);
    PyErr_Restore(type, value, traceback);
}

static void flush_queue(void)
{
    pthread_mutex_lock(&queue_lock);
    fy_log_line *lines = queue_first;
    unsigned dropped = queue_dropped;
    queue_first = NULL;
    queue_last = &queue_first;
    queue_len = queue_dropped = 0;
    flush_scheduled = 0;
    pthread_mutex_unlock(&queue_lock);
    deliver(lines, dropped);
}

static int flush_pending(void *unused)
{
    (void)unused;
    flush_queue();
    return 0;
}

void fy_log_hold_begin(fy_log_hold *hold)
{
    hold->first = NULL;
    hold->last = &hold->first;
    hold->outer = current_hold;
    current_hold = hold;
}

static int is_pool_full_warning(const fy_log_line *line)
{
    return line->level == FERRY_LOG_WARN && strstr(line->text, POOL_FULL_MARK) != NULL;
}

void fy_log_hold_end(fy_log_hold *hold, int raised_pool_full)
{
    current_hold = hold->outer;
    fy_log_line *keep = NULL, **keep_last = &keep;
    for (fy_log_line *line = hold->first, *next; line; line = next) {
        next = line->next;
        if (raised_pool_full && is_pool_full_warning(line))
            free(line);
        else
            append(&keep_last, line);
    }
    if (current_hold) { /* a hold inside a hold (Python code run by a publish): the outer one */
        if (keep) {
            *current_hold->last = keep;
            current_hold->last = keep_last;
        }
        return;
    }
    flush_queue(); /* lines of other threads first: they are older */
    deliver(keep, 0);
}

PyObject *fy_log_flush(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    flush_queue();
    Py_RETURN_NONE;
}

/* atexit: the lines still queued, then stderr again for whatever the library logs after. */
static PyObject *log_atexit(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    ferry_set_log(NULL, NULL);
    flush_queue();
    Py_RETURN_NONE;
}

static PyMethodDef atexit_def = {"_log_atexit", log_atexit, METH_NOARGS, NULL};

static void reset_in_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    queue_lock = fresh;
    flush_scheduled = 0;
}

int fy_log_install(PyObject *module)
{
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, reset_in_child) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_atfork failed");
        return -1;
    }
    atfork_done = 1;
    PyObject *fn = PyCFunction_New(&atexit_def, module);
    PyObject *atexit = fn ? PyImport_ImportModule("atexit") : NULL;
    PyObject *r = atexit ? PyObject_CallMethod(atexit, "register", "O", fn) : NULL;
    Py_XDECREF(atexit);
    Py_XDECREF(fn);
    if (!r)
        return -1;
    Py_DECREF(r);
    ferry_set_log(on_log, NULL);
    return 0;
}
