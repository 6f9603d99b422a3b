/* The lists of tests/remote_abi.h against UCX's own headers. */
#include <stddef.h>

#include <ucp/api/ucp.h>

#include "remote_abi.h"

extern const long long remote_abi_ucx[], remote_abi_cli_ucx[];
const long long remote_abi_ucx[] = {REMOTE_ABI(REMOTE_ABI_VALUE) 0};
const long long remote_abi_cli_ucx[] = {REMOTE_ABI_CLI(REMOTE_ABI_VALUE) 0};
