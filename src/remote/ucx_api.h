/* The slice of UCX's UCP API that ferry uses, declared here so that ferry builds where UCX is
 * absent (it is loaded at run time: remote/ucx.h).
 *
 * Types, constants and structure layouts are UCP's public ABI as of UCX 1.10, which later
 * releases keep: structures only grow at their end, and UCP reads a field only when its bit
 * is set in field_mask (or op_attr_mask), so a structure declared here up to the last field
 * ferry sets is valid for every release since. tests/test_remote_abi.c checks every offset
 * and value below against UCX's own headers where they are installed. */
#ifndef FERRY_REMOTE_UCX_API_H
#define FERRY_REMOTE_UCX_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef int8_t ucs_status_t; /* UCX packs the enum of its values (-100 to 1) into a byte */
typedef void *ucs_status_ptr_t;

#define UCS_OK                   0
#define UCS_INPROGRESS           1
#define UCS_ERR_NO_MESSAGE       (-1)
#define UCS_ERR_NO_MEMORY        (-4)
#define UCS_ERR_BUSY             (-15)
#define UCS_ERR_CANCELED         (-16)
#define UCS_ERR_CONNECTION_RESET (-25)
#define UCS_ERR_LAST             (-100)

/* A request pointer, or an error status cast to a pointer, or NULL (done at once). */
#define FERRY_UCS_PTR_IS_ERR(p) ((uintptr_t)(p) >= (uintptr_t)UCS_ERR_LAST)
#define FERRY_UCS_PTR_STATUS(p) ((ucs_status_t)(intptr_t)(p))

typedef enum {
    UCS_THREAD_MODE_SINGLE,
    UCS_THREAD_MODE_SERIALIZED,
    UCS_THREAD_MODE_MULTI,
} ucs_thread_mode_t;

typedef enum {
    UCS_MEMORY_TYPE_HOST,
    UCS_MEMORY_TYPE_CUDA,
} ucs_memory_type_t;

typedef struct {
    unsigned long ucs_bits[1024 / (8 * sizeof(unsigned long))];
} ucs_cpu_set_t;

typedef struct {
    const struct sockaddr *addr;
    socklen_t addrlen;
} ucs_sock_addr_t;

typedef struct ucp_context *ucp_context_h;
typedef struct ucp_config ucp_config_t;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_address ucp_address_t;
typedef struct ucp_ep *ucp_ep_h;
typedef struct ucp_mem *ucp_mem_h;
typedef struct ucp_rkey_handle *ucp_rkey_h;
typedef struct ucp_conn_request *ucp_conn_request_h;
typedef uint64_t ucp_datatype_t;

/* ucp_params_t */
#define UCP_PARAM_FIELD_FEATURES (1ull << 0)
#define UCP_PARAM_FIELD_NAME     (1ull << 8)
#define UCP_FEATURE_RMA          (1ull << 1)
#define UCP_FEATURE_WAKEUP       (1ull << 4)
#define UCP_FEATURE_AM           (1ull << 6)

typedef struct ucp_params {
    uint64_t field_mask;
    uint64_t features;
    size_t request_size;
    void (*request_init)(void *);
    void (*request_cleanup)(void *);
    uint64_t tag_sender_mask;
    int mt_workers_shared;
    size_t estimated_num_eps;
    size_t estimated_num_ppn;
    const char *name;
} ucp_params_t;

/* ucp_context_attr_t */
#define UCP_ATTR_FIELD_MEMORY_TYPES (1ull << 2)

typedef struct ucp_context_attr {
    uint64_t field_mask;
    size_t request_size;
    ucs_thread_mode_t thread_mode;
    uint64_t memory_types; /* bit UCS_MEMORY_TYPE_x: memory UCX can reach */
} ucp_context_attr_t;

/* ucp_worker_params_t */
#define UCP_WORKER_PARAM_FIELD_THREAD_MODE (1ull << 0)

typedef struct ucp_worker_params {
    uint64_t field_mask;
    ucs_thread_mode_t thread_mode;
    ucs_cpu_set_t cpu_mask;
    unsigned events;
    void *user_data;
    int event_fd;
    uint64_t flags;
    const char *name;
} ucp_worker_params_t;

/* ucp_worker_attr_t */
#define UCP_WORKER_ATTR_FIELD_THREAD_MODE (1ull << 0)

typedef struct ucp_worker_attr {
    uint64_t field_mask;
    ucs_thread_mode_t thread_mode;
} ucp_worker_attr_t;

/* ucp_ep_params_t */
#define UCP_EP_PARAM_FIELD_REMOTE_ADDRESS    (1ull << 0)
#define UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE (1ull << 1)
#define UCP_EP_PARAM_FIELD_ERR_HANDLER       (1ull << 2)
#define UCP_EP_PARAM_FIELD_USER_DATA         (1ull << 3)

typedef enum {
    UCP_ERR_HANDLING_MODE_NONE,
    UCP_ERR_HANDLING_MODE_PEER,
} ucp_err_handling_mode_t;

typedef void (*ucp_err_handler_cb_t)(void *arg, ucp_ep_h ep, ucs_status_t status);

typedef struct ucp_err_handler {
    ucp_err_handler_cb_t cb;
    void *arg;
} ucp_err_handler_t;

typedef struct ucp_ep_params {
    uint64_t field_mask;
    const ucp_address_t *address;
    ucp_err_handling_mode_t err_mode;
    ucp_err_handler_t err_handler;
    void *user_data;
} ucp_ep_params_t;

#define UCP_EP_CLOSE_FLAG_FORCE (1u << 0)

/* ucp_mem_map_params_t */
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

/* ucp_request_param_t: what a nonblocking operation is told */
#define UCP_OP_ATTR_FIELD_CALLBACK    (1u << 1)
#define UCP_OP_ATTR_FIELD_USER_DATA   (1u << 2)
#define UCP_OP_ATTR_FIELD_FLAGS       (1u << 4)
#define UCP_OP_ATTR_FIELD_MEMORY_TYPE (1u << 6)
#define UCP_OP_ATTR_FLAG_NO_IMM_CMPL  (1u << 16)

typedef void (*ucp_send_nbx_callback_t)(void *request, ucs_status_t status, void *user_data);

typedef struct {
    uint32_t op_attr_mask;
    uint32_t flags;
    void *request;
    union {
        ucp_send_nbx_callback_t send;
        void *other;
    } cb;
    ucp_datatype_t datatype;
    void *user_data;
    void *reply_buffer;
    ucs_memory_type_t memory_type;
    union {
        size_t *length;
        void *tag_info;
    } recv_info;
    ucp_mem_h memh; /* UCX 1.12 and later: never set by ferry */
} ucp_request_param_t;

/* Active messages */
#define UCP_AM_HANDLER_PARAM_FIELD_ID    (1ull << 0)
#define UCP_AM_HANDLER_PARAM_FIELD_FLAGS (1ull << 1)
#define UCP_AM_HANDLER_PARAM_FIELD_CB    (1ull << 2)
#define UCP_AM_HANDLER_PARAM_FIELD_ARG   (1ull << 3)
#define UCP_AM_FLAG_WHOLE_MSG            (1u << 0)
#define UCP_AM_SEND_FLAG_EAGER           (1u << 1)
#define UCP_AM_RECV_ATTR_FLAG_DATA       (1ull << 16)
#define UCP_AM_RECV_ATTR_FLAG_RNDV       (1ull << 17)

typedef struct ucp_am_recv_param {
    uint64_t recv_attr;
    ucp_ep_h reply_ep;
} ucp_am_recv_param_t;

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

#endif
