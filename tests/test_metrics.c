/* ferry_pool_metrics: the Prometheus text of a pool that was published into, filled until
 * POOL_FULL, waited on and cancelled from. Every line is parsed (a small parser of the text
 * exposition format below), every value is checked against ferry_pool_stats_get and
 * ferry_pool_consumer_info, and truncation, bad labels and a closed pool are tried. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"

#define MS   1000000ull
#define ITEM 4096

/* ---- a parser of the text format -------------------------------------------------------- */

#define MAX_LABELS 8

typedef struct sample {
    char name[64];
    int labels;
    char key[MAX_LABELS][32];
    char value_text[MAX_LABELS][128]; /* unescaped */
    double value;
} sample;

static int name_char(char c, int first)
{
    return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && c >= '0' && c <= '9');
}

/* Copies a metric or label name at *p into out; 0 if there is none. */
static int parse_name(const char **p, char *out, size_t size)
{
    size_t n = 0;
    while (name_char((*p)[n], n == 0))
        n++;
    if (n == 0 || n >= size)
        return 0;
    memcpy(out, *p, n);
    out[n] = '\0';
    *p += n;
    return 1;
}

/* A quoted label value with its escapes (\\, \", \n). */
static int parse_value(const char **p, char *out, size_t size)
{
    const char *s = *p;
    size_t n = 0;
    if (*s++ != '"')
        return 0;
    for (; *s != '"'; s++) {
        char c = *s;
        if (c == '\0' || c == '\n' || n + 1 >= size)
            return 0;
        if (c == '\\') {
            s++;
            if (*s != '\\' && *s != '"' && *s != 'n')
                return 0;
            c = *s == 'n' ? '\n' : *s;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    *p = s + 1;
    return 1;
}

/* name{key="value",...} value, the whole line. */
static int parse_sample(const char *line, sample *out)
{
    const char *p = line;
    memset(out, 0, sizeof(*out));
    if (!parse_name(&p, out->name, sizeof(out->name)))
        return 0;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            if (out->labels == MAX_LABELS)
                return 0;
            if (out->labels && *p++ != ',')
                return 0;
            if (!parse_name(&p, out->key[out->labels], sizeof(out->key[0])) || *p++ != '=' ||
                !parse_value(&p, out->value_text[out->labels], sizeof(out->value_text[0])))
                return 0;
            out->labels++;
        }
        p++;
    }
    if (*p++ != ' ' || *p == '\0')
        return 0;
    char *end;
    out->value = strtod(p, &end);
    return *end == '\0' && end != p;
}

static const char *label_of(const sample *s, const char *key)
{
    for (int i = 0; i < s->labels; i++)
        if (strcmp(s->key[i], key) == 0)
            return s->value_text[i];
    return NULL;
}

/* ---- what the text must say --------------------------------------------------------------- */

typedef struct expected {
    const char *name;
    const char *type;
    size_t offset; /* in ferry_pool_stats */
} expected;

#define C_(name, field)                                                                            \
    {                                                                                              \
        "ferry_" name, "counter", offsetof(ferry_pool_stats, field)                                \
    }
#define G_(name, field)                                                                            \
    {                                                                                              \
        "ferry_" name, "gauge", offsetof(ferry_pool_stats, field)                                  \
    }
static const expected pool_expected[] = {
    C_("publishes_total", publishes),
    C_("pool_full_events_total", pool_full_events),
    C_("pool_full_waits_total", pool_full_waits),
    C_("pool_full_timeouts_total", pool_full_timeouts),
    C_("too_large_total", too_large),
    C_("reclaimed_total", reclaimed),
    C_("cancelled_total", cancelled),
    C_("acked_for_dead_total", acked_for_dead),
    C_("broker_refused_total", broker_refused),
    G_("capacity_bytes", capacity),
    G_("usable_bytes", usable_bytes),
    G_("bytes_in_use", bytes_in_use),
    G_("largest_free_bytes", largest_free),
    G_("leases_in_flight", leases_in_flight),
    G_("high_water_bytes", high_water_bytes),
    G_("high_water_leases", high_water_leases),
    G_("consumers_attached", consumers_attached),
    G_("consumers_alive", consumers_alive),
    G_("remote_connected", remote_connected),
    C_("remote_admitted_total", remote_admitted),
    G_("remote_emulated", remote_emulated),
    C_("remote_forwarded_total", remote_forwarded),
    C_("remote_bad_messages_total", remote_bad_messages),
};
#undef C_
#undef G_
#define POOL_METRICS (sizeof(pool_expected) / sizeof(pool_expected[0]))

static const char *const rank_expected[] = {
    "ferry_rank_attached",
    "ferry_rank_alive",
    "ferry_rank_pid",
    "ferry_rank_outstanding_leases",
    "ferry_rank_oldest_lease_age_seconds",
};
#define RANK_METRICS (sizeof(rank_expected) / sizeof(rank_expected[0]))
/* ferry_remote_refused_total{reason=...}: malformed, secret, rank, silent, flood, error */
#define REFUSED_REASONS 6

static ferry_pool_stats stats_of(ferry_pool *pool)
{
    ferry_pool_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    s.version = FERRY_POOL_STATS_VERSION;
    assert_int_equal(ferry_pool_stats_get(pool, &s), FERRY_OK);
    return s;
}

static uint64_t stat_at(const ferry_pool_stats *s, size_t offset)
{
    uint64_t v;
    memcpy(&v, (const char *)s + offset, sizeof(v));
    return v;
}

static char *metrics_of(ferry_pool *pool, const char *labels)
{
    size_t needed = 0;
    assert_int_equal(ferry_pool_metrics(pool, labels, NULL, 0, &needed), FERRY_OK);
    size_t size = needed + 4096; /* room for counts that grow in between */
    char *text = malloc(size);
    assert_int_equal(ferry_pool_metrics(pool, labels, text, size, &needed), FERRY_OK);
    assert_true(needed < size);
    assert_int_equal(strlen(text), needed);
    return text;
}

/* Which family (by TYPE line) a sample name belongs to; NULL if none was declared. */
typedef struct families {
    int count;
    char name[64][64];
    char type[64][64];
    int samples[64];
} families;

static int family_find(const families *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->name[i], name) == 0)
            return i;
    return -1;
}

static void parse_comment(families *f, const char *line)
{
    char name[64], word[64];
    if (strncmp(line, "# HELP ", 7) == 0) {
        assert_int_equal(sscanf(line + 7, "%63s %63s", name, word), 2); /* a name and a text */
        assert_int_equal(family_find(f, name), -1);                     /* HELP before TYPE */
        return;
    }
    assert_int_equal(strncmp(line, "# TYPE ", 7), 0);
    assert_int_equal(sscanf(line + 7, "%63s %63s", name, word), 2);
    assert_true(strcmp(word, "counter") == 0 || strcmp(word, "gauge") == 0);
    assert_int_equal(family_find(f, name), -1); /* one TYPE line per family */
    assert_true(f->count < 64);
    snprintf(f->name[f->count], sizeof(f->name[0]), "%s", name);
    snprintf(f->type[f->count], sizeof(f->type[0]), "%s", word);
    f->samples[f->count++] = 0;
}

/* Every sample carries pool (32 hex digits), backend and the caller's worker="3"
 * (with_worker), and ranks carry rank. */
static void check_common_labels(const sample *s, const char *pool_hex, int with_worker)
{
    assert_string_equal(label_of(s, "pool"), pool_hex);
    assert_string_equal(label_of(s, "backend"), "host");
    assert_int_equal(s->labels >= 2, 1);
    assert_string_equal(s->key[0], "pool");
    assert_string_equal(s->key[1], "backend");
    if (with_worker)
        assert_string_equal(label_of(s, "worker"), "3");
    else
        assert_null(label_of(s, "worker"));
}

/* Parses the whole text; every sample is checked against stats and infos. */
static void check_text(const char *text, const ferry_pool_stats *stats,
                       const ferry_consumer_info *infos, uint32_t ranks, const char *pool_hex,
                       int with_worker)
{
    families f = {0};
    size_t len = strlen(text);
    assert_true(len > 0 && text[len - 1] == '\n');
    char *copy = strdup(text);
    char *save = NULL;
    int lines = 0;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lines++;
        if (line[0] == '#') {
            parse_comment(&f, line);
            continue;
        }
        sample s;
        if (!parse_sample(line, &s))
            fail_msg("metrics line does not parse: \"%s\"", line);
        int fam = family_find(&f, s.name);
        assert_true(fam >= 0); /* its TYPE came first */
        f.samples[fam]++;
        check_common_labels(&s, pool_hex, with_worker);
        const char *rank = label_of(&s, "rank");
        for (size_t i = 0; i < POOL_METRICS; i++) {
            if (strcmp(s.name, pool_expected[i].name) != 0)
                continue;
            assert_null(rank);
            assert_string_equal(f.type[fam], pool_expected[i].type);
            assert_true(s.value == (double)stat_at(stats, pool_expected[i].offset));
        }
        if (strncmp(s.name, "ferry_rank_", 11) != 0)
            continue;
        assert_non_null(rank);
        uint32_t r = (uint32_t)strtoul(rank, NULL, 10);
        assert_true(r < ranks);
        assert_string_equal(f.type[fam], "gauge");
        const ferry_consumer_info *ci = &infos[r];
        if (strcmp(s.name, "ferry_rank_attached") == 0)
            assert_true(s.value == (ci->attached ? 1 : 0));
        else if (strcmp(s.name, "ferry_rank_alive") == 0)
            assert_true(s.value == (ci->alive ? 1 : 0));
        else if (strcmp(s.name, "ferry_rank_pid") == 0)
            assert_true(s.value == (double)ci->pid);
        else if (strcmp(s.name, "ferry_rank_outstanding_leases") == 0)
            assert_true(s.value == (double)ci->outstanding);
        else /* taken a moment apart: the text's look is the later one, within a minute */
            assert_true(s.value * 1e9 + 1000 >= (double)ci->oldest_age_ns &&
                        s.value <= (double)ci->oldest_age_ns / 1e9 + 60);
    }
    free(copy);
    /* Every metric, once per pool, once per rank or (remote refusals) once per reason, and
     * nothing else. */
    assert_int_equal(f.count, POOL_METRICS + RANK_METRICS + 1);
    int refused = family_find(&f, "ferry_remote_refused_total");
    assert_true(refused >= 0);
    assert_int_equal(f.samples[refused], REFUSED_REASONS);
    for (size_t i = 0; i < POOL_METRICS; i++) {
        int fam = family_find(&f, pool_expected[i].name);
        assert_true(fam >= 0);
        assert_int_equal(f.samples[fam], 1);
    }
    for (size_t i = 0; i < RANK_METRICS; i++) {
        int fam = family_find(&f, rank_expected[i]);
        assert_true(fam >= 0);
        assert_int_equal(f.samples[fam], ranks);
    }
    assert_int_equal(lines, 3 * POOL_METRICS + (2 + REFUSED_REASONS) + (2 + ranks) * RANK_METRICS);
}

/* ---- the pool ------------------------------------------------------------------------------ */

typedef struct fixture {
    ferry_pool *pool;
    ferry_consumer *consumer; /* rank 0, attached in this process */
    ferry_descriptor leases[64];
    int count;
    char pool_hex[33];
} fixture;

static ferry_status publish_item(ferry_pool *pool, uint64_t timeout_ns, ferry_descriptor *d)
{
    static uint8_t item[ITEM];
    ferry_tensor t = ferry_tensor_bytes(ITEM);
    return ferry_pool_publish(pool, &t, item, timeout_ns, d);
}

typedef struct canceller {
    ferry_pool *pool;
    ferry_descriptor lease;
    ferry_status status;
} canceller;

/* Cancels the lease once a publisher waits for space (the second wait of the fixture). */
static void *cancel_when_waited(void *arg)
{
    canceller *c = arg;
    struct timespec ms = {0, (long)MS};
    for (int i = 0; i < 10000; i++) {
        ferry_pool_stats s;
        memset(&s, 0, sizeof(s));
        s.struct_size = sizeof(s);
        s.version = FERRY_POOL_STATS_VERSION;
        if (ferry_pool_stats_get(c->pool, &s) == FERRY_OK && s.pool_full_waits == 2)
            break;
        nanosleep(&ms, NULL);
    }
    c->status = ferry_pool_cancel(c->pool, &c->lease);
    return NULL;
}

/* Publishes, fills the pool until POOL_FULL, waits in vain once, waits for a cancel once,
 * and is refused a tensor that can never fit; rank 0 attaches and acknowledges one lease. */
static void fixture_make(fixture *fx)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 1 << 16;
    c.consumer_count = 3;
    c.max_inflight_slices = 64;
    c.reclaim_interval_us = 3600ll * 1000000; /* no background reclaim: counts stay put */
    memset(fx, 0, sizeof(*fx));
    assert_int_equal(ferry_pool_create(&c, &fx->pool), FERRY_OK);
    ferry_status st;
    while ((st = publish_item(fx->pool, FERRY_NO_WAIT, &fx->leases[fx->count])) == FERRY_OK)
        assert_true(++fx->count < 64);
    assert_int_equal(st, FERRY_POOL_FULL);
    assert_true(fx->count >= 2);
    ferry_descriptor d;
    assert_int_equal(publish_item(fx->pool, 10 * MS, &d), FERRY_POOL_FULL); /* waited in vain */
    canceller cn = {fx->pool, fx->leases[--fx->count], FERRY_OK};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, cancel_when_waited, &cn), 0);
    st = publish_item(fx->pool, 10000 * MS, &fx->leases[fx->count]);
    pthread_join(thread, NULL);
    assert_int_equal(st, FERRY_OK);
    assert_int_equal(cn.status, FERRY_OK);
    fx->count++;
    uint8_t byte = 0;
    ferry_tensor huge = ferry_tensor_bytes(1ull << 20);
    assert_int_equal(ferry_pool_publish(fx->pool, &huge, &byte, 10 * MS, &d), FERRY_POOL_FULL);
    /* Rank 0 attaches (this process) and acknowledges the first lease. */
    assert_int_equal(ferry_consumer_create(0, &fx->consumer), FERRY_OK);
    assert_int_equal(ferry_consumer_open(fx->consumer, &fx->leases[0]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack(fx->consumer, &fx->leases[0]), FERRY_OK);
    assert_int_equal(ferry_consumer_ack_range(fx->consumer, &fx->leases[0], 1, 2), FERRY_OK);
    uint64_t n = 0;
    assert_int_equal(ferry_pool_reclaim(fx->pool, &n), FERRY_OK);
    assert_int_equal(n, 1);
    ferry_descriptor pd;
    assert_int_equal(ferry_pool_describe(fx->pool, &pd), FERRY_OK);
    for (int i = 0; i < 16; i++)
        snprintf(fx->pool_hex + 2 * i, 3, "%02x", pd.pool_id[i]);
}

/* Every lease acknowledged by every rank and reclaimed: no age in the text changes. */
static void fixture_settle(fixture *fx)
{
    for (int i = 1; i < fx->count; i++)
        assert_int_equal(ferry_consumer_ack_all(fx->consumer, &fx->leases[i]), FERRY_OK);
    uint64_t n = 0;
    assert_int_equal(ferry_pool_reclaim(fx->pool, &n), FERRY_OK);
    assert_int_equal(n, fx->count - 1);
}

static void fixture_free(fixture *fx)
{
    ferry_consumer_destroy(fx->consumer);
    ferry_pool_destroy(fx->pool);
}

static void infos_of(ferry_pool *pool, ferry_consumer_info *infos, uint32_t ranks)
{
    for (uint32_t r = 0; r < ranks; r++) {
        ferry_consumer_info ci = FERRY_CONSUMER_INFO_INIT;
        assert_int_equal(ferry_pool_consumer_info(pool, r, &ci), FERRY_OK);
        infos[r] = ci;
    }
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_every_line_parses_and_matches(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx);
    ferry_pool_stats s = stats_of(fx.pool);
    /* What the fixture did, as the counters say it. */
    assert_int_equal(s.publishes, fx.count + 1);
    assert_int_equal(s.pool_full_events, 3); /* no wait, waited in vain, waited for a cancel */
    assert_int_equal(s.pool_full_waits, 2);
    assert_int_equal(s.pool_full_timeouts, 1);
    assert_int_equal(s.too_large, 1);
    assert_int_equal(s.cancelled, 1);
    assert_int_equal(s.reclaimed, 1);
    assert_int_equal(s.consumers_attached, 1);
    assert_int_equal(s.consumers_alive, 1);
    ferry_consumer_info infos[3];
    infos_of(fx.pool, infos, 3);
    assert_int_equal(infos[0].pid, getpid());
    assert_int_equal(infos[0].outstanding, fx.count - 1);
    assert_int_equal(infos[1].attached, 0);
    assert_int_equal(infos[1].outstanding, fx.count - 1);
    char *text = metrics_of(fx.pool, "worker=\"3\"");
    check_text(text, &s, infos, 3, fx.pool_hex, 1);
    free(text);
    /* No labels of the caller's: NULL and "" alike. */
    fixture_settle(&fx);
    s = stats_of(fx.pool);
    infos_of(fx.pool, infos, 3);
    text = metrics_of(fx.pool, NULL);
    check_text(text, &s, infos, 3, fx.pool_hex, 0);
    char *empty = metrics_of(fx.pool, "");
    assert_string_equal(text, empty);
    free(empty);
    free(text);
    fixture_free(&fx);
}

static void test_escaped_labels_pass_through(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx);
    char *text = metrics_of(fx.pool, "job=\"a \\\"b\\\" {c}\\\\\\n\",worker=\"3\"");
    char *line = strstr(text, "\nferry_publishes_total{");
    assert_non_null(line);
    *strchr(line + 1, '\n') = '\0';
    sample s;
    assert_true(parse_sample(line + 1, &s));
    assert_string_equal(label_of(&s, "job"), "a \"b\" {c}\\\n");
    assert_string_equal(label_of(&s, "worker"), "3");
    free(text);
    fixture_free(&fx);
}

static void test_truncation_and_needed(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx);
    fixture_settle(&fx);
    char *full = metrics_of(fx.pool, "worker=\"3\"");
    size_t len = strlen(full);
    size_t sizes[] = {1, 2, 10, 100, len / 2, len, len + 1};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t size = sizes[i], needed = 0;
        char *buf = malloc(size + 8);
        memset(buf, 'X', size + 8);
        assert_int_equal(ferry_pool_metrics(fx.pool, "worker=\"3\"", buf, size, &needed), FERRY_OK);
        assert_int_equal(needed, len);
        size_t kept = size - 1 < len ? size - 1 : len;
        assert_int_equal(strlen(buf), kept);
        assert_memory_equal(buf, full, kept);
        for (size_t j = size; j < size + 8; j++)
            assert_int_equal(buf[j], 'X'); /* nothing past size */
        free(buf);
    }
    /* Sizing only; needed may be NULL. */
    size_t needed = 0;
    assert_int_equal(ferry_pool_metrics(fx.pool, "worker=\"3\"", NULL, 0, &needed), FERRY_OK);
    assert_int_equal(needed, len);
    char small[16];
    assert_int_equal(ferry_pool_metrics(fx.pool, NULL, small, sizeof(small), NULL), FERRY_OK);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_int_equal(ferry_pool_metrics(fx.pool, NULL, NULL, 10, &needed), FERRY_INVALID_ARGUMENT);
    free(full);
    fixture_free(&fx);
}

static void test_bad_labels_refused(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx);
    ferry_pool_stats before = stats_of(fx.pool);
    const char *bad[] = {
        "worker=\"3\"\nferry_fake 1", /* a newline: a forged sample */
        "worker=\"3\"\r",
        "worker=\"3\t\"",
        "worker=\"3",     /* unterminated value */
        "worker=\"3\\\"", /* its closing quote escaped */
        "worker=\"3\"}",  /* a brace outside a value */
        "{worker=\"3\"",
        "a=\"\x7f\"",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char buf[64];
        memset(buf, 'X', sizeof(buf));
        size_t needed = 12345;
        assert_int_equal(ferry_pool_metrics(fx.pool, bad[i], buf, sizeof(buf), &needed),
                         FERRY_INVALID_ARGUMENT);
        assert_true(strlen(ferry_last_error()) > 0);
        assert_int_equal(needed, 12345);
        for (size_t j = 0; j < sizeof(buf); j++)
            assert_int_equal(buf[j], 'X');
    }
    ferry_pool_stats after = stats_of(fx.pool);
    assert_memory_equal(&before, &after, sizeof(before));
    assert_int_equal(ferry_pool_metrics(NULL, NULL, NULL, 0, NULL), FERRY_INVALID_ARGUMENT);
    fixture_free(&fx);
}

static void test_closed_pool_answers_closing(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx);
    ferry_pool_close(fx.pool);
    char buf[64];
    memset(buf, 'X', sizeof(buf));
    size_t needed = 12345;
    assert_int_equal(ferry_pool_metrics(fx.pool, "worker=\"3\"", buf, sizeof(buf), &needed),
                     FERRY_CLOSING);
    assert_non_null(strstr(ferry_last_error(), "closing"));
    assert_int_equal(needed, 12345);
    assert_int_equal(buf[0], 'X');
    fixture_free(&fx);
}

/* Callers built against versions 1 and 2 of ferry_pool_stats get their fields only. */
static void test_older_stats_versions(void **state)
{
    (void)state;
    fixture fx;
    fixture_make(&fx);
    ferry_pool_stats now = stats_of(fx.pool);
    size_t sizes[] = {offsetof(ferry_pool_stats, too_large),
                      offsetof(ferry_pool_stats, pool_full_waits)};
    for (uint32_t v = 1; v <= 2; v++) {
        ferry_pool_stats old;
        memset(&old, 0xAB, sizeof(old));
        old.struct_size = (uint32_t)sizes[v - 1];
        old.version = v;
        assert_int_equal(ferry_pool_stats_get(fx.pool, &old), FERRY_OK);
        assert_int_equal(old.publishes, now.publishes);
        assert_int_equal(old.pool_full_events, now.pool_full_events);
        const unsigned char *tail = (const unsigned char *)&old + sizes[v - 1];
        for (size_t i = 0; i < sizeof(old) - sizes[v - 1]; i++)
            assert_int_equal(tail[i], 0xAB); /* beyond the caller's struct: untouched */
        if (v == 2)
            assert_int_equal(old.too_large, now.too_large);
    }
    fixture_free(&fx);
}

static void quiet(int level, const char *message, void *user)
{
    (void)level, (void)message, (void)user; /* the pool-full warning is expected here */
}

int main(void)
{
    ferry_set_log(quiet, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_line_parses_and_matches),
        cmocka_unit_test(test_escaped_labels_pass_through),
        cmocka_unit_test(test_truncation_and_needed),
        cmocka_unit_test(test_bad_labels_refused),
        cmocka_unit_test(test_closed_pool_answers_closing),
        cmocka_unit_test(test_older_stats_versions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
