/* What the GPU transports share: the host segment (header, generations and, by default, the
 * control words), the control placement, and the stream-ordered data path. A transport
 * (cuda_ipc.c, cuda_vmm.c) only allocates, exports and releases the device memory. */
#ifndef FERRY_TRANSPORT_CUDA_POOL_H
#define FERRY_TRANSPORT_CUDA_POOL_H

#include "driver/driver.h"
#include "transport/transport.h"

typedef struct ferry__cuda_local ferry__cuda_local;

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
    CUstream io;      /* device placement: the stream the CPU reads and writes the table on */
    const ferry__placement *place; /* where the control words live */
    void *backend;                 /* the transport's own state */
    ferry__cuda_local *local;      /* registered among this process's pools */
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
 * producer's own mapping (CUDA refuses to open a process's own IPC handle). A consumer that
 * borrows a mapping holds it: a producer that releases its pool meanwhile leaves the device
 * memory to the last borrower, as CUDA keeps an exported allocation alive for the processes
 * that opened it. */
/* How a transport frees its device memory, whoever does it last. */
typedef void (*ferry__cuda_free_fn)(const ferry__cuda *cuda, CUdeviceptr base, uint64_t size,
                                    uint64_t cookie);

/* Finds the pool named pool_id among this process's and borrows its mapping: *entry (released
 * with ferry__cuda_local_put), *base, *size and *device. 0 if this process did not create it
 * (or has released it). */
int ferry__cuda_local_find(const uint8_t pool_id[16], ferry__cuda_local **entry, CUdeviceptr *base,
                           uint64_t *size, int *device);
void ferry__cuda_local_put(ferry__cuda_local *entry);

/* Registers a created pool (c->base, mem->memory_size); free frees its device memory. */
ferry_status ferry__cuda_local_add(ferry__cuda_pool *c, const ferry__pool_memory *mem,
                                   ferry__cuda_free_fn free, uint64_t cookie);

/* At the producer's release: 1 if the device memory is left to borrowers (the transport must
 * not free it), 0 if the transport frees it now. */
int ferry__cuda_local_retire(ferry__cuda_pool *c);

/* The device placement's producer side (its table is in cuda_consumer.c). */
ferry_status ferry__cuda_device_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                            uint32_t value);
ferry_status ferry__cuda_device_sync(ferry__pool_memory *mem);

/* The consumer side, identical for every GPU transport (cuda_consumer.c). */
const char *ferry__cuda_view_check(const ferry__shm_layout *l, uint64_t *tail);
const ferry__placement *ferry__cuda_view_placement(const ferry__shm_layout *l);
ferry_status ferry__cuda_view_attach(ferry__mapped_pool *p, int device);
void ferry__cuda_view_detach(ferry__mapped_pool *p);
void ferry__cuda_view_track(ferry__mapped_pool *p, int device, uint32_t rank, void *stream);
ferry_status ferry__cuda_view_quiesce(ferry__mapped_pool *p, uint32_t rank, uint64_t deadline);
ferry_status ferry__cuda_view_map(ferry__mapped_pool *p, int device, uint64_t deadline);
ferry_status ferry__cuda_view_copy_out(ferry__mapped_pool *p, int device, uint64_t offset,
                                       void *dst, uint64_t n);
ferry_status ferry__cuda_view_data(ferry__mapped_pool *p, int device, uint64_t offset,
                                   const void **data);
ferry_status ferry__cuda_view_streams(const ferry__mapped_pool *p);
ferry_status ferry__cuda_view_enqueue_wait(ferry__mapped_pool *p, int device, uint64_t word,
                                           uint32_t value, void *stream);
ferry_status ferry__cuda_view_enqueue_copy(ferry__mapped_pool *p, int device, uint64_t offset,
                                           void *dst, uint64_t n, void *stream);
ferry_status ferry__cuda_view_enqueue_store(ferry__mapped_pool *p, int device, uint64_t word,
                                            uint32_t value, void *stream);

/* The entries every GPU transport's ops table shares: the producer's data path and the
 * whole consumer side. */
#define FERRY_CUDA_SHARED_OPS                                                                      \
    .gpu = 1, .device_placement = 1, .space_poll_ns = 20000ull, .copy_in = ferry__cuda_copy_in,    \
    .mark_ready = ferry__cuda_mark_ready, .write_words = ferry__cuda_write_words,                  \
    .sync_control = ferry__cuda_sync_control, .slice_ptr = ferry__cuda_slice_ptr,                  \
    .memory_map = ferry__cuda_memory_map, FERRY_CUDA_VIEW_OPS

#define FERRY_CUDA_VIEW_OPS                                                                        \
    .ready_poll_ns = 20000ull, .ready_spin_ns = 100000ull, .view_check = ferry__cuda_view_check,   \
    .view_placement = ferry__cuda_view_placement, .view_attach = ferry__cuda_view_attach,          \
    .view_detach = ferry__cuda_view_detach, .view_track = ferry__cuda_view_track,                  \
    .view_quiesce = ferry__cuda_view_quiesce, .view_map = ferry__cuda_view_map,                    \
    .view_copy_out = ferry__cuda_view_copy_out, .view_data = ferry__cuda_view_data,                \
    .view_streams = ferry__cuda_view_streams, .view_enqueue_wait = ferry__cuda_view_enqueue_wait,  \
    .view_enqueue_copy = ferry__cuda_view_enqueue_copy,                                            \
    .view_enqueue_store = ferry__cuda_view_enqueue_store

/* The data path, identical for every GPU transport (transport.h ops). */
ferry_status ferry__cuda_copy_in(ferry__pool_memory *mem, uint64_t offset, const void *src,
                                 uint64_t n, void *stream);
ferry_status ferry__cuda_mark_ready(ferry__pool_memory *mem, uint64_t word, uint32_t generation,
                                    void *stream);
ferry_status ferry__cuda_write_words(ferry__pool_memory *mem, uint64_t first, uint32_t count,
                                     uint32_t value);
ferry_status ferry__cuda_sync_control(ferry__pool_memory *mem);
ferry_status ferry__cuda_slice_ptr(ferry__pool_memory *mem, uint64_t offset, void **ptr);
void ferry__cuda_memory_map(const ferry__pool_memory *mem, ferry__memory_map *map);

#endif
