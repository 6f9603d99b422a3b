/* UCX, loaded at run time.
 *
 * ferry never links UCX: ferry__ucx_get() dlopens "libucp.so.0" (or the library named by
 * FERRY_UCX_LIBRARY) once per process and resolves the UCP entry points ferry uses. UCX
 * older than 1.10 (no ucp_*_nbx), a missing library or a missing entry point make remote
 * pools fail with the reason ("remote pools need UCX: libucp.so.0: cannot open shared object
 * file ..."); everything local works as ever. */
#ifndef FERRY_REMOTE_UCX_H
#define FERRY_REMOTE_UCX_H

#include <stdio.h>

#include "ferry.h"
#include "remote/ucx_api.h"

/* X(name, return type, parameters) */
#define FERRY_UCX_FUNCTIONS(X)                                                                     \
    X(ucp_get_version, void, (unsigned *, unsigned *, unsigned *))                                 \
    X(ucs_status_string, const char *, (ucs_status_t))                                             \
    X(ucp_config_read, ucs_status_t, (const char *, const char *, ucp_config_t **))                \
    X(ucp_config_release, void, (ucp_config_t *))                                                  \
    X(ucp_init_version, ucs_status_t,                                                              \
      (unsigned, unsigned, const ucp_params_t *, const ucp_config_t *, ucp_context_h *))           \
    X(ucp_cleanup, void, (ucp_context_h))                                                          \
    X(ucp_context_print_info, void, (const ucp_context_h, FILE *))                                 \
    X(ucp_context_query, ucs_status_t, (ucp_context_h, ucp_context_attr_t *))                      \
    X(ucp_worker_create, ucs_status_t,                                                             \
      (ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *))                                \
    X(ucp_worker_destroy, void, (ucp_worker_h))                                                    \
    X(ucp_worker_query, ucs_status_t, (ucp_worker_h, ucp_worker_attr_t *))                         \
    X(ucp_worker_get_address, ucs_status_t, (ucp_worker_h, ucp_address_t **, size_t *))            \
    X(ucp_worker_release_address, void, (ucp_worker_h, ucp_address_t *))                           \
    X(ucp_worker_progress, unsigned, (ucp_worker_h))                                               \
    X(ucp_worker_get_efd, ucs_status_t, (ucp_worker_h, int *))                                     \
    X(ucp_worker_arm, ucs_status_t, (ucp_worker_h))                                                \
    X(ucp_worker_signal, ucs_status_t, (ucp_worker_h))                                             \
    X(ucp_worker_set_am_recv_handler, ucs_status_t,                                                \
      (ucp_worker_h, const ucp_am_handler_param_t *))                                              \
    X(ucp_ep_create, ucs_status_t, (ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *))            \
    X(ucp_ep_close_nbx, ucs_status_ptr_t, (ucp_ep_h, const ucp_request_param_t *))                 \
    X(ucp_ep_print_info, void, (ucp_ep_h, FILE *))                                                 \
    X(ucp_mem_map, ucs_status_t, (ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *))       \
    X(ucp_mem_unmap, ucs_status_t, (ucp_context_h, ucp_mem_h))                                     \
    X(ucp_rkey_pack, ucs_status_t, (ucp_context_h, ucp_mem_h, void **, size_t *))                  \
    X(ucp_rkey_buffer_release, void, (void *))                                                     \
    X(ucp_ep_rkey_unpack, ucs_status_t, (ucp_ep_h, const void *, ucp_rkey_h *))                    \
    X(ucp_rkey_destroy, void, (ucp_rkey_h))                                                        \
    X(ucp_get_nbx, ucs_status_ptr_t,                                                               \
      (ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *))               \
    X(ucp_am_send_nbx, ucs_status_ptr_t,                                                           \
      (ucp_ep_h, unsigned, const void *, size_t, const void *, size_t,                             \
       const ucp_request_param_t *))                                                               \
    X(ucp_am_data_release, void, (ucp_worker_h, void *))                                           \
    X(ucp_request_check_status, ucs_status_t, (void *))                                            \
    X(ucp_request_free, void, (void *))

typedef struct ferry__ucx {
    void *library;
    unsigned major, minor, release; /* ucp_get_version */
    char path[256];                 /* the library that was loaded */
#define FERRY_UCX_SLOT_(name, ret, params) ret(*name) params;
    FERRY_UCX_FUNCTIONS(FERRY_UCX_SLOT_)
#undef FERRY_UCX_SLOT_
} ferry__ucx;

/* The process's UCX table, loading it on first use (thread-safe). NOT_SUPPORTED, with the
 * first cause, when there is no usable UCX; the answer is cached. */
ferry_status ferry__ucx_get(const ferry__ucx **ucx);

/* Reports a failed UCX call: "<call> failed: <UCX's text>" with status SYSTEM (NO_MEMORY for
 * out of memory). */
ferry_status ferry__ucx_fail(const ferry__ucx *ucx, const char *call, ucs_status_t status);

/* One UCP context and worker: AM, RMA and wake-ups, the worker SERIALIZED (its owner locks
 * around every call), UCX's configuration from the environment (UCX_TLS, ...). */
typedef struct ferry__ucx_node {
    const ferry__ucx *ucx;
    ucp_context_h context;
    ucp_worker_h worker;
    int efd;                /* the worker's event fd (ucp_worker_get_efd) */
    ucp_address_t *address; /* the worker's address, for the peer */
    size_t address_len;
} ferry__ucx_node;

ferry_status ferry__ucx_node_open(ferry__ucx_node *node, const char *name);
void ferry__ucx_node_close(ferry__ucx_node *node);

/* UCX (1.13 at least) aborts the process when it runs out of file descriptors while it makes
 * a worker (its async thread: "ucs_async_thread_global_context.thread != NULL") or an endpoint
 * (ucp_worker_iface_activate: "failed to set active message handler"): ferry makes either
 * only while the process has FERRY_UCX_SPARE_FDS of them to spare. SYSTEM (EMFILE)
 * otherwise, nothing changed. */
#define FERRY_UCX_SPARE_FDS 32
ferry_status ferry__ucx_fds_spare(void);

/* Sets cb as the handler of the active messages of id, and other as the handler of every
 * other id (the ids are 16 bits). UCX 1.13 leaves the entries of its handler table
 * uninitialised but the one set (ucp_worker_set_am_handler_common initialises entry id where
 * it means i), and reads past the table for an id beyond it on some paths: a peer's message
 * of such an id ran whatever was there. Every id has a handler, the table 1.5 MiB a worker. */
#define FERRY_UCX_AM_TABLE 65536
ferry_status ferry__ucx_node_handlers(ferry__ucx_node *node, unsigned id, ucp_am_recv_callback_t cb,
                                      ucp_am_recv_callback_t other, void *arg);

/* Progresses the worker until it has nothing more to do, then arms its event fd: returns
 * once a poll on efd will wake for the next event. */
void ferry__ucx_node_drain(ferry__ucx_node *node);

/* The parameters of every active message ferry sends: eager, and its header and payload
 * named host memory. A UCX that detects memory types (built with CUDA: its cuda_copy md) sends
 * a message inline only when it knows the bytes are the host's; unnamed, each send takes a
 * request, has its buffer looked up and goes through UCX's general protocol selection
 * while CUDA memory exists in the process (ucp_proto_is_inline: memtype_off is -1 there). */
static inline ucp_request_param_t ferry__ucx_am_param(void)
{
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                             .flags = UCP_AM_SEND_FLAG_EAGER,
                             .memory_type = UCS_MEMORY_TYPE_HOST};
    return p;
}

/* How remote reads on ep would go: "native RMA over <transports>" or "emulated over active
 * messages (<transports>)" into buf; *emulated = 1 for the latter. */
void ferry__ucx_ep_rma_path(ferry__ucx_node *node, ucp_ep_h ep, char *buf, size_t size,
                            int *emulated);

/* What ferry doctor says of UCX: found or why not, its version, the transports its context
 * offers, and how a remote read of host and of GPU memory would go. */
typedef struct ferry__ucx_report {
    int loaded;
    char error[512];
    char path[256];
    unsigned major, minor, release;
    char transports[1024]; /* "tcp/eth0, sysv/memory, ..." as UCX lists its resources */
    int cuda;              /* UCX reaches CUDA memory (its cuda transports are there) */
    char host_read[256];
    char gpu_read[256];
} ferry__ucx_report;

void ferry__ucx_report_get(ferry__ucx_report *r);
#endif
