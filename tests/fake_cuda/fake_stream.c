/* The fake CUDA driver's streams: every stream is a FIFO of operations (copies, fills,
 * 32-bit stream memory operations, event markers) run in order by a worker thread of its
 * own, which sleeps on a condition variable while the queue is empty. The NULL stream is the
 * process's legacy stream, created on first use, with CUDA's implicit synchronization:
 * its work waits for what blocking streams (created without CU_STREAM_NON_BLOCKING) had
 * queued before it, and their work waits for what it had queued before. cuMemcpy and
 * cuMemsetD32 run on the legacy stream and wait for it.
 *
 * An operation pins the regions it uses (fake_region.pending), so that memory is not
 * unmapped under a worker; everything is guarded by fake_lock, released while copying and
 * between the polls of a wait. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_cuda.h"

#define FAKE_CU_STREAM_LEGACY                        ((CUstream)(uintptr_t)1)
#define FAKE_CU_STREAM_PER_THREAD                    ((CUstream)(uintptr_t)2)
#define FAKE_CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER 0x1u
#define FAKE_CU_EVENT_BLOCKING_SYNC                  0x1u
#define FAKE_CU_EVENT_INTERPROCESS                   0x4u
#define FAKE_WAIT_POLL_NS                            20000

enum op_kind { OP_COPY, OP_SET32, OP_WRITE, OP_WAIT, OP_EVENT, OP_CALL };

/* Implicit synchronization: the stream with this id must have completed target operations. */
struct dep {
    uint64_t stream;
    uint64_t target;
};

struct op {
    struct op *next;
    enum op_kind kind;
    char *dst;       /* COPY, SET32; WRITE and WAIT: the 32-bit word */
    const char *src; /* COPY */
    size_t n;        /* COPY: bytes; SET32: words */
    uint32_t value;  /* SET32, WRITE, WAIT */
    unsigned flags;  /* WAIT */
    struct fake_region *pin[2];
    struct CUevent_st *event; /* EVENT */
    uint64_t seq;             /* EVENT: which record of the event */
    void (*call)(void *);     /* CALL, with call_arg */
    void *call_arg;
    struct dep after; /* cuStreamWaitEvent: the event's marker (stream 0: none) */
    size_t ndeps;
    struct dep *deps;
};

struct CUstream_st {
    struct CUstream_st *next; /* every stream whose worker has not been joined */
    uint64_t id;
    unsigned flags;
    int legacy;
    int dying;   /* cuStreamDestroy: no new work; finish, giving up blocked waits */
    int waiting; /* the worker is polling a cuStreamWaitValue32 */
    pthread_t thread;
    pthread_cond_t work; /* signalled when work is queued and at destroy */
    struct op *head, *tail;
    uint64_t enqueued, completed;
};

struct CUevent_st {
    struct CUevent_st *next; /* live events */
    unsigned flags;
    uint64_t recorded; /* records so far */
    int done;          /* the marker of the latest record ran */
    int lost;          /* the marker of the latest record was dropped (its stream destroyed) */
    unsigned refs;     /* the handle and the markers in flight */
    struct dep marker; /* where the latest record's marker is: its stream and ticket */
};

static struct CUstream_st *streams;
static struct CUstream_st *legacy_stream;
static struct CUevent_st *events;
static uint64_t last_stream_id;

static struct CUstream_st *stream_by_id(uint64_t id)
{
    for (struct CUstream_st *s = streams; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static void event_unref(struct CUevent_st *e)
{
    if (--e->refs == 0)
        free(e);
}

/* Releases what a run or dropped operation holds (under fake_lock). */
static void finish(struct op *op, int lost)
{
    if (lost && op->kind == OP_CALL) /* a free behind a wait given up still happens */
        op->call(op->call_arg);
    for (int i = 0; i < 2; i++)
        if (op->pin[i])
            op->pin[i]->pending--;
    if (op->event) {
        if (op->seq == op->event->recorded) {
            op->event->done = !lost;
            op->event->lost = lost;
        }
        event_unref(op->event);
    }
    free(op->deps);
    free(op);
}

static int wait_satisfied(const struct op *op)
{
    uint32_t v = __atomic_load_n((uint32_t *)(void *)op->dst, __ATOMIC_ACQUIRE);
    if (op->flags == CU_STREAM_WAIT_VALUE_EQ)
        return v == op->value;
    return (int32_t)(v - op->value) >= 0;
}

/* Copies like a DMA engine: memory of the fake (device memory, registered host memory) is
 * read and written with relaxed atomic words, which hardware does not tear, so that a copy of
 * a table of control words that a stream memory operation updates at the same time is no
 * data race; pageable host memory is read and written plainly. ThreadSanitizer thus still
 * reports stream work that races with plain accesses of the CPU, but not two streams that
 * touch the same words. */
static void engine_copy(char *dst, const char *src, size_t n, int dst_fake, int src_fake)
{
    if (!dst_fake && !src_fake) {
        memcpy(dst, src, n);
        return;
    }
    size_t i = 0;
    if (((uintptr_t)dst & 7) == ((uintptr_t)src & 7)) {
        for (; i < n && ((uintptr_t)(dst + i) & 7); i++) {
            char c = src_fake ? __atomic_load_n(src + i, __ATOMIC_RELAXED) : src[i];
            if (dst_fake)
                __atomic_store_n(dst + i, c, __ATOMIC_RELAXED);
            else
                dst[i] = c;
        }
        for (; i + 8 <= n; i += 8) {
            uint64_t v;
            if (src_fake)
                v = __atomic_load_n((const uint64_t *)(const void *)(src + i), __ATOMIC_RELAXED);
            else
                memcpy(&v, src + i, 8);
            if (dst_fake)
                __atomic_store_n((uint64_t *)(void *)(dst + i), v, __ATOMIC_RELAXED);
            else
                memcpy(dst + i, &v, 8);
        }
    }
    for (; i < n; i++) {
        char c = src_fake ? __atomic_load_n(src + i, __ATOMIC_RELAXED) : src[i];
        if (dst_fake)
            __atomic_store_n(dst + i, c, __ATOMIC_RELAXED);
        else
            dst[i] = c;
    }
}

/* Runs op on s's worker (under fake_lock, which it releases while copying or polling).
 * Returns 1 if it gave the operation up because s is being destroyed. */
/* Waits (under fake_lock) until the stream of dep ran its target or is gone: 1 if s is being
 * destroyed and that stream is blocked in a wait (the dependency would never be met). */
static int wait_dep(struct CUstream_st *s, const struct dep *dep)
{
    for (;;) {
        struct CUstream_st *t = stream_by_id(dep->stream);
        if (!t || t->completed >= dep->target)
            return 0;
        if (s->dying && t->waiting)
            return 1;
        pthread_cond_wait(&fake_progress, &fake_lock);
    }
}

static int run(struct CUstream_st *s, struct op *op)
{
    for (size_t i = 0; i < op->ndeps; i++)
        if (wait_dep(s, &op->deps[i]))
            return 1;
    if (op->after.stream && wait_dep(s, &op->after))
        return 1;
    switch (op->kind) {
    case OP_COPY:
        pthread_mutex_unlock(&fake_lock);
        engine_copy(op->dst, op->src, op->n, op->pin[0] != NULL, op->pin[1] != NULL);
        pthread_mutex_lock(&fake_lock);
        break;
    case OP_SET32:
        pthread_mutex_unlock(&fake_lock);
        for (size_t i = 0; i < op->n; i++)
            __atomic_store_n((uint32_t *)(void *)(op->dst + 4 * i), op->value, __ATOMIC_RELAXED);
        pthread_mutex_lock(&fake_lock);
        break;
    case OP_WRITE:
        __atomic_store_n((uint32_t *)(void *)op->dst, op->value, __ATOMIC_RELEASE);
        break;
    case OP_WAIT: {
        int gave_up = 0;
        s->waiting = 1;
        pthread_cond_broadcast(&fake_progress); /* a dying stream may wait on this one */
        while (!wait_satisfied(op)) {
            if (s->dying) {
                gave_up = 1;
                break;
            }
            pthread_mutex_unlock(&fake_lock);
            struct timespec pause = {0, FAKE_WAIT_POLL_NS};
            nanosleep(&pause, NULL);
            pthread_mutex_lock(&fake_lock);
        }
        s->waiting = 0;
        return gave_up;
    }
    case OP_EVENT:
        break;
    case OP_CALL:
        op->call(op->call_arg);
        break;
    }
    return 0;
}

static void *worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&fake_lock);
    for (;;) {
        struct op *op = s->head;
        if (!op) {
            if (s->dying)
                break;
            pthread_cond_wait(&s->work, &fake_lock);
            continue;
        }
        int gave_up = run(s, op);
        /* A wait given up never completes: what was queued behind it never runs. */
        for (int first = 1; first || (gave_up && s->head); first = 0) {
            op = s->head;
            s->head = op->next;
            if (!s->head)
                s->tail = NULL;
            s->completed++;
            finish(op, gave_up);
        }
        pthread_cond_broadcast(&fake_progress);
    }
    pthread_mutex_unlock(&fake_lock);
    return NULL;
}

/* Handles of destroyed streams (the latest ones; under fake_lock): work queued on one aborts,
 * as CUDA's driver may crash there (its behaviour is undefined; an H100's did). A new stream
 * that gets the same address takes its handle back. */
#define FAKE_DEAD_STREAMS 256
static const void *dead_streams[FAKE_DEAD_STREAMS];
static unsigned dead_next;

/* Where h is recorded as a destroyed stream's handle, or NULL. */
static const void **dead_stream(const void *h)
{
    for (unsigned i = 0; i < FAKE_DEAD_STREAMS; i++)
        if (dead_streams[i] == h)
            return &dead_streams[i];
    return NULL;
}

/* A new stream with its worker (under fake_lock), or NULL. */
static struct CUstream_st *stream_new(unsigned flags, int legacy)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    const void **dead = dead_stream(s);
    if (dead)
        *dead = NULL;
    s->id = ++last_stream_id;
    s->flags = flags;
    s->legacy = legacy;
    if (pthread_cond_init(&s->work, NULL) != 0) {
        free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        pthread_cond_destroy(&s->work);
        free(s);
        return NULL;
    }
    s->next = streams;
    streams = s;
    return s;
}

/* The calling thread's per-thread default stream (CU_STREAM_PER_THREAD), made on first use:
 * a blocking stream (it synchronises with the legacy stream), never destroyed. */
static _Thread_local struct CUstream_st *per_thread_stream;

/* The stream a handle names (under fake_lock): NULL and CU_STREAM_LEGACY name the legacy
 * stream, created on first use when create is set (else *out = NULL); CU_STREAM_PER_THREAD
 * the calling thread's own. */
static CUresult stream_resolve(CUstream h, int create, struct CUstream_st **out)
{
    *out = NULL;
    if (h == NULL || h == FAKE_CU_STREAM_LEGACY) {
        if (!legacy_stream && create && !(legacy_stream = stream_new(0, 1)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        *out = legacy_stream;
        return CUDA_SUCCESS;
    }
    if (h == FAKE_CU_STREAM_PER_THREAD) {
        if (!per_thread_stream && !(per_thread_stream = stream_new(0, 0)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        *out = per_thread_stream;
        return CUDA_SUCCESS;
    }
    for (struct CUstream_st *s = streams; s; s = s->next)
        if (s == h && !s->dying && !s->legacy) {
            *out = s;
            return CUDA_SUCCESS;
        }
    if (create && dead_stream(h)) {
        fprintf(stderr, "fake CUDA: work queued on destroyed stream %p (undefined in CUDA)\n",
                (void *)h);
        abort();
    }
    return FAKE_CUDA_ERROR_INVALID_HANDLE;
}

static struct op *op_new(enum op_kind kind)
{
    struct op *op = calloc(1, sizeof(*op));
    if (op)
        op->kind = kind;
    return op;
}

/* Queues op on s (under fake_lock), pinning its regions; on failure frees op. Returns the
 * operation's ticket in *ticket: s has run it once s->completed reaches it. */
static CUresult submit(struct CUstream_st *s, struct op *op, uint64_t *ticket)
{
    size_t n = 0;
    int blocking = !s->legacy && !(s->flags & CU_STREAM_NON_BLOCKING);
    for (struct CUstream_st *t = streams; t; t = t->next) {
        int want =
            s->legacy ? !t->legacy && !(t->flags & CU_STREAM_NON_BLOCKING) : blocking && t->legacy;
        if (want && t->enqueued > t->completed)
            n++;
    }
    if (n) {
        op->deps = calloc(n, sizeof(*op->deps));
        if (!op->deps) {
            free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (struct CUstream_st *t = streams; t; t = t->next) {
            int want = s->legacy ? !t->legacy && !(t->flags & CU_STREAM_NON_BLOCKING)
                                 : blocking && t->legacy;
            if (want && t->enqueued > t->completed)
                op->deps[op->ndeps++] = (struct dep){t->id, t->enqueued};
        }
    }
    for (int i = 0; i < 2; i++)
        if (op->pin[i])
            op->pin[i]->pending++;
    if (op->event)
        op->event->refs++;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    *ticket = ++s->enqueued;
    pthread_cond_signal(&s->work);
    return CUDA_SUCCESS;
}

/* Waits (under fake_lock) until the stream with this id has run ticket operations or is
 * gone. */
static void wait_ticket(uint64_t id, uint64_t ticket)
{
    struct CUstream_st *s;
    while ((s = stream_by_id(id)) && s->completed < ticket)
        pthread_cond_wait(&fake_progress, &fake_lock);
}

/* ---- copies ---------------------------------------------------------------------------- */

/* Queues a copy on stream h; waits for it when wait is set or one side is pageable host
 * memory (as CUDA does for pageable memory: the caller may reuse its buffer at once). */
static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, int wait)
{
    struct fake_region *rd, *rs;
    struct CUstream_st *s;
    uint64_t ticket;
    pthread_mutex_lock(&fake_lock);
    CUresult rc = stream_resolve(h, 1, &s);
    if (rc == CUDA_SUCCESS && n) /* a copy of nothing is no operation */
        rc = fake_check_span((uintptr_t)dst, n, &rd);
    if (rc == CUDA_SUCCESS && n)
        rc = fake_check_span((uintptr_t)src, n, &rs);
    if (rc == CUDA_SUCCESS && n) {
        struct op *op = op_new(OP_COPY);
        if (!op)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            op->dst = (char *)(uintptr_t)dst;
            op->src = (const char *)(uintptr_t)src;
            op->n = n;
            op->pin[0] = rd;
            op->pin[1] = rs;
            rc = submit(s, op, &ticket);
        }
        if (rc == CUDA_SUCCESS && (wait || !rd || !rs))
            wait_ticket(s->id, ticket);
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuMemcpy);
static CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    FAKE_ENTER(cuMemcpy);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    return copy(dst, src, ByteCount, NULL, 1);
}

FAKE_DECLARE(cuMemcpyAsync);
static CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    FAKE_ENTER(cuMemcpyAsync);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    return copy(dst, src, ByteCount, hStream, 0);
}

FAKE_DECLARE(cuMemsetD32);
static CUresult cuMemsetD32(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    FAKE_ENTER(cuMemsetD32);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((dstDevice & 3) || N > SIZE_MAX / 4)
        return CUDA_ERROR_INVALID_VALUE;
    if (N == 0)
        return CUDA_SUCCESS;
    struct fake_region *r;
    struct CUstream_st *s;
    uint64_t ticket;
    pthread_mutex_lock(&fake_lock);
    rc = fake_check_span((uintptr_t)dstDevice, N * 4, &r);
    if (rc == CUDA_SUCCESS && !r)
        rc = CUDA_ERROR_INVALID_VALUE; /* pageable host memory */
    if (rc == CUDA_SUCCESS)
        rc = stream_resolve(NULL, 1, &s);
    if (rc == CUDA_SUCCESS) {
        struct op *op = op_new(OP_SET32);
        if (!op)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            op->dst = (char *)(uintptr_t)dstDevice;
            op->n = N;
            op->value = ui;
            op->pin[0] = r;
            rc = submit(s, op, &ticket);
        }
        if (rc == CUDA_SUCCESS)
            wait_ticket(s->id, ticket);
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

/* ---- streams --------------------------------------------------------------------------- */

FAKE_DECLARE(cuStreamCreate);
static CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    FAKE_ENTER(cuStreamCreate);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phStream || (Flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct CUstream_st *s = stream_new(Flags, 0);
    pthread_mutex_unlock(&fake_lock);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = s;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuStreamDestroy);
static CUresult cuStreamDestroy(CUstream hStream)
{
    FAKE_ENTER(cuStreamDestroy);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUstream_st *s;
    pthread_mutex_lock(&fake_lock);
    rc = stream_resolve(hStream, 0, &s);
    if (rc == CUDA_SUCCESS && (!s || s->legacy || hStream == FAKE_CU_STREAM_PER_THREAD))
        rc = FAKE_CUDA_ERROR_INVALID_HANDLE;
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&fake_lock);
        return rc;
    }
    /* Queued work still runs, but a wait that is not satisfied is given up (and what is
     * queued behind it dropped), lest the worker never finish. */
    s->dying = 1;
    pthread_cond_signal(&s->work);
    pthread_cond_broadcast(&fake_progress);
    pthread_mutex_unlock(&fake_lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&fake_lock);
    for (struct CUstream_st **at = &streams; *at; at = &(*at)->next)
        if (*at == s) {
            *at = s->next;
            break;
        }
    dead_streams[dead_next++ % FAKE_DEAD_STREAMS] = s;
    pthread_cond_broadcast(&fake_progress);
    pthread_mutex_unlock(&fake_lock);
    pthread_cond_destroy(&s->work);
    free(s);
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuStreamSynchronize);
static CUresult cuStreamSynchronize(CUstream hStream)
{
    FAKE_ENTER(cuStreamSynchronize);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUstream_st *s;
    pthread_mutex_lock(&fake_lock);
    rc = stream_resolve(hStream, 0, &s);
    if (rc == CUDA_SUCCESS && s)
        wait_ticket(s->id, s->enqueued);
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuStreamQuery);
static CUresult cuStreamQuery(CUstream hStream)
{
    FAKE_ENTER(cuStreamQuery);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUstream_st *s;
    pthread_mutex_lock(&fake_lock);
    rc = stream_resolve(hStream, 0, &s);
    if (rc == CUDA_SUCCESS && s && s->completed < s->enqueued)
        rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

/* A stream's id, unique for the process's life (a new stream never takes an old one's, even
 * at the same address). A destroyed stream's handle aborts, as work queued on it does. */
FAKE_DECLARE(cuStreamGetId);
static CUresult cuStreamGetId(CUstream hStream, unsigned long long *id)
{
    FAKE_ENTER(cuStreamGetId);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    pthread_mutex_lock(&fake_lock);
    rc = stream_resolve(hStream, 1, &s);
    if (rc == CUDA_SUCCESS)
        *id = s->id;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

/* Queues a 32-bit stream memory operation on the word at addr, which must lie in device
 * memory or registered host memory. */
static CUresult value_op(enum op_kind kind, CUstream h, CUdeviceptr addr, uint32_t value,
                         unsigned flags)
{
    if (addr & 3)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_region *r;
    struct CUstream_st *s;
    uint64_t ticket;
    pthread_mutex_lock(&fake_lock);
    CUresult rc = stream_resolve(h, 1, &s);
    if (rc == CUDA_SUCCESS)
        rc = fake_check_span((uintptr_t)addr, 4, &r);
    if (rc == CUDA_SUCCESS && !r)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct op *op = op_new(kind);
        if (!op)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            op->dst = (char *)(uintptr_t)addr;
            op->value = value;
            op->flags = flags;
            op->pin[0] = r;
            rc = submit(s, op, &ticket);
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuStreamWaitValue32);
static CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, uint32_t value,
                                    unsigned int flags)
{
    FAKE_ENTER(cuStreamWaitValue32);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags != CU_STREAM_WAIT_VALUE_GEQ && flags != CU_STREAM_WAIT_VALUE_EQ)
        return CUDA_ERROR_INVALID_VALUE;
    return value_op(OP_WAIT, stream, addr, value, flags);
}

FAKE_DECLARE(cuStreamWriteValue32);
static CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, uint32_t value,
                                     unsigned int flags)
{
    FAKE_ENTER(cuStreamWriteValue32);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags & ~FAKE_CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
        return CUDA_ERROR_INVALID_VALUE;
    return value_op(OP_WRITE, stream, addr, value, flags);
}

/* ---- events ---------------------------------------------------------------------------- */

static struct CUevent_st *event_resolve(CUevent h)
{
    for (struct CUevent_st *e = events; e; e = e->next)
        if (e == h)
            return e;
    return NULL;
}

FAKE_DECLARE(cuEventCreate);
static CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FAKE_ENTER(cuEventCreate);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned known =
        FAKE_CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | FAKE_CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known) ||
        ((Flags & FAKE_CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = Flags;
    e->refs = 1;
    pthread_mutex_lock(&fake_lock);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&fake_lock);
    *phEvent = e;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuEventRecord);
static CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    FAKE_ENTER(cuEventRecord);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUstream_st *s;
    uint64_t ticket;
    pthread_mutex_lock(&fake_lock);
    struct CUevent_st *e = event_resolve(hEvent);
    rc = e ? stream_resolve(hStream, 1, &s) : FAKE_CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        struct op *op = op_new(OP_EVENT);
        if (!op)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            op->event = e;
            op->seq = e->recorded + 1;
            rc = submit(s, op, &ticket);
        }
        if (rc == CUDA_SUCCESS) {
            e->recorded++;
            e->done = 0;
            e->lost = 0;
            e->marker = (struct dep){s->id, ticket};
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuEventQuery);
static CUresult cuEventQuery(CUevent hEvent)
{
    FAKE_ENTER(cuEventQuery);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct CUevent_st *e = event_resolve(hEvent);
    if (!e)
        rc = FAKE_CUDA_ERROR_INVALID_HANDLE;
    else if (e->recorded && !e->done)
        rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuEventSynchronize);
static CUresult cuEventSynchronize(CUevent hEvent)
{
    FAKE_ENTER(cuEventSynchronize);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct CUevent_st *e = event_resolve(hEvent);
    if (!e) {
        pthread_mutex_unlock(&fake_lock);
        return FAKE_CUDA_ERROR_INVALID_HANDLE;
    }
    /* Waits for the latest record at the time of the call (a later record ends the wait). */
    uint64_t record = e->recorded;
    e->refs++;
    while (record && e->recorded == record && !e->done && !e->lost)
        pthread_cond_wait(&fake_progress, &fake_lock);
    /* A marker dropped with its destroyed stream never completes; say so at once rather
     * than block forever as CUDA would. */
    if (record && e->recorded == record && e->lost)
        rc = CUDA_ERROR_NOT_READY;
    event_unref(e);
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuEventDestroy);
static CUresult cuEventDestroy(CUevent hEvent)
{
    FAKE_ENTER(cuEventDestroy);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct CUevent_st **at = &events;
    while (*at && *at != hEvent)
        at = &(*at)->next;
    if (*at) {
        struct CUevent_st *e = *at;
        *at = e->next;
        event_unref(e); /* markers in flight keep it until they run */
    } else
        rc = FAKE_CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

FAKE_DECLARE(cuStreamWaitEvent);
static CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FAKE_ENTER(cuStreamWaitEvent);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    uint64_t ticket;
    pthread_mutex_lock(&fake_lock);
    struct CUevent_st *e = event_resolve(hEvent);
    rc = e ? stream_resolve(hStream, 1, &s) : FAKE_CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && e->recorded) { /* an event never recorded is complete */
        struct op *op = op_new(OP_EVENT);
        if (!op)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            op->after = e->marker;
            rc = submit(s, op, &ticket);
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

CUresult fake_stream_call(CUstream h, void (*fn)(void *arg), void *arg, uint64_t *id)
{
    struct CUstream_st *s;
    uint64_t ticket;
    pthread_mutex_lock(&fake_lock);
    CUresult rc = stream_resolve(h, 1, &s);
    if (rc == CUDA_SUCCESS && id)
        *id = s->id;
    if (rc == CUDA_SUCCESS && fn) {
        struct op *op = op_new(OP_CALL);
        if (!op)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            op->call = fn;
            op->call_arg = arg;
            rc = submit(s, op, &ticket);
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

void fake_register_stream(fake_generic_fn *table)
{
    FAKE_REGISTER(table, cuMemcpy);
    FAKE_REGISTER(table, cuMemcpyAsync);
    FAKE_REGISTER(table, cuMemsetD32);
    FAKE_REGISTER(table, cuStreamCreate);
    FAKE_REGISTER(table, cuStreamDestroy);
    FAKE_REGISTER(table, cuStreamSynchronize);
    FAKE_REGISTER(table, cuStreamQuery);
    FAKE_REGISTER(table, cuStreamGetId);
    FAKE_REGISTER(table, cuStreamWaitValue32);
    FAKE_REGISTER(table, cuStreamWriteValue32);
    FAKE_REGISTER(table, cuEventCreate);
    FAKE_REGISTER(table, cuEventRecord);
    FAKE_REGISTER(table, cuEventQuery);
    FAKE_REGISTER(table, cuEventSynchronize);
    FAKE_REGISTER(table, cuEventDestroy);
    FAKE_REGISTER(table, cuStreamWaitEvent);
}
