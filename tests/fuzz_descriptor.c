/* libFuzzer target of the descriptor decoder: whatever decodes must re-encode to the same
 * bytes and carry a length equal to its tensor's size. Each 256-byte input is also tried with
 * its checksum recomputed, so that mutations reach the field rules behind the CRC. Builds
 * with gcc too (fuzz_replay.c supplies a main that replays a corpus). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_descriptor: %s (%s)\n", what, ferry_last_error());
    abort();
}

static void check_decoded(const uint8_t *data, const ferry_descriptor *desc)
{
    uint8_t again[FERRY_DESCRIPTOR_SIZE];
    uint64_t nbytes = 0;
    if (ferry_descriptor_encode(desc, again) != FERRY_OK)
        fuzz_fail("a decoded descriptor does not encode");
    if (memcmp(again, data, FERRY_DESCRIPTOR_SIZE) != 0)
        fuzz_fail("re-encoding a decoded descriptor changed its bytes");
    if (ferry_tensor_nbytes(&desc->tensor, &nbytes) != FERRY_OK)
        fuzz_fail("a decoded tensor has no size");
    if (nbytes != desc->length)
        fuzz_fail("a decoded length differs from its tensor's size");
}

static void fuzz_one(const uint8_t *data, size_t size)
{
    static const uint8_t empty[1];
    ferry_descriptor desc;
    if (ferry_descriptor_decode(data ? (const void *)data : empty, size, &desc) != FERRY_OK)
        return;
    if (size != FERRY_DESCRIPTOR_SIZE)
        fuzz_fail("a descriptor of the wrong length decoded");
    check_decoded(data, &desc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t sealed[FERRY_DESCRIPTOR_SIZE];
    fuzz_one(data, size);
    if (size == FERRY_DESCRIPTOR_SIZE) {
        memcpy(sealed, data, size);
        ferry__put_le32(sealed + size - 4, ferry__crc32c(sealed, size - 4));
        fuzz_one(sealed, size);
    }
    return 0;
}
