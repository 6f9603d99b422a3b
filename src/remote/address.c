/* Remote addresses: ferry+ucx://HOST:PORT/<pool id>/<secret>. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote.h"
#include "wire/wire.h"

int ferry__remote_is_address(const char *text)
{
    return text && strncmp(text, FERRY__REMOTE_PREFIX, strlen(FERRY__REMOTE_PREFIX)) == 0;
}

/* The message quotes the address up to its pool id: whatever follows may be its secret,
 * and messages end up in logs. */
static ferry_status bad(const char *text, const char *why)
{
    const char *from = ferry__remote_is_address(text) ? text + strlen(FERRY__REMOTE_PREFIX) : text;
    const char *after = strchr(from, '/');
    int n = after ? (int)(after - text) : (int)strlen(text);
    return ferry__fail(FERRY_INVALID_ARGUMENT,
                       "'%.*s%s' is not a remote ferry address (%s; the form is "
                       "ferry+ucx://HOST:PORT/<pool id>/<secret>, as "
                       "ferry_pool_remote_address gives)",
                       n < 120 ? n : 120, text, after ? "/..." : "", why);
}

/* A host as an address names it: letters, digits, '.', '-', '_' and ':' inside brackets. */
static int host_valid(const char *host, size_t n, int bracketed)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = host[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '-' || c == '_' || (bracketed && c == ':');
        if (!ok)
            return 0;
    }
    return 1;
}

/* Parses "HOST:PORT" or "[HOST]:PORT" of n bytes at text into host and port. */
static int parse_host_port(const char *text, size_t n, char *host, size_t host_size, uint16_t *port)
{
    const char *colon = NULL;
    const char *h = text;
    size_t hn;
    int bracketed = n > 0 && text[0] == '[';
    if (bracketed) {
        const char *close = memchr(text, ']', n);
        if (!close || close + 1 >= text + n || close[1] != ':')
            return -1;
        h = text + 1;
        hn = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = memrchr(text, ':', n);
        if (!colon)
            return -1;
        hn = (size_t)(colon - text);
    }
    if (hn >= host_size || !host_valid(h, hn, bracketed))
        return -1;
    size_t pn = n - (size_t)(colon + 1 - text);
    if (pn == 0 || pn > 5)
        return -1;
    unsigned long p = 0;
    for (size_t i = 0; i < pn; i++) {
        char c = colon[1 + i];
        if (c < '0' || c > '9')
            return -1;
        p = p * 10 + (unsigned long)(c - '0');
    }
    if (p == 0 || p > 65535 || (pn > 1 && colon[1] == '0'))
        return -1;
    memcpy(host, h, hn);
    host[hn] = '\0';
    *port = (uint16_t)p;
    return 0;
}

ferry_status ferry__remote_parse(const char *text, ferry__remote_address *out)
{
    ferry__remote_address a;
    if (!text)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "address is NULL");
    if (!ferry__remote_is_address(text))
        return bad(text, "no ferry+ucx:// prefix");
    const char *p = text + strlen(FERRY__REMOTE_PREFIX);
    size_t n = strlen(p);
    /* .../<32 hex>/<32 hex> at the end, exactly. */
    if (n < 2 * 33 + 4 || p[n - 33] != '/' || p[n - 66] != '/')
        return bad(text, "no /<pool id>/<secret> of 32 hex digits each");
    if (ferry__hex_get(p + n - 65, 16, a.pool_id) != 0 ||
        ferry__hex_get(p + n - 32, 16, a.secret) != 0)
        return bad(text, "pool id or secret is not 32 hex digits");
    if (parse_host_port(p, n - 66, a.host, sizeof(a.host), &a.port) != 0)
        return bad(text, "no HOST:PORT");
    *out = a;
    return FERRY_OK;
}

void ferry__remote_format(const ferry__remote_address *a, char *buf, size_t size)
{
    char id[33], secret[33];
    ferry__hex_put(a->pool_id, 16, id);
    ferry__hex_put(a->secret, 16, secret);
    int v6 = strchr(a->host, ':') != NULL;
    snprintf(buf, size, FERRY__REMOTE_PREFIX "%s%s%s:%u/%s/%s", v6 ? "[" : "", a->host,
             v6 ? "]" : "", (unsigned)a->port, id, secret);
}
