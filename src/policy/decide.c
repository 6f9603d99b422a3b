/* The transport policy: which backend FERRY_BACKEND_AUTO picks, and why, from the probes.
 * One decision function serves ferry_pool_create, ferry_backend_resolve and the doctor.
 *
 * What a demanding user expects, and what AUTO therefore does:
 * - data in host memory (a negative device, or the initialiser's FERRY_DEVICE_DEFAULT) gets
 *   the host transport without touching the CUDA driver, on a GPU machine too: CPU consumers
 *   can read it, and a configuration that never named a GPU keeps the pool it always had;
 * - data on GPU d gets CUDA IPC on that GPU (one handle for the whole pool, control words in
 *   host memory, the faster placement) when the stream memory operations every GPU transport
 *   needs work there, probed for real; otherwise host, with the probe's failure as the reason;
 * - no driver or no GPU at all is a host machine: host;
 * - a GPU ordinal the driver does not have is a mistake, not a machine's limitation: it
 *   fails (INVALID_ARGUMENT) rather than quietly making a host pool. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "policy/policy.h"

#define IPC_REASON                                                                                 \
    "CUDA IPC: one handle for the whole pool; control words in host shared memory registered "     \
    "with the GPU"

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

static const char *gpu_failure(const ferry__gpu *g)
{
    return g->error[0] ? g->error : g->memops.err;
}

/* ---- cuda_vmm's state ------------------------------------------------------------------ */

static void vmm_state(const ferry__gpu *g, char *buf, size_t size)
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

void ferry__policy_vmm(const ferry__machine *m, char *buf, size_t size)
{
    char first[FERRY__PROBE_LONG], state[FERRY__PROBE_LONG];
    int same = 1;
    buf[0] = '\0';
    if (!m->cuda || m->count == 0) {
        append(buf, size, "unavailable (no GPU)");
        return;
    }
    vmm_state(&m->gpus[0], first, sizeof(first));
    for (int i = 1; i < m->count; i++) {
        vmm_state(&m->gpus[i], state, sizeof(state));
        same = same && strcmp(state, first) == 0;
    }
    if (same) {
        append(buf, size, "%s", first);
        return;
    }
    for (int i = 0; i < m->count; i++) {
        vmm_state(&m->gpus[i], state, sizeof(state));
        append(buf, size, "%sGPU %d: %s", i ? "; " : "", i, state);
    }
}

/* ---- the transport ---------------------------------------------------------------------- */

/* The machine as a whole: CUDA IPC when stream memory operations work on some GPU. */
static void decide_machine(const ferry__machine *m, ferry_backend *backend, char *reason,
                           size_t size)
{
    int first_bad = -1, works = 0;
    *backend = FERRY_BACKEND_HOST;
    if (!m->cuda || m->count == 0) {
        append(reason, size, "shared memory");
        return;
    }
    for (int i = 0; i < m->count; i++) {
        if (m->gpus[i].memops.works)
            works++;
        else if (first_bad < 0)
            first_bad = i;
    }
    if (!works) {
        append(reason, size,
               "shared memory: stream memory operations fail on every GPU, so the GPU "
               "transports cannot run here (GPU %d: %s)",
               first_bad, gpu_failure(&m->gpus[first_bad]));
        return;
    }
    *backend = FERRY_BACKEND_CUDA_IPC;
    append(reason, size, "%s", IPC_REASON);
    if (first_bad >= 0)
        append(reason, size,
               "; but not for pools on GPU %d, where stream memory operations fail: %s", first_bad,
               gpu_failure(&m->gpus[first_bad]));
}

/* Data on GPU device. */
static ferry_status decide_device(const ferry__machine *m, int32_t device, ferry_backend *backend,
                                  char *reason, size_t size)
{
    *backend = FERRY_BACKEND_HOST;
    if (!m->cuda) {
        append(reason, size, "shared memory: data on GPU %d, but there is no GPU here (%s)",
               (int)device, m->error);
        return FERRY_OK;
    }
    if (m->count == 0) {
        append(reason, size,
               "shared memory: data on GPU %d, but the CUDA driver reports no devices",
               (int)device);
        return FERRY_OK;
    }
    if (device >= m->count)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "FERRY_BACKEND_AUTO: device %d does not exist (%d devices)", (int)device,
                           m->cuda->device_count);
    const ferry__gpu *g = &m->gpus[device];
    if (!g->memops.works) {
        append(reason, size,
               "shared memory: stream memory operations fail on GPU %d, so the GPU transports "
               "cannot run there (%s)",
               (int)device, gpu_failure(g));
        return FERRY_OK;
    }
    *backend = FERRY_BACKEND_CUDA_IPC;
    append(reason, size, "%s (data on GPU %d)", IPC_REASON, (int)device);
    return FERRY_OK;
}

ferry_status ferry__policy_decide(const ferry__machine *m, int32_t device, ferry_backend *backend,
                                  char *reason, size_t size)
{
    char text[FERRY__PROBE_LONG] = "";
    ferry_status st = FERRY_OK;
    if (device == FERRY__POLICY_MACHINE)
        decide_machine(m, backend, text, sizeof(text));
    else if (device < 0) {
        *backend = FERRY_BACKEND_HOST;
        append(text, sizeof(text), "shared memory: the data is in host memory");
    } else
        st = decide_device(m, device, backend, text, sizeof(text));
    if (st == FERRY_OK && reason && size)
        snprintf(reason, size, "%s", text);
    return st;
}

/* ---- the public calls --------------------------------------------------------------------- */

ferry_status ferry_backend_resolve(int32_t device, ferry_backend *backend, char *reason,
                                   size_t size)
{
    if (!backend)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "backend is NULL");
    ferry_backend b = FERRY_BACKEND_HOST;
    ferry_status st;
    if (device < 0) {
        /* Host memory: decided without the driver. */
        static const ferry__machine none;
        st = ferry__policy_decide(&none, device, &b, reason, size);
    } else {
        ferry__machine *m = ferry__machine_lock();
        if (!m)
            return FERRY_NO_MEMORY;
        ferry__probe_device(m, device);
        st = ferry__policy_decide(m, device, &b, reason, size);
        ferry__machine_unlock();
    }
    if (st != FERRY_OK)
        return st;
    *backend = b;
    ferry__clear_error();
    return FERRY_OK;
}

/* Logs AUTO's choice once per process for each device (and once for host memory). */
static void log_choice(int32_t device, ferry_backend backend, const char *reason)
{
    static int logged[FERRY_MAX_DEVICES + 1];
    int slot = device < 0 || device >= FERRY_MAX_DEVICES ? FERRY_MAX_DEVICES : device;
    if (__atomic_exchange_n(&logged[slot], 1, __ATOMIC_ACQ_REL))
        return;
    ferry__log(FERRY_LOG_INFO, "FERRY_BACKEND_AUTO picked %s: %s", ferry_backend_name(backend),
               reason);
}

ferry_status ferry__policy_resolve_config(const ferry_pool_config *config, ferry_pool_config *out)
{
    ferry_pool_config c = *config; /* out may be config */
    if (c.backend == FERRY_BACKEND_AUTO) {
        char reason[FERRY__PROBE_LONG];
        ferry_status st = ferry_backend_resolve(c.device, &c.backend, reason, sizeof(reason));
        if (st != FERRY_OK)
            return st;
        log_choice(c.device, c.backend, reason);
    }
    if (c.backend != FERRY_BACKEND_HOST && c.device == FERRY_DEVICE_DEFAULT)
        c.device = 0;
    *out = c;
    return FERRY_OK;
}
