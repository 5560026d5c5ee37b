/* `pfcps export`: the model leaves pfcps (usage in tools/commands.h).
 *   --format safetensors CKPT OUT: the backbone as arcface_torch's state_dict (worker/model/safetensors.h);
 *   --format onnx [--opset N] CKPT OUT: the backbone in eval mode as an ONNX model
 * (worker/model/onnx_export.h);
 *   --centers [--dim D] RUN_OUTPUT OUT: the class centers of a run (worker/model/centers_export.h); D from
 *     RUN_OUTPUT/model.ckpt unless --dim is given. */
#include "tools/commands.h"

#include "common/err.h"
#include "tools/opts.h"
#include "worker/eval/embed.h"
#include "worker/model/centers_export.h"
#include "worker/model/onnx_export.h"
#include "worker/model/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The usage lines after a usage error. Returns 2. */
static int print_usage(void)
{
    fprintf(stderr, "usage: pfcps export --format safetensors|onnx [--opset N] CKPT OUT\n"
                    "       pfcps export --centers [--dim D] RUN_OUTPUT OUT\n");
    return 2;
}

static int usage_err(const char *fmt, const char *arg)
{
    fprintf(stderr, "pfcps export: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    return print_usage();
}

int cmd_export(int argc, char **argv)
{
    const char *format = NULL, *pos[2] = {NULL, NULL};
    int centers = 0, dim = 0, opset = ONNX_EXPORT_OPSET, npos = 0, k;
    enum { FORMAT, CENTERS, DIM, OPSET };
    static const tool_opt opts[] = {
        {"--format", 1}, {"--centers", 0}, {"--dim", 1}, {"--opset", 1}, {NULL, 0}};
    tool_args a;
    tool_args_init(&a, "export", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        if (k == FORMAT) {
            if (!a.arg)
                return usage_err("%s needs a value (safetensors or onnx)", a.opt);
            format = a.arg;
            if (strcmp(format, "safetensors") && strcmp(format, "onnx"))
                return usage_err("--format '%s': expected safetensors or onnx", format);
        } else if (k == CENTERS) {
            centers = 1;
        } else if (k == DIM) {
            if (tool_opt_int(&a, 1, 1 << 20, NULL, &dim) < 0)
                return print_usage();
        } else if (k == OPSET) {
            if (tool_opt_int(&a, ONNX_EXPORT_OPSET_MIN, ONNX_EXPORT_OPSET_MAX,
                             "an opset this exporter writes (" ONNX_EXPORT_OPSETS ")", &opset) < 0)
                return print_usage();
        } else if (k == TOOL_UNKNOWN) {
            return usage_err("unknown option '%s'", a.opt);
        } else {
            if (npos == 2)
                return usage_err("unexpected argument '%s'", a.arg);
            pos[npos++] = a.arg;
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
