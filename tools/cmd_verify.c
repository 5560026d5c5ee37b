/* `pfcps verify`: arcface_torch's verification of a backbone checkpoint on a pair set (usage in
 * tools/commands.h; the set readers and the protocol are worker/eval/set.h), or of one of two baselines
 * in place of the checkpoint (SET is then the only argument):
 *   --init NETWORK:D[:SEED]  the untrained network as training starts it (model_init(SEED), SEED default
 *                            2048 as the config key `seed`; eval_model_init);
 *   --pixels                 raw pixels: each image's preprocessed 3x112x112 input is its embedding
 *                            (eval_verify_pixels).
 * The output lines are the same for all three. */
#include "tools/commands.h"

#include "common/clock.h"
#include "common/err.h"
#include "tools/opts.h"
#include "worker/eval/set.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NETWORK:D[:SEED] -> net (room for 32 chars + NUL), *d, *seed (2048 when absent). */
static int parse_init(const char *spec, char net[33], int *d, uint64_t *seed)
{
    const char *c1 = strchr(spec, ':');
    char *end = NULL;
    if (!c1 || c1 == spec || c1 - spec > 32)
        goto bad;
    memcpy(net, spec, (size_t)(c1 - spec));
    net[c1 - spec] = 0;
    errno = 0;
    long x = strtol(c1 + 1, &end, 10);
    if (errno || end == c1 + 1 || x < 1 || x > (1 << 20) || (*end && *end != ':'))
        goto bad;
    *d = (int)x;
    *seed = 2048;
    if (*end == ':') {
        const char *sv = end + 1;
        errno = 0;
        unsigned long long sd = strtoull(sv, &end, 10);
        if (errno || end == sv || *end || *sv == '-')
            goto bad;
        *seed = (uint64_t)sd;
    }
    return 0;
bad:
    fprintf(stderr, "pfcps verify: --init needs NETWORK:D[:SEED] (e.g. r18_w16:128:2048), got '%s'\n", spec);
    return -1;
}

int cmd_verify(int argc, char **argv)
{
    eval_embed_opts o = {.batch = 32, .flip = 1};
    const char *device = "cpu", *images = NULL, *pos[2], *init = NULL;
    int npos = 0, folds = 10, pixels = 0, init_d = 0, k;
    char init_net[33] = {0};
    uint64_t init_seed = 0;
    enum { PIXELS, INIT, NO_FLIP, PAD, FOLDS, BATCH, IMAGES, DEVICE };
    static const tool_opt opts[] = {{"--pixels", 0}, {"--init", 1},   {"--no-flip", 0},
                                    {"--pad", 0},    {"--folds", 1},  {"--batch", 1},
                                    {"--images", 1}, {"--device", 1}, {NULL, 0}};
    tool_args a;
    tool_args_init(&a, "verify", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        if ((k == INIT || k == IMAGES || k == DEVICE) && !a.arg) {
            fprintf(stderr, "pfcps verify: %s needs a value\n", a.opt);
            return 2;
        }
        if (k == PIXELS)
            pixels = 1;
        else if (k == INIT) {
            init = a.arg;
            if (parse_init(init, init_net, &init_d, &init_seed) < 0)
                return 2;
        } else if (k == NO_FLIP)
            o.flip = 0;
        else if (k == PAD)
            o.pad = 1;
        else if (k == FOLDS) {
            if (tool_opt_int(&a, 1, EVAL_MAX_FOLDS, NULL, &folds) < 0)
                return 2;
        } else if (k == BATCH) {
            if (tool_opt_int(&a, 1, 1024, NULL, &o.batch) < 0)
                return 2;
        } else if (k == IMAGES)
            images = a.arg;
        else if (k == DEVICE)
            device = a.arg;
        else if (k == TOOL_UNKNOWN || npos == 2)
            return tool_unexpected(&a, k == TOOL_UNKNOWN ? a.opt : a.arg, NULL);
        else
            pos[npos++] = a.arg;
    }
    if (init && pixels) {
        fprintf(stderr, "pfcps verify: --init and --pixels are two baselines: give one\n");
        return 2;
    }
    int baseline = init || pixels;
    if (npos != 2 - baseline) {
        fprintf(stderr,
                baseline ? "pfcps verify: with %s, needs SET only (no checkpoint)\n"
                         : "pfcps verify: needs CKPT and SET\n",
                init ? "--init" : "--pixels");
        return 2;
    }
    const char *set_path = pos[1 - baseline];
    const ops_device *dev = ops_device_by_name(device);
    if (!dev) {
        fprintf(stderr, "pfcps verify: --device '%s' is not a device of this build\n", device);
        return 2;
    }
    eval_set s;
    model *m = NULL;
    int rc = eval_set_open(&s, set_path, images);
    if (rc) {
        fprintf(stderr, "pfcps verify: %s\n", pf_errmsg());
        return rc == -EINVAL ? 2 : 1;
    }
    if (folds > s.n_pairs) {
        fprintf(stderr, "pfcps verify: --folds %d is more than the set's %" PRId64 " pairs\n", folds,
                s.n_pairs);
        eval_set_free(&s);
        return 2;
    }
    char what[160];
    if (pixels)
        snprintf(what, sizeof what, "raw pixels (D %d: the preprocessed 3x112x112 input)", EVAL_PIXELS_D);
    else {
        if ((rc = init ? eval_model_init(&m, init_net, init_d, init_seed, o.batch, dev)
                       : eval_model_open(&m, pos[0], o.batch, dev)))
            goto fail;
        const model_desc *desc = model_get_desc(m);
        snprintf(what, sizeof what, "%s%s (D %d)", init ? "untrained " : "", desc->name,
                 desc->embedding_size);
        if (init)
            snprintf(what + strlen(what), sizeof what - strlen(what), ", model_init seed %" PRIu64,
                     init_seed);
    }
    fprintf(stderr, "pfcps verify: %s: %" PRId64 " pairs (%s), %s on %s, %s, %d folds\n", s.name, s.n_pairs,
            s.is_bin ? ".bin set" : "pairs file", what, pixels ? "cpu" : dev->name,
            o.flip ? "image + flip" : "no flip", folds);
    eval_progress ps = {.what = "pfcps verify", .t0 = pf_now_s()};
    o.progress = eval_progress_stderr;
    o.progress_arg = &ps;
    eval_result r;
    int64_t refit = 0;
    if ((rc = pixels ? eval_verify_pixels(&s, &o, folds, &r, &refit)
                     : eval_verify_model(m, &s, &o, folds, &r, &refit)))
        goto fail;
    if (refit)
        printf("[%s] note: %" PRId64 " of %" PRId64 " images were not 112x112 and were %s to 112x112\n",
               s.name, refit, 2 * s.n_pairs,
               o.pad ? "padded (scaled down only, aspect kept)" : "resized (bilinear)");
    printf("[%s] pairs: %" PRId64 " (%d folds)\n", s.name, s.n_pairs, folds);
    printf("[%s] XNorm: %f\n", s.name, r.xnorm);
    printf("[%s] %s: %1.5f+-%1.5f\n", s.name, o.flip ? "Accuracy-Flip" : "Accuracy", r.acc_mean, r.acc_std);
    printf("[%s] Best-Threshold: %.2f (mean over folds; per fold:", s.name, r.threshold_mean);
    for (int f = 0; f < r.folds; f++)
        printf(" %.2f", r.fold_threshold[f]);
    printf(")\n");
    model_free(m);
    eval_set_free(&s);
    return 0;
fail:
    fprintf(stderr, "pfcps verify: %s\n", pf_errmsg());
    model_free(m);
    eval_set_free(&s);
    return 1;
}
