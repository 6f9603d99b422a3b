/* ferry doctor: what this machine offers ferry, probed for real rather than taken from the
 * driver's attributes (which can claim more than the machine allows). See docs/cli.md. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/error.h"
#include "driver/driver.h"

#define DOCTOR_MAX_GPUS 64 /* the driver loader's limit on devices, too */
#define DOCTOR_TEXT     512
#define DOCTOR_LONG     4096
#define DOCTOR_WAIT_NS  2000000000ull /* how long the stream probe may take */
#define DOCTOR_POLL_NS  100000ull
#define DOCTOR_WORD     0x5eed0001u /* the value the stream probe writes, then waits for */
/* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID of cuda.h (cuda_api.h does not list it). */
#define DOCTOR_ATTR_PCI_DOMAIN 50
#define DOCTOR_MPS_PIPE_DIR    "/tmp/nvidia-mps"

#define DOCTOR_IPC_REASON                                                                          \
    "CUDA IPC: one handle for the whole pool; control words in host shared memory registered "     \
    "with the GPU"
#define DOCTOR_TIME_SLICED                                                                         \
    "processes sharing one GPU are time-sliced (~140 us per switch, so a same-GPU handoff costs "  \
    "~300 us; start MPS for ~31 us)"

/* One real probe: the driver's attribute (1, 0, or -1 when the driver does not answer),
 * whether it ran, and whether doing the thing worked (err: the failure). */
typedef struct doctor_probe {
    int attribute;
    int ran;
    int works;
    char err[DOCTOR_TEXT];
} doctor_probe;

typedef struct doctor_gpu {
    int index;
    CUdevice dev;
    char error[DOCTOR_TEXT]; /* the device could not be queried at all */
    char name[256];
    int cc_major, cc_minor; /* -1: unknown */
    char pci[32];
    int vmm_api; /* the driver has the VMM entry points */
    int vmm_attribute;
    size_t granularity; /* 0: unknown */
    doctor_probe posix_fd, fabric, memops;
    signed char peer[DOCTOR_MAX_GPUS]; /* 1 yes, 0 no, -1 the query failed */
    char peer_err[DOCTOR_TEXT];
} doctor_gpu;

typedef struct doctor_mps {
    char pipe_dir[PATH_MAX];
    int pipe;         /* the control pipe exists: clients started now use MPS */
    long control_pid; /* 0: none visible */
    long server_pid;
} doctor_mps;

typedef struct doctor_report {
    const ferry__cuda *cuda; /* NULL without a driver */
    char error[DOCTOR_TEXT]; /* why there is no driver */
    char file[PATH_MAX];     /* the file the driver was loaded from */
    int count;               /* GPUs examined */
    doctor_gpu *gpus;
    doctor_mps mps;
    const char *choice;
    char reason[DOCTOR_LONG];
    char vmm[DOCTOR_LONG]; /* cuda_vmm's state */
} doctor_report;

/* ---- small helpers ------------------------------------------------------------------- */

static void save_error(char *dst, size_t size)
{
    snprintf(dst, size, "%s", ferry_last_error());
}

static void append(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void append(char *buf, size_t size, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, size - used, fmt, ap);
    va_end(ap);
}

/* An attribute of dev, or -1 when the driver does not answer. */
static int gpu_attr(const ferry__cuda *cuda, CUdevice dev, int attr)
{
    int value = -1;
    if (cuda->cuDeviceGetAttribute(&value, attr, dev) != CUDA_SUCCESS)
        return -1;
    return value;
}

/* ---- identity ---------------------------------------------------------------------- */

static void gpu_pci(const ferry__cuda *cuda, doctor_gpu *g)
{
    int domain = gpu_attr(cuda, g->dev, DOCTOR_ATTR_PCI_DOMAIN);
    int bus = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    int slot = gpu_attr(cuda, g->dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    if (domain < 0 || bus < 0 || slot < 0)
        snprintf(g->pci, sizeof(g->pci), "unknown");
    else
        snprintf(g->pci, sizeof(g->pci), "%04x:%02x:%02x.0", (unsigned)domain, (unsigned)bus,
                 (unsigned)slot);
}

static ferry_status gpu_identity(const ferry__cuda *cuda, doctor_gpu *g)
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

static void vmm_probe(const ferry__cuda *cuda, doctor_gpu *g, int type, int attr, doctor_probe *p)
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

static void gpu_vmm(const ferry__cuda *cuda, doctor_gpu *g)
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
    uint64_t deadline = cli_now_ns() + ns;
    CUresult rc;
    while ((rc = m->cuda->cuStreamQuery(m->stream)) == CUDA_ERROR_NOT_READY &&
           cli_now_ns() < deadline)
        cli_sleep_ns(DOCTOR_POLL_NS);
    return rc;
}

/* Waits for the stream, at most DOCTOR_WAIT_NS; past that, the host writes the word itself
 * so that the stream's wait ends. A stream that still does not finish is left alone (stuck:
 * its page stays registered and mapped), so that doctor never hangs. */
static ferry_status memops_drain(memops_state *m)
{
    CUresult rc = memops_poll(m, DOCTOR_WAIT_NS);
    if (rc == CUDA_ERROR_NOT_READY) {
        m->timed_out = 1;
        __atomic_store_n(m->host, DOCTOR_WORD, __ATOMIC_SEQ_CST);
        rc = memops_poll(m, DOCTOR_WAIT_NS);
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
                 (m->stream, m->dptr, DOCTOR_WORD, CU_STREAM_WRITE_VALUE_DEFAULT));
    FERRY_CU_TRY(m->cuda, cuStreamWaitValue32,
                 (m->stream, m->dptr, DOCTOR_WORD, CU_STREAM_WAIT_VALUE_GEQ));
    ferry_status st = memops_drain(m);
    if (st != FERRY_OK)
        return st;
    if (m->timed_out)
        return ferry__fail(FERRY_TIMEOUT,
                           "cuStreamWaitValue32 did not see the word cuStreamWriteValue32 "
                           "wrote to registered host memory within %llu ms",
                           DOCTOR_WAIT_NS / 1000000ull);
    uint32_t seen = __atomic_load_n(m->host, __ATOMIC_SEQ_CST);
    if (seen != DOCTOR_WORD)
        return ferry__fail(FERRY_DRIVER,
                           "the stream finished, but the host word is 0x%08x, not the 0x%08x "
                           "cuStreamWriteValue32 wrote",
                           seen, DOCTOR_WORD);
    return FERRY_OK;
}

/* Undoes whatever memops_setup and memops_run did, whichever step failed. */
static void memops_cleanup(memops_state *m)
{
    if (m->stuck)
        return;
    if (m->stream) {
        __atomic_store_n(m->host, DOCTOR_WORD, __ATOMIC_SEQ_CST); /* ends any pending wait */
        if (memops_poll(m, DOCTOR_WAIT_NS) == CUDA_ERROR_NOT_READY)
            return; /* stuck: leave the page to the stream */
        m->cuda->cuStreamDestroy(m->stream);
    }
    if (m->registered)
        m->cuda->cuMemHostUnregister(m->host);
    if (m->host)
        munmap(m->host, m->bytes);
}

/* Runs after ferry__cuda_use_device(g->index); ctx is its result, g->memops.err its
 * failure. */
static void gpu_memops(const ferry__cuda *cuda, doctor_gpu *g, ferry_status ctx)
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

/* ---- peers --------------------------------------------------------------------------- */

static void gpu_peers(const ferry__cuda *cuda, doctor_report *r, doctor_gpu *g)
{
    for (int j = 0; j < r->count; j++) {
        int can = 0;
        const doctor_gpu *other = &r->gpus[j];
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
static void mps_note_process(doctor_mps *m, long pid)
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

static void mps_scan(doctor_mps *m)
{
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    snprintf(m->pipe_dir, sizeof(m->pipe_dir), "%s", dir && *dir ? dir : DOCTOR_MPS_PIPE_DIR);
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

/* ---- the transport ferry would pick ---------------------------------------------------- */

static void vmm_state(const doctor_gpu *g, char *buf, size_t size)
{
    buf[0] = '\0';
    if (g->error[0])
        append(buf, size, "unavailable (the GPU could not be queried)");
    else if (!g->vmm_api)
        append(buf, size, "unavailable (VMM API not in this driver)");
    else if (g->fabric.works)
        append(buf, size, "FABRIC");
    else if (g->posix_fd.works)
        append(buf, size, "POSIX_FD (FABRIC refused: %s)", g->fabric.err);
    else
        append(buf, size, "unavailable (FABRIC refused: %s; POSIX_FD refused: %s)", g->fabric.err,
               g->posix_fd.err);
    if ((g->fabric.works || g->posix_fd.works) && !g->memops.works)
        append(buf, size, ", but stream memory operations fail");
}

static void decide_vmm(doctor_report *r)
{
    char first[DOCTOR_LONG], state[DOCTOR_LONG];
    int same = 1;
    vmm_state(&r->gpus[0], first, sizeof(first));
    for (int i = 1; i < r->count; i++) {
        vmm_state(&r->gpus[i], state, sizeof(state));
        same = same && strcmp(state, first) == 0;
    }
    if (same) {
        snprintf(r->vmm, sizeof(r->vmm), "%s", first);
        return;
    }
    for (int i = 0; i < r->count; i++) {
        vmm_state(&r->gpus[i], state, sizeof(state));
        append(r->vmm, sizeof(r->vmm), "%sGPU %d: %s", i ? "; " : "", i, state);
    }
}

static void decide(doctor_report *r)
{
    int first_bad = -1, works = 0;
    r->choice = "host";
    if (!r->cuda || r->count == 0) {
        snprintf(r->reason, sizeof(r->reason), "shared memory");
        snprintf(r->vmm, sizeof(r->vmm), "unavailable (no GPU)");
        return;
    }
    for (int i = 0; i < r->count; i++) {
        if (r->gpus[i].memops.works)
            works++;
        else if (first_bad < 0)
            first_bad = i;
    }
    decide_vmm(r);
    if (!works) {
        snprintf(r->reason, sizeof(r->reason),
                 "shared memory: stream memory operations fail on every GPU, so the GPU "
                 "transports cannot run here (GPU %d: %s)",
                 first_bad,
                 r->gpus[first_bad].error[0] ? r->gpus[first_bad].error
                                             : r->gpus[first_bad].memops.err);
        return;
    }
    r->choice = "cuda_ipc";
    snprintf(r->reason, sizeof(r->reason), "%s", DOCTOR_IPC_REASON);
    if (first_bad >= 0)
        append(r->reason, sizeof(r->reason),
               "; but not for pools on GPU %d, where stream memory operations fail: %s", first_bad,
               r->gpus[first_bad].memops.err);
}

/* ---- examining the machine ------------------------------------------------------------ */

static void examine_gpu(const ferry__cuda *cuda, doctor_gpu *g)
{
    if (gpu_identity(cuda, g) != FERRY_OK) {
        save_error(g->error, sizeof(g->error));
        return;
    }
    ferry_status ctx = ferry__cuda_use_device(cuda, g->index);
    if (ctx != FERRY_OK)
        snprintf(g->memops.err, sizeof(g->memops.err), "no context on the GPU: %s",
                 ferry_last_error());
    gpu_vmm(cuda, g);
    gpu_memops(cuda, g, ctx);
}

static void driver_file(const ferry__cuda *cuda, char *buf, size_t size)
{
    Dl_info info;
    void *fn;
    memcpy(&fn, &cuda->cuInit, sizeof(fn));
    if (dladdr(fn, &info) && info.dli_fname)
        snprintf(buf, size, "%s", info.dli_fname);
}

static int examine(doctor_report *r)
{
    mps_scan(&r->mps);
    if (ferry__cuda_get(&r->cuda) != FERRY_OK) {
        r->cuda = NULL;
        save_error(r->error, sizeof(r->error));
        decide(r);
        return 0;
    }
    driver_file(r->cuda, r->file, sizeof(r->file));
    r->count = r->cuda->device_count < DOCTOR_MAX_GPUS ? r->cuda->device_count : DOCTOR_MAX_GPUS;
    r->gpus = calloc(r->count ? (size_t)r->count : 1, sizeof(*r->gpus));
    if (!r->gpus)
        return -1;
    for (int i = 0; i < r->count; i++) {
        r->gpus[i].index = i;
        examine_gpu(r->cuda, &r->gpus[i]);
    }
    for (int i = 0; i < r->count; i++)
        gpu_peers(r->cuda, r, &r->gpus[i]);
    decide(r);
    return 0;
}

/* ---- text ------------------------------------------------------------------------------ */

static const char *attr_text(int attribute)
{
    return attribute < 0 ? "unknown" : attribute ? "1" : "0";
}

static void probe_text(const doctor_probe *p, char *buf, size_t size)
{
    if (!p->ran)
        snprintf(buf, size, "%s", p->err);
    else if (p->works)
        snprintf(buf, size, "works%s",
                 p->attribute == 0 ? " (although the attribute says unsupported)" : "");
    else if (p->attribute == 1)
        snprintf(buf, size, "attribute says supported, but %s", p->err);
    else
        snprintf(buf, size, "%s", p->err);
}

static void print_probe(const char *label, const doctor_probe *p, const char *hint)
{
    char text[DOCTOR_LONG];
    probe_text(p, text, sizeof(text));
    printf("%s: attribute %s; probe: %s%s\n", label, attr_text(p->attribute), text,
           !p->works && hint && strstr(p->err, "CUDA_ERROR_NOT_PERMITTED") ? hint : "");
}

static void print_driver(const doctor_report *r)
{
    int v = r->cuda->driver_version;
    printf("driver: CUDA %d.%d, %s", v / 1000, v % 1000 / 10, r->cuda->path);
    if (r->file[0] && strcmp(r->file, r->cuda->path) != 0)
        printf(" (%s)", r->file);
    printf("\n");
}

static void print_vmm(const doctor_gpu *g)
{
    char size[32];
    cli_format_size(g->granularity, size, sizeof(size));
    printf("  VMM: attribute %s", attr_text(g->vmm_attribute));
    if (!g->vmm_api)
        printf(": VMM API not in this driver\n");
    else if (g->granularity)
        printf(", granularity %s (%zu bytes)\n", size, g->granularity);
    else
        printf(", granularity unknown\n");
    print_probe("    POSIX_FILE_DESCRIPTOR", &g->posix_fd, NULL);
    print_probe("    FABRIC", &g->fabric,
                "; FABRIC handles need an IMEX channel (nvidia-imex running, "
                "/dev/nvidia-caps-imex-channels/channelN visible)");
}

static void print_gpu(const doctor_gpu *g)
{
    printf("\nGPU %d: ", g->index);
    if (g->error[0]) {
        printf("cannot be queried: %s\n", g->error);
        return;
    }
    printf("%s\n", g->name);
    if (g->cc_major < 0 || g->cc_minor < 0)
        printf("  compute capability unknown");
    else
        printf("  compute capability %d.%d", g->cc_major, g->cc_minor);
    printf(", PCI bus id %s\n", g->pci);
    print_vmm(g);
    print_probe("  stream memory operations", &g->memops, NULL);
}

static void print_peers(const doctor_report *r)
{
    if (r->count < 2)
        return;
    printf("\npeer access (cuDeviceCanAccessPeer: can the row's GPU access the column's):\n     ");
    for (int j = 0; j < r->count; j++)
        printf(" %4d", j);
    printf("\n");
    for (int i = 0; i < r->count; i++) {
        printf("  %3d", i);
        for (int j = 0; j < r->count; j++) {
            int v = r->gpus[i].peer[j];
            printf(" %4s", i == j ? "-" : v < 0 ? "?" : v ? "yes" : "no");
        }
        printf("\n");
    }
    for (int i = 0; i < r->count; i++)
        if (r->gpus[i].peer_err[0])
            printf("  GPU %d: %s\n", i, r->gpus[i].peer_err);
}

static void print_mps(const doctor_mps *m)
{
    if (m->pipe && m->server_pid)
        printf("MPS: active (pipe dir %s, server pid %ld)\n", m->pipe_dir, m->server_pid);
    else if (m->pipe && m->control_pid)
        printf("MPS: active (pipe dir %s, control daemon pid %ld; no server yet: the daemon "
               "starts one for the first CUDA process)\n",
               m->pipe_dir, m->control_pid);
    else if (m->pipe)
        printf("MPS: active (pipe dir %s; no MPS process visible from here: the daemon may run "
               "outside this PID namespace, or the pipe is stale)\n",
               m->pipe_dir);
    else if (m->control_pid || m->server_pid)
        printf("MPS: not active for processes started with this environment: an MPS daemon "
               "runs (pid %ld), but %s has no control pipe (set CUDA_MPS_PIPE_DIRECTORY to the "
               "daemon's); " DOCTOR_TIME_SLICED "\n",
               m->control_pid ? m->control_pid : m->server_pid, m->pipe_dir);
    else
        printf("MPS: not active \xe2\x80\x94 " DOCTOR_TIME_SLICED "\n");
}

static void print_text(const doctor_report *r)
{
    if (!r->cuda) {
        printf("no GPU: %s\n", r->error);
    } else {
        print_driver(r);
        if (r->count == 0)
            printf("no GPU: the CUDA driver reports no devices\n");
        else if (r->cuda->device_count > r->count)
            printf("GPUs: %d (the first %d examined)\n", r->cuda->device_count, r->count);
        else
            printf("GPUs: %d\n", r->count);
    }
    for (int i = 0; i < r->count; i++)
        print_gpu(&r->gpus[i]);
    print_peers(r);
    printf("\n");
    print_mps(&r->mps);
    printf("transport: %s (%s)\n", r->choice, r->reason);
    printf("cuda_vmm: %s%s\n", r->vmm,
           r->count ? "; the fallback for containers that forbid legacy CUDA IPC" : "");
}

/* ---- JSON ------------------------------------------------------------------------------ */

/* Length of the valid UTF-8 sequence at s, 0 when it is not one. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0], lo = 0x80, hi = 0xbf;
    size_t n;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4;
    else
        return 0;
    lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : lo;
    hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : hi;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

/* A JSON string (null for NULL); bytes that are not UTF-8 become U+FFFD. */
static void json_str(const char *text)
{
    if (!text) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (const unsigned char *s = (const unsigned char *)text; *s;) {
        size_t n = *s >= 0x80 ? utf8_len(s) : 1;
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if (*s < 0x20)
            printf("\\u%04x", *s);
        else if (n)
            fwrite(s, 1, n, stdout);
        else
            fputs("\\ufffd", stdout);
        s += n ? n : 1;
    }
    putchar('"');
}

static void json_key(const char *key, const char *text, const char *after)
{
    printf("\"%s\": ", key);
    json_str(text);
    fputs(after, stdout);
}

static void json_bool(const char *key, int value, const char *after)
{
    printf("\"%s\": %s%s", key, value < 0 ? "null" : value ? "true" : "false", after);
}

static void json_pid(const char *key, long pid, const char *after)
{
    if (pid)
        printf("\"%s\": %ld%s", key, pid, after);
    else
        printf("\"%s\": null%s", key, after);
}

static void json_probe(const char *key, const doctor_probe *p, const char *after)
{
    char text[DOCTOR_LONG];
    probe_text(p, text, sizeof(text));
    printf("\"%s\": {", key);
    json_bool("attribute", p->attribute, ", ");
    json_bool("works", p->works, ", ");
    json_key("probe", text, "}");
    fputs(after, stdout);
}

static void json_vmm(const doctor_gpu *g)
{
    printf("\"vmm\": {");
    json_bool("api", g->vmm_api, ", ");
    json_bool("supported", g->vmm_attribute, ", ");
    if (g->granularity)
        printf("\"granularity\": %zu, ", g->granularity);
    else
        printf("\"granularity\": null, ");
    json_probe("posix_fd", &g->posix_fd, ", ");
    json_probe("fabric", &g->fabric, "}, ");
}

static void json_peers(const doctor_report *r, const doctor_gpu *g)
{
    int first = 1;
    printf("\"peers\": [");
    for (int j = 0; j < r->count; j++) {
        if (g->peer[j] == 1) {
            printf("%s%d", first ? "" : ", ", j);
            first = 0;
        }
    }
    printf("], ");
    json_key("peer_error", g->peer_err[0] ? g->peer_err : NULL, "}");
}

static void json_gpu(const doctor_report *r, const doctor_gpu *g)
{
    char cc[32];
    int ok = !g->error[0];
    snprintf(cc, sizeof(cc), "%d.%d", g->cc_major, g->cc_minor);
    printf("{\"index\": %d, ", g->index);
    json_key("error", ok ? NULL : g->error, ", ");
    json_key("name", ok ? g->name : NULL, ", ");
    json_key("compute_capability", ok && g->cc_major >= 0 && g->cc_minor >= 0 ? cc : NULL, ", ");
    json_key("pci_bus_id", ok && strcmp(g->pci, "unknown") != 0 ? g->pci : NULL, ", ");
    if (!ok) {
        printf("\"vmm\": null, \"stream_mem_ops\": null, \"peers\": []}");
        return;
    }
    json_vmm(g);
    json_probe("stream_mem_ops", &g->memops, ", ");
    json_peers(r, g);
}

static void json_driver(const doctor_report *r)
{
    char version[32];
    const ferry__cuda *c = r->cuda;
    if (c)
        snprintf(version, sizeof(version), "%d.%d", c->driver_version / 1000,
                 c->driver_version % 1000 / 10);
    printf("\"driver\": {");
    json_bool("loaded", c != NULL, ", ");
    json_key("path", c ? c->path : NULL, ", ");
    json_key("file", c && r->file[0] ? r->file : NULL, ", ");
    json_key("version", c ? version : NULL, ", ");
    json_key("error", c ? NULL : r->error, ", ");
    printf("\"device_count\": %d}, ", c ? c->device_count : 0);
}

static void print_json(const doctor_report *r)
{
    printf("{");
    json_driver(r);
    printf("\"devices\": [");
    for (int i = 0; i < r->count; i++) {
        printf("%s", i ? ", " : "");
        json_gpu(r, &r->gpus[i]);
    }
    printf("], \"mps\": {");
    json_bool("active", r->mps.pipe, ", ");
    json_key("pipe_dir", r->mps.pipe_dir, ", ");
    json_pid("control_pid", r->mps.control_pid, ", ");
    json_pid("server_pid", r->mps.server_pid, "}, ");
    printf("\"transport\": {");
    json_key("choice", r->choice, ", ");
    json_key("reason", r->reason, ", ");
    json_key("cuda_vmm", r->vmm, "}}\n");
}

/* ---- the command ----------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, int *json)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            *json = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ferry doctor [--json]\n");
            return CLI_EXIT_OK;
        } else {
            fprintf(stderr, "ferry doctor: %s '%s'\nRun 'ferry help' for the options.\n",
                    argv[i][0] == '-' ? "unknown option" : "unexpected argument", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    return -1;
}

int cmd_doctor(int argc, char **argv)
{
    int json = 0, rc = parse_args(argc, argv, &json);
    if (rc >= 0)
        return rc;
    doctor_report *r = calloc(1, sizeof(*r));
    if (!r || examine(r) != 0) {
        fprintf(stderr, "ferry doctor: out of memory\n");
        free(r);
        return CLI_EXIT_FAIL;
    }
    if (json)
        print_json(r);
    else
        print_text(r);
    free(r->gpus);
    free(r);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "ferry doctor: cannot write the report\n");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
