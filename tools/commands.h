/* The pfcps tool's subcommands, one per tools/cmd_*.c file, dispatched by tools/pfcps.c (its `commands`
 * table holds each one's name and usage line). */
#ifndef PFCPS_TOOLS_COMMANDS_H
#define PFCPS_TOOLS_COMMANDS_H

/* Each cmd_* runs one subcommand. argv[0] is the subcommand's name, argv[1..argc-1] its arguments; -h /
 * --help before `--` never reaches it (the dispatcher prints the usage). Returns the process's exit status: 0
 * on success, 1 when the work failed, 2 for a usage error; every message goes to stderr as "pfcps CMD: ...".
 * Arguments are read with tools/opts.h, so options, values, "-" and "--" follow the same rules everywhere. */

/* `pfcps pack [--pad|--resize] [--first-class N] [--identities N] [--quality Q] [--quiet] IMAGE_DIR
 * OUT_PREFIX`: packs one subfolder per identity into OUT_PREFIX.rec/.idx + property (worker/data/pack.h); an
 * OUT_PREFIX that is a folder (existing, or ending in '/') means <folder>/train. Prints a one-line summary on
 * stdout. */
int cmd_pack(int argc, char **argv);

/* `pfcps rec-info [--skip-bad] [--decode] PREFIX`: prints the dataset's layout, image count, classes, label
 * and key ranges and the first image's size on stdout; --decode decodes every image and returns 1 if any
 * fails to decode or is not IMG_SIZE x IMG_SIZE. */
int cmd_rec_info(int argc, char **argv);

/* `pfcps config-get [-c FILE] [--set KEY=VALUE ...] KEY [KEY ...]`: prints each KEY's effective value, one
 * per line, as the daemons parse the config; all or nothing (2 and no output for an unknown key, the secret,
 * or a config the daemons would refuse). */
int cmd_config_get(int argc, char **argv);

/* `pfcps embed [--flip] [--pad] [--batch N] [--device NAME] CKPT INPUT OUT.npy`: embeddings (N x D float32,
 * in input order) of a .bin set, a RecordIO pack, an image folder (recursive, sorted) or a list file
 * (tools/cmd_embed.c says how INPUT is recognised); --flip adds each flipped image's embedding. */
int cmd_embed(int argc, char **argv);

/* `pfcps verify [--images DIR] [--folds K] [--no-flip] [--pad] [--batch N] [--device NAME] CKPT SET`, or with
 * `--init NETWORK:D[:SEED]` (the untrained network, built as training starts) or `--pixels` (the raw pixels)
 * in place of CKPT: arcface_torch's verification (worker/eval/set.h) on a .bin set or a pairs file over DIR;
 * prints XNorm, Accuracy-Flip mean+-std and the best threshold on stdout. */
int cmd_verify(int argc, char **argv);

/* `pfcps export --format safetensors|onnx [--opset N] CKPT OUT` / `pfcps export --centers [--dim D]
 * RUN_OUTPUT OUT`: the backbone of a checkpoint as arcface_torch's state_dict in safetensors or as an
 * eval-mode ONNX model (worker/model/safetensors.h, onnx_export.h), or a run's class centers
 * (RUN_OUTPUT/centers/partition.rank<r>) as one C x D safetensors tensor (worker/model/centers_export.h).
 * Prints one summary line on stdout. */
int cmd_export(int argc, char **argv);

/* `pfcps plan --identities C --workers W --link-gbps G [--dim D] [--sample-rate R | --sampled K] [--batch B]
 * [--wire fp32|fp16|bf16] [--head-mode global|local] [--servers S] [--server-mem GIB] [--mem-bw GB/S]
 * [--gemm-gflops GFLOP/S] [--backbone-ms MS]`: the servers a run needs for memory and for bandwidth, the bytes
 * per step on a worker's and a server's link, and the step time bounded by link, server memory and head
 * compute (tools/plan.h). Exit 1 when no server count fits (or --servers is too few). */
int cmd_plan(int argc, char **argv);

/* `pfcps ckpt-info [--newest] [--run ID] DIR`: the checkpoints under a run's output (DIR/snapshots) or a
 * checkpoint root: per step, complete or not (every member's files present, verified and of one run:
 * common/snapfile.h, common/ckpt.h; with PFCPS_SECRET set, every .snap's HMAC too), members, bytes, the
 * SHA-256 of the class-center table in class order (independent of the number of servers), of worker 0's
 * backbone (its tensors), below it the run id, seed and config digest; --newest prints only the newest
 * complete step (0: none); --run ID (32 hex digits) leaves out the steps another run wrote. Exit 1 when DIR
 * is missing, not a folder or cannot be read; 2 for a usage error (a run id that is not 32 hex digits). */
int cmd_ckpt_info(int argc, char **argv);

/* `pfcps top [--interval SECONDS] [--count N | --once] URL [URL ...]`: a running job's view from its daemons'
 * Prometheus endpoints (docs/metrics.md): each URL's /targets (HTTP service discovery, served by server 0)
 * names the members, else the URL is one; every SECONDS (1) each member's /metrics is scraped (libcurl,
 * in parallel, 0.8 s each) and one row per member printed on stdout, sorted by role then rank (the screen
 * cleared first when stdout is a terminal): step, steps/s and samples/s (two scrapes apart), loss, lr, wait
 * per step (a server's median apply time), resident memory and its share of the memory limit, a server's
 * rows pulled / pushed per second, queue depth and snapshot age; "down" and the error for a member that did
 * not answer. --count N: N refreshes (0: until SIGINT / SIGTERM); --once: one, without rates. Exit 1 when no
 * member answered at the last refresh. */
int cmd_top(int argc, char **argv);

#endif
