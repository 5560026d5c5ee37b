/* Checkpoint folders: one checkpoint id is a step number T (steps completed). Every member writes its part of
 * checkpoint T into <root>/step-<T>/ (root: config key snapshot_dir, default <output>/snapshots):
 *   shard-<s>-of-<S>.snap        server s of S: its shard (server/snapshot.h)
 *   worker-<w>-of-<W>.snap       worker w of W: optimizer, loss scaler, step, RNG and loader state
 *   worker-<w>-of-<W>.model      worker w of W: the backbone with its BN statistics (model_save format)
 * A checkpoint is complete when the files of every member are there and valid (`pfcps ckpt-info`). */
#ifndef PFCPS_COMMON_CKPT_H
#define PFCPS_COMMON_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

/* The checkpoint root of a run config: snapshot_dir, or <output>/snapshots when it is empty. */
void ckpt_root(const pf_config *cfg, char *buf, size_t n);

/* <root>/step-<T>. */
void ckpt_step_dir(const char *root, int64_t step, char *buf, size_t n);

/* <root>/step-<T>/<role>-<r>-of-<n><ext>, role "shard" or "worker", ext ".snap" or ".model". */
void ckpt_member_path(const char *root, int64_t step, const char *role, int r, int n, const char *ext,
                      char *buf, size_t len);

/* The checkpoint steps under root (folders named step-<T>, T > 0), newest first, into *steps (malloc'd, free
 * it). Returns their number (0 when root does not exist), or -ENOMEM. */
int ckpt_list_steps(const char *root, int64_t **steps);

/* One member's test of one checkpoint step: 0 when the member could resume from it (its files are there and
 * verified whole), else a negative code with the reason in pf_errmsg(). `arg` is the caller's. */
typedef int (*ckpt_step_check)(const char *root, int64_t step, void *arg);

/* The checkpoint steps under root that this member could resume from, reported at join so that the
 * rendezvous picks the newest step every member holds (both daemons, resume = true). Every step of
 * ckpt_list_steps is tried with check, newest first, until cap are usable; each refused step is logged
 * "resume: checkpoint step <T> not usable by this <member>: <reason>" (member "server" or "worker"), then one
 * line counts them ("... usable by <who>", who e.g. "shard 0", "worker 1"). The usable steps go to usable[],
 * newest first. Returns how many (0 when none, root missing or unreadable). */
int ckpt_resume_steps(const char *root, const char *member, const char *who, ckpt_step_check check, void *arg,
                      int64_t *usable, int cap);

/* Scans <root>/step-<T> for files named <role>-<r>-of-<n><ext> (0 <= r < n): *count = how many, *of = their n
 * when they all agree (-1: files of different shapes; 0: none). `seen` (may be NULL) gets a 1 at [r] for
 * every r < seen_cap found. Returns 0, or -ENOENT when the folder is missing. */
int ckpt_scan_members(const char *root, int64_t step, const char *role, const char *ext, int *count, int *of,
                      uint8_t *seen, int seen_cap);

/* Removes old checkpoints of `role` ("shard" or "worker") after this member (rank) wrote one. In a folder
 * shared by the members (another rank's files visible), only steps older than the `keep` newest complete
 * ones (every shard and worker file present) go, every file of them (also those of ranks a reshaped run no
 * longer has); in a private folder, this member's own files beyond its newest `keep`. A checkpoint that
 * failed on some member never costs the last complete one. */
void ckpt_prune(const char *root, const char *role, int rank, int keep);

/* Removes empty step folders under root (rmdir leaves non-empty ones). */
void ckpt_remove_empty(const char *root);

#endif
