/* The per-process consumer cache: one ferry_consumer per (rank, device), created on first
 * use. Views hold references of their own, so that they can acknowledge after the cache let
 * go of the consumer (ferry.release_consumers) or the module was torn down. The cache itself
 * is guarded by the GIL; reference counts are atomic.
 *
 * A forked child starts with an empty cache: its parent's consumers hold the parent's rank
 * claims, and the library refuses them in the child (FORKED), so a receive there creates a
 * consumer of its own. The inherited ones are left to views the child inherited (whose
 * acknowledgements the library refuses, as it should) and never destroyed there. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "ferry_py.h"

static fy_consumer **cache;
static size_t cache_len, cache_cap;

/* pthread_atfork child handler: no locks, no Python, nothing freed. */
static void forget_after_fork(void)
{
    cache = NULL;
    cache_len = cache_cap = 0;
}

int fy_consumers_init(void)
{
    return pthread_atfork(NULL, NULL, forget_after_fork) == 0 ? 0 : -1;
}

void fy_consumer_ref(fy_consumer *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void fy_consumer_unref(fy_consumer *c)
{
    if (!c || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (c->pid != getpid()) { /* inherited through fork: the parent's to destroy */
        free(c);
        return;
    }
    ferry_consumer_destroy(c->handle);
    free(c);
}

static fy_consumer *cache_find(uint32_t rank, int32_t device)
{
    for (size_t i = 0; i < cache_len; i++)
        if (cache[i]->rank == rank && cache[i]->device == device)
            return cache[i];
    return NULL;
}

static int cache_add(fy_consumer *c)
{
    if (cache_len == cache_cap) {
        size_t cap = cache_cap ? 2 * cache_cap : 8;
        fy_consumer **grown = realloc(cache, cap * sizeof(*grown));
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        cache = grown;
        cache_cap = cap;
    }
    cache[cache_len++] = c;
    return 0;
}

static fy_consumer *consumer_create(uint32_t rank, int32_t device)
{
    fy_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return (fy_consumer *)PyErr_NoMemory();
    ferry_status st = ferry_consumer_create_on(rank, device, &c->handle);
    if (st != FERRY_OK) {
        free(c);
        return (fy_consumer *)fy_raise(st);
    }
    c->refs = 1; /* the cache's */
    c->pid = getpid();
    c->rank = rank;
    c->device = device;
    if (cache_add(c) < 0) {
        fy_consumer_unref(c);
        return NULL;
    }
    return c;
}

fy_consumer *fy_consumer_wrap(ferry_consumer *handle, uint32_t rank, int32_t device)
{
    fy_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return (fy_consumer *)PyErr_NoMemory();
    c->refs = 1;
    c->handle = handle;
    c->pid = getpid();
    c->rank = rank;
    c->device = device;
    return c;
}

fy_consumer *fy_consumer_get(uint32_t rank, int32_t device)
{
    fy_consumer *c = cache_find(rank, device);
    if (!c && !(c = consumer_create(rank, device)))
        return NULL;
    fy_consumer_ref(c);
    return c;
}

fy_consumer *fy_consumer_any(uint32_t consumer_count, int32_t device, uint32_t fallback)
{
    fy_consumer *exact = cache_find(fallback, device);
    if (exact) {
        fy_consumer_ref(exact);
        return exact;
    }
    for (size_t i = 0; i < cache_len; i++) {
        if (cache[i]->device == device && cache[i]->rank < consumer_count) {
            fy_consumer_ref(cache[i]);
            return cache[i];
        }
    }
    return fy_consumer_get(fallback, device);
}

PyObject *fy_release_consumers(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    size_t n = cache_len;
    fy_consumer **held = cache;
    cache = NULL;
    cache_len = cache_cap = 0;
    for (size_t i = 0; i < n; i++)
        fy_consumer_unref(held[i]);
    free(held);
    Py_RETURN_NONE;
}
