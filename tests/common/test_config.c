/* Config: defaults, file + --set overrides, every validation error's message, the INI round trip,
 * the startup dump format and the shared command-line parser. Expected values are written here by
 * hand from common/config.h and docs/configuration.md, never read back from the code under test. */
#include "common/cli.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static const char *write_file(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_defaults(void **state)
{
    (void)state;
    pf_config c;
    cfg_defaults(&c);
    assert_string_equal(c.network, "r50");
    assert_int_equal(c.embedding_size, 512);
    assert_true(c.sample_rate == 1.0);
    assert_true(c.margin_list[0] == 1.0 && c.margin_list[1] == 0.5 && c.margin_list[2] == 0.0);
    assert_true(c.scale == 64.0);
    assert_true(c.interclass_filtering_threshold == 0.0);
    assert_string_equal(c.margin_grad, "straight_through"); /* arcface_torch's margin under no_grad */
    assert_string_equal(c.pfc_update, "dense"); /* PartialFC_V2: SGD over the whole table every step */
    assert_int_equal(c.fp16, 0);
    assert_string_equal(c.device, "cpu");
    assert_string_equal(c.optimizer, "sgd");
    assert_true(c.lr == 0.1 && c.momentum == 0.9 && c.weight_decay == 5e-4);
    assert_int_equal(c.batch_size, 128);
    assert_int_equal(c.num_classes, 0);
    assert_int_equal(c.num_image, 0);
    assert_int_equal(c.num_epoch, 20);
    assert_true(c.warmup_epoch == 0.0);
    assert_string_equal(c.lr_scheduler, "polynomial_lr_warmup"); /* train_v2.py's PolynomialLRWarmup */
    assert_string_equal(c.rec, "");
    assert_int_equal(c.frequent, 10);
    assert_int_equal(c.verbose, 2000);
    assert_string_equal(c.output, "work_dirs/pfcps");
    assert_int_equal(c.seed, 2048);
    assert_int_equal(c.num_workers, 2);
    assert_int_equal(c.resume + c.save_all_states + c.skip_bad_records, 0);
    assert_int_equal(c.servers, 1);
    assert_int_equal(c.workers, 1);
    assert_string_equal(c.provider, "tcp");
    assert_string_equal(c.rendezvous, "127.0.0.1:29500");
    assert_string_equal(c.wire_dtype, "fp32");
    assert_int_equal(c.max_staleness, 0);
    assert_string_equal(c.head_mode, "global");
    assert_string_equal(c.secret, "");
    assert_int_equal(c.ctl_max_frame, 1 << 20);
    assert_true(c.ctl_timeout == 30.0);
    assert_string_equal(c.snapshot_dir, "");
    assert_int_equal(c.snapshot_every, 0);
    assert_int_equal(c.apply_threads, 2);
    /* Defaults alone miss the two required keys. */
    assert_int_equal(cfg_validate(&c), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "num_classes"));
    assert_int_equal(cfg_validate_ranges(&c), 0);
}

static void test_file_and_overrides(void **state)
{
    (void)state;
    const char *path = write_file("ok.ini", "; an arcface_torch-like config\n"
                                            "[train]\n"
                                            "network = \"r100\"\n"
                                            "embedding_size = 256   ; inline comment\n"
                                            "margin_list = (1.0, 0.0, 0.4)\n"
                                            "sample_rate = 0.2\n"
                                            "fp16 = True\n"
                                            "num_classes = 93431\n"
                                            "lr = 0.02\n"
                                            "[data]\n"
                                            "rec = /data/ms1m\n"
                                            "# another comment style\n"
                                            "[cluster]\n"
                                            "servers = 4\n"
                                            "workers = 8\n"
                                            "wire_dtype = bf16\n"
                                            "head_mode = local\n");
    const char *sets[] = {"lr=0.5", " batch_size = 64", "servers=2", "margin_list=1,0.5,0"};
    pf_config c;
    assert_int_equal(cfg_load(&c, path, sets, 4), 0);
    assert_string_equal(c.network, "r100");
    assert_int_equal(c.embedding_size, 256);
    assert_true(c.margin_list[0] == 1.0 && c.margin_list[1] == 0.5 && c.margin_list[2] == 0.0);
    assert_true(c.sample_rate == 0.2);
    assert_int_equal(c.fp16, 1);
    assert_int_equal(c.num_classes, 93431);
    assert_true(c.lr == 0.5); /* --set wins over the file */
    assert_int_equal(c.batch_size, 64);
    assert_string_equal(c.rec, "/data/ms1m");
    assert_int_equal(c.servers, 2);
    assert_int_equal(c.workers, 8);
    assert_string_equal(c.wire_dtype, "bf16");
    assert_string_equal(c.head_mode, "local");
    assert_int_equal(c.num_epoch, 20); /* untouched keys keep their defaults */

    /* Only overrides, no file. */
    const char *sets2[] = {"num_classes=10", "rec=synthetic", "device=cuda"};
    assert_int_equal(cfg_load(&c, NULL, sets2, 3), 0);
    assert_int_equal(c.num_classes, 10);
    assert_string_equal(c.device, "cuda");
}

typedef struct bad_case {
    const char *ini; /* file body, or NULL for a --set case */
    const char *set; /* --set value */
    int code;
    const char *want[3]; /* substrings the message must contain */
} bad_case;

#define BASE "num_classes = 100\nrec = synthetic\n"

static const bad_case bad_cases[] = {
    {BASE "sampel_rate = 0.5\n",
     NULL,
     -EINVAL,
     {"bad.ini:3", "unknown key 'sampel_rate'", "did you mean 'sample_rate'"}},
    {BASE "[train]\nembeding_size = 5\n",
     NULL,
     -EINVAL,
     {"bad.ini:4", "'embeding_size'", "did you mean 'embedding_size'"}},
    {BASE "zzqqxx = 1\n", NULL, -EINVAL, {"unknown key 'zzqqxx'", NULL, NULL}},
    {BASE "embedding_size = abc\n", NULL, -EINVAL, {"embedding_size", "not an integer", NULL}},
    {BASE "embedding_size = 0\n", NULL, -ERANGE, {"embedding_size", "out of range", NULL}},
    {BASE "batch_size = 12.5\n", NULL, -EINVAL, {"batch_size", "not an integer", NULL}},
    {BASE "sample_rate = -0.1\n", NULL, -ERANGE, {"sample_rate", "out of range", "[0, 1]"}},
    {BASE "sample_rate = 1.5\n", NULL, -ERANGE, {"sample_rate", "out of range", NULL}},
    {BASE "lr = fast\n", NULL, -EINVAL, {"lr", "not a (finite) number", NULL}},
    {BASE "lr = 1e999\n", NULL, -EINVAL, {"lr", "not a (finite) number", NULL}},
    {BASE "fp16 = maybe\n", NULL, -EINVAL, {"fp16", "not a boolean", NULL}},
    {BASE "fp16 = true\nbf16 = true\n", NULL, -EINVAL, {"'fp16' and 'bf16' are both true", NULL, NULL}},
    {BASE "device = gpu\n", NULL, -EINVAL, {"device", "'gpu'", "cpu cuda cpu-fenced cpu-bf16"}},
    {BASE "margin_list = 1.0, 0.5\n", NULL, -EINVAL, {"margin_list", "exactly 3 numbers", NULL}},
    {BASE "margin_list = 1.0, x, 0.0\n", NULL, -EINVAL, {"margin_list", "'x'", "not a number"}},
    {BASE "margin_list = 1, 0.5, 0, 7\n", NULL, -EINVAL, {"margin_list", "exactly 3", NULL}},
    {BASE "margin_list = 1.35, 0.0, 0.0\n",
     NULL,
     -EINVAL,
     {"'margin_list': (1.35, 0, 0)", "m1 must be 1", "margin_combine = full"}},
    {BASE "servers = 0\n", NULL, -ERANGE, {"servers", "out of range", NULL}},
    {BASE "workers = -1\n", NULL, -ERANGE, {"workers", "out of range", NULL}},
    /* Below 1 s every scheduling hiccup would count as a lost member. */
    {BASE "[cluster]\nctl_timeout = 0.5\n", NULL, -ERANGE, {"ctl_timeout", "out of range", "[1, 86400]"}},
    {BASE "[cluster]\njoin_timeout = 0\n", NULL, -ERANGE, {"join_timeout", "out of range", "(0, 86400]"}},
    {BASE "wire_dtype = fp8\n", NULL, -EINVAL, {"wire_dtype", "'fp8'", "fp32 fp16 bf16"}},
    {BASE "head_mode = both\n", NULL, -EINVAL, {"head_mode", "global local", NULL}},
    {BASE "provider = udp\n", NULL, -EINVAL, {"provider", "tcp shm verbs", NULL}},
    {BASE "optimizer = lamb\n", NULL, -EINVAL, {"optimizer", "sgd adamw", NULL}},
    {BASE "rendezvous = nohost\n", NULL, -EINVAL, {"rendezvous", "host:port", NULL}},
    {BASE "rendezvous = h:70000\n", NULL, -EINVAL, {"rendezvous", "host:port", NULL}},
    {BASE "momentum = 1\n", NULL, -ERANGE, {"momentum", "out of range", NULL}},
    {BASE "num_classes = -5\n", NULL, -ERANGE, {"num_classes", "out of range", NULL}},
    {BASE "network =\n", NULL, -EINVAL, {"network", "must not be empty", NULL}},
    {BASE "this line has no equals sign\n", NULL, -EINVAL, {"bad.ini:3", "syntax error", NULL}},
    {BASE "num_epoch = 2\nwarmup_epoch = 3\n", NULL, -ERANGE, {"warmup_epoch", "num_epoch", NULL}},
    {BASE "warmup_epoch = -2e6\n", NULL, -ERANGE, {"warmup_epoch", "out of range", NULL}},
    {BASE "lr_scheduler = cosine\n",
     NULL,
     -EINVAL,
     {"lr_scheduler", "'cosine'", "polynomial_lr_warmup poly_scheduler"}},
    {"rec = synthetic\nlr = 0.1\n", NULL, -EINVAL, {"missing required key 'num_classes'", NULL, NULL}},
    {"num_classes = 7\n", NULL, -EINVAL, {"missing required key 'rec'", NULL, NULL}},
    {NULL,
     "embeding_size=5",
     -EINVAL,
     {"--set embeding_size=5", "unknown key", "did you mean 'embedding_size'"}},
    {NULL, "lr", -EINVAL, {"--set lr", "expected key=value", NULL}},
    {NULL, "sample_rate=2", -ERANGE, {"--set sample_rate=2", "out of range", NULL}},
    {NULL, "wire_dtype=int8", -EINVAL, {"wire_dtype", "not one of", NULL}},
};

static void test_validation_errors(void **state)
{
    (void)state;
    int n = (int)(sizeof bad_cases / sizeof bad_cases[0]);
    for (int i = 0; i < n; i++) {
        const bad_case *b = &bad_cases[i];
        pf_config c;
        pf_err_clear();
        int rc;
        if (b->ini) {
            rc = cfg_load(&c, write_file("bad.ini", b->ini), NULL, 0);
        } else {
            const char *sets[] = {"num_classes=3", "rec=synthetic", b->set};
            rc = cfg_load(&c, NULL, sets, 3);
        }
        printf("case %2d: rc %d msg: %s\n", i, rc, pf_errmsg());
        assert_int_equal(rc, b->code);
        for (int k = 0; k < 3; k++)
            if (b->want[k] && !strstr(pf_errmsg(), b->want[k]))
                fail_msg("case %d: message '%s' lacks '%s'", i, pf_errmsg(), b->want[k]);
    }

    /* A missing file names the path. */
    pf_config c;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/does-not-exist.ini", tmpdir);
    assert_int_equal(cfg_load(&c, missing, NULL, 0), -ENOENT);
    assert_non_null(strstr(pf_errmsg(), "does-not-exist.ini"));

    /* A FIFO or a folder given as the config is refused at once, naming the path and its kind (a FIFO
     * opened for reading would otherwise wait for a writer). */
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/fifo.ini", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(cfg_load(&c, fifo, NULL, 0), -EIO);
    assert_non_null(strstr(pf_errmsg(), "fifo.ini: a FIFO, not a regular file"));
    assert_int_equal(cfg_load(&c, tmpdir, NULL, 0), -EIO);
    assert_non_null(strstr(pf_errmsg(), ": a directory, not a regular file"));
    unlink(fifo);

    /* A line the parser would have to split is refused with its number. */
    char *huge = malloc(6000);
    strcpy(huge, "num_classes = 1\nrec = x\n; ");
    size_t hl = strlen(huge);
    memset(huge + hl, 'z', 5000);
    strcpy(huge + hl + 5000, "\n");
    assert_int_equal(cfg_load(&c, write_file("huge.ini", huge), NULL, 0), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "huge.ini:3: line longer than"));
    free(huge);

    /* resume_run: 32 hex digits or nothing. */
    const char *bad_runs[] = {"resume_run=xyz", "resume_run=0123456789abcdef0123456789abcdeg",
                              "resume_run=0123456789abcdef0123456789abcdef0"};
    for (int i = 0; i < 3; i++) {
        const char *one[] = {"rec=x", "num_classes=10", "resume=true", bad_runs[i]};
        assert_int_equal(cfg_load(&c, NULL, one, 4), -EINVAL);
        assert_non_null(strstr(pf_errmsg(), "key 'resume_run'"));
        assert_non_null(strstr(pf_errmsg(), "is not a run id (32 hex digits"));
    }
    const char *no_resume[] = {"rec=x", "num_classes=10", "resume_run=0123456789ABCDEF0123456789abcdef"};
    assert_int_equal(cfg_load(&c, NULL, no_resume, 3), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "key 'resume_run' is set but resume = false"));
    const char *good_run[] = {"rec=x", "num_classes=10", "resume=true",
                              "resume_run=0123456789ABCDEF0123456789abcdef"};
    assert_int_equal(cfg_load(&c, NULL, good_run, 4), 0);
    assert_string_equal(c.resume_run, "0123456789ABCDEF0123456789abcdef");

    /* cfg_set refuses without changing the value. */
    cfg_defaults(&c);
    assert_int_equal(cfg_set(&c, "embedding_size", "-3"), -ERANGE);
    assert_int_equal(c.embedding_size, 512);
    assert_int_equal(cfg_set(&c, "margin_list", "1, 99, 0"), -ERANGE);
    assert_true(c.margin_list[1] == 0.5);
}

#define SAME_STR(f) assert_string_equal(a->f, b->f)
#define SAME_NUM(f) assert_true(a->f == b->f)

static void assert_same_config(const pf_config *a, const pf_config *b)
{
    SAME_STR(network);
    SAME_NUM(embedding_size);
    SAME_NUM(sample_rate);
    SAME_NUM(margin_list[0]);
    SAME_NUM(margin_list[1]);
    SAME_NUM(margin_list[2]);
    SAME_NUM(scale);
    SAME_NUM(interclass_filtering_threshold);
    SAME_STR(margin_grad);
    SAME_STR(pfc_update);
    SAME_NUM(fp16);
    SAME_NUM(bf16);
    SAME_STR(device);
    SAME_STR(optimizer);
    SAME_NUM(lr);
    SAME_NUM(momentum);
    SAME_NUM(weight_decay);
    SAME_NUM(batch_size);
    SAME_NUM(num_classes);
    SAME_NUM(num_image);
    SAME_NUM(num_epoch);
    SAME_NUM(warmup_epoch);
    SAME_STR(lr_scheduler);
    SAME_STR(rec);
    SAME_NUM(frequent);
    SAME_NUM(verbose);
    SAME_STR(output);
    SAME_NUM(seed);
    SAME_NUM(num_workers);
    SAME_NUM(resume);
    SAME_STR(resume_run);
    SAME_NUM(save_all_states);
    SAME_NUM(skip_bad_records);
    SAME_NUM(servers);
    SAME_NUM(workers);
    SAME_STR(provider);
    SAME_STR(rendezvous);
    SAME_STR(wire_dtype);
    SAME_NUM(max_staleness);
    SAME_STR(head_mode);
    SAME_NUM(ctl_max_frame);
    SAME_NUM(ctl_timeout);
    SAME_STR(snapshot_dir);
    SAME_NUM(snapshot_every);
    SAME_NUM(apply_threads);
}

static void test_round_trip(void **state)
{
    (void)state;
    const char *sets[] = {"num_classes=123456789012",
                          "rec=/data/with space/x",
                          "lr=0.30000000000000004",
                          "margin_list=1.0, 0.3, 0.2",
                          "sample_rate=0.1",
                          "lr_scheduler=poly_scheduler",
                          "margin_grad=exact",
                          "pfc_update=sparse",
                          "fp16=1",
                          "output=  \"quoted\"  ",
                          "wire_dtype=fp16",
                          "seed=9007199254740993",
                          "secret=s3cr3t-value",
                          "snapshot_dir=/tmp/snap",
                          "ctl_timeout=2.5",
                          "device=cuda",
                          "resume=yes"};
    pf_config a, b;
    assert_int_equal(cfg_load(&a, NULL, sets, 16), 0);
    assert_string_equal(a.lr_scheduler, "poly_scheduler");
    assert_string_equal(a.output, "quoted");
    assert_int_equal(a.seed, 9007199254740993LL);
    char *text = cfg_to_ini(&a);
    assert_non_null(text);
    assert_null(strstr(text, "s3cr3t-value")); /* the secret never travels in the config text */
    assert_non_null(strstr(text, "[cluster]"));
    assert_int_equal(cfg_load_text(&b, text), 0);
    assert_same_config(&a, &b);
    assert_string_equal(b.secret, "");
    /* The text is also a valid file. */
    assert_int_equal(cfg_load(&b, write_file("rt.ini", text), NULL, 0), 0);
    assert_same_config(&a, &b);
    /* A 255-character value that starts with a quote is written in quotes (257 characters on the line) and
     * must read back (found by fuzz_ctl_config: the reload refused it as longer than 255); 256 unquoted is
     * refused, as is 256 inside quotes. */
    char longv[300], set[320];
    memset(longv, 'x', 255);
    longv[0] = '"';
    longv[255] = '\0';
    snprintf(set, sizeof set, "rec=%s", longv);
    const char *lsets[] = {"num_classes=5", set};
    assert_int_equal(cfg_load(&a, NULL, lsets, 2), 0);
    assert_string_equal(a.rec, longv);
    char *ltext = cfg_to_ini(&a);
    assert_int_equal(cfg_load_text(&b, ltext), 0);
    assert_string_equal(b.rec, longv);
    free(ltext);
    memset(longv, 'y', 256);
    longv[256] = '\0';
    snprintf(set, sizeof set, "rec=%s", longv);
    assert_int_equal(cfg_load(&a, NULL, lsets, 2), -EINVAL);
    snprintf(set, sizeof set, "rec=\"%s\"", longv);
    assert_int_equal(cfg_load(&a, NULL, lsets, 2), -EINVAL);
    free(text);

    /* A string with a leading quote survives too. */
    const char *sets2[] = {"num_classes=1", "rec='odd"};
    assert_int_equal(cfg_load(&a, NULL, sets2, 2), 0);
    assert_string_equal(a.rec, "'odd");
    text = cfg_to_ini(&a);
    assert_int_equal(cfg_load_text(&b, text), 0);
    assert_string_equal(b.rec, "'odd");
    free(text);
    /* A 250-character value (above inih's default 200-byte line) survives the file and the text. */
    char longrec[300] = "rec=/";
    memset(longrec + 5, 'p', 249);
    longrec[254] = '\0';
    const char *sets3[] = {"num_classes=1", longrec};
    assert_int_equal(cfg_load(&a, NULL, sets3, 2), 0);
    assert_int_equal(strlen(a.rec), 250);
    text = cfg_to_ini(&a);
    assert_int_equal(cfg_load_text(&b, text), 0);
    assert_string_equal(b.rec, a.rec);
    assert_int_equal(cfg_load(&b, write_file("long.ini", text), NULL, 0), 0);
    assert_string_equal(b.rec, a.rec);
    free(text);
    /* A value over CFG_STR - 1 characters is refused, naming the key. */
    char toolong[400] = "rec=";
    memset(toolong + 4, 'q', 300);
    toolong[304] = '\0';
    const char *sets4[] = {"num_classes=1", toolong};
    assert_int_equal(cfg_load(&a, NULL, sets4, 2), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "key 'rec': value is longer than 255"));
    /* A value starting with ';' is written back so that it reads back as itself, not as a comment (a case
     * fuzz_ctl_config reaches); a rendezvous host of ";[:" is refused. */
    const char *sets5[] = {"num_classes=1", "rec=;x", "output=a;b"};
    assert_int_equal(cfg_load(&a, NULL, sets5, 3), 0);
    text = cfg_to_ini(&a);
    assert_int_equal(cfg_load_text(&b, text), 0);
    assert_string_equal(b.rec, ";x");
    assert_string_equal(b.output, "a;b");
    free(text);
    assert_int_equal(cfg_load_text(&b, "num_classes = 5\nrec = x\nrendezvous =;[::1\n"), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "rendezvous"));
    /* A value with ' ;' inside is accepted and written back in quotes, so it reads back whole. */
    assert_int_equal(cfg_set(&a, "rec", "a ;b"), 0);
    text = cfg_to_ini(&a);
    assert_non_null(strstr(text, "rec = \"a ;b\"\n"));
    assert_int_equal(cfg_load_text(&b, text), 0);
    assert_string_equal(b.rec, "a ;b");
    free(text);
    /* Indented lines are ordinary keys (not continuations of the previous value). */
    assert_int_equal(cfg_load(&b,
                              write_file("indent.ini", "[train]\n  num_classes = 9\n  lr = 0.25\n"
                                                       "[data]\n\trec = x\n"),
                              NULL, 0),
                     0);
    assert_int_equal(b.num_classes, 9);
    assert_true(b.lr == 0.25);
    assert_string_equal(b.rec, "x");
    /* Bad text gives a located error. */
    assert_int_equal(cfg_load_text(&b, "num_classes = 1\nrec = x\nservers = many\n"), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "<config text>:3"));
}

/* Config-level facts (warmup against num_epoch, the network's name, quoting) are checked by the config load
 * itself, so `pfcps config-get` and every daemon refuse a bad value at once, before the run forms. */
static void test_late_checks(void **state)
{
    (void)state;
    pf_config c;
    /* warmup_epoch = num_epoch: the lr schedule needs warmup shorter than training. */
    const char *eq[] = {"num_classes=1", "rec=x", "num_epoch=5", "warmup_epoch=5"};
    assert_int_equal(cfg_load(&c, NULL, eq, 4), -ERANGE);
    assert_string_equal(pf_errmsg(),
                        "key 'warmup_epoch': warmup 5 epochs is not shorter than num_epoch 5 (the "
                        "lr schedule needs warmup shorter than training)");
    /* ... also where the required keys may be missing (config-get, a member's own file), and from a file. */
    const char *path = write_file("warm.ini", "[train]\nwarmup_epoch = 20\n");
    assert_int_equal(cfg_load_ex(&c, path, NULL, 0, 0), -ERANGE);
    assert_non_null(strstr(pf_errmsg(), "warm.ini: key 'warmup_epoch': warmup 20 epochs is not shorter than "
                                        "num_epoch 20"));
    const char *ok[] = {"num_classes=1", "rec=x", "num_epoch=5", "warmup_epoch=4.5"};
    assert_int_equal(cfg_load(&c, NULL, ok, 4), 0);
    const char *one[] = {"num_classes=1", "rec=x", "num_epoch=1", "warmup_epoch=0"};
    assert_int_equal(cfg_load(&c, NULL, one, 4), 0);
    /* 3millions.py's warmup_epoch = -1 (no warmup in arcface_torch) loads. */
    const char *neg[] = {"num_classes=1", "rec=x", "num_epoch=1", "warmup_epoch=-1"};
    assert_int_equal(cfg_load(&c, NULL, neg, 4), 0);
    assert_true(c.warmup_epoch == -1.0);

    /* An unknown network, with the file and line; a bad width suffix; the names zoo.c accepts pass. */
    path = write_file("net.ini", "[train]\nnetwork = r19\n");
    assert_int_equal(cfg_load_ex(&c, path, NULL, 0, 0), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "net.ini:2: key 'network': unknown network 'r19' (known: r18 r34 r50 "
                                        "r100 r200, each optionally with a width suffix such as r18_w16, and "
                                        "mbf)"));
    assert_int_equal(cfg_set(&c, "network", "r18_w7"), -EINVAL);
    assert_string_equal(
        pf_errmsg(), "key 'network': network 'r18_w7': width suffix _w7 is not an even number in [2, 512]");
    const char *good[] = {"r18",       "r34",    "r50",         "r100", "r200",
                          "iresnet50", "r18_w8", "\"r18_w16\"", "mbf",  "mobilefacenet"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        assert_int_equal(cfg_set(&c, "network", good[i]), 0);
    assert_int_equal(cfg_set(&c, "network", "resnet50"), -EINVAL);
    assert_int_equal(cfg_set(&c, "network", "mbf_w16"), -EINVAL);

    /* A quoted value keeps its ' ;' (it does not start a comment inside the quotes); a comment may follow. */
    path = write_file("quoted.ini", "num_classes = 1\nrec = x\noutput = \"/tmp/a ;b\" ; where it goes\n"
                                    "pretrained = '/m ;1.ckpt'\nval_targets = lfw ; a comment\n"
                                    "snapshot_dir = ; none\n");
    assert_int_equal(cfg_load(&c, path, NULL, 0), 0);
    assert_string_equal(c.output, "/tmp/a ;b");
    assert_string_equal(c.pretrained, "/m ;1.ckpt");
    assert_string_equal(c.val_targets, "lfw");
    assert_string_equal(c.snapshot_dir, "");
    char *text = cfg_to_ini(&c);
    pf_config b;
    assert_int_equal(cfg_load_text(&b, text), 0);
    assert_string_equal(b.output, "/tmp/a ;b");
    assert_string_equal(b.pretrained, "/m ;1.ckpt");
    free(text);
    /* Unquoted, ' ;' starts a comment as before; a quote inside a quoted value stays. */
    path = write_file("bare.ini", "num_classes = 1\nrec = x\noutput = /tmp/a ;b\nval_targets = \"a\"b\"\n");
    assert_int_equal(cfg_load(&c, path, NULL, 0), 0);
    assert_string_equal(c.output, "/tmp/a");
    assert_string_equal(c.val_targets, "a\"b");
    /* Text after a closing quote that is not a comment: the value is read as written, quotes and all. */
    path = write_file("tail.ini", "num_classes = 1\nrec = x\noutput = \"/tmp/a\"b\n");
    assert_int_equal(cfg_load(&c, path, NULL, 0), 0);
    assert_string_equal(c.output, "\"/tmp/a\"b");
    /* A value no quoting can write back (' ;' and both quotes, each followed by a comment) is refused. */
    assert_int_equal(cfg_set(&c, "output", "a\" ;x' ;y"), -EINVAL);
    assert_string_equal(pf_errmsg(),
                        "key 'output': value contains ' ;' (which INI reads as a comment) and both "
                        "kinds of quote: it cannot be written back");
}

static void test_log_format(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/log.txt", tmpdir);
    pf_config c;
    cfg_defaults(&c);
    strcpy(c.secret, "hidden");
    assert_int_equal(log_open_file(path), 0);
    cfg_log(&c);
    log_close_file();
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    int lines = 0, seen_net = 0, seen_emb = 0, seen_long = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        assert_null(strstr(line, "hidden"));
        /* ": " + key + (25 - len(key)) spaces + value, as arcface_torch's train.py prints it. */
        if (strstr(line, " INFO : network                  r50\n"))
            seen_net = 1;
        if (strstr(line, " INFO : embedding_size           512\n"))
            seen_emb = 1;
        if (strstr(line, " INFO : interclass_filtering_threshold 0\n"))
            seen_long = 1;
    }
    fclose(f);
    printf("cfg_log wrote %d lines\n", lines);
    assert_int_equal(lines, cfg_key_count());
    assert_true(seen_net && seen_emb && seen_long);
}

static void test_cli(void **state)
{
    (void)state;
    const char *path = write_file("cli.ini", "num_classes = 50\nrec = synthetic\nlr = 0.2\n");
    char a0[] = "prog", a1[] = "--rank", a2[] = "2", a3[] = "--config", a5[] = "--set", a6[] = "lr=0.7",
         a7[] = "-s", a8[] = "batch_size=8", a9[] = "extra", a10[] = "--set=workers=3";
    char a4[512];
    snprintf(a4, sizeof a4, "%s", path);
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, NULL};
    pf_config c;
    int rest = -1;
    assert_int_equal(cli_parse_common(11, argv, &c, NULL, 0, &rest), 0);
    assert_int_equal(rest, 4);
    assert_string_equal(argv[0], "prog");
    assert_string_equal(argv[1], "--rank");
    assert_string_equal(argv[2], "2");
    assert_string_equal(argv[3], "extra");
    assert_null(argv[4]);
    assert_true(c.lr == 0.7);
    assert_int_equal(c.batch_size, 8);
    assert_int_equal(c.workers, 3);
    assert_int_equal(c.num_classes, 50);

    char b0[] = "prog", b1[] = "--set";
    char *argv2[] = {b0, b1, NULL};
    assert_int_equal(cli_parse_common(2, argv2, &c, NULL, 0, &rest), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "--set needs key=value"));

    char c0[] = "prog", c1[] = "-c", c2[] = "x.ini", c3[] = "--config=y.ini";
    char *argv3[] = {c0, c1, c2, c3, NULL};
    assert_int_equal(cli_parse_common(4, argv3, &c, NULL, 0, &rest), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "--config given twice"));

    /* Without required keys: refused, unless the caller takes the config from the rendezvous. */
    char d0[] = "prog", d1[] = "--set", d2[] = "servers=2";
    char *argv4[] = {d0, d1, d2, NULL};
    assert_int_equal(cli_parse_common(3, argv4, &c, NULL, 0, &rest), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "missing required key 'num_classes'"));
    char *argv5[] = {d0, d1, d2, NULL};
    assert_int_equal(cli_parse_common(3, argv5, &c, NULL, CLI_CONFIG_OPTIONAL, &rest), 0);
    assert_int_equal(c.servers, 2);
    assert_int_equal(rest, 1);
}

/* docs/configuration.md has a table row for every known key. */
/* cfg_replaces_workers: replicas = 1 and a device other than cuda, in either head mode; the reason otherwise.
 */
static void test_replaces_workers(void **state)
{
    (void)state;
    const struct {
        const char *sets[3];
        int yes;
        const char *why;
    } cases[] = {
        {{"replicas=1", "head_mode=global", "device=cpu"}, 1, ""},
        {{"replicas=1", "head_mode=local", "device=cpu"}, 1, ""},
        {{"replicas=0", "head_mode=global", "device=cpu"}, 0, "replicas = 0"},
        {{"replicas=1", "head_mode=local", "device=cuda"}, 0, "device = cuda"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *sets[6] = {"num_classes=10", "rec=synthetic",  "servers=2",
                               cases[i].sets[0], cases[i].sets[1], cases[i].sets[2]};
        pf_config c;
        assert_int_equal(cfg_load(&c, NULL, sets, 6), 0);
        char why[64] = "unset";
        assert_int_equal(cfg_replaces_workers(&c, why, sizeof why), cases[i].yes);
        assert_string_equal(why, cases[i].why);
    }
}

static void test_docs_list_every_key(void **state)
{
    (void)state;
    const char *src = getenv("PFCPS_SOURCE");
    if (!src)
        skip();
    char path[600];
    snprintf(path, sizeof path, "%s/docs/configuration.md", src);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *doc = NULL;
    size_t cap = 0;
    assert_true(getdelim(&doc, &cap, '\0', f) > 0);
    fclose(f);
    for (int i = 0; i < cfg_key_count(); i++) {
        char row[128];
        snprintf(row, sizeof row, "| `%s` |", cfg_key_name(i));
        if (!strstr(doc, row))
            fail_msg("docs/configuration.md has no row for key '%s'", cfg_key_name(i));
    }
    printf("docs/configuration.md documents all %d keys\n", cfg_key_count());
    free(doc);
}

/* cfg_diff: the keys two configs do not share, each with both values, in table order; skip and unset
 * filters; the secret never. */
static void test_diff(void **state)
{
    (void)state;
    pf_config a, b, def;
    cfg_defaults(&a);
    cfg_defaults(&b);
    cfg_defaults(&def);
    char out[512];
    assert_int_equal(cfg_diff(&a, &b, NULL, NULL, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(cfg_set(&a, "lr", "0.2"), 0);
    assert_int_equal(cfg_set(&b, "lr", "0.1"), 0);
    assert_int_equal(cfg_set(&a, "join_timeout", "90"), 0);
    assert_int_equal(cfg_set(&a, "secret", "one"), 0);
    assert_int_equal(cfg_set(&b, "secret", "two"), 0);
    assert_int_equal(cfg_set(&b, "num_epoch", "3"), 0);
    assert_int_equal(cfg_diff(&a, &b, NULL, NULL, out, sizeof out), 3);
    assert_string_equal(out, "lr = 0.2 (0.1), num_epoch = 20 (3), join_timeout = 90 (600)");
    /* member-local keys left out; a key a leaves at its default (num_epoch) left out with `unset` */
    assert_int_equal(cfg_diff(&a, &b, &def, cfg_member_local_keys, out, sizeof out), 1);
    assert_string_equal(out, "lr = 0.2 (0.1)");
    /* a short buffer is cut, the count stays whole */
    assert_int_equal(cfg_diff(&a, &b, NULL, NULL, out, 8), 3);
    assert_int_equal(strlen(out), 7);
}

/* cfg_keys_text / cfg_keys_text_diff: a worker's endpoint keys as text, compared with a run's config; lines
 * without " = " or of unknown keys skipped, a value that does not fit skipped, a short buffer cut. */
static void test_keys_text(void **state)
{
    (void)state;
    pf_config w, run;
    cfg_defaults(&w);
    cfg_defaults(&run);
    assert_int_equal(cfg_set(&w, "num_classes", "1000"), 0);
    assert_int_equal(cfg_set(&w, "embedding_size", "128"), 0);
    assert_int_equal(cfg_set(&run, "num_classes", "1000"), 0);
    assert_int_equal(cfg_set(&run, "embedding_size", "512"), 0);
    assert_int_equal(cfg_set(&run, "lr", "0.3"), 0); /* not an endpoint key */
    const char *const two[] = {"num_classes", "embedding_size", NULL};
    char text[256], out[256];
    assert_int_equal(cfg_keys_text(&w, two, text, sizeof text), 40);
    assert_string_equal(text, "num_classes = 1000\nembedding_size = 128\n");
    assert_int_equal(cfg_keys_text(&w, two, text, 20), -ENOSPC);
    const char *const bad[] = {"no_such_key", NULL};
    assert_int_equal(cfg_keys_text(&w, bad, text, sizeof text), -EINVAL);
    /* pfcps-worker's join list is pfcps.torch's (the data plane's) and then the device's keys */
    int nd = 0;
    for (; cfg_data_plane_keys[nd]; nd++)
        assert_string_equal(cfg_worker_endpoint_keys[nd], cfg_data_plane_keys[nd]);
    assert_int_equal(nd, 6);
    assert_string_equal(cfg_worker_endpoint_keys[nd], "device");
    assert_true(cfg_keys_text(&w, cfg_data_plane_keys, text, sizeof text) > 0);
    assert_int_equal(cfg_keys_text_diff(text, &run, out, sizeof out), 1);
    assert_string_equal(out, "embedding_size = 128 (512)");
    assert_true(cfg_keys_text(&w, cfg_worker_endpoint_keys, text, sizeof text) > 0);
    assert_int_equal(cfg_keys_text_diff(text, &run, out, sizeof out), 1);
    assert_string_equal(out, "embedding_size = 128 (512)");
    assert_int_equal(cfg_keys_text_diff(text, &w, out, sizeof out), 0);
    assert_string_equal(out, "");
    /* skipped: a line without " = ", an unknown key, an empty line; no newline at the end */
    assert_int_equal(
        cfg_keys_text_diff("garbage\nfuture_key = 3\n\nprovider = shm\nservers = 7", &run, out, sizeof out),
        2);
    assert_string_equal(out, "provider = shm (tcp), servers = 7 (1)");
    assert_int_equal(cfg_keys_text_diff("", &run, out, sizeof out), 0);
    assert_int_equal(cfg_keys_text_diff("servers = 7\nprovider = shm\n", &run, out, 12), 2);
    assert_int_equal(strlen(out), 11);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pfcps-test-config-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    log_init("test", -1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_file_and_overrides),
        cmocka_unit_test(test_validation_errors),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_late_checks),
        cmocka_unit_test(test_log_format),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_replaces_workers),
        cmocka_unit_test(test_docs_list_every_key),
        cmocka_unit_test(test_diff),
        cmocka_unit_test(test_keys_text),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
