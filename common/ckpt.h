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
 * `pfcps ckpt-info` lists the checkpoints of a root and says which are complete. */
#ifndef PFCPS_COMMON_CKPT_H
#define PFCPS_COMMON_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

/* The checkpoint root of a run config: snapshot_dir, or <output>/snapshots when it is empty. */
void ckpt_root(const pf_config *cfg, char *buf, size_t n);

/* The step folder <root>/step-<T>. */
void ckpt_step_dir(const char *root, int64_t step, char *buf, size_t n);

/* The member file <root>/step-<T>/<role>-<r>-of-<n><ext>, role "shard" or "worker", ext ".snap" or
 * ".model". */
void ckpt_member_path(const char *root, int64_t step, const char *role, int r, int n, const char *ext,
                      char *buf, size_t len);

/* The checkpoint steps under root (step folders step-<T>, T > 0), newest first, into *steps (malloc'd, free
 * it). Returns their number (0 when root does not exist), or -ENOMEM. */
int ckpt_list_steps(const char *root, int64_t **steps);

/* One member's test of one checkpoint step: 0 when the step is usable by the member (its files present and
 * verified whole), else a negative code with the reason in pf_errmsg(). `arg` is the caller's. */
typedef int (*ckpt_step_check)(const char *root, int64_t step, void *arg);

/* The checkpoint steps under root that are usable by this member (its files present and verified), reported
 * at join so that the rendezvous picks the newest step every member holds (both daemons, resume = true).
 * Every step of ckpt_list_steps is tried with check, newest first, until cap are usable; each refused step is
 * logged "resume: checkpoint step <T> not usable by this <member>: <reason>" (member "server" or "worker"),
 * then one line counts them ("... usable by <who>", who e.g. "shard 0", "worker 1"). The usable steps go to
 * usable[], newest first. Returns how many (0 when none, root missing or unreadable). */
int ckpt_resume_steps(const char *root, const char *member, const char *who, ckpt_step_check check, void *arg,
                      int64_t *usable, int cap);

/* Scans the step folder <root>/step-<T> for member files <role>-<r>-of-<n><ext> (0 <= r < n): *count = how
 * many, *of = their n when they all agree (-1: files of different shapes; 0: none). `seen` (may be NULL) gets
 * a 1 at [r] for every r < seen_cap found. Returns 0, or -ENOENT when the folder is missing. */
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
