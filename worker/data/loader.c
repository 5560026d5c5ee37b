/* The worker's data loader. Order, threading and bad-record rules: loader.h. */
#include "worker/data/loader.h"

#include "common/err.h"
#include "common/log.h"
#include "worker/data/image.h"
#include "worker/data/rec.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SLOT_FREE = 0, SLOT_BUSY, SLOT_READY, SLOT_HELD };
enum { SUBSTITUTE_TRIES = 16 }; /* records tried in place of one that fails to decode */

typedef struct slot {
    loader_batch b;
    int state;
    int rc; /* error of the batch, 0 when fine */
    char msg[PF_ERRMSG_MAX];
} slot;

struct loader {
    loader_opts o;
    int synthetic;    /* rec = synthetic */
    float *one_image; /* synthetic, not varied: arcface_torch's SyntheticDataset image (image_floats) */
    rec_file *rf;
    int64_t num_images, num_classes, nb;
    size_t image_floats;
    /* epoch state */
    int64_t epoch;
    int64_t *order; /* nb * batch_size image indices (or global positions) of this rank */
    int64_t next_claim, next_deliver;
    int active, stop;
    int depth;
    slot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t *threads;
    int nthreads;
    img_decoder sync_dec; /* num_workers == 0 */
    rec_buf sync_buf;
    int64_t skipped_decode; /* atomic */
};

void loader_opts_default(loader_opts *o)
{
    memset(o, 0, sizeof *o);
    o->batch_size = 128;
    o->num_workers = 2;
    o->seed = 2048;
    o->world_size = 1;
    o->shuffle = 1;
    o->flip = 1;
    o->image_size = IMG_SIZE;
    o->num_image = 1 << 20;
}

void loader_opts_from_config(loader_opts *o, const pf_config *cfg, int rank, int world_size)
{
    loader_opts_default(o);
    o->rec = cfg->rec;
    o->num_classes = cfg->num_classes;
    o->batch_size = cfg->batch_size;
    o->num_workers = cfg->num_workers;
    o->seed = (uint64_t)cfg->seed;
    o->skip_bad_records = cfg->skip_bad_records;
    o->resize = cfg->resize;
    if (cfg->num_image > 0)
        o->num_image = cfg->num_image;
    o->synthetic_varied = strcmp(cfg->synthetic, "varied") == 0;
    o->rank = rank;
    o->world_size = world_size;
}

int64_t loader_num_batches(const loader *l)
{
    return l->nb;
}
int64_t loader_num_images(const loader *l)
{
    return l->num_images;
}
int64_t loader_num_classes(const loader *l)
{
    return l->num_classes;
}

int64_t loader_skipped(const loader *l)
{
    return (l->rf ? l->rf->skipped : 0) + __atomic_load_n(&l->skipped_decode, __ATOMIC_RELAXED);
}

/* Label of the sample at global position p (synthetic): uniform in [0, C) by multiply-shift of a
 * 64-bit hash (bias below C / 2^64). */
static int64_t synthetic_label(const loader *l, int64_t epoch, int64_t p)
{
    uint64_t h = img_hash64(l->o.seed, (uint64_t)epoch, (uint64_t)p, 0x1abe1ull);
    __extension__ typedef unsigned __int128 u128;
    return (int64_t)(((u128)h * (u128)(uint64_t)l->num_classes) >> 64);
}

static int64_t sample_label(const loader *l, int64_t epoch, int64_t idx)
{
    if (l->synthetic)
        return l->one_image ? ARCFACE_SYNTHETIC_LABEL : synthetic_label(l, epoch, idx);
    return l->rf->images[idx].class_id;
}

/* arcface_torch's SyntheticDataset image (dataset.py: np.random.randint(0, 255, (112, 112, 3)), transposed
 * to CHW, then ((img / 255) - 0.5) / 0.5 in float32): pixel values 0..254 from a stream seeded by `seed`
 * (other bits than numpy's; the same on every rank), normalised in that float32 order. */
static void synthetic_one_image(float *img, size_t n, uint64_t seed)
{
    uint64_t st = img_hash64(seed, 0, 0, 0x0ae1ull);
    for (size_t k = 0; k < n; k++) {
        __extension__ typedef unsigned __int128 u128;
        uint32_t v = (uint32_t)(((u128)img_splitmix64(&st) * 255u) >> 64);
        img[k] = ((float)v / 255.0f - 0.5f) / 0.5f;
    }
}

int loader_epoch_order(const loader *l, int64_t epoch, int64_t *indices)
{
    int64_t N = l->num_images, W = l->o.world_size, per_rank = l->nb * l->o.batch_size;
    if (l->synthetic) {
        /* Synthetic samples are defined by their global position: no permutation needed (positions past the
         * end wrap, as the padding below). */
        for (int64_t k = 0; k < per_rank; k++)
            indices[k] = (k * W + l->o.rank) % N;
        return 0;
    }
    int64_t *perm = malloc((size_t)N * sizeof *perm);
    if (!perm)
        return pf_err(-ENOMEM, "out of memory for a %" PRId64 "-image order", N);
    for (int64_t i = 0; i < N; i++)
        perm[i] = i;
    if (l->o.shuffle) {
        /* Fisher-Yates seeded by (seed, epoch): the same permutation on every rank. */
        uint64_t st = img_hash64(l->o.seed, (uint64_t)epoch, 0x5eedull, 0);
        for (int64_t i = N - 1; i > 0; i--) {
            __extension__ typedef unsigned __int128 u128;
            int64_t j = (int64_t)(((u128)img_splitmix64(&st) * (u128)(uint64_t)(i + 1)) >> 64);
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    }
    /* DistributedSampler pads the permutation to ceil(N / W) * W by repeating it from its start
     * (indices += indices[:padding]): position p >= N is perm[p mod N]. */
    for (int64_t k = 0; k < per_rank; k++)
        indices[k] = perm[(k * W + l->o.rank) % N];
    free(perm);
    return 0;
}

/* Fills batch `bi` of the current epoch into s. Returns 0 or an error (message in this thread). */
static int produce(loader *l, int64_t bi, slot *s, img_decoder *dec, rec_buf *buf)
{
    int B = l->o.batch_size, S = l->o.image_size;
    loader_batch *b = &s->b;
    b->epoch = l->epoch;
    b->index = bi;
    b->n = B;
    for (int i = 0; i < B; i++) {
        int64_t idx = l->order[bi * B + i];
        float *img = b->images + (size_t)i * l->image_floats;
        b->labels[i] = sample_label(l, l->epoch, idx);
        if (l->synthetic && l->one_image) {
            b->keys[i] = -1;
            b->flips[i] = 0;
            memcpy(img, l->one_image, l->image_floats * sizeof *img);
            continue;
        }
        if (l->synthetic) {
            b->keys[i] = -1;
            b->flips[i] = 0;
            uint64_t st = img_hash64(l->o.seed, (uint64_t)l->epoch, (uint64_t)idx, 0x1a6eull);
            for (size_t k = 0; k < l->image_floats; k += 2) {
                uint64_t r = img_splitmix64(&st);
                img[k] = (float)(uint32_t)r * (2.0f / 4294967296.0f) - 1.0f;
                if (k + 1 < l->image_floats)
                    img[k + 1] = (float)(uint32_t)(r >> 32) * (2.0f / 4294967296.0f) - 1.0f;
            }
            continue;
        }
        /* A record that fails to decode (corrupt JPEG body) is, with skip_bad_records, replaced by the
         * next record in file order that decodes (at most SUBSTITUTE_TRIES tried): the batch keeps its
         * size and every sample its true label. The labels are published only once the batch is
         * produced (loader_peek_labels waits for it), so the class-center sampling sees the labels of
         * the images actually trained on. */
        int rc = 0;
        for (int a = 0; a <= SUBSTITUTE_TRIES; a++) {
            int64_t j = (idx + a) % l->rf->num_images;
            const rec_image *im = &l->rf->images[j];
            int flip = l->o.flip
                           ? (int)(img_hash64(l->o.seed, (uint64_t)l->epoch, (uint64_t)im->key, 0xf1ull) & 1)
                           : 0;
            rec_payload p;
            rc = rec_get(l->rf, j, buf, &p);
            if (rc == 0) {
                rc = img_load(dec, p.image, p.image_len, S, l->o.resize, flip, img);
                if (rc < 0)
                    rc = pf_err_wrap(rc, "%s: key %" PRId64 " at byte %" PRIu64, l->rf->rec_path, im->key,
                                     im->offset);
            }
            if (rc == 0) {
                b->keys[i] = im->key;
                b->flips[i] = (uint8_t)flip;
                b->labels[i] = im->class_id;
                break;
            }
            if (!l->o.skip_bad_records)
                return rc;
            int64_t n = __atomic_fetch_add(&l->skipped_decode, 1, __ATOMIC_RELAXED);
            if (n < 10)
                log_warn("skipping bad image (the next record in file order takes its place): %s",
                         pf_errmsg());
        }
        if (rc < 0)
            return pf_err_wrap(rc, "%s: %d consecutive records from key %" PRId64 " fail to decode",
                               l->rf->rec_path, SUBSTITUTE_TRIES + 1, l->rf->images[idx].key);
    }
    return 0;
}

static void *worker_main(void *arg)
{
    loader *l = arg;
    img_decoder dec;
    rec_buf buf = {0};
    int ok = img_decoder_init(&dec) == 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && (!l->active || l->next_claim >= l->nb ||
                            l->slots[l->next_claim % l->depth].state != SLOT_FREE))
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop)
            break;
        int64_t bi = l->next_claim++;
        slot *s = &l->slots[bi % l->depth];
        s->state = SLOT_BUSY;
        pthread_mutex_unlock(&l->mu);
        int rc = ok ? produce(l, bi, s, &dec, &buf) : pf_err(-ENOMEM, "TurboJPEG handle");
        pthread_mutex_lock(&l->mu);
        s->rc = rc;
        if (rc < 0)
            snprintf(s->msg, sizeof s->msg, "%s", pf_errmsg());
        s->state = SLOT_READY;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    if (ok)
        img_decoder_free(&dec);
    rec_buf_free(&buf);
    return NULL;
}

void loader_close(loader *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    free(l->threads);
    if (l->slots)
        for (int i = 0; i < l->depth; i++) {
            free(l->slots[i].b.images);
            free(l->slots[i].b.labels);
            free(l->slots[i].b.keys);
            free(l->slots[i].b.flips);
        }
    free(l->slots);
    free(l->order);
    free(l->one_image);
    if (l->sync_dec.tj)
        img_decoder_free(&l->sync_dec);
    rec_buf_free(&l->sync_buf);
    rec_close(l->rf);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

int loader_open(loader **out, const loader_opts *o)
{
    *out = NULL;
    if (!o->rec || !o->rec[0])
        return pf_err(-EINVAL, "loader: rec is not set (a dataset prefix or \"synthetic\")");
    if (o->batch_size <= 0)
        return pf_err(-EINVAL, "loader: batch_size %d is not positive", o->batch_size);
    if (o->world_size <= 0 || o->rank < 0 || o->rank >= o->world_size)
        return pf_err(-EINVAL, "loader: rank %d is outside world_size %d", o->rank, o->world_size);
    if (o->num_workers < 0 || o->num_workers > 256)
        return pf_err(-EINVAL, "loader: num_workers %d is outside 0..256", o->num_workers);
    if (o->image_size <= 0 || o->image_size > 1024)
        return pf_err(-EINVAL, "loader: image_size %d is outside 1..1024", o->image_size);
    loader *l = calloc(1, sizeof *l);
    if (!l)
        return pf_err(-ENOMEM, "out of memory");
    l->o = *o;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int rc = 0;
    l->synthetic = strcmp(o->rec, "synthetic") == 0;
    if (l->synthetic) {
        if (o->num_classes <= 0 || o->num_classes > (INT64_C(1) << 32)) {
            rc = pf_err(-EINVAL, "loader: synthetic data needs num_classes in 1..2^32, got %" PRId64,
                        o->num_classes);
            goto fail;
        }
        if (o->num_image <= 0) {
            rc = pf_err(-EINVAL, "loader: num_image %" PRId64 " is not positive", o->num_image);
            goto fail;
        }
        if (!o->synthetic_varied && o->num_classes <= ARCFACE_SYNTHETIC_LABEL) {
            rc = pf_err(-EINVAL,
                        "loader: synthetic = arcface_torch labels every sample %d, which needs num_classes >= %d, "
                        "got %" PRId64 " (synthetic = varied draws labels below num_classes)",
                        ARCFACE_SYNTHETIC_LABEL, ARCFACE_SYNTHETIC_LABEL + 1, o->num_classes);
            goto fail;
        }
        l->num_images = o->synthetic_varied ? o->num_image : ARCFACE_SYNTHETIC_IMAGES;
        l->num_classes = o->num_classes;
        size_t n = (size_t)3 * o->image_size * o->image_size;
        if (!o->synthetic_varied) {
            if (!(l->one_image = malloc(n * sizeof(float)))) {
                rc = pf_err(-ENOMEM, "out of memory");
                goto fail;
            }
            synthetic_one_image(l->one_image, n, o->seed);
        }
    } else {
        rc = rec_open(&l->rf, o->rec, o->num_classes, o->skip_bad_records);
        if (rc < 0)
            goto fail;
        l->num_images = l->rf->num_images;
        l->num_classes = l->rf->num_classes;
    }
    /* arcface_torch's loader length: DistributedSampler gives each rank ceil(N / W) samples (the permutation
     * padded by repeating its start), DataLoader(drop_last=True) makes floor(that / B) batches of them. */
    l->nb = (l->num_images + o->world_size - 1) / o->world_size / o->batch_size;
    if (l->nb == 0) {
        rc = pf_err(-EINVAL,
                    "loader: %" PRId64 " images give each of world_size %d ranks %" PRId64
                    " samples, less than one batch of batch_size %d",
                    l->num_images, o->world_size, (l->num_images + o->world_size - 1) / o->world_size,
                    o->batch_size);
        goto fail;
    }
    l->image_floats = (size_t)3 * o->image_size * o->image_size;
    l->depth = o->prefetch > 0 ? o->prefetch : 2 * (o->num_workers > 0 ? o->num_workers : 1);
    if (l->depth < 2)
        l->depth = 2; /* the caller holds one batch while the next is decoded */
    if (o->num_workers == 0)
        l->depth = 2; /* the batch held and the next one, produced by a peek */
    l->slots = calloc((size_t)l->depth, sizeof *l->slots);
    l->order = malloc((size_t)(l->nb * o->batch_size) * sizeof *l->order);
    if (!l->slots || !l->order) {
        rc = pf_err(-ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < l->depth; i++) {
        slot *s = &l->slots[i];
        s->b.slot = i;
        s->b.images = malloc(l->image_floats * (size_t)o->batch_size * sizeof(float));
        s->b.labels = malloc((size_t)o->batch_size * sizeof(int64_t));
        s->b.keys = malloc((size_t)o->batch_size * sizeof(int64_t));
        s->b.flips = malloc((size_t)o->batch_size);
        if (!s->b.images || !s->b.labels || !s->b.keys || !s->b.flips) {
            rc = pf_err(-ENOMEM, "out of memory for batches");
            goto fail;
        }
    }
    if (o->num_workers == 0) {
        rc = img_decoder_init(&l->sync_dec);
        if (rc < 0)
            goto fail;
    } else {
        l->threads = calloc((size_t)o->num_workers, sizeof *l->threads);
        if (!l->threads) {
            rc = pf_err(-ENOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < o->num_workers; i++) {
            if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) {
                rc = pf_err(-EAGAIN, "loader: cannot start decode thread %d", i);
                goto fail;
            }
            l->nthreads++;
        }
    }
    l->epoch = -1;
    *out = l;
    return 0;
fail : {
    char msg[PF_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", pf_errmsg());
    loader_close(l);
    pf_err(rc, "%s", msg);
}
    return rc;
}

int loader_start_epoch(loader *l, int64_t epoch)
{
    return loader_start_epoch_at(l, epoch, 0);
}

int loader_start_epoch_at(loader *l, int64_t epoch, int64_t first_batch)
{
    if (first_batch < 0 || first_batch > l->nb)
        return pf_err(-ERANGE, "batch %lld of epoch %lld is outside [0, %lld]", (long long)first_batch,
                      (long long)epoch, (long long)l->nb);
    pthread_mutex_lock(&l->mu);
    l->active = 0;
    for (;;) {
        int busy = 0;
        for (int i = 0; i < l->depth; i++)
            busy |= l->slots[i].state == SLOT_BUSY;
        if (!busy)
            break;
        pthread_cond_wait(&l->cv, &l->mu);
    }
    for (int i = 0; i < l->depth; i++)
        l->slots[i].state = SLOT_FREE;
    pthread_mutex_unlock(&l->mu);
    /* Threads are idle (inactive): the order can be rewritten without the lock held. */
    int rc = loader_epoch_order(l, epoch, l->order);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&l->mu);
    l->epoch = epoch;
    l->next_claim = l->next_deliver = first_batch;
    l->active = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

/* Waits (lock held) until batch bi of the epoch is produced in its slot; returns that slot. */
static slot *wait_ready(loader *l, int64_t bi)
{
    slot *s = &l->slots[bi % l->depth];
    while (!(s->state == SLOT_READY && s->b.index == bi && s->b.epoch == l->epoch))
        pthread_cond_wait(&l->cv, &l->mu);
    return s;
}

/* Produces batch next_deliver now (num_workers == 0), once: peek and next share the result. */
static int produce_sync(loader *l, slot *s)
{
    int64_t bi = l->next_deliver;
    if (s->state == SLOT_READY && s->b.index == bi && s->b.epoch == l->epoch)
        return s->rc;
    s->rc = produce(l, bi, s, &l->sync_dec, &l->sync_buf);
    if (s->rc < 0)
        snprintf(s->msg, sizeof s->msg, "%s", pf_errmsg());
    s->b.index = bi;
    s->b.epoch = l->epoch;
    s->state = SLOT_READY;
    return s->rc;
}

int loader_peek_labels(loader *l, int64_t *labels)
{
    if (l->epoch < 0 || l->next_deliver >= l->nb)
        return 0;
    int B = l->o.batch_size;
    slot *s = &l->slots[l->next_deliver % l->depth];
    if (l->o.num_workers == 0) {
        if (s->state == SLOT_HELD)
            s->state = SLOT_FREE; /* as loader_next: the batch two back is released */
        if (produce_sync(l, s) < 0)
            return pf_err(s->rc, "%s", s->msg);
        memcpy(labels, s->b.labels, (size_t)B * sizeof *labels);
        return 1;
    }
    pthread_mutex_lock(&l->mu);
    if (s->state == SLOT_HELD) {
        pthread_mutex_unlock(&l->mu);
        return pf_err(-EBUSY, "loader: %d batches held; loader_release one before loader_peek_labels",
                      l->depth);
    }
    s = wait_ready(l, l->next_deliver);
    int rc = s->rc;
    if (rc < 0)
        pf_err(rc, "%s", s->msg);
    else
        memcpy(labels, s->b.labels, (size_t)B * sizeof *labels);
    pthread_mutex_unlock(&l->mu);
    return rc < 0 ? rc : 1;
}

int loader_next(loader *l, loader_batch **out)
{
    *out = NULL;
    if (l->epoch < 0)
        return pf_err(-EINVAL, "loader: loader_start_epoch was not called");
    if (l->next_deliver >= l->nb)
        return 0;
    int64_t bi = l->next_deliver;
    slot *s = &l->slots[bi % l->depth];
    if (l->o.num_workers == 0) {
        if (s->state == SLOT_HELD)
            s->state = SLOT_FREE;
        if (produce_sync(l, s) < 0)
            return pf_err(s->rc, "%s", s->msg);
        s->state = SLOT_HELD;
        l->next_deliver++;
        *out = &s->b;
        return 1;
    }
    pthread_mutex_lock(&l->mu);
    if (s->state == SLOT_HELD) {
        pthread_mutex_unlock(&l->mu);
        return pf_err(-EBUSY, "loader: %d batches held; loader_release one before loader_next", l->depth);
    }
    s = wait_ready(l, bi);
    int rc = s->rc;
    if (rc < 0) {
        /* The batch stays READY with its error: the epoch cannot go on past a bad record. */
        pf_err(rc, "%s", s->msg);
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    s->state = SLOT_HELD;
    l->next_deliver++;
    pthread_mutex_unlock(&l->mu);
    *out = &s->b;
    return 1;
}

void loader_release(loader *l, loader_batch *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&l->mu);
    slot *s = &l->slots[b->slot];
    if (s->state == SLOT_HELD)
        s->state = SLOT_FREE;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}
