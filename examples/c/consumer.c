/*
 * ferry example, consumer side (rank 0): reads 256-byte descriptors from stdin until end of
 * file; for each one, decodes it, copies the tensor out of the producer's pool, checks its
 * values and acknowledges it, so that the producer may reuse the memory.
 *
 *     ./producer | ./consumer
 */
#include <ferry.h>

#include <stdio.h>
#include <stdlib.h>

#define SECOND_NS 1000000000ull

static int fail(const char *what, ferry_status st)
{
    fprintf(stderr, "consumer: %s: %s: %s\n", what, ferry_status_name(st), ferry_last_error());
    return 1;
}

/* Tensor i is float32 and its element j holds i * 1000 + j (see producer.c). */
static int check_values(const ferry_descriptor *desc, const float *values, int i)
{
    if (desc->tensor.dtype_code != FERRY_DTYPE_FLOAT || desc->tensor.dtype_bits != 32) {
        fprintf(stderr, "consumer: tensor %d is not float32\n", i);
        return 1;
    }
    for (uint64_t j = 0; j < desc->length / sizeof(float); j++) {
        if (values[j] != (float)(i * 1000 + (int)j)) {
            fprintf(stderr, "consumer: tensor %d element %llu is %g\n", i, (unsigned long long)j,
                    values[j]);
            return 1;
        }
    }
    return 0;
}

/* Reads, checks and acknowledges the tensor that one descriptor names. */
static int consume_one(ferry_consumer *consumer, const uint8_t *wire, int i)
{
    ferry_descriptor desc;
    ferry_status st = ferry_descriptor_decode(wire, FERRY_DESCRIPTOR_SIZE, &desc);
    if (st != FERRY_OK)
        return fail("decode", st);
    float *values = malloc(desc.length);
    if (!values) {
        fprintf(stderr, "consumer: out of memory\n");
        return 1;
    }
    int rc = 0;
    st = ferry_consumer_read(consumer, &desc, values, desc.length, 5 * SECOND_NS);
    if (st != FERRY_OK)
        rc = fail("read", st);
    else
        rc = check_values(&desc, values, i);
    free(values);
    st = ferry_consumer_ack(consumer, &desc); /* acknowledge even a tensor we could not use */
    if (st != FERRY_OK && rc == 0)
        rc = fail("ack", st);
    if (rc == 0)
        printf("consumer: tensor %d [%lld x %lld] float32 ok\n", i, (long long)desc.tensor.shape[0],
               (long long)desc.tensor.shape[1]);
    return rc;
}

int main(void)
{
    ferry_consumer *consumer;
    ferry_status st = ferry_consumer_create(0, &consumer);
    if (st != FERRY_OK)
        return fail("create the consumer", st);

    int rc = 0, count = 0;
    uint8_t wire[FERRY_DESCRIPTOR_SIZE];
    while (rc == 0 && fread(wire, 1, sizeof(wire), stdin) == sizeof(wire))
        rc = consume_one(consumer, wire, count++);
    if (rc == 0 && ferror(stdin)) {
        perror("consumer: reading a descriptor");
        rc = 1;
    }
    if (rc == 0)
        printf("consumer: %d tensors read, checked and acknowledged\n", count);
    ferry_consumer_destroy(consumer);
    return rc;
}
