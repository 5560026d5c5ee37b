/* Shard snapshots: a server's shard file of a checkpoint (names: common/ckpt.h), a point-in-time copy of its
 * shard written while the server keeps serving, and its load at resume (docs/architecture.md, Checkpoints and
 * recovery).
 *
 * Writing (copy-on-update by row block, never fork(): the table is registered memory): the shard's rows are
 * cut into blocks of `block_rows` rows. A writer thread saves the blocks in order; an apply thread that is
 * about to change a row of a block not yet saved first copies that block aside (snap_before_update), and the
 * writer saves the copy when it gets there. Every block is therefore saved exactly as it stood when the
 * snapshot began, whatever pushes arrive meanwhile. A row never generated yet (shard.h: rows are created on
 * first touch) is saved with its initial value, computed into the copy, never into the table.
 *
 * File: common/snapfile.h container, role "shard", payload block by block: the block's weights (n x D fp32)
 * then its momentum (n x D fp32); the header carries the run identity and, with a key, an HMAC.
 * pfc_update = dense (header field dense): the payload starts with mu and wd (float64) and the lr of steps
 * 0 .. T-1 (T steps; float64, as shard.step_lr holds them, NaN for a skipped step), and each block ends with
 * its rows' steps (n x int64, shard.rstep); the rows are written as stored, not brought up to date with T,
 * and the table is not changed by a snapshot. The row of class c as it stands after T steps is the closed
 * form of its skipped steps (server/dense.h: dense_cache_get(lr, rstep, T - 1, mu, wd) applied by
 * dense_apply_row). optimizer = adamw (header field adamw, dense or not): the payload starts with beta1, beta2,
 * eps and wd (float64) and the lr of steps 0 .. T-1; each block holds its weights, first moments and second
 * moments (n x D fp32 each), then (dense) its rows' steps; a dense row as it stands after T steps is the replay
 * of the zero-gradient AdamW steps it skipped (server/adamw.h: adamw_coefs over the file's lr table, then
 * adamw_replay from its step to T - 1). Written to <root>/step-<T>/shard-<s>-of-<S>.snap with temp + fsync +
 * rename + folder fsync; progress (rows, MB/s) is logged every ~2 s and at the end.
 *
 * Loading: rows are redistributed on load, so a checkpoint written by S servers loads into S' servers: class
 * c (local row c div S of old shard c mod S) goes to local row c div S' of new shard c mod S'. A dense file's
 * rows keep their steps and the shard gets the file's lr table, so the closed form goes on exactly as in the
 * run that wrote it; a sparse file's rows are up to date with T. An AdamW file loads only into an AdamW shard
 * and an SGD file only into an SGD one (the optimizer state does not carry over: refused naming both). */
#ifndef PFCPS_SERVER_SNAPSHOT_H
#define PFCPS_SERVER_SNAPSHOT_H

#include <stdint.h>

#include "common/ckpt_ident.h"
#include "common/snapfile.h"
#include "server/shard.h"

typedef struct snap_job snap_job;

/* Starts writing shard `sh` as it stands now, as checkpoint `step` under `root`, on a new thread; the file
 * carries identity id and, when key is not NULL, its HMAC (both copied); a dense shard's lr of steps
 * 0 .. step-1 is copied now. From now on every change to a row
 * must be preceded by snap_before_update for that row, until snap_finish. The caller must not let anything
 * change the table between the last apply and this call. Returns 0, or -errno with a message (folder not
 * creatable, out of memory: nothing started). */
int snap_start(shard *sh, const char *root, int64_t step, const ckpt_ident *id, const snapfile_key *key,
               snap_job **out);

/* Called by a thread about to change local row `lrow` (weights or momentum): when the row's block is not yet
 * saved, copies it aside first (or waits while another thread copies it). Thread-safe; O(1) once the block
 * is saved. */
void snap_before_update(snap_job *j, int64_t lrow);

/* 1 when the writer thread has finished (successfully or not), else 0. */
int snap_done(const snap_job *j);

/* The checkpoint step of j. */
int64_t snap_step(const snap_job *j);

/* The fraction of the shard's rows the writer has saved so far, in [0, 1] (1 for an empty shard). Safe from
 * any thread while j exists. */
double snap_progress(const snap_job *j);

/* What a finished snapshot took (snap_finish_ex). */
typedef struct snap_outcome {
    int64_t step;
    double seconds; /* from snap_start to the writer's end */
    int64_t bytes;  /* size of the committed file (0 when it failed) */
} snap_outcome;

/* Waits for the writer, logs the outcome, frees j. Returns 0 when the file was committed, else the write's
 * error (-EIO naming the file: the previous checkpoints are untouched). */
int snap_finish(snap_job *j);

/* snap_finish, and *out (not NULL) gets its step, duration and file size. */
int snap_finish_ex(snap_job *j, snap_outcome *out);

/* Prunes old checkpoints after this server (rank) wrote one: ckpt_prune (common/ckpt.h) for role "shard",
 * keeping the newest `keep` (>= 1) complete ones; steps holding another run's files (run: this run's
 * identity) are left alone. */
void snap_prune(const char *root, int rank, int keep, const ckpt_ident *run);

/* Checks that checkpoint `step` under root is usable by a server of a run with C classes of dimension D:
 * every file it needs (all shard-<i>-of-<S0>.snap of one S0) is present, a regular file, with a header whose
 * fields agree with each other and with its name (snapfile_check_fields, snapfile_check_member), the same C
 * and D, the same run identity as shard-0-of-<S0>.snap's (run_id, seed, config_digest), its HMAC verified
 * when key is not NULL, and its payload hashing right. Returns 0 (with *old_servers = S0 and *id = the
 * files' identity), or a negative code with the first problem (file and field) in pf_errmsg(). */
int snap_check(const char *root, int64_t step, int64_t num_classes, int dim, const snapfile_key *key,
               int *old_servers, ckpt_ident *id);

/* Loads checkpoint `step` under root into sh (redistributing rows when it was written by another number of
 * servers), verifying every file as snap_check does as it reads, and (expect not NULL) that the files carry
 * identity *expect. Every row of sh is set; a dense shard (shard_dense_enable) also gets each row's step (a
 * dense file's, else `step`), and a dense or AdamW shard the lr of steps 0 .. step-1 (dense and AdamW files).
 * A dense file loaded into a sparse shard, or one whose mu / wd (AdamW: betas, eps, wd) differ from the
 * shard's, has its rows brought up to date with `step` here (the files of one checkpoint must carry the same
 * lr table: -EINVAL naming the file otherwise). An AdamW file into an SGD shard or the reverse: -EINVAL naming
 * the file and both optimizers.
 * Returns 0, or a negative code naming the file and the problem; on failure sh's content is unspecified and
 * the caller must not serve it. */
int snap_load(shard *sh, const char *root, int64_t step, const snapfile_key *key, const ckpt_ident *expect);

#endif
