/* The fake CUDA driver's private declarations: shared by fake_cuda.c (entry table, fault
 * injection, devices, contexts), fake_mem.c (allocations, host registration, pointer
 * attributes, IPC), fake_stream.c (copies, streams, stream memory operations, events) and
 * fake_vmm.c (virtual memory management).
 *
 * Every cu* entry point is a static function of one of those files, with the parameter list
 * that driver.h's FERRY_CUDA_FUNCTIONS gives it (declared through fake_fn_<name>, so that a
 * definition that differs does not compile), and is reached only through
 * cuGetProcAddress_v2. Memory, stream and event state lives under one process-wide lock,
 * fake_lock; fake_progress is broadcast whenever a stream operation completes or something
 * pinned by stream work is released. */
#ifndef FERRY_FAKE_CUDA_H
#define FERRY_FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "driver/driver.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

/* Codes beyond cuda_api.h's that the fake returns (values of CUDA's cuda.h). */
enum {
    FAKE_CUDA_ERROR_INVALID_CONTEXT = 201,
    FAKE_CUDA_ERROR_INVALID_HANDLE = 400,
    FAKE_CUDA_ERROR_NOT_FOUND = 500,
    FAKE_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    FAKE_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
};

/* One identifier per entry point, in driver.h's order. */
enum fake_id {
#define FAKE_ID_(name, version, mandatory, params) FAKE_ID_##name,
    FERRY_CUDA_FUNCTIONS(FAKE_ID_)
#undef FAKE_ID_
        FAKE_ID_COUNT
};

/* The function type of every entry point, from driver.h's parameter lists. */
#define FAKE_TYPE_(name, version, mandatory, params) typedef CUresult fake_fn_##name params;
FERRY_CUDA_FUNCTIONS(FAKE_TYPE_)
#undef FAKE_TYPE_

/* Declares an entry point of this file with exactly driver.h's parameter list. */
#define FAKE_DECLARE(name) static fake_fn_##name name

/* Registers an entry point of this file in the table cuGetProcAddress_v2 answers from. */
typedef void (*fake_generic_fn)(void);
#define FAKE_REGISTER(table, name) ((table)[FAKE_ID_##name] = (fake_generic_fn)(name))
void fake_register_mem(fake_generic_fn *table);
void fake_register_stream(fake_generic_fn *table);
void fake_register_vmm(fake_generic_fn *table);
void fake_register_pool(fake_generic_fn *table);

/* The first thing every entry point does: counts the call, answers a failure injected for
 * it, and refuses every call in a fork()ed child of a process that initialised the driver
 * (as CUDA does). */
CUresult fake_enter(enum fake_id id);
#define FAKE_ENTER(name)                                                                           \
    do {                                                                                           \
        CUresult fake_enter_rc_ = fake_enter(FAKE_ID_##name);                                      \
        if (fake_enter_rc_ != CUDA_SUCCESS)                                                        \
            return fake_enter_rc_;                                                                 \
    } while (0)

/* CUDA_ERROR_NOT_INITIALIZED before cuInit. */
CUresult fake_need_init(void);
/* fake_need_init, then CUDA_ERROR_INVALID_CONTEXT without a current (retained) context;
 * *device (may be NULL) receives the current context's device. */
CUresult fake_need_context(int *device);
int fake_device_count(void);
/* Accounts a new allocation of size bytes on device against FERRY_FAKE_CUDA_MEMORY (under
 * fake_lock): CUDA_ERROR_OUT_OF_MEMORY beyond it. fake_unreserve_bytes gives them back. */
CUresult fake_reserve_bytes(int device, size_t size);
void fake_unreserve_bytes(int device, size_t size);

/* Writes a message to stderr, prefixed with "ferry fake CUDA: ". */
void fake_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

extern pthread_mutex_t fake_lock;
extern pthread_cond_t fake_progress;

/* ---- memory regions (fake_mem.c), all under fake_lock ---------------------------------- */

enum fake_kind {
    FAKE_ALLOC = 1,     /* cuMemAlloc: a memfd of this process */
    FAKE_IPC = 2,       /* cuIpcOpenMemHandle: another process's allocation */
    FAKE_HOSTREG = 4,   /* cuMemHostRegister: the caller's host memory */
    FAKE_VMM = 8,       /* cuMemMap: a mapped allocation handle */
    FAKE_RESERVED = 16, /* cuMemAddressReserve: address space, mapped or not */
    FAKE_POOLED = 32    /* cuMemAllocFromPoolAsync: a block of a memory pool */
};
#define FAKE_DEVICE_MEMORY (FAKE_ALLOC | FAKE_IPC | FAKE_VMM | FAKE_POOLED)

struct fake_vmm_handle;
struct CUmemPoolHandle_st;

struct fake_region {
    struct fake_region *next;
    enum fake_kind kind;
    char *base;
    size_t size;
    int device;
    unsigned pending; /* stream operations that use it and have not run yet */
    int dying;        /* being released: no new use */
    int fd;           /* FAKE_ALLOC: the memfd (kept open for IPC) */
    int accessible;   /* FAKE_VMM: cuMemSetAccess gave read or write access */
    unsigned flags;   /* FAKE_HOSTREG: the registration flags */
    /* FAKE_IPC: the exporter's (pid, fd, inode) and the opens not yet closed; FAKE_ALLOC:
     * ipc_ino is the memfd's inode */
    pid_t ipc_pid;
    int ipc_fd;
    uint64_t ipc_ino;
    unsigned ipc_refs;
    struct fake_vmm_handle *handle;  /* FAKE_VMM */
    struct CUmemPoolHandle_st *pool; /* FAKE_POOLED: its pool */
    int pool_free;                   /* FAKE_POOLED: freed; the pool may hand it out again */
    uint64_t free_token;             /* FAKE_POOLED: names the latest cuMemFreeAsync */
    uint64_t free_stream;            /* FAKE_POOLED: the stream of that free */
    unsigned free_calls;             /* FAKE_POOLED: frees queued and not run yet */
};

/* The region of one of kinds that contains address p, or NULL. */
struct fake_region *fake_region_at(uintptr_t p, unsigned kinds);
/* A region of one of kinds that overlaps [p, p + n), or NULL. */
struct fake_region *fake_region_overlapping(uintptr_t p, size_t n, unsigned kinds);
/* The region after r (NULL: the first) of one of kinds, or NULL. */
struct fake_region *fake_region_next(struct fake_region *r, unsigned kinds);
/* A new region, zeroed but for kind, base and size, linked into the registry; NULL when out
 * of memory. */
struct fake_region *fake_region_add(enum fake_kind kind, void *base, size_t size);
/* Unlinks and frees r (its mapping is the caller's business). */
void fake_region_remove(struct fake_region *r);
/* Waits until no pending stream operation uses r; warns on stderr if that takes long. */
void fake_region_drain(struct fake_region *r, const char *call);
/* Checks that [p, p + n) may be read or written by a copy: inside one device-accessible
 * region or pageable host memory (*region = NULL). CUDA_ERROR_INVALID_VALUE for NULL, for a
 * span that runs out of its region or lies in unmapped reserved address space;
 * CUDA_ERROR_ILLEGAL_ADDRESS for a VMM mapping without access. */
CUresult fake_check_span(uintptr_t p, size_t n, struct fake_region **region);
/* Counts live resources, for ferry_fake_cuda_live_allocations (under fake_lock): blocks a
 * memory pool holds count while allocated, until their stream-ordered free has run. */
int fake_live_regions(void);
int fake_live_vmm_handles(void);

/* ---- streams (fake_stream.c) ----------------------------------------------------------- */

/* Enqueues fn(arg) on stream h (NULL: the legacy stream), run by its worker under fake_lock
 * after the work queued before it (also when that work is given up: the stream destroyed). A
 * NULL fn checks that h names a stream and enqueues nothing. *id (may be NULL) gets the
 * stream's identity. */
CUresult fake_stream_call(CUstream h, void (*fn)(void *arg), void *arg, uint64_t *id);

#endif
