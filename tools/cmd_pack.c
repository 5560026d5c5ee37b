/* `pfcps pack`: the command line of worker/data/pack.h's packer (usage in tools/commands.h). */
#include "tools/commands.h"

#include "common/err.h"
#include "tools/opts.h"
#include "worker/data/pack.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cmd_pack(int argc, char **argv)
{
    pack_opts o;
    pack_opts_default(&o);
    o.progress = 1;
    enum { RESIZE, PAD, QUIET, FIRST_CLASS, IDENTITIES, QUALITY };
    static const tool_opt opts[] = {
        {"--resize", 0},     {"--pad", 0},     {"--quiet", 0}, {"--first-class", 1},
        {"--identities", 1}, {"--quality", 1}, {NULL, 0}};
    const char *pos[2];
    int npos = 0, k;
    tool_args a;
    tool_args_init(&a, "pack", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        int64_t v = 0;
        if (k == RESIZE)
            o.resize = 1;
        else if (k == PAD)
            o.resize = 0;
        else if (k == QUIET)
            o.progress = 0;
        else if (k == FIRST_CLASS) {
            /* class ids are stored exactly up to 2^48 (id2 "PF" marker): first_class + identities must stay
             * below */
            if (tool_opt_i64(&a, 0, (INT64_C(1) << 48) - 1, NULL, &v) < 0)
                return 2;
            o.first_class = v;
        } else if (k == IDENTITIES) {
            if (tool_opt_i64(&a, 1, INT64_MAX, NULL, &v) < 0)
                return 2;
            o.max_identities = v;
        } else if (k == QUALITY) {
            if (tool_opt_i64(&a, 1, 100, NULL, &v) < 0)
                return 2;
            o.quality = (int)v;
        } else if (k == TOOL_UNKNOWN || npos == 2)
            return tool_unexpected(&a, k == TOOL_UNKNOWN ? a.opt : a.arg, NULL);
        else
            pos[npos++] = a.arg;
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
