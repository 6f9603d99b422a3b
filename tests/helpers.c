#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"

static uint64_t th_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

void th_fill(void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1, v;
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v = th_next(&s);
        memcpy(p + i, &v, 8);
    }
    v = th_next(&s);
    memcpy(p + i, &v, n - i);
}

int th_check(const void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1, v;
    const unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v = th_next(&s);
        if (memcmp(p + i, &v, 8) != 0)
            return 0;
    }
    v = th_next(&s);
    return memcmp(p + i, &v, n - i) == 0;
}

void th_stamp(void *buf, size_t n, uint64_t seed)
{
    if (n < 8) {
        th_fill(buf, n, seed);
        return;
    }
    memcpy(buf, &seed, 8);
    th_fill((unsigned char *)buf + 8, n - 8, seed);
}

int th_check_stamp(const void *buf, size_t n, uint64_t seed, uint64_t *found)
{
    uint64_t head = 0;
    if (n < 8) {
        if (found)
            *found = 0;
        return th_check(buf, n, seed);
    }
    memcpy(&head, buf, 8);
    if (found)
        *found = head;
    return head == seed && th_check((const unsigned char *)buf + 8, n - 8, seed);
}

#if defined(__SANITIZE_THREAD__)
#define TH_SANITIZER_SCALE 0.1
#elif defined(__SANITIZE_ADDRESS__)
#define TH_SANITIZER_SCALE 0.25
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TH_SANITIZER_SCALE 0.1
#elif __has_feature(address_sanitizer)
#define TH_SANITIZER_SCALE 0.25
#endif
#endif
#ifndef TH_SANITIZER_SCALE
#define TH_SANITIZER_SCALE 1.0
#endif

double th_stress_scale(void)
{
    const char *env = getenv("FERRY_STRESS_SCALE");
    double s = env ? strtod(env, NULL) : 0;
    return s > 0 ? s : TH_SANITIZER_SCALE;
}

int th_sanitized(void)
{
    return TH_SANITIZER_SCALE < 1.0;
}

uint64_t th_scaled(uint64_t n, uint64_t min)
{
    double v = (double)n * th_stress_scale();
    return v < (double)min ? min : (uint64_t)v;
}

int th_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

long th_threads_settled(long want)
{
    long v = th_status_field("Threads:");
    for (int i = 0; i < 1000 && v > want; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        v = th_status_field("Threads:");
    }
    return v;
}

long th_status_field(const char *name)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, name, strlen(name)) == 0)
            v = strtol(line + strlen(name), NULL, 10);
    if (f)
        fclose(f);
    return v;
}
