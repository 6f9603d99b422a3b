/* The header's shared words that wake somebody, each wake-up beside its wait:
 *
 * - the acknowledgement sequence (ack_seq): whoever acknowledges or frees space bumps it and
 *   wakes the publishers asleep on it (producer_waiters counts them);
 * - a slot's ready word: the producer stores it and wakes the consumers asleep on ready words
 *   (consumer_waiters counts them);
 * - the closing flag: set once by the producer, read by every wait of a consumer.
 *
 * Each pair that must not miss a wake-up is a Dekker pair: the waiter raises its count, then
 * looks at the word; the waker changes the word, then looks at the count; both sides with
 * sequentially consistent accesses, so that at least one of them sees the other. A count is
 * only ever compared with zero: whatever a peer writes into it costs a needless wake-up or a
 * sleep that lasts its full slice, never more. */
#ifndef FERRY_SHM_SIGNAL_H
#define FERRY_SHM_SIGNAL_H

#include <stdint.h>

#include "shm/segment.h"

/* ---- the acknowledgement sequence ----------------------------------------------------- */

/* After an acknowledgement, a cancel or a freed slice: bumps ack_seq and wakes the
 * publishers asleep on it. */
void ferry__shm_acked(ferry__shm *s);

/* A publisher's wait for space: begin counts it among the sleepers (before its first look),
 * end uncounts it. */
void ferry__shm_space_wait_begin(ferry__shm *s);
void ferry__shm_space_wait_end(ferry__shm *s);

/* The sequence as a look saw it (read before the look), and a sleep of at most ns unless it
 * moved on since. */
uint32_t ferry__shm_ack_seq(ferry__shm *s);
void ferry__shm_sleep_on_acks(ferry__shm *s, uint32_t seen, uint64_t ns);

/* ---- ready words (in the segment's control table: host placement) ---------------------------- */

/* Stores a ready word and wakes the consumers asleep on ready words. */
void ferry__shm_ready_store(ferry__shm *s, uint32_t *word, uint32_t generation);

/* Wakes the consumers asleep on word, which the caller has just written (with release
 * stores or any other way: a full fence orders them before the sleeper count is read). */
void ferry__shm_ready_wake(ferry__shm *s, uint32_t *word);

/* Wakes every consumer asleep on one of the count ready words from words, each row_words
 * apart (close). */
void ferry__shm_ready_wake_all(ferry__shm *s, uint32_t *words, uint32_t count, uint32_t row_words);

/* A consumer's sleep of at most ns on word, unless it no longer holds seen. */
void ferry__shm_sleep_on_ready(ferry__shm *s, uint32_t *word, uint32_t seen, uint64_t ns);

/* ---- closing ------------------------------------------------------------------------------ */

/* The producer closes the pool: every consumer's wait ends (their wake-ups are the caller's). */
void ferry__shm_close(ferry__shm *s);

/* 1 once the producer closed the pool. */
int ferry__shm_closing(const ferry__shm *s);

#endif
