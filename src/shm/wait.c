/* The one wait loop (wait.h). */
#include <sched.h>

#include "common/clock.h"
#include "shm/wait.h"

static uint64_t min3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t m = a < b ? a : b;
    return m < c ? m : c;
}

ferry_status ferry__wait_run(const ferry__wait *w, uint64_t timeout_ns, uint64_t deadline)
{
    uint64_t start = 0, next_check = UINT64_MAX;
    for (;;) {
        int r = w->look(w->ctx);
        if (r != FERRY__WAIT_AGAIN)
            return (ferry_status)r;
        uint64_t now = ferry__now_ns();
        if (!start) {
            start = now;
            if (!deadline)
                deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
            if (w->check)
                next_check = now + w->check_ns;
        } else if (now >= next_check) {
            ferry_status st = w->check(w->ctx);
            if (st != FERRY_OK)
                return st;
            next_check = now + w->check_ns;
        }
        if (now >= deadline) {
            r = w->expired(w->ctx);
            if (r == FERRY__WAIT_AGAIN)
                continue;
            return (ferry_status)r;
        }
        if (now - start < w->spin_ns) {
            sched_yield();
            continue;
        }
        w->sleep(w->ctx, min3(deadline - now, w->slice_ns, next_check - now));
    }
}
