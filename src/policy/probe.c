/* The doctor's probes, run for real rather than taken from the driver's attributes (which
 * can claim more than the machine allows), each at most once per process. Every probe
 * saves and restores the calling thread's current CUDA context. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "policy/policy.h"

#define PROBE_WAIT_NS 2000000000ull /* how long the stream probe may take */
#define PROBE_POLL_NS 100000ull
#define PROBE_WORD    0x5eed0001u /* the value the stream probe writes, then waits for */
/* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID of cuda.h (cuda_api.h does not list it). */
#define ATTR_PCI_DOMAIN 50
#define MPS_PIPE_DIR    "/tmp/nvidia-mps"

static pthread_mutex_t machine_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry__machine *machine;

static void save_error(char *dst, size_t size)
{
    snprintf(dst, size, "%s", ferry_last_error());
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* An attribute of dev, or -1 when the driver does not answer. */
static int gpu_attr(const ferry__cuda *cuda, CUdevice dev, int attr)
{
    int value = -1;
    if (cuda->cuDeviceGetAttribute(&value, attr, dev) != CUDA_SUCCESS)
        return -1;
    return value;
}

/* ---- the driver ---------------------------------------------------------------------- */

static void driver_file(const ferry__cuda *cuda, char *buf, size_t size)
{
    Dl_info info;
    void *fn;
    memcpy(&fn, &cuda->cuInit, sizeof(fn));
    if (dladdr(fn, &info) && info.dli_fname)
        snprintf(buf, size, "%s", info.dli_fname);
}

static void load_driver(ferry__machine *m)
{
    m->loaded = 1;
    if (ferry__cuda_get(&m->cuda) != FERRY_OK) {
        m->cuda = NULL;
        save_error(m->error, sizeof(m->error));
        return;
    }
    driver_file(m->cuda, m->file, sizeof(m->file));
    m->count =
        m->cuda->device_count < FERRY_MAX_DEVICES ? m->cuda->device_count : FERRY_MAX_DEVICES;
    for (int i = 0; i < m->count; i++)
        m->gpus[i].index = i;
}

ferry__machine *ferry__machine_lock(void)
{
    pthread_mutex_lock(&machine_lock);
    if (!machine && !(machine = calloc(1, sizeof(*machine)))) {
        pthread_mutex_unlock(&machine_lock);
        ferry__fail(FERRY_NO_MEMORY, "out of memory for the machine's probes");
        return NULL;
    }
    if (!machine->loaded)
        load_driver(machine);
    return machine;
}

void ferry__machine_unlock(void)
{
    pthread_mutex_unlock(&machine_lock);
}

/* ---- identity ---------------------------------------------------------------------- */

static void gpu_pci(const ferry__cuda *cuda, ferry__gpu *g)
{
    int domain = gpu_attr(cuda, g->dev, ATTR_PCI_DOMAIN);
    int bus = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    int slot = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    if (domain < 0 || bus < 0 || slot < 0)
        snprintf(g->pci, sizeof(g->pci), "unknown");
    else
        snprintf(g->pci, sizeof(g->pci), "%04x:%02x:%02x.0", (unsigned)domain, (unsigned)bus,
                 (unsigned)slot);
}

static ferry_status gpu_identity(const ferry__cuda *cuda, ferry__gpu *g)
{
    FERRY_CU_TRY(cuda, cuDeviceGet, (&g->dev, g->index));
    FERRY_CU_TRY(cuda, cuDeviceGetName, (g->name, (int)sizeof(g->name), g->dev));
    g->name[sizeof(g->name) - 1] = '\0';
    g->cc_major = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    g->cc_minor = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    gpu_pci(cuda, g);
    return FERRY_OK;
}

/* ---- virtual memory management: one granule of each handle type ------------------- */

static ferry_status vmm_try(const ferry__cuda *cuda, int ordinal, int type, size_t *granularity)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = type;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    FERRY_CU_TRY(cuda, cuMemGetAllocationGranularity,
                 (granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle handle;
    FERRY_CU_TRY(cuda, cuMemCreate, (&handle, *granularity, &prop, 0));
    FERRY_CU_TRY(cuda, cuMemRelease, (handle));
    return FERRY_OK;
}

static void vmm_probe(const ferry__cuda *cuda, ferry__gpu *g, int type, int attr, ferry__probe *p)
{
    size_t granularity = 0;
    p->attribute = gpu_attr(cuda, g->dev, attr);
    if (!g->vmm_api) {
        snprintf(p->err, sizeof(p->err), "VMM API not in this driver");
        return;
    }
    p->ran = 1;
    if (vmm_try(cuda, g->index, type, &granularity) == FERRY_OK)
        p->works = 1;
    else
        save_error(p->err, sizeof(p->err));
    if (granularity && !g->granularity)
        g->granularity = granularity;
}

static void gpu_vmm(const ferry__cuda *cuda, ferry__gpu *g)
{
    g->vmm_attribute =
        gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
    g->vmm_api = cuda->cuMemGetAllocationGranularity && cuda->cuMemCreate && cuda->cuMemRelease;
    vmm_probe(cuda, g, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
              CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, &g->posix_fd);
    vmm_probe(cuda, g, CU_MEM_HANDLE_TYPE_FABRIC, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
              &g->fabric);
}

/* ---- stream memory operations on registered host memory ---------------------------- */

typedef struct memops_state {
    const ferry__cuda *cuda;
    uint32_t *host; /* one page */
    size_t bytes;
    int registered;
    CUdeviceptr dptr;
    CUstream stream;
    int timed_out; /* the host had to write the word */
    int stuck;     /* the stream did not finish even then */
} memops_state;

static ferry_status memops_setup(memops_state *m)
{
    long page = sysconf(_SC_PAGESIZE);
    m->bytes = page > 0 ? (size_t)page : 4096;
    void *mem = mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return ferry__fail_errno(FERRY_SYSTEM, errno, "mmap of one page");
    m->host = mem;
    FERRY_CU_TRY(m->cuda, cuMemHostRegister,
                 (m->host, m->bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    m->registered = 1;
    FERRY_CU_TRY(m->cuda, cuMemHostGetDevicePointer, (&m->dptr, m->host, 0));
    FERRY_CU_TRY(m->cuda, cuStreamCreate, (&m->stream, CU_STREAM_NON_BLOCKING));
    return FERRY_OK;
}

/* Polls the stream until it is done or ns have passed: CUDA_SUCCESS, CUDA_ERROR_NOT_READY
 * or the stream's error. */
static CUresult memops_poll(const memops_state *m, uint64_t ns)
{
    uint64_t deadline = ferry__now_ns() + ns;
    CUresult rc;
    while ((rc = m->cuda->cuStreamQuery(m->stream)) == CUDA_ERROR_NOT_READY &&
           ferry__now_ns() < deadline)
        sleep_ns(PROBE_POLL_NS);
    return rc;
}

/* Waits for the stream, at most PROBE_WAIT_NS; past that, the host writes the word itself
 * so that the stream's wait ends. A stream that still does not finish is left alone (stuck:
 * its page stays registered and mapped), so that the probe never hangs. */
static ferry_status memops_drain(memops_state *m)
{
    CUresult rc = memops_poll(m, PROBE_WAIT_NS);
    if (rc == CUDA_ERROR_NOT_READY) {
        m->timed_out = 1;
        __atomic_store_n(m->host, PROBE_WORD, __ATOMIC_SEQ_CST);
        rc = memops_poll(m, PROBE_WAIT_NS);
    }
    if (rc == CUDA_ERROR_NOT_READY) {
        m->stuck = 1;
        return ferry__fail(FERRY_TIMEOUT,
                           "the stream did not finish cuStreamWriteValue32 + cuStreamWaitValue32 "
                           "on registered host memory, even after the host wrote the word itself");
    }
    if (rc != CUDA_SUCCESS)
        return ferry__cuda_fail(m->cuda, "cuStreamQuery", rc);
    FERRY_CU_TRY(m->cuda, cuStreamSynchronize, (m->stream));
    return FERRY_OK;
}

static ferry_status memops_run(memops_state *m)
{
    __atomic_store_n(m->host, 0, __ATOMIC_SEQ_CST);
    FERRY_CU_TRY(m->cuda, cuStreamWriteValue32,
                 (m->stream, m->dptr, PROBE_WORD, CU_STREAM_WRITE_VALUE_DEFAULT));
    FERRY_CU_TRY(m->cuda, cuStreamWaitValue32,
                 (m->stream, m->dptr, PROBE_WORD, CU_STREAM_WAIT_VALUE_GEQ));
    ferry_status st = memops_drain(m);
    if (st != FERRY_OK)
        return st;
    if (m->timed_out)
        return ferry__fail(FERRY_TIMEOUT,
                           "cuStreamWaitValue32 did not see the word cuStreamWriteValue32 "
                           "wrote to registered host memory within %llu ms",
                           PROBE_WAIT_NS / 1000000ull);
    uint32_t seen = __atomic_load_n(m->host, __ATOMIC_SEQ_CST);
    if (seen != PROBE_WORD)
        return ferry__fail(FERRY_DRIVER,
                           "the stream finished, but the host word is 0x%08x, not the 0x%08x "
                           "cuStreamWriteValue32 wrote",
                           seen, PROBE_WORD);
    return FERRY_OK;
}

/* Undoes whatever memops_setup and memops_run did, whichever step failed. */
static void memops_cleanup(memops_state *m)
{
    if (m->stuck)
        return;
    if (m->stream) {
        __atomic_store_n(m->host, PROBE_WORD, __ATOMIC_SEQ_CST); /* ends any pending wait */
        if (memops_poll(m, PROBE_WAIT_NS) == CUDA_ERROR_NOT_READY)
            return; /* stuck: leave the page to the stream */
        m->cuda->cuStreamDestroy(m->stream);
    }
    if (m->registered)
        m->cuda->cuMemHostUnregister(m->host);
    if (m->host)
        munmap(m->host, m->bytes);
}

/* Runs with g's primary context current (ctx: how making it current went). */
static void gpu_memops(const ferry__cuda *cuda, ferry__gpu *g, ferry_status ctx)
{
    g->memops.attribute = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1);
    g->memops.ran = 1;
    if (ctx != FERRY_OK)
        return;
    memops_state m;
    memset(&m, 0, sizeof(m));
    m.cuda = cuda;
    ferry_status st = memops_setup(&m);
    if (st == FERRY_OK)
        st = memops_run(&m);
    if (st == FERRY_OK)
        g->memops.works = 1;
    else
        save_error(g->memops.err, sizeof(g->memops.err));
    memops_cleanup(&m);
}

/* ---- one GPU ------------------------------------------------------------------------- */

/* Identity, then (with vmm) the VMM probes, then stream memory operations, each once. */
static void examine_gpu(const ferry__cuda *cuda, ferry__gpu *g, int vmm)
{
    if (!g->identified) {
        g->identified = 1;
        if (gpu_identity(cuda, g) != FERRY_OK)
            save_error(g->error, sizeof(g->error));
    }
    if (g->error[0] || (g->memops_done && (g->vmm_done || !vmm)))
        return;
    CUcontext saved = NULL;
    cuda->cuCtxGetCurrent(&saved);
    ferry_status ctx = ferry__cuda_use_device(cuda, g->index);
    if (ctx != FERRY_OK && !g->memops_done)
        snprintf(g->memops.err, sizeof(g->memops.err), "no context on the GPU: %s",
                 ferry_last_error());
    if (vmm && !g->vmm_done) {
        g->vmm_done = 1;
        gpu_vmm(cuda, g);
    }
    if (!g->memops_done) {
        g->memops_done = 1;
        gpu_memops(cuda, g, ctx);
    }
    cuda->cuCtxSetCurrent(saved);
}

void ferry__probe_device(ferry__machine *m, int device)
{
    if (m->cuda && device >= 0 && device < m->count)
        examine_gpu(m->cuda, &m->gpus[device], 0);
}

/* ---- peers --------------------------------------------------------------------------- */

static void gpu_peers(const ferry__cuda *cuda, ferry__machine *m, ferry__gpu *g)
{
    for (int j = 0; j < m->count; j++) {
        int can = 0;
        const ferry__gpu *other = &m->gpus[j];
        if (other == g || g->error[0] || other->error[0]) {
            g->peer[j] = other == g ? 0 : -1;
            continue;
        }
        CUresult rc = cuda->cuDeviceCanAccessPeer(&can, g->dev, other->dev);
        g->peer[j] = rc == CUDA_SUCCESS ? can != 0 : -1;
        if (rc != CUDA_SUCCESS && !g->peer_err[0]) {
            ferry__cuda_fail(cuda, "cuDeviceCanAccessPeer", rc);
            save_error(g->peer_err, sizeof(g->peer_err));
        }
    }
}

/* ---- MPS ------------------------------------------------------------------------------ */

/* Reads at most size - 1 bytes of a small file; the text ends at the first NUL or newline.
 * Returns its length, or -1. */
static int read_small(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return (int)strlen(buf);
}

/* comm holds 15 characters, so the control daemon and the server both read
 * "nvidia-cuda-mps"; argv[0] tells them apart. */
static void mps_note_process(ferry__mps *m, long pid)
{
    char path[64], text[256];
    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    if (read_small(path, text, sizeof(text)) < 0 || strncmp(text, "nvidia-cuda-mps", 15) != 0)
        return;
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
    int server = read_small(path, text, sizeof(text)) > 0 && strstr(text, "mps-server") != NULL;
    long *slot = server ? &m->server_pid : &m->control_pid;
    if (!*slot)
        *slot = pid;
}

static void mps_scan(ferry__mps *m)
{
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    snprintf(m->pipe_dir, sizeof(m->pipe_dir), "%s", dir && *dir ? dir : MPS_PIPE_DIR);
    char path[PATH_MAX + 16];
    struct stat st;
    snprintf(path, sizeof(path), "%s/control", m->pipe_dir);
    m->pipe = stat(path, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
    DIR *proc = opendir("/proc");
    if (!proc)
        return;
    struct dirent *e;
    while ((e = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (pid > 0 && *end == '\0')
            mps_note_process(m, pid);
    }
    closedir(proc);
}

/* ---- everything ------------------------------------------------------------------------ */

void ferry__probe_all(ferry__machine *m)
{
    if (!m->mps_done) {
        m->mps_done = 1;
        mps_scan(&m->mps);
    }
    if (!m->cuda)
        return;
    for (int i = 0; i < m->count; i++)
        examine_gpu(m->cuda, &m->gpus[i], 1);
    if (!m->peers_done) {
        m->peers_done = 1;
        for (int i = 0; i < m->count; i++)
            gpu_peers(m->cuda, m, &m->gpus[i]);
    }
}
