/* pfcps: the command-line tool. One entry per subcommand in `commands` below; add yours there.
 *   pfcps pack [--pad|--resize] [--first-class N] [--identities N] [--quality Q] [--quiet] IMAGE_DIR OUT_PREFIX
 *   pfcps rec-info [--skip-bad] [--decode] PREFIX
 *   pfcps config-get [-c FILE] [--set KEY=VALUE ...] KEY [KEY ...]
 * Every subcommand answers -h / --help (anywhere before `--`) with its usage on stdout and exit 0; `pfcps help
 * COMMAND` does the same. Usage errors exit 2, failures 1. */
#include "common/cli.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/data/image.h"
#include "worker/data/pack.h"
#include "worker/data/rec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

typedef struct pfcps_command {
    const char *name;
    int (*run)(int argc, char **argv);  /* argv[0] is the subcommand name; returns the exit status */
    const char *usage;
} pfcps_command;

static int parse_i64(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *v = x;
    return 0;
}

/* The integer value of option argv[*i] (argv[*i + 1], advancing *i), within [lo, hi]. Returns 0, or -1 after
 * printing "pfcps CMD: OPTION needs an integer in [lo, hi], got 'x'". */
static int opt_i64(const char *cmd, int argc, char **argv, int *i, int64_t lo, int64_t hi, int64_t *v)
{
    const char *opt = argv[*i];
    if (*i + 1 >= argc || parse_i64(argv[*i + 1], v) < 0 || *v < lo || *v > hi) {
        fprintf(stderr, "pfcps %s: %s needs an integer in [%" PRId64 ", %" PRId64 "], got %s%s%s\n", cmd, opt, lo,
                hi, *i + 1 < argc ? "'" : "nothing", *i + 1 < argc ? argv[*i + 1] : "", *i + 1 < argc ? "'" : "");
        return -1;
    }
    (*i)++;
    return 0;
}

static int cmd_pack(int argc, char **argv)
{
    pack_opts o;
    pack_opts_default(&o);
    o.progress = 1;
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        int64_t v;
        if (strcmp(argv[i], "--resize") == 0) o.resize = 1;
        else if (strcmp(argv[i], "--pad") == 0) o.resize = 0;
        else if (strcmp(argv[i], "--quiet") == 0) o.progress = 0;
        else if (strcmp(argv[i], "--first-class") == 0) {
            /* class ids are stored exactly up to 2^48 (id2 "PF" marker): first_class + identities must stay below */
            if (opt_i64("pack", argc, argv, &i, 0, (INT64_C(1) << 48) - 1, &v) < 0) return 2;
            o.first_class = v;
        } else if (strcmp(argv[i], "--identities") == 0) {
            if (opt_i64("pack", argc, argv, &i, 1, INT64_MAX, &v) < 0) return 2;
            o.max_identities = v;
        } else if (strcmp(argv[i], "--quality") == 0) {
            if (opt_i64("pack", argc, argv, &i, 1, 100, &v) < 0) return 2;
            o.quality = (int)v;
        } else if (argv[i][0] == '-' || npos == 2) {
            fprintf(stderr, "pfcps pack: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else pos[npos++] = argv[i];
    }
    if (npos != 2) {
        fprintf(stderr, "pfcps pack: needs IMAGE_DIR and OUT_PREFIX\n");
        return 2;
    }
    /* OUT_PREFIX as `rec` reads it: a folder (an existing one, or any path ending in '/') means <folder>/train.
     * "pfcps pack imgs out/" wrote the hidden out/.rec and out/.idx, and an existing folder got <folder>.rec
     * beside it (with ./property), neither of which rec = out finds. */
    char outp[4200];
    size_t ol = strlen(pos[1]);
    struct stat sb;
    if (ol && pos[1][ol - 1] == '/')
        snprintf(outp, sizeof outp, "%strain", pos[1]);
    else if (stat(pos[1], &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(outp, sizeof outp, "%s/train", pos[1]);
    else
        snprintf(outp, sizeof outp, "%s", pos[1]);
    pos[1] = outp;
    pack_stats st;
    int rc = pack_dir(pos[0], pos[1], &o, &st);
    if (rc < 0) {
        fprintf(stderr, "pfcps pack: %s\n", pf_errmsg());
        return 1;
    }
    printf("packed %" PRId64 " images of %" PRId64 " identities into %s.rec/.idx (%" PRId64 " kept as is, %" PRId64
           " converted to 112x112 JPEG)\n", st.images, st.classes, pos[1], st.kept, st.converted);
    if (o.max_identities > 0 && st.classes < o.max_identities)
        fprintf(stderr, "pfcps pack: note: --identities %" PRId64 " asked, but %s has only %" PRId64
                " identity folders: all of them were packed\n", o.max_identities, pos[0], st.classes);
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmd_rec_info(int argc, char **argv)
{
    int skip = 0, decode = 0;
    const char *prefix = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--skip-bad") == 0) skip = 1;
        else if (strcmp(argv[i], "--decode") == 0) decode = 1;
        else if (argv[i][0] == '-' || prefix) {
            fprintf(stderr, "pfcps rec-info: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else prefix = argv[i];
    }
    if (!prefix) {
        fprintf(stderr, "pfcps rec-info: needs PREFIX\n");
        return 2;
    }
    rec_file *rf;
    if (rec_open(&rf, prefix, 0, skip) < 0) {
        fprintf(stderr, "pfcps rec-info: %s\n", pf_errmsg());
        return 1;
    }
    int64_t *c = malloc((size_t)rf->num_images * sizeof *c);
    int64_t distinct = 0;
    if (c) {
        for (int64_t i = 0; i < rf->num_images; i++) c[i] = rf->images[i].class_id;
        qsort(c, (size_t)rf->num_images, sizeof *c, cmp_i64);
        for (int64_t i = 0; i < rf->num_images; i++) distinct += i == 0 || c[i] != c[i - 1];
        free(c);
    }
    printf("rec         %s (%zu bytes)\n", rf->rec_path, rf->size);
    if (rf->layout == REC_LAYOUT_INSIGHTFACE)
        printf("layout      insightface (header at key 0; identity records at keys %" PRId64 "..%" PRId64 ")\n",
               rf->header_end[0], rf->header_end[1] - 1);
    else printf("layout      im2rec (no header record; every key is an image)\n");
    printf("images      %" PRId64 "\n", rf->num_images);
    printf("classes     %" PRId64 " distinct, label range [%" PRId64 ", %" PRId64 "], num_classes %" PRId64 "%s\n",
           distinct, rf->min_class, rf->max_class, rf->num_classes,
           rf->property_classes ? " (property)" : " (max label + 1)");
    printf("keys        first %" PRId64 ", last %" PRId64 "\n", rf->min_key, rf->max_key);
    if (skip) printf("skipped     %" PRId64 " bad records\n", rf->skipped);
    rec_buf buf = {0};
    rec_payload p;
    if (rec_get(rf, 0, &buf, &p) == 0) {
        tjhandle tj = tjInitDecompress();
        int w = 0, h = 0, ss, cs;
        if (p.image_len >= 2 && p.image[0] == 0xFF && tj &&
            tjDecompressHeader3(tj, p.image, (unsigned long)p.image_len, &w, &h, &ss, &cs) == 0)
            printf("first image JPEG %dx%d, %zu bytes\n", w, h, p.image_len);
        else printf("first image %zu bytes\n", p.image_len);
        if (tj) tjDestroy(tj);
    }
    /* --decode: decode every image (as training would) and report the ones that fail. */
    int64_t bad = 0, sizes = 0;
    if (decode) {
        img_decoder dec;
        if (img_decoder_init(&dec) < 0) {
            fprintf(stderr, "pfcps rec-info: %s\n", pf_errmsg());
            rec_buf_free(&buf);
            rec_close(rf);
            return 1;
        }
        for (int64_t i = 0; i < rf->num_images; i++) {
            int w, h;
            uint8_t *rgb;
            int rc = rec_get(rf, i, &buf, &p);
            if (rc == 0) rc = img_decode_rgb(&dec, p.image, p.image_len, &w, &h, &rgb);
            if (rc == 0 && (w != IMG_SIZE || h != IMG_SIZE)) {
                if (sizes++ < 10)
                    printf("size        key %" PRId64 " at byte %" PRIu64 ": %dx%d, not %dx%d\n", rf->images[i].key,
                           rf->images[i].offset, w, h, IMG_SIZE, IMG_SIZE);
            } else if (rc < 0 && bad++ < 10)
                printf("bad image   %s: key %" PRId64 " at byte %" PRIu64 ": %s\n", rf->rec_path, rf->images[i].key,
                       rf->images[i].offset, pf_errmsg());
        }
        img_decoder_free(&dec);
        printf("decoded     %" PRId64 " images: %" PRId64 " fail to decode, %" PRId64 " not %dx%d\n", rf->num_images, bad,
               sizes, IMG_SIZE, IMG_SIZE);
    }
    rec_buf_free(&buf);
    rec_close(rf);
    return bad || sizes ? 1 : 0;
}

/* The value `key` has in the effective config, as the daemons see it: looked up in cfg_to_ini's text (every
 * key, formatted so that the parser reads it back to the same value) with the one pair of quotes the parser
 * strips removed. Returns 0, or -ENOENT for a key cfg_to_ini does not write (the secret). */
static int config_value(const char *ini, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *l = ini; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, kl) != 0 || strncmp(l + kl, " = ", 3) != 0) continue;
        const char *v = l + kl + 3;
        size_t n = strcspn(v, "\n");
        if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) v++, n -= 2;
        if (n >= cap) n = cap - 1;
        memcpy(out, v, n);
        out[n] = 0;
        return 0;
    }
    return -ENOENT;
}

static const char config_get_usage[] =
    "usage: pfcps config-get [-c FILE] [--set KEY=VALUE ...] KEY [KEY ...]\n"
    "  Prints each KEY's value, one per line, as the daemons will see it: FILE parsed by the same parser\n"
    "  (quotes, inline comments, sections, defaults), then every --set in order. The secret is never printed.\n"
    "  Exit 2 for an unknown key or a config the daemons would refuse (message on stderr).";

static int cmd_config_get(int argc, char **argv)
{
    pf_config cfg;
    int rest = 0;
    int rc = cli_parse_common(argc, argv, &cfg, config_get_usage, CLI_CONFIG_OPTIONAL, &rest);
    if (rc == CLI_HELP) return 0;
    if (rc < 0) {
        fprintf(stderr, "pfcps config-get: %s\n", pf_errmsg());
        return 2;
    }
    if (rest < 2) {
        fprintf(stderr, "pfcps config-get: needs at least one KEY\n%s\n", config_get_usage);
        return 2;
    }
    char *ini = cfg_to_ini(&cfg);
    if (!ini) {
        fprintf(stderr, "pfcps config-get: out of memory\n");
        return 1;
    }
    char (*vals)[CFG_STR + 8] = calloc((size_t)rest, sizeof *vals);
    int status = vals ? 0 : 1;
    for (int i = 1; i < rest && status == 0; i++) {
        const char *key = argv[i];
        int known = 0;
        for (int k = 0; k < cfg_key_count(); k++) known |= strcmp(cfg_key_name(k), key) == 0;
        if (!known) {
            fprintf(stderr, "pfcps config-get: unknown key '%s' (docs/configuration.md lists them)\n", key);
            status = 2;
        } else if (config_value(ini, key, vals[i], sizeof vals[i]) < 0) {
            fprintf(stderr, "pfcps config-get: key '%s' is never printed\n", key);
            status = 2;
        }
    }
    /* All or nothing: a caller reading one line per key never gets a partial answer. */
    for (int i = 1; i < rest && status == 0; i++) printf("%s\n", vals[i]);
    free(vals);
    free(ini);
    return status;
}

static const pfcps_command commands[] = {
    {"pack", cmd_pack,
     "pack [--pad|--resize] [--first-class N] [--identities N] [--quality Q] [--quiet] IMAGE_DIR OUT_PREFIX\n"
     "        one subfolder per identity -> OUT_PREFIX.rec/.idx + property; --identities N: first N only"},
    {"rec-info", cmd_rec_info,
     "rec-info [--skip-bad] [--decode] PREFIX\n"
     "        images, classes, label range, layout, keys; --decode: decode every image, exit 1 if any fails"},
    {"config-get", cmd_config_get,
     "config-get [-c FILE] [--set KEY=VALUE ...] KEY [KEY ...]\n"
     "        each KEY's effective value, one per line, as the daemons parse it (deploy/local/launch.sh uses it)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: pfcps COMMAND [ARGS]\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) fprintf(f, "  pfcps %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
    log_init("pfcps", -1);
    if (argc < 2 || (strcmp(argv[1], "help") == 0 && argc < 3) || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* `pfcps help COMMAND` and `pfcps COMMAND ... --help|-h ...`: that command's usage, exit 0. */
    int help = strcmp(argv[1], "help") == 0;
    const char *name = help ? argv[2] : argv[1];
    for (int i = 2; !help && i < argc && strcmp(argv[i], "--") != 0; i++)
        help = strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (strcmp(name, commands[i].name) != 0) continue;
        if (help) {
            printf("usage: pfcps %s\n", commands[i].usage);
            if (commands[i].run == cmd_config_get) cli_print_common_help(stdout);
            return 0;
        }
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "pfcps: unknown command '%s'\n", name);
    usage(stderr);
    return 2;
}
