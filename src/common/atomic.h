/* Shared-memory words are touched only through these helpers; each name says its order. */
#ifndef FERRY_COMMON_ATOMIC_H
#define FERRY_COMMON_ATOMIC_H

#include <stdint.h>

static inline uint32_t ferry__load_acquire32(const volatile uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline uint32_t ferry__load_relaxed32(const volatile uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void ferry__store_release32(volatile uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void ferry__store_relaxed32(volatile uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline uint32_t ferry__fetch_add_seqcst32(volatile uint32_t *p, uint32_t v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

/* Replaces *p by v if it holds expected; returns 1 if it did, else 0 with *expected set to
 * what *p held. Acquire-release. */
static inline int ferry__cas_acqrel32(volatile uint32_t *p, uint32_t *expected, uint32_t v)
{
    return __atomic_compare_exchange_n(p, expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static inline int ferry__cas_seqcst32(volatile uint32_t *p, uint32_t *expected, uint32_t v)
{
    return __atomic_compare_exchange_n(p, expected, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static inline uint32_t ferry__exchange_seqcst32(volatile uint32_t *p, uint32_t v)
{
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}

static inline uint32_t ferry__load_seqcst32(const volatile uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static inline void ferry__store_seqcst32(volatile uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

static inline uint64_t ferry__load_acquire64(const volatile uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void ferry__store_release64(volatile uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline uint64_t ferry__load_relaxed64(const volatile uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void ferry__store_relaxed64(volatile uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

/* Orders every earlier load and store of this thread before every later one (a writer's
 * seqlock fence: a new generation word before the bytes of the new lease). */
static inline void ferry__fence_seqcst(void)
{
#if defined(__SANITIZE_THREAD__)
    static uint32_t tsan_fence; /* TSan does not model fences: a seq_cst RMW stands in */
    __atomic_fetch_add(&tsan_fence, 0, __ATOMIC_SEQ_CST);
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/* Loads *p ordered after every earlier read of this thread (the re-check of a seqlock).
 * TSan does not model fences, so its builds use an equivalent read-modify-write. */
static inline uint32_t ferry__load_after_reads32(volatile uint32_t *p)
{
#if defined(__SANITIZE_THREAD__)
    return __atomic_fetch_add(p, 0, __ATOMIC_ACQ_REL);
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

#endif
