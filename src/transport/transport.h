/* The contract between the pool engine and a memory transport.
 *
 * A transport owns the pool's memory: it allocates the shared segment (header, slot
 * generations, control words) and the pool region, copies tensors in, and tells consumers
 * how to reach the memory. One static const table per transport; every slot is filled, an
 * operation a transport cannot do answers NOT_SUPPORTED. */
#ifndef FERRY_TRANSPORT_TRANSPORT_H
#define FERRY_TRANSPORT_TRANSPORT_H

#include <stdint.h>

#include "ferry.h"
#include "pool/layout.h"

typedef struct ferry__pool_memory {
    ferry__shm_header *header; /* shared header (host memory) */
    uint32_t *generations;     /* shared slot generation table */
    uint32_t *control;         /* control table: max_inflight rows of row_words */
    uint8_t *data;             /* data region (host-addressable for the host transport) */
    int shared_fd;             /* fd the broker hands to consumers */
    uint64_t shared_size;      /* its size */
    void *priv;                /* transport state */
} ferry__pool_memory;

typedef struct ferry__transport_ops {
    const char *name; /* "host", "CUDA IPC", "CUDA VMM": used in messages */
    ferry_backend backend;
    /* Allocates and lays out the memory for a validated configuration. */
    ferry_status (*create)(const ferry_pool_config *config, uint64_t data_start,
                           ferry__pool_memory *mem);
    /* Releases everything create made. */
    void (*destroy)(ferry__pool_memory *mem);
    /* Copies n bytes from src into the data region at offset. */
    ferry_status (*copy_in)(ferry__pool_memory *mem, uint64_t offset, const void *src, uint64_t n);
    /* Pointer to the data region at offset for a zero-copy writer. */
    ferry_status (*slice_ptr)(ferry__pool_memory *mem, uint64_t offset, void **ptr);
} ferry__transport_ops;

extern const ferry__transport_ops ferry__host_transport;

/* The transport for a backend: NOT_SUPPORTED (with a message) for backends this build or
 * machine cannot serve. */
ferry_status ferry__transport_select(ferry_backend backend, const ferry__transport_ops **ops);

#endif
