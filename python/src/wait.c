/* Blocking calls in bounded slices. The library waits without the GIL, so Python cannot run
 * its signal handlers meanwhile: a receive that waits forever, or a publish that waits for
 * space, would ignore Ctrl-C. Such calls wait at most FY_WAIT_SLICE_NS at a time inside the
 * library and handle signals (PyErr_CheckSignals, with the GIL) between slices; a handler's
 * exception (KeyboardInterrupt) ends the call, which has left nothing half-done: no slice
 * leased, nothing read or acknowledged. */

#include "ferry_py.h"

void fy_wait_start(fy_wait *w, uint64_t total_ns)
{
    uint64_t now = ferry_now_ns();
    w->total_ns = total_ns;
    w->deadline = total_ns >= UINT64_MAX - now ? UINT64_MAX : now + total_ns;
    w->sliced = 0;
}

uint64_t fy_wait_slice(const fy_wait *w)
{
    if (!w->sliced) /* a short wait is one call, whose messages name its whole timeout */
        return w->total_ns < FY_WAIT_SLICE_NS ? w->total_ns : FY_WAIT_SLICE_NS;
    if (w->deadline == UINT64_MAX)
        return FY_WAIT_SLICE_NS;
    uint64_t now = ferry_now_ns();
    uint64_t left = w->deadline > now ? w->deadline - now : 0;
    return left < FY_WAIT_SLICE_NS ? left : FY_WAIT_SLICE_NS;
}

int fy_wait_next(fy_wait *w)
{
    if (w->deadline != UINT64_MAX && ferry_now_ns() >= w->deadline)
        return 0;
    if (PyErr_CheckSignals() < 0)
        return -1;
    w->sliced = 1;
    return 1;
}

int fy_wait_call(fy_wait *w, ferry_status (*call)(void *ctx, uint64_t slice_ns), void *ctx,
                 ferry_status *status)
{
    for (;;) {
        uint64_t slice = fy_wait_slice(w);
        ferry_status st;
        Py_BEGIN_ALLOW_THREADS
        st = call(ctx, slice);
        Py_END_ALLOW_THREADS
        *status = st;
        if (st != FERRY_TIMEOUT)
            return 0;
        int more = fy_wait_next(w);
        if (more <= 0)
            return more;
    }
}
