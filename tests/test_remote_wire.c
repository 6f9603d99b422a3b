/* The remote wire format (docs/wire-format.md, "Remote consumers") and remote addresses:
 * round trips, every refusal, the seed corpus (written by an independent encoder,
 * scripts/gen-remote-corpus.py). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "remote/remote.h"
#include "wire/remote.h"
#include "wire/wire.h"

static uint8_t worker[79], rkey_a[10], rkey_b[40];

static ferry__hello sample_hello(void)
{
    ferry__hello h = {.rank = 3, .pid = 4242, .worker_len = sizeof(worker), .worker = worker};
    for (int i = 0; i < 16; i++) {
        h.secret[i] = (uint8_t)i;
        h.pool_id[i] = (uint8_t)(0xa0 + i);
    }
    strcpy(h.host, "encoder-0");
    for (size_t i = 0; i < sizeof(worker); i++)
        worker[i] = (uint8_t)(i * 7 + 1);
    return h;
}

static ferry__welcome sample_welcome(void)
{
    ferry__welcome w = {
        .conn_id = 3 | 1 << 16,
        .producer_pid = 99,
        .token = 0x1122334455667788ull,
        .timeout_ms = 5000,
        .ring_depth = 64,
        .flags = FERRY_WELCOME_CONTROL_IN_POOL | FERRY_WELCOME_DATA_IN_POOL,
        .region_addr = {0x7f0000000000ull, 0x7e0000000000ull},
        .region_size = {1 << 20, 1 << 30},
        .gen_offset = 256,
        .extent_offset = 512,
        .control_offset = 0,
        .data_offset = 4096,
        .worker_len = sizeof(worker),
        .rkey_len = {sizeof(rkey_a), sizeof(rkey_b)},
        .worker = worker,
        .rkey = {rkey_a, rkey_b},
    };
    for (int i = 0; i < FERRY_DESCRIPTOR_SIZE; i++)
        w.pool[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof(rkey_b); i++)
        rkey_b[i] = (uint8_t)(0x30 + i);
    return w;
}

static void test_hello_round_trip(void **state)
{
    (void)state;
    ferry__hello h = sample_hello(), back;
    uint8_t buf[FERRY_REMOTE_MAX_MESSAGE];
    size_t n = ferry__hello_size(&h);
    assert_int_equal(n, 128 + 80);
    assert_int_equal(ferry__hello_encode(&h, buf, sizeof(buf)), FERRY_OK);
    assert_int_equal(ferry__hello_decode(buf, n, &back), FERRY_OK);
    assert_memory_equal(back.secret, h.secret, 16);
    assert_memory_equal(back.pool_id, h.pool_id, 16);
    assert_int_equal(back.rank, 3);
    assert_int_equal(back.pid, 4242);
    assert_string_equal(back.host, "encoder-0");
    assert_int_equal(back.worker_len, sizeof(worker));
    assert_memory_equal(back.worker, worker, sizeof(worker));
    /* Every truncation and every extension is refused. */
    for (size_t len = 0; len < n; len++)
        assert_int_equal(ferry__hello_decode(buf, len, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__hello_decode(buf, n + 8, &back), FERRY_MALFORMED);
}

static void test_hello_refusals(void **state)
{
    (void)state;
    ferry__hello h = sample_hello(), back;
    uint8_t buf[FERRY_REMOTE_MAX_MESSAGE], bad[FERRY_REMOTE_MAX_MESSAGE];
    size_t n = ferry__hello_size(&h);
    assert_int_equal(ferry__hello_encode(&h, buf, sizeof(buf)), FERRY_OK);
    /* One byte changed in the header, the reserved field, the padding or the host. */
    const size_t offsets[] = {0, 4, 6, 8, 12, 60, 64 + 9 + 1, 127, n - 1};
    for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); i++) {
        memcpy(bad, buf, n);
        bad[offsets[i]] ^= 0x40;
        assert_int_equal(ferry__hello_decode(bad, n, &back), FERRY_MALFORMED);
    }
    /* A worker address longer than the bound cannot be encoded. */
    h.worker_len = FERRY_REMOTE_MAX_BLOB + 1;
    assert_int_equal(ferry__hello_encode(&h, buf, sizeof(buf)), FERRY_INVALID_ARGUMENT);
    h = sample_hello();
    strcpy(h.host, "two words");
    assert_int_equal(ferry__hello_encode(&h, buf, sizeof(buf)), FERRY_INVALID_ARGUMENT);
    /* The wrong type where a hello is due. */
    ferry__refuse r = {.status = FERRY_PERMISSION};
    assert_int_equal(ferry__refuse_encode(&r, bad, sizeof(bad)), FERRY_OK);
    assert_int_equal(ferry__hello_decode(bad, FERRY_REFUSE_SIZE, &back), FERRY_MALFORMED);
}

static void test_welcome_round_trip(void **state)
{
    (void)state;
    ferry__welcome w = sample_welcome(), back;
    uint8_t buf[FERRY_REMOTE_MAX_MESSAGE];
    size_t n = ferry__welcome_size(&w);
    assert_int_equal(n, 384 + 80 + 16 + 40);
    assert_int_equal(ferry__welcome_encode(&w, buf, sizeof(buf)), FERRY_OK);
    assert_int_equal(ferry__welcome_decode(buf, n, &back), FERRY_OK);
    assert_int_equal(back.conn_id, w.conn_id);
    assert_true(back.token == w.token);
    assert_int_equal(back.ring_depth, 64);
    assert_true(back.region_size[1] == 1u << 30);
    assert_true(back.data_offset == 4096);
    assert_memory_equal(back.pool, w.pool, FERRY_DESCRIPTOR_SIZE);
    assert_memory_equal(back.rkey[1], rkey_b, sizeof(rkey_b));
    for (size_t len = 0; len < n; len++)
        assert_int_equal(ferry__welcome_decode(buf, len, &back), FERRY_MALFORMED);
}

static void test_welcome_refusals(void **state)
{
    (void)state;
    uint8_t buf[FERRY_REMOTE_MAX_MESSAGE];
    ferry__welcome back;
    /* Each mutation of a valid welcome that the decoder must refuse. */
    for (int k = 0; k < 6; k++) {
        ferry__welcome w = sample_welcome();
        switch (k) {
        case 0:
            w.ring_depth = 3;
            break; /* not a power of two */
        case 1:
            w.timeout_ms = 0;
            break;
        case 2:
            w.rkey_len[1] = 0;
            break; /* region 2 without a key */
        case 3:
            w.region_addr[0] = UINT64_MAX - 10;
            break; /* wraps */
        case 4:
            w.region_size[1] = 0;
            w.rkey_len[1] = 0;
            break; /* tables in no region */
        case 5:
            w.region_size[0] = 0;
            break;
        }
        size_t n = ferry__welcome_size(&w);
        assert_int_equal(ferry__welcome_encode(&w, buf, sizeof(buf)), FERRY_OK);
        assert_int_equal(ferry__welcome_decode(buf, n, &back), FERRY_MALFORMED);
    }
    ferry__welcome w = sample_welcome();
    w.flags = 0x4;
    assert_int_equal(ferry__welcome_encode(&w, buf, sizeof(buf)), FERRY_INVALID_ARGUMENT);
}

static void test_refuse_and_peek(void **state)
{
    (void)state;
    uint8_t buf[64];
    ferry__refuse r = {.status = FERRY_RANK_IN_USE, .rank = 2, .holder_pid = 77}, back;
    uint32_t type, size;
    assert_int_equal(ferry__refuse_encode(&r, buf, sizeof(buf)), FERRY_OK);
    assert_int_equal(ferry__remote_peek(buf, FERRY_REMOTE_HEADER, &type, &size), FERRY_OK);
    assert_int_equal(type, FERRY_REMOTE_REFUSE);
    assert_int_equal(size, FERRY_REFUSE_SIZE);
    assert_int_equal(ferry__refuse_decode(buf, FERRY_REFUSE_SIZE, &back), FERRY_OK);
    assert_int_equal(back.holder_pid, 77);
    r.status = FERRY_OK;
    assert_int_equal(ferry__refuse_encode(&r, buf, sizeof(buf)), FERRY_INVALID_ARGUMENT);
    /* A header announcing a size out of bounds for its type. */
    ferry__put_le32(buf + 8, FERRY_REMOTE_MAX_MESSAGE + 1);
    assert_int_equal(ferry__remote_peek(buf, FERRY_REMOTE_HEADER, &type, &size), FERRY_MALFORMED);
}

static void test_am_headers(void **state)
{
    (void)state;
    uint8_t buf[FERRY_AM_HEADER];
    ferry__am m = {.type = FERRY_AM_ACK, .conn_id = 5, .token = 42, .u.ack = {7, 9, 0, 4}}, back;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_OK);
    assert_int_equal(back.u.ack.slot, 7);
    assert_int_equal(back.u.ack.count, 4);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf) - 1, 0, &back), FERRY_MALFORMED);
    m.flags = FERRY_AM_ACK_PARTIAL; /* some parts of a packed lease */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_OK);
    assert_int_equal(back.flags, FERRY_AM_ACK_PARTIAL);
    m.flags = 2; /* no other flag */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    m = (ferry__am){.type = FERRY_AM_DESC, .u.desc = {4096, 96}};
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 2 * FERRY_DESCRIPTOR_SIZE, &back),
                     FERRY_OK);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 100, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    buf[0] = 77; /* an unknown type */
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 256, &back), FERRY_MALFORMED);
}

/* A DESC with its lease's bytes inline: exactly one descriptor and the extent's length of
 * bytes, 1 to FERRY_REMOTE_INLINE_MAX of them; everything else is refused. */
static void test_am_desc_inline(void **state)
{
    (void)state;
    uint8_t buf[FERRY_AM_HEADER];
    const size_t D = FERRY_DESCRIPTOR_SIZE, T = FERRY_REMOTE_INLINE_MAX;
    ferry__am m = {.type = FERRY_AM_DESC, .flags = FERRY_AM_DESC_INLINE, .u.desc = {4096, 1000}};
    ferry__am back;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 1000, &back), FERRY_OK);
    assert_int_equal(back.flags, FERRY_AM_DESC_INLINE);
    assert_true(back.u.desc.offset == 4096 && back.u.desc.length == 1000);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 999, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 1001, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 2 * D + 1000, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D, &back), FERRY_MALFORMED);
    /* without the flag, the same payload is no whole number of descriptors */
    m.flags = 0;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 1000, &back), FERRY_MALFORMED);
    /* the bound: T bytes decode, T + 1 do not; nor an empty extent, nor other flags */
    m.flags = FERRY_AM_DESC_INLINE;
    m.u.desc.length = T;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + T, &back), FERRY_OK);
    m.u.desc.length = T + 1;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + T + 1, &back), FERRY_MALFORMED);
    m.u.desc.length = 0;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D, &back), FERRY_MALFORMED);
    m.u.desc.length = 1000;
    m.flags = FERRY_AM_DESC_INLINE | FERRY_AM_DESC_HELD; /* held: the same shape */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 1000, &back), FERRY_OK);
    assert_int_equal(back.flags, FERRY_AM_DESC_INLINE | FERRY_AM_DESC_HELD);
    m.flags = FERRY_AM_DESC_INLINE | 4;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 1000, &back), FERRY_MALFORMED);
    m.flags = 4; /* nor without the inline flag */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D, &back), FERRY_MALFORMED);
    m.flags = FERRY_AM_DESC_HELD;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 2 * D, &back), FERRY_OK);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), D + 1000, &back), FERRY_MALFORMED);
    /* an extent length that wraps the payload's sum is refused too */
    m.flags = FERRY_AM_DESC_INLINE;
    m.u.desc.length = UINT64_MAX - D + 1;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    /* docs/wire-format.md's example, byte for byte */
    static const uint8_t example[FERRY_AM_HEADER] = {
        0x01, 0x00, 0x01, 0x00, 0x03, 0x00, 0x01, 0x00, 0x88, 0x77, 0x66,
        0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    m = (ferry__am){.type = FERRY_AM_DESC,
                    .flags = FERRY_AM_DESC_INLINE,
                    .conn_id = 0x00010003,
                    .token = 0x1122334455667788ull,
                    .u.desc = {4096, 1000}};
    ferry__am_encode(&m, buf);
    assert_memory_equal(buf, example, sizeof(example));
    /* the flag means nothing on a type that has no flags (ACK's flag 1 is its own) */
    m = (ferry__am){.type = FERRY_AM_TAKEN, .flags = FERRY_AM_DESC_INLINE, .u.taken = {1}};
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
}

/* READ and DATA: a read asks for at most FERRY_AM_READ_MAX bytes and names its offset in an
 * 8-byte payload; an answer's payload is the bytes (OK), the lease's extent (flagged: OK or
 * OUTSIDE) or nothing, and only STALE carries a value. */
static void test_am_read_and_data(void **state)
{
    (void)state;
    uint8_t buf[FERRY_AM_HEADER];
    ferry__am m = {.type = FERRY_AM_READ,
                   .conn_id = 3,
                   .token = 9,
                   .u.read = {5, 7, 11, FERRY_AM_READ_MAX}},
              back;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8, &back), FERRY_OK);
    assert_true(back.u.read.slot == 5 && back.u.read.generation == 7 && back.u.read.id == 11 &&
                back.u.read.length == FERRY_AM_READ_MAX);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 16, &back), FERRY_MALFORMED);
    m.u.read.length = FERRY_AM_READ_MAX + 1;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8, &back), FERRY_MALFORMED);
    m.u.read.length = 0; /* a look at the lease: answered with its extent */
    m.flags = 1;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8, &back), FERRY_MALFORMED);

    m = (ferry__am){.type = FERRY_AM_DATA, .u.data = {11, FERRY_AM_DATA_OK, 0}};
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), FERRY_AM_READ_MAX, &back), FERRY_OK);
    assert_true(back.u.data.id == 11 && back.u.data.status == FERRY_AM_DATA_OK);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 1, &back), FERRY_OK);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), FERRY_AM_READ_MAX + 1, &back),
                     FERRY_MALFORMED);
    m.flags = FERRY_AM_DATA_EXTENT;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 16, &back), FERRY_OK);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 17, &back), FERRY_MALFORMED);
    m.u.data.status = FERRY_AM_DATA_OUTSIDE;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 16, &back), FERRY_OK);
    m.flags = 0; /* OUTSIDE always carries the extent */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    m.u.data.status = FERRY_AM_DATA_STALE;
    m.u.data.value = 8;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_OK);
    assert_true(back.u.data.value == 8);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 4, &back), FERRY_MALFORMED);
    m.flags = FERRY_AM_DATA_EXTENT; /* only OK and OUTSIDE carry an extent */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 16, &back), FERRY_MALFORMED);
    m.flags = 0;
    for (uint32_t st = FERRY_AM_DATA_NOT_READY; st <= FERRY_AM_DATA_BUSY; st++) {
        m.u.data.status = st;
        m.u.data.value = st == FERRY_AM_DATA_OUTSIDE ? 0 : 1; /* a value only with STALE */
        ferry__am_encode(&m, buf);
        assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    }
    m.u.data.status = FERRY_AM_DATA_BUSY;
    m.u.data.value = 0;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_OK);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 1, &back), FERRY_MALFORMED);
    m.u.data.status = FERRY_AM_DATA_STATUSES; /* unknown */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    m.u.data.status = FERRY_AM_DATA_OK;
    m.flags = 2; /* no other flag */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
}

/* REVOKE and RELEASED: a lease (slot, generation), no flags, no payload, the rest of the
 * body zero. */
static void test_am_hold(void **state)
{
    (void)state;
    uint8_t buf[FERRY_AM_HEADER];
    for (uint16_t type = FERRY_AM_REVOKE; type <= FERRY_AM_RELEASED; type++) {
        ferry__am m = {.type = type, .conn_id = 3, .token = 9, .u.hold = {5, 0xfffff}}, back;
        ferry__am_encode(&m, buf);
        assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_OK);
        assert_true(back.type == type && back.u.hold.slot == 5 &&
                    back.u.hold.generation == 0xfffff && back.conn_id == 3 && back.token == 9);
        assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8, &back), FERRY_MALFORMED);
        buf[16 + 8] = 1; /* reserved */
        assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
        m.flags = 1;
        ferry__am_encode(&m, buf);
        assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    }
}

/* ACKS: a count of 1 to FERRY_AM_ACKS_MAX leases, 8 bytes of payload for each, no flags, the
 * rest of the body zero. */
static void test_am_acks(void **state)
{
    (void)state;
    uint8_t buf[FERRY_AM_HEADER];
    ferry__am m = {.type = FERRY_AM_ACKS, .conn_id = 3, .token = 9, .u.acks = {5}}, back;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 40, &back), FERRY_OK);
    assert_true(back.type == FERRY_AM_ACKS && back.u.acks.count == 5 && back.conn_id == 3 &&
                back.token == 9);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 32, &back), FERRY_MALFORMED);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 48, &back), FERRY_MALFORMED);
    buf[16 + 4] = 1; /* reserved */
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 40, &back), FERRY_MALFORMED);
    m.flags = 1;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 40, &back), FERRY_MALFORMED);
    m.flags = 0;
    m.u.acks.count = FERRY_AM_ACKS_MAX;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8 * FERRY_AM_ACKS_MAX, &back), FERRY_OK);
    m.u.acks.count = FERRY_AM_ACKS_MAX + 1;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8 * (FERRY_AM_ACKS_MAX + 1), &back),
                     FERRY_MALFORMED);
    m.u.acks.count = 0;
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 0, &back), FERRY_MALFORMED);
    m.u.acks.count = 0x20000001u; /* 8 x count in 32 bits would be 8: refused all the same */
    ferry__am_encode(&m, buf);
    assert_int_equal(ferry__am_decode(buf, sizeof(buf), 8, &back), FERRY_MALFORMED);
}

static void test_secret_compare(void **state)
{
    (void)state;
    uint8_t a[16] = {1, 2, 3}, b[16] = {1, 2, 3};
    assert_int_equal(ferry__secret_differs(a, b, 16), 0);
    b[15] = 1;
    assert_int_not_equal(ferry__secret_differs(a, b, 16), 0);
}

static void test_addresses(void **state)
{
    (void)state;
    ferry__remote_address a = {.port = 4242}, back;
    char text[FERRY_REMOTE_ADDRESS_SIZE];
    strcpy(a.host, "10.77.0.1");
    for (int i = 0; i < 16; i++) {
        a.pool_id[i] = (uint8_t)(0xa0 + i);
        a.secret[i] = (uint8_t)i;
    }
    ferry__remote_format(&a, text, sizeof(text));
    assert_string_equal(text, "ferry+ucx://10.77.0.1:4242/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/"
                              "000102030405060708090a0b0c0d0e0f");
    assert_int_equal(ferry__remote_parse(text, &back), FERRY_OK);
    assert_string_equal(back.host, "10.77.0.1");
    assert_int_equal(back.port, 4242);
    assert_memory_equal(back.secret, a.secret, 16);
    strcpy(a.host, "fe80::1");
    ferry__remote_format(&a, text, sizeof(text));
    assert_non_null(strstr(text, "[fe80::1]:4242"));
    assert_int_equal(ferry__remote_parse(text, &back), FERRY_OK);
    assert_string_equal(back.host, "fe80::1");
    static const char *bad[] = {
        "ferry:a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",
        "ferry+ucx://10.0.0.1:0/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0f",
        "ferry+ucx://10.0.0.1:70000/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/"
        "000102030405060708090a0b0c0d0e0f",
        "ferry+ucx://10.0.0.1/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0f",
        "ferry+ucx://10.0.0.1:42/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0",
        "ferry+ucx://10.0.0.1:42/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/"
        "000102030405060708090a0b0c0d0e0fx",
        "ferry+ucx://10.0.0.1:42/g0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0f",
        "ferry+ucx://10.0.0.1 "
        ":42/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0f",
        "ferry+ucx://[fe80::1:42/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0f",
        "ferry+ucx://:42/a0a1a2a3a4a5a6a7a8a9aaabacadaeaf/000102030405060708090a0b0c0d0e0f",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(ferry__remote_parse(bad[i], &back), FERRY_INVALID_ARGUMENT);
}

/* Every valid-* file of the corpus decodes (as its name says), every invalid-* one does not. */
static int decodes(const uint8_t *data, size_t size)
{
    ferry__hello h;
    ferry__welcome w;
    ferry__refuse r;
    ferry__am m;
    const uint8_t *msg = data + 1;
    size_t n = size - 1;
    return ferry__hello_decode(msg, n, &h) == FERRY_OK ||
           ferry__welcome_decode(msg, n, &w) == FERRY_OK ||
           ferry__refuse_decode(msg, n, &r) == FERRY_OK ||
           ferry__am_decode(msg, n, (size_t)data[0] * 8, &m) == FERRY_OK;
}

static void test_seed_corpus(void **state)
{
    (void)state;
    DIR *dir = opendir(FERRY_REMOTE_CORPUS);
    assert_non_null(dir);
    int seen = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        int valid = strncmp(e->d_name, "valid-", 6) == 0;
        if (!valid && strncmp(e->d_name, "invalid-", 8) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", FERRY_REMOTE_CORPUS, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        uint8_t data[FERRY_REMOTE_MAX_MESSAGE + 1];
        size_t size = fread(data, 1, sizeof(data), f);
        fclose(f);
        if (decodes(data, size) != valid)
            fail_msg("%s: %s", e->d_name, valid ? "does not decode" : "decodes");
        seen++;
    }
    closedir(dir);
    assert_true(seen >= 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_round_trip),   cmocka_unit_test(test_hello_refusals),
        cmocka_unit_test(test_welcome_round_trip), cmocka_unit_test(test_welcome_refusals),
        cmocka_unit_test(test_refuse_and_peek),    cmocka_unit_test(test_am_headers),
        cmocka_unit_test(test_am_desc_inline),     cmocka_unit_test(test_am_read_and_data),
        cmocka_unit_test(test_am_hold),
        cmocka_unit_test(test_am_acks),            cmocka_unit_test(test_secret_compare),
        cmocka_unit_test(test_addresses),
        cmocka_unit_test(test_seed_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
