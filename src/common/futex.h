/* Sleeping on a 32-bit word shared between processes (Linux futex, non-private). */
#ifndef FERRY_COMMON_FUTEX_H
#define FERRY_COMMON_FUTEX_H

#include <stdint.h>

/* Sleeps while *word == expected, at most timeout_ns. Returns 0 on a wake-up, timeout or
 * signal, or a value change; callers re-check their condition either way. */
int ferry__futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns);

/* Wakes every process sleeping on word. */
void ferry__futex_wake_all(uint32_t *word);

#endif
