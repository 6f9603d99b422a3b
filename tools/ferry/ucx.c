/* The UCX calls of `ferry bench --mode remote`'s floor (ucx.h): the entry points of the UCX the
 * library loaded, a context and worker made as ferry makes its own, endpoints, waits. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "ucx.h"

#define SPIN_NS   50000ull /* as long as ferry's remote calls spin before they sleep */
#define UCX_MAJOR 1        /* the UCP API asked for: 1.10, as ferry does */
#define UCX_MINOR 10

ucx_api ucx;

static const struct {
    const char *name;
    size_t offset;
} entries[] = {
#define UCX_ENTRY_(name, ret, params) {#name, offsetof(ucx_api, name)},
    UCX_FUNCTIONS(UCX_ENTRY_)
#undef UCX_ENTRY_
};

/* The UCX the library loaded (ferry_ucx_symbol): NULL, or why there is none. */
const char *ucx_load(void)
{
    static char why[512];
    static int state; /* 0: not tried, 1: loaded, -1: failed */
    for (size_t i = 0; !state && i < sizeof(entries) / sizeof(entries[0]); i++) {
        void *fn = NULL;
        if (ferry_ucx_symbol(entries[i].name, &fn) != FERRY_OK) {
            snprintf(why, sizeof(why), "%s", ferry_last_error());
            state = -1;
        }
        memcpy((char *)&ucx + entries[i].offset, &fn, sizeof(fn));
    }
    if (!state)
        state = 1;
    return state > 0 ? NULL : why;
}

const char *ucx_error(const char *call, ucs_status_t st)
{
    static __thread char text[160];
    const char *what = ucx.ucs_status_string ? ucx.ucs_status_string(st) : NULL;
    snprintf(text, sizeof(text), "%s failed: %s (%d)", call, what ? what : "?", st);
    return text;
}

#define UCX_TRY(call, args)                                                                        \
    do {                                                                                           \
        ucs_status_t st_ = ucx.call args;                                                          \
        if (st_ != UCS_OK)                                                                         \
            return ucx_error(#call, st_);                                                          \
    } while (0)

const char *ucx_node_open(ucx_node *n, ucs_thread_mode_t mode, unsigned am_id,
                          ucp_am_recv_callback_t cb, void *arg)
{
    const char *why = ucx_load();
    if (why)
        return why;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = mode};
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = am_id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = cb,
        .arg = arg};
    UCX_TRY(ucp_init_version, (UCX_MAJOR, UCX_MINOR, &p, NULL, &n->context));
    UCX_TRY(ucp_worker_create, (n->context, &wp, &n->worker));
    UCX_TRY(ucp_worker_get_efd, (n->worker, &n->efd));
    UCX_TRY(ucp_worker_set_am_recv_handler, (n->worker, &hp));
    UCX_TRY(ucp_worker_get_address, (n->worker, &n->address, &n->address_len));
    return NULL;
}

/* Closes an endpoint at once (the run is over, or failed), progressing a while at most. */
int ucx_node_cuda(ucx_node *n)
{
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    return ucx.ucp_context_query(n->context, &attr) == UCS_OK &&
           (attr.memory_types & (1ull << UCS_MEMORY_TYPE_CUDA)) != 0;
}

void ucx_ep_close(ucx_node *n, ucp_ep_h ep)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ep ? ucx.ucp_ep_close_nbx(ep, &p) : NULL;
    uint64_t deadline = ferry_now_ns() + 100000000ull;
    if (!req || UCS_PTR_IS_ERR_(req))
        return;
    while (ucx.ucp_request_check_status(req) == UCS_INPROGRESS && ferry_now_ns() < deadline)
        ucx.ucp_worker_progress(n->worker);
    ucx.ucp_request_free(req);
}

void ucx_node_close(ucx_node *n)
{
    if (n->address)
        ucx.ucp_worker_release_address(n->worker, n->address);
    if (n->worker)
        ucx.ucp_worker_destroy(n->worker);
    if (n->context)
        ucx.ucp_cleanup(n->context);
    memset(n, 0, sizeof(*n));
}

/* Progresses until req is done and frees it, as ferry's remote calls wait for theirs: spins
 * spin_ns, then sleeps on the worker's event fd. NULL, or why not. */
const char *ucx_wait(ucx_node *n, void *req, uint64_t spin_ns, uint64_t timeout_ns,
                     const char *call)
{
    if (!req)
        return NULL;
    if (UCS_PTR_IS_ERR_(req))
        return ucx_error(call, (ucs_status_t)(intptr_t)req);
    uint64_t start = ferry_now_ns();
    ucs_status_t st;
    while ((st = ucx.ucp_request_check_status(req)) == UCS_INPROGRESS) {
        if (ucx.ucp_worker_progress(n->worker))
            continue;
        uint64_t now = ferry_now_ns();
        if (now - start >= timeout_ns) {
            static __thread char text[128];
            snprintf(text, sizeof(text), "%s did not complete within %llu ms", call,
                     (unsigned long long)(timeout_ns / 1000000));
            return text; /* the request stays UCX's: the run fails, the process exits */
        }
        if (now - start > spin_ns && ucx.ucp_worker_arm(n->worker) == UCS_OK) {
            struct pollfd p = {.fd = n->efd, .events = POLLIN};
            poll(&p, 1, 1);
        }
    }
    ucx.ucp_request_free(req);
    return st == UCS_OK ? NULL : ucx_error(call, st);
}

/* An endpoint whose peer failed: its requests end with the error, which the waits report (a
 * consumer that died is noticed by the harness). Without a handler UCX logs an error for the
 * endpoint of every consumer that exits at the end of a run. */
static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    (void)status;
}

const char *ucx_ep_open(ucx_node *n, const void *address, ucp_ep_h *ep)
{
    ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLER,
                         .address = address,
                         .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                         .err_handler = {on_ep_error, NULL}};
    ucs_status_t st = ucx.ucp_ep_create(n->worker, &p, ep);
    if (st == UCS_OK)
        return NULL;
    *ep = NULL;
    return ucx_error("ucp_ep_create", st);
}

/* An active message's parameters, as the library's (src/remote/ucx.h, ferry__ucx_am_param):
 * eager, its bytes named host memory, which a UCX built with CUDA needs to send it inline. */
static ucp_request_param_t am_param(void)
{
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                             .flags = UCP_AM_SEND_FLAG_EAGER,
                             .memory_type = UCS_MEMORY_TYPE_HOST};
    return p;
}

void *ucx_am_send(ucp_ep_h ep, unsigned id, const void *header, size_t n)
{
    ucp_request_param_t p = am_param();
    return ucx.ucp_am_send_nbx(ep, id, header, n, NULL, 0, &p);
}

static void on_posted(void *request, ucs_status_t status, void *user_data)
{
    (void)status; /* a failed send fails its endpoint, and the waits that follow say so */
    free(user_data);
    ucx.ucp_request_free(request);
}

const char *ucx_am_post(ucp_ep_h ep, unsigned id, const void *header, size_t n)
{
    void *copy = malloc(n);
    if (!copy)
        return "out of memory for an active message";
    memcpy(copy, header, n);
    ucp_request_param_t p = am_param();
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = on_posted;
    p.user_data = copy;
    void *req = ucx.ucp_am_send_nbx(ep, id, copy, n, NULL, 0, &p);
    if (req && !UCS_PTR_IS_ERR_(req))
        return NULL; /* on_posted frees both */
    free(copy);
    return req ? ucx_error("ucp_am_send_nbx", (ucs_status_t)(intptr_t)req) : NULL;
}

/* How reads on ep go, from UCX's description of its lanes ("lane[0]:  0:tcp/lo.0 md[0] ->
 * ... am am_bw#0 rma_bw#0 ..."): "native RMA over <transports>", or "emulated over active
 * messages (<transports>)" when no lane carries remote memory access. */
void ucx_read_path(ucp_ep_h ep, char *out, size_t size)
{
    char *text = NULL, rma[128] = "", all[128] = "";
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        ucx.ucp_ep_print_info(ep, f);
        fclose(f);
    }
    for (char *save = NULL, *line = text ? strtok_r(text, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane["), *at = lane ? strstr(lane, ":  ") : NULL, tl[64];
        if (!at || sscanf(at + 3, "%*[0-9]:%63s", tl) != 1)
            continue;
        char *list = strstr(at, " rma") ? rma : all;
        size_t used = strlen(list);
        if (!strstr(list, tl))
            snprintf(list + used, sizeof(rma) - used, "%s%s", used ? ", " : "", tl);
    }
    free(text);
    if (rma[0])
        snprintf(out, size, "native RMA over %s", rma);
    else
        snprintf(out, size, "emulated over active messages (%s)", all[0] ? all : "?");
}
