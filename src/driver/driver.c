/* Loading the CUDA driver at run time. */
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "driver/driver.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);

static ferry__cuda cuda_table;
static ferry_status cuda_status = FERRY_OK;
static char cuda_error[512];
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[FERRY_MAX_DEVICES];

static void load_failed(const char *fmt, const char *a, const char *b)
{
    snprintf(cuda_error, sizeof(cuda_error), fmt, a, b);
    cuda_status = FERRY_NOT_SUPPORTED;
}

/* Every entry point: its name, the CUDA version of its ABI, whether ferry needs it, and
 * where its pointer goes in the table. */
static const struct entry {
    const char *name;
    int version;
    int mandatory;
    size_t offset;
} entries[] = {
#define FERRY_CUDA_ENTRY_(name, version, mandatory, params)                                        \
    {#name, version, mandatory, offsetof(ferry__cuda, name)},
    FERRY_CUDA_FUNCTIONS(FERRY_CUDA_ENTRY_)
#undef FERRY_CUDA_ENTRY_
};

static int resolve_all(ferry__cuda *c, get_proc_fn get_proc)
{
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        void *fn = NULL;
        int status = 0;
        if (get_proc(entries[i].name, &fn, entries[i].version, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                     &status) != CUDA_SUCCESS ||
            status != 0)
            fn = NULL;
        if (!fn && entries[i].mandatory) {
            load_failed("CUDA driver %.200s lacks %s", c->path, entries[i].name);
            return -1;
        }
        memcpy((char *)c + entries[i].offset, &fn, sizeof(fn));
    }
    return 0;
}

static int open_library(ferry__cuda *c)
{
    const char *path = getenv("FERRY_CUDA_DRIVER");
    if (!path || !*path)
        path = "libcuda.so.1";
    snprintf(c->path, sizeof(c->path), "%s", path);
    c->library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!c->library) {
        const char *why = dlerror();
        load_failed("no CUDA driver: %.400s%s", why ? why : path, "");
        return -1;
    }
    return 0;
}

static void cuda_load(void)
{
    ferry__cuda *c = &cuda_table;
    if (open_library(c) != 0)
        return;
    get_proc_fn get_proc;
    void *sym = dlsym(c->library, "cuGetProcAddress_v2");
    memcpy(&get_proc, &sym, sizeof(sym));
    if (!sym) {
        load_failed("CUDA driver %.200s has no cuGetProcAddress_v2 (a CUDA 12 or newer driver "
                    "is needed)%s",
                    c->path, "");
        goto close_library;
    }
    if (resolve_all(c, get_proc) != 0)
        goto close_library;
    c->get_proc = sym;
    CUresult rc = c->cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = c->cuDriverGetVersion(&c->driver_version);
    if (rc == CUDA_SUCCESS)
        rc = c->cuDeviceGetCount(&c->device_count);
    if (rc != CUDA_SUCCESS) {
        const char *name = NULL;
        c->cuGetErrorName(rc, &name);
        load_failed("CUDA driver failed to initialise: cuInit: %s%s", name ? name : "?", "");
        goto close_library;
    }
    return;
close_library:
    dlclose(c->library);
    memset(c, 0, sizeof(*c));
}

ferry_status ferry__cuda_get(const ferry__cuda **cuda)
{
    pthread_once(&cuda_once, cuda_load);
    if (cuda_status != FERRY_OK)
        return ferry__fail(cuda_status, "%s", cuda_error);
    *cuda = &cuda_table;
    return FERRY_OK;
}

ferry_status ferry__cuda_fail(const ferry__cuda *cuda, const char *call, CUresult result)
{
    const char *name = NULL, *text = NULL;
    if (cuda->cuGetErrorName(result, &name) != CUDA_SUCCESS || !name)
        name = "unknown CUresult";
    if (cuda->cuGetErrorString(result, &text) != CUDA_SUCCESS || !text)
        text = "no description";
    return ferry__fail(result == CUDA_ERROR_OUT_OF_MEMORY ? FERRY_NO_MEMORY : FERRY_DRIVER,
                       "%s failed: %s (%s, %d)", call, name, text, result);
}

/* The calling thread's context as it was when a public call first switched it. */
static __thread struct {
    int depth; /* public calls in progress on this thread */
    int saved; /* previous holds the caller's context */
    CUcontext previous;
    const ferry__cuda *cuda;
} boundary;

static ferry_status retain_primary(const ferry__cuda *cuda, int device, CUcontext *ctx)
{
    CUdevice dev;
    FERRY_CU_TRY(cuda, cuDeviceGet, (&dev, device));
    FERRY_CU_TRY(cuda, cuDevicePrimaryCtxRetain, (ctx, dev));
    return FERRY_OK;
}

ferry_status ferry__cuda_use_device(const ferry__cuda *cuda, int device)
{
    if (device < 0 || device >= cuda->device_count || device >= FERRY_MAX_DEVICES)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "device %d does not exist (%d devices)", device,
                           cuda->device_count);
    CUcontext ctx = __atomic_load_n(&primary[device], __ATOMIC_ACQUIRE);
    ferry_status st = FERRY_OK;
    if (!ctx) {
        pthread_mutex_lock(&ctx_lock);
        if (!primary[device])
            st = retain_primary(cuda, device, &ctx);
        if (st == FERRY_OK && !primary[device])
            __atomic_store_n(&primary[device], ctx, __ATOMIC_RELEASE);
        ctx = primary[device];
        pthread_mutex_unlock(&ctx_lock);
    }
    if (st != FERRY_OK)
        return st;
    CUcontext current = NULL;
    if (cuda->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx)
        return FERRY_OK;
    if (boundary.depth && !boundary.saved) {
        boundary.previous = current; /* the caller's, put back when its call returns */
        boundary.cuda = cuda;
        boundary.saved = 1;
    }
    FERRY_CU_TRY(cuda, cuCtxSetCurrent, (ctx));
    return FERRY_OK;
}

ferry_status ferry__cuda_io_stream(const ferry__cuda *cuda, CUstream *io)
{
    FERRY_CU_TRY(cuda, cuStreamCreate, (io, CU_STREAM_NON_BLOCKING));
    return FERRY_OK;
}

ferry_status ferry__cuda_copy(const ferry__cuda *cuda, CUstream io, void *dst, const void *src,
                              size_t n)
{
    FERRY_CU_TRY(cuda, cuMemcpyAsync,
                 ((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, io));
    FERRY_CU_TRY(cuda, cuStreamSynchronize, (io));
    return FERRY_OK;
}

ferry_status ferry__cuda_words_read(const ferry__cuda *cuda, CUstream io, void *host,
                                    CUdeviceptr words, size_t bytes)
{
    return ferry__cuda_copy(cuda, io, host, (const void *)(uintptr_t)words, bytes);
}

ferry_status ferry__cuda_words_write(const ferry__cuda *cuda, CUstream io, CUdeviceptr words,
                                     uint32_t count, uint32_t value)
{
    for (uint32_t i = 0; i < count; i++)
        FERRY_CU_TRY(cuda, cuStreamWriteValue32,
                     (io, words + i * sizeof(uint32_t), value, CU_STREAM_WRITE_VALUE_DEFAULT));
    FERRY_CU_TRY(cuda, cuStreamSynchronize, (io));
    return FERRY_OK;
}

int ferry__cuda_boundary_begin(void)
{
    boundary.depth++;
    return 0;
}

void ferry__cuda_boundary_end(int *unused)
{
    (void)unused;
    if (--boundary.depth || !boundary.saved)
        return;
    boundary.saved = 0;
    boundary.cuda->cuCtxSetCurrent(boundary.previous);
}
