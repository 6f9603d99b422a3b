/* Configuration validation and the node budget split, with the documented messages. */
#include <stddef.h>
#include <string.h>

#include "common/error.h"
#include "policy/policy.h"
#include "shm/layout.h"
#include "pool/pool.h"

/* The most bytes of descriptor rings a pool may ask for in its shared host segment. */
#define FERRY_MAX_RING_BYTES (256ull << 20)

static ferry_status check_positive(int64_t value, const char *name)
{
    if (value <= 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "%s must be positive", name);
    return FERRY_OK;
}

/* Bytes of each version of ferry_pool_config (a new version appends fields). */
static size_t config_size(uint32_t version)
{
    switch (version) {
    case 1:
        return offsetof(ferry_pool_config, vmm_handle) + sizeof(int32_t);
    case 2:
        return offsetof(ferry_pool_config, drain_timeout_us) + sizeof(int64_t);
    case 3:
        return offsetof(ferry_pool_config, remote_timeout_us) + sizeof(int64_t);
    default:
        return 0;
    }
}

static ferry_status check_struct(const ferry_pool_config *config)
{
    if (!config)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "pool config is NULL");
    size_t least = config_size(config->version);
    if (!least || config->struct_size < least)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "pool config has struct_size=%u version=%u; initialise it with "
                           "FERRY_POOL_CONFIG_INIT",
                           config->struct_size, config->version);
    return FERRY_OK;
}

static ferry_status check_limits(const ferry_pool_config *config)
{
    if (config->consumer_count > FERRY_MAX_CONSUMERS)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "consumer_count=%lld exceeds the limit of %d",
                           (long long)config->consumer_count, FERRY_MAX_CONSUMERS);
    if (config->max_inflight_slices > FERRY_MAX_INFLIGHT)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "max_inflight_slices=%lld exceeds the limit of %d",
                           (long long)config->max_inflight_slices, FERRY_MAX_INFLIGHT);
    if (config->control_placement != FERRY_CONTROL_HOST &&
        config->control_placement != FERRY_CONTROL_DEVICE)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "control_placement=%d is not a placement",
                           (int)config->control_placement);
    if (config->vmm_handle < FERRY_VMM_HANDLE_AUTO ||
        config->vmm_handle > FERRY_VMM_HANDLE_POSIX_FD)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "vmm_handle=%d is not a handle type",
                           (int)config->vmm_handle);
    int64_t depth = config->channel_depth;
    if (depth < 1 || depth > FERRY_MAX_DEPTH || (depth & (depth - 1)) != 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "channel_depth=%lld must be a power of two from 1 to %d",
                           (long long)depth, FERRY_MAX_DEPTH);
    uint64_t rings = (uint64_t)config->consumer_count * ferry__ring_stride((uint64_t)depth);
    if (rings > FERRY_MAX_RING_BYTES)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "descriptor rings of consumer_count=%lld x channel_depth=%lld need "
                           "%llu bytes, more than %llu: lower channel_depth",
                           (long long)config->consumer_count, (long long)depth,
                           (unsigned long long)rings, FERRY_MAX_RING_BYTES);
    if (config->drain_timeout_us < 0)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "drain_timeout_us=%lld is negative",
                           (long long)config->drain_timeout_us);
    if (config->listen && config->remote_timeout_us < 2000000)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "remote_timeout_us=%lld is below 2 s (TCP keepalive counts seconds)",
                           (long long)config->remote_timeout_us);
    if (config->initial_generation >= FERRY_GENERATION_MAX)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "initial_generation=%u leaves no generation to lease (max %u)",
                           config->initial_generation, FERRY_GENERATION_MAX);
    return FERRY_OK;
}

void ferry__config_normalize(const ferry_pool_config *in, ferry_pool_config *out)
{
    ferry_pool_config defaults = FERRY_POOL_CONFIG_INIT;
    size_t n = config_size(in->version); /* the fields of the caller's version, no more */
    if (in->struct_size < n)
        n = in->struct_size;
    *out = defaults;
    memcpy(out, in, n);
    out->struct_size = sizeof(*out);
    out->version = FERRY_POOL_CONFIG_VERSION;
    /* A caller that cannot name channel_depth gets the default, or less where that many
     * ranks' rings would not fit: its configs that worked before still do. */
    if (n < offsetof(ferry_pool_config, channel_depth) + sizeof(int64_t) &&
        out->consumer_count > 0 && out->consumer_count <= FERRY_MAX_CONSUMERS)
        while (out->channel_depth > 1 &&
               (uint64_t)out->consumer_count * ferry__ring_stride((uint64_t)out->channel_depth) >
                   FERRY_MAX_RING_BYTES)
            out->channel_depth /= 2;
}

ferry_status ferry__config_validate(const ferry_pool_config *config,
                                    const ferry__transport_ops *ops, uint64_t *data_start)
{
    ferry_status st = check_struct(config);
    if (st == FERRY_OK)
        st = check_positive(config->memory_size, "memory_size");
    if (st == FERRY_OK)
        st = check_positive(config->consumer_count, "consumer_count");
    if (st == FERRY_OK)
        st = check_positive(config->max_inflight_slices, "max_inflight_slices");
    if (st == FERRY_OK)
        st = check_positive(config->reclaim_interval_us, "recycle_interval");
    if (st == FERRY_OK)
        st = check_limits(config);
    if (st == FERRY_OK && config->control_placement == FERRY_CONTROL_DEVICE &&
        !ops->device_placement)
        st = ferry__fail(FERRY_INVALID_ARGUMENT,
                         "control words can live on the device only in a GPU pool");
    if (st != FERRY_OK)
        return st;
    uint64_t start =
        ferry__data_start((uint64_t)config->max_inflight_slices, (uint64_t)config->consumer_count);
    /* A transport that rounds the size (CUDA VMM, to its granularity) reports a size below
     * its granularity first, as the reference does; the engine checks the control metadata
     * against the rounded size once the memory exists. */
    if (!ops->rounds_size && (uint64_t)config->memory_size < start + FERRY_DATA_ALIGN)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "%s pool is too small after control metadata: pool=%lld, control=%llu",
                           ops->name, (long long)config->memory_size, (unsigned long long)start);
    *data_start = start;
    return FERRY_OK;
}

ferry_status ferry_pool_config_check(const ferry_pool_config *config)
{
    const ferry__transport_ops *ops;
    uint64_t data_start;
    ferry_pool_config full;
    ferry_status st = check_struct(config);
    if (st == FERRY_OK) {
        ferry__config_normalize(config, &full);
        st = ferry__policy_resolve_config(&full, &full);
    }
    if (st == FERRY_OK)
        st = ferry__transport_select(full.backend, &ops);
    if (st == FERRY_OK)
        st = ferry__config_validate(&full, ops, &data_start);
    if (st == FERRY_OK)
        ferry__clear_error();
    return st;
}

ferry_status ferry_split_budget(int64_t total_pool_size, int64_t tokenizer_worker_num,
                                int64_t *share)
{
    ferry_status st = check_positive(total_pool_size, "total_pool_size");
    if (st == FERRY_OK)
        st = check_positive(tokenizer_worker_num, "tokenizer_worker_num");
    if (st != FERRY_OK)
        return st;
    if (!share)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "share is NULL");
    *share = total_pool_size / tokenizer_worker_num;
    ferry__clear_error();
    return FERRY_OK;
}
