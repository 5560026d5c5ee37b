/* pfcps: the command-line tool's dispatcher. One entry per subcommand in `commands` below, each run by a
 * cmd_* function of its own file (tools/cmd_*.c, declared in tools/commands.h; each reads its arguments with
 * tools/opts.h); add yours in both places. Every subcommand answers -h / --help (anywhere before `--`) with
 * its usage on stdout and exit 0; `pfcps help COMMAND` does the same. Usage errors exit 2, failures 1. */
#include "tools/commands.h"

#include "common/cli.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

typedef struct pfcps_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name; returns the exit status */
    const char *usage;
    int common_opts; /* 1: also takes the daemons' options (-c, --set); --help lists them */
} pfcps_command;

static const pfcps_command commands[] = {
    {"pack", cmd_pack,
     "pack [--pad|--resize] [--first-class N] [--identities N] [--quality Q] [--quiet] IMAGE_DIR OUT_PREFIX\n"
     "        one subfolder per identity -> OUT_PREFIX.rec/.idx + property; --identities N: first N only",
     0},
    {"rec-info", cmd_rec_info,
     "rec-info [--skip-bad] [--decode] PREFIX\n"
     "        images, classes, label range, layout, keys; --decode: decode every image, exit 1 if any fails",
     0},
    {"config-get", cmd_config_get,
     "config-get [-c FILE] [--set KEY=VALUE ...] KEY [KEY ...]\n"
     "        each KEY's effective value, one per line, as the daemons parse it (deploy/local/launch.sh uses "
     "it)",
     1},
    {"embed", cmd_embed,
     "embed [--flip] [--pad] [--batch N] [--device NAME] CKPT INPUT OUT.npy\n"
     "        .bin set, RecordIO pack, image folder (recursive, sorted) or list file -> N x D float32",
     0},
    {"verify", cmd_verify,
     "verify [--images DIR] [--folds K] [--no-flip] [--pad] [--batch N] [--device NAME] CKPT SET\n"
     "       | verify (--init NETWORK:D[:SEED] | --pixels) [options] SET\n"
     "        arcface_torch's verification on a .bin set or pairs file: Accuracy-Flip, XNorm, threshold;\n"
     "        --init scores the untrained network (as training starts), --pixels the raw pixels",
     0},
    {"export", cmd_export,
     "export --format safetensors|onnx [--opset N] CKPT OUT | export --centers [--dim D] RUN_OUTPUT OUT\n"
     "        backbone -> safetensors (arcface_torch names) or ONNX (eval); a run's class centers -> "
     "safetensors",
     0},
    {"plan", cmd_plan,
     "plan --identities C --workers W --link-gbps G [--dim D] [--sample-rate R | --sampled K]\n"
     "        [--batch B] [--wire fp32|fp16|bf16] [--head-mode global|local] [--servers S]\n"
     "        [--server-mem GIB] [--mem-bw GB/S] [--gemm-gflops GFLOP/S] [--backbone-ms MS]\n"
     "        [--replicas 0|1] [--optimizer sgd|adamw]\n"
     "        servers needed (memory, bandwidth), bytes per step per link, step time bounded by link,\n"
     "        server memory and head compute (tools/plan.h)",
     0},
    {"ckpt-info", cmd_ckpt_info,
     "ckpt-info [--newest] [--run ID] DIR\n"
     "        a run's checkpoints (DIR/snapshots): complete or not, members, bytes, table and backbone "
     "SHA-256",
     0},
    {"top", cmd_top,
     "top [--interval SECONDS] [--count N | --once] URL [URL ...]\n"
     "        a running job's members (a URL's /targets, or the URL), one row each every SECONDS (1): step,\n"
     "        rates, loss, lr, wait (a worker's seconds waited per step; a server's median apply time),\n"
     "        memory (% of its limit), a server's rows pulled / pushed per second, queue, snapshot age;\n"
     "        'down' and why for a member that does not answer. --count N: N refreshes (0, the default: "
     "until\n"
     "        Ctrl-C); --once: one, no rates. Exit 1 when no member answered at the last refresh",
     0},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: pfcps COMMAND [ARGS]\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  pfcps %s\n", commands[i].usage);
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
        if (strcmp(name, commands[i].name) != 0)
            continue;
        if (help) {
            printf("usage: pfcps %s\n", commands[i].usage);
            if (commands[i].common_opts)
                cli_print_common_help(stdout);
            return 0;
        }
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "pfcps: unknown command '%s'\n", name);
    usage(stderr);
    return 2;
}
