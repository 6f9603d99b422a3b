/* Loading UCX at run time, and the one way ferry makes a UCP context and worker. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/error.h"
#include "common/proc.h"
#include "remote/ucx.h"

/* The oldest UCX with every call ferry makes (ucp_am_send_nbx, ucp_get_nbx). */
#define FERRY_UCX_MIN_MAJOR 1
#define FERRY_UCX_MIN_MINOR 10

static ferry__ucx ucx_table;
static pid_t
    ucx_user; /* the process whose UCX is initialised (atomic): UCX does not survive fork */
static ferry_status ucx_status = FERRY_OK;
static char ucx_error[512];
static pthread_once_t ucx_once = PTHREAD_ONCE_INIT;

static const struct entry {
    const char *name;
    size_t offset;
} entries[] = {
#define FERRY_UCX_ENTRY_(name, ret, params) {#name, offsetof(ferry__ucx, name)},
    FERRY_UCX_FUNCTIONS(FERRY_UCX_ENTRY_)
#undef FERRY_UCX_ENTRY_
};

static void load_failed(const char *why)
{
    snprintf(ucx_error, sizeof(ucx_error), "remote pools need UCX: %s", why);
    ucx_status = FERRY_NOT_SUPPORTED;
}

static int resolve_all(ferry__ucx *u)
{
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        void *fn = dlsym(u->library, entries[i].name);
        if (!fn) {
            char why[400];
            snprintf(why, sizeof(why), "%.200s lacks %s", u->path, entries[i].name);
            load_failed(why);
            return -1;
        }
        memcpy((char *)u + entries[i].offset, &fn, sizeof(fn));
    }
    return 0;
}

static void ucx_load(void)
{
    ferry__ucx *u = &ucx_table;
    const char *path = getenv("FERRY_UCX_LIBRARY");
    if (!path || !*path)
        path = "libucp.so.0";
    snprintf(u->path, sizeof(u->path), "%s", path);
    u->library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!u->library) {
        const char *why = dlerror();
        load_failed(why ? why : path);
        return;
    }
    if (resolve_all(u) != 0)
        goto close_library;
    u->ucp_get_version(&u->major, &u->minor, &u->release);
    if (u->major < FERRY_UCX_MIN_MAJOR ||
        (u->major == FERRY_UCX_MIN_MAJOR && u->minor < FERRY_UCX_MIN_MINOR)) {
        char why[400];
        snprintf(why, sizeof(why), "%.200s is UCX %u.%u.%u; ferry needs %d.%d or newer", u->path,
                 u->major, u->minor, u->release, FERRY_UCX_MIN_MAJOR, FERRY_UCX_MIN_MINOR);
        load_failed(why);
        goto close_library;
    }
    return;
close_library:
    dlclose(u->library);
    memset(u, 0, sizeof(*u));
}

ferry_status ferry__ucx_get(const ferry__ucx **ucx)
{
    pthread_once(&ucx_once, ucx_load);
    if (ucx_status != FERRY_OK)
        return ferry__fail(ucx_status, "%s", ucx_error);
    *ucx = &ucx_table;
    return FERRY_OK;
}

ferry_status ferry_ucx_symbol(const char *name, void **fn)
{
    const ferry__ucx *u;
    if (!name || !fn)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "name or output pointer is NULL");
    ferry_status st = ferry__ucx_get(&u);
    if (st != FERRY_OK)
        return st;
    /* The handle's dependencies are searched too: libucs's functions come with libucp. */
    void *p = dlsym(u->library, name);
    if (!p)
        return ferry__fail(FERRY_NOT_SUPPORTED, "UCX %.200s has no %.100s", u->path, name);
    *fn = p;
    ferry__clear_error();
    return FERRY_OK;
}

ferry_status ferry__ucx_fail(const ferry__ucx *ucx, const char *call, ucs_status_t status)
{
    const char *text = ucx->ucs_status_string(status);
    return ferry__fail(status == UCS_ERR_NO_MEMORY ? FERRY_NO_MEMORY : FERRY_SYSTEM,
                       "%s failed: %s (%d)", call, text ? text : "unknown UCX status", status);
}

#define UCX_TRY(u, fn, args)                                                                       \
    do {                                                                                           \
        ucs_status_t ferry_ucx_rc_ = (u)->fn args;                                                 \
        if (ferry_ucx_rc_ != UCS_OK) {                                                             \
            st = ferry__ucx_fail((u), #fn, ferry_ucx_rc_);                                         \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* UCX's global state (its progress thread, its memory hooks) is the parent's after a fork: a
 * child that uses UCX after its parent did hangs in ways nobody can diagnose. Refused. */
static ferry_status fork_check(void)
{
    pid_t self = ferry__proc_self(), user = 0;
    if (__atomic_compare_exchange_n(&ucx_user, &user, self, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE) ||
        user == self)
        return FERRY_OK;
    return ferry__fail(FERRY_FORKED,
                       "UCX was started by process %d and this is a forked child (pid %d): UCX "
                       "does not survive fork; start processes that use remote pools with spawn "
                       "or exec",
                       (int)user, (int)self);
}

ferry_status ferry__ucx_node_open(ferry__ucx_node *node, const char *name)
{
    const ferry__ucx *u;
    ucp_config_t *config = NULL;
    memset(node, 0, sizeof(*node));
    node->efd = -1;
    ferry_status st = ferry__ucx_get(&u);
    if (st == FERRY_OK)
        st = fork_check();
    if (st == FERRY_OK)
        st = ferry__ucx_fds_spare();
    if (st != FERRY_OK)
        return st;
    node->ucx = u;
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .name = name,
    };
    UCX_TRY(u, ucp_config_read, (NULL, NULL, &config));
    UCX_TRY(u, ucp_init_version,
            (FERRY_UCX_MIN_MAJOR, FERRY_UCX_MIN_MINOR, &params, config, &node->context));
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    UCX_TRY(u, ucp_worker_create, (node->context, &wp, &node->worker));
    UCX_TRY(u, ucp_worker_get_efd, (node->worker, &node->efd));
    UCX_TRY(u, ucp_worker_get_address, (node->worker, &node->address, &node->address_len));
    u->ucp_config_release(config);
    return FERRY_OK;
fail:
    if (config)
        u->ucp_config_release(config);
    ferry__ucx_node_close(node);
    return st;
}

void ferry__ucx_node_close(ferry__ucx_node *node)
{
    const ferry__ucx *u = node->ucx;
    if (!u)
        return;
    if (node->address)
        u->ucp_worker_release_address(node->worker, node->address);
    if (node->worker)
        u->ucp_worker_destroy(node->worker);
    if (node->context)
        u->ucp_cleanup(node->context);
    memset(node, 0, sizeof(*node));
    node->efd = -1;
}

ferry_status ferry__ucx_fds_spare(void)
{
    int fds[FERRY_UCX_SPARE_FDS], n = 0, err = 0;
    for (; n < FERRY_UCX_SPARE_FDS; n++) {
        fds[n] = eventfd(0, EFD_CLOEXEC);
        if (fds[n] < 0) {
            err = errno;
            break;
        }
    }
    while (n)
        close(fds[--n]);
    if (!err)
        return FERRY_OK;
    return ferry__fail_errno(FERRY_SYSTEM, err,
                             "fewer than %d file descriptors to spare for UCX (it aborts the "
                             "process when it runs out of them)",
                             FERRY_UCX_SPARE_FDS);
}

static ucs_status_t set_handler(ferry__ucx_node *node, unsigned id, ucp_am_recv_callback_t cb,
                                void *arg)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = cb,
        .arg = arg,
    };
    return node->ucx->ucp_worker_set_am_recv_handler(node->worker, &hp);
}

ferry_status ferry__ucx_node_handlers(ferry__ucx_node *node, unsigned id, ucp_am_recv_callback_t cb,
                                      ucp_am_recv_callback_t other, void *arg)
{
    /* The top entry first, so that UCX allocates the table once, then every entry below. */
    ucs_status_t rc = set_handler(node, FERRY_UCX_AM_TABLE - 1, other, arg);
    for (unsigned i = 0; i < FERRY_UCX_AM_TABLE - 1 && rc == UCS_OK; i++)
        rc = set_handler(node, i, i == id ? cb : other, arg);
    return rc == UCS_OK ? FERRY_OK
                        : ferry__ucx_fail(node->ucx, "ucp_worker_set_am_recv_handler", rc);
}

void ferry__ucx_node_drain(ferry__ucx_node *node)
{
    const ferry__ucx *u = node->ucx;
    for (;;) {
        while (u->ucp_worker_progress(node->worker)) {
        }
        if (u->ucp_worker_arm(node->worker) != UCS_ERR_BUSY)
            return;
    }
}

/* The transports of the endpoint's lanes that carry remote memory access ("rma" in UCX's
 * lane description), and those of all its lanes. */
static void scan_lanes(char *text, char *rma, size_t rma_size, char *all, size_t all_size)
{
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *colon = lane ? strstr(lane, ":  ") : NULL;
        if (!colon)
            continue;
        char tl[64] = "";
        /* "lane[0]:  1:tcp/lo.0 md[1] -> ... am am_bw#0 rma_bw#0 keepalive" */
        if (sscanf(colon + 3, "%*[0-9]:%63s", tl) != 1)
            continue;
        int carries_rma = strstr(colon, " rma") != NULL;
        char *dst = carries_rma ? rma : all;
        size_t size = carries_rma ? rma_size : all_size;
        if (strstr(dst, tl))
            continue;
        size_t used = strlen(dst);
        snprintf(dst + used, size - used, "%s%s", used ? ", " : "", tl);
    }
}

void ferry__ucx_ep_rma_path(ferry__ucx_node *node, ucp_ep_h ep, char *buf, size_t size,
                            int *emulated)
{
    char *text = NULL;
    size_t len = 0;
    char rma[256] = "", all[256] = "";
    FILE *f = open_memstream(&text, &len);
    if (f) {
        node->ucx->ucp_ep_print_info(ep, f);
        fclose(f);
    }
    if (text)
        scan_lanes(text, rma, sizeof(rma), all, sizeof(all));
    free(text);
    *emulated = rma[0] == '\0';
    if (*emulated)
        snprintf(buf, size, "emulated over active messages (%s)", all[0] ? all : "unknown lanes");
    else
        snprintf(buf, size, "native RMA over %s", rma);
}

/* ---- what ferry doctor says -------------------------------------------------------------- */

/* Transports that reach only this node (shared memory, loopback, CUDA IPC): not what a
 * consumer on another host can use. */
static int node_local(const char *tl)
{
    static const char *const local[] = {"self/",      "sysv/",      "posix/",    "cma/",
                                        "xpmem/",     "knem/",      "cuda_ipc/", "rocm_ipc/",
                                        "cuda_copy/", "rocm_copy/", "gdr_copy/"};
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if (strncmp(tl, local[i], strlen(local[i])) == 0)
            return 1;
    return 0;
}

static int rdma(const char *tl)
{
    static const char *const verbs[] = {"rc", "dc", "ud", "srd"};
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        if (strncmp(tl, verbs[i], strlen(verbs[i])) == 0)
            return 1;
    return 0;
}

/* The context's resources, from its printed description ("resource N : md M dev D flags --
 * tl/dev"). */
static void scan_resources(ferry__ucx_report *r, char *text, int *net, int *rdma_seen)
{
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *dash = strstr(line, "resource");
        char *tl = dash ? strstr(dash, "-- ") : NULL;
        if (!tl)
            continue;
        tl += 3;
        tl[strcspn(tl, " \t")] = '\0';
        size_t used = strlen(r->transports);
        snprintf(r->transports + used, sizeof(r->transports) - used, "%s%s", used ? ", " : "", tl);
        if (!node_local(tl))
            *net = 1;
        if (rdma(tl))
            *rdma_seen = 1;
    }
}

void ferry__ucx_report_get(ferry__ucx_report *r)
{
    ferry__ucx_node node;
    memset(r, 0, sizeof(*r));
    ferry_status st = ferry__ucx_node_open(&node, "ferry-doctor");
    if (st != FERRY_OK) {
        snprintf(r->error, sizeof(r->error), "%s", ferry_last_error());
        ferry__clear_error();
        return;
    }
    const ferry__ucx *u = node.ucx;
    r->loaded = 1;
    snprintf(r->path, sizeof(r->path), "%s", u->path);
    r->major = u->major;
    r->minor = u->minor;
    r->release = u->release;
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    r->cuda = u->ucp_context_query(node.context, &attr) == UCS_OK &&
              (attr.memory_types & (1ull << UCS_MEMORY_TYPE_CUDA)) != 0;
    char *text = NULL;
    size_t len = 0;
    int net = 0, verbs = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        u->ucp_context_print_info(node.context, f);
        fclose(f);
        if (text)
            scan_resources(r, text, &net, &verbs);
    }
    free(text);
    ferry__ucx_node_close(&node);
    if (!net)
        snprintf(r->host_read, sizeof(r->host_read),
                 "none: UCX offers no network transport here (UCX_TLS?)");
    else if (verbs)
        snprintf(r->host_read, sizeof(r->host_read), "native RMA (RDMA: one-sided gets)");
    else
        snprintf(r->host_read, sizeof(r->host_read),
                 "emulated over active messages (tcp): the producer's thread serves every get");
    if (!r->cuda)
        snprintf(r->gpu_read, sizeof(r->gpu_read),
                 "not possible: this UCX has no CUDA support (pip's libucx-cu12/libucx-cu13 "
                 "has it); pools in GPU memory cannot be read remotely");
    else if (verbs)
        snprintf(r->gpu_read, sizeof(r->gpu_read),
                 "RDMA from GPU memory where the NIC can register it (GPUDirect), else staged "
                 "through host memory by cuda_copy");
    else
        snprintf(r->gpu_read, sizeof(r->gpu_read),
                 "served over active messages (tcp): the producer's thread copies every piece "
                 "out of GPU memory and answers it");
}
