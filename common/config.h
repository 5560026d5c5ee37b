/* Run configuration: one INI file (parsed by inih), keys named as in arcface_torch's configs so users
 * can carry theirs over, plus pfcps's cluster keys. `--set key=value` on any command line overrides the
 * file. Every process of a run uses the same effective config: the rendezvous (server 0) sends its
 * text to every member in the join reply.
 *
 * Sections group keys for readability ([train], [data], [cluster], [server]); a key is looked up by
 * name in the table of known keys, whatever section it appears in. See docs/configuration.md. */
#ifndef PFCPS_COMMON_CONFIG_H
#define PFCPS_COMMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CFG_STR 256

typedef struct pf_config {
    /* --- model / head (arcface_torch names) --- */
    char network[CFG_STR];                 /* r18 r34 r50 r100 r200 mbf, or tiny test nets; default "r50" */
    int embedding_size;                    /* D, default 512 */
    double sample_rate;                    /* Partial FC sample rate r in [0, 1], default 1.0 (0: the batch's
                                              positive classes only) */
    double margin_list[3];                 /* (m1, m2, m3), default (1.0, 0.5, 0.0) = ArcFace */
    double scale;                          /* logit scale s, default 64 */
    double interclass_filtering_threshold; /* 0 = off */
    char margin_grad[CFG_STR];             /* "straight_through" (default, arcface_torch) or "exact" */
    char sample_rounding[CFG_STR];         /* Partial FC's sample count: "floor" (default, arcface_torch's
                                              int(sample_rate * P)) or "ceil" */
    char margin_combine[CFG_STR];          /* "arcface_torch" (default: m3 > 0 is CosFace alone, m1 != 1 refused)
                                              or "full": cos(m1 theta + m2) - m3 for any triple */
    char pfc_update[CFG_STR]; /* "dense" (default, PartialFC_V2: every class center moves every step) or
                                 "sparse" (only the rows a step pulled) */
    int fp16;             /* mixed precision, fp16 body + dynamic loss scaling, default false */
    int bf16;             /* mixed precision, bf16 body, default false (not with fp16) */
    char fp16_overflow_skip[CFG_STR]; /* with fp16, what a step whose gradients overflowed skips: "step"
                                         (default, GradScaler: the whole optimizer step, class centers
                                         included) or "backbone" (the backbone's step only; the centers'
                                         push overlaps the backward) */
    char backbone_grad_comm[CFG_STR]; /* the workers' allreduce of backbone gradients: "fp16" (default,
                                         arcface_torch's DDP fp16_compress_hook: each gradient rounded to
                                         fp16, divided by W and summed in fp16) or "fp32" */
    char device[CFG_STR]; /* "cpu" (default), "cuda"; debugging devices "cpu-fenced", "cpu-bf16" */
    /* --- optimizer / schedule --- */
    char optimizer[CFG_STR];  /* "sgd" (default) or "adamw" */
    double lr;                /* default 0.1 */
    double momentum;          /* default 0.9 */
    double weight_decay;      /* default 5e-4 */
    int batch_size;           /* per worker, default 128 */
    int gradient_acc;         /* arcface_torch's gradient_acc: an optimizer step every this many global steps,
                                 the gradients of those batches summed; default 1 */
    int64_t num_classes;      /* C, required (> 0) */
    int64_t num_image;        /* images in the dataset; 0 = read from the dataset */
    int num_epoch;            /* default 20 */
    double warmup_epoch;      /* default 0; <= 0: no warmup (3millions.py's -1) */
    char lr_scheduler[CFG_STR]; /* "polynomial_lr_warmup" (default, train_v2.py's PolynomialLRWarmup) or
                                   "poly_scheduler" (the older PolyScheduler, power 2) */
    char pretrained[CFG_STR]; /* backbone to start from: safetensors (arcface_torch names) or a pfcps
                                 model.ckpt; "" = none */
    char pretrained_centers[CFG_STR]; /* class centers the servers start from: safetensors (`weight` or
                                         `centers`, C x D F32, optional `momentum`) or arcface_torch's
                                         checkpoint_gpu_<r>.pt set (server/centers_load.h); "" = none */
    /* --- data / output --- */
    char rec[CFG_STR];    /* dataset prefix or directory (train.rec/train.idx), or "synthetic"; required */
    char synthetic[CFG_STR]; /* rec = synthetic: "arcface_torch" (default, its SyntheticDataset: one image, label
                                1, 1,000,000 samples) or "varied" (an image per sample, uniform labels) */
    int frequent;         /* log every N steps, default 10 */
    int verbose;          /* verification every N steps (arcface_torch), default 2000 */
    char output[CFG_STR]; /* output directory, default "work_dirs/pfcps" */
    int64_t seed;         /* default 2048 */
    int num_workers;      /* data loader threads per worker, default 2 */
    int resume;           /* default false */
    char resume_run[CFG_STR]; /* with resume = true: the run id (32 hex digits, `pfcps ckpt-info`, server 0's
                                 "run id" log line) whose checkpoints alone count; "" (default): any run's
                                 with this config */
    int save_all_states;  /* default false */
    int skip_bad_records; /* default false: a bad record stops the loader */
    int resize;           /* default false: images not 112x112 are an error; true: resized */
    char val_targets[CFG_STR]; /* verification sets (arcface_torch): .bin names in the rec folder or paths,
                                  comma-separated; "" = none */
    int save_centers; /* default false: true: each worker writes its partition of the class-center table at
                         the end */
    char log_format[CFG_STR]; /* training.log's line prefix: "pfcps" (default, as stderr) or "arcface_torch"
                                 (`Training: <local asctime>-<message>`, its utils_logging format) */
    /* --- cluster --- */
    int servers;              /* S, default 1 */
    int workers;              /* W, default 1 */
    char provider[CFG_STR];   /* libfabric provider: "tcp" (default, means tcp;ofi_rxm), "shm", "verbs" */
    char rendezvous[CFG_STR]; /* host:port of server 0's control plane, default "127.0.0.1:29500" */
    char wire_dtype[CFG_STR]; /* "fp32" (default), "fp16", "bf16" */
    int max_staleness;        /* 0 = BSP (default); k = pulls may run k steps ahead (SSP) */
    char data_address[CFG_STR]; /* "auto" (default): where the route to the rendezvous leaves; "any"; an address */
    char metrics_address[CFG_STR]; /* host:port of this member's Prometheus /metrics endpoint (port 0: a free
                                      one); default "" = off. Member-local: each daemon uses its own value */
    char head_mode[CFG_STR];  /* "global" (default) or "local" */
    char secret[CFG_STR];     /* shared join secret; default "" = read PFCPS_SECRET from the environment */
    int ctl_max_frame;        /* control-plane frame limit, bytes, default 1 MiB */
    double ctl_timeout;       /* control-plane read timeout, seconds, default 30 */
    double join_timeout;      /* how long a member waits to reach the rendezvous and for the run to form,
                                 seconds, default 600 (torchrun's rendezvous join_timeout). Member-local */
    /* --- server --- */
    char snapshot_dir[CFG_STR]; /* default "" = <output>/snapshots */
    int snapshot_every;         /* steps between checkpoints, 0 = off (default); one is also written at the end */
    int replicas;               /* 0 (default) or 1: every shard also has a hot-standby copy on the next
                                   server (docs/architecture.md, "Hot-standby shards") */
    int snapshot_keep;          /* newest checkpoints each member keeps on disk (default 2) */
    char on_member_loss[CFG_STR];  /* "exit" (default: stop with 75 so the run re-forms) or "serve" (inspection) */
    int apply_threads;          /* server threads applying pushes and gathering pulls, default 2 */
    char center_init[CFG_STR];  /* "eager" (default): servers generate every class center in the background
                                   from start; "lazy": each on its first pull or push */
} pf_config;

/* Fills `cfg` with the defaults listed above (num_classes 0 and rec "" still need to be set). */
void cfg_defaults(pf_config *cfg);

/* Loads `path` (INI; NULL = defaults only), then applies `nset` overrides "key=value" in order, then
 * validates. The file is opened with pf_open_regular (a FIFO, device or folder is refused at once).
 * Returns 0, or -EINVAL / -ENOENT with pf_errmsg() naming the file, line, key and problem:
 * unknown key (with a did-you-mean suggestion), wrong type, out of range, missing required key;
 * -EACCES "permission denied" / -EIO "a FIFO, not a regular file" (and other kinds) naming the file. */
int cfg_load(pf_config *cfg, const char *path, const char *const *sets, int nset);

/* Sets one key from its text value (the `--set` path). Returns 0 or -EINVAL with a message. */
int cfg_set(pf_config *cfg, const char *key, const char *value);

/* Checks ranges and required keys. Returns 0 or -EINVAL naming the key. */
int cfg_validate(const pf_config *cfg);

/* Writes the effective config as INI text (every key, `key = value`), parseable by cfg_load.
 * Returns the malloc'd text or NULL on out of memory. Used to ship the config in the join reply. */
char *cfg_to_ini(const pf_config *cfg);

/* Parses config text produced by cfg_to_ini (or any INI text). Same errors as cfg_load. */
int cfg_load_text(pf_config *cfg, const char *text);

/* Applies an arcface_torch Python config (configs/NAME.py: `config = edict()` then `config.key = value`
 * lines) to cfg, without running Python (grammar in config_py.c: literals, tuples, lists, True/False/None,
 * integer arithmetic such as `30 * 10000`, comments, imports, a UTF-8 BOM at the start). Tuples and lists become comma-separated values
 * (margin_list, val_targets); None keeps the default, except `output = None` (or no `output` line), which is
 * work_dirs/<file name without .py>, as arcface_torch's get_config. arcface_torch keys pfcps does not use
 * (dali, dali_aug, gradient_acc, wandb_*, using_wandb, suffix_run_name, ...) are listed once in a warning;
 * any other unknown key, a value of the wrong type or out of range, and any construct outside the grammar
 * (a name, a call, a dict, statements joined by ';', an indented line, a second `config = edict()`, an
 * import binding `config` or another `edict`) are refused: -EINVAL (or cfg_set's code) with
 * "<where>:<line>: <problem>". Does
 * not validate: cfg_load_ex does that after the --set overrides. */
int cfg_load_py_text(pf_config *cfg, const char *text, const char *where);

/* Logs the effective config like arcface_torch's startup dump: one `: key<padding>value` per line
 * (key padded to 25 columns, as train.py does). The secret is shown only as "(set)". */
void cfg_log(const pf_config *cfg);

/* cfg_load with `check_required` = 0: ranges are checked but num_classes/rec may stay unset (a member
 * that takes the run config from the rendezvous needs from its own file the cluster keys, plus, for a
 * worker, the keys its endpoints are opened with before the run config arrives: provider, servers,
 * embedding_size, wire_dtype, device — worker/train.c refuses a worker whose values differ from the run's).
 */
int cfg_load_ex(pf_config *cfg, const char *path, const char *const *sets, int nset, int check_required);

/* cfg_validate without the required-key checks. */
int cfg_validate_ranges(const pf_config *cfg);

/* The join secret: cfg->secret when set, else $PFCPS_SECRET, else NULL. */
const char *cfg_secret(const pf_config *cfg);

/* The value of key `name` in cfg as cfg_to_ini writes it (text cfg_set parses back to the same value) into
 * out[cap]. Returns 0, or -EINVAL "unknown key '<name>'". */
int cfg_format_key(const pf_config *cfg, const char *name, char *out, size_t cap);

/* 1 when a lost worker of a run with this config is replaced in place (docs/architecture.md, "Worker
 * replacement in place"): replicas = 1 (the servers keep undo logs of the newest applied step's rows; under
 * gradient_acc the redo starts at a window start), either head_mode, and a device other than cuda (the NCCL
 * communicator is not rebuilt). Else 0,
 * with the first reason in why[n] (why may be NULL): such a loss re-forms the run from its checkpoint. */
int cfg_replaces_workers(const pf_config *cfg, char *why, size_t n);

/* The keys whose values a and b do not share, in table order, as "key = <a's> (<b's>)" joined by ", " into
 * out[cap] (cut at cap, "" when none): a key named in `skip` (NULL-terminated, may be NULL) is left out, and
 * so is, when `unset` is not NULL, a key whose value in a equals unset's (a config file that does not set
 * it). The secret is never compared (no run config carries it: cfg_to_ini leaves it out). Returns the
 * number of such keys. */
int cfg_diff(const pf_config *a, const pf_config *b, const pf_config *unset, const char *const *skip,
             char *out, size_t cap);

/* Member-local keys: each daemon takes them from its own --config / --set, never from the run config the
 * rendezvous sends (rendezvous, metrics_address, join_timeout, data_address, apply_threads). NULL-terminated.
 */
extern const char *const cfg_member_local_keys[];

/* The keys a worker's parameter-server endpoints and message buffers are opened and sized with from its own
 * config, before the run's arrives (servers, num_classes, embedding_size, wire_dtype, provider, replicas): a
 * member whose values differ from the run's cannot take part (worker/train_net.c train_net_check_run).
 * pfcps.torch sends them at its join, whose rendezvous refuses a mismatch. NULL-terminated. */
extern const char *const cfg_data_plane_keys[];

/* cfg_data_plane_keys, in the same order, then the keys pfcps-worker sets up its device and ring with before
 * the run's config arrives (device, fp16, bf16): pfcps-worker sends them at its join, whose rendezvous
 * refuses a mismatch (common/daemon.c daemon_join). NULL-terminated. */
extern const char *const cfg_worker_endpoint_keys[];

/* cfg's values of the keys in `list` (NULL-terminated) as "key = value" lines (cfg_format_key's text) into
 * out[cap]. Returns the length, or -EINVAL (an unknown key) / -ENOSPC. */
int cfg_keys_text(const pf_config *cfg, const char *const *list, char *out, size_t cap);

/* The keys of `text` ("key = value" lines, cfg_keys_text's) whose values differ from cfg's, as
 * "key = <text's> (<cfg's>)" joined by ", " into out[cap] (cut at cap, "" when none). A line without " = " or
 * naming an unknown key is skipped (a member that knows more keys); at most `text`'s first 4096 bytes are
 * read. Returns the number of differing keys. */
int cfg_keys_text_diff(const char *text, const pf_config *cfg, char *out, size_t cap);

/* The known keys, in table order (for docs and tests): count, and name of key i (NULL out of range). */
int cfg_key_count(void);
const char *cfg_key_name(int i);

#endif
