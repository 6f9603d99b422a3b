/* The remote server's thread held between its check of a lease and its copy of the lease's
 * bytes (an inline DESC's or a served read's: ferry__remote_test_before_copy), once each time
 * it is armed: for tests that recycle a lease, or kill a consumer, at exactly that point. */
#ifndef FERRY_TESTS_HOLD_H
#define FERRY_TESTS_HOLD_H

/* Sets the hook (unarmed). */
void th_hold_install(void);
/* The next copy holds the thread until th_hold_release. */
void th_hold_arm(void);
/* Waits (10 s at most: the test fails) until the armed copy holds the thread. */
void th_hold_wait(void);
/* Lets the held thread go on. */
void th_hold_release(void);
/* Clears the hook; the thread is not held (released, or never armed). */
void th_hold_remove(void);
/* For a test's teardown: if the test left the hook set (it failed on the way), disarms and
 * clears it and lets a held thread go, so that the tests after it run. 0. */
int th_hold_undo(void **state);

#endif
