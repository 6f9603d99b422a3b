/* The consumer side of the GPU transports (CUDA IPC and CUDA VMM): the host segment
 * registered with CUDA once per process, the pool opened once per process and device, on the
 * consumer's own device with lazy peer access (no context is ever made on the producer's
 * GPU), and the control words in the device pool (the device placement, both sides). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "broker/broker.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/error.h"
#include "driver/driver.h"
#include "transport/cuda_pool.h"

/* Events a view keeps behind the latest work of each stream on the pool: one per stream for
 * the ranks the process holds for its life, one per stream and rank for the others (what
 * giving that rank back waits for). */
#define FERRY_VIEW_TRACKED 64
/* The stream id of an entry that two streams joined: no later call records it alone. */
#define FERRY_JOINED_STREAMS (~0ull)

/* The event behind the latest work a stream was given on the pool for a rank (work on one
 * stream runs in order): what releasing the view, and giving a lent rank back, wait for.
 * No stream handle is kept: the caller may destroy its stream once the work is queued, and
 * CUDA may crash on a destroyed stream's handle. */
typedef struct tracked {
    CUevent event;                /* made in the context of device */
    unsigned long long stream_id; /* cuStreamGetId: never another stream's, as a handle may be */
    uint32_t rank;                /* a rank that may be given back, or FERRY__TRACK_ANY */
    int device;
    int used;
} tracked;

/* A view whose streams may still run work on it (a copy, a wait on a ready word, an
 * acknowledgement): released once events recorded behind that work have completed. */
typedef struct deferred {
    struct deferred *next;
    struct cuda_view *g;
    uint32_t backend;
    uint64_t memory_size;
    void *segment; /* the host segment mapping, unmapped last */
    uint64_t segment_size;
    CUevent events[FERRY_VIEW_TRACKED];
    int devices[FERRY_VIEW_TRACKED]; /* whose context made each event */
    int nevents;
} deferred;

typedef struct cuda_view {
    const ferry__cuda *cuda;
    pthread_mutex_t lock;                           /* guards base[] while opening */
    int registered;                                 /* the segment is registered with CUDA */
    int device;                                     /* the device whose context registered it */
    CUdeviceptr segment_dev;                        /* its device address */
    CUdeviceptr base[FERRY_MAX_DEVICES];            /* the pool opened on each device, 0 if not */
    ferry__cuda_local *borrowed[FERRY_MAX_DEVICES]; /* base is the producer's own mapping */
    CUmemGenericAllocationHandle vmm[FERRY_MAX_DEVICES]; /* CUDA VMM: imported handles */
    CUstream io[FERRY_MAX_DEVICES]; /* device placement: CPU access to the words, per device */
    /* Stream work queued on the pool (ferry__cuda_view_track); untracked: per rank, some of
     * it could not be tracked. Guarded by lock. */
    tracked tracked[FERRY_VIEW_TRACKED];
    uint8_t *untracked;
    int untracked_all; /* work of some rank untracked where no per-rank table could be had */
    int uncovered;     /* some work is behind no event: the view is never released */
    struct cuda_view *kept_next; /* on the list of views kept for good */
    deferred *spare; /* the record of its deferred release, made with the view */
} cuda_view;

static cuda_view *view_of(const ferry__mapped_pool *p)
{
    return p->priv;
}

/* Calls that reach gpu_map after their pool was opened give the VMM broker this long. */
#define FERRY_VMM_BROKER_TIMEOUT_NS 5000000000ull

static int device_control(const ferry__mapped_pool *p)
{
    return p->place == &ferry__device_placement;
}

static ferry_status check_device(int device)
{
    if (device < 0 || device >= FERRY_MAX_DEVICES)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "a GPU pool needs a consumer on a device (ferry_consumer_create_on), "
                           "got device %d",
                           device);
    return FERRY_OK;
}

/* Streams wait on and write the control words in this process's mapping of them: the
 * segment is registered with CUDA once, with device's context current. */
static ferry_status register_segment(ferry__mapped_pool *p, cuda_view *g, int device)
{
    FERRY_CU_TRY(g->cuda, cuMemHostRegister,
                 (p->base, p->size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    g->registered = 1;
    g->device = device;
    FERRY_CU_TRY(g->cuda, cuMemHostGetDevicePointer, (&g->segment_dev, p->base, 0));
    return FERRY_OK;
}

/* The driver and (host placement) the registered segment, on first use on a device. A
 * consumer on no device (acknowledging on behalf, host control words) never gets here. */
static ferry_status prepare_locked(ferry__mapped_pool *p, cuda_view *g, int device)
{
    ferry_status st = FERRY_OK;
    if (!g->cuda && (st = ferry__cuda_get(&g->cuda)) != FERRY_OK) {
        g->cuda = NULL;
        return ferry__fail_wrap(st, "opening a GPU pool needs the CUDA driver");
    }
    st = ferry__cuda_use_device(g->cuda, device); /* registering needs a current context */
    if (st == FERRY_OK && !device_control(p) && !g->registered)
        st = register_segment(p, g, device);
    return st;
}

ferry_status ferry__cuda_view_attach(ferry__mapped_pool *p, int device)
{
    if (device >= FERRY_MAX_DEVICES)
        return check_device(device);
    cuda_view *g = calloc(1, sizeof(*g));
    if (g && !(g->spare = calloc(1, sizeof(*g->spare)))) {
        free(g);
        g = NULL;
    }
    if (!g)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory opening a GPU pool");
    pthread_mutex_init(&g->lock, NULL);
    g->device = -1;
    p->priv = g;
    if (device < 0)
        return FERRY_OK; /* the device is prepared on the first use that needs one */
    pthread_mutex_lock(&g->lock);
    ferry_status st = prepare_locked(p, g, device);
    pthread_mutex_unlock(&g->lock);
    return st;
}

static ferry_status open_ipc(ferry__mapped_pool *p, CUdeviceptr *base)
{
    const ferry__cuda *cuda = view_of(p)->cuda;
    CUipcMemHandle h;
    memcpy(&h, p->handle, sizeof(h));
    CUresult rc = cuda->cuIpcOpenMemHandle(base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (rc != CUDA_SUCCESS) {
        /* A stale mapping of a dead producer's pool can stand in the way: drop the cache's
         * pools whose producer is gone, then try once more. */
        ferry__cache_sweep();
        rc = cuda->cuIpcOpenMemHandle(base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    }
    if (rc != CUDA_SUCCESS)
        return ferry__cuda_fail(cuda, "cuIpcOpenMemHandle", rc);
    return FERRY_OK;
}

/* CUDA VMM: the allocation handle, from the FABRIC bytes or the broker's POSIX fd. */
static ferry_status import_vmm(ferry__mapped_pool *p, uint64_t deadline,
                               CUmemGenericAllocationHandle *h)
{
    const ferry__cuda *cuda = view_of(p)->cuda;
    if (p->flags & FERRY_DESC_FLAG_FABRIC) {
        FERRY_CU_TRY(cuda, cuMemImportFromShareableHandle,
                     (h, p->handle, CU_MEM_HANDLE_TYPE_FABRIC));
        return FERRY_OK;
    }
    int fd;
    uint64_t size;
    pid_t pid;
    uint64_t now = ferry__now_ns();
    ferry_status st = ferry__broker_request(p->handle, p->pool_id, "CUDA VMM POSIX FD broker",
                                            deadline > now ? deadline - now : 0, &fd, &size, &pid);
    if (st != FERRY_OK)
        return st;
    CUresult rc = cuda->cuMemImportFromShareableHandle(h, (void *)(intptr_t)fd,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (rc != CUDA_SUCCESS)
        return ferry__cuda_fail(cuda, "cuMemImportFromShareableHandle", rc);
    return FERRY_OK;
}

/* Reserves a range, maps h into it and lets device read and write it; undone on failure. */
static ferry_status map_range(const ferry__cuda *cuda, CUmemGenericAllocationHandle h,
                              uint64_t size, size_t granularity, int device, CUdeviceptr *out)
{
    CUdeviceptr va = 0;
    FERRY_CU_TRY(cuda, cuMemAddressReserve, (&va, size, granularity, 0, 0));
    CUresult rc = cuda->cuMemMap(va, size, 0, h, 0);
    if (rc != CUDA_SUCCESS) {
        cuda->cuMemAddressFree(va, size);
        return ferry__cuda_fail(cuda, "cuMemMap", rc);
    }
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = cuda->cuMemSetAccess(va, size, &access, 1);
    if (rc != CUDA_SUCCESS) {
        cuda->cuMemUnmap(va, size);
        cuda->cuMemAddressFree(va, size);
        return ferry__cuda_fail(cuda, "cuMemSetAccess", rc);
    }
    *out = va;
    return FERRY_OK;
}

/* CUDA VMM: imports the pool and maps it on the consumer's device. */
static ferry_status open_vmm(ferry__mapped_pool *p, int device, uint64_t deadline,
                             CUdeviceptr *base)
{
    const ferry__cuda *cuda = view_of(p)->cuda;
    if (!cuda->cuMemCreate)
        return ferry__fail(FERRY_NOT_SUPPORTED, "CUDA VMM: this driver has no VMM entry points");
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, device}};
    size_t g;
    CUmemGenericAllocationHandle h;
    FERRY_CU_TRY(cuda, cuMemGetAllocationGranularity,
                 (&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    ferry_status st = import_vmm(p, deadline, &h);
    if (st == FERRY_OK && (st = map_range(cuda, h, p->memory_size, g, device, base)) != FERRY_OK)
        cuda->cuMemRelease(h);
    if (st == FERRY_OK)
        view_of(p)->vmm[device] = h;
    return st;
}

/* A consumer in the producer's own process reads the producer's mapping: CUDA refuses to
 * open a process's own IPC handle, and importing its own VMM allocation would map it twice.
 * A CUDA VMM mapping is made accessible from the consumer's device too. */
static ferry_status borrow_local(ferry__mapped_pool *p, int device, ferry__cuda_local *l,
                                 CUdeviceptr local_base, uint64_t size, int owner_device,
                                 CUdeviceptr *base)
{
    if (p->backend == FERRY_BACKEND_CUDA_VMM && device != owner_device) {
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                                  CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUresult rc = view_of(p)->cuda->cuMemSetAccess(local_base, size, &access, 1);
        if (rc != CUDA_SUCCESS) {
            ferry__cuda_local_put(l);
            return ferry__cuda_fail(view_of(p)->cuda, "cuMemSetAccess", rc);
        }
    }
    *base = local_base;
    view_of(p)->borrowed[device] = l;
    return FERRY_OK;
}

static ferry_status open_handle(ferry__mapped_pool *p, int device, uint64_t deadline,
                                CUdeviceptr *base)
{
    ferry__cuda_local *local;
    CUdeviceptr local_base;
    uint64_t size;
    int owner;
    if (ferry__cuda_local_find(p->pool_id, &local, &local_base, &size, &owner))
        return borrow_local(p, device, local, local_base, size, owner, base);
    return p->backend == FERRY_BACKEND_CUDA_VMM ? open_vmm(p, device, deadline, base)
                                                : open_ipc(p, base);
}

ferry_status ferry__cuda_view_map(ferry__mapped_pool *p, int device, uint64_t deadline)
{
    ferry_status st = check_device(device);
    if (st != FERRY_OK)
        return st;
    cuda_view *g = view_of(p);
    if (__atomic_load_n(&g->base[device], __ATOMIC_ACQUIRE))
        return ferry__cuda_use_device(g->cuda, device);
    pthread_mutex_lock(&g->lock);
    st = prepare_locked(p, g, device);
    if (st == FERRY_OK && !g->base[device]) {
        CUdeviceptr base = 0;
        st = open_handle(p, device, deadline, &base);
        if (st == FERRY_OK)
            __atomic_store_n(&g->base[device], base, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g->lock);
    return st;
}

/* ---- releasing a view: only once the streams that used it have run ------------------------ */

static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static deferred *deferred_head;
static struct cuda_view *kept_head; /* views kept for good (their work untracked) */
static pthread_once_t deferred_once = PTHREAD_ONCE_INIT;

/* A forked child has none of its parent's streams or mappings' CUDA state. */
static void deferred_after_fork(void)
{
    pthread_mutex_init(&deferred_lock, NULL);
    deferred_head = NULL;
}

static void deferred_init(void)
{
    pthread_atfork(NULL, NULL, deferred_after_fork);
}

static void release_view(cuda_view *g, uint32_t backend, uint64_t memory_size, void *segment)
{
    for (int d = 0; d < FERRY_MAX_DEVICES; d++) {
        if (!g->base[d] || ferry__cuda_use_device(g->cuda, d) != FERRY_OK)
            continue;
        if (g->io[d])
            g->cuda->cuStreamDestroy(g->io[d]);
        if (g->borrowed[d]) {
            ferry__cuda_local_put(g->borrowed[d]); /* the last borrower frees a left pool */
            continue;
        }
        if (backend == FERRY_BACKEND_CUDA_VMM) {
            g->cuda->cuMemUnmap(g->base[d], memory_size);
            g->cuda->cuMemAddressFree(g->base[d], memory_size);
            g->cuda->cuMemRelease(g->vmm[d]);
        } else {
            g->cuda->cuIpcCloseMemHandle(g->base[d]);
        }
    }
    if (g->registered && ferry__cuda_use_device(g->cuda, g->device) == FERRY_OK)
        g->cuda->cuMemHostUnregister(segment);
    for (int i = 0; i < FERRY_VIEW_TRACKED; i++)
        if (g->tracked[i].used && ferry__cuda_use_device(g->cuda, g->tracked[i].device) == FERRY_OK)
            g->cuda->cuEventDestroy(g->tracked[i].event);
    free(g->untracked);
    free(g->spare);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* Moves the events behind the view's stream work into r, but those whose work has run (1 if
 * any is left). An event whose context cannot be made current is kept: whether its work
 * ran cannot be told. A failed look counts as run, as in release_deferred. */
static int take_pending(cuda_view *g, deferred *r)
{
    for (int i = 0; i < FERRY_VIEW_TRACKED; i++) {
        tracked *e = &g->tracked[i];
        if (!e->used)
            continue;
        e->used = 0;
        int current = ferry__cuda_use_device(g->cuda, e->device) == FERRY_OK;
        if (!current || g->cuda->cuEventQuery(e->event) == CUDA_ERROR_NOT_READY) {
            r->devices[r->nevents] = e->device;
            r->events[r->nevents++] = e->event;
        } else {
            g->cuda->cuEventDestroy(e->event);
        }
    }
    return r->nevents > 0;
}

/* Releases the deferred views whose streams have run (every view release looks). */
static void release_deferred(void)
{
    deferred *done = NULL;
    pthread_mutex_lock(&deferred_lock);
    for (deferred **pp = &deferred_head; *pp;) {
        deferred *r = *pp;
        int ready = 1;
        for (int i = 0; i < r->nevents && ready; i++)
            ready = ferry__cuda_use_device(r->g->cuda, r->devices[i]) == FERRY_OK &&
                    r->g->cuda->cuEventQuery(r->events[i]) != CUDA_ERROR_NOT_READY;
        if (ready) {
            *pp = r->next;
            r->next = done;
            done = r;
        } else {
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&deferred_lock);
    while (done) {
        deferred *next = done->next;
        for (int i = 0; i < done->nevents; i++)
            if (ferry__cuda_use_device(done->g->cuda, done->devices[i]) == FERRY_OK)
                done->g->cuda->cuEventDestroy(done->events[i]);
        release_view(done->g, done->backend, done->memory_size, done->segment);
        munmap(done->segment, done->segment_size);
        free(done); /* the view's spare record: release_view left it */
        done = next;
    }
}

void ferry__cuda_view_detach(ferry__mapped_pool *p)
{
    cuda_view *g = view_of(p);
    pthread_once(&deferred_once, deferred_init);
    if (g && g->uncovered) {
        /* Some of its stream work is behind no event: nothing tells when it has run. */
        ferry__log(FERRY_LOG_WARN, "a GPU pool's mapping stays in this process for good: some "
                                   "stream work on it could not be tracked");
        pthread_mutex_lock(&deferred_lock);
        g->kept_next = kept_head;
        kept_head = g;
        pthread_mutex_unlock(&deferred_lock);
        p->base = NULL; /* the segment mapping stays too */
        p->priv = NULL;
    } else if (g) {
        deferred *r = g->spare;
        if (take_pending(g, r)) {
            /* The view and the segment mapping are the deferred release's from here. */
            g->spare = NULL;
            r->g = g;
            r->backend = p->backend;
            r->memory_size = p->memory_size;
            r->segment = p->base;
            r->segment_size = p->size;
            p->base = NULL;
            pthread_mutex_lock(&deferred_lock);
            r->next = deferred_head;
            deferred_head = r;
            pthread_mutex_unlock(&deferred_lock);
        } else {
            release_view(g, p->backend, p->memory_size, p->base);
        }
        p->priv = NULL;
    }
    release_deferred();
}

/* Work queued that no event stands behind: the view is never released, and a lent rank's
 * give-back is refused (the rank stays this process's until it exits). Under g->lock. */
static void uncovered(cuda_view *g, uint32_t rank)
{
    g->uncovered = 1;
    if (rank != FERRY__TRACK_ANY)
        g->untracked[rank] = 1;
}

/* The entry for (rank, device, id), a new one, or NULL (the table is full of work that has
 * not run). Under g->lock, in device's context. */
static tracked *track_entry(cuda_view *g, uint32_t rank, int device, unsigned long long id)
{
    tracked *free_entry = NULL;
    for (int i = 0; i < FERRY_VIEW_TRACKED; i++) {
        tracked *e = &g->tracked[i];
        if (!e->used)
            free_entry = free_entry ? free_entry : e;
        else if (e->rank == rank && e->device == device && e->stream_id == id)
            return e;
    }
    /* None free: one whose work has run (its stream is done with). */
    for (int i = 0; i < FERRY_VIEW_TRACKED && !free_entry; i++) {
        tracked *e = &g->tracked[i];
        if (ferry__cuda_use_device(g->cuda, e->device) == FERRY_OK &&
            g->cuda->cuEventQuery(e->event) == CUDA_SUCCESS) {
            g->cuda->cuEventDestroy(e->event);
            e->used = 0;
            free_entry = e;
        }
    }
    CUevent ev;
    if (!free_entry || ferry__cuda_use_device(g->cuda, device) != FERRY_OK ||
        g->cuda->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    *free_entry = (tracked){.event = ev, .stream_id = id, .rank = rank, .device = device, .used = 1};
    return free_entry;
}

/* Recorded by the thread that queued the work, right after it, per stream as its id names it
 * (a handle may name another stream once its own is destroyed; the per-thread default stream
 * is each thread's own), so that a stream destroyed before the view is released or the rank
 * given back is covered as well. With the table full of work that has not run, the stream
 * joins an entry of the same device: it waits for that entry's event, which is then recorded
 * behind both and never again behind one stream alone. */
void ferry__cuda_view_track(ferry__mapped_pool *p, int device, uint32_t rank, void *stream)
{
    cuda_view *g = view_of(p);
    CUstream s = (CUstream)stream;
    /* The work was queued in device's context; the event is made and recorded there. */
    unsigned long long id = 0;
    int ok = ferry__cuda_use_device(g->cuda, device) == FERRY_OK &&
             g->cuda->cuStreamGetId(s, &id) == CUDA_SUCCESS;
    pthread_mutex_lock(&g->lock);
    if (!g->untracked && !(g->untracked = calloc(p->consumers, 1))) {
        /* No per-rank table: the work is waited for here, or every give-back refused and
         * the view kept. */
        if (!ok || g->cuda->cuStreamSynchronize(s) != CUDA_SUCCESS)
            g->untracked_all = g->uncovered = 1;
        pthread_mutex_unlock(&g->lock);
        return;
    }
    tracked *t = ok ? track_entry(g, rank, device, id) : NULL;
    /* Joins an entry of its rank, or (a rank that may be given back) one of ranks held for
     * life, which then stands for this rank too. */
    for (int pass = 0; ok && !t && pass < 2; pass++)
        for (int i = 0; !t && i < FERRY_VIEW_TRACKED; i++) {
            tracked *e = &g->tracked[i];
            uint32_t want = pass == 0 ? rank : FERRY__TRACK_ANY;
            if (e->used && e->rank == want && e->device == device &&
                ferry__cuda_use_device(g->cuda, device) == FERRY_OK &&
                g->cuda->cuStreamWaitEvent(s, e->event, 0) == CUDA_SUCCESS) {
                t = e;
                t->rank = rank;
                t->stream_id = FERRY_JOINED_STREAMS;
            }
        }
    if (!t || ferry__cuda_use_device(g->cuda, device) != FERRY_OK ||
        g->cuda->cuEventRecord(t->event, s) != CUDA_SUCCESS)
        uncovered(g, rank);
    pthread_mutex_unlock(&g->lock);
}

ferry_status ferry__cuda_view_quiesce(ferry__mapped_pool *p, uint32_t rank, uint64_t deadline)
{
    cuda_view *g = view_of(p);
    if (!g)
        return FERRY_OK;
    for (;;) {
        int pending = 0, untracked = 0;
        CUresult failed = CUDA_SUCCESS;
        pthread_mutex_lock(&g->lock);
        untracked = g->untracked_all || (g->untracked && g->untracked[rank]);
        for (int i = 0; i < FERRY_VIEW_TRACKED && !untracked; i++) {
            tracked *e = &g->tracked[i];
            if (!e->used || e->rank != rank)
                continue;
            CUresult rc = ferry__cuda_use_device(g->cuda, e->device) == FERRY_OK
                              ? g->cuda->cuEventQuery(e->event)
                              : CUDA_ERROR_NOT_INITIALIZED;
            if (rc == CUDA_SUCCESS) {
                g->cuda->cuEventDestroy(e->event);
                e->used = 0;
            } else if (rc == CUDA_ERROR_NOT_READY) {
                pending++;
            } else {
                failed = rc;
            }
        }
        pthread_mutex_unlock(&g->lock);
        if (untracked)
            return ferry__fail(FERRY_SYSTEM,
                               "stream work for rank %u could not be tracked (no "
                               "event could be recorded behind it)",
                               rank);
        if (failed != CUDA_SUCCESS)
            return ferry__fail(FERRY_SYSTEM,
                               "cannot tell whether rank %u's stream work has run (cuEventQuery "
                               "failed: %d)",
                               rank, (int)failed);
        if (!pending)
            return FERRY_OK;
        if (ferry__now_ns() >= deadline)
            return ferry__fail(FERRY_TIMEOUT,
                               "copies or acknowledgements for rank %u queued on %d streams have "
                               "not run after the wait for them",
                               rank, pending);
        struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
    }
}

/* The device address of a control word, as the consumer's device sees it. */
static ferry_status word_address(ferry__mapped_pool *p, int device, uint64_t word,
                                 CUdeviceptr *addr)
{
    ferry_status st = ferry__cuda_view_map(p, device, ferry__deadline(FERRY_VMM_BROKER_TIMEOUT_NS));
    if (st != FERRY_OK)
        return st;
    cuda_view *g = view_of(p);
    if (device_control(p))
        *addr = g->base[device] + word * sizeof(uint32_t);
    else
        *addr = g->segment_dev + p->shm.layout.header_bytes + word * sizeof(uint32_t);
    return FERRY_OK;
}

/* ---- control words in the device pool: the device placement ---------------------------- */

static ferry_status device_open(ferry__mapped_pool *p)
{
    p->my_acks = calloc((size_t)p->max_inflight * p->consumers, sizeof(uint32_t));
    if (!p->my_acks)
        return ferry__fail(FERRY_NO_MEMORY, "out of memory opening a pool");
    return FERRY_OK;
}

static void device_close(ferry__mapped_pool *p)
{
    free(p->my_acks);
    p->my_acks = NULL;
}

/* The device's stream for CPU access to the words, made on first use (word_address made the
 * device's context current). */
static ferry_status io_stream(ferry__mapped_pool *p, int device, CUstream *io)
{
    cuda_view *g = view_of(p);
    ferry_status st = FERRY_OK;
    pthread_mutex_lock(&g->lock);
    if (!g->io[device])
        st = ferry__cuda_io_stream(g->cuda, &g->io[device]);
    *io = g->io[device];
    pthread_mutex_unlock(&g->lock);
    return st;
}

static ferry_status device_load(ferry__mapped_pool *p, int device, uint64_t word, uint32_t *value)
{
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    uint32_t v;
    CUstream io;
    st = io_stream(p, device, &io);
    if (st == FERRY_OK)
        st = ferry__cuda_words_read(view_of(p)->cuda, io, &v, addr, sizeof(v));
    if (st == FERRY_OK)
        *value = v;
    return st;
}

/* Reading the word would cost a device round trip: this process's own record instead (an
 * acknowledgement another process wrote for the rank is not seen here). */
static ferry_status device_load_ack(ferry__mapped_pool *p, int device, uint32_t slot, uint32_t rank,
                                    uint32_t *value)
{
    (void)device;
    *value = ferry__load_acquire32(&p->my_acks[(uint64_t)slot * p->consumers + rank]);
    return FERRY_OK;
}

static ferry_status device_replace(ferry__mapped_pool *p, int device, uint64_t word,
                                   uint32_t *expected, uint32_t value, int *done)
{
    (void)expected;
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    CUstream io;
    if (st == FERRY_OK)
        st = io_stream(p, device, &io);
    if (st == FERRY_OK)
        st = ferry__cuda_words_write(view_of(p)->cuda, io, addr, 1, value);
    if (st == FERRY_OK)
        *done = 1;
    return st;
}

static void device_note_ack(ferry__mapped_pool *p, uint32_t slot, uint32_t rank, uint32_t gen)
{
    ferry__store_release32(&p->my_acks[(uint64_t)slot * p->consumers + rank], gen);
}

static int device_seen(const ferry__mapped_pool *p, uint64_t word, uint32_t value)
{
    (void)p;
    (void)word;
    (void)value;
    return 0; /* only a device read could tell */
}

static void device_sleep(ferry__mapped_pool *p, uint64_t word, uint32_t seen, uint64_t ns)
{
    (void)p;
    (void)word;
    (void)seen;
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

const ferry__placement ferry__device_placement = {
    .name = "device",
    .open = device_open,
    .close = device_close,
    .load = device_load,
    .load_ack = device_load_ack,
    .replace = device_replace,
    .replace_compares = 0,
    .note_ack = device_note_ack,
    .seen = device_seen,
    .sleep = device_sleep,
    .write_words = ferry__cuda_device_write_words,
    .sync = ferry__cuda_device_sync,
};

/* ---- the rest of the consumer side ------------------------------------------------------ */

const char *ferry__cuda_view_check(const ferry__shm_layout *l, uint64_t *tail)
{
    if (l->device < 0)
        return "placement differs";
    *tail = (l->desc_flags & FERRY_DESC_FLAG_DEVICE_CONTROL) ? 0 : l->data_start;
    return NULL;
}

const ferry__placement *ferry__cuda_view_placement(const ferry__shm_layout *l)
{
    return (l->desc_flags & FERRY_DESC_FLAG_DEVICE_CONTROL) ? &ferry__device_placement
                                                            : &ferry__host_placement;
}

ferry_status ferry__cuda_view_streams(const ferry__mapped_pool *p)
{
    (void)p;
    return FERRY_OK;
}

ferry_status ferry__cuda_view_data(ferry__mapped_pool *p, int device, uint64_t offset,
                                   const void **data)
{
    ferry_status st = ferry__cuda_view_map(p, device, ferry__deadline(FERRY_VMM_BROKER_TIMEOUT_NS));
    if (st != FERRY_OK)
        return st;
    *data = (const void *)(uintptr_t)(view_of(p)->base[device] + p->shm.layout.data_start + offset);
    return FERRY_OK;
}

ferry_status ferry__cuda_view_copy_out(ferry__mapped_pool *p, int device, uint64_t offset,
                                       void *dst, uint64_t n)
{
    const void *src;
    ferry_status st = ferry__cuda_view_data(p, device, offset, &src);
    if (st != FERRY_OK || n == 0)
        return st;
    FERRY_CU_TRY(view_of(p)->cuda, cuMemcpy,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n));
    return FERRY_OK;
}

ferry_status ferry__cuda_view_enqueue_wait(ferry__mapped_pool *p, int device, uint64_t word,
                                           uint32_t value, void *stream)
{
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(view_of(p)->cuda, cuStreamWaitValue32,
                 ((CUstream)stream, addr, value, CU_STREAM_WAIT_VALUE_GEQ));
    return FERRY_OK;
}

ferry_status ferry__cuda_view_enqueue_copy(ferry__mapped_pool *p, int device, uint64_t offset,
                                           void *dst, uint64_t n, void *stream)
{
    const void *src;
    ferry_status st = ferry__cuda_view_data(p, device, offset, &src);
    if (st != FERRY_OK || n == 0)
        return st;
    FERRY_CU_TRY(view_of(p)->cuda, cuMemcpyAsync,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream));
    return FERRY_OK;
}

ferry_status ferry__cuda_view_enqueue_store(ferry__mapped_pool *p, int device, uint64_t word,
                                            uint32_t value, void *stream)
{
    CUdeviceptr addr;
    ferry_status st = word_address(p, device, word, &addr);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(view_of(p)->cuda, cuStreamWriteValue32,
                 ((CUstream)stream, addr, value, CU_STREAM_WRITE_VALUE_DEFAULT));
    return FERRY_OK;
}
