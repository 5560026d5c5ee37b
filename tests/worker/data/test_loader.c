/* Loader: determinism (same seed -> same batches, whatever num_workers), rank slices disjoint and
 * covering the kept part of the epoch with equal batch counts, labels-first (peek == batch labels ==
 * the class of each key, computed here from the ORL folder sizes), normalization and flip checked
 * against an independent TurboJPEG decode in float64, synthetic labels uniform in [0, C) up to 2^32,
 * arcface_torch's epoch length and padding (DistributedSampler + drop_last DataLoader), a rewind to an
 * earlier batch with batches in flight (loader_start_epoch_at), and bad options. */
#include "fixture.h"

#include "common/err.h"
#include "worker/data/loader.h"
#include "worker/data/pack.h"
#include "worker/data/rec.h"

#include <inttypes.h>
#include <math.h>
#include <png.h>

static char dir[256], prefix[300];
enum { W = 3, B = 16, S = 112, IMGF = 3 * S * S };

/* Class of ORL pack key k (keys 1..398 in folder order; s8 and s9 have 9 images, the rest 10). */
static int64_t orl_class_of_key(int64_t key)
{
    int64_t k = key - 1;
    for (int c = 0; c < 40; c++) {
        int n = (c == 7 || c == 8) ? 9 : 10;
        if (k < n)
            return c;
        k -= n;
    }
    return -1;
}

static loader *open_loader_b(int rank, int workers, uint64_t seed, int batch)
{
    loader_opts o;
    loader_opts_default(&o);
    o.rec = prefix;
    o.batch_size = batch;
    o.num_workers = workers;
    o.seed = seed;
    o.rank = rank;
    o.world_size = W;
    loader *l;
    int rc = loader_open(&l, &o);
    CHECK(rc == 0, "loader_open rank %d: %s", rank, pf_errmsg());
    return rc == 0 ? l : NULL;
}

static loader *open_loader(int rank, int workers, uint64_t seed)
{
    return open_loader_b(rank, workers, seed, B);
}

/* arcface_torch's epoch length where it differs from floor(N / (W B)): 398 images, 3 ranks, batch 19.
 * DistributedSampler gives each rank ceil(398 / 3) = 133 samples (the permutation padded to 399 by repeating
 * its first index), DataLoader(drop_last=True) 133 // 19 = 7 batches; floor(398 / 57) would be 6. So every
 * image is read once and exactly one twice: the permutation's first, rank 0's first sample, read again by
 * rank 2 as its last (position 398). */
static void test_padding(void)
{
    enum { BP = 19, NB = 7 };
    int64_t order[W][NB * BP];
    int64_t *seen = calloc(398, sizeof *seen);
    for (int r = 0; r < W; r++) {
        loader *l = open_loader_b(r, 1, 7, BP);
        if (!l) {
            free(seen);
            return;
        }
        int64_t nb = loader_num_batches(l);
        CHECK(nb == NB, "padding: rank %d: %" PRId64 " batches, want 7 (ceil(398 / 3) // 19)", r, nb);
        if (nb == NB)
            loader_epoch_order(l, 0, order[r]);
        loader_close(l);
        if (nb != NB) {
            free(seen);
            return;
        }
        for (int k = 0; k < NB * BP; k++)
            if (order[r][k] >= 0 && order[r][k] < 398)
                seen[order[r][k]]++;
    }
    int64_t once = 0, twice = 0, twice_idx = -1;
    for (int i = 0; i < 398; i++) {
        once += seen[i] == 1;
        if (seen[i] == 2) {
            twice++;
            twice_idx = i;
        }
    }
    CHECK(once == 397 && twice == 1, "padding: %" PRId64 " images read once, %" PRId64 " twice (want 397, 1)",
          once, twice);
    CHECK(twice_idx == order[0][0] && order[2][NB * BP - 1] == order[0][0],
          "padding: the repeated image %" PRId64 " is not the permutation's first (%" PRId64
          ") at rank 2's last position (%" PRId64 ")",
          twice_idx, order[0][0], order[2][NB * BP - 1]);
    printf("padding: 3 ranks x 7 batches x 19 = 399 samples of 398 images, image %" PRId64 " twice\n", twice_idx);
    free(seen);
}

static void test_slices(void)
{
    int64_t nb = -1;
    int64_t *seen = calloc(398, sizeof *seen);
    int64_t total = 0;
    int64_t order0[W][8 * B];
    for (int r = 0; r < W; r++) {
        loader *l = open_loader(r, 1, 7);
        if (!l)
            return;
        if (nb < 0)
            nb = loader_num_batches(l);
        CHECK(loader_num_batches(l) == 8 && loader_num_batches(l) == nb,
              "rank %d: %" PRId64 " batches, want 8 (398 / 48)", r, loader_num_batches(l));
        loader_epoch_order(l, 0, order0[r]);
        for (int k = 0; k < 8 * B; k++) {
            int64_t i = order0[r][k];
            CHECK(i >= 0 && i < 398, "index %" PRId64, i);
            if (i >= 0 && i < 398)
                seen[i]++;
            total++;
        }
        /* Another epoch gives another order; the same epoch again gives the same one. */
        int64_t again[8 * B], e1[8 * B];
        loader_epoch_order(l, 0, again);
        loader_epoch_order(l, 1, e1);
        CHECK(memcmp(again, order0[r], sizeof again) == 0, "rank %d: epoch 0 order not reproducible", r);
        CHECK(memcmp(e1, order0[r], sizeof e1) != 0, "rank %d: epoch 1 has epoch 0's order", r);
        loader_close(l);
    }
    int64_t dup = 0, covered = 0;
    for (int i = 0; i < 398; i++) {
        dup += seen[i] > 1;
        covered += seen[i] == 1;
    }
    CHECK(total == 384 && dup == 0 && covered == 384,
          "slices: %" PRId64 " samples, %" PRId64 " duplicates, %" PRId64 " covered", total, dup, covered);
    printf("slices: 3 ranks x 8 batches x 16 = %" PRId64 " samples, %" PRId64 " distinct images, %" PRId64
           " shared, 14 dropped (drop_last)\n",
           total, covered, dup);
    /* A different seed permutes differently. */
    loader *l = open_loader(0, 1, 8);
    if (l) {
        int64_t o8[8 * B];
        loader_epoch_order(l, 0, o8);
        CHECK(memcmp(o8, order0[0], sizeof o8) != 0, "seed 8 gave seed 7's order");
        loader_close(l);
    }
    free(seen);
}

/* Reads every batch of `epoch` from rank 1; returns a malloc'd copy of images, labels, keys. */
static int read_epoch(int workers, int64_t epoch, float **imgs, int64_t **labels, int64_t **keys)
{
    loader *l = open_loader(1, workers, 7);
    if (!l)
        return -1;
    int64_t nb = loader_num_batches(l);
    *imgs = malloc((size_t)nb * B * IMGF * sizeof(float));
    *labels = malloc((size_t)nb * B * sizeof(int64_t));
    *keys = malloc((size_t)nb * B * sizeof(int64_t));
    loader_start_epoch(l, epoch);
    int64_t got = 0, peek[B];
    int peek_ok = 1, class_ok = 1;
    for (;;) {
        int has = loader_peek_labels(l, peek);
        loader_batch *b;
        int rc = loader_next(l, &b);
        CHECK(rc >= 0, "loader_next: %s", pf_errmsg());
        CHECK(has == rc, "peek says %d, next says %d", has, rc);
        if (rc <= 0)
            break;
        CHECK(b->index == got && b->epoch == epoch && b->n == B, "batch %" PRId64 " index %" PRId64, got,
              b->index);
        for (int i = 0; i < B; i++) {
            peek_ok &= peek[i] == b->labels[i];
            class_ok &= b->labels[i] == orl_class_of_key(b->keys[i]);
        }
        memcpy(*imgs + (size_t)got * B * IMGF, b->images, (size_t)B * IMGF * sizeof(float));
        memcpy(*labels + got * B, b->labels, B * sizeof(int64_t));
        memcpy(*keys + got * B, b->keys, B * sizeof(int64_t));
        loader_release(l, b);
        got++;
    }
    CHECK(got == nb && got == 8, "%" PRId64 " batches, want 8", got);
    CHECK(peek_ok, "peeked labels differ from the batch labels");
    CHECK(class_ok, "a label differs from the class of its key");
    loader_close(l);
    return 0;
}

/* Reads batches [first, end) of the epoch the loader is in and compares them with the reference (read_epoch's
 * arrays): index, images, labels and keys. Returns the number that differ. */
static int compare_batches(loader *l, int64_t epoch, int64_t first, int64_t end, const float *imgs,
                           const int64_t *labels, const int64_t *keys)
{
    int bad = 0;
    for (int64_t i = first; i < end; i++) {
        int64_t peek[B];
        loader_batch *b;
        if (loader_peek_labels(l, peek) != 1 || loader_next(l, &b) != 1) {
            CHECK(0, "batch %" PRId64 " of epoch %" PRId64 " missing: %s", i, epoch, pf_errmsg());
            return bad + 1;
        }
        bad += b->index != i || b->epoch != epoch || memcmp(b->labels, labels + i * B, B * sizeof(int64_t)) ||
               memcmp(b->keys, keys + i * B, B * sizeof(int64_t)) ||
               memcmp(b->images, imgs + (size_t)i * B * IMGF, (size_t)B * IMGF * sizeof(float)) ||
               memcmp(peek, b->labels, B * sizeof(int64_t));
        loader_release(l, b);
    }
    return bad;
}

/* In-place recovery's rewind: loader_start_epoch_at back to an earlier batch of the same epoch, or of the
 * epoch before, while batches are decoded ahead, one is peeked and one held: the batches from there are the
 * ones an uninterrupted epoch delivers (num_workers 2 and 0). */
static void test_rewind_mid_epoch(void)
{
    float *ref1, *ref2;
    int64_t *l1, *l2, *k1, *k2;
    if (read_epoch(2, 1, &ref1, &l1, &k1) < 0 || read_epoch(2, 2, &ref2, &l2, &k2) < 0)
        return;
    for (int workers = 2; workers >= 0; workers -= 2) {
        loader *l = open_loader(1, workers, 7);
        if (!l)
            return;
        int bad = 0;
        loader_start_epoch(l, 1);
        bad += compare_batches(l, 1, 0, 4, ref1, l1, k1);
        loader_batch *held;
        int64_t peek[B];
        CHECK(loader_next(l, &held) == 1 && loader_peek_labels(l, peek) == 1, "batch 4 held, 5 peeked: %s",
              pf_errmsg());
        CHECK(loader_start_epoch_at(l, 1, 3) == 0, "rewind to batch 3: %s", pf_errmsg());
        bad += compare_batches(l, 1, 3, 8, ref1, l1, k1);
        /* epoch 2 under way, back to the last batch of epoch 1, then on into epoch 2 */
        loader_start_epoch(l, 2);
        bad += compare_batches(l, 2, 0, 2, ref2, l2, k2);
        CHECK(loader_peek_labels(l, peek) == 1, "peek: %s", pf_errmsg());
        CHECK(loader_start_epoch_at(l, 1, 7) == 0, "rewind to epoch 1 batch 7: %s", pf_errmsg());
        bad += compare_batches(l, 1, 7, 8, ref1, l1, k1);
        CHECK(loader_peek_labels(l, peek) == 0, "epoch 1 ends after batch 7");
        loader_start_epoch(l, 2);
        bad += compare_batches(l, 2, 0, 8, ref2, l2, k2);
        CHECK(bad == 0, "num_workers %d: %d batches after a rewind differ from the uninterrupted epoch",
              workers, bad);
        loader_close(l);
    }
    printf("rewind: loader_start_epoch_at mid-epoch with batches in flight, peeked and held: same batches\n");
    free(ref1);
    free(ref2);
    free(l1);
    free(l2);
    free(k1);
    free(k2);
}

static void test_determinism_and_values(void)
{
    float *ia, *ib;
    int64_t *la, *lb, *ka, *kb;
    if (read_epoch(2, 0, &ia, &la, &ka) < 0 || read_epoch(0, 0, &ib, &lb, &kb) < 0)
        return;
    size_t n = 8 * B;
    CHECK(memcmp(ka, kb, n * sizeof *ka) == 0 && memcmp(la, lb, n * sizeof *la) == 0 &&
              memcmp(ia, ib, n * IMGF * sizeof *ia) == 0,
          "2 threads and 0 threads gave different batches");
    printf("determinism: 8 batches of rank 1 identical with 2 decode threads and with none (keys, labels, "
           "pixels)\n");

    /* Each image against an independent decode: (v/255 - 0.5)/0.5 in float64, flipped or not. */
    rec_file *rf;
    if (rec_open(&rf, prefix, 0, 0) < 0) {
        CHECK(0, "rec_open: %s", pf_errmsg());
        return;
    }
    rec_buf s = {0};
    int flips = 0, matched = 0;
    double worst = 0;
    for (size_t k = 0; k < n; k++) {
        rec_payload p;
        int64_t key = ka[k];
        if (rec_get(rf, key - 1, &s, &p) < 0 || rf->images[key - 1].key != key) {
            CHECK(0, "key %" PRId64, key);
            continue;
        }
        int w, h;
        uint8_t *rgb = fx_decode(p.image, p.image_len, &w, &h);
        if (!rgb || w != S || h != S) {
            CHECK(0, "decode key %" PRId64, key);
            free(rgb);
            continue;
        }
        double err[2] = {0, 0};
        const float *img = ia + k * IMGF;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < S; y++)
                for (int x = 0; x < S; x++) {
                    double got = img[((size_t)c * S + y) * S + x];
                    double plain = ((double)rgb[((size_t)y * S + x) * 3 + c] / 255.0 - 0.5) / 0.5;
                    double flip = ((double)rgb[((size_t)y * S + (S - 1 - x)) * 3 + c] / 255.0 - 0.5) / 0.5;
                    err[0] = fmax(err[0], fabs(got - plain));
                    err[1] = fmax(err[1], fabs(got - flip));
                }
        int f = err[1] < err[0];
        flips += f;
        matched += err[f] < 1e-6;
        worst = fmax(worst, err[f]);
        free(rgb);
    }
    CHECK(matched == (int)n, "%d of %zu images match the float64 normalization", matched, n);
    CHECK(flips >= 40 && flips <= 88, "%d of %zu flipped (p = 0.5; 4 sd is 40..88)", flips, n);
    printf(
        "normalize: %d/%zu images within 1e-6 of (v/255-0.5)/0.5 in float64 (max |err| %.3g), %d flipped\n",
        matched, n, worst, flips);
    rec_buf_free(&s);
    rec_close(rf);

    free(ia);
    free(ib);
    free(la);
    free(lb);
    free(ka);
    free(kb);
}

static void test_synthetic(void)
{
    const int64_t classes[3] = {INT64_C(1) << 32, 100000007, 10};
    for (int t = 0; t < 3; t++) {
        int64_t C = classes[t];
        loader_opts o;
        loader_opts_default(&o);
        o.rec = "synthetic";
        o.synthetic_varied = 1;
        o.num_classes = C;
        o.batch_size = 64;
        o.world_size = 2;
        o.rank = 1;
        o.num_workers = 2;
        o.num_image = 64 * 2 * 50;
        o.image_size = 16; /* small random images: labels are what is tested here */
        loader *l;
        int rc = loader_open(&l, &o);
        CHECK(rc == 0, "synthetic open: %s", pf_errmsg());
        if (rc < 0)
            return;
        loader_start_epoch(l, 3);
        int64_t peek[64], n = 0, count[10] = {0}, maxl = 0, bad = 0;
        double mean = 0;
        float lo = 0, hi = 0;
        loader_batch *b;
        while (loader_peek_labels(l, peek) == 1 && loader_next(l, &b) == 1) {
            for (int i = 0; i < 64; i++) {
                int64_t v = b->labels[i];
                bad += v < 0 || v >= C || v != peek[i];
                mean += (double)v / (double)C;
                if (v > maxl)
                    maxl = v;
                if (C == 10 && v >= 0 && v < 10)
                    count[v]++;
                n++;
            }
            for (int k = 0; k < 64 * 3 * 16 * 16; k++) {
                lo = fminf(lo, b->images[k]);
                hi = fmaxf(hi, b->images[k]);
            }
            loader_release(l, b);
        }
        mean /= (double)n;
        CHECK(n == 3200 && bad == 0,
              "C %" PRId64 ": %" PRId64 " labels, %" PRId64 " out of range or not as peeked", C, n, bad);
        double want = (double)(C - 1) / (2.0 * (double)C); /* mean of c / C for c uniform in 0..C-1 */
        CHECK(fabs(mean - want) < 0.025, "C %" PRId64 ": mean label / C = %.4f, want %.4f (sd 0.005)", C,
              mean, want);
        CHECK(lo >= -1.0f && hi <= 1.0f && hi - lo > 1.9f, "images in [%.3f, %.3f]", (double)lo, (double)hi);
        if (C == (INT64_C(1) << 32))
            CHECK(maxl > (INT64_C(1) << 31), "max label %" PRId64 " never above 2^31", maxl);
        double chi2 = 0;
        if (C == 10) {
            for (int c = 0; c < 10; c++)
                chi2 += (count[c] - 320.0) * (count[c] - 320.0) / 320.0;
            CHECK(chi2 < 27.88, "C 10: chi-square %.2f over 9 dof (p = 0.001 bound 27.88)", chi2);
        }
        printf("synthetic C = %" PRId64 ": %" PRId64 " labels in range, mean/C %.4f (want %.4f), max %" PRId64
               "\n",
               C, n, mean, want, maxl);
        if (C == 10)
            printf("synthetic C = 10: chi-square %.2f (9 dof, bound 27.88)\n", chi2);
        loader_close(l);
    }
}

/* A pack holding a real PNG (written here with libpng) and a JPEG: no flip, no shuffle; the batch must
 * equal (v/255 - 0.5)/0.5 of the source pixels (PNG: exact source; JPEG: independent TurboJPEG decode). */
static void test_png_record(const char *orl)
{
    size_t jn;
    uint8_t *jpg = fx_orl_jpeg(orl, 5, 5, S, S, 90, &jn);
    int w, h;
    uint8_t *src = jpg ? fx_decode(jpg, jn, &w, &h) : NULL;
    if (!src) {
        CHECK(0, "fixture JPEG");
        free(jpg);
        return;
    }
    for (size_t i = 0; i < (size_t)S * S * 3; i += 3)
        src[i] = (uint8_t)(255 - src[i]); /* distinct channels */
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = S;
    im.height = S;
    im.format = PNG_FORMAT_RGB;
    png_alloc_size_t pn = 0;
    png_image_write_to_memory(&im, NULL, &pn, 0, src, 0, NULL);
    uint8_t *png = malloc(pn);
    int ok = png && png_image_write_to_memory(&im, png, &pn, 0, src, 0, NULL);
    CHECK(ok, "PNG encode: %s", im.message);
    fx_bytes *b = calloc(1, sizeof *b);
    size_t o0 = fx_record0(b, 3.0f, 0, 0, png, pn), o1 = fx_record0(b, 4.0f, 1, 0, jpg, jn);
    char p[400], idx[64], pre[300];
    snprintf(pre, sizeof pre, "%s/png", dir);
    snprintf(p, sizeof p, "%s.rec", pre);
    fx_write(p, b->d, b->n);
    snprintf(p, sizeof p, "%s.idx", pre);
    snprintf(idx, sizeof idx, "0\t%zu\n1\t%zu\n", o0, o1);
    fx_write_text(p, idx);
    loader_opts o;
    loader_opts_default(&o);
    o.rec = pre;
    o.batch_size = 2;
    o.num_workers = 1;
    o.shuffle = 0;
    o.flip = 0;
    loader *l;
    loader_batch *bt;
    int rc = loader_open(&l, &o);
    CHECK(rc == 0, "open: %s", pf_errmsg());
    if (rc == 0) {
        loader_start_epoch(l, 0);
        rc = loader_next(l, &bt);
        CHECK(rc == 1, "next: %s", pf_errmsg());
        if (rc == 1) {
            uint8_t *jd = fx_decode(jpg, jn, &w, &h);
            double err[2] = {0, 0};
            for (int k = 0; k < 2; k++) {
                const uint8_t *px = k == 0 ? src : jd;
                for (int c = 0; c < 3; c++)
                    for (int i = 0; i < S * S; i++) {
                        double want = ((double)px[(size_t)i * 3 + c] / 255.0 - 0.5) / 0.5;
                        err[k] =
                            fmax(err[k], fabs(bt->images[(size_t)k * IMGF + (size_t)c * S * S + i] - want));
                    }
            }
            CHECK(bt->labels[0] == 3 && bt->labels[1] == 4 && err[0] < 1e-6 && err[1] < 1e-6,
                  "PNG/JPEG record: labels %" PRId64 " %" PRId64 ", max err %.3g %.3g", bt->labels[0],
                  bt->labels[1], err[0], err[1]);
            printf("PNG record: max |err| %.3g vs source pixels; JPEG record %.3g vs independent decode\n",
                   err[0], err[1]);
            free(jd);
            loader_release(l, bt);
        }
        loader_close(l);
    }
    free(b);
    free(png);
    free(src);
    free(jpg);
}

/* The run config's keys reach the loader (config.h: rec, num_classes, batch_size, num_workers, seed,
 * skip_bad_records, num_image). */
static void test_from_config(void)
{
    pf_config cfg;
    cfg_defaults(&cfg);
    const char *sets[] = {"rec=synthetic", "num_classes=5000000000", "batch_size=32",  "num_workers=3",
                          "seed=99",       "skip_bad_records=true",  "num_image=4096", "resize=true", "synthetic=varied"};
    int rc = 0;
    for (size_t i = 0; i < sizeof sets / sizeof *sets && rc == 0; i++) {
        char k[64], v[64];
        sscanf(sets[i], "%63[^=]=%63s", k, v);
        rc = cfg_set(&cfg, k, v);
    }
    CHECK(rc == 0, "cfg_set: %s", pf_errmsg());
    loader_opts o;
    loader_opts_from_config(&o, &cfg, 2, 4);
    CHECK(strcmp(o.rec, "synthetic") == 0 && o.num_classes == INT64_C(5000000000) && o.batch_size == 32 &&
              o.num_workers == 3 && o.seed == 99 && o.skip_bad_records == 1 && o.num_image == 4096 &&
              o.rank == 2 && o.world_size == 4 && o.resize == 1 && o.synthetic_varied == 1,
          "loader_opts_from_config");
    loader *l;
    rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL && fx_contains(pf_errmsg(), "num_classes in 1..2^32, got 5000000000"), "C 5e9: %s",
          pf_errmsg());
    o.num_classes = 1000;
    rc = loader_open(&l, &o);
    CHECK(rc == 0 && loader_num_batches(l) == 4096 / (32 * 4), "synthetic from config: %s", pf_errmsg());
    if (rc == 0)
        loader_close(l);
    printf("config: rec, num_classes, batch_size, num_workers, seed, skip_bad_records, num_image, resize "
           "reach the loader\n");
}

/* synthetic = arcface_torch (the default): its SyntheticDataset, checked by hand: label 1 everywhere, one image
 * for every sample and rank and epoch, pixel values on the 0..254 grid normalised as ((v / 255) - 0.5) / 0.5,
 * never mirrored, 1,000,000 samples an epoch whatever num_image says; num_classes 1 refused. */
static void test_synthetic_arcface(void)
{
    float *first = NULL;
    size_t n = (size_t)3 * 112 * 112;
    int64_t bad_label = 0, bad_image = 0, off_grid = 0, flipped = 0, levels[255] = {0};
    for (int rank = 0; rank < 2; rank++) {
        loader_opts o;
        loader_opts_default(&o);
        o.rec = "synthetic";
        o.num_classes = 300000;
        o.num_image = 100000; /* the schedule's length only */
        o.batch_size = 8;
        o.world_size = 2;
        o.rank = rank;
        o.num_workers = 1;
        loader *l;
        int rc = loader_open(&l, &o);
        CHECK(rc == 0, "arcface_torch synthetic open: %s", pf_errmsg());
        if (rc < 0)
            return;
        CHECK(loader_num_images(l) == 1000000 && loader_num_batches(l) == 1000000 / 16,
              "arcface_torch synthetic: %lld images, %lld batches (want 1000000, 62500)",
              (long long)loader_num_images(l), (long long)loader_num_batches(l));
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            loader_start_epoch(l, epoch);
            loader_batch *b;
            for (int k = 0; k < 3 && loader_next(l, &b) == 1; k++) {
                for (int i = 0; i < b->n; i++) {
                    const float *img = b->images + (size_t)i * n;
                    bad_label += b->labels[i] != 1;
                    flipped += b->flips[i] != 0;
                    if (!first) {
                        first = malloc(n * sizeof *first);
                        memcpy(first, img, n * sizeof *first);
                        for (size_t j = 0; j < n; j++) {
                            double v = ((double)img[j] * 0.5 + 0.5) * 255.0;
                            long r = lround(v);
                            off_grid += fabs(v - (double)r) > 1e-3 || r < 0 || r > 254 ||
                                        img[j] != ((float)r / 255.0f - 0.5f) / 0.5f;
                            if (r >= 0 && r <= 254)
                                levels[r]++;
                        }
                    } else
                        bad_image += memcmp(first, img, n * sizeof *first) != 0;
                }
                loader_release(l, b);
            }
        }
        loader_close(l);
    }
    int64_t used = 0;
    for (int v = 0; v < 255; v++)
        used += levels[v] > 0;
    CHECK(bad_label == 0 && bad_image == 0 && off_grid == 0 && flipped == 0 && used == 255,
          "arcface_torch synthetic: %lld labels not 1, %lld images differ, %lld pixels off the 0..254 grid, %lld "
          "mirrored, %lld of 255 levels used",
          (long long)bad_label, (long long)bad_image, (long long)off_grid, (long long)flipped, (long long)used);
    free(first);
    loader_opts o;
    loader_opts_default(&o);
    o.rec = "synthetic";
    o.num_classes = 1;
    loader *l;
    int rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL && fx_contains(pf_errmsg(), "needs num_classes >= 2"), "C 1: %s", pf_errmsg());
    printf("synthetic = arcface_torch: label 1, one image on the 0..254 grid, 1000000 samples an epoch\n");
}

static void test_bad_options(void)
{
    loader_opts o;
    loader *l;
    loader_opts_default(&o);
    o.rec = "synthetic";
    int rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL && fx_contains(pf_errmsg(), "num_classes in 1..2^32"), "synthetic without C: %s",
          pf_errmsg());
    o.num_classes = (INT64_C(1) << 32) + 1;
    rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL, "synthetic C 2^32+1 accepted");
    loader_opts_default(&o);
    o.rec = prefix;
    o.batch_size = 200;
    o.world_size = 2;
    rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL &&
              fx_contains(pf_errmsg(),
                          "398 images give each of world_size 2 ranks 199 samples, less than one batch of "
                          "batch_size 200"),
          "too small: %s", pf_errmsg());
    o.batch_size = 8;
    o.rank = 2;
    rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL && fx_contains(pf_errmsg(), "rank 2 is outside world_size 2"), "rank: %s",
          pf_errmsg());
    o.rank = 0;
    o.rec = "";
    rc = loader_open(&l, &o);
    CHECK(rc == -EINVAL && fx_contains(pf_errmsg(), "rec is not set"), "rec: %s", pf_errmsg());
    /* Holding every batch and asking for one more is refused, not a deadlock. */
    o.rec = prefix;
    o.num_workers = 1;
    o.prefetch = 2;
    if (loader_open(&l, &o) == 0) {
        loader_batch *a, *b, *c;
        loader_start_epoch(l, 0);
        loader_next(l, &a);
        loader_next(l, &b);
        rc = loader_next(l, &c);
        CHECK(rc == -EBUSY && fx_contains(pf_errmsg(), "loader_release"), "held batches: rc %d %s", rc,
              pf_errmsg());
        loader_release(l, a);
        rc = loader_next(l, &c);
        CHECK(rc == 1 && c->index == 2, "after release: rc %d", rc);
        loader_close(l);
    }
    printf("bad options: synthetic without num_classes, C > 2^32, dataset < one global batch, rank >= "
           "world_size, "
           "no rec, too many held batches: refused\n");
}

int main(void)
{
    char ob[300];
    const char *orl = fx_orl(ob, sizeof ob);
    if (!orl) {
        printf("SKIP: ORL faces not found under PFCPS_SOURCE/data/orl\n");
        return 77;
    }
    if (!fx_tmpdir(dir, sizeof dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(prefix, sizeof prefix, "%s/orl/train", dir);
    pack_opts po;
    pack_opts_default(&po);
    pack_stats st;
    if (pack_dir(orl, prefix, &po, &st) < 0) {
        printf("FAIL: pack ORL: %s\n", pf_errmsg());
        fx_rmdir(dir);
        return 1;
    }
    test_slices();
    test_padding();
    test_determinism_and_values();
    test_rewind_mid_epoch();
    test_synthetic();
    test_synthetic_arcface();
    test_png_record(orl);
    test_from_config();
    test_bad_options();
    fx_rmdir(dir);
    printf("%s: %d failures\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
