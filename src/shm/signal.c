/* The header's shared words that wake somebody, each wake-up beside its wait (signal.h). */
#include "common/atomic.h"
#include "common/futex.h"
#include "shm/signal.h"

void ferry__shm_acked(ferry__shm *s)
{
    ferry__shm_header *h = s->header;
    ferry__fetch_add_seqcst32(&h->ack_seq, 1);
    if (ferry__load_seqcst32(&h->producer_waiters))
        ferry__futex_wake_all(&h->ack_seq);
}

void ferry__shm_space_wait_begin(ferry__shm *s)
{
    ferry__fetch_add_seqcst32(&s->header->producer_waiters, 1);
}

void ferry__shm_space_wait_end(ferry__shm *s)
{
    ferry__fetch_add_seqcst32(&s->header->producer_waiters, (uint32_t)-1);
}

uint32_t ferry__shm_ack_seq(ferry__shm *s)
{
    return ferry__load_seqcst32(&s->header->ack_seq);
}

void ferry__shm_sleep_on_acks(ferry__shm *s, uint32_t seen, uint64_t ns)
{
    ferry__futex_wait(&s->header->ack_seq, seen, ns);
}

void ferry__shm_ready_store(ferry__shm *s, uint32_t *word, uint32_t generation)
{
    /* seq_cst, so that the read of the sleeper count below cannot pass it. */
    ferry__store_seqcst32(word, generation);
    if (ferry__load_seqcst32(&s->header->consumer_waiters))
        ferry__futex_wake_all(word);
}

void ferry__shm_ready_wake(ferry__shm *s, uint32_t *word)
{
    /* The word was written with release stores (cancel), which do not order a later load:
     * the full fence keeps them before the read of the sleeper count (the other half of the
     * Dekker pair with ferry__shm_sleep_on_ready). */
    ferry__fence_seqcst();
    if (ferry__load_seqcst32(&s->header->consumer_waiters))
        ferry__futex_wake_all(word);
}

void ferry__shm_ready_wake_all(ferry__shm *s, uint32_t *words, uint32_t count, uint32_t row_words)
{
    if (!ferry__load_seqcst32(&s->header->consumer_waiters))
        return;
    for (uint32_t i = 0; i < count; i++)
        ferry__futex_wake_all(&words[(uint64_t)i * row_words]);
}

/* The waiter count is raised first (seq_cst, as the producer's store of the word and its
 * read of the count), so that a producer that writes the word after our look wakes us. */
void ferry__shm_sleep_on_ready(ferry__shm *s, uint32_t *word, uint32_t seen, uint64_t ns)
{
    ferry__fetch_add_seqcst32(&s->header->consumer_waiters, 1);
    if (ferry__load_seqcst32(word) == seen)
        ferry__futex_wait(word, seen, ns);
    ferry__fetch_add_seqcst32(&s->header->consumer_waiters, (uint32_t)-1);
}

void ferry__shm_close(ferry__shm *s)
{
    ferry__store_seqcst32(&s->header->closing, 1);
}

int ferry__shm_closing(const ferry__shm *s)
{
    return ferry__load_acquire32(&s->header->closing) != 0;
}
