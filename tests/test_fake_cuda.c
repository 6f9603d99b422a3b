/* Tests of the fake CUDA driver (tests/fake_cuda), loaded through ferry's own loader: the
 * test double that stands in for libcuda where there is no GPU must itself behave. Helper
 * processes (this binary with --helper) open IPC and VMM handles across processes and check
 * the environment switches. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver/driver.h"
#include "fake_cuda_control.h"
#include "helpers.h"

extern char **environ;

#define CUDA_ERROR_INVALID_CONTEXT            201
#define CUDA_ERROR_ILLEGAL_ADDRESS            700
#define CUDA_ERROR_INVALID_HANDLE             400
#define CUDA_ERROR_NOT_FOUND                  500
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define VMM_FD                                100 /* where a helper finds the exported VMM file descriptor */
#define MiB                                   ((size_t)1 << 20)

static const ferry__cuda *cu;
static __typeof__(ferry_fake_cuda_fail) *fake_fail;
static __typeof__(ferry_fake_cuda_calls) *fake_calls;
static __typeof__(ferry_fake_cuda_reset) *fake_reset;
static __typeof__(ferry_fake_cuda_live_allocations) *fake_live;
static char self_exe[4096];

static void *control(const char *name)
{
    void *sym = dlsym(cu->library, name);
    if (!sym) {
        fprintf(stderr, "fake driver lacks %s\n", name);
        exit(1);
    }
    return sym;
}

/* Loads the fake driver through ferry, makes device 0 current on this thread and finds the
 * control functions. 0 on success. */
static int load_driver(void)
{
    if (ferry__cuda_get(&cu) != FERRY_OK) {
        fprintf(stderr, "loading the fake driver: %s\n", ferry_last_error());
        return -1;
    }
    if (cu->device_count > 0 && ferry__cuda_use_device(cu, 0) != FERRY_OK) {
        fprintf(stderr, "device 0: %s\n", ferry_last_error());
        return -1;
    }
    void *sym;
    sym = control("ferry_fake_cuda_fail");
    memcpy(&fake_fail, &sym, sizeof(sym));
    sym = control("ferry_fake_cuda_calls");
    memcpy(&fake_calls, &sym, sizeof(sym));
    sym = control("ferry_fake_cuda_reset");
    memcpy(&fake_reset, &sym, sizeof(sym));
    sym = control("ferry_fake_cuda_live_allocations");
    memcpy(&fake_live, &sym, sizeof(sym));
    return 0;
}

static CUdeviceptr dptr_of(const void *p)
{
    return (CUdeviceptr)(uintptr_t)p;
}

static void *host_of(CUdeviceptr d)
{
    return (void *)(uintptr_t)d;
}

static void store_word(CUdeviceptr d, uint32_t v)
{
    __atomic_store_n((uint32_t *)host_of(d), v, __ATOMIC_RELEASE);
}

static uint32_t load_word(CUdeviceptr d)
{
    return __atomic_load_n((uint32_t *)host_of(d), __ATOMIC_ACQUIRE);
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* ---- helper processes ------------------------------------------------------------------ */

/* Whether entry ("NAME=value") names a variable that extra (NULL-terminated, may be NULL)
 * sets. */
static int overridden(const char *entry, char *const extra[])
{
    size_t name = strcspn(entry, "=");
    for (int i = 0; extra && extra[i]; i++)
        if (strncmp(extra[i], entry, name + 1) == 0)
            return 1;
    return 0;
}

/* Runs this binary as a helper with extra environment entries (NULL-terminated, may be
 * NULL), the VMM fd (or -1) passed as VMM_FD; returns its exit status. */
static int run_helper(char *const args[], char *const extra_env[], int vmm_fd)
{
    /* Under a user-mode emulator (FERRY_TEST_EMULATOR: the aarch64 check), in it. */
    char *emulator = getenv("FERRY_TEST_EMULATOR");
    char *argv[17] = {emulator, self_exe, "--helper"};
    int argc = 3;
    for (int i = 0; args[i] && argc < 16; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    char *envp[256];
    int envc = 0;
    for (int i = 0; extra_env && extra_env[i]; i++)
        envp[envc++] = extra_env[i];
    for (char **e = environ; *e && envc < 255; e++)
        if (!overridden(*e, extra_env)) /* no duplicates: emulators may keep the last */
            envp[envc++] = *e;
    envp[envc] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (vmm_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, vmm_fd, VMM_FD);
    pid_t pid;
    char **run = emulator && *emulator ? argv : argv + 1;
    int rc = posix_spawnp(&pid, run[0], &fa, NULL, run, envp);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

static void hex_encode(const void *data, size_t n, char *out)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static int hex_decode(const char *text, void *data, size_t n)
{
    unsigned char *p = data;
    if (strlen(text) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(text + 2 * i, "%2x", &v) != 1)
            return -1;
        p[i] = (unsigned char)v;
    }
    return 0;
}

#define HCHECK(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "helper %s:%d: %s failed\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ipc HANDLE SIZE SEED: opens the handle, checks SIZE bytes of th_fill(SEED) there, checks a
 * second open gives the same pointer, sets the 32-bit word after them to 1, closes. */
static int helper_ipc(char **argv)
{
    CUipcMemHandle h;
    HCHECK(hex_decode(argv[0], &h, sizeof(h)) == 0);
    size_t size = strtoul(argv[1], NULL, 10);
    uint64_t seed = strtoull(argv[2], NULL, 10);
    CUdeviceptr d, again;
    HCHECK(cu->cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    HCHECK(cu->cuIpcOpenMemHandle(&again, h, 0) == CUDA_SUCCESS);
    HCHECK(again == d);
    HCHECK(fake_live() == 2);
    unsigned int type = 0;
    HCHECK(cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d) == 0);
    HCHECK(type == CU_MEMORYTYPE_DEVICE);
    char *copy = malloc(size);
    HCHECK(copy);
    HCHECK(cu->cuMemcpy(dptr_of(copy), d, size) == CUDA_SUCCESS);
    HCHECK(th_check(copy, size, seed));
    free(copy);
    CUstream s;
    HCHECK(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    HCHECK(cu->cuStreamWriteValue32(s, d + size, 1, 0) == CUDA_SUCCESS);
    HCHECK(cu->cuStreamSynchronize(s) == CUDA_SUCCESS);
    HCHECK(cu->cuStreamDestroy(s) == CUDA_SUCCESS);
    HCHECK(cu->cuIpcCloseMemHandle(d) == CUDA_SUCCESS);
    HCHECK(fake_live() == 1);
    HCHECK(cu->cuIpcCloseMemHandle(d) == CUDA_SUCCESS);
    HCHECK(cu->cuIpcCloseMemHandle(d) == CUDA_ERROR_INVALID_VALUE);
    HCHECK(fake_live() == 0);
    return 0;
}

/* ipc-open HANDLE EXPECTED: opening the handle answers EXPECTED. */
static int helper_ipc_open(char **argv)
{
    CUipcMemHandle h;
    HCHECK(hex_decode(argv[0], &h, sizeof(h)) == 0);
    CUdeviceptr d;
    CUresult rc = cu->cuIpcOpenMemHandle(&d, h, 0);
    if (rc != atoi(argv[1])) {
        fprintf(stderr, "helper: cuIpcOpenMemHandle answered %d\n", rc);
        return 1;
    }
    HCHECK(fake_live() == 0);
    return 0;
}

/* vmm SIZE SEED: imports the POSIX fd at VMM_FD, maps it, checks SIZE bytes of
 * th_fill(SEED), sets the word after them to 1, and releases everything. */
static int helper_vmm(char **argv)
{
    size_t size = strtoul(argv[0], NULL, 10);
    uint64_t seed = strtoull(argv[1], NULL, 10);
    CUmemGenericAllocationHandle h;
    HCHECK(cu->cuMemImportFromShareableHandle(&h, (void *)(intptr_t)VMM_FD,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0);
    close(VMM_FD);
    CUdeviceptr va;
    HCHECK(cu->cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    HCHECK(cu->cuMemMap(va, 2 * MiB, 0, h, 0) == CUDA_SUCCESS);
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    HCHECK(cu->cuMemSetAccess(va, 2 * MiB, &access, 1) == CUDA_SUCCESS);
    char *copy = malloc(size);
    HCHECK(copy);
    HCHECK(cu->cuMemcpy(dptr_of(copy), va, size) == CUDA_SUCCESS);
    HCHECK(th_check(copy, size, seed));
    free(copy);
    uint32_t one = 1;
    HCHECK(cu->cuMemcpy(va + size, dptr_of(&one), sizeof(one)) == CUDA_SUCCESS);
    HCHECK(fake_live() == 3); /* handle, reservation, mapping */
    HCHECK(cu->cuMemRelease(h) == CUDA_SUCCESS);
    HCHECK(cu->cuMemUnmap(va, 2 * MiB) == CUDA_SUCCESS);
    HCHECK(cu->cuMemAddressFree(va, 2 * MiB) == CUDA_SUCCESS);
    HCHECK(fake_live() == 0);
    return 0;
}

/* env: run with FERRY_FAKE_CUDA_FAIL, _HIDE and _MEMORY set (see test_environment). */
static int helper_env(void)
{
    HCHECK(cu->cuMemCreate == NULL); /* hidden, and optional for ferry */
    HCHECK(cu->cuMemMap != NULL);
    CUdeviceptr a, b, c;
    HCHECK(cu->cuMemAlloc(&a, 3 * MiB) == CUDA_SUCCESS);
    HCHECK(cu->cuMemAlloc(&b, 1024) == CUDA_ERROR_OUT_OF_MEMORY);    /* the 2nd call, injected */
    HCHECK(cu->cuMemAlloc(&b, 2 * MiB) == CUDA_ERROR_OUT_OF_MEMORY); /* over 4M */
    HCHECK(cu->cuMemAlloc(&b, 1 * MiB) == CUDA_SUCCESS);
    HCHECK(cu->cuMemFree(a) == CUDA_SUCCESS);
    HCHECK(cu->cuMemAlloc(&c, 2 * MiB) == CUDA_SUCCESS);
    HCHECK(fake_calls("cuMemAlloc") == 5);
    CUstream s;
    HCHECK(cu->cuStreamCreate(&s, 0) == 999);
    HCHECK(cu->cuStreamCreate(&s, 0) == 999);
    HCHECK(cu->cuStreamCreate(&s, 0) == CUDA_SUCCESS);
    HCHECK(cu->cuStreamDestroy(s) == CUDA_SUCCESS);
    HCHECK(cu->cuMemFree(b) == CUDA_SUCCESS);
    HCHECK(cu->cuMemFree(c) == CUDA_SUCCESS);
    HCHECK(fake_live() == 0);
    return 0;
}

/* nodevice: FERRY_FAKE_CUDA_DEVICES=0. */
static int helper_nodevice(void)
{
    HCHECK(cu->device_count == 0);
    CUdevice dev;
    HCHECK(cu->cuDeviceGet(&dev, 0) == CUDA_ERROR_INVALID_DEVICE);
    CUdeviceptr d;
    HCHECK(cu->cuMemAlloc(&d, 64) == CUDA_ERROR_INVALID_CONTEXT);
    return 0;
}

static int helper_main(int argc, char **argv)
{
    if (load_driver() != 0)
        return 1;
    const char *mode = argv[2];
    if (strcmp(mode, "ipc") == 0 && argc >= 6)
        return helper_ipc(argv + 3);
    if (strcmp(mode, "ipc-open") == 0 && argc >= 5)
        return helper_ipc_open(argv + 3);
    if (strcmp(mode, "vmm") == 0 && argc >= 5)
        return helper_vmm(argv + 3);
    if (strcmp(mode, "env") == 0)
        return helper_env();
    if (strcmp(mode, "nodevice") == 0)
        return helper_nodevice();
    fprintf(stderr, "helper: unknown mode %s\n", mode);
    return 2;
}

/* ---- tests ----------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    fake_reset();
    return 0;
}

/* Every test releases everything it made. */
static int teardown(void **state)
{
    (void)state;
    assert_int_equal(fake_live(), 0);
    return 0;
}

static void test_devices_and_errors(void **state)
{
    (void)state;
    assert_int_equal(cu->driver_version, 13000);
    assert_int_equal(cu->device_count, 2);
    char name[64];
    assert_int_equal(cu->cuDeviceGetName(name, sizeof(name), 1), CUDA_SUCCESS);
    assert_string_equal(name, "ferry fake GPU 1");
    CUdevice dev;
    assert_int_equal(cu->cuDeviceGet(&dev, 1), CUDA_SUCCESS);
    assert_int_equal(dev, 1);
    assert_int_equal(cu->cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cu->cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);

    static const struct {
        int attr, value;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
        {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
        {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 1},
        {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 2},
        {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0},
    };
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        int v = -1;
        assert_int_equal(cu->cuDeviceGetAttribute(&v, attrs[i].attr, 1), CUDA_SUCCESS);
        assert_int_equal(v, attrs[i].value);
    }
    int v;
    assert_int_equal(cu->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 2),
                     CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cu->cuDeviceCanAccessPeer(&v, 0, 1), CUDA_SUCCESS);
    assert_int_equal(v, 1);
    assert_int_equal(cu->cuDeviceCanAccessPeer(&v, 1, 1), CUDA_SUCCESS);
    assert_int_equal(v, 0);
    assert_int_equal(cu->cuDeviceCanAccessPeer(&v, 0, 5), CUDA_ERROR_INVALID_DEVICE);

    const char *text;
    assert_int_equal(cu->cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
    assert_string_equal(text, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_int_equal(cu->cuGetErrorName(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, &text), 0);
    assert_string_equal(text, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED");
    assert_int_equal(cu->cuGetErrorString(CUDA_ERROR_NOT_READY, &text), CUDA_SUCCESS);
    assert_non_null(text);
    assert_int_equal(cu->cuGetErrorName(12345, &text), CUDA_ERROR_INVALID_VALUE);
    assert_null(text);

    /* The loader's entry point answers unknown names and old versions like CUDA's. */
    CUresult (*get_proc)(const char *, void **, int, unsigned long long, int *);
    void *sym = dlsym(cu->library, "cuGetProcAddress_v2");
    assert_non_null(sym);
    memcpy(&get_proc, &sym, sizeof(sym));
    void *fn = &v;
    int status = -1;
    assert_int_equal(get_proc("cuNoSuchThing", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(status, 1);
    assert_null(fn);
    assert_int_equal(get_proc("cuMemCreate", &fn, 9000, 0, &status), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(status, 2);
    assert_int_equal(get_proc("cuMemCreate", &fn, 13000, 0, &status), CUDA_SUCCESS);
    assert_int_equal(status, 0);
    assert_non_null(fn);
    /* Every entry point of driver.h, optional ones included, is there. */
#define CHECK_SLOT_(name, version, mandatory, params) assert_non_null(cu->name);
    FERRY_CUDA_FUNCTIONS(CHECK_SLOT_)
#undef CHECK_SLOT_
    /* Entry points are not exported: only cuGetProcAddress_v2 reaches them. */
    assert_null(dlsym(cu->library, "cuMemAlloc"));
}

static void *alloc_without_context(void *arg)
{
    (void)arg;
    CUdeviceptr d;
    return (void *)(intptr_t)cu->cuMemAlloc(&d, 64);
}

static void test_contexts(void **state)
{
    (void)state;
    CUcontext current = NULL, other = NULL;
    assert_int_equal(cu->cuCtxGetCurrent(&current), CUDA_SUCCESS);
    assert_non_null(current);
    /* A thread without a current context cannot allocate. */
    pthread_t t;
    void *ret;
    assert_int_equal(pthread_create(&t, NULL, alloc_without_context, NULL), 0);
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_int_equal((intptr_t)ret, CUDA_ERROR_INVALID_CONTEXT);

    assert_int_equal(cu->cuDevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
    assert_non_null(other);
    assert_ptr_not_equal(other, current);
    assert_int_equal(cu->cuCtxSetCurrent(other), CUDA_SUCCESS);
    CUdeviceptr d;
    assert_int_equal(cu->cuMemAlloc(&d, 64), CUDA_SUCCESS);
    int ordinal = -1;
    assert_int_equal(cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d),
                     CUDA_SUCCESS);
    assert_int_equal(ordinal, 1);
    assert_int_equal(cu->cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu->cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
    /* Released: no longer usable. */
    assert_int_equal(cu->cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu->cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu->cuCtxSetCurrent((CUcontext)&ordinal), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu->cuCtxSetCurrent(current), CUDA_SUCCESS);
}

static void test_alloc_copy_free(void **state)
{
    (void)state;
    const size_t n = 1 * MiB + 12;
    CUdeviceptr a, b;
    assert_int_equal(cu->cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemAlloc(&a, n), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&b, n), CUDA_SUCCESS);
    assert_int_equal(fake_live(), 2);
    unsigned char *host = malloc(n), *back = malloc(n);
    assert_non_null(host);
    assert_non_null(back);
    th_fill(host, n, 7);
    assert_int_equal(cu->cuMemcpy(a, dptr_of(host), n), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemcpy(b, a, n), CUDA_SUCCESS);
    memset(back, 0, n);
    assert_int_equal(cu->cuMemcpy(dptr_of(back), b, n), CUDA_SUCCESS);
    assert_true(th_check(back, n, 7));
    /* Out of the allocation. */
    assert_int_equal(cu->cuMemcpy(b + 16, a, n), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemcpy(0, a, 16), CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cu->cuMemsetD32(a + 4, 0xdeadbeef, 3), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(a + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemsetD32(dptr_of(host), 0, 1), CUDA_ERROR_INVALID_VALUE);
    uint32_t words[5];
    assert_int_equal(cu->cuMemcpy(dptr_of(words), a, sizeof(words)), CUDA_SUCCESS);
    assert_int_equal(words[1], 0xdeadbeef);
    assert_int_equal(words[3], 0xdeadbeef);
    assert_int_not_equal(words[4], 0xdeadbeef);

    unsigned int type = 0;
    int ordinal = -1;
    assert_int_equal(cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 100),
                     CUDA_SUCCESS);
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a),
                     CUDA_SUCCESS);
    assert_int_equal(ordinal, 0);
    assert_int_equal(
        cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr_of(host)),
        CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cu->cuMemFree(a + 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemFree(b), CUDA_SUCCESS);
    free(host);
    free(back);
}

/* Memory pools: blocks handed out and taken back in stream order, a freed block refused as a
 * copy's destination, cuMemFree of pool memory, trimming. */
static void test_memory_pool(void **state)
{
    (void)state;
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool pool;
    props.location.id = 7;
    assert_int_equal(cu->cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_DEVICE);
    props.location.id = 0;
    assert_int_equal(cu->cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    unsigned long long keep = ~0ull;
    assert_int_equal(cu->cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
                     CUDA_SUCCESS);
    assert_int_equal(cu->cuMemPoolSetAttribute(pool, 9, &keep), CUDA_ERROR_INVALID_VALUE);
    CUstream s;
    assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr a, b, words;
    int live = fake_live();
    assert_int_equal(cu->cuMemAllocFromPoolAsync(&a, 0, pool, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemAllocFromPoolAsync(&a, MiB, pool, s), CUDA_SUCCESS);
    assert_int_equal(fake_live(), live + 1);
    unsigned char host[64];
    th_fill(host, sizeof(host), 5);
    assert_int_equal(cu->cuMemcpyAsync(a, dptr_of(host), sizeof(host), s), CUDA_SUCCESS);

    /* A free behind a blocked wait: the block is not handed out to another stream meanwhile,
     * and a copy into it after the free is refused. */
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(s, words, 1, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFreeAsync(a, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemcpy(a, dptr_of(host), 8), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemAllocFromPoolAsync(&b, MiB, pool, NULL), CUDA_SUCCESS);
    assert_true(b != a);
    store_word(words, 1);
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    /* Run: the block is the pool's again, for any stream; cuMemFree takes pool memory too. */
    assert_int_equal(fake_live(), live + 2); /* b and words */
    CUdeviceptr c;
    assert_int_equal(cu->cuMemAllocFromPoolAsync(&c, MiB - 100, pool, NULL), CUDA_SUCCESS);
    assert_true(c == a);
    assert_int_equal(cu->cuMemFree(c), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(c), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(fake_live(), live + 1); /* words */
    assert_int_equal(cu->cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAllocFromPoolAsync(&a, 64, pool, s), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
    assert_int_equal(fake_live(), live);
}

/* cuStreamWaitEvent: work on one stream waits for an event recorded on another. */
static void test_stream_wait_event(void **state)
{
    (void)state;
    CUdeviceptr words;
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    CUstream a, b;
    CUevent e;
    assert_int_equal(cu->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS); /* never recorded: done */
    assert_int_equal(cu->cuStreamSynchronize(b), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitEvent(b, e, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuStreamWaitValue32(a, words, 1, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWriteValue32(b, words + 4, 9, 0), CUDA_SUCCESS);
    sleep_ms(20);
    assert_int_equal(cu->cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    assert_int_equal(load_word(words + 4), 0);
    store_word(words, 1);
    assert_int_equal(cu->cuStreamSynchronize(b), CUDA_SUCCESS);
    assert_int_equal(load_word(words + 4), 9);
    /* The per-thread default stream (CU_STREAM_PER_THREAD) takes work and waits too. */
    CUstream per_thread = (CUstream)(uintptr_t)2;
    assert_int_equal(cu->cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitEvent(per_thread, e, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWriteValue32(per_thread, words + 8, 3, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamSynchronize(per_thread), CUDA_SUCCESS);
    assert_int_equal(load_word(words + 8), 3);
    assert_int_equal(cu->cuStreamDestroy(per_thread), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu->cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(a), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(b), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
}

static void test_host_register(void **state)
{
    (void)state;
    const size_t n = 64 * 1024;
    char *buf = aligned_alloc(4096, n);
    assert_non_null(buf);
    assert_int_equal(cu->cuMemHostRegister(buf, n, 0x4), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(
        cu->cuMemHostRegister(buf, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
        CUDA_SUCCESS);
    assert_int_equal(cu->cuMemHostRegister(buf + 100, 10, 0),
                     CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    assert_int_equal(fake_live(), 1);
    CUdeviceptr d;
    assert_int_equal(cu->cuMemHostGetDevicePointer(&d, buf + 8, 0), CUDA_SUCCESS);
    assert_ptr_equal(host_of(d), buf + 8);
    char other;
    assert_int_equal(cu->cuMemHostGetDevicePointer(&d, &other, 0), CUDA_ERROR_INVALID_VALUE);
    unsigned int type = 0;
    assert_int_equal(
        cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr_of(buf)), 0);
    assert_int_equal(type, CU_MEMORYTYPE_HOST);
    /* Stream memory operations accept registered memory. */
    CUstream s;
    assert_int_equal(cu->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWriteValue32(s, dptr_of(buf), 42, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(load_word(dptr_of(buf)), 42);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemHostUnregister(buf + 8), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cu->cuMemHostUnregister(buf), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    free(buf);
}

struct poke {
    CUdeviceptr word;
    uint32_t value;
    long delay_ms;
};

static void *poke_later(void *arg)
{
    struct poke *p = arg;
    sleep_ms(p->delay_ms);
    store_word(p->word, p->value);
    return NULL;
}

struct observer {
    CUdeviceptr done, data;
    size_t n;
    int saw_data; /* the data was complete when the done word appeared */
};

static void *observe(void *arg)
{
    struct observer *o = arg;
    while (load_word(o->done) != 7)
        sleep_ms(1);
    o->saw_data = th_check(host_of(o->data), o->n, 11);
    return NULL;
}

static void test_stream_order(void **state)
{
    (void)state;
    const size_t n = 256 * 1024;
    CUdeviceptr src, dst, words;
    assert_int_equal(cu->cuMemAlloc(&src, n), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&dst, n), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(dst, 0, n / 4), CUDA_SUCCESS);
    th_fill(host_of(src), n, 11);
    CUdeviceptr flag = words, done = words + 4;

    CUstream s;
    assert_int_equal(cu->cuStreamCreate(&s, 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamQuery(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(s, flag, 1, 2), CUDA_ERROR_INVALID_VALUE);
    uint32_t pageable = 0;
    assert_int_equal(cu->cuStreamWaitValue32(s, dptr_of(&pageable), 1, 0),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuStreamWriteValue32(s, flag + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);

    /* wait(flag >= 1); copy; write(done = 7): nothing after the wait runs before the flag. */
    assert_int_equal(cu->cuStreamWaitValue32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemcpyAsync(dst, src, n, s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWriteValue32(s, done, 7, CU_STREAM_WRITE_VALUE_DEFAULT),
                     CUDA_SUCCESS);
    struct observer o = {.done = done, .data = dst, .n = n};
    pthread_t watcher;
    assert_int_equal(pthread_create(&watcher, NULL, observe, &o), 0);
    sleep_ms(50);
    assert_int_equal(cu->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    assert_int_equal(load_word(done), 0);

    struct poke p = {.word = flag, .value = 1, .delay_ms = 20};
    pthread_t poker;
    assert_int_equal(pthread_create(&poker, NULL, poke_later, &p), 0);
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamQuery(s), CUDA_SUCCESS);
    assert_int_equal(pthread_join(poker, NULL), 0);
    assert_int_equal(pthread_join(watcher, NULL), 0);
    assert_int_equal(load_word(done), 7);
    assert_true(o.saw_data);

    /* EQ waits for the exact value; GEQ compares cyclically. */
    store_word(flag, 0xfffffff0u);
    assert_int_equal(cu->cuStreamWaitValue32(s, flag, 0xffffffe0u, CU_STREAM_WAIT_VALUE_GEQ), 0);
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(s, flag, 5, CU_STREAM_WAIT_VALUE_EQ), 0);
    assert_int_equal(cu->cuStreamWriteValue32(s, done, 8, 0), CUDA_SUCCESS);
    p.value = 6;
    p.delay_ms = 0;
    assert_int_equal(pthread_create(&poker, NULL, poke_later, &p), 0);
    assert_int_equal(pthread_join(poker, NULL), 0);
    sleep_ms(20);
    assert_int_equal(cu->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    store_word(flag, 5);
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(load_word(done), 8);

    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu->cuMemFree(src), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(dst), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
}

static void test_pageable_copy_returns_done(void **state)
{
    (void)state;
    const size_t n = 4096;
    CUdeviceptr d, words;
    assert_int_equal(cu->cuMemAlloc(&d, n), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    CUstream s;
    assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    /* The pageable copy waits for the wait before it, then copies before returning. */
    assert_int_equal(cu->cuStreamWaitValue32(s, words, 1, 0), CUDA_SUCCESS);
    struct poke p = {.word = words, .value = 1, .delay_ms = 30};
    pthread_t poker;
    assert_int_equal(pthread_create(&poker, NULL, poke_later, &p), 0);
    unsigned char buf[4096];
    th_fill(buf, n, 3);
    assert_int_equal(cu->cuMemcpyAsync(d, dptr_of(buf), n, s), CUDA_SUCCESS);
    memset(buf, 0, n); /* reused at once */
    assert_int_equal(cu->cuStreamQuery(s), CUDA_SUCCESS);
    assert_int_equal(pthread_join(poker, NULL), 0);
    assert_int_equal(cu->cuMemcpyAsync(dptr_of(buf), d, n, s), CUDA_SUCCESS);
    assert_true(th_check(buf, n, 3));
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
}

static void test_events(void **state)
{
    (void)state;
    CUdeviceptr words;
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    CUstream s;
    CUevent e;
    assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventCreate(&e, 0x4), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventQuery(e), CUDA_SUCCESS); /* never recorded */
    assert_int_equal(cu->cuStreamWaitValue32(s, words, 1, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventRecord(e, s), CUDA_SUCCESS);
    sleep_ms(10);
    assert_int_equal(cu->cuEventQuery(e), CUDA_ERROR_NOT_READY);
    struct poke p = {.word = words, .value = 1, .delay_ms = 20};
    pthread_t poker;
    assert_int_equal(pthread_create(&poker, NULL, poke_later, &p), 0);
    assert_int_equal(cu->cuEventSynchronize(e), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventQuery(e), CUDA_SUCCESS);
    assert_int_equal(pthread_join(poker, NULL), 0);
    /* Recorded on the legacy stream. */
    assert_int_equal(cu->cuEventRecord(e, NULL), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventSynchronize(e), CUDA_SUCCESS);
    /* Destroyed while its marker is pending: the marker runs later without harm. */
    assert_int_equal(cu->cuStreamWaitValue32(s, words, 2, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventDestroy(e), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu->cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
    store_word(words, 2);
    assert_int_equal(cu->cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
}

static void test_destroy_gives_up_blocked_wait(void **state)
{
    (void)state;
    CUdeviceptr words, a;
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&a, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    CUstream s;
    CUevent e;
    assert_int_equal(cu->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventCreate(&e, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWriteValue32(s, words + 4, 3, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(s, words, 1, 0), CUDA_SUCCESS); /* never */
    assert_int_equal(cu->cuStreamWriteValue32(s, words + 8, 9, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemcpyAsync(a, words, 16, s), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventRecord(e, s), CUDA_SUCCESS);
    sleep_ms(10);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(load_word(words + 4), 3); /* ran before the wait */
    assert_int_equal(load_word(words + 8), 0); /* queued behind it: dropped */
    assert_int_equal(cu->cuEventQuery(e), CUDA_ERROR_NOT_READY);
    assert_int_equal(cu->cuEventSynchronize(e), CUDA_ERROR_NOT_READY);
    assert_int_equal(cu->cuEventDestroy(e), CUDA_SUCCESS);
    /* Nothing pins the memory any more. */
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(a), CUDA_SUCCESS);
}

static void test_legacy_stream_implicit_sync(void **state)
{
    (void)state;
    CUdeviceptr words, a, b;
    assert_int_equal(cu->cuMemAlloc(&words, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&a, 4096), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemAlloc(&b, 4096), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(words, 0, 16), CUDA_SUCCESS);
    CUstream blocking, nonblocking;
    assert_int_equal(cu->cuStreamCreate(&blocking, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(blocking, words, 1, 0), CUDA_SUCCESS);
    /* Legacy-stream work waits for the blocking stream; a non-blocking stream does not. */
    assert_int_equal(cu->cuMemcpyAsync(b, a, 4096, NULL), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWriteValue32(nonblocking, words + 4, 1, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamSynchronize(nonblocking), CUDA_SUCCESS);
    assert_int_equal(load_word(words + 4), 1);
    sleep_ms(10);
    assert_int_equal(cu->cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    store_word(words, 1);
    assert_int_equal(cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamQuery(blocking), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(blocking), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(nonblocking), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu->cuMemFree(words), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(b), CUDA_SUCCESS);
}

static void test_ipc_across_processes(void **state)
{
    (void)state;
    const size_t offset = 8192, n = 100000;
    CUdeviceptr base;
    assert_int_equal(cu->cuMemAlloc(&base, offset + n + 4), CUDA_SUCCESS);
    CUdeviceptr d = base + offset, word = d + n;
    unsigned char *host = malloc(n);
    assert_non_null(host);
    th_fill(host, n, 99);
    assert_int_equal(cu->cuMemcpy(d, dptr_of(host), n), CUDA_SUCCESS);
    free(host);
    assert_int_equal(cu->cuMemsetD32(word, 0, 1), CUDA_SUCCESS);

    CUipcMemHandle h;
    assert_int_equal(cu->cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
    uint32_t pageable;
    CUipcMemHandle bad;
    assert_int_equal(cu->cuIpcGetMemHandle(&bad, dptr_of(&pageable)), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr opened;
    /* The exporting process cannot open its own handle, as with CUDA. */
    assert_int_equal(cu->cuIpcOpenMemHandle(&opened, h, 0), CUDA_ERROR_INVALID_CONTEXT);
    memset(&bad, 0, sizeof(bad));
    assert_int_equal(cu->cuIpcOpenMemHandle(&opened, bad, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuIpcOpenMemHandle(&opened, h, 2), CUDA_ERROR_INVALID_VALUE);

    /* The child writes the word; a stream here waits for it. */
    CUstream s;
    CUevent e;
    assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamWaitValue32(s, word, 1, CU_STREAM_WAIT_VALUE_EQ), 0);
    assert_int_equal(cu->cuEventRecord(e, s), CUDA_SUCCESS);
    char hex[2 * sizeof(h) + 1], size_text[32];
    hex_encode(&h, sizeof(h), hex);
    snprintf(size_text, sizeof(size_text), "%zu", n);
    char *args[] = {"ipc", hex, size_text, "99", NULL};
    assert_int_equal(run_helper(args, NULL, -1), 0);
    assert_int_equal(cu->cuEventSynchronize(e), CUDA_SUCCESS);
    assert_int_equal(load_word(word), 1);
    assert_int_equal(cu->cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);

    /* Freed: the handle names nothing any more. */
    assert_int_equal(cu->cuMemFree(base), CUDA_SUCCESS);
    char code[16];
    snprintf(code, sizeof(code), "%d", CUDA_ERROR_INVALID_HANDLE);
    char *gone[] = {"ipc-open", hex, code, NULL};
    assert_int_equal(run_helper(gone, NULL, -1), 0);
}

static void test_fault_injection(void **state)
{
    (void)state;
    CUdeviceptr d;
    assert_int_equal(fake_calls("cuMemAlloc"), 0);
    fake_fail("cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult rc = cu->cuMemAlloc(&d, 64);
    assert_int_equal(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(ferry__cuda_fail(cu, "cuMemAlloc", rc), FERRY_NO_MEMORY);
    assert_string_equal(ferry_last_error(),
                        "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory, 2)");
    assert_int_equal(fake_live(), 0);
    assert_int_equal(cu->cuMemAlloc(&d, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemAlloc"), 2);
    assert_int_equal(fake_calls("cuMemFree"), 1);

    /* The 2nd call from now; the driver status of other codes. */
    fake_fail("cuStreamCreate", 2, 999);
    CUstream s;
    assert_int_equal(cu->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);
    rc = cu->cuStreamCreate(&s, 0);
    assert_int_equal(rc, 999);
    assert_int_equal(ferry__cuda_fail(cu, "cuStreamCreate", rc), FERRY_DRIVER);
    assert_string_equal(ferry_last_error(),
                        "cuStreamCreate failed: CUDA_ERROR_UNKNOWN (unknown error, 999)");
    assert_int_equal(cu->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuStreamDestroy(s), CUDA_SUCCESS);

    /* Every call, until cleared. */
    fake_fail("cuEventCreate", 0, CUDA_ERROR_NOT_SUPPORTED);
    CUevent e;
    for (int i = 0; i < 3; i++)
        assert_int_equal(cu->cuEventCreate(&e, 0), CUDA_ERROR_NOT_SUPPORTED);
    fake_fail("cuEventCreate", 0, 0);
    assert_int_equal(cu->cuEventCreate(&e, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuEventCreate"), 4);

    /* Reset clears failures still armed and the counters. */
    fake_fail("cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY);
    fake_reset();
    assert_int_equal(fake_calls("cuMemAlloc"), 0);
    assert_int_equal(fake_calls("cuNoSuchThing"), 0);
    assert_int_equal(cu->cuMemAlloc(&d, 64), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemFree(d), CUDA_SUCCESS);
}

static void test_environment(void **state)
{
    (void)state;
    char *env_args[] = {"env", NULL};
    char *env[] = {"FERRY_FAKE_CUDA_FAIL=cuMemAlloc:2:2,cuStreamCreate:1:999,cuStreamCreate:2:999",
                   "FERRY_FAKE_CUDA_HIDE=cuMemCreate", "FERRY_FAKE_CUDA_MEMORY=4M", NULL};
    assert_int_equal(run_helper(env_args, env, -1), 0);
    char *nodev_args[] = {"nodevice", NULL};
    char *nodev[] = {"FERRY_FAKE_CUDA_DEVICES=0", NULL};
    assert_int_equal(run_helper(nodev_args, nodev, -1), 0);
}

/* A child forked (without exec) after the parent initialised the driver cannot use it, as
 * with CUDA. */
static void test_fork_child_refused(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        CUdeviceptr d;
        int count;
        _exit(cu->cuMemAlloc(&d, 64) == CUDA_ERROR_NOT_INITIALIZED &&
                      cu->cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED
                  ? 0
                  : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_vmm(void **state)
{
    (void)state;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    assert_int_equal(cu->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     0);
    assert_int_equal(g, 2 * MiB);

    /* FABRIC is claimed by the device but refused, as on the real machine. */
    CUmemGenericAllocationHandle h;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    assert_int_equal(cu->cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_PERMITTED);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    assert_int_equal(cu->cuMemCreate(&h, MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 7;
    assert_int_equal(cu->cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
    prop.location.id = 0;
    assert_int_equal(cu->cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_SUCCESS);

    CUdeviceptr va;
    assert_int_equal(cu->cuMemAddressReserve(&va, 4 * MiB, 4 * MiB, 0, 0), CUDA_SUCCESS);
    assert_int_equal(va % (4 * MiB), 0);
    assert_int_equal(cu->cuMemMap(va + MiB, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemMap(va + 2 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemMap(va, 2 * MiB, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(fake_live(), 3);
    const size_t n = 12345;
    unsigned char *host = malloc(n);
    assert_non_null(host);
    th_fill(host, n, 5);
    /* No access yet. */
    assert_int_equal(cu->cuMemcpy(va, dptr_of(host), n), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(cu->cuMemSetAccess(va, 4 * MiB, &access, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemSetAccess(va, 2 * MiB, &access, 1), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemcpy(va, dptr_of(host), n), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemsetD32(va + MiB, 0, 4), CUDA_SUCCESS);
    free(host);
    unsigned int type = 0;
    assert_int_equal(cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va), 0);
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    /* Reserved but unmapped address space is not memory. */
    assert_int_equal(cu->cuMemsetD32(va + 2 * MiB, 0, 1), CUDA_ERROR_INVALID_VALUE);

    int fd = -1;
    assert_int_equal(cu->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
                     CUDA_ERROR_NOT_PERMITTED);
    assert_int_equal(
        cu->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), 0);
    assert_true(fd >= 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    char size_text[32];
    snprintf(size_text, sizeof(size_text), "%zu", n);
    char *args[] = {"vmm", size_text, "5", NULL};
    assert_int_equal(run_helper(args, NULL, fd), 0);
    close(fd);
    uint32_t word = 0;
    assert_int_equal(cu->cuMemcpy(dptr_of(&word), va + n, 4), CUDA_SUCCESS);
    assert_int_equal(word, 1);

    /* Something that is not an exported handle is refused. */
    CUmemGenericAllocationHandle other;
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(devnull >= 0);
    assert_int_equal(cu->cuMemImportFromShareableHandle(&other, (void *)(intptr_t)devnull,
                                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     CUDA_ERROR_INVALID_VALUE);
    close(devnull);

    /* Released while mapped: lives until unmapped. The reservation must be empty to go. */
    assert_int_equal(cu->cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fake_live(), 2);
    assert_int_equal(cu->cuMemAddressFree(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemUnmap(va, MiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemUnmap(va, 2 * MiB), CUDA_SUCCESS);
    assert_int_equal(cu->cuMemUnmap(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemAddressFree(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemAddressFree(va, 4 * MiB), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 1;
    self_exe[n] = '\0';
    if (argc >= 3 && strcmp(argv[1], "--helper") == 0)
        return helper_main(argc, argv);
    setenv("FERRY_CUDA_DRIVER", FERRY_FAKE_CUDA_PATH, 1);
    setenv("FERRY_FAKE_CUDA_DEVICES", "2", 1);
    unsetenv("FERRY_FAKE_CUDA_FAIL");
    unsetenv("FERRY_FAKE_CUDA_HIDE");
    unsetenv("FERRY_FAKE_CUDA_MEMORY");
    if (load_driver() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_devices_and_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_contexts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_copy_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_wait_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_register, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pageable_copy_returns_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_gives_up_blocked_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_legacy_stream_implicit_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_across_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_injection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_environment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork_child_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
