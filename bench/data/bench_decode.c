/* Data pipeline throughput on one core: decode + augment (TurboJPEG decode to RGB, flip, normalize to
 * NCHW float32: img_load) and the whole loader path with num_workers = 0 (record read from the mmap'd
 * .rec, decode, augment, batch), against the ceiling measured in the same run: bare TurboJPEG
 * tjDecompress2 of the same JPEG records to RGB. Prints images/s and the ratios.
 *   bench_decode [PREFIX]   (default: packs PFCPS_SOURCE/data/orl into a temp folder first)
 *   PFCPS_BENCH_ROUNDS (default 5) rounds of every measurement, interleaved; the best round counts.
 * Rates are per second of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): one core, unaffected by
 * other processes taking turns on a shared machine. */
#include "common/err.h"
#include "worker/data/image.h"
#include "worker/data/loader.h"
#include "worker/data/pack.h"
#include "worker/data/rec.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

static double thread_cpu_s(void)
{
    struct timespec ts;
    /* CPU time of this thread: the machine is shared, wall time would count other processes' turns. */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    char prefix[600], tmp[64] = "";
    if (argc > 1)
        snprintf(prefix, sizeof prefix, "%s", argv[1]);
    else {
        const char *src = getenv("PFCPS_SOURCE");
        char orl[512];
        snprintf(orl, sizeof orl, "%s/data/orl", src ? src : ".");
        snprintf(tmp, sizeof tmp, "/tmp/pfcps-bench-data-XXXXXX");
        if (!mkdtemp(tmp)) {
            perror("mkdtemp");
            return 1;
        }
        snprintf(prefix, sizeof prefix, "%s/train", tmp);
        pack_opts po;
        pack_opts_default(&po);
        pack_stats st;
        if (pack_dir(orl, prefix, &po, &st) < 0) {
            fprintf(stderr, "pack: %s\n", pf_errmsg());
            return 1;
        }
    }
    rec_file *rf;
    if (rec_open(&rf, prefix, 0, 0) < 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    int64_t n = rf->num_images;
    const uint8_t **img = calloc((size_t)n, sizeof *img);
    size_t *len = calloc((size_t)n, sizeof *len);
    rec_buf *bufs = calloc((size_t)n, sizeof *bufs);
    for (int64_t i = 0; i < n; i++) {
        rec_payload p;
        if (rec_get(rf, i, &bufs[i], &p) < 0) {
            fprintf(stderr, "%s\n", pf_errmsg());
            return 1;
        }
        img[i] = p.image;
        len[i] = p.image_len;
    }
    const char *r = getenv("PFCPS_BENCH_ROUNDS");
    int rounds = r ? atoi(r) : 5;
    if (rounds < 1)
        rounds = 1;
    tjhandle tj = tjInitDecompress();
    uint8_t *rgb = malloc(IMG_SIZE * IMG_SIZE * 3);
    float *out = malloc(sizeof(float) * 3 * IMG_SIZE * IMG_SIZE);
    img_decoder dec;
    img_decoder_init(&dec);
    loader_opts o;
    loader_opts_default(&o);
    o.rec = prefix;
    o.batch_size = 32;
    o.num_workers = 0;
    loader *l;
    if (loader_open(&l, &o) < 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    int64_t per_epoch = loader_num_batches(l) * o.batch_size;
    double best_bare = 0, best_aug = 0, best_loader = 0, best_dec = 0;
    int reps = 4; /* passes over the records per round */
    for (int round = 0; round < rounds; round++) {
        double t = thread_cpu_s();
        for (int rep = 0; rep < reps; rep++)
            for (int64_t i = 0; i < n; i++)
                if (tjDecompress2(tj, img[i], (unsigned long)len[i], rgb, IMG_SIZE, 0, IMG_SIZE, TJPF_RGB,
                                  0) != 0) {
                    fprintf(stderr, "decode %" PRId64 ": %s\n", i, tjGetErrorStr2(tj));
                    return 1;
                }
        double bare = (double)(n * reps) / (thread_cpu_s() - t);
        t = thread_cpu_s();
        for (int rep = 0; rep < reps; rep++)
            for (int64_t i = 0; i < n; i++)
                if (img_load(&dec, img[i], len[i], IMG_SIZE, 0, (int)(i & 1), out) < 0) {
                    fprintf(stderr, "%s\n", pf_errmsg());
                    return 1;
                }
        double aug = (double)(n * reps) / (thread_cpu_s() - t);
        t = thread_cpu_s();
        for (int rep = 0; rep < reps; rep++)
            for (int64_t i = 0; i < n; i++) {
                int w, h;
                uint8_t *px;
                if (img_decode_rgb(&dec, img[i], len[i], &w, &h, &px) < 0)
                    return 1;
            }
        double dc = (double)(n * reps) / (thread_cpu_s() - t);
        if (dc > best_dec)
            best_dec = dc;
        t = thread_cpu_s();
        for (int rep = 0; rep < reps; rep++) {
            loader_start_epoch(l, round * reps + rep);
            loader_batch *b;
            while (loader_next(l, &b) == 1)
                loader_release(l, b);
        }
        double ld = (double)(per_epoch * reps) / (thread_cpu_s() - t);
        if (bare > best_bare)
            best_bare = bare;
        if (aug > best_aug)
            best_aug = aug;
        if (ld > best_loader)
            best_loader = ld;
    }
    printf("records: %" PRId64
           " JPEGs %dx%d from %s.rec, %d rounds x %d passes, best round, per CPU-second of one thread\n",
           n, IMG_SIZE, IMG_SIZE, prefix, rounds, reps);
    printf("ceiling  bare TurboJPEG tjDecompress2 -> RGB      %9.0f img/s\n", best_bare);
    printf("pfcps    decode only (img_decode_rgb)              %9.0f img/s   ratio %.3f of ceiling\n",
           best_dec, best_dec / best_bare);
    printf("pfcps    decode + flip + normalize -> NCHW f32     %9.0f img/s   ratio %.3f of ceiling\n",
           best_aug, best_aug / best_bare);
    printf("pfcps    loader (rec read + decode + augment)      %9.0f img/s   ratio %.3f of ceiling\n",
           best_loader, best_loader / best_bare);
    loader_close(l);
    img_decoder_free(&dec);
    tjDestroy(tj);
    free(rgb);
    free(out);
    for (int64_t i = 0; i < n; i++)
        rec_buf_free(&bufs[i]);
    free(bufs);
    free(img);
    free(len);
    rec_close(rf);
    if (tmp[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmp);
    }
    return 0;
}
