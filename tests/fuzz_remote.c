/* libFuzzer target of the remote wire format's decoders (wire/remote.h): bootstrap messages
 * (HELLO, WELCOME, REFUSE) and active-message headers. Whatever decodes must re-encode to the
 * same bytes; nothing may read outside the input. The first byte picks what is tried with an
 * AM header (the payload length, in units of 8 bytes), the rest is the message. Builds with
 * gcc too (fuzz_replay.c supplies a main that replays a corpus). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "wire/remote.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_remote: %s (%s)\n", what, ferry_last_error());
    abort();
}

static void same(const uint8_t *a, const uint8_t *b, size_t n, const char *what)
{
    if (memcmp(a, b, n) != 0)
        fuzz_fail(what);
}

static void try_bootstrap(const uint8_t *msg, size_t n)
{
    static uint8_t out[FERRY_REMOTE_MAX_MESSAGE];
    uint32_t type, size;
    ferry__hello h;
    ferry__welcome w;
    ferry__refuse r;
    int peeked = ferry__remote_peek(msg, n, &type, &size) == FERRY_OK;
    if (ferry__hello_decode(msg, n, &h) == FERRY_OK) {
        if (!peeked || type != FERRY_REMOTE_HELLO || size != n || ferry__hello_size(&h) != n ||
            ferry__hello_encode(&h, out, sizeof(out)) != FERRY_OK)
            fuzz_fail("a decoded hello does not encode to its size");
        same(out, msg, n, "re-encoding a hello changed its bytes");
    }
    if (ferry__welcome_decode(msg, n, &w) == FERRY_OK) {
        if (!peeked || type != FERRY_REMOTE_WELCOME || ferry__welcome_size(&w) != n ||
            ferry__welcome_encode(&w, out, sizeof(out)) != FERRY_OK)
            fuzz_fail("a decoded welcome does not encode to its size");
        same(out, msg, n, "re-encoding a welcome changed its bytes");
    }
    if (ferry__refuse_decode(msg, n, &r) == FERRY_OK) {
        if (n != FERRY_REFUSE_SIZE || ferry__refuse_encode(&r, out, sizeof(out)) != FERRY_OK)
            fuzz_fail("a decoded refusal does not encode");
        same(out, msg, n, "re-encoding a refusal changed its bytes");
    }
}

static void try_am(const uint8_t *msg, size_t n, size_t payload)
{
    uint8_t out[FERRY_AM_HEADER];
    ferry__am m;
    if (ferry__am_decode(msg, n, payload, &m) != FERRY_OK)
        return;
    if (n != FERRY_AM_HEADER)
        fuzz_fail("an active-message header of the wrong size decoded");
    ferry__am_encode(&m, out);
    same(out, msg, n, "re-encoding an active-message header changed its bytes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    /* A copy of exactly the input, so that a read past it is a sanitizer error. */
    uint8_t *msg = malloc(size - 1 ? size - 1 : 1);
    if (!msg)
        return 0;
    memcpy(msg, data + 1, size - 1);
    try_bootstrap(msg, size - 1);
    try_am(msg, size - 1, (size_t)data[0] * 8);
    free(msg);
    return 0;
}
