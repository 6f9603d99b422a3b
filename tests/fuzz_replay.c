/* Replays fuzz inputs through LLVMFuzzerTestOneInput without libFuzzer, so that a corpus runs
 * as an ordinary test: fuzz_replay DIR_OR_FILE... Fails if an argument is missing or a
 * directory holds no regular file. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads a whole file into a malloc'd buffer (one byte more than the file, so never empty). */
static int read_file(const char *path, uint8_t **data, size_t *size)
{
    struct stat st;
    uint8_t *buf = NULL;
    FILE *f;
    errno = 0;
    f = fopen(path, "rb");
    if (!f || fstat(fileno(f), &st) != 0)
        goto fail;
    buf = malloc((size_t)st.st_size + 1);
    if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        goto fail;
    fclose(f);
    *data = buf;
    *size = (size_t)st.st_size;
    return 0;
fail:
    fprintf(stderr, "fuzz_replay: cannot read %s: %s\n", path,
            errno ? strerror(errno) : "short read");
    if (f)
        fclose(f);
    free(buf);
    return -1;
}

static int replay_file(const char *path)
{
    uint8_t *data;
    size_t size;
    if (read_file(path, &data, &size) != 0)
        return -1;
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

/* Replays every regular file of dir; returns how many, or -1 on an error. */
static long replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    struct stat st;
    char path[4096];
    long count = 0;
    if (!d) {
        fprintf(stderr, "fuzz_replay: cannot open %s: %s\n", dir, strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (replay_file(path) != 0) {
            closedir(d);
            return -1;
        }
        count++;
    }
    closedir(d);
    return count;
}

static long replay_arg(const char *arg)
{
    struct stat st;
    if (stat(arg, &st) != 0) {
        fprintf(stderr, "fuzz_replay: %s: %s\n", arg, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        long n = replay_dir(arg);
        if (n == 0)
            fprintf(stderr, "fuzz_replay: %s holds no input\n", arg);
        return n == 0 ? -1 : n;
    }
    return replay_file(arg) == 0 ? 1 : -1;
}

int main(int argc, char **argv)
{
    long total = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        long n = replay_arg(argv[i]);
        if (n < 0)
            return 1;
        total += n;
    }
    printf("fuzz_replay: replayed %ld inputs\n", total);
    return 0;
}
