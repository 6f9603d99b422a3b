/* What the GPU transports share: the host segment (header, generations and, by default, the
 * control words), the control placement, and the stream-ordered data path. A transport
 * (cuda_ipc.c, cuda_vmm.c) only allocates, exports and releases the device memory. */
#ifndef FERRY_TRANSPORT_CUDA_POOL_H
#define FERRY_TRANSPORT_CUDA_POOL_H

#include "driver/driver.h"
#include "transport/transport.h"

typedef struct ferry__cuda_pool {
    const ferry__cuda *cuda;
    const char *transport; /* "CUDA IPC", "CUDA VMM" */
    int device;
    int device_control;      /* control words in the device pool */
    CUdeviceptr base;        /* the pool region on the producer's device */
    void *segment;           /* host segment */
    int registered;          /* segment registered with CUDA */
    CUdeviceptr control_dev; /* device address of control word 0 */
    uint64_t control_words;
    uint32_t *mirror; /* device placement: what the CPU last read of the table */
    void *backend;    /* the transport's own state */
    int local;        /* registered among this process's pools */
} ferry__cuda_pool;

/* Loads the driver and makes the pool's device current; fills c (cuda, transport, device,
 * placement) and mem's segment size. */
ferry_status ferry__cuda_pool_init(ferry__cuda_pool *c, const char *transport,
                                   const ferry_pool_config *config, uint64_t data_start,
                                   ferry__pool_memory *mem);

/* Once c->base exists: creates the host segment and places the control words. */
ferry_status ferry__cuda_pool_place(ferry__cuda_pool *c, const ferry_pool_config *config,
                                    ferry__pool_memory *mem);

/* Releases what init and place made (not the device memory). Safe on a partial pool. */
void ferry__cuda_pool_release(ferry__cuda_pool *c, ferry__pool_memory *mem);

ferry_status ferry__cuda_pool_use_device(ferry__cuda_pool *c);

/* In a forked child: unmaps the child's copy of the segment and closes its fd; no CUDA call
 * (the child has no context) and no shared word is touched. */
void ferry__cuda_pool_forget(ferry__cuda_pool *c, ferry__pool_memory *mem);

/* Pools created by this process, so that a consumer in the producer's own process reads the
 * producer's own mapping (CUDA refuses to open a process's own IPC handle). */
typedef struct ferry__cuda_local {
    CUdeviceptr base; /* the pool region on the producer's device */
    uint64_t size;    /* its bytes */
    int device;       /* the producer's device */
} ferry__cuda_local;

/* 1 and *out if this process created the pool named pool_id and has not released it. */
int ferry__cuda_local_find(const uint8_t pool_id[16], ferry__cuda_local *out);

/* Registers a created pool (c->base, mem->memory_size); undone by ferry__cuda_pool_release. */
ferry_status ferry__cuda_local_add(ferry__cuda_pool *c, const ferry__pool_memory *mem);

/* The data path, identical for every GPU transport (transport.h ops). */
ferry_status ferry__cuda_copy_in(ferry__pool_memory *mem, uint64_t offset, const void *src,
                                 uint64_t n, void *stream);
ferry_status ferry__cuda_mark_ready(ferry__pool_memory *mem, uint64_t word, uint32_t generation,
                                    void *stream);
ferry_status ferry__cuda_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                     uint32_t value);
ferry_status ferry__cuda_sync_control(ferry__pool_memory *mem);
ferry_status ferry__cuda_slice_ptr(ferry__pool_memory *mem, uint64_t offset, void **ptr);

#endif
