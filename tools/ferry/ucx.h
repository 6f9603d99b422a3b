/* The slice of UCX's UCP API that `ferry bench --mode remote` calls itself for its floor
 * (remote.c), and the few helpers it makes of it (ucx.c): the entry points come from the UCX
 * the library loaded (ferry_ucx_symbol), the types are declared here, as gpu.h declares
 * CUDA's, so that the tool builds where UCX is absent.
 *
 * UCP's public ABI as of UCX 1.10: structures only grow at their end and UCP reads a field
 * only when its bit is set in field_mask (op_attr_mask), so each structure is declared up to
 * the last field set here. tests/remote_abi_cli.c checks every offset and value below against
 * UCX's own headers where they are installed. */
#ifndef FERRY_TOOL_UCX_H
#define FERRY_TOOL_UCX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int8_t ucs_status_t; /* one byte: UCX packs the enum of its values */
typedef void *ucs_status_ptr_t;

#define UCS_OK             0
#define UCS_INPROGRESS     1
#define UCS_ERR_BUSY       (-15)
#define UCS_ERR_LAST       (-100)
#define UCS_PTR_IS_ERR_(p) ((uintptr_t)(p) >= (uintptr_t)UCS_ERR_LAST)

typedef enum {
    UCS_THREAD_MODE_SINGLE,
    UCS_THREAD_MODE_SERIALIZED,
    UCS_THREAD_MODE_MULTI,
} ucs_thread_mode_t;
typedef enum { UCS_MEMORY_TYPE_HOST, UCS_MEMORY_TYPE_CUDA } ucs_memory_type_t;

typedef struct ucp_context *ucp_context_h;
typedef struct ucp_config ucp_config_t;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_address ucp_address_t;
typedef struct ucp_ep *ucp_ep_h;
typedef struct ucp_mem *ucp_mem_h;
typedef struct ucp_rkey_handle *ucp_rkey_h;

#define UCP_PARAM_FIELD_FEATURES (1ull << 0)
#define UCP_FEATURE_RMA          (1ull << 1)
#define UCP_FEATURE_WAKEUP       (1ull << 4)
#define UCP_FEATURE_AM           (1ull << 6)

typedef struct ucp_params {
    uint64_t field_mask;
    uint64_t features;
} ucp_params_t;

#define UCP_ATTR_FIELD_MEMORY_TYPES (1ull << 2)

typedef struct ucp_context_attr {
    uint64_t field_mask;
    size_t request_size;
    ucs_thread_mode_t thread_mode;
    uint64_t memory_types; /* bit UCS_MEMORY_TYPE_x: memory this context reaches */
} ucp_context_attr_t;

#define UCP_WORKER_PARAM_FIELD_THREAD_MODE (1ull << 0)

typedef struct ucp_worker_params {
    uint64_t field_mask;
    ucs_thread_mode_t thread_mode;
} ucp_worker_params_t;

#define UCP_EP_PARAM_FIELD_REMOTE_ADDRESS    (1ull << 0)
#define UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE (1ull << 1)
#define UCP_EP_PARAM_FIELD_ERR_HANDLER       (1ull << 2)
#define UCP_ERR_HANDLING_MODE_PEER           1
#define UCP_EP_CLOSE_FLAG_FORCE              (1u << 0)

typedef struct ucp_err_handler {
    void (*cb)(void *arg, ucp_ep_h ep, ucs_status_t status);
    void *arg;
} ucp_err_handler_t;

typedef struct ucp_ep_params {
    uint64_t field_mask;
    const ucp_address_t *address;
    int err_mode; /* ucp_err_handling_mode_t */
    ucp_err_handler_t err_handler;
} ucp_ep_params_t;

#define UCP_MEM_MAP_PARAM_FIELD_ADDRESS     (1ull << 0)
#define UCP_MEM_MAP_PARAM_FIELD_LENGTH      (1ull << 1)
#define UCP_MEM_MAP_PARAM_FIELD_PROT        (1ull << 3)
#define UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE (1ull << 4)
#define UCP_MEM_MAP_PROT_LOCAL_READ         (1u << 0)
#define UCP_MEM_MAP_PROT_LOCAL_WRITE        (1u << 1)
#define UCP_MEM_MAP_PROT_REMOTE_READ        (1u << 8)

typedef struct ucp_mem_map_params {
    uint64_t field_mask;
    void *address;
    size_t length;
    unsigned flags;
    unsigned prot;
    ucs_memory_type_t memory_type;
} ucp_mem_map_params_t;

#define UCP_OP_ATTR_FIELD_CALLBACK    (1u << 1)
#define UCP_OP_ATTR_FIELD_USER_DATA   (1u << 2)
#define UCP_OP_ATTR_FIELD_FLAGS       (1u << 4)
#define UCP_OP_ATTR_FIELD_MEMORY_TYPE (1u << 6)
#define UCP_OP_ATTR_FIELD_MEMH        (1u << 8)
#define UCP_AM_SEND_FLAG_EAGER        (1u << 1)

typedef void (*ucp_send_nbx_callback_t)(void *request, ucs_status_t status, void *user_data);

typedef struct {
    uint32_t op_attr_mask;
    uint32_t flags;
    void *request;
    union {
        ucp_send_nbx_callback_t send;
        void *other;
    } cb;
    uint64_t datatype;
    void *user_data;
    void *reply_buffer;
    ucs_memory_type_t memory_type;
    union {
        size_t *length;
        void *tag_info;
    } recv_info;
    ucp_mem_h memh; /* UCX 1.12 and later: the floor's registered destination */
} ucp_request_param_t;

#define UCP_AM_HANDLER_PARAM_FIELD_ID    (1ull << 0)
#define UCP_AM_HANDLER_PARAM_FIELD_FLAGS (1ull << 1)
#define UCP_AM_HANDLER_PARAM_FIELD_CB    (1ull << 2)
#define UCP_AM_HANDLER_PARAM_FIELD_ARG   (1ull << 3)
#define UCP_AM_FLAG_WHOLE_MSG            (1u << 0)

typedef struct ucp_am_recv_param ucp_am_recv_param_t; /* not looked at */
typedef ucs_status_t (*ucp_am_recv_callback_t)(void *arg, const void *header, size_t header_length,
                                               void *data, size_t length,
                                               const ucp_am_recv_param_t *param);

typedef struct ucp_am_handler_param {
    uint64_t field_mask;
    unsigned id;
    uint32_t flags;
    ucp_am_recv_callback_t cb;
    void *arg;
} ucp_am_handler_param_t;

/* X(name, return type, parameters) */
#define UCX_FUNCTIONS(X)                                                                           \
    X(ucs_status_string, const char *, (ucs_status_t))                                             \
    X(ucp_init_version, ucs_status_t,                                                              \
      (unsigned, unsigned, const ucp_params_t *, const ucp_config_t *, ucp_context_h *))           \
    X(ucp_cleanup, void, (ucp_context_h))                                                          \
    X(ucp_context_query, ucs_status_t, (ucp_context_h, ucp_context_attr_t *))                      \
    X(ucp_worker_create, ucs_status_t,                                                             \
      (ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *))                                \
    X(ucp_worker_destroy, void, (ucp_worker_h))                                                    \
    X(ucp_worker_get_address, ucs_status_t, (ucp_worker_h, ucp_address_t **, size_t *))            \
    X(ucp_worker_release_address, void, (ucp_worker_h, ucp_address_t *))                           \
    X(ucp_worker_progress, unsigned, (ucp_worker_h))                                               \
    X(ucp_worker_get_efd, ucs_status_t, (ucp_worker_h, int *))                                     \
    X(ucp_worker_arm, ucs_status_t, (ucp_worker_h))                                                \
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
    X(ucp_request_check_status, ucs_status_t, (void *))                                            \
    X(ucp_request_free, void, (void *))

typedef struct ucx_api {
#define UCX_SLOT_(name, ret, params) ret(*name) params;
    UCX_FUNCTIONS(UCX_SLOT_)
#undef UCX_SLOT_
} ucx_api;

extern ucx_api ucx;

/* Takes the entry points of the UCX the library loaded, once: NULL, or why there is none. */
const char *ucx_load(void);

/* "call failed: UCX's text (status)", in a thread-local buffer. */
const char *ucx_error(const char *call, ucs_status_t st);

typedef struct ucx_node {
    ucp_context_h context;
    ucp_worker_h worker;
    int efd; /* the worker's event fd */
    ucp_address_t *address;
    size_t address_len;
} ucx_node;

/* A context and worker made as ferry makes its own (AM, RMA and wake-ups; UCX's settings from
 * the environment), in thread mode `mode` (SERIALIZED: the caller keeps calls apart; MULTI:
 * UCX does), with cb handling active message am_id: NULL, or why not (ucx_node_close
 * releases what was made). */
const char *ucx_node_open(ucx_node *n, ucs_thread_mode_t mode, unsigned am_id,
                          ucp_am_recv_callback_t cb, void *arg);
void ucx_node_close(ucx_node *n);

/* Whether the node's UCX reaches CUDA memory (it was built with CUDA support). */
int ucx_node_cuda(ucx_node *n);

/* An endpoint to a worker address, in peer failure mode as ferry's are: NULL, or why not. */
const char *ucx_ep_open(ucx_node *n, const void *address, ucp_ep_h *ep);
/* Closes an endpoint by force (the run is over or failed); NULL is a no-op. */
void ucx_ep_close(ucx_node *n, ucp_ep_h ep);

/* Progresses n until req (what a ucp_*_nbx call returned) is done and frees it, as ferry's
 * remote calls wait for theirs: spins spin_ns, then sleeps on n's event fd. NULL, or why
 * not. */
const char *ucx_wait(ucx_node *n, void *req, uint64_t spin_ns, uint64_t timeout_ns,
                     const char *call);

/* Sends an active message of a header alone, eagerly: a request, NULL or an error. */
void *ucx_am_send(ucp_ep_h ep, unsigned id, const void *header, size_t n);
/* The same without waiting for it: the header is copied, and freed with the request by
 * whichever thread progresses the worker when UCX is done with it. NULL, or why not. */
const char *ucx_am_post(ucp_ep_h ep, unsigned id, const void *header, size_t n);

/* How reads on ep go, from its lanes: "native RMA over <transports>", or "emulated over active
 * messages (<transports>)" when no lane carries remote memory access. */
void ucx_read_path(ucp_ep_h ep, char *out, size_t size);

#endif
