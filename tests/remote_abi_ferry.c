/* The list of tests/remote_abi.h against ferry's declarations, and the comparison: every
 * offset, size and constant ferry relies on is UCX's. Built where UCX's headers are installed
 * (Debian's libucx-dev in CI). */
#include <stddef.h>
#include <stdio.h>

#include "remote/ucx_api.h"
#include "remote_abi.h"

extern const long long remote_abi_ucx[];
static const long long remote_abi_ferry[] = {REMOTE_ABI(REMOTE_ABI_VALUE) 0};
static const char *const names[] = {REMOTE_ABI(REMOTE_ABI_NAME) NULL};

int main(void)
{
    int bad = 0;
    for (int i = 0; names[i]; i++)
        if (remote_abi_ferry[i] != remote_abi_ucx[i]) {
            fprintf(stderr, "remote_abi: %s is %lld in ferry, %lld in UCX\n", names[i],
                    remote_abi_ferry[i], remote_abi_ucx[i]);
            bad = 1;
        }
    if (!bad)
        printf("remote_abi: %zu offsets, sizes and constants match UCX's headers\n",
               sizeof(remote_abi_ferry) / sizeof(remote_abi_ferry[0]) - 1);
    return bad;
}
