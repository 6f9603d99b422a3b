/* The remote wire format: bootstrap messages and active-message headers (wire/remote.h,
 * docs/wire-format.md "Remote consumers"). */
#include <string.h>

#include "common/error.h"
#include "wire/remote.h"
#include "wire/wire.h"

/* Byte offsets of the common header. */
enum { H_MAGIC = 0, H_VERSION = 4, H_TYPE = 6, H_SIZE = 8, H_RESERVED = 12 };

/* HELLO, from the start of the message. */
enum {
    HELLO_SECRET = 16,
    HELLO_POOL_ID = 32,
    HELLO_RANK = 48,
    HELLO_PID = 52,
    HELLO_WORKER_LEN = 56,
    HELLO_RESERVED = 60,
    HELLO_HOST = 64,
    HELLO_FIXED = HELLO_HOST + FERRY_REMOTE_HOST_SIZE, /* 128 */
};

/* WELCOME, from the start of the message. */
enum {
    W_CONN_ID = 16,
    W_PID = 20,
    W_TOKEN = 24,
    W_TIMEOUT = 32,
    W_RING_DEPTH = 36,
    W_FLAGS = 40,
    W_RESERVED_A = 44,
    W_REGION_ADDR = 48, /* 2 x u64 */
    W_REGION_SIZE = 64, /* 2 x u64 */
    W_GEN = 80,
    W_EXTENT = 88,
    W_CONTROL = 96,
    W_DATA = 104,
    W_WORKER_LEN = 112,
    W_RKEY_LEN = 116, /* 2 x u32 */
    W_RESERVED_B = 124,
    W_POOL = 128,
    W_FIXED = W_POOL + FERRY_DESCRIPTOR_SIZE, /* 384 */
};

/* REFUSE, from the start of the message. */
enum { R_STATUS = 16, R_RANK = 20, R_HOLDER = 24, R_RESERVED = 28 };

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

static int all_zero(const uint8_t *p, size_t n)
{
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++)
        any |= p[i];
    return any == 0;
}

int ferry__secret_differs(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff != 0;
}

static void put_header(uint8_t *out, uint32_t type, size_t size)
{
    ferry__put_le32(out + H_MAGIC, FERRY_REMOTE_MAGIC);
    ferry__put_le16(out + H_VERSION, FERRY_REMOTE_VERSION);
    ferry__put_le16(out + H_TYPE, (uint16_t)type);
    ferry__put_le32(out + H_SIZE, (uint32_t)size);
    ferry__put_le32(out + H_RESERVED, 0);
}

/* Copies a blob of n bytes at *at and zeroes its padding; *at moves past both. */
static void put_blob(uint8_t *out, size_t *at, const uint8_t *blob, size_t n)
{
    if (n)
        memcpy(out + *at, blob, n);
    memset(out + *at + n, 0, pad8(n) - n);
    *at += pad8(n);
}

static ferry_status malformed(const char *what)
{
    return ferry__fail(FERRY_MALFORMED, "malformed remote message: %s", what);
}

/* A blob of n bytes at *at within len, its padding zero; *at moves past both. */
static ferry_status get_blob(const uint8_t *buf, size_t len, size_t *at, size_t n,
                             const uint8_t **blob, const char *what)
{
    if (n > FERRY_REMOTE_MAX_BLOB || *at > len || pad8(n) > len - *at)
        return malformed(what);
    if (!all_zero(buf + *at + n, pad8(n) - n))
        return malformed("nonzero padding");
    *blob = buf + *at;
    *at += pad8(n);
    return FERRY_OK;
}

/* ---- the common header -------------------------------------------------------------------- */

static int size_fits(uint32_t type, uint32_t size)
{
    switch (type) {
    case FERRY_REMOTE_HELLO:
        return size >= HELLO_FIXED + 8 && size <= HELLO_FIXED + FERRY_REMOTE_MAX_BLOB;
    case FERRY_REMOTE_WELCOME:
        return size >= W_FIXED + 8 && size <= FERRY_REMOTE_MAX_MESSAGE;
    case FERRY_REMOTE_REFUSE:
        return size == FERRY_REFUSE_SIZE;
    default:
        return 0;
    }
}

ferry_status ferry__remote_peek(const uint8_t *buf, size_t len, uint32_t *type, uint32_t *size)
{
    if (len < FERRY_REMOTE_HEADER)
        return malformed("shorter than its header");
    if (ferry__get_le32(buf + H_MAGIC) != FERRY_REMOTE_MAGIC)
        return malformed("bad magic (not a ferry remote message)");
    if (ferry__get_le16(buf + H_VERSION) != FERRY_REMOTE_VERSION)
        return ferry__fail(FERRY_MALFORMED,
                           "malformed remote message: version %u, this ferry speaks %u",
                           ferry__get_le16(buf + H_VERSION), FERRY_REMOTE_VERSION);
    uint32_t t = ferry__get_le16(buf + H_TYPE), s = ferry__get_le32(buf + H_SIZE);
    if (ferry__get_le32(buf + H_RESERVED) != 0)
        return malformed("nonzero reserved header bits");
    if (!size_fits(t, s))
        return ferry__fail(FERRY_MALFORMED,
                           "malformed remote message: type %u with size %u is out of bounds", t, s);
    *type = t;
    *size = s;
    return FERRY_OK;
}

static ferry_status expect(const uint8_t *buf, size_t len, uint32_t want)
{
    uint32_t type = 0, size = 0; /* gcc -O3 cannot see that peek sets them when it succeeds */
    ferry_status st = ferry__remote_peek(buf, len, &type, &size);
    if (st != FERRY_OK)
        return st;
    if (type != want)
        return ferry__fail(FERRY_MALFORMED, "malformed remote message: type %u where %u was due",
                           type, want);
    if (size != len)
        return ferry__fail(FERRY_MALFORMED,
                           "malformed remote message: it announces %u bytes and has %zu", size,
                           len);
    return FERRY_OK;
}

/* ---- HELLO --------------------------------------------------------------------------------- */

static int host_valid(const char *host)
{
    size_t n = strnlen(host, FERRY_REMOTE_HOST_SIZE);
    if (n == FERRY_REMOTE_HOST_SIZE)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)host[i] < 0x21 || (unsigned char)host[i] > 0x7e)
            return 0;
    return all_zero((const uint8_t *)host + n, FERRY_REMOTE_HOST_SIZE - n);
}

size_t ferry__hello_size(const ferry__hello *m)
{
    if (m->worker_len == 0 || m->worker_len > FERRY_REMOTE_MAX_BLOB)
        return 0;
    return HELLO_FIXED + pad8(m->worker_len);
}

ferry_status ferry__hello_encode(const ferry__hello *m, uint8_t *out, size_t size)
{
    size_t need = ferry__hello_size(m);
    if (!need || size < need || !host_valid(m->host))
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "hello: worker address of %u bytes, host name "
                           "or buffer out of bounds",
                           m->worker_len);
    put_header(out, FERRY_REMOTE_HELLO, need);
    memcpy(out + HELLO_SECRET, m->secret, 16);
    memcpy(out + HELLO_POOL_ID, m->pool_id, 16);
    ferry__put_le32(out + HELLO_RANK, m->rank);
    ferry__put_le32(out + HELLO_PID, m->pid);
    ferry__put_le32(out + HELLO_WORKER_LEN, m->worker_len);
    ferry__put_le32(out + HELLO_RESERVED, 0);
    memcpy(out + HELLO_HOST, m->host, FERRY_REMOTE_HOST_SIZE);
    size_t at = HELLO_FIXED;
    put_blob(out, &at, m->worker, m->worker_len);
    return FERRY_OK;
}

ferry_status ferry__hello_decode(const uint8_t *buf, size_t len, ferry__hello *m)
{
    ferry__hello h;
    ferry_status st = expect(buf, len, FERRY_REMOTE_HELLO);
    if (st != FERRY_OK)
        return st;
    if (ferry__get_le32(buf + HELLO_RESERVED) != 0)
        return malformed("nonzero reserved hello field");
    memcpy(h.secret, buf + HELLO_SECRET, 16);
    memcpy(h.pool_id, buf + HELLO_POOL_ID, 16);
    h.rank = ferry__get_le32(buf + HELLO_RANK);
    h.pid = ferry__get_le32(buf + HELLO_PID);
    h.worker_len = ferry__get_le32(buf + HELLO_WORKER_LEN);
    memcpy(h.host, buf + HELLO_HOST, FERRY_REMOTE_HOST_SIZE);
    if (!host_valid(h.host))
        return malformed("host name is not printable and NUL-terminated");
    size_t at = HELLO_FIXED;
    if (h.worker_len == 0)
        return malformed("empty worker address");
    st = get_blob(buf, len, &at, h.worker_len, &h.worker, "worker address out of bounds");
    if (st != FERRY_OK)
        return st;
    if (at != len)
        return malformed("hello size disagrees with its worker address");
    *m = h;
    return FERRY_OK;
}

/* ---- WELCOME ------------------------------------------------------------------------------- */

size_t ferry__welcome_size(const ferry__welcome *m)
{
    if (m->worker_len == 0 || m->worker_len > FERRY_REMOTE_MAX_BLOB || m->rkey_len[0] == 0 ||
        m->rkey_len[0] > FERRY_REMOTE_MAX_BLOB || m->rkey_len[1] > FERRY_REMOTE_MAX_BLOB)
        return 0;
    size_t n = W_FIXED + pad8(m->worker_len) + pad8(m->rkey_len[0]) + pad8(m->rkey_len[1]);
    return n <= FERRY_REMOTE_MAX_MESSAGE ? n : 0;
}

ferry_status ferry__welcome_encode(const ferry__welcome *m, uint8_t *out, size_t size)
{
    size_t need = ferry__welcome_size(m);
    if (!need || size < need || (m->flags & ~FERRY_WELCOME_FLAGS_KNOWN))
        return ferry__fail(FERRY_INVALID_ARGUMENT,
                           "welcome: blob lengths, flags or buffer out of bounds");
    put_header(out, FERRY_REMOTE_WELCOME, need);
    ferry__put_le32(out + W_CONN_ID, m->conn_id);
    ferry__put_le32(out + W_PID, m->producer_pid);
    ferry__put_le64(out + W_TOKEN, m->token);
    ferry__put_le32(out + W_TIMEOUT, m->timeout_ms);
    ferry__put_le32(out + W_RING_DEPTH, m->ring_depth);
    ferry__put_le32(out + W_FLAGS, m->flags);
    ferry__put_le32(out + W_RESERVED_A, 0);
    for (int i = 0; i < 2; i++) {
        ferry__put_le64(out + W_REGION_ADDR + 8 * i, m->region_addr[i]);
        ferry__put_le64(out + W_REGION_SIZE + 8 * i, m->region_size[i]);
        ferry__put_le32(out + W_RKEY_LEN + 4 * i, m->rkey_len[i]);
    }
    ferry__put_le64(out + W_GEN, m->gen_offset);
    ferry__put_le64(out + W_EXTENT, m->extent_offset);
    ferry__put_le64(out + W_CONTROL, m->control_offset);
    ferry__put_le64(out + W_DATA, m->data_offset);
    ferry__put_le32(out + W_WORKER_LEN, m->worker_len);
    ferry__put_le32(out + W_RESERVED_B, 0);
    memcpy(out + W_POOL, m->pool, FERRY_DESCRIPTOR_SIZE);
    size_t at = W_FIXED;
    put_blob(out, &at, m->worker, m->worker_len);
    put_blob(out, &at, m->rkey[0], m->rkey_len[0]);
    put_blob(out, &at, m->rkey[1], m->rkey_len[1]);
    return FERRY_OK;
}

/* What WELCOME's numbers must satisfy on their own (the consumer checks them against the
 * pool's descriptor afterwards): regions and tables inside them. */
static ferry_status welcome_sane(const ferry__welcome *w)
{
    if (w->flags & ~FERRY_WELCOME_FLAGS_KNOWN)
        return malformed("unknown welcome flags");
    if (w->region_size[0] == 0 || (w->region_size[1] == 0) != (w->rkey_len[1] == 0))
        return malformed("region sizes disagree with the remote keys");
    if (w->region_addr[0] > UINT64_MAX - w->region_size[0] ||
        w->region_addr[1] > UINT64_MAX - w->region_size[1])
        return malformed("a region wraps around the address space");
    if (!w->region_size[1] && (w->flags & FERRY_WELCOME_FLAGS_KNOWN))
        return malformed("a table is in a region that does not exist");
    if (w->ring_depth == 0 || (w->ring_depth & (w->ring_depth - 1)) != 0)
        return malformed("ring depth is not a power of two");
    if (w->timeout_ms == 0)
        return malformed("keepalive bound is 0");
    return FERRY_OK;
}

ferry_status ferry__welcome_decode(const uint8_t *buf, size_t len, ferry__welcome *m)
{
    ferry__welcome w;
    ferry_status st = expect(buf, len, FERRY_REMOTE_WELCOME);
    if (st != FERRY_OK)
        return st;
    if (ferry__get_le32(buf + W_RESERVED_A) || ferry__get_le32(buf + W_RESERVED_B))
        return malformed("nonzero reserved welcome field");
    w.conn_id = ferry__get_le32(buf + W_CONN_ID);
    w.producer_pid = ferry__get_le32(buf + W_PID);
    w.token = ferry__get_le64(buf + W_TOKEN);
    w.timeout_ms = ferry__get_le32(buf + W_TIMEOUT);
    w.ring_depth = ferry__get_le32(buf + W_RING_DEPTH);
    w.flags = ferry__get_le32(buf + W_FLAGS);
    for (int i = 0; i < 2; i++) {
        w.region_addr[i] = ferry__get_le64(buf + W_REGION_ADDR + 8 * i);
        w.region_size[i] = ferry__get_le64(buf + W_REGION_SIZE + 8 * i);
        w.rkey_len[i] = ferry__get_le32(buf + W_RKEY_LEN + 4 * i);
    }
    w.gen_offset = ferry__get_le64(buf + W_GEN);
    w.extent_offset = ferry__get_le64(buf + W_EXTENT);
    w.control_offset = ferry__get_le64(buf + W_CONTROL);
    w.data_offset = ferry__get_le64(buf + W_DATA);
    w.worker_len = ferry__get_le32(buf + W_WORKER_LEN);
    memcpy(w.pool, buf + W_POOL, FERRY_DESCRIPTOR_SIZE);
    size_t at = W_FIXED;
    if (w.worker_len == 0 || w.rkey_len[0] == 0)
        return malformed("empty worker address or remote key");
    st = get_blob(buf, len, &at, w.worker_len, &w.worker, "worker address out of bounds");
    if (st == FERRY_OK)
        st = get_blob(buf, len, &at, w.rkey_len[0], &w.rkey[0], "remote key 1 out of bounds");
    if (st == FERRY_OK)
        st = get_blob(buf, len, &at, w.rkey_len[1], &w.rkey[1], "remote key 2 out of bounds");
    if (st == FERRY_OK && at != len)
        st = malformed("welcome size disagrees with its parts");
    if (st == FERRY_OK)
        st = welcome_sane(&w);
    if (st != FERRY_OK)
        return st;
    *m = w;
    return FERRY_OK;
}

/* ---- REFUSE -------------------------------------------------------------------------------- */

ferry_status ferry__refuse_encode(const ferry__refuse *m, uint8_t *out, size_t size)
{
    if (size < FERRY_REFUSE_SIZE || m->status == FERRY_OK)
        return ferry__fail(FERRY_INVALID_ARGUMENT, "refuse: buffer too small or status OK");
    put_header(out, FERRY_REMOTE_REFUSE, FERRY_REFUSE_SIZE);
    ferry__put_le32(out + R_STATUS, m->status);
    ferry__put_le32(out + R_RANK, m->rank);
    ferry__put_le32(out + R_HOLDER, m->holder_pid);
    ferry__put_le32(out + R_RESERVED, 0);
    return FERRY_OK;
}

ferry_status ferry__refuse_decode(const uint8_t *buf, size_t len, ferry__refuse *m)
{
    ferry_status st = expect(buf, len, FERRY_REMOTE_REFUSE);
    if (st != FERRY_OK)
        return st;
    ferry__refuse r = {
        .status = ferry__get_le32(buf + R_STATUS),
        .rank = ferry__get_le32(buf + R_RANK),
        .holder_pid = ferry__get_le32(buf + R_HOLDER),
    };
    if (ferry__get_le32(buf + R_RESERVED) != 0)
        return malformed("nonzero reserved refuse field");
    if (r.status == FERRY_OK || r.status > FERRY_FORKED)
        return malformed("refusal with no error status");
    *m = r;
    return FERRY_OK;
}

/* ---- active-message headers ---------------------------------------------------------------- */

enum { AM_TYPE = 0, AM_FLAGS = 2, AM_CONN = 4, AM_TOKEN = 8, AM_BODY = 16 };

void ferry__am_encode(const ferry__am *m, uint8_t out[FERRY_AM_HEADER])
{
    memset(out, 0, FERRY_AM_HEADER);
    ferry__put_le16(out + AM_TYPE, m->type);
    ferry__put_le16(out + AM_FLAGS, m->flags);
    ferry__put_le32(out + AM_CONN, m->conn_id);
    ferry__put_le64(out + AM_TOKEN, m->token);
    uint8_t *b = out + AM_BODY;
    switch (m->type) {
    case FERRY_AM_DESC:
        ferry__put_le64(b, m->u.desc.offset);
        ferry__put_le64(b + 8, m->u.desc.length);
        break;
    case FERRY_AM_ACK:
        ferry__put_le32(b, m->u.ack.slot);
        ferry__put_le32(b + 4, m->u.ack.generation);
        ferry__put_le32(b + 8, m->u.ack.first);
        ferry__put_le32(b + 12, m->u.ack.count);
        break;
    case FERRY_AM_TAKEN:
        ferry__put_le32(b, m->u.taken.taken);
        break;
    case FERRY_AM_READ:
        ferry__put_le32(b, m->u.read.slot);
        ferry__put_le32(b + 4, m->u.read.generation);
        ferry__put_le32(b + 8, m->u.read.id);
        ferry__put_le32(b + 12, m->u.read.length);
        break;
    case FERRY_AM_DATA:
        ferry__put_le32(b, m->u.data.id);
        ferry__put_le32(b + 4, m->u.data.status);
        ferry__put_le64(b + 8, m->u.data.value);
        break;
    case FERRY_AM_REVOKE:
    case FERRY_AM_RELEASED:
        ferry__put_le32(b, m->u.hold.slot);
        ferry__put_le32(b + 4, m->u.hold.generation);
        break;
    case FERRY_AM_ACKS:
        ferry__put_le32(b, m->u.acks.count);
        break;
    default:
        break;
    }
}

/* A DESC's payload: its descriptors, and with FERRY_AM_DESC_INLINE the lease's bytes after
 * its one descriptor, as many as the extent's length says. FERRY_AM_DESC_HELD may go with
 * either. */
static ferry_status desc_shape(const ferry__am *m, size_t payload_len)
{
    if (m->flags & ~(FERRY_AM_DESC_INLINE | FERRY_AM_DESC_HELD))
        return malformed("descriptor message with unknown flags");
    if (m->flags & FERRY_AM_DESC_INLINE)
        return m->u.desc.length == 0 || m->u.desc.length > FERRY_REMOTE_INLINE_MAX ||
                       payload_len != FERRY_DESCRIPTOR_SIZE + m->u.desc.length
                   ? malformed("inline bytes that are not one lease's whole extent")
                   : FERRY_OK;
    if (payload_len == 0 || payload_len % FERRY_DESCRIPTOR_SIZE ||
        payload_len / FERRY_DESCRIPTOR_SIZE > 65535u)
        return malformed("descriptor message with a bad payload");
    return FERRY_OK;
}

/* A DATA's payload: the bytes asked for (OK), the lease's extent (OK for a READ of none, and
 * OUTSIDE, both flagged FERRY_AM_DATA_EXTENT), or nothing (STALE, NOT_READY, BUSY, FAILED); a
 * value only with STALE. */
static ferry_status data_shape(const ferry__am *m, size_t payload_len)
{
    uint32_t st = m->u.data.status;
    int extent = m->flags == FERRY_AM_DATA_EXTENT;
    if ((m->flags && !extent) || st >= FERRY_AM_DATA_STATUSES ||
        (m->u.data.value && st != FERRY_AM_DATA_STALE))
        return malformed("bad read answer");
    if (extent)
        return (st == FERRY_AM_DATA_OK || st == FERRY_AM_DATA_OUTSIDE) && payload_len == 16
                   ? FERRY_OK
                   : malformed("bad read answer");
    if (st == FERRY_AM_DATA_OUTSIDE ||
        (st == FERRY_AM_DATA_OK ? payload_len > FERRY_AM_READ_MAX : payload_len != 0))
        return malformed("bad read answer");
    return FERRY_OK;
}

/* Flags each type may carry, and the bytes of its body that must be zero. */
static ferry_status am_shape(const ferry__am *m, const uint8_t *b, size_t payload_len)
{
    switch (m->type) {
    case FERRY_AM_DESC:
        return desc_shape(m, payload_len);
    case FERRY_AM_ACK:
        return (m->flags & ~FERRY_AM_ACK_PARTIAL) || payload_len ? malformed("bad acknowledgement")
                                                                 : FERRY_OK;
    case FERRY_AM_TAKEN:
        return m->flags || payload_len || !all_zero(b + 4, 12) ? malformed("bad taken message")
                                                               : FERRY_OK;
    case FERRY_AM_INFO:
        return (m->flags & ~(FERRY_AM_INFO_EMULATED | FERRY_AM_INFO_HOLD)) ||
                       payload_len > FERRY_AM_MAX_INFO || !all_zero(b, 16)
                   ? malformed("bad info message")
                   : FERRY_OK;
    case FERRY_AM_READ:
        return m->flags || payload_len != 8 || m->u.read.length > FERRY_AM_READ_MAX
                   ? malformed("bad read request")
                   : FERRY_OK;
    case FERRY_AM_DATA:
        return data_shape(m, payload_len);
    case FERRY_AM_REVOKE:
    case FERRY_AM_RELEASED:
        return m->flags || payload_len || !all_zero(b + 8, 8) ? malformed("bad hold message")
                                                              : FERRY_OK;
    case FERRY_AM_ACKS:
        return m->flags || !m->u.acks.count || m->u.acks.count > FERRY_AM_ACKS_MAX ||
                       payload_len != 8ull * m->u.acks.count || !all_zero(b + 4, 12)
                   ? malformed("bad acknowledgements")
                   : FERRY_OK;
    default:
        return malformed("unknown active message");
    }
}

ferry_status ferry__am_decode(const uint8_t *buf, size_t len, size_t payload_len, ferry__am *m)
{
    if (len != FERRY_AM_HEADER)
        return malformed("active-message header of the wrong size");
    ferry__am a;
    memset(&a, 0, sizeof(a));
    a.type = ferry__get_le16(buf + AM_TYPE);
    a.flags = ferry__get_le16(buf + AM_FLAGS);
    a.conn_id = ferry__get_le32(buf + AM_CONN);
    a.token = ferry__get_le64(buf + AM_TOKEN);
    const uint8_t *b = buf + AM_BODY;
    if (a.type == FERRY_AM_DESC) {
        a.u.desc.offset = ferry__get_le64(b);
        a.u.desc.length = ferry__get_le64(b + 8);
    } else if (a.type == FERRY_AM_ACK) {
        a.u.ack.slot = ferry__get_le32(b);
        a.u.ack.generation = ferry__get_le32(b + 4);
        a.u.ack.first = ferry__get_le32(b + 8);
        a.u.ack.count = ferry__get_le32(b + 12);
    } else if (a.type == FERRY_AM_TAKEN) {
        a.u.taken.taken = ferry__get_le32(b);
    } else if (a.type == FERRY_AM_READ) {
        a.u.read.slot = ferry__get_le32(b);
        a.u.read.generation = ferry__get_le32(b + 4);
        a.u.read.id = ferry__get_le32(b + 8);
        a.u.read.length = ferry__get_le32(b + 12);
    } else if (a.type == FERRY_AM_DATA) {
        a.u.data.id = ferry__get_le32(b);
        a.u.data.status = ferry__get_le32(b + 4);
        a.u.data.value = ferry__get_le64(b + 8);
    } else if (a.type == FERRY_AM_REVOKE || a.type == FERRY_AM_RELEASED) {
        a.u.hold.slot = ferry__get_le32(b);
        a.u.hold.generation = ferry__get_le32(b + 4);
    } else if (a.type == FERRY_AM_ACKS) {
        a.u.acks.count = ferry__get_le32(b);
    }
    ferry_status st = am_shape(&a, b, payload_len);
    if (st != FERRY_OK)
        return st;
    *m = a;
    return FERRY_OK;
}
