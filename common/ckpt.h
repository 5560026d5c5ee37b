/* Checkpoint folders. The names used for checkpoints everywhere in pfcps (this header owns them):
 *   checkpoint T = every member's files for step T (steps completed) | root = the folder of step folders
 *   (config snapshot_dir, default <output>/snapshots) | step folder = <root>/step-<T> | member file = one
 *   member's file in it, <role>-<r>-of-<n><ext> | role = "shard" (a server) or "worker" | shard file = a
 *   server's .snap, written by a shard snapshot (server/snapshot.h, snap_*) | worker files = a worker's .snap
 *   and .model (worker/resume.h, wresume_*) | snapfile = the .snap container (common/snapfile.h) | backbone
 *   file = model_save's format (.model, model.ckpt: worker/model/model.h) | complete = every member's files
 *   present and verified | usable = this member's files present and verified (resume).
 * Every member writes its part of checkpoint T into the step folder:
 *   shard-<s>-of-<S>.snap        server s of S: its shard (server/snapshot.h)
 *   worker-<w>-of-<W>.snap       worker w of W: optimizer, loss scaler, step, RNG and loader state
 *   worker-<w>-of-<W>.model      worker w of W: the backbone with its BN statistics (backbone file)
 * `pfcps ckpt-info` lists the checkpoints of a root and says which are complete.
 *
 * Run identity (common/ckpt_ident.h): every file of a checkpoint carries the run id (16 random bytes picked
 * by the rendezvous at the run's first start and kept across resumes: the resumed step's), the seed and the
 * config digest (ckpt_config_digest): in the .snap headers, and as extras of the .model (ckpt_ident_extras).
 * A step whose files disagree on any of them, or whose identity is not the resuming run's, is not usable.
 *
 * Step folder names are canonical: "step-" then T > 0 in decimal without leading zeros or sign, at most
 * INT64_MAX; member files likewise "<role>-<r>-of-<n><ext>" with r and n so written. Other names that look
 * like steps (step-0072, step-99999999999999999999) are skipped with a warning. */
#ifndef PFCPS_COMMON_CKPT_H
#define PFCPS_COMMON_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt_ident.h"
#include "common/config.h"

/* The config keys of the run identity, whose values a resumed run must share with the run that wrote the
 * checkpoint: they fix what the saved state means (num_classes, embedding_size: the table; network: the
 * backbone; optimizer: the optimizer arrays) and where in the data stream step T is (seed, batch_size,
 * num_image, sample_rate: data order, flips and Partial FC sampling). Tuning keys (lr, momentum,
 * weight_decay, margin_list, scale, num_epoch, warmup_epoch, ...), the cluster's shape (servers, workers:
 * a checkpoint loads into another S and W) and paths (rec, output, snapshot_dir: data and runs move) are not
 * part of it. NULL-terminated. */
extern const char *const ckpt_ident_keys[];

/* The config digest: SHA-256 of "<key> = <value>\n" for each of ckpt_ident_keys in order, values as
 * cfg_to_ini writes them. Returns 0 or -EIO (OpenSSL) with a message. */
int ckpt_config_digest(const pf_config *cfg, uint8_t d[CKPT_DIGEST_BYTES]);

/* The identity of the run with config cfg and run id run_id: seed and config digest from cfg. Returns 0 or
 * ckpt_config_digest's error. */
int ckpt_ident_of(const pf_config *cfg, const uint8_t run_id[CKPT_RUN_ID_BYTES], ckpt_ident *id);

/* The 32 lowercase hex digits of a run id, NUL-terminated. */
void ckpt_run_id_hex(const uint8_t run_id[CKPT_RUN_ID_BYTES], char out[2 * CKPT_RUN_ID_BYTES + 1]);

/* The n bytes written as the 2n hex digits of s and nothing after (lowercase only when lower_only; the run
 * ids and digests ckpt_run_id_hex and the markers write are lowercase, a config's resume_run may be either)
 * into out. Returns 0, or -EINVAL (out untouched) for any other text. */
int ckpt_unhex(const char *s, uint8_t *out, size_t n, int lower_only);

/* Compares two identities field by field. Returns 0 when equal, else the number of fields that differ, with
 * "<field> <a> vs <b>" for each ("run_id 5f3a... vs 9c2b..., seed 7 vs 2048, config_digest 0d1e2f3a vs
 * 77aa10bc"; the header field names) in out[cap] (truncated to fit). */
int ckpt_ident_diff(const ckpt_ident *a, const ckpt_ident *b, char *out, size_t cap);

/* The identity as backbone-file extras (worker/model/model.h model_extra: name[32], f64 bits): count
 * CKPT_IDENT_EXTRAS, names "ckpt.run_id.0", "ckpt.run_id.1", "ckpt.seed", "ckpt.config_digest.0" .. ".3", the
 * values stored by their bits (little-endian u64 pieces). ckpt_ident_extras fills names[i] (32 bytes each)
 * and bits[i]; ckpt_ident_from_extras finds them among n extras (name / bits pairs as read back) and returns
 * 0, or -ENOENT "no run identity (extra '<name>' missing)". */
#define CKPT_IDENT_EXTRAS 7
void ckpt_ident_extras(const ckpt_ident *id, char names[CKPT_IDENT_EXTRAS][32],
                       uint64_t bits[CKPT_IDENT_EXTRAS]);
int ckpt_ident_from_extras(const char (*names)[32], const uint64_t *bits, int n, ckpt_ident *id);

/* The checkpoint root of a run config: snapshot_dir, or <output>/snapshots when it is empty. */
void ckpt_root(const pf_config *cfg, char *buf, size_t n);

/* The step folder <root>/step-<T>. */
void ckpt_step_dir(const char *root, int64_t step, char *buf, size_t n);

/* The member file <root>/step-<T>/<role>-<r>-of-<n><ext>, role "shard" or "worker", ext ".snap" or
 * ".model". */
void ckpt_member_path(const char *root, int64_t step, const char *role, int r, int n, const char *ext,
                      char *buf, size_t len);

/* T of a canonical step folder name "step-<T>" (see above), or -1 for any other name. */
int64_t ckpt_parse_step(const char *name);

/* The checkpoint steps under root (canonical step folders step-<T>, T > 0), newest first, into *steps
 * (malloc'd, free it; NULL when none). Names that look like steps but are not canonical are logged with a
 * warning and skipped (ckpt_prune and ckpt_remove_empty skip them silently). Returns their number (0 when
 * root does not exist), or -ENOMEM, or -EACCES / -ENOTDIR / -EIO "cannot read the checkpoint root <root>:
 * <reason>" when root exists but cannot be listed (permission denied, not a folder, a file on the way). */
int ckpt_list_steps(const char *root, int64_t **steps);

/* One member's test of one checkpoint step: 0 when the step is usable by the member (its files present,
 * verified whole, and agreeing on the run identity, which goes to *id), else a negative code with the reason
 * in pf_errmsg(). `arg` is the caller's. */
typedef int (*ckpt_step_check)(const char *root, int64_t step, void *arg, ckpt_ident *id);

/* The checkpoint steps under root that are usable by this member (its files present and verified), reported
 * at join with their identities so that the rendezvous picks the newest step every member holds from the
 * same run (both daemons, resume = true). Every step of ckpt_list_steps is tried with check, newest first,
 * until cap are usable; each refused step is logged "resume: checkpoint step <T> not usable by this
 * <member>: <reason>" (member "server" or "worker"), then one line counts them ("... usable by <who>", who
 * e.g. "shard 0", "worker 1"). The usable steps go to usable[] and their identities to ids[], newest first.
 * Returns how many (0 when none or root missing), or ckpt_list_steps' error when root cannot be read (a
 * resume must not start afresh over checkpoints it cannot see). */
int ckpt_resume_steps(const char *root, const char *member, const char *who, ckpt_step_check check, void *arg,
                      int64_t *usable, ckpt_ident *ids, int cap);

/* A PyTorch-module rank's part of checkpoint T (pfcps.torch: the backbone, its optimizer and the module's
 * state are in the script's own files, which pfcps does not see): the marker file
 * <root>/step-<T>/worker-<r>-of-<W>.module, six text lines "pfcps module checkpoint 1", "step T",
 * "rank r of W", "run_id <32 hex>", "seed <u64>", "config_digest <64 hex>". With every rank's marker present
 * the step counts as complete (pruning, ckpt-info), as with pfcps-worker's .snap/.model files.
 * ckpt_module_marker_write writes it atomically, creating the step folder when root exists; -ENOENT when root
 * does not exist on this host (the servers' folder is not shared here: nothing written), -EIO naming the file
 * otherwise. ckpt_module_marker_read parses one and checks its step, rank and W against the expected ones:
 * 0 with *id, -ENOENT (missing), -EINVAL "<path>: <what is wrong>". */
int ckpt_module_marker_write(const char *root, int64_t step, int rank, int workers, const ckpt_ident *id);
int ckpt_module_marker_read(const char *path, int64_t step, int rank, int workers, ckpt_ident *id);

/* Scans the step folder <root>/step-<T> for member files <role>-<r>-of-<n><ext> (0 <= r < n): *count = how
 * many, *of = their n when they all agree (-1: files of different shapes; 0: none). `seen` (may be NULL) gets
 * a 1 at [r] for every r < seen_cap found. Returns 0, or -ENOENT when the folder is missing. */
int ckpt_scan_members(const char *root, int64_t step, const char *role, const char *ext, int *count, int *of,
                      uint8_t *seen, int seen_cap);

/* Removes old checkpoints of `role` ("shard" or "worker") after this member (rank) wrote one. In a folder
 * shared by the members (another rank's files visible), only steps older than the `keep` newest complete
 * ones (every shard and worker file present) go, every file of them (also those of ranks a reshaped run no
 * longer has), and every incomplete step older than the newest complete one: the files a failed checkpoint
 * (disk full) left behind, which no member writes to any more. In a private folder, this member's own
 * files beyond its newest `keep`. A checkpoint that failed on some member never costs the last complete
 * one. With `run` (not NULL), a step that holds a member file of another run (a .snap header or a .module
 * marker naming another run id: an earlier run in the same output folder, whose files a resume refused) is
 * neither counted nor removed: it is not this run's to judge, and counting it as a newer complete checkpoint
 * would prune this run's own steps as they are written. NULL: every step counts (files not read). */
void ckpt_prune(const char *root, const char *role, int rank, int keep, const ckpt_ident *run);

/* Removes empty step folders under root (rmdir leaves non-empty ones). */
void ckpt_remove_empty(const char *root);

#endif
