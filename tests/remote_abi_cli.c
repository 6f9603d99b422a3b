/* The CLI's list of tests/remote_abi.h against the CLI's declarations (tools/ferry/ucx.h). */
#include <stddef.h>

#include "remote_abi.h"
#include "ucx.h"

extern const long long remote_abi_cli[];
const long long remote_abi_cli[] = {REMOTE_ABI_CLI(REMOTE_ABI_VALUE) 0};
