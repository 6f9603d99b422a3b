/* Host transport: the whole segment (header, generations, control table, data) is one memfd
 * that consumers receive from the broker and map once. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/error.h"
#include "transport/transport.h"

static ferry_status host_map(int fd, uint64_t size, void **base)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return ferry__fail_errno(FERRY_NO_MEMORY, errno, "host pool: mmap of %llu bytes failed",
                                 (unsigned long long)size);
    *base = p;
    return FERRY_OK;
}

static ferry_status host_create(const ferry_pool_config *config, uint64_t data_start,
                                ferry__pool_memory *mem)
{
    uint64_t header_bytes = ferry__header_bytes((uint64_t)config->max_inflight_slices);
    uint64_t size = header_bytes + (uint64_t)config->memory_size;
    void *base = NULL;
    ferry_status st;

    int fd = memfd_create("ferry-host-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "host pool: memfd_create failed");
    if (ftruncate(fd, (off_t)size) != 0) {
        st = ferry__fail_errno(FERRY_NO_MEMORY, errno, "host pool: ftruncate to %llu bytes failed",
                               (unsigned long long)size);
        goto close_fd;
    }
    /* The size is fixed for the pool's life: consumers may rely on it. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        st = ferry__fail_errno(FERRY_SYSTEM, errno, "host pool: sealing the memfd failed");
        goto close_fd;
    }
    st = host_map(fd, size, &base);
    if (st != FERRY_OK)
        goto close_fd;
    mem->header = base;
    mem->generations = (uint32_t *)((uint8_t *)base + FERRY_GEN_TABLE_OFFSET);
    mem->control = (uint32_t *)((uint8_t *)base + header_bytes);
    mem->data = (uint8_t *)base + header_bytes + data_start;
    mem->shared_fd = fd;
    mem->shared_size = size;
    mem->priv = base;
    return FERRY_OK;
close_fd:
    close(fd);
    return st;
}

static void host_destroy(ferry__pool_memory *mem)
{
    if (mem->priv)
        munmap(mem->priv, mem->shared_size);
    if (mem->shared_fd >= 0)
        close(mem->shared_fd);
    memset(mem, 0, sizeof(*mem));
    mem->shared_fd = -1;
}

static ferry_status host_copy_in(ferry__pool_memory *mem, uint64_t offset, const void *src,
                                 uint64_t n)
{
    if (n)
        memcpy(mem->data + offset, src, n);
    return FERRY_OK;
}

static ferry_status host_slice_ptr(ferry__pool_memory *mem, uint64_t offset, void **ptr)
{
    *ptr = mem->data + offset;
    return FERRY_OK;
}

const ferry__transport_ops ferry__host_transport = {
    .name = "host",
    .backend = FERRY_BACKEND_HOST,
    .create = host_create,
    .destroy = host_destroy,
    .copy_in = host_copy_in,
    .slice_ptr = host_slice_ptr,
};

ferry_status ferry__transport_select(ferry_backend backend, const ferry__transport_ops **ops)
{
    switch (backend) {
    case FERRY_BACKEND_AUTO:
    case FERRY_BACKEND_HOST:
        *ops = &ferry__host_transport;
        return FERRY_OK;
    case FERRY_BACKEND_CUDA_IPC:
    case FERRY_BACKEND_CUDA_VMM:
        return ferry__fail(FERRY_NOT_SUPPORTED, "%s backend is not available in this build",
                           ferry_backend_name(backend));
    }
    return ferry__fail(FERRY_INVALID_ARGUMENT, "unknown backend %d", (int)backend);
}
