/* CUDA IPC transport: the pool is one cuMemAlloc on the producer's device, exported once as a
 * CUDA IPC handle that travels in every descriptor (the rest: cuda_pool.c). */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/cuda_pool.h"

static void ipc_free_device(const ferry__cuda *cuda, CUdeviceptr base, uint64_t size,
                            uint64_t cookie)
{
    (void)size;
    (void)cookie;
    cuda->cuMemFree(base);
}

static void ipc_release(ferry__cuda_pool *c, ferry__pool_memory *mem)
{
    int borrowed = ferry__cuda_local_retire(c);
    if (c->base && !borrowed && ferry__cuda_pool_use_device(c) == FERRY_OK)
        c->cuda->cuMemFree(c->base);
    ferry__cuda_pool_release(c, mem);
    free(c);
}

static ferry_status ipc_build(ferry__cuda_pool *c, const ferry_pool_config *config,
                              uint64_t data_start, ferry__pool_memory *mem)
{
    ferry_status st = ferry__cuda_pool_init(c, "CUDA IPC", config, data_start, mem);
    if (st != FERRY_OK)
        return st;
    FERRY_CU_TRY(c->cuda, cuMemAlloc, (&c->base, (size_t)config->memory_size));
    st = ferry__cuda_pool_place(c, config, mem);
    if (st != FERRY_OK)
        return st;
    CUipcMemHandle handle;
    FERRY_CU_TRY(c->cuda, cuIpcGetMemHandle, (&handle, c->base));
    memcpy(mem->handle, &handle, sizeof(mem->handle));
    mem->memory_size = (uint64_t)config->memory_size;
    return ferry__cuda_local_add(c, mem, ipc_free_device, 0);
}

static ferry_status ipc_create(const ferry_pool_config *config, uint64_t data_start,
                               ferry__pool_memory *mem)
{
    ferry__cuda_pool *c = calloc(1, sizeof(*c));
    if (!c)
        return ferry__fail(FERRY_NO_MEMORY, "CUDA IPC pool: out of memory");
    mem->shared_fd = -1;
    ferry_status st = ipc_build(c, config, data_start, mem);
    if (st != FERRY_OK) {
        ipc_release(c, mem);
        memset(mem, 0, sizeof(*mem));
        mem->shared_fd = -1;
    }
    return st;
}

static void ipc_destroy(ferry__pool_memory *mem)
{
    if (mem->priv)
        ipc_release(mem->priv, mem);
    memset(mem, 0, sizeof(*mem));
    mem->shared_fd = -1;
}

static void ipc_forget(ferry__pool_memory *mem)
{
    if (mem->priv) {
        ferry__cuda_pool_forget(mem->priv, mem);
        free(mem->priv);
    }
    memset(mem, 0, sizeof(*mem));
    mem->shared_fd = -1;
}

static ferry_status ipc_check(ferry__pool_memory *mem, char *cause, size_t size)
{
    (void)mem;
    (void)cause;
    (void)size;
    return FERRY_OK;
}

const ferry__transport_ops ferry__cuda_ipc_transport = {
    .name = "CUDA IPC",
    .pool_name = "CUDA IPC",
    .backend = FERRY_BACKEND_CUDA_IPC,
    .rounds_size = 0,
    .create = ipc_create,
    .destroy = ipc_destroy,
    .forget = ipc_forget,
    .check = ipc_check,
    FERRY_CUDA_SHARED_OPS,
};
