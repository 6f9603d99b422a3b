/* A fake CUDA driver for the test suite: ferry loads it in place of libcuda.so.1
 * (FERRY_CUDA_DRIVER=.../libferry_fakecuda.so) where there is no GPU, so that the logic of
 * the GPU transports runs under the sanitizers. A "device pointer" is a host address here.
 * It is a test double: real GPU tests are the authority on what CUDA does.
 *
 * This file: the entry table behind cuGetProcAddress_v2, call counting and fault
 * injection, error names, devices and primary contexts, and the control functions of
 * fake_cuda_control.h. Environment:
 *   FERRY_FAKE_CUDA_DEVICES  number of devices (default 1, 0 allowed, at most 64)
 *   FERRY_FAKE_CUDA_FAIL     "name:nth:code[,...]": the nth call (1-based; 0 = every call)
 *                            of entry point name returns code
 *   FERRY_FAKE_CUDA_MEMORY   bytes per device (suffix K, M or G) that cuMemAlloc and
 *                            cuMemCreate may take before CUDA_ERROR_OUT_OF_MEMORY
 *                            (default: no limit)
 *   FERRY_FAKE_CUDA_HIDE     "name[,...]": entry points cuGetProcAddress_v2 does not find
 *
 * Where the fake knowingly differs from CUDA:
 *   - device memory is host memory: CPU code that dereferences a device pointer works here
 *     (and would fault on a GPU); peer access is not enforced;
 *   - cuMemsetD32 and cuMemcpy both wait for the copy (CUDA's cuMemsetD32 on device memory is
 *     asynchronous to the host);
 *   - cuIpcGetMemHandle accepts a pointer inside an allocation and cuIpcOpenMemHandle returns
 *     the same offset in the mapping (CUDA documents the base pointer only);
 *   - cuStreamDestroy waits for queued work but gives up a wait that is not satisfied and
 *     drops what is queued behind it (CUDA returns at once and leaves the work pending); an
 *     event whose marker was dropped so answers cuEventSynchronize with NOT_READY at once;
 *   - work queued on a destroyed stream's handle aborts the process (CUDA's behaviour is
 *     undefined: an H100's driver crashed); other calls given it answer INVALID_HANDLE;
 *   - memory is only unmapped (cuMemFree, cuIpcCloseMemHandle, cuMemHostUnregister,
 *     cuMemUnmap) once queued stream work that uses it has run, with a warning after 2 s;
 *   - cuMemAddressFree refuses a reservation that still has mappings;
 *   - stream work reads and writes the fake's memory in relaxed atomic words (see
 *     engine_copy in fake_stream.c). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_cuda_control.h"

#define FAKE_MAX_DEVICES    64
#define FAKE_MAX_RULES      64
#define FAKE_DRIVER_VERSION 13000

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         unsigned long long flags, int *symbolStatus);

pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t fake_progress = PTHREAD_COND_INITIALIZER;

/* ---- the entry table ------------------------------------------------------------------- */

static const struct {
    const char *name;
    int version;
} entry_info[FAKE_ID_COUNT] = {
#define FAKE_INFO_(name, version, mandatory, params) {#name, version},
    FERRY_CUDA_FUNCTIONS(FAKE_INFO_)
#undef FAKE_INFO_
};

static fake_generic_fn entry_fn[FAKE_ID_COUNT];
static int entry_hidden[FAKE_ID_COUNT];

static int entry_id(const char *name, size_t len)
{
    for (int i = 0; i < FAKE_ID_COUNT; i++)
        if (strlen(entry_info[i].name) == len && memcmp(entry_info[i].name, name, len) == 0)
            return i;
    return -1;
}

/* ---- configuration, counters and injected failures ------------------------------------- */

static int device_count = 1;
static unsigned long long memory_limit; /* 0: none */
static size_t device_used[FAKE_MAX_DEVICES];

static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long call_count[FAKE_ID_COUNT];
static struct rule {
    int id;
    int every;
    unsigned long at; /* the call number that fails, unless every */
    CUresult code;
} rules[FAKE_MAX_RULES];
static int rule_count;

static int initialized; /* cuInit succeeded (atomic) */
static pid_t init_pid;  /* the process that called it (atomic) */

void fake_warn(const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    fprintf(stderr, "ferry fake CUDA: %s\n", text);
}

/* Adds a rule (under ctl_lock): call number nth from now fails with code; nth 0: every call;
 * code 0 clears the rules of id. */
static void add_rule(int id, long nth, CUresult code)
{
    if (code == CUDA_SUCCESS) {
        int kept = 0;
        for (int i = 0; i < rule_count; i++)
            if (rules[i].id != id)
                rules[kept++] = rules[i];
        rule_count = kept;
        return;
    }
    if (nth < 0) {
        fake_warn("negative call number %ld for %s ignored", nth, entry_info[id].name);
        return;
    }
    if (rule_count == FAKE_MAX_RULES) {
        fake_warn("more than %d injected failures; %s ignored", FAKE_MAX_RULES,
                  entry_info[id].name);
        return;
    }
    rules[rule_count++] = (struct rule){
        .id = id, .every = nth == 0, .at = call_count[id] + (unsigned long)nth, .code = code};
}

/* Parses FERRY_FAKE_CUDA_FAIL: "name:nth:code[,name:nth:code...]". */
static void parse_fail(const char *spec)
{
    while (*spec) {
        const char *end = strchr(spec, ',');
        size_t len = end ? (size_t)(end - spec) : strlen(spec);
        const char *colon = memchr(spec, ':', len);
        char *after = NULL;
        long nth = -1, code = 0;
        if (colon) {
            nth = strtol(colon + 1, &after, 10);
            if (after && *after == ':')
                code = strtol(after + 1, &after, 10);
            else
                after = NULL;
        }
        int id = colon ? entry_id(spec, (size_t)(colon - spec)) : -1;
        if (!colon || !after || after != spec + len || id < 0 || nth < 0)
            fake_warn("FERRY_FAKE_CUDA_FAIL: ignoring \"%.*s\" (want name:nth:code)", (int)len,
                      spec);
        else
            add_rule(id, nth, (CUresult)code);
        spec += len;
        if (*spec == ',')
            spec++;
    }
}

static void parse_hide(const char *spec)
{
    while (*spec) {
        size_t len = strcspn(spec, ",");
        int id = entry_id(spec, len);
        if (id >= 0)
            entry_hidden[id] = 1;
        else if (len)
            fake_warn("FERRY_FAKE_CUDA_HIDE: unknown entry point \"%.*s\"", (int)len, spec);
        spec += len;
        if (*spec == ',')
            spec++;
    }
}

static void parse_memory(const char *text)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    unsigned long long unit = 1;
    if (*end == 'K' || *end == 'k')
        unit = 1ull << 10;
    else if (*end == 'M' || *end == 'm')
        unit = 1ull << 20;
    else if (*end == 'G' || *end == 'g')
        unit = 1ull << 30;
    if (unit != 1)
        end++;
    if (errno || end == text || *end || v > ~0ull / unit) {
        fake_warn("FERRY_FAKE_CUDA_MEMORY: ignoring \"%s\"", text);
        return;
    }
    memory_limit = v * unit;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&ctl_lock);
    pthread_mutex_lock(&fake_lock);
}

static void atfork_release(void)
{
    pthread_mutex_unlock(&fake_lock);
    pthread_mutex_unlock(&ctl_lock);
}

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

struct CUctx_st {
    int device; /* set once, at setup */
    int refs;   /* atomic */
};

static struct CUctx_st contexts[FAKE_MAX_DEVICES];
static _Thread_local struct CUctx_st *current_context;

static void register_here(fake_generic_fn *table);

static void setup(void)
{
    const char *v = getenv("FERRY_FAKE_CUDA_DEVICES");
    if (v && *v) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end || n < 0 || n > FAKE_MAX_DEVICES)
            fake_warn("FERRY_FAKE_CUDA_DEVICES: ignoring \"%s\" (want 0 to %d)", v,
                      FAKE_MAX_DEVICES);
        else
            device_count = (int)n;
    }
    v = getenv("FERRY_FAKE_CUDA_MEMORY");
    if (v && *v)
        parse_memory(v);
    v = getenv("FERRY_FAKE_CUDA_HIDE");
    if (v)
        parse_hide(v);
    v = getenv("FERRY_FAKE_CUDA_FAIL");
    if (v)
        parse_fail(v);
    for (int i = 0; i < FAKE_MAX_DEVICES; i++)
        contexts[i].device = i;
    register_here(entry_fn);
    fake_register_mem(entry_fn);
    fake_register_stream(entry_fn);
    fake_register_vmm(entry_fn);
    fake_register_pool(entry_fn);
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

CUresult fake_enter(enum fake_id id)
{
    pthread_once(&setup_once, setup);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&ctl_lock);
    unsigned long n = ++call_count[id];
    for (int i = 0; i < rule_count && rc == CUDA_SUCCESS; i++)
        if (rules[i].id == (int)id && (rules[i].every || rules[i].at == n))
            rc = rules[i].code;
    pthread_mutex_unlock(&ctl_lock);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* CUDA cannot be used in a child forked after the parent initialised it. */
    if (__atomic_load_n(&initialized, __ATOMIC_ACQUIRE) &&
        __atomic_load_n(&init_pid, __ATOMIC_RELAXED) != getpid())
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

CUresult fake_need_init(void)
{
    return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS
                                                           : CUDA_ERROR_NOT_INITIALIZED;
}

int fake_device_count(void)
{
    return device_count;
}

CUresult fake_reserve_bytes(int device, size_t size)
{
    if (device < 0 || device >= FAKE_MAX_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    if (memory_limit && (size > memory_limit || device_used[device] > memory_limit - size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    device_used[device] += size;
    return CUDA_SUCCESS;
}

void fake_unreserve_bytes(int device, size_t size)
{
    if (device >= 0 && device < FAKE_MAX_DEVICES)
        device_used[device] -= size;
}

/* ---- error names ------------------------------------------------------------------------ */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "driver not initialized"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "stub driver library loaded"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "call needs a newer driver"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {205, "CUDA_ERROR_MAP_FAILED", "mapping failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmapping failed"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access not supported"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "operating system call failed"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "illegal state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "illegal memory access"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access not enabled"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context destroyed"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory already registered"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory not registered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not ready"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "driver and kernel module versions differ"},
    {909, "CUDA_ERROR_TIMEOUT", "timed out"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult code, const char **str, int want_name)
{
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].code == code) {
            *str = want_name ? errors[i].name : errors[i].text;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FAKE_DECLARE(cuGetErrorName);
static CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    FAKE_ENTER(cuGetErrorName);
    return error_lookup(error, pStr, 1);
}

FAKE_DECLARE(cuGetErrorString);
static CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    FAKE_ENTER(cuGetErrorString);
    return error_lookup(error, pStr, 0);
}

/* ---- initialisation and devices -------------------------------------------------------- */

FAKE_DECLARE(cuInit);
static CUresult cuInit(unsigned int flags)
{
    FAKE_ENTER(cuInit);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&init_pid, getpid(), __ATOMIC_RELAXED);
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuDriverGetVersion);
static CUresult cuDriverGetVersion(int *driverVersion)
{
    FAKE_ENTER(cuDriverGetVersion);
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

static int valid_device(CUdevice dev)
{
    return dev >= 0 && dev < device_count;
}

FAKE_DECLARE(cuDeviceGet);
static CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FAKE_ENTER(cuDeviceGet);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuDeviceGetCount);
static CUresult cuDeviceGetCount(int *count)
{
    FAKE_ENTER(cuDeviceGetCount);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuDeviceGetName);
static CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FAKE_ENTER(cuDeviceGetName);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "ferry fake GPU %d", dev);
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuDeviceGetAttribute);
static CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    FAKE_ENTER(cuDeviceGetAttribute);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pi || attrib <= 0 || attrib >= 256)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    /* Claimed as on the real H200 machine, whose cuMemCreate then refuses FABRIC. */
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        *pi = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *pi = 9;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *pi = dev + 1;
        break;
    default:
        *pi = 0;
        break;
    }
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuDeviceCanAccessPeer);
static CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    FAKE_ENTER(cuDeviceCanAccessPeer);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev) || !valid_device(peerDev))
        return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* ---- primary contexts ------------------------------------------------------------------ */

FAKE_DECLARE(cuDevicePrimaryCtxRetain);
static CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FAKE_ENTER(cuDevicePrimaryCtxRetain);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    __atomic_fetch_add(&contexts[dev].refs, 1, __ATOMIC_ACQ_REL);
    *pctx = &contexts[dev];
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuDevicePrimaryCtxRelease);
static CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    FAKE_ENTER(cuDevicePrimaryCtxRelease);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    int refs = __atomic_load_n(&contexts[dev].refs, __ATOMIC_ACQUIRE);
    do {
        if (refs == 0)
            return FAKE_CUDA_ERROR_INVALID_CONTEXT;
    } while (!__atomic_compare_exchange_n(&contexts[dev].refs, &refs, refs - 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuCtxSetCurrent);
static CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FAKE_ENTER(cuCtxSetCurrent);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    int known = ctx == NULL;
    for (int i = 0; i < device_count && !known; i++)
        known = ctx == &contexts[i];
    if (!known)
        return FAKE_CUDA_ERROR_INVALID_CONTEXT;
    current_context = ctx;
    return CUDA_SUCCESS;
}

FAKE_DECLARE(cuCtxGetCurrent);
static CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FAKE_ENTER(cuCtxGetCurrent);
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_context;
    return CUDA_SUCCESS;
}

CUresult fake_need_context(int *device)
{
    CUresult rc = fake_need_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUctx_st *ctx = current_context;
    if (!ctx || __atomic_load_n(&ctx->refs, __ATOMIC_ACQUIRE) <= 0)
        return FAKE_CUDA_ERROR_INVALID_CONTEXT;
    if (device)
        *device = ctx->device;
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress_v2 --------------------------------------------------------------- */

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             unsigned long long flags, int *symbolStatus)
{
    pthread_once(&setup_once, setup);
    int status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    CUresult rc = FAKE_CUDA_ERROR_NOT_FOUND;
    if (!symbol || !pfn || flags > 2) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    *pfn = NULL;
    int id = entry_id(symbol, strlen(symbol));
    if (id < 0 || entry_hidden[id] || !entry_fn[id])
        goto out;
    if (cudaVersion < entry_info[id].version) {
        status = 2; /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
        goto out;
    }
    memcpy(pfn, &entry_fn[id], sizeof(*pfn));
    status = 0;
    rc = CUDA_SUCCESS;
out:
    if (symbolStatus)
        *symbolStatus = status;
    return rc;
}

static void register_here(fake_generic_fn *table)
{
    FAKE_REGISTER(table, cuGetErrorName);
    FAKE_REGISTER(table, cuGetErrorString);
    FAKE_REGISTER(table, cuInit);
    FAKE_REGISTER(table, cuDriverGetVersion);
    FAKE_REGISTER(table, cuDeviceGet);
    FAKE_REGISTER(table, cuDeviceGetCount);
    FAKE_REGISTER(table, cuDeviceGetName);
    FAKE_REGISTER(table, cuDeviceGetAttribute);
    FAKE_REGISTER(table, cuDeviceCanAccessPeer);
    FAKE_REGISTER(table, cuDevicePrimaryCtxRetain);
    FAKE_REGISTER(table, cuDevicePrimaryCtxRelease);
    FAKE_REGISTER(table, cuCtxSetCurrent);
    FAKE_REGISTER(table, cuCtxGetCurrent);
}

/* ---- control functions ----------------------------------------------------------------- */

void ferry_fake_cuda_fail(const char *name, int nth, int code)
{
    pthread_once(&setup_once, setup);
    int id = name ? entry_id(name, strlen(name)) : -1;
    if (id < 0) {
        fake_warn("ferry_fake_cuda_fail: unknown entry point \"%s\"", name ? name : "(null)");
        return;
    }
    pthread_mutex_lock(&ctl_lock);
    add_rule(id, nth, code);
    pthread_mutex_unlock(&ctl_lock);
}

unsigned long ferry_fake_cuda_calls(const char *name)
{
    pthread_once(&setup_once, setup);
    int id = name ? entry_id(name, strlen(name)) : -1;
    if (id < 0)
        return 0;
    pthread_mutex_lock(&ctl_lock);
    unsigned long n = call_count[id];
    pthread_mutex_unlock(&ctl_lock);
    return n;
}

void ferry_fake_cuda_reset(void)
{
    pthread_once(&setup_once, setup);
    pthread_mutex_lock(&ctl_lock);
    rule_count = 0;
    memset(call_count, 0, sizeof(call_count));
    pthread_mutex_unlock(&ctl_lock);
}

int ferry_fake_cuda_live_allocations(void)
{
    pthread_once(&setup_once, setup);
    pthread_mutex_lock(&fake_lock);
    int n = fake_live_regions() + fake_live_vmm_handles();
    pthread_mutex_unlock(&fake_lock);
    return n;
}
