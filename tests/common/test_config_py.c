/* arcface_torch Python configs (configs/NAME.py) read without Python: every construct those files use, on
 * configs written here in their style (base.py's keys, ms1mv3_r50.py, glint360k with arithmetic, a wf42m
 * partial-fc one), and every refusal with its file:line. Expected values are written by hand from the
 * files below and arcface_torch's get_config (output None -> work_dirs/<config name>). */
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

/* ms1mv3_r50.py as arcface_torch ships it (comments, imports, edict, tuple, list with both quote kinds,
 * 5e-4, True/False/None, dali). */
static const char ms1mv3_r50[] = "from easydict import EasyDict as edict\n"
                                 "\n"
                                 "# make training faster\n"
                                 "# our RAM is 256G\n"
                                 "# mount -t tmpfs -o size=140G  tmpfs /train_tmp\n"
                                 "\n"
                                 "config = edict()\n"
                                 "config.margin_list = (1.0, 0.5, 0.0)\n"
                                 "config.network = \"r50\"\n"
                                 "config.resume = False\n"
                                 "config.output = None\n"
                                 "config.embedding_size = 512\n"
                                 "config.sample_rate = 1.0\n"
                                 "config.fp16 = True\n"
                                 "config.momentum = 0.9\n"
                                 "config.weight_decay = 5e-4\n"
                                 "config.batch_size = 128\n"
                                 "config.lr = 0.1\n"
                                 "config.verbose = 2000\n"
                                 "config.dali = False\n"
                                 "\n"
                                 "config.rec = \"/train_tmp/ms1m-retinaface-t1\"\n"
                                 "config.num_classes = 93431\n"
                                 "config.num_image = 5179510\n"
                                 "config.num_epoch = 20\n"
                                 "config.warmup_epoch = 0\n"
                                 "config.val_targets = ['lfw', 'cfp_fp', \"agedb_30\"]\n";

static void test_ms1mv3(void **state)
{
    (void)state;
    const char *p = write_file("ms1mv3_r50.py", ms1mv3_r50);
    pf_config c;
    assert_int_equal(cfg_load(&c, p, NULL, 0), 0);
    assert_true(c.margin_list[0] == 1.0 && c.margin_list[1] == 0.5 && c.margin_list[2] == 0.0);
    assert_string_equal(c.network, "r50");
    assert_int_equal(c.resume, 0);
    assert_string_equal(c.output, "work_dirs/ms1mv3_r50");
    assert_int_equal(c.embedding_size, 512);
    assert_true(c.sample_rate == 1.0);
    assert_int_equal(c.fp16, 1);
    assert_true(c.momentum == 0.9);
    assert_true(c.weight_decay == 5e-4);
    assert_int_equal(c.batch_size, 128);
    assert_true(c.lr == 0.1);
    assert_int_equal(c.verbose, 2000);
    assert_string_equal(c.rec, "/train_tmp/ms1m-retinaface-t1");
    assert_int_equal(c.num_classes, 93431);
    assert_int_equal(c.num_image, 5179510);
    assert_int_equal(c.num_epoch, 20);
    assert_true(c.warmup_epoch == 0.0);
    assert_string_equal(c.val_targets, "lfw, cfp_fp, agedb_30");
}

/* Arithmetic as arcface_torch's files write it, trailing comments, a multi-line list, an '_' in a number,
 * the wandb / dali keys (ignored), --set over a .py file, no output line (-> work_dirs/<name>). */
static void test_constructs(void **state)
{
    (void)state;
    const char *p = write_file("glint360k_r100.py", "from easydict import EasyDict as edict\n"
                                                    "import os\n"
                                                    "config = edict()  # the config\n"
                                                    "config.num_classes = 360232\n"
                                                    "config.num_image = 17091657\n"
                                                    "config.num_epoch = 20\n"
                                                    "config.warmup_epoch = config.num_epoch // 10\n"
                                                    "config.network = 'r100'\n"
                                                    "config.output = config.network\n"
                                                    "config.sample_rate = 0.2 # comment\n"
                                                    "config.batch_size = 2 * 64\n"
                                                    "config.frequent = 30 * 10000 // 1000 - (2 + 8)\n"
                                                    "config.verbose = 1_000\n"
                                                    "config.lr = 0.4 / 4\n"
                                                    "config.weight_decay = -(-1e-4)\n"
                                                    "config.seed = +2048\n"
                                                    "config.val_targets = [\n"
                                                    "    'lfw',  # LFW\n"
                                                    "    'agedb_30',\n"
                                                    "]\n"
                                                    "config.margin_list = (1.0, 0.0, 0.4,)\n"
                                                    "config.dali = True\n"
                                                    "config.dali_aug = False\n"
                                                    "config.gradient_acc = 1\n"
                                                    "config.using_wandb = False\n"
                                                    "config.wandb_key = \"XXXX\"\n"
                                                    "config.wandb_entity = 'e'\n"
                                                    "config.suffix_run_name = None\n"
                                                    "config.rec = '/data/glint360k'\n");
    const char *sets[] = {"batch_size=64"};
    pf_config c;
    assert_int_equal(cfg_load(&c, p, sets, 1), 0);
    assert_int_equal(c.num_classes, 360232);
    assert_true(c.sample_rate == 0.2);
    assert_int_equal(c.batch_size, 64); /* --set wins over the file's 2 * 64 */
    assert_int_equal(c.frequent, 290);  /* 300000 // 1000 - 10 */
    assert_int_equal(c.verbose, 1000);
    assert_true(c.lr == 0.1);
    assert_true(c.weight_decay == 1e-4);
    assert_int_equal(c.seed, 2048);
    assert_string_equal(c.val_targets, "lfw, agedb_30");
    assert_true(c.margin_list[0] == 1.0 && c.margin_list[1] == 0.0 && c.margin_list[2] == 0.4);
    assert_true(c.warmup_epoch == 2.0); /* config.num_epoch // 10 */
    assert_string_equal(c.network, "r100");
    assert_string_equal(c.output, "r100"); /* config.output = config.network */
    assert_string_equal(c.rec, "/data/glint360k");

    /* No output line: work_dirs/<name>; an empty list is an empty value. */
    p = write_file("wf42m_pfc02_r100.py", "config = edict()\nconfig.num_classes = 10\nconfig.rec = 'x'\n"
                                          "config.val_targets = []\n");
    assert_int_equal(cfg_load(&c, p, NULL, 0), 0);
    assert_string_equal(c.output, "work_dirs/wf42m_pfc02_r100");
    assert_string_equal(c.val_targets, "");

    /* Without --set the arithmetic stands; a float result of '/' where an int is needed is refused. */
    assert_int_equal(cfg_load(&c, p, NULL, 0), 0);
    assert_int_equal(c.batch_size, 128);
    p = write_file("div.py", "config = edict()\nconfig.num_classes = 10\nconfig.rec = 'x'\n"
                             "config.batch_size = 256 / 2\n");
    assert_int_equal(cfg_load(&c, p, NULL, 0), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "div.py:4"));
    assert_non_null(strstr(pf_errmsg(), "batch_size"));
}

/* Each refusal: the code, file:line and what is wrong. */
static void expect_refused(const char *text, int line, const char *needle)
{
    const char *p = write_file("bad.py", text);
    pf_config c;
    int rc = cfg_load(&c, p, NULL, 0);
    char want[64];
    snprintf(want, sizeof want, "bad.py:%d:", line);
    printf("refused: %s\n", pf_errmsg());
    assert_true(rc < 0);
    assert_non_null(strstr(pf_errmsg(), want));
    assert_non_null(strstr(pf_errmsg(), needle));
}

static void test_refusals(void **state)
{
    (void)state;
    const char *head = "config = edict()\nconfig.num_classes = 10\nconfig.rec = 'x'\n";
    char buf[512];
#define REFUSED(tail, line, needle)                                                                          \
    do {                                                                                                     \
        snprintf(buf, sizeof buf, "%s%s", head, tail);                                                       \
        expect_refused(buf, line, needle);                                                                   \
    } while (0)
    REFUSED("config.lr = os.environ['LR']\n", 4, "names, calls");
    REFUSED("config.lr = float('0.1')\n", 4, "names, calls");
    REFUSED("config.network = {'a': 1}\n", 4, "expected a number");
    REFUSED("config.network = 'r50\n", 4, "unterminated string");
    REFUSED("config.lr = 0.1 0.2\n", 4, "unexpected text");
    REFUSED("config.lr == 0.1\n", 4, "expected '='");
    REFUSED("config.num_epoch = 1 // 0\n", 4, "division by zero");
    REFUSED("config.num_epoch = 9223372036854775807 * 2\n", 4, "integer overflow");
    REFUSED("config.learning_rate = 0.1\n", 4, "learning_rate");        /* unknown key: refused, named */
    REFUSED("config.margin_list = (1.0, (0.5, 0.0))\n", 4, "expected"); /* nested tuple */
    REFUSED("config.margin_list = (1.0, None, 0.0)\n", 4, "None inside");
    REFUSED("cfg = edict()\n", 4, "expected 'config.KEY = value'");
    REFUSED("config.lr = 010\n", 4, "leading zero");
    REFUSED("config.val_targets = ['lfw',\n 'cfp_fp'\n", 6, "expected"); /* unclosed list */
    REFUSED("exec('import os')\n", 4, "expected 'config.KEY = value'");
    REFUSED("config.warmup_epoch = config.num_epoch // 10\n", 4, "has not set"); /* num_epoch not set here */
    REFUSED("config.num_epoch = config.rec * 2\n", 4, "not a number");           /* arithmetic on a string */
    REFUSED("config.output = f'work_dirs/{config.rec}'\n", 4, "names, calls");
    /* Python reads these differently from what a line-by-line reading gives: refused, never skipped. */
    REFUSED("import os; config.lr = 5.0\n", 4, "';' joins statements");
    REFUSED("import os; os.system('true')\n", 4, "';' joins statements");
    REFUSED("config.lr = 5.0;\n", 4, "';' joins statements");
    REFUSED("  config.lr = 5.0\n", 4, "an indented statement");
    REFUSED("config = edict()\n", 4, "a second 'config = edict()'");
    REFUSED("from os import path as config\n", 4, "binds the name 'config'");
    REFUSED("import config\n", 4, "binds the name 'config'");
    REFUSED("from collections import OrderedDict as edict\n", 4, "'edict' / 'EasyDict'");
    REFUSED("import easydict as EasyDict\n", 4, "'edict' / 'EasyDict'");
    REFUSED("from os import *\n", 4, "'import *'");
    REFUSED("import os.\n", 4, "expected a module name");
    REFUSED("from os import\n", 4, "expected a name to import");
    REFUSED("from os path import sep\n", 4, "expected 'import' after 'from MODULE'");
    REFUSED("import os if True\n", 4, "unexpected text after the statement");
    REFUSED("config.lr = 5.0 if True else 0.1\n", 4, "unexpected text after the statement");
#undef REFUSED
    expect_refused("config.num_classes = 10\nconfig = edict()\n", 1, "before 'config = edict()'");
}

/* A UTF-8 byte order mark before the first line is skipped (as Python does); the imports arcface_torch's
 * files and their users write are read (plain, dotted, several, 'as', from-imports, __future__, relative). */
static void test_bom_and_imports(void **state)
{
    (void)state;
    char text[sizeof ms1mv3_r50 + 3] = "\xEF\xBB\xBF";
    strcat(text, ms1mv3_r50);
    const char *p = write_file("bom.py", text);
    pf_config c;
    assert_int_equal(cfg_load(&c, p, NULL, 0), 0);
    assert_string_equal(c.network, "r50");
    assert_int_equal(c.num_classes, 93431);
    assert_true(c.lr == 0.1);
    assert_string_equal(c.output, "work_dirs/bom");
    p = write_file("imports.py", "from __future__ import annotations\n"
                                 "import os\n"
                                 "import os.path, sys as system  # several\n"
                                 "from os import path as osp, sep\n"
                                 "from . import sibling\n"
                                 "from ..pkg.mod import thing as other\n"
                                 "from easydict import EasyDict as edict\n"
                                 "from easydict import EasyDict\n"
                                 "config = edict()\n"
                                 "config.num_classes = 10\n"
                                 "config.rec = 'x'\n");
    assert_int_equal(cfg_load(&c, p, NULL, 0), 0);
    assert_int_equal(c.num_classes, 10);
    /* a BOM anywhere else is not skipped */
    p = write_file("bom2.py", "config = edict()\n\xEF\xBB\xBF"
                              "config.num_classes = 10\n");
    assert_int_equal(cfg_load(&c, p, NULL, 0), -EINVAL);
    assert_non_null(strstr(pf_errmsg(), "bom2.py:2:"));
}

/* The text of an upstream config in tests/common/config_py (PFCPS_SOURCE), loaded with `sets`. Returns 0 when
 * PFCPS_SOURCE is not set (the caller skips). */
static int load_upstream(pf_config *c, const char *name, const char *const *sets, int nset)
{
    const char *src = getenv("PFCPS_SOURCE");
    if (!src)
        return 0;
    char path[600];
    snprintf(path, sizeof path, "%s/tests/common/config_py/%s", src, name);
    int rc = cfg_load(c, path, sets, nset);
    if (rc < 0)
        printf("%s: %s\n", name, pf_errmsg());
    assert_int_equal(rc, 0);
    return 1;
}

/* arcface_torch's configs as it ships them (tests/common/config_py; revisions: base.py of
 * darkrubiks/insightface 473b4bf, a fork with deepinsight's keys plus image_size, dali_aug and the wandb keys;
 * 3millions.py deepinsight fe116a4; wf42m_pfc0008_32gpu_r100.py deepinsight 5ef9804) load, with the values
 * read off those texts here: base.py's keys pfcps does not read are ignored (one warning), 3millions.py's
 * warmup_epoch -1 and wf42m_pfc0008's sample_rate 0 are accepted. gradient_acc is read (12 as 12; 0 refused by
 * its range); image_size other than 112 is refused naming the key (ignoring it would change training). */
static void test_upstream_configs(void **state)
{
    (void)state;
    pf_config c;
    const char *req[] = {"num_classes=10", "rec=x"}; /* base.py sets neither: get_config merges it under one */
    if (!load_upstream(&c, "base.py", req, 2))
        skip();
    assert_true(c.margin_list[0] == 1.0 && c.margin_list[1] == 0.5 && c.margin_list[2] == 0.0);
    assert_string_equal(c.network, "r50");
    assert_string_equal(c.output, "ms1mv3_arcface_r50");
    assert_true(c.sample_rate == 1.0 && c.lr == 0.1 && c.momentum == 0.9 && c.weight_decay == 5e-4);
    assert_int_equal(c.batch_size, 128);
    assert_int_equal(c.verbose, 2000);
    assert_int_equal(c.frequent, 10);
    assert_int_equal(c.seed, 2048);
    assert_int_equal(c.num_workers, 2);

    assert_int_equal(load_upstream(&c, "3millions.py", NULL, 0), 1);
    assert_true(c.warmup_epoch == -1.0);
    assert_true(c.sample_rate == 0.1);
    assert_string_equal(c.network, "mbf");
    assert_true(c.margin_list[0] == 1.0 && c.margin_list[1] == 0.0 && c.margin_list[2] == 0.4);
    assert_int_equal(c.fp16, 1);
    assert_int_equal(c.batch_size, 512);
    assert_string_equal(c.rec, "synthetic");
    assert_int_equal(c.num_classes, 300000);
    assert_int_equal(c.num_image, 100000);
    assert_int_equal(c.num_epoch, 30);
    assert_string_equal(c.output, "work_dirs/3millions");
    assert_string_equal(c.val_targets, "");

    assert_int_equal(load_upstream(&c, "wf42m_pfc0008_32gpu_r100.py", NULL, 0), 1);
    assert_true(c.sample_rate == 0.0);
    assert_true(c.lr == 0.4);
    assert_string_equal(c.network, "r100");
    assert_int_equal(c.num_classes, 2059906);
    assert_int_equal(c.num_image, 42474557);
    assert_true(c.warmup_epoch == 2.0); /* config.num_epoch // 10 */
    assert_string_equal(c.val_targets, "lfw, cfp_fp, agedb_30");
    assert_string_equal(c.output, "work_dirs/wf42m_pfc0008_32gpu_r100");

    const char *head = "config = edict()\nconfig.num_classes = 10\nconfig.rec = 'x'\n";
    char buf[256];
    snprintf(buf, sizeof buf, "%sconfig.gradient_acc = 12\n", head);
    const char *acc = write_file("acc12.py", buf);
    assert_int_equal(cfg_load(&c, acc, NULL, 0), 0);
    assert_int_equal(c.gradient_acc, 12);
    snprintf(buf, sizeof buf, "%sconfig.gradient_acc = 0\n", head);
    expect_refused(buf, 4, "gradient_acc");
    snprintf(buf, sizeof buf, "%sconfig.image_size = (224, 224)\n", head);
    expect_refused(buf, 4, "key 'image_size': 224, 224: pfcps trains on 112x112 images only");
    snprintf(buf, sizeof buf, "%sconfig.image_size = (112, 112)\nconfig.gradient_acc = 1\n", head);
    const char *p = write_file("ok112.py", buf);
    assert_int_equal(cfg_load(&c, p, NULL, 0), 0);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pfcps-test-config-py-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ms1mv3),
        cmocka_unit_test(test_constructs),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bom_and_imports),
        cmocka_unit_test(test_upstream_configs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        return 1;
    return rc;
}
