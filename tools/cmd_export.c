/* `pfcps export`: the model leaves pfcps (usage in tools/commands.h).
 *   --format safetensors CKPT OUT: the backbone as arcface_torch's state_dict (worker/model/safetensors.h);
 *   --format onnx [--opset N] CKPT OUT: the backbone in eval mode as an ONNX model
 * (worker/model/onnx_export.h);
 *   --centers [--dim D] RUN_OUTPUT OUT: the class centers of a run (worker/model/centers_export.h); D from
 *     RUN_OUTPUT/model.ckpt unless --dim is given. */
#include "tools/commands.h"

#include "common/err.h"
#include "worker/eval/embed.h"
#include "worker/model/centers_export.h"
#include "worker/model/onnx_export.h"
#include "worker/model/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage_err(const char *fmt, const char *arg)
{
    fprintf(stderr, "pfcps export: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: pfcps export --format safetensors|onnx [--opset N] CKPT OUT\n"
                    "       pfcps export --centers [--dim D] RUN_OUTPUT OUT\n");
    return 2;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int cmd_export(int argc, char **argv)
{
    const char *format = NULL, *pos[2] = {NULL, NULL};
    int centers = 0, dim = 0, opset = ONNX_EXPORT_OPSET, npos = 0, only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && !strcmp(a, "--")) {
            only_pos = 1;
        } else if (!only_pos && !strcmp(a, "--format")) {
            if (++i >= argc)
                return usage_err("%s needs a value (safetensors or onnx)", a);
            format = argv[i];
            if (strcmp(format, "safetensors") && strcmp(format, "onnx"))
                return usage_err("--format '%s': expected safetensors or onnx", format);
        } else if (!only_pos && !strcmp(a, "--centers")) {
            centers = 1;
        } else if (!only_pos && !strcmp(a, "--dim")) {
            if (parse_int(i + 1 < argc ? argv[i + 1] : NULL, 1, 1 << 20, &dim))
                return usage_err("--dim needs an integer in [1, 1048576], got '%s'",
                                 i + 1 < argc ? argv[i + 1] : "");
            i++;
        } else if (!only_pos && !strcmp(a, "--opset")) {
            if (parse_int(i + 1 < argc ? argv[i + 1] : NULL, ONNX_EXPORT_OPSET_MIN, ONNX_EXPORT_OPSET_MAX,
                          &opset))
                return usage_err("--opset needs an opset this exporter writes (" ONNX_EXPORT_OPSETS
                                 "), got '%s'",
                                 i + 1 < argc ? argv[i + 1] : "");
            i++;
        } else if (!only_pos && a[0] == '-' && a[1]) {
            return usage_err("unknown option '%s'", a);
        } else {
            if (npos == 2)
                return usage_err("unexpected argument '%s'", a);
            pos[npos++] = a;
        }
    }
    if (centers == !!format)
        return usage_err("%s", centers ? "--centers and --format exclude each other"
                                       : "needs --format safetensors|onnx or --centers");
    if (npos != 2)
        return usage_err("%s", centers ? "needs RUN_OUTPUT and OUT" : "needs CKPT and OUT");
    if (centers) {
        int64_t C;
        int D;
        int rc = centers_export_safetensors(pos[0], dim, pos[1], &C, &D);
        if (rc) {
            fprintf(stderr, "pfcps export: %s\n", pf_errmsg());
            return 1;
        }
        printf("centers: %" PRId64 " classes x %d -> %s\n", C, D, pos[1]);
        return 0;
    }
    if (dim)
        return usage_err("%s", "--dim goes with --centers (a checkpoint names its embedding size)");
    model *m;
    int rc = eval_model_open(&m, pos[0], 1, NULL);
    if (rc) {
        fprintf(stderr, "pfcps export: %s\n", pf_errmsg());
        return 1;
    }
    const model_desc *d = model_get_desc(m);
    if (!strcmp(format, "safetensors"))
        rc = model_export_safetensors(m, pos[1]);
    else
        rc = model_export_onnx(m, pos[1], opset);
    if (rc)
        fprintf(stderr, "pfcps export: %s\n", pf_errmsg());
    else if (!strcmp(format, "onnx"))
        printf("%s (D %d) -> %s: ONNX opset %d\n", d->name, d->embedding_size, pos[1], opset);
    else
        printf("%s (D %d) -> %s: safetensors\n", d->name, d->embedding_size, pos[1]);
    model_free(m);
    return rc ? 1 : 0;
}
