/* Received memory, and the leases that views hold. Everything here may run on any thread,
 * without the GIL, even after the interpreter finalised: a DLPack deleter runs whenever the
 * consumer's framework frees its tensor. */
#include <stdlib.h>

#include "ferry_py.h"

struct fy_lease {
    long refs; /* atomic */
    fy_consumer *consumer;
    ferry_descriptor desc;
    int ack_on_drop;
};

fy_lease *fy_lease_new(fy_consumer *consumer, const ferry_descriptor *d, int ack_on_drop)
{
    fy_lease *lease = calloc(1, sizeof(*lease));
    if (!lease)
        return NULL;
    lease->refs = 1;
    fy_consumer_ref(consumer);
    lease->consumer = consumer;
    lease->desc = *d;
    lease->ack_on_drop = ack_on_drop;
    return lease;
}

void fy_lease_ref(fy_lease *lease)
{
    __atomic_add_fetch(&lease->refs, 1, __ATOMIC_RELAXED);
}

void fy_lease_forget(fy_lease *lease)
{
    if (lease)
        lease->ack_on_drop = 0;
    fy_lease_drop(lease, NULL);
}

/* GPU views: the acknowledgement is enqueued after the work on the consumer's stream (that
 * read the view); the CPU acknowledges when that cannot be done. */
static void ack_gpu(fy_lease *lease, void *const *stream)
{
    ferry_status st = FERRY_OK;
    if (stream)
        st = ferry_consumer_ack_async(lease->consumer->handle, &lease->desc, *stream);
    if (st == FERRY_OK && stream)
        return;
    if (stream)
        fy_cuda_stream_sync(lease->consumer->device, *stream);
    ferry_consumer_ack(lease->consumer->handle, &lease->desc);
}

void fy_lease_drop(fy_lease *lease, void *const *stream)
{
    if (!lease || __atomic_sub_fetch(&lease->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    /* Errors cannot be reported from here; a STALE answer means that the lease was
     * acknowledged for this rank already (ferry.ack) or the pool went away. */
    if (lease->ack_on_drop && lease->desc.device < 0) /* host memory: nothing on a stream */
        ferry_consumer_ack(lease->consumer->handle, &lease->desc);
    else if (lease->ack_on_drop)
        ack_gpu(lease, stream);
    fy_consumer_unref(lease->consumer);
    free(lease);
}

static void release_gpu_copy(fy_payload *p)
{
    fy_cuda_free(p->device.device_id, p->buffer); /* after the work that uses the memory */
}

void fy_payload_ref(fy_payload *p)
{
    __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
}

void fy_payload_release(void *ctx)
{
    fy_payload *p = ctx;
    if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    switch (p->kind) {
    case FY_HOST_COPY:
        free(p->buffer);
        break;
    case FY_GPU_COPY:
        release_gpu_copy(p);
        fy_lease_drop(p->lease, NULL);
        break;
    case FY_HOST_VIEW:
        fy_lease_drop(p->lease, NULL);
        break;
    case FY_GPU_VIEW:
        fy_lease_drop(p->lease, p->has_ack_stream ? &p->ack_stream : NULL);
        break;
    }
    fy_cuda_event_destroy(p->ready, p->device.device_id);
    free(p);
}
