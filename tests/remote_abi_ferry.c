/* The list of tests/remote_abi.h against ferry's declarations, and the comparison of both
 * lists: every offset, size and constant ferry and its CLI rely on is UCX's. Built where UCX's
 * headers are installed (Debian's libucx-dev in CI). */
#include <stddef.h>
#include <stdio.h>

#include "remote/ucx_api.h"
#include "remote_abi.h"

extern const long long remote_abi_ucx[], remote_abi_cli_ucx[], remote_abi_cli[];
static const long long remote_abi_ferry[] = {REMOTE_ABI(REMOTE_ABI_VALUE) 0};
static const char *const names[] = {REMOTE_ABI(REMOTE_ABI_NAME) NULL};
static const char *const cli_names[] = {REMOTE_ABI_CLI(REMOTE_ABI_NAME) NULL};

/* Compares one list: the number of entries that match, or -1 if one does not. */
static int compare(const char *who, const char *const *list, const long long *ours,
                   const long long *ucx)
{
    int i, bad = 0;
    for (i = 0; list[i]; i++)
        if (ours[i] != ucx[i]) {
            fprintf(stderr, "remote_abi: %s is %lld in %s, %lld in UCX\n", list[i], ours[i], who,
                    ucx[i]);
            bad = 1;
        }
    return bad ? -1 : i;
}

int main(void)
{
    int lib = compare("ferry", names, remote_abi_ferry, remote_abi_ucx);
    int cli = compare("the CLI (tools/ferry/ucx.h)", cli_names, remote_abi_cli, remote_abi_cli_ucx);
    if (lib < 0 || cli < 0)
        return 1;
    printf("remote_abi: %d offsets, sizes and constants of ferry's and %d of the CLI's match UCX's "
           "headers\n",
           lib, cli);
    return 0;
}
