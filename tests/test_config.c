/* Configuration validation: every documented message, and the budget split; the public
 * clock and futex. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "ferry.h"

static ferry_pool_config base_config(void)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 1 << 20;
    c.consumer_count = 2;
    return c;
}

static void expect_invalid(ferry_pool_config c, const char *message)
{
    ferry_pool *pool = (ferry_pool *)0x1;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), message);
    assert_int_equal(ferry_pool_create(&c, &pool), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), message);
    assert_ptr_equal(pool, (ferry_pool *)0x1); /* output untouched */
}

static void test_non_positive_fields(void **state)
{
    (void)state;
    ferry_pool_config c;
    int64_t bad[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = base_config();
        c.memory_size = bad[i];
        expect_invalid(c, "memory_size must be positive");
        c = base_config();
        c.consumer_count = bad[i];
        expect_invalid(c, "consumer_count must be positive");
        c = base_config();
        c.max_inflight_slices = bad[i];
        expect_invalid(c, "max_inflight_slices must be positive");
        c = base_config();
        c.reclaim_interval_us = bad[i];
        expect_invalid(c, "recycle_interval must be positive");
    }
}

static void test_too_small_after_control(void **state)
{
    (void)state;
    ferry_pool_config c = base_config();
    /* 4096 rows of (1 + 2) words = 49152 bytes of control, already 256-aligned. */
    c.memory_size = 1000;
    expect_invalid(c, "host pool is too small after control metadata: pool=1000, control=49152");
    c.memory_size = 49152;
    expect_invalid(c, "host pool is too small after control metadata: pool=49152, control=49152");
    /* Rounding: 3 rows of 2 words = 24 bytes, data starts at 256. */
    c.max_inflight_slices = 3;
    c.consumer_count = 1;
    c.memory_size = 300;
    expect_invalid(c, "host pool is too small after control metadata: pool=300, control=256");
    c.memory_size = 512;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_OK);
}

static void test_struct_and_limits(void **state)
{
    (void)state;
    ferry_pool_config c = base_config();
    c.struct_size = 8;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "FERRY_POOL_CONFIG_INIT"));
    c = base_config();
    c.version = 99;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    /* A caller built against another header: the fields of its version are read, no more
     * (a larger struct of the same version is read as far as this library knows). */
    c = base_config();
    c.version = 1;
    c.struct_size = (uint32_t)(offsetof(ferry_pool_config, vmm_handle) + sizeof(int32_t));
    c.channel_depth = 3; /* beyond a version 1 struct: not read, the default is taken */
    assert_int_equal(ferry_pool_config_check(&c), FERRY_OK);
    c.struct_size += 64;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_OK);
    c.struct_size = (uint32_t)offsetof(ferry_pool_config, vmm_handle);
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    /* A version 1 caller with more ranks than default rings fit gets smaller rings, not a
     * refusal of a config that worked before. */
    c = base_config();
    c.version = 1;
    c.struct_size = (uint32_t)(offsetof(ferry_pool_config, vmm_handle) + sizeof(int32_t));
    c.consumer_count = 20000;
    c.max_inflight_slices = 4;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_OK);
    c.version = FERRY_POOL_CONFIG_VERSION; /* one that can name channel_depth is told */
    c.struct_size = sizeof(c);
    c.channel_depth = 64;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "lower channel_depth"));
    /* Version 2 needs its own fields. */
    c = base_config();
    c.struct_size = (uint32_t)(offsetof(ferry_pool_config, vmm_handle) + sizeof(int32_t));
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    c = base_config();
    c.channel_depth = 3;
    expect_invalid(c, "channel_depth=3 must be a power of two from 1 to 65536");
    c.channel_depth = 0;
    expect_invalid(c, "channel_depth=0 must be a power of two from 1 to 65536");
    c.channel_depth = 1 << 17;
    expect_invalid(c, "channel_depth=131072 must be a power of two from 1 to 65536");
    c.channel_depth = 1 << 16;
    c.consumer_count = 64;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "lower channel_depth"));
    c = base_config();
    c.drain_timeout_us = -1;
    expect_invalid(c, "drain_timeout_us=-1 is negative");
    c = base_config();
    c.consumer_count = 70000;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error(), "consumer_count=70000"));
    c = base_config();
    c.initial_generation = 0x7fffffff;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    c = base_config();
    c.backend = (ferry_backend)42;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_config_check(NULL), FERRY_INVALID_ARGUMENT);
}

static void test_gpu_backends(void **state)
{
    (void)state;
    ferry_pool_config c = base_config();
    c.backend = FERRY_BACKEND_CUDA_VMM;
    c.vmm_handle = 3;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), "vmm_handle=3 is not a handle type");
    c.vmm_handle = FERRY_VMM_HANDLE_FABRIC;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_OK);
    /* The transport's name is in its messages. */
    c.backend = FERRY_BACKEND_CUDA_IPC;
    c.memory_size = 1000;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(),
                        "CUDA IPC pool is too small after control metadata: pool=1000, "
                        "control=49152");
    c = base_config();
    c.control_placement = FERRY_CONTROL_DEVICE;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(),
                        "control words can live on the device only in a GPU pool");
    c.control_placement = 7;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_INVALID_ARGUMENT);
    c = base_config();
    c.backend = FERRY_BACKEND_CUDA_IPC;
    c.control_placement = FERRY_CONTROL_DEVICE;
    assert_int_equal(ferry_pool_config_check(&c), FERRY_OK);
}

static void test_split_budget(void **state)
{
    (void)state;
    int64_t share = -7;
    assert_int_equal(ferry_split_budget(0, 4, &share), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), "total_pool_size must be positive");
    assert_int_equal(ferry_split_budget(-5, 4, &share), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), "total_pool_size must be positive");
    assert_int_equal(ferry_split_budget(100, 0, &share), FERRY_INVALID_ARGUMENT);
    assert_string_equal(ferry_last_error(), "tokenizer_worker_num must be positive");
    assert_int_equal(share, -7);
    assert_int_equal(ferry_split_budget(100, 3, &share), FERRY_OK);
    assert_int_equal(share, 33);
    assert_true(share * 3 <= 100);
    assert_int_equal(ferry_split_budget(INT64_MAX, 7, &share), FERRY_OK);
    assert_int_equal(share, INT64_MAX / 7);
}

static void test_status_table(void **state)
{
    (void)state;
    assert_string_equal(ferry_status_name(FERRY_OK), "OK");
    assert_string_equal(ferry_status_name(FERRY_POOL_FULL), "POOL_FULL");
    assert_string_equal(ferry_status_str(FERRY_STALE), "descriptor is stale");
    assert_int_equal(FERRY_PRODUCER_GONE, 5);
    assert_string_equal(ferry_status_name((ferry_status)999), "UNKNOWN");
    assert_string_equal(ferry_version(), "0.1.0");
    assert_int_equal(ferry_version_number(), FERRY_VERSION_NUMBER);
    assert_int_equal(FERRY_VERSION_NUMBER, 100);
}

/* ferry_now_ns is CLOCK_MONOTONIC; a futex wait ends at its timeout, at once on a changed
 * word, and on a wake from another process sharing the word. */
static void test_clock_and_futex(void **state)
{
    (void)state;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t mono = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t t0 = ferry_now_ns();
    assert_true(t0 >= mono && t0 - mono < 1000000000ull);

    uint32_t *word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(word != MAP_FAILED);
    ferry_futex_wait(word, 0, 20000000ull);
    uint64_t waited = ferry_now_ns() - t0;
    assert_true(waited >= 20000000ull && waited < 2000000000ull);
    t0 = ferry_now_ns();
    ferry_futex_wait(word, 1, 5000000000ull); /* *word is 0: no sleep */
    assert_true(ferry_now_ns() - t0 < 1000000000ull);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        usleep(50000);
        __atomic_store_n(word, 1, __ATOMIC_SEQ_CST);
        ferry_futex_wake(word);
        _exit(0);
    }
    t0 = ferry_now_ns();
    while (__atomic_load_n(word, __ATOMIC_SEQ_CST) == 0)
        ferry_futex_wait(word, 0, 10000000000ull);
    assert_true(ferry_now_ns() - t0 < 5000000000ull);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    munmap(word, 4096);
}

/* Whether a backend's pools live in GPU memory, answered by the transports; a query that
 * leaves the last error as it was. */
static void test_backend_uses_gpu(void **state)
{
    (void)state;
    ferry__fail(FERRY_TIMEOUT, "before");
    assert_int_equal(ferry_backend_uses_gpu(FERRY_BACKEND_HOST), 0);
    assert_int_equal(ferry_backend_uses_gpu(FERRY_BACKEND_AUTO), 0);
    assert_int_equal(ferry_backend_uses_gpu(FERRY_BACKEND_CUDA_IPC), 1);
    assert_int_equal(ferry_backend_uses_gpu(FERRY_BACKEND_CUDA_VMM), 1);
    assert_int_equal(ferry_backend_uses_gpu((ferry_backend)99), 0);
    assert_int_equal(ferry_backend_uses_gpu((ferry_backend)-1), 0);
    assert_string_equal(ferry_last_error(), "before");
}

/* An error message may quote the one before it: ferry__fail formats aside, so that
 * ferry_last_error() as an argument is not overwritten while it is read. */
static void test_error_quotes_the_last(void **state)
{
    (void)state;
    int64_t share;
    assert_int_equal(ferry_split_budget(0, 4, &share), FERRY_INVALID_ARGUMENT);
    char first[256];
    snprintf(first, sizeof(first), "%s", ferry_last_error());
    assert_int_equal(ferry__fail(FERRY_TIMEOUT, "outer (%s): %s", "x", ferry_last_error()),
                     FERRY_TIMEOUT);
    char want[300];
    snprintf(want, sizeof(want), "outer (x): %s", first);
    assert_string_equal(ferry_last_error(), want);
    assert_int_equal(ferry__fail_errno(FERRY_SYSTEM, 2, "again: %s", ferry_last_error()),
                     FERRY_SYSTEM);
    snprintf(want, sizeof(want), "again: outer (x): %s: %s", first, strerror(2));
    assert_string_equal(ferry_last_error(), want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_non_positive_fields), cmocka_unit_test(test_too_small_after_control),
        cmocka_unit_test(test_struct_and_limits),   cmocka_unit_test(test_gpu_backends),
        cmocka_unit_test(test_split_budget),        cmocka_unit_test(test_status_table),
        cmocka_unit_test(test_clock_and_futex),     cmocka_unit_test(test_error_quotes_the_last),
        cmocka_unit_test(test_backend_uses_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
