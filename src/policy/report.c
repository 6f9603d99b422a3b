/* The doctor's report, text for people or one JSON object, rendered into the caller's buffer
 * from the probes and the decision (ferry_doctor_report). docs/cli.md shows both. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "policy/policy.h"
#include "remote/ucx.h"

#define TIME_SLICED                                                                                \
    "processes sharing one GPU are time-sliced (~140 us per switch, so a same-GPU handoff costs "  \
    "~300 us; start MPS for ~31 us)"

/* The output: buf holds at most size - 1 bytes, len counts every byte of the whole report. */
typedef struct out {
    char *buf;
    size_t size;
    size_t len;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out *o, const char *fmt, ...)
{
    char tmp[1];
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->size ? o->size - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : tmp, room ? room : sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

static void put_bytes(out *o, const void *bytes, size_t n)
{
    if (o->len < o->size) {
        size_t room = o->size - o->len - 1, k = n < room ? n : room;
        memcpy(o->buf + o->len, bytes, k);
        o->buf[o->len + k] = '\0';
    }
    o->len += n;
}

/* "2MiB" where exact, else the bytes. */
static void format_size(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"GiB", "MiB", "KiB"};
    for (int i = 0; i < 3; i++) {
        uint64_t unit = 1ull << (10 * (3 - i));
        if (bytes >= unit && bytes % unit == 0) {
            snprintf(buf, size, "%llu%s", (unsigned long long)(bytes / unit), units[i]);
            return;
        }
    }
    snprintf(buf, size, "%lluB", (unsigned long long)bytes);
}

/* ---- text ------------------------------------------------------------------------------ */

static const char *attr_text(int attribute)
{
    return attribute < 0 ? "unknown" : attribute ? "1" : "0";
}

static void probe_text(const ferry__probe *p, char *buf, size_t size)
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

static void text_probe(out *o, const char *label, const ferry__probe *p, const char *hint)
{
    char text[FERRY__PROBE_LONG];
    probe_text(p, text, sizeof(text));
    put(o, "%s: attribute %s; probe: %s%s\n", label, attr_text(p->attribute), text,
        !p->works && hint && strstr(p->err, "CUDA_ERROR_NOT_PERMITTED") ? hint : "");
}

static void text_driver(out *o, const ferry__machine *m)
{
    int v = m->cuda->driver_version;
    put(o, "driver: CUDA %d.%d, %s", v / 1000, v % 1000 / 10, m->cuda->path);
    if (m->file[0] && strcmp(m->file, m->cuda->path) != 0)
        put(o, " (%s)", m->file);
    put(o, "\n");
    if (m->count == 0)
        put(o, "no GPU: the CUDA driver reports no devices\n");
    else if (m->cuda->device_count > m->count)
        put(o, "GPUs: %d (the first %d examined)\n", m->cuda->device_count, m->count);
    else
        put(o, "GPUs: %d\n", m->count);
}

static void text_vmm(out *o, const ferry__gpu *g)
{
    char size[32];
    format_size(g->granularity, size, sizeof(size));
    put(o, "  VMM: attribute %s", attr_text(g->vmm_attribute));
    if (!g->vmm_api)
        put(o, ": VMM API not in this driver\n");
    else if (g->granularity)
        put(o, ", granularity %s (%zu bytes)\n", size, g->granularity);
    else
        put(o, ", granularity unknown\n");
    text_probe(o, "    POSIX_FILE_DESCRIPTOR", &g->posix_fd, NULL);
    text_probe(o, "    FABRIC", &g->fabric,
               "; FABRIC handles need an IMEX channel (nvidia-imex running, "
               "/dev/nvidia-caps-imex-channels/channelN visible)");
}

static void text_gpu(out *o, const ferry__gpu *g)
{
    put(o, "\nGPU %d: ", g->index);
    if (g->error[0]) {
        put(o, "cannot be queried: %s\n", g->error);
        return;
    }
    put(o, "%s\n", g->name);
    if (g->cc_major < 0 || g->cc_minor < 0)
        put(o, "  compute capability unknown");
    else
        put(o, "  compute capability %d.%d", g->cc_major, g->cc_minor);
    put(o, ", PCI bus id %s\n", g->pci);
    text_vmm(o, g);
    text_probe(o, "  stream memory operations", &g->memops, NULL);
}

static void text_peers(out *o, const ferry__machine *m)
{
    if (m->count < 2)
        return;
    put(o, "\npeer access (cuDeviceCanAccessPeer: can the row's GPU access the column's):\n     ");
    for (int j = 0; j < m->count; j++)
        put(o, " %4d", j);
    put(o, "\n");
    for (int i = 0; i < m->count; i++) {
        put(o, "  %3d", i);
        for (int j = 0; j < m->count; j++) {
            int v = m->gpus[i].peer[j];
            put(o, " %4s", i == j ? "-" : v < 0 ? "?" : v ? "yes" : "no");
        }
        put(o, "\n");
    }
    for (int i = 0; i < m->count; i++)
        if (m->gpus[i].peer_err[0])
            put(o, "  GPU %d: %s\n", i, m->gpus[i].peer_err);
}

static void text_mps(out *o, const ferry__mps *m)
{
    if (m->pipe && m->server_pid)
        put(o, "MPS: active (pipe dir %s, server pid %ld)\n", m->pipe_dir, m->server_pid);
    else if (m->pipe && m->control_pid)
        put(o,
            "MPS: active (pipe dir %s, control daemon pid %ld; no server yet: the daemon starts "
            "one for the first CUDA process)\n",
            m->pipe_dir, m->control_pid);
    else if (m->pipe)
        put(o,
            "MPS: active (pipe dir %s; no MPS process visible from here: the daemon may run "
            "outside this PID namespace, or the pipe is stale)\n",
            m->pipe_dir);
    else if (m->control_pid || m->server_pid)
        put(o,
            "MPS: not active for processes started with this environment: an MPS daemon runs "
            "(pid %ld), but %s has no control pipe (set CUDA_MPS_PIPE_DIRECTORY to the "
            "daemon's); " TIME_SLICED "\n",
            m->control_pid ? m->control_pid : m->server_pid, m->pipe_dir);
    else
        put(o, "MPS: not active \xe2\x80\x94 " TIME_SLICED "\n");
}

static void text_ucx(out *o, const ferry__ucx_report *u)
{
    if (!u->loaded) {
        put(o,
            "UCX: not found: %s (consumers on other hosts need it: the site's UCX, or pip "
            "install 'ferry-tensors[ucx]')\n",
            u->error);
        return;
    }
    put(o, "UCX: %u.%u.%u, %s (consumers on other hosts: cfg.listen)\n", u->major, u->minor,
        u->release, u->path);
    put(o, "  transports: %s\n", u->transports[0] ? u->transports : "none");
    put(o, "  remote read of host memory: %s\n", u->host_read);
    put(o, "  remote read of GPU memory: %s\n", u->gpu_read);
}

static void report_text(out *o, const ferry__machine *m, ferry_backend choice, const char *reason,
                        const char *vmm, const ferry__ucx_report *ucx)
{
    if (!m->cuda)
        put(o, "no GPU: %s\n", m->error);
    else
        text_driver(o, m);
    for (int i = 0; i < m->count; i++)
        text_gpu(o, &m->gpus[i]);
    text_peers(o, m);
    put(o, "\n");
    text_mps(o, &m->mps);
    put(o, "transport: %s (%s)\n", ferry_backend_name(choice), reason);
    put(o, "cuda_vmm: %s%s\n", vmm,
        m->count ? "; the fallback for containers that forbid legacy CUDA IPC" : "");
    text_ucx(o, ucx);
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

/* "key": "text" (null for NULL), then after; bytes that are not UTF-8 become U+FFFD. */
static void json_str(out *o, const char *key, const char *text, const char *after)
{
    put(o, "\"%s\": ", key);
    if (!text) {
        put(o, "null%s", after);
        return;
    }
    put(o, "\"");
    for (const unsigned char *s = (const unsigned char *)text; *s;) {
        size_t n = *s >= 0x80 ? utf8_len(s) : 1;
        if (*s == '"' || *s == '\\')
            put(o, "\\%c", *s);
        else if (*s < 0x20)
            put(o, "\\u%04x", *s);
        else if (n)
            put_bytes(o, s, n);
        else
            put(o, "\\ufffd");
        s += n ? n : 1;
    }
    put(o, "\"%s", after);
}

static void json_bool(out *o, const char *key, int value, const char *after)
{
    put(o, "\"%s\": %s%s", key, value < 0 ? "null" : value ? "true" : "false", after);
}

static void json_pid(out *o, const char *key, long pid, const char *after)
{
    if (pid)
        put(o, "\"%s\": %ld%s", key, pid, after);
    else
        put(o, "\"%s\": null%s", key, after);
}

static void json_probe(out *o, const char *key, const ferry__probe *p, const char *after)
{
    char text[FERRY__PROBE_LONG];
    probe_text(p, text, sizeof(text));
    put(o, "\"%s\": {", key);
    json_bool(o, "attribute", p->attribute, ", ");
    json_bool(o, "works", p->works, ", ");
    json_str(o, "probe", text, "}");
    put(o, "%s", after);
}

static void json_vmm(out *o, const ferry__gpu *g)
{
    put(o, "\"vmm\": {");
    json_bool(o, "api", g->vmm_api, ", ");
    json_bool(o, "supported", g->vmm_attribute, ", ");
    if (g->granularity)
        put(o, "\"granularity\": %zu, ", g->granularity);
    else
        put(o, "\"granularity\": null, ");
    json_probe(o, "posix_fd", &g->posix_fd, ", ");
    json_probe(o, "fabric", &g->fabric, "}, ");
}

static void json_gpu(out *o, const ferry__machine *m, const ferry__gpu *g)
{
    char cc[32];
    int ok = !g->error[0], first = 1;
    snprintf(cc, sizeof(cc), "%d.%d", g->cc_major, g->cc_minor);
    put(o, "{\"index\": %d, ", g->index);
    json_str(o, "error", ok ? NULL : g->error, ", ");
    json_str(o, "name", ok ? g->name : NULL, ", ");
    json_str(o, "compute_capability", ok && g->cc_major >= 0 && g->cc_minor >= 0 ? cc : NULL, ", ");
    json_str(o, "pci_bus_id", ok && strcmp(g->pci, "unknown") != 0 ? g->pci : NULL, ", ");
    if (!ok) {
        put(o, "\"vmm\": null, \"stream_mem_ops\": null, \"peers\": []}");
        return;
    }
    json_vmm(o, g);
    json_probe(o, "stream_mem_ops", &g->memops, ", ");
    put(o, "\"peers\": [");
    for (int j = 0; j < m->count; j++) {
        if (g->peer[j] == 1) {
            put(o, "%s%d", first ? "" : ", ", j);
            first = 0;
        }
    }
    put(o, "], ");
    json_str(o, "peer_error", g->peer_err[0] ? g->peer_err : NULL, "}");
}

static void json_driver(out *o, const ferry__machine *m)
{
    char version[32];
    const ferry__cuda *c = m->cuda;
    if (c)
        snprintf(version, sizeof(version), "%d.%d", c->driver_version / 1000,
                 c->driver_version % 1000 / 10);
    put(o, "\"driver\": {");
    json_bool(o, "loaded", c != NULL, ", ");
    json_str(o, "path", c ? c->path : NULL, ", ");
    json_str(o, "file", c && m->file[0] ? m->file : NULL, ", ");
    json_str(o, "version", c ? version : NULL, ", ");
    json_str(o, "error", c ? NULL : m->error, ", ");
    put(o, "\"device_count\": %d}, ", c ? c->device_count : 0);
}

static void json_ucx(out *o, const ferry__ucx_report *u)
{
    char version[48];
    snprintf(version, sizeof(version), "%u.%u.%u", u->major, u->minor, u->release);
    put(o, "\"ucx\": {");
    json_bool(o, "loaded", u->loaded, ", ");
    json_str(o, "path", u->loaded ? u->path : NULL, ", ");
    json_str(o, "version", u->loaded ? version : NULL, ", ");
    json_str(o, "error", u->loaded ? NULL : u->error, ", ");
    json_str(o, "transports", u->loaded ? u->transports : NULL, ", ");
    json_bool(o, "cuda", u->loaded ? u->cuda : -1, ", ");
    json_str(o, "host_read", u->loaded ? u->host_read : NULL, ", ");
    json_str(o, "gpu_read", u->loaded ? u->gpu_read : NULL, "}");
}

static void report_json(out *o, const ferry__machine *m, ferry_backend choice, const char *reason,
                        const char *vmm, const ferry__ucx_report *ucx)
{
    put(o, "{");
    json_driver(o, m);
    put(o, "\"devices\": [");
    for (int i = 0; i < m->count; i++) {
        put(o, "%s", i ? ", " : "");
        json_gpu(o, m, &m->gpus[i]);
    }
    put(o, "], \"mps\": {");
    json_bool(o, "active", m->mps.pipe, ", ");
    json_str(o, "pipe_dir", m->mps.pipe_dir, ", ");
    json_pid(o, "control_pid", m->mps.control_pid, ", ");
    json_pid(o, "server_pid", m->mps.server_pid, "}, ");
    put(o, "\"transport\": {");
    json_str(o, "choice", ferry_backend_name(choice), ", ");
    json_str(o, "reason", reason, ", ");
    json_str(o, "cuda_vmm", vmm, "}, ");
    json_ucx(o, ucx);
    put(o, "}\n");
}

/* ---- the call ---------------------------------------------------------------------------- */

ferry_status ferry_doctor_report(int json, char *buf, size_t size, size_t *needed)
{
    char reason[FERRY__PROBE_LONG], vmm[FERRY__PROBE_LONG];
    ferry_backend choice;
    static ferry__ucx_report ucx; /* under the machine's lock */
    out o = {buf, buf ? size : 0, 0};
    if (o.size)
        o.buf[0] = '\0';
    ferry__machine *m = ferry__machine_lock();
    if (!m)
        return FERRY_NO_MEMORY;
    ferry__probe_all(m);
    ferry__policy_decide(m, FERRY__POLICY_MACHINE, &choice, reason, sizeof(reason));
    ferry__policy_vmm(m, vmm, sizeof(vmm));
    ferry__ucx_report_get(&ucx);
    if (json)
        report_json(&o, m, choice, reason, vmm, &ucx);
    else
        report_text(&o, m, choice, reason, vmm, &ucx);
    ferry__machine_unlock();
    if (needed)
        *needed = o.len;
    ferry__clear_error();
    return FERRY_OK;
}
