/* What ferry relies on in UCP's ABI, as expressions that mean the same with UCX's own headers
 * and with ferry's declarations: REMOTE_ABI for the library's (src/remote/ucx_api.h),
 * REMOTE_ABI_CLI for the CLI's (tools/ferry/ucx.h). remote_abi_ucx.c evaluates both lists
 * against UCX's headers, remote_abi_ferry.c and remote_abi_cli.c each against ferry's, and
 * remote_abi_ferry.c's main compares. */
#define REMOTE_ABI(X)                                                                              \
    X(sizeof(ucs_status_t))                                                                        \
    X(sizeof(ucs_cpu_set_t))                                                                       \
    X(sizeof(ucs_sock_addr_t))                                                                     \
    X(offsetof(ucp_params_t, features))                                                            \
    X(offsetof(ucp_params_t, name))                                                                \
    X(offsetof(ucp_context_attr_t, memory_types))                                                  \
    X(offsetof(ucp_worker_params_t, thread_mode))                                                  \
    X(offsetof(ucp_worker_params_t, cpu_mask))                                                     \
    X(offsetof(ucp_worker_params_t, name))                                                         \
    X(offsetof(ucp_worker_attr_t, thread_mode))                                                    \
    X(offsetof(ucp_ep_params_t, address))                                                          \
    X(offsetof(ucp_ep_params_t, err_mode))                                                         \
    X(offsetof(ucp_ep_params_t, err_handler))                                                      \
    X(offsetof(ucp_ep_params_t, user_data))                                                        \
    X(sizeof(ucp_err_handler_t))                                                                   \
    X(offsetof(ucp_mem_map_params_t, address))                                                     \
    X(offsetof(ucp_mem_map_params_t, length))                                                      \
    X(offsetof(ucp_mem_map_params_t, flags))                                                       \
    X(offsetof(ucp_mem_map_params_t, prot))                                                        \
    X(offsetof(ucp_mem_map_params_t, memory_type))                                                 \
    X(offsetof(ucp_request_param_t, flags))                                                        \
    X(offsetof(ucp_request_param_t, request))                                                      \
    X(offsetof(ucp_request_param_t, cb))                                                           \
    X(offsetof(ucp_request_param_t, datatype))                                                     \
    X(offsetof(ucp_request_param_t, user_data))                                                    \
    X(offsetof(ucp_request_param_t, memory_type))                                                  \
    X(offsetof(ucp_request_param_t, memh))                                                         \
    X(offsetof(ucp_am_recv_param_t, recv_attr))                                                    \
    X(offsetof(ucp_am_recv_param_t, reply_ep))                                                     \
    X(offsetof(ucp_am_handler_param_t, id))                                                        \
    X(offsetof(ucp_am_handler_param_t, flags))                                                     \
    X(offsetof(ucp_am_handler_param_t, cb))                                                        \
    X(offsetof(ucp_am_handler_param_t, arg))                                                       \
    X(UCS_OK)                                                                                      \
    X(UCS_INPROGRESS)                                                                              \
    X(UCS_ERR_NO_MESSAGE)                                                                          \
    X(UCS_ERR_NO_MEMORY)                                                                           \
    X(UCS_ERR_BUSY)                                                                                \
    X(UCS_ERR_CANCELED)                                                                            \
    X(UCS_ERR_CONNECTION_RESET)                                                                    \
    X(UCS_ERR_LAST)                                                                                \
    X(UCS_THREAD_MODE_SERIALIZED)                                                                  \
    X(UCS_MEMORY_TYPE_HOST)                                                                        \
    X(UCS_MEMORY_TYPE_CUDA)                                                                        \
    X(UCP_PARAM_FIELD_FEATURES)                                                                    \
    X(UCP_PARAM_FIELD_NAME)                                                                        \
    X(UCP_FEATURE_RMA)                                                                             \
    X(UCP_FEATURE_WAKEUP)                                                                          \
    X(UCP_FEATURE_AM)                                                                              \
    X(UCP_ATTR_FIELD_MEMORY_TYPES)                                                                 \
    X(UCP_WORKER_PARAM_FIELD_THREAD_MODE)                                                          \
    X(UCP_WORKER_ATTR_FIELD_THREAD_MODE)                                                           \
    X(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS)                                                           \
    X(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE)                                                        \
    X(UCP_EP_PARAM_FIELD_ERR_HANDLER)                                                              \
    X(UCP_EP_PARAM_FIELD_USER_DATA)                                                                \
    X(UCP_ERR_HANDLING_MODE_PEER)                                                                  \
    X(UCP_EP_CLOSE_FLAG_FORCE)                                                                     \
    X(UCP_MEM_MAP_PARAM_FIELD_ADDRESS)                                                             \
    X(UCP_MEM_MAP_PARAM_FIELD_LENGTH)                                                              \
    X(UCP_MEM_MAP_PARAM_FIELD_PROT)                                                                \
    X(UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE)                                                         \
    X(UCP_MEM_MAP_PROT_LOCAL_READ)                                                                 \
    X(UCP_MEM_MAP_PROT_LOCAL_WRITE)                                                                \
    X(UCP_MEM_MAP_PROT_REMOTE_READ)                                                                \
    X(UCP_OP_ATTR_FIELD_CALLBACK)                                                                  \
    X(UCP_OP_ATTR_FIELD_USER_DATA)                                                                 \
    X(UCP_OP_ATTR_FIELD_FLAGS)                                                                     \
    X(UCP_OP_ATTR_FIELD_MEMORY_TYPE)                                                               \
    X(UCP_OP_ATTR_FLAG_NO_IMM_CMPL)                                                                \
    X(UCP_AM_HANDLER_PARAM_FIELD_ID)                                                               \
    X(UCP_AM_HANDLER_PARAM_FIELD_FLAGS)                                                            \
    X(UCP_AM_HANDLER_PARAM_FIELD_CB)                                                               \
    X(UCP_AM_HANDLER_PARAM_FIELD_ARG)                                                              \
    X(UCP_AM_FLAG_WHOLE_MSG)                                                                       \
    X(UCP_AM_SEND_FLAG_EAGER)                                                                      \
    X(UCP_AM_RECV_ATTR_FLAG_DATA)                                                                  \
    X(UCP_AM_RECV_ATTR_FLAG_RNDV)

#define REMOTE_ABI_CLI(X)                                                                          \
    X(sizeof(ucs_status_t))                                                                        \
    X(offsetof(ucp_params_t, features))                                                            \
    X(offsetof(ucp_context_attr_t, memory_types))                                                  \
    X(offsetof(ucp_worker_params_t, thread_mode))                                                  \
    X(offsetof(ucp_ep_params_t, address))                                                          \
    X(offsetof(ucp_ep_params_t, err_mode))                                                         \
    X(offsetof(ucp_ep_params_t, err_handler))                                                      \
    X(sizeof(ucp_err_handler_t))                                                                   \
    X(offsetof(ucp_err_handler_t, arg))                                                            \
    X(offsetof(ucp_mem_map_params_t, address))                                                     \
    X(offsetof(ucp_mem_map_params_t, length))                                                      \
    X(offsetof(ucp_mem_map_params_t, flags))                                                       \
    X(offsetof(ucp_mem_map_params_t, prot))                                                        \
    X(offsetof(ucp_mem_map_params_t, memory_type))                                                 \
    X(offsetof(ucp_request_param_t, flags))                                                        \
    X(offsetof(ucp_request_param_t, request))                                                      \
    X(offsetof(ucp_request_param_t, cb))                                                           \
    X(offsetof(ucp_request_param_t, datatype))                                                     \
    X(offsetof(ucp_request_param_t, user_data))                                                    \
    X(offsetof(ucp_request_param_t, reply_buffer))                                                 \
    X(offsetof(ucp_request_param_t, memory_type))                                                  \
    X(offsetof(ucp_request_param_t, memh))                                                         \
    X(offsetof(ucp_am_handler_param_t, id))                                                        \
    X(offsetof(ucp_am_handler_param_t, flags))                                                     \
    X(offsetof(ucp_am_handler_param_t, cb))                                                        \
    X(offsetof(ucp_am_handler_param_t, arg))                                                       \
    X(UCS_OK)                                                                                      \
    X(UCS_INPROGRESS)                                                                              \
    X(UCS_ERR_BUSY)                                                                                \
    X(UCS_ERR_LAST)                                                                                \
    X(UCS_THREAD_MODE_SERIALIZED)                                                                  \
    X(UCS_THREAD_MODE_MULTI)                                                                       \
    X(UCS_MEMORY_TYPE_HOST)                                                                        \
    X(UCS_MEMORY_TYPE_CUDA)                                                                        \
    X(UCP_PARAM_FIELD_FEATURES)                                                                    \
    X(UCP_FEATURE_RMA)                                                                             \
    X(UCP_FEATURE_WAKEUP)                                                                          \
    X(UCP_FEATURE_AM)                                                                              \
    X(UCP_ATTR_FIELD_MEMORY_TYPES)                                                                 \
    X(UCP_WORKER_PARAM_FIELD_THREAD_MODE)                                                          \
    X(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS)                                                           \
    X(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE)                                                        \
    X(UCP_EP_PARAM_FIELD_ERR_HANDLER)                                                              \
    X(UCP_ERR_HANDLING_MODE_PEER)                                                                  \
    X(UCP_EP_CLOSE_FLAG_FORCE)                                                                     \
    X(UCP_MEM_MAP_PARAM_FIELD_ADDRESS)                                                             \
    X(UCP_MEM_MAP_PARAM_FIELD_LENGTH)                                                              \
    X(UCP_MEM_MAP_PARAM_FIELD_PROT)                                                                \
    X(UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE)                                                         \
    X(UCP_MEM_MAP_PROT_LOCAL_READ)                                                                 \
    X(UCP_MEM_MAP_PROT_LOCAL_WRITE)                                                                \
    X(UCP_MEM_MAP_PROT_REMOTE_READ)                                                                \
    X(UCP_OP_ATTR_FIELD_CALLBACK)                                                                  \
    X(UCP_OP_ATTR_FIELD_USER_DATA)                                                                 \
    X(UCP_OP_ATTR_FIELD_FLAGS)                                                                     \
    X(UCP_OP_ATTR_FIELD_MEMORY_TYPE)                                                               \
    X(UCP_OP_ATTR_FIELD_MEMH)                                                                      \
    X(UCP_AM_SEND_FLAG_EAGER)                                                                      \
    X(UCP_AM_HANDLER_PARAM_FIELD_ID)                                                               \
    X(UCP_AM_HANDLER_PARAM_FIELD_FLAGS)                                                            \
    X(UCP_AM_HANDLER_PARAM_FIELD_CB)                                                               \
    X(UCP_AM_HANDLER_PARAM_FIELD_ARG)                                                              \
    X(UCP_AM_FLAG_WHOLE_MSG)

#define REMOTE_ABI_VALUE(expr) (long long)(expr),
#define REMOTE_ABI_NAME(expr)  #expr,
