/* pretrained_centers (server/centers_load.c), the pfcps side of test_centers_load.py: every shard s of S
 * created as a server creates it and loaded from FILE; the table written back in class order.
 * Usage: test_centers_load FILE C D S OUT
 *   OUT gets C x D float32 weights then C x D float32 momentum, class order, little-endian.
 * Exit 0; 1 when a load fails (its message on stderr, as the server logs it); 2 for a usage or test error
 * (a row not marked generated, a class seen twice or never). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "server/centers_load.h"
#include "server/shard.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: test_centers_load FILE C D S OUT\n");
        return 2;
    }
    const char *path = argv[1], *out = argv[5];
    long long C = atoll(argv[2]);
    int D = atoi(argv[3]), S = atoi(argv[4]);
    if (C <= 0 || D <= 0 || S <= 0) {
        fprintf(stderr, "test_centers_load: bad C, D or S\n");
        return 2;
    }
    float *w = calloc((size_t)C * (size_t)D, sizeof *w), *m = calloc((size_t)C * (size_t)D, sizeof *m);
    unsigned char *seen = calloc((size_t)C, 1);
    if (!w || !m || !seen)
        return 2;
    for (int s = 0; s < S; s++) {
        shard sh;
        if (shard_create(&sh, C, S, s, D, 7, 1, 0) < 0) {
            fprintf(stderr, "shard_create: %s\n", pf_errmsg());
            return 2;
        }
        if (centers_load(&sh, path) < 0) {
            fprintf(stderr, "%s\n", pf_errmsg());
            shard_destroy(&sh);
            return 1;
        }
        for (int64_t lr = 0; lr < sh.rows; lr++) {
            int64_t c = lr * S + s;
            if (!shard_row_ready(&sh, lr) || c >= C || seen[c]) {
                fprintf(stderr, "shard %d: local row %lld (class %lld) not loaded or seen twice\n", s,
                        (long long)lr, (long long)c);
                return 2;
            }
            seen[c] = 1;
            memcpy(w + (size_t)c * (size_t)D, sh.weight + (size_t)lr * (size_t)D, (size_t)D * sizeof *w);
            memcpy(m + (size_t)c * (size_t)D, sh.momentum + (size_t)lr * (size_t)D, (size_t)D * sizeof *m);
        }
        shard_destroy(&sh);
    }
    for (long long c = 0; c < C; c++)
        if (!seen[c]) {
            fprintf(stderr, "class %lld in no shard\n", c);
            return 2;
        }
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(w, sizeof *w, (size_t)C * (size_t)D, f) != (size_t)C * (size_t)D ||
        fwrite(m, sizeof *m, (size_t)C * (size_t)D, f) != (size_t)C * (size_t)D || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", out, strerror(errno));
        return 2;
    }
    free(w);
    free(m);
    free(seen);
    return 0;
}
