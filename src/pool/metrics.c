/* The pool's statistics and per-rank state as Prometheus metrics, in the text exposition
 * format 0.0.4 (docs/metrics.md). The numbers come from one snapshot taken under the pool's
 * lock (ferry__pool_snapshot_take); rendering touches no pool memory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "driver/driver.h"
#include "pool/pool.h"
#include "remote/remote.h"

/* Text written into the caller's buffer as far as it goes, and counted in full. */
typedef struct text {
    char *buf;
    size_t size;
    size_t len; /* of the whole text */
} text;

static void text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* vsnprintf truncates and NUL-terminates within the room left, so the buffer always ends
 * with a NUL (at len when the whole text fits, at size - 1 otherwise). */
static void text_add(text *t, const char *fmt, ...)
{
    int fits = t->len < t->size;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(fits ? t->buf + t->len : NULL, fits ? t->size - t->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n;
}

/* ---- the metrics ----------------------------------------------------------------------- */

typedef struct pool_metric {
    const char *name; /* after "ferry_" */
    const char *type;
    const char *help;
    size_t offset; /* of its uint64_t in ferry_pool_stats */
} pool_metric;

#define COUNTER_(name, field, help)                                                                \
    {                                                                                              \
        name, "counter", help, offsetof(ferry_pool_stats, field)                                   \
    }
#define GAUGE_(name, field, help)                                                                  \
    {                                                                                              \
        name, "gauge", help, offsetof(ferry_pool_stats, field)                                     \
    }
static const pool_metric pool_metrics[] = {
    COUNTER_("publishes_total", publishes, "Leases created (publish, publish_many, reserve)."),
    COUNTER_("pool_full_events_total", pool_full_events,
             "Publishes that found the pool full even after reclaiming."),
    COUNTER_("pool_full_waits_total", pool_full_waits,
             "Publishes that found the pool full and waited for space."),
    COUNTER_("pool_full_timeouts_total", pool_full_timeouts,
             "Publishes that waited for space and gave up with POOL_FULL."),
    COUNTER_("too_large_total", too_large,
             "Publishes refused at once because they can never fit (the fallback path)."),
    COUNTER_("reclaimed_total", reclaimed, "Leases freed after every rank acknowledged them."),
    COUNTER_("cancelled_total", cancelled, "Leases cancelled by the producer."),
    COUNTER_("acked_for_dead_total", acked_for_dead,
             "Acknowledgements written on behalf of consumers whose process died."),
    COUNTER_("broker_refused_total", broker_refused,
             "Broker connections refused (another uid, a bad message)."),
    GAUGE_("capacity_bytes", capacity, "Bytes of pool memory: control table and data."),
    GAUGE_("usable_bytes", usable_bytes, "Bytes of the pool available for data."),
    GAUGE_("bytes_in_use", bytes_in_use, "Bytes held by live leases."),
    GAUGE_("largest_free_bytes", largest_free, "Bytes of the largest free extent."),
    GAUGE_("leases_in_flight", leases_in_flight, "Leases reserved or published, not reclaimed."),
    GAUGE_("high_water_bytes", high_water_bytes, "Most bytes in use at once so far."),
    GAUGE_("high_water_leases", high_water_leases, "Most leases in flight at once so far."),
    GAUGE_("consumers_attached", consumers_attached, "Ranks that attached at least once."),
    GAUGE_("consumers_alive", consumers_alive, "Attached ranks whose process is alive."),
    GAUGE_("remote_connected", remote_connected, "Ranks held by consumers on other hosts now."),
    COUNTER_("remote_admitted_total", remote_admitted, "Remote consumers admitted so far."),
    GAUGE_("remote_emulated", remote_emulated,
           "Remote consumers connected now whose reads are emulated over active messages (tcp)."),
    COUNTER_("remote_forwarded_total", remote_forwarded,
             "Descriptors sent to consumers on other hosts."),
    COUNTER_("remote_bad_messages_total", remote_bad_messages,
             "Active messages from remote consumers dropped as malformed, forged or stale."),
};
#undef COUNTER_
#undef GAUGE_

typedef struct rank_metric {
    const char *name;
    const char *help;
    void (*value)(text *t, const ferry_consumer_info *info);
} rank_metric;

static void rank_attached(text *t, const ferry_consumer_info *info)
{
    text_add(t, "%d", info->attached ? 1 : 0);
}

static void rank_alive(text *t, const ferry_consumer_info *info)
{
    text_add(t, "%d", info->alive ? 1 : 0);
}

static void rank_pid(text *t, const ferry_consumer_info *info)
{
    text_add(t, "%lld", (long long)info->pid);
}

static void rank_outstanding(text *t, const ferry_consumer_info *info)
{
    text_add(t, "%llu", (unsigned long long)info->outstanding);
}

/* Seconds with nanosecond digits, written without the locale's decimal separator. */
static void rank_oldest_age(text *t, const ferry_consumer_info *info)
{
    text_add(t, "%llu.%09llu", (unsigned long long)(info->oldest_age_ns / 1000000000u),
             (unsigned long long)(info->oldest_age_ns % 1000000000u));
}

static const rank_metric rank_metrics[] = {
    {"rank_attached", "1 if the rank attached at least once.", rank_attached},
    {"rank_alive", "1 if the rank's last process is alive.", rank_alive},
    {"rank_pid", "The rank's last process (the producer's pid namespace), 0 if none.", rank_pid},
    {"rank_outstanding_leases", "Published leases the rank has not acknowledged.",
     rank_outstanding},
    {"rank_oldest_lease_age_seconds", "Age of the rank's oldest unacknowledged lease, 0 if none.",
     rank_oldest_age},
};

/* ---- rendering ------------------------------------------------------------------------- */

/* The caller's label text: printable, no newline, no braces outside quoted values, every
 * quoted value closed (a backslash escapes the next character inside one). */
static ferry_status check_labels(const char *labels)
{
    int quoted = 0;
    for (const unsigned char *p = (const unsigned char *)labels; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "metrics labels hold a control character (0x%02x) at offset %zu", *p,
                               (size_t)(p - (const unsigned char *)labels));
        if (quoted && *p == '\\' && p[1]) {
            p++;
            continue;
        }
        if (*p == '"')
            quoted = !quoted;
        else if (!quoted && (*p == '{' || *p == '}'))
            return ferry__fail(FERRY_INVALID_ARGUMENT,
                               "metrics labels hold '%c' outside a quoted value: \"%s\"", *p,
                               labels);
    }
    if (quoted)
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "metrics labels end inside a quoted value: \"%s\"", labels);
    return FERRY_OK;
}

static void family_head(text *t, const char *name, const char *type, const char *help)
{
    text_add(t, "# HELP ferry_%s %s\n# TYPE ferry_%s %s\n", name, help, name, type);
}

/* pool="...",backend="..." and the caller's labels, without the braces. */
static void base_labels(char *out, size_t size, const ferry__pool_snapshot *snap)
{
    static const char hex[] = "0123456789abcdef";
    char id[33];
    for (int i = 0; i < 16; i++) {
        id[2 * i] = hex[snap->pool_id[i] >> 4];
        id[2 * i + 1] = hex[snap->pool_id[i] & 15];
    }
    id[32] = '\0';
    snprintf(out, size, "pool=\"%s\",backend=\"%s\"", id, ferry_backend_name(snap->backend));
}

static void render(text *t, const ferry__pool_snapshot *snap, const char *labels)
{
    char base[96];
    base_labels(base, sizeof(base), snap);
    const char *sep = *labels ? "," : "";
    for (size_t i = 0; i < sizeof(pool_metrics) / sizeof(pool_metrics[0]); i++) {
        const pool_metric *m = &pool_metrics[i];
        uint64_t value;
        memcpy(&value, (const char *)&snap->stats + m->offset, sizeof(value));
        family_head(t, m->name, m->type, m->help);
        text_add(t, "ferry_%s{%s%s%s} %llu\n", m->name, base, sep, labels,
                 (unsigned long long)value);
    }
    const uint64_t by[FERRY_REMOTE_REFUSED_REASONS] = {
        snap->stats.remote_refused_malformed, snap->stats.remote_refused_secret,
        snap->stats.remote_refused_rank,      snap->stats.remote_refused_silent,
        snap->stats.remote_refused_flood,     snap->stats.remote_refused_error};
    family_head(t, "remote_refused_total", "counter",
                "Remote connections refused, by reason (malformed, secret, rank, silent, flood, "
                "error).");
    for (int r = 0; r < FERRY_REMOTE_REFUSED_REASONS; r++)
        text_add(t, "ferry_remote_refused_total{%s%s%s,reason=\"%s\"} %llu\n", base, sep, labels,
                 ferry__remote_refused_names[r], (unsigned long long)by[r]);
    for (size_t i = 0; i < sizeof(rank_metrics) / sizeof(rank_metrics[0]); i++) {
        const rank_metric *m = &rank_metrics[i];
        family_head(t, m->name, "gauge", m->help);
        for (uint32_t r = 0; r < snap->consumers; r++) {
            text_add(t, "ferry_%s{%s%s%s,rank=\"%u\"} ", m->name, base, sep, labels, r);
            m->value(t, &snap->ranks[r]);
            text_add(t, "\n");
        }
    }
}

ferry_status ferry_pool_metrics(ferry_pool *pool, const char *labels, char *buf, size_t size,
                                size_t *needed)
{
    FERRY_CUDA_BOUNDARY; /* the ranks' backlog syncs device control words */
    if (!labels)
        labels = "";
    if (!buf && size)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "metrics buffer is NULL but its size is %zu",
                           size);
    ferry_status st = check_labels(labels);
    if (st != FERRY_OK)
        return st;
    ferry__pool_snapshot snap;
    st = ferry__pool_snapshot_take(pool, &snap);
    if (st != FERRY_OK)
        return st;
    text t = {buf, size, 0};
    render(&t, &snap, labels);
    free(snap.ranks);
    if (needed)
        *needed = t.len;
    ferry__clear_error();
    return FERRY_OK;
}
