/* The shared segment's header: written by the producer at create, validated by each consumer
 * at open, both from and into a private layout (segment.h). */
#include <string.h>

#include "common/error.h"
#include "shm/segment.h"

void ferry__shm_layout_init(ferry__shm_layout *l, const ferry_pool_config *config)
{
    uint64_t max_inflight = (uint64_t)config->max_inflight_slices;
    memset(l, 0, sizeof(*l));
    l->consumers = (uint32_t)config->consumer_count;
    l->max_inflight = (uint32_t)max_inflight;
    l->row_words = 1 + l->consumers;
    l->ring_depth = (uint32_t)config->channel_depth;
    l->header_bytes = ferry__header_bytes_of(config);
    l->gen_offset = FERRY_GEN_TABLE_OFFSET;
    l->extent_offset = ferry__extent_offset(max_inflight);
    l->ring_offset = ferry__ring_offset(max_inflight);
    l->ring_stride = ferry__ring_stride(l->ring_depth);
    l->device = -1;
}

void ferry__shm_map(ferry__shm *s, void *base)
{
    uint8_t *b = base;
    s->header = base;
    s->generations = (uint32_t *)(b + s->layout.gen_offset);
    s->extents = (ferry__extent *)(b + s->layout.extent_offset);
    s->rings = b + s->layout.ring_offset;
}

void ferry__shm_header_write(ferry__shm *s, uint32_t backend, uint64_t memory_size,
                             uint64_t data_start, uint64_t data_size, uint32_t desc_flags,
                             int32_t device, const uint8_t pool_id[16], uint32_t generation)
{
    ferry__shm_layout *l = &s->layout;
    ferry__shm_header *h = s->header;
    l->backend = backend;
    l->memory_size = memory_size;
    l->data_start = data_start;
    l->data_size = data_size;
    l->desc_flags = desc_flags;
    l->device = device;
    h->version = FERRY_SHM_VERSION;
    h->header_bytes = l->header_bytes;
    memcpy(h->pool_id, pool_id, 16);
    h->backend = l->backend;
    h->consumer_count = l->consumers;
    h->max_inflight = l->max_inflight;
    h->row_words = l->row_words;
    h->memory_size = l->memory_size;
    h->data_start = l->data_start;
    h->data_size = l->data_size;
    h->gen_offset = l->gen_offset;
    h->extent_offset = l->extent_offset;
    h->ring_offset = l->ring_offset;
    h->ring_depth = l->ring_depth;
    h->desc_flags = l->desc_flags;
    h->device = l->device;
    for (uint32_t i = 0; i < l->max_inflight; i++)
        s->generations[i] = generation;
    ferry__store_release32(&h->magic, FERRY_SHM_MAGIC);
}

/* ---- the consumer's side: one look at the header, checked ------------------------------ */

/* A copy of the header, word by word (another process may be writing it). */
static void header_copy(const void *base, ferry__shm_header *out)
{
    const uint32_t *from = base;
    uint32_t words[sizeof(*out) / sizeof(uint32_t)];
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        words[i] = ferry__load_relaxed32(&from[i]);
    memcpy(out, words, sizeof(*out));
}

/* The layout the header describes, checked for consistency; NULL or why not. The sizes are
 * bounded first, so that no offset computed from them overflows. */
static const char *layout_of(const ferry__shm_header *h, ferry__shm_layout *l)
{
    uint64_t depth = h->ring_depth, max_inflight = h->max_inflight;
    if (depth == 0 || depth > FERRY_MAX_DEPTH || (depth & (depth - 1)) != 0 || max_inflight == 0 ||
        max_inflight > FERRY_MAX_INFLIGHT || h->consumer_count == 0 ||
        h->consumer_count > FERRY_MAX_CONSUMERS || h->row_words != 1u + h->consumer_count)
        return "inconsistent layout";
    if (h->ring_offset != ferry__ring_offset(max_inflight) ||
        h->header_bytes != ferry__header_bytes(max_inflight, h->consumer_count, depth) ||
        h->gen_offset != FERRY_GEN_TABLE_OFFSET ||
        h->extent_offset != ferry__extent_offset(max_inflight) ||
        h->data_start != ferry__data_start(max_inflight, h->consumer_count) ||
        h->data_start >= h->memory_size ||
        h->data_size != ((h->memory_size - h->data_start) & ~(uint64_t)(FERRY_DATA_ALIGN - 1)))
        return "inconsistent layout";
    *l = (ferry__shm_layout){
        .backend = h->backend,
        .consumers = h->consumer_count,
        .max_inflight = h->max_inflight,
        .row_words = h->row_words,
        .ring_depth = h->ring_depth,
        .desc_flags = h->desc_flags,
        .device = h->device,
        .header_bytes = h->header_bytes,
        .gen_offset = h->gen_offset,
        .extent_offset = h->extent_offset,
        .ring_offset = h->ring_offset,
        .ring_stride = ferry__ring_stride(depth),
        .memory_size = h->memory_size,
        .data_start = h->data_start,
        .data_size = h->data_size,
    };
    return NULL;
}

/* Why the header h (a copy) does not describe the pool d names, or NULL. */
static const char *header_mismatch(const ferry__shm_header *h, const ferry_descriptor *d)
{
    if (h->magic != FERRY_SHM_MAGIC)
        return "bad magic";
    if (h->version != FERRY_SHM_VERSION)
        return "unsupported layout version";
    if (memcmp(h->pool_id, d->pool_id, 16) != 0)
        return "pool identity differs";
    if (h->backend != d->backend)
        return "backend differs";
    if (h->desc_flags != (d->flags & FERRY_DESC_FLAG_DEVICE_CONTROL))
        return "placement differs";
    if (h->consumer_count != d->consumer_count || h->row_words != 1u + h->consumer_count)
        return "consumer count differs";
    if (h->max_inflight != d->max_inflight)
        return "max_inflight differs";
    if (h->memory_size != d->pool_size)
        return "pool size differs";
    return NULL;
}

ferry_status ferry__shm_open(ferry__shm *s, void *base, uint64_t size, const ferry_descriptor *d)
{
    ferry__shm_header h = {0}; /* gcc -O2 cannot see that a short segment stops before h is read */
    ferry__shm_layout l;
    const char *why = "bad magic";
    memset(&h, 0, sizeof(h));
    if (size >= FERRY_GEN_TABLE_OFFSET) {
        header_copy(base, &h);
        why = header_mismatch(&h, d);
    }
    if (!why)
        why = layout_of(&h, &l);
    if (!why && l.header_bytes > size)
        why = "segment size differs from the layout";
    if (why)
        return ferry__fail(FERRY_MISMATCH, "pool header does not match the descriptor: %s", why);
    s->layout = l;
    ferry__shm_map(s, base);
    return FERRY_OK;
}
