#include <errno.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "hold.h"
#include "remote/remote.h"

static struct {
    sem_t paused, resume;
    int armed; /* atomic */
} held;

static void hold_hook(uint32_t slot, uint32_t generation)
{
    (void)slot, (void)generation;
    if (!__atomic_exchange_n(&held.armed, 0, __ATOMIC_ACQ_REL))
        return;
    sem_post(&held.paused);
    while (sem_wait(&held.resume) != 0) {
    }
}

void th_hold_install(void)
{
    assert_int_equal(sem_init(&held.paused, 0, 0), 0);
    assert_int_equal(sem_init(&held.resume, 0, 0), 0);
    ferry__remote_test_before_copy = hold_hook;
}

void th_hold_arm(void)
{
    __atomic_store_n(&held.armed, 1, __ATOMIC_RELEASE);
}

void th_hold_wait(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (sem_timedwait(&held.paused, &until) != 0)
        assert_int_equal(errno, EINTR);
}

void th_hold_release(void)
{
    sem_post(&held.resume);
}

void th_hold_remove(void)
{
    ferry__remote_test_before_copy = NULL;
    sem_destroy(&held.paused);
    sem_destroy(&held.resume);
}

int th_hold_undo(void **state)
{
    (void)state;
    if (ferry__remote_test_before_copy == hold_hook) {
        __atomic_store_n(&held.armed, 0, __ATOMIC_RELEASE);
        ferry__remote_test_before_copy = NULL;
        sem_post(&held.resume);
    }
    return 0;
}
