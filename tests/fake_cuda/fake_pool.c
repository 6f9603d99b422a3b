/* The fake CUDA driver's stream-ordered memory pools (cuMemPoolCreate,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync): a pool holds blocks of anonymous memory. A block
 * freed in stream order goes back to its pool only when the free's stream runs it, and an
 * allocation takes a free block (the smallest that fits and is at most twice the size asked)
 * or makes a new one; blocks stay with the pool until cuMemPoolTrimTo. Until then a freed
 * block is refused as a copy's source or destination, so that use after a free is an error
 * here. An allocation on the stream of a free not run yet may take that block at once (what
 * it enqueues runs after the free, as in CUDA). Work on another stream that still uses a block
 * when its free runs is reported on stderr (CUDA leaves that to the caller, and the memory may
 * be handed out again).
 *
 * Where the fake differs from CUDA: allocations on other streams never reuse a block whose
 * free has not run yet (CUDA may, by ordering the allocating stream after the free: internal
 * dependencies), and the release threshold is recorded but never acted on (only
 * cuMemPoolTrimTo releases). */
#include <stdlib.h>
#include <sys/mman.h>

#include "fake_cuda.h"
#include "fake_cuda_control.h"

struct CUmemPoolHandle_st {
    struct CUmemPoolHandle_st *next;
    int device;
    unsigned long long threshold;
};

static struct CUmemPoolHandle_st *pools;

static struct CUmemPoolHandle_st *pool_lookup(CUmemoryPool h)
{
    for (struct CUmemPoolHandle_st *p = pools; p; p = p->next)
        if (p == h)
            return p;
    return NULL;
}

FAKE_DECLARE(cuMemPoolCreate);
static CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    FAKE_ENTER(cuMemPoolCreate);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->handleTypes != CU_MEM_HANDLE_TYPE_NONE ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= fake_device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->device = props->location.id;
    pthread_mutex_lock(&fake_lock);
    p->next = pools;
    pools = p;
    pthread_mutex_unlock(&fake_lock);
    *pool = p;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuMemPoolSetAttribute);
static CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    FAKE_ENTER(cuMemPoolSetAttribute);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value || attr < 1 || attr > CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        return CUDA_ERROR_INVALID_VALUE; /* 1-3: the reuse policies, ints; 4: a cuuint64_t */
    pthread_mutex_lock(&fake_lock);
    struct CUmemPoolHandle_st *p = pool_lookup(pool);
    if (!p)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        p->threshold = *(const unsigned long long *)value;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

/* Whether r may be handed out to an allocation on the stream with identity stream: freed, or
 * its free queued on that same stream (under fake_lock). */
static int reusable(const struct fake_region *r, uint64_t stream)
{
    return r->pool_free || (r->dying && r->free_calls && r->free_stream == stream);
}

/* A free block of p for n bytes on stream (under fake_lock): the smallest that fits and is at
 * most 2n. A block whose free is still queued is taken over: that free will do nothing. */
static struct fake_region *take_free(struct CUmemPoolHandle_st *p, size_t n, uint64_t stream)
{
    struct fake_region *best = NULL;
    for (struct fake_region *r = NULL; (r = fake_region_next(r, FAKE_POOLED));)
        if (r->pool == p && reusable(r, stream) && r->size >= n && r->size / 2 <= n &&
            (!best || r->size < best->size))
            best = r;
    if (best) {
        best->pool_free = 0;
        best->dying = 0;
        best->free_token++;
    }
    return best;
}

/* A new block of n bytes for p (under fake_lock), or NULL with *rc. */
static struct fake_region *new_block(struct CUmemPoolHandle_st *p, size_t n, CUresult *rc)
{
    if ((*rc = fake_reserve_bytes(p->device, n)) != CUDA_SUCCESS)
        return NULL;
    void *base = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct fake_region *r = base != MAP_FAILED ? fake_region_add(FAKE_POOLED, base, n) : NULL;
    if (!r) {
        if (base != MAP_FAILED)
            munmap(base, n);
        fake_unreserve_bytes(p->device, n);
        *rc = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    r->device = p->device;
    r->pool = p;
    return r;
}

FAKE_DECLARE(cuMemAllocFromPoolAsync);
static CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    FAKE_ENTER(cuMemAllocFromPoolAsync);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = (bytesize + 255) & ~(size_t)255;
    uint64_t stream;
    rc = fake_stream_call(hStream, NULL, NULL, &stream); /* the stream must exist */
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct CUmemPoolHandle_st *p = pool_lookup(pool);
    struct fake_region *r = NULL;
    if (!p)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (!(r = take_free(p, n, stream)))
        r = new_block(p, n, &rc);
    if (r)
        *dptr = (CUdeviceptr)(uintptr_t)r->base;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

struct queued_free {
    struct fake_region *block;
    uint64_t token;
};

/* Run by the free's stream: the block goes back to its pool, unless an allocation on that
 * stream took it over meanwhile. */
static void block_freed(void *arg)
{
    struct queued_free *f = arg;
    struct fake_region *r = f->block;
    r->free_calls--;
    if (f->token == r->free_token) {
        if (r->pending)
            fake_warn("cuMemFreeAsync(%p) ran while %u operation(s) on other streams still use "
                      "the memory",
                      (void *)r->base, r->pending);
        r->dying = 0;
        r->pool_free = 1;
    }
    free(f);
}

FAKE_DECLARE(cuMemFreeAsync);
static CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    FAKE_ENTER(cuMemFreeAsync);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t stream;
    struct queued_free *f = malloc(sizeof(*f));
    rc = f ? fake_stream_call(hStream, NULL, NULL, &stream) : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc != CUDA_SUCCESS) {
        free(f);
        return rc;
    }
    pthread_mutex_lock(&fake_lock);
    struct fake_region *r = fake_region_at((uintptr_t)dptr, FAKE_POOLED);
    if (!r || r->dying || r->pool_free || (uintptr_t)r->base != dptr) {
        pthread_mutex_unlock(&fake_lock);
        free(f);
        return CUDA_ERROR_INVALID_VALUE;
    }
    r->dying = 1; /* no new use from here */
    r->free_stream = stream;
    r->free_calls++;
    *f = (struct queued_free){r, ++r->free_token};
    pthread_mutex_unlock(&fake_lock);
    /* (A stream destroyed in between: the block is the caller's again.) */
    rc = fake_stream_call(hStream, block_freed, f, NULL);
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_lock(&fake_lock);
        r->dying = 0;
        r->free_calls--;
        r->free_token++;
        pthread_mutex_unlock(&fake_lock);
        free(f);
    }
    return rc;
}

FAKE_DECLARE(cuMemPoolTrimTo);
static CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    FAKE_ENTER(cuMemPoolTrimTo);
    CUresult rc = fake_need_context(NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fake_lock);
    struct CUmemPoolHandle_st *p = pool_lookup(pool);
    size_t held = 0;
    for (struct fake_region *r = NULL; p && (r = fake_region_next(r, FAKE_POOLED));)
        held += r->pool == p ? r->size : 0;
    struct fake_region *r = NULL, *next;
    for (r = fake_region_next(NULL, FAKE_POOLED); p && r && held > minBytesToKeep; r = next) {
        next = fake_region_next(r, FAKE_POOLED);
        if (r->pool != p || !r->pool_free || r->free_calls)
            continue;
        held -= r->size;
        munmap(r->base, r->size);
        fake_unreserve_bytes(r->device, r->size);
        fake_region_remove(r);
    }
    if (!p)
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

unsigned long long ferry_fake_cuda_pool_bytes(void)
{
    unsigned long long n = 0;
    pthread_mutex_lock(&fake_lock);
    for (struct fake_region *r = NULL; (r = fake_region_next(r, FAKE_POOLED));)
        n += r->size;
    pthread_mutex_unlock(&fake_lock);
    return n;
}

void fake_register_pool(fake_generic_fn *table)
{
    FAKE_REGISTER(table, cuMemPoolCreate);
    FAKE_REGISTER(table, cuMemPoolSetAttribute);
    FAKE_REGISTER(table, cuMemAllocFromPoolAsync);
    FAKE_REGISTER(table, cuMemFreeAsync);
    FAKE_REGISTER(table, cuMemPoolTrimTo);
}
