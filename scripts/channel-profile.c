/* The CPU cost of each call of one channel hand-over, producer and consumer in one thread
 * (host pool, 4 KiB): what the channel round trip adds to the floor's copies.
 *   cc -O2 -Iinclude scripts/channel-profile.c build/libferry.a -lpthread && ./a.out */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ferry.h"

static unsigned long long now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

int main(void)
{
    ferry_pool_config c = FERRY_POOL_CONFIG_INIT;
    c.backend = FERRY_BACKEND_HOST;
    c.memory_size = 64 << 20;
    c.max_inflight_slices = 256;
    ferry_pool *p;
    ferry_consumer *rx;
    char addr[FERRY_ADDRESS_SIZE];
    static char src[4096], dst[4096];
    if (ferry_pool_create(&c, &p) || ferry_pool_address(p, addr, sizeof(addr)) ||
        ferry_consumer_connect(addr, 0, -1, &rx)) {
        fprintf(stderr, "%s\n", ferry_last_error());
        return 1;
    }
    ferry_tensor t = ferry_tensor_bytes(sizeof(src));
    const void *s = src;
    enum { N = 200000 };
    unsigned long long send = 0, recv = 0, read = 0, ack = 0, publish = 0, copy = 0;
    for (int i = 0; i < N; i++) {
        ferry_descriptor d, d2;
        size_t k;
        unsigned long long t0 = now();
        int bad = ferry_pool_send(p, &t, &s, 1, NULL, NULL, 0, NULL);
        unsigned long long t1 = now();
        bad |= ferry_consumer_recv(rx, 0, &d, 1, &k);
        unsigned long long t2 = now();
        bad |= ferry_consumer_read(rx, &d, dst, sizeof(dst), 0);
        unsigned long long t3 = now();
        bad |= ferry_consumer_ack(rx, &d);
        unsigned long long t4 = now();
        bad |= ferry_pool_publish(p, &t, src, 0, &d2);
        unsigned long long t5 = now();
        memcpy(dst, src, sizeof(src));
        __asm__ volatile("" ::: "memory");
        unsigned long long t6 = now();
        bad |= ferry_consumer_ack(rx, &d2);
        if (bad) {
            fprintf(stderr, "%s\n", ferry_last_error());
            return 1;
        }
        send += t1 - t0, recv += t2 - t1, read += t3 - t2, ack += t4 - t3;
        publish += t5 - t4, copy += t6 - t5;
    }
    printf("ns per call (4 KiB): send %.0f (publish alone %.0f), recv %.0f, read %.0f, ack %.0f; "
           "one 4 KiB memcpy %.0f\n",
           (double)send / N, (double)publish / N, (double)recv / N, (double)read / N,
           (double)ack / N, (double)copy / N);
    ferry_consumer_destroy(rx);
    ferry_pool_destroy(p);
    return 0;
}
