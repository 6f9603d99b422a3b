/* The contract between the pool engine and a memory transport.
 *
 * A transport owns the pool's memory: the shared host segment (header, slot generations and,
 * unless they live on the device, the control words), the data region, and how consumers
 * reach them. One static const table per transport with every slot filled; an operation a
 * transport cannot do answers NOT_SUPPORTED. */
#ifndef FERRY_TRANSPORT_TRANSPORT_H
#define FERRY_TRANSPORT_TRANSPORT_H

#include <stdint.h>

#include "ferry.h"
#include "shm/segment.h"
#include "transport/mapping.h"

typedef struct ferry__pool_memory {
    uint8_t pool_id[16];  /* set by the engine before create: the pool's identity */
    ferry__shm shm;       /* the host segment and its layout (the producer's own) */
    uint32_t *control;    /* control table as the CPU reads it: the shared words, or a
                           * mirror refreshed by sync_control (device placement) */
    uint64_t data_start;  /* data offset inside the pool region */
    uint64_t memory_size; /* bytes of the pool region as allocated (CUDA VMM rounds the
                           * configured size down to its granularity) */
    int shared_fd;        /* the host segment's fd, handed to consumers by the broker */
    uint64_t shared_size; /* its size */
    int device;           /* GPU ordinal, -1 for host memory */
    uint8_t flags;        /* FERRY_DESC_FLAG_DEVICE_CONTROL when control is on the device */
    uint8_t handle[64];   /* what consumers need to open the pool's data (CUDA IPC) */
    void *priv;           /* transport state */
} ferry__pool_memory;

/* The pool's memory as consumers on other hosts read it (remote/remote.h): up to two regions
 * (the host segment; the device pool of a GPU pool), and where the control words and the
 * data lie in them. */
typedef struct ferry__memory_map {
    void *base[2];
    uint64_t size[2]; /* size[1] is 0 when there is no second region */
    int gpu[2];       /* the region is GPU memory (of mem->device) */
    int control_region, data_region;
    uint64_t control_offset, data_offset;
} ferry__memory_map;

/* view_track's rank for work of a rank the process holds for its life (never given back). */
#define FERRY__TRACK_ANY UINT32_MAX

/* Both sides of a transport: the producer's pool memory (ferry__pool_memory) and a consumer
 * process's mapping of the pool (ferry__mapped_pool, transport/mapping.h). */
typedef struct ferry__transport_ops {
    const char *name;      /* "host", "CUDA IPC", "CUDA VMM": used in messages */
    const char *pool_name; /* in "<pool_name> pool failed" / "... is closing" */
    ferry_backend backend;
    /* 1 if the pool's data is GPU memory (ferry_backend_uses_gpu). */
    int gpu;
    /* 1 if create rounds memory_size (the engine checks the control metadata afterwards). */
    int rounds_size;
    /* 1 if the control words may live in the device pool (FERRY_CONTROL_DEVICE). */
    int device_placement;
    /* Nanoseconds a publisher waiting for space sleeps at most between looks at the control
     * words: long where every acknowledgement wakes it (CPU acks bump a futex), short where
     * GPU streams write acknowledgements that wake nobody. */
    uint64_t space_poll_ns;
    /* Allocates and lays out the memory for a validated configuration; every control word
     * starts at config->initial_generation. Rolls back everything on failure. */
    ferry_status (*create)(const ferry_pool_config *config, uint64_t data_start,
                           ferry__pool_memory *mem);
    /* Releases everything create made. */
    void (*destroy)(ferry__pool_memory *mem);
    /* In a forked child: releases only what the child's copy of the process owns (its
     * mappings and file descriptors), touching no shared word, no device and no thread. */
    void (*forget)(ferry__pool_memory *mem);
    /* FERRY_OK while the transport's background parts are healthy; otherwise the first
     * failure's status, its message copied into cause. */
    ferry_status (*check)(ferry__pool_memory *mem, char *cause, size_t size);
    /* Copies n bytes from src to the data region at offset, ordered on stream (GPU) or at
     * once (host, stream must be NULL). */
    ferry_status (*copy_in)(ferry__pool_memory *mem, uint64_t offset, const void *src, uint64_t n,
                            void *stream);
    /* Writes a slot's ready word after what stream already holds, and wakes CPU waiters
     * where it can. */
    ferry_status (*mark_ready)(ferry__pool_memory *mem, uint64_t word, uint32_t generation,
                               void *stream);
    /* Writes count consecutive control words from first, now (cancel, dead consumers). */
    ferry_status (*write_words)(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                uint32_t value);
    /* Brings mem->control up to date before the CPU reads it. */
    ferry_status (*sync_control)(ferry__pool_memory *mem);
    /* Pointer to the data region at offset for a zero-copy writer (device pointer on GPUs). */
    ferry_status (*slice_ptr)(ferry__pool_memory *mem, uint64_t offset, void **ptr);
    /* The memory remote consumers read. */
    void (*memory_map)(const ferry__pool_memory *mem, ferry__memory_map *map);

    /* ---- consumer side: one mapping of the pool per consumer process ---- */
    /* Longest sleep of a CPU waiter between looks at a ready word (where producers wake
     * sleepers it is long; GPU streams wake nobody), and how long it yields first. */
    uint64_t ready_poll_ns;
    uint64_t ready_spin_ns;
    /* Checks a validated layout for this transport: NULL and *tail (the segment's bytes
     * after the header) if it is consistent, else why not. */
    const char *(*view_check)(const ferry__shm_layout *l, uint64_t *tail);
    /* The placement of the control words the layout describes. */
    const ferry__placement *(*view_placement)(const ferry__shm_layout *l);
    /* Once the segment is mapped and its layout known: what the process needs before it reads
     * (GPU pools: the segment registered with CUDA on device). Undone by view_detach, which
     * is also safe on a partial attach; a detach that must wait for streams still working on
     * the pool takes the segment mapping over (it sets p->base to NULL) and releases both
     * once that work has run. */
    ferry_status (*view_attach)(ferry__mapped_pool *p, int device);
    void (*view_detach)(ferry__mapped_pool *p);
    /* After work (a wait, a copy, an acknowledgement) was queued on stream by this thread,
     * for rank (FERRY__TRACK_ANY: one the process holds for its life): remembers it for
     * view_quiesce(rank) and for the release of the view (view_detach), which must not use
     * the stream handle itself (it may be destroyed by then). */
    void (*view_track)(ferry__mapped_pool *p, int device, uint32_t rank, void *stream);
    /* Waits, until deadline at most, for the tracked work for rank to run: OK (at once where
     * there is none), TIMEOUT where some has not run, SYSTEM where some could not be
     * tracked or its state cannot be told. */
    ferry_status (*view_quiesce)(ferry__mapped_pool *p, uint32_t rank, uint64_t deadline);
    /* Opens the pool's data for device (once per device; a CUDA VMM fd is asked of its broker
     * until deadline at most). */
    ferry_status (*view_map)(ferry__mapped_pool *p, int device, uint64_t deadline);
    /* Copies n bytes at data offset into dst now (device or host memory for GPU pools). */
    ferry_status (*view_copy_out)(ferry__mapped_pool *p, int device, uint64_t offset, void *dst,
                                  uint64_t n);
    /* The tensor's address at data offset, as device's work sees it. */
    ferry_status (*view_data)(ferry__mapped_pool *p, int device, uint64_t offset,
                              const void **data);
    /* Stream-ordered consuming: FERRY_OK where the transport can order work on streams. */
    ferry_status (*view_streams)(const ferry__mapped_pool *p);
    ferry_status (*view_enqueue_wait)(ferry__mapped_pool *p, int device, uint64_t word,
                                      uint32_t value, void *stream);
    ferry_status (*view_enqueue_copy)(ferry__mapped_pool *p, int device, uint64_t offset, void *dst,
                                      uint64_t n, void *stream);
    ferry_status (*view_enqueue_store)(ferry__mapped_pool *p, int device, uint64_t word,
                                       uint32_t value, void *stream);
} ferry__transport_ops;

extern const ferry__transport_ops ferry__host_transport;
extern const ferry__transport_ops ferry__cuda_ipc_transport;
extern const ferry__transport_ops ferry__cuda_vmm_transport;

/* The transport for a backend: NOT_SUPPORTED (with a message) for backends this build or
 * machine cannot serve. */
ferry_status ferry__transport_select(ferry_backend backend, const ferry__transport_ops **ops);

/* Breaks a CUDA VMM pool's POSIX FD broker (tests of the latched failure). */
struct ferry_pool;
int ferry__vmm_break_broker_for_tests(struct ferry_pool *pool);

/* The transport of a pool a consumer opens (the header's backend). */
ferry_status ferry__transport_of(uint32_t backend, const ferry__transport_ops **ops);

/* Shared pieces of the transports that keep control words in host memory. */
ferry_status ferry__segment_create(const char *transport, uint64_t size, int *fd, void **base);
void ferry__segment_layout(ferry__pool_memory *mem, void *base, const ferry_pool_config *config);
ferry_status ferry__host_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                     uint32_t value);
ferry_status ferry__host_sync_control(ferry__pool_memory *mem);
void ferry__fill_words(uint32_t *words, uint64_t count, uint32_t value);

#endif
