/* `pfcps pack`: the command line of worker/data/pack.h's packer (usage in tools/commands.h). */
#include "tools/commands.h"

#include "common/err.h"
#include "worker/data/pack.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int parse_i64(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *v = x;
    return 0;
}

/* The integer value of option argv[*i] (argv[*i + 1], advancing *i), within [lo, hi]. Returns 0, or -1 after
 * printing "pfcps CMD: OPTION needs an integer in [lo, hi], got 'x'". */
static int opt_i64(const char *cmd, int argc, char **argv, int *i, int64_t lo, int64_t hi, int64_t *v)
{
    const char *opt = argv[*i];
    if (*i + 1 >= argc || parse_i64(argv[*i + 1], v) < 0 || *v < lo || *v > hi) {
        fprintf(stderr, "pfcps %s: %s needs an integer in [%" PRId64 ", %" PRId64 "], got %s%s%s\n", cmd, opt,
                lo, hi, *i + 1 < argc ? "'" : "nothing", *i + 1 < argc ? argv[*i + 1] : "",
                *i + 1 < argc ? "'" : "");
        return -1;
    }
    (*i)++;
    return 0;
}

int cmd_pack(int argc, char **argv)
{
    pack_opts o;
    pack_opts_default(&o);
    o.progress = 1;
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        int64_t v;
        if (strcmp(argv[i], "--resize") == 0)
            o.resize = 1;
        else if (strcmp(argv[i], "--pad") == 0)
            o.resize = 0;
        else if (strcmp(argv[i], "--quiet") == 0)
            o.progress = 0;
        else if (strcmp(argv[i], "--first-class") == 0) {
            /* class ids are stored exactly up to 2^48 (id2 "PF" marker): first_class + identities must stay
             * below */
            if (opt_i64("pack", argc, argv, &i, 0, (INT64_C(1) << 48) - 1, &v) < 0)
                return 2;
            o.first_class = v;
        } else if (strcmp(argv[i], "--identities") == 0) {
            if (opt_i64("pack", argc, argv, &i, 1, INT64_MAX, &v) < 0)
                return 2;
            o.max_identities = v;
        } else if (strcmp(argv[i], "--quality") == 0) {
            if (opt_i64("pack", argc, argv, &i, 1, 100, &v) < 0)
                return 2;
            o.quality = (int)v;
        } else if (argv[i][0] == '-' || npos == 2) {
            fprintf(stderr, "pfcps pack: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else
            pos[npos++] = argv[i];
    }
    if (npos != 2) {
        fprintf(stderr, "pfcps pack: needs IMAGE_DIR and OUT_PREFIX\n");
        return 2;
    }
    /* OUT_PREFIX as `rec` reads it: a folder (an existing one, or any path ending in '/') means
     * <folder>/train. "pfcps pack imgs out/" wrote the hidden out/.rec and out/.idx, and an existing folder
     * got <folder>.rec beside it (with ./property), neither of which rec = out finds. */
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
    printf("packed %" PRId64 " images of %" PRId64 " identities into %s.rec/.idx (%" PRId64
           " kept as is, %" PRId64 " converted to 112x112 JPEG)\n",
           st.images, st.classes, pos[1], st.kept, st.converted);
    if (o.max_identities > 0 && st.classes < o.max_identities)
        fprintf(stderr,
                "pfcps pack: note: --identities %" PRId64 " asked, but %s has only %" PRId64
                " identity folders: all of them were packed\n",
                o.max_identities, pos[0], st.classes);
    return 0;
}
