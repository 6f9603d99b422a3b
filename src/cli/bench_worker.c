/* A consumer process of `ferry bench` (the hidden `ferry bench-worker` command): receives
 * each item's message, reads the item (from the ferry pool or the floor ring), verifies
 * every byte, acknowledges, and records when. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"

#define RECLAIM_SLEEP_MAX_NS 200000ull

typedef struct worker {
    uint32_t rank;
    int sock;
    bench_region region;
    bench_params p;
    bench_rank *me;
    const uint8_t *floor;
    bench_patterns patterns;
    uint8_t *buf;
    uint64_t buf_bytes;
    ferry_consumer *consumer;
} worker;

static void note(worker *w, const char *fmt, va_list ap)
{
    char text[BENCH_MESSAGE_MAX];
    vsnprintf(text, sizeof(text), fmt, ap);
    if (!w->me) {
        fprintf(stderr, "ferry bench-worker rank %u: %s\n", w->rank, text);
        return;
    }
    if (!w->me->message[0])
        memcpy(w->me->message, text, sizeof(text));
}

/* A fatal error: noted in the results region, the worker exits 1. */
__attribute__((format(printf, 2, 3))) static int worker_fail(worker *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(w, fmt, ap);
    va_end(ap);
    if (w->me)
        __atomic_store_n(&w->me->state, BENCH_STATE_FAILED, __ATOMIC_RELEASE);
    return -1;
}

/* A verification error: counted and (the first one) noted; the run goes on. */
__attribute__((format(printf, 3, 4))) static void worker_error(worker *w, int phase,
                                                               const char *fmt, ...)
{
    va_list ap;
    w->me->errors[phase]++;
    va_start(ap, fmt);
    note(w, fmt, ap);
    va_end(ap);
}

static int parse_args(int argc, char **argv, int64_t *rank, int64_t fds[3])
{
    static const char *const names[] = {"--rank", "--fd", "--results-fd", "--floor-fd"};
    int64_t *out[] = {rank, &fds[0], &fds[1], &fds[2]};
    if (argc != 9)
        return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(argv[1 + 2 * i], names[i]) != 0 ||
            cli_parse_int("bench-worker", names[i], argv[2 + 2 * i], out[i]) != 0)
            return -1;
    return *rank >= 0 && *rank <= UINT32_MAX ? 0 : -1;
}

static int map_floor(worker *w, int fd)
{
    if (fd < 0)
        return 0;
    void *p = mmap(NULL, (size_t)w->p.floor_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return worker_fail(w, "mapping the floor ring failed: %s", strerror(errno));
    w->floor = p;
    return 0;
}

static int worker_init(worker *w, int64_t fds[3])
{
    w->sock = (int)fds[0];
    if (bench_region_map((int)fds[1], &w->region) != 0)
        return worker_fail(w, "mapping the results region failed: %s", strerror(errno));
    w->p = w->region.hdr->params;
    if (w->rank >= w->p.consumers)
        return worker_fail(w, "rank %u is outside the run's %llu consumers", w->rank,
                           (unsigned long long)w->p.consumers);
    w->me = &w->region.ranks[w->rank];
    if (map_floor(w, (int)fds[2]) != 0)
        return -1;
    w->buf_bytes = w->p.size_hi;
    w->buf = aligned_alloc(64, (w->buf_bytes + 63) & ~63ull);
    if (!w->buf ||
        bench_patterns_create(&w->patterns, (uint32_t)w->p.ring, w->p.size_hi, w->p.seed) != 0)
        return worker_fail(w, "out of memory for the item buffers");
    memset(w->buf, 0, w->buf_bytes);
    if (ferry_consumer_create(w->rank, &w->consumer) != FERRY_OK)
        return worker_fail(w, "ferry_consumer_create: %s", ferry_last_error());
    return 0;
}

/* Checks the message's header against what the run says item `item` must be. */
static int check_header(worker *w, int phase, const bench_msg *m)
{
    uint64_t limit = phase == BENCH_PHASE_RECLAIM ? w->p.reclaim_rounds + 1 : w->p.items;
    uint64_t want = phase == BENCH_PHASE_RECLAIM
                        ? w->p.reclaim_item
                        : bench_item_size(w->p.seed, w->p.size_lo, w->p.size_hi, m->item);
    if (m->item >= limit || m->seed != w->p.seed || m->size != want)
        return worker_fail(w,
                           "%s message for item %llu (seed %llu, %llu bytes) does not match "
                           "the run (%llu items, seed %llu, %llu bytes)",
                           bench_phase_name(phase), (unsigned long long)m->item,
                           (unsigned long long)m->seed, (unsigned long long)m->size,
                           (unsigned long long)limit, (unsigned long long)w->p.seed,
                           (unsigned long long)want);
    return 0;
}

static void verify(worker *w, int phase, const bench_msg *m)
{
    uint8_t got, want;
    const uint8_t *base = w->patterns.buf[bench_item_key(m->item, w->patterns.count)];
    int64_t off = bench_pattern_verify(w->buf, base, m->size, w->p.seed, m->item, &got, &want);
    if (off < 0) {
        w->me->verified[phase]++;
        return;
    }
    worker_error(w, phase, "%s item %llu (%llu bytes): byte %lld is 0x%02x, expected 0x%02x",
                 bench_phase_name(phase), (unsigned long long)m->item, (unsigned long long)m->size,
                 (long long)off, got, want);
}

/* Decodes the descriptor and copies the item out of the pool into w->buf. */
static int read_item(worker *w, int phase, const bench_msg *m, ferry_descriptor *d)
{
    if (ferry_descriptor_decode(m->desc, FERRY_DESCRIPTOR_SIZE, d) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_descriptor_decode: %s", bench_phase_name(phase),
                           (unsigned long long)m->item, ferry_last_error());
    if (d->length != m->size)
        return worker_fail(w, "%s item %llu: descriptor says %llu bytes, message %llu",
                           bench_phase_name(phase), (unsigned long long)m->item,
                           (unsigned long long)d->length, (unsigned long long)m->size);
    if (ferry_consumer_read(w->consumer, d, w->buf, w->buf_bytes, w->p.timeout_ns) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_read: %s", bench_phase_name(phase),
                           (unsigned long long)m->item, ferry_last_error());
    return 0;
}

static int ack_item(worker *w, int phase, const bench_msg *m, const ferry_descriptor *d)
{
    if (ferry_consumer_ack(w->consumer, d) != FERRY_OK)
        return worker_fail(w, "%s item %llu: ferry_consumer_ack: %s", bench_phase_name(phase),
                           (unsigned long long)m->item, ferry_last_error());
    return 0;
}

static int on_ferry(worker *w, const bench_msg *m)
{
    ferry_descriptor d;
    if (check_header(w, BENCH_PHASE_FERRY, m) != 0 || read_item(w, BENCH_PHASE_FERRY, m, &d) != 0)
        return -1;
    verify(w, BENCH_PHASE_FERRY, m);
    if (ack_item(w, BENCH_PHASE_FERRY, m, &d) != 0)
        return -1;
    *bench_ack_slot(&w->region, BENCH_PHASE_FERRY, m->item, w->rank) = cli_now_ns();
    bench_note_progress(&w->region, BENCH_PHASE_FERRY, w->rank, (uint32_t)(m->item + 1));
    return 0;
}

static int on_floor(worker *w, const bench_msg *m)
{
    if (check_header(w, BENCH_PHASE_FLOOR, m) != 0)
        return -1;
    if (!w->floor || m->slot >= w->p.floor_slots)
        return worker_fail(w, "floor item %llu names slot %llu of %llu",
                           (unsigned long long)m->item, (unsigned long long)m->slot,
                           (unsigned long long)w->p.floor_slots);
    memcpy(w->buf, w->floor + m->slot * w->p.floor_slot_bytes, m->size);
    verify(w, BENCH_PHASE_FLOOR, m);
    /* The progress word is the floor's acknowledgement. */
    *bench_ack_slot(&w->region, BENCH_PHASE_FLOOR, m->item, w->rank) = cli_now_ns();
    bench_note_progress(&w->region, BENCH_PHASE_FLOOR, w->rank, (uint32_t)(m->item + 1));
    return 0;
}

static int on_reclaim(worker *w, const bench_msg *m)
{
    ferry_descriptor d;
    if (check_header(w, BENCH_PHASE_RECLAIM, m) != 0 ||
        read_item(w, BENCH_PHASE_RECLAIM, m, &d) != 0)
        return -1;
    verify(w, BENCH_PHASE_RECLAIM, m);
    cli_sleep_ns(cli_mix64(w->p.seed ^ (m->item << 17) ^ 0x51ee9ull) % (RECLAIM_SLEEP_MAX_NS + 1));
    /* Written before the ack (a release store) so the producer sees it once it sees the ack. */
    w->region.reclaim_ack_ns[m->item] = cli_now_ns();
    if (ack_item(w, BENCH_PHASE_RECLAIM, m, &d) != 0)
        return -1;
    bench_note_progress(&w->region, BENCH_PHASE_RECLAIM, w->rank, (uint32_t)(m->item + 1));
    return 0;
}

/* The end of the run: exit 0 only if every item verified. */
static int on_done(worker *w)
{
    uint64_t errors = 0;
    for (int ph = 0; ph < BENCH_PHASES; ph++)
        errors += w->me->errors[ph];
    __atomic_store_n(&w->me->state, BENCH_STATE_DONE, __ATOMIC_RELEASE);
    return errors ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

static int receive(worker *w, bench_msg *m)
{
    char why[160];
    return cli_recv_record(w->sock, m, sizeof(*m), why, sizeof(why)) ? worker_fail(w, "%s", why)
                                                                     : 0;
}

static int serve(worker *w)
{
    bench_msg m;
    for (;;) {
        int rc;
        if (receive(w, &m) != 0)
            return CLI_EXIT_FAIL;
        switch (m.type) {
        case BENCH_MSG_FERRY:
            rc = on_ferry(w, &m);
            break;
        case BENCH_MSG_FLOOR:
            rc = on_floor(w, &m);
            break;
        case BENCH_MSG_RECLAIM:
            rc = on_reclaim(w, &m);
            break;
        case BENCH_MSG_DONE:
            return on_done(w);
        default:
            rc = worker_fail(w, "unknown message type %u", m.type);
        }
        if (rc != 0)
            return CLI_EXIT_FAIL;
    }
}

int cmd_bench_worker(int argc, char **argv)
{
    worker w;
    int64_t rank, fds[3];
    memset(&w, 0, sizeof(w));
    if (parse_args(argc, argv, &rank, fds) != 0) {
        fprintf(stderr, "ferry bench-worker: internal command of 'ferry bench'\n");
        return CLI_EXIT_USAGE;
    }
    w.rank = (uint32_t)rank;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* the reclaim phase sleeps 0-200 us */
    int rc = CLI_EXIT_FAIL;
    if (worker_init(&w, fds) == 0) {
        __atomic_store_n(&w.me->state, BENCH_STATE_READY, __ATOMIC_RELEASE);
        rc = serve(&w);
    }
    ferry_consumer_destroy(w.consumer);
    bench_patterns_destroy(&w.patterns);
    free(w.buf);
    return rc;
}
