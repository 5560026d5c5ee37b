/* A worker's part of a checkpoint, its worker files (names: common/ckpt.h): everything it needs to continue
 * exactly where checkpoint step T left off, in two member files in the step folder <root>/step-<T>/:
 *   worker-<w>-of-<W>.model  the backbone file with its BN statistics (model_save_ex), loadable by users
 *   worker-<w>-of-<W>.snap   common/snapfile.h container, role "worker", rows = parameter count; payload:
 *                            u32 count, count x (char name[24], u64 value) scalars (doubles stored by their
 *                            bits), the SHA-256 of the .model file (binding the pair), then the optimizer
 * state as fp32 arrays of `rows` elements: SGD momentum, or AdamW's first and second moment. The scalars:
 * step, opt_steps, amp.scale, amp.growth_tracker, dropout_rng, first_loss, val_highest.<i>. Nothing else is
 * needed: the data order, flips and Partial FC sampling are functions of (seed, epoch, step), so the loader
 * restarts at batch T mod steps_per_epoch of epoch T div steps_per_epoch. Every worker writes its own pair
 * (all workers hold the same backbone and optimizer state); a resume with W' workers reads worker (w mod
 * W)'s. The .snap binds the .model by its digest: the two are one pair. Both carry the run identity (the
 * .snap in its header, the .model as extras, common/ckpt.h) and a reader checks that they agree; with the
 * checkpoint key the .snap carries an HMAC, which through the digest authenticates the .model too. */
#ifndef PFCPS_WORKER_RESUME_H
#define PFCPS_WORKER_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt_ident.h"
#include "common/snapfile.h"
#include "worker/model/model.h"

#define WRESUME_MAX_SCALARS 32

typedef struct wresume_scalar {
    char name[24];
    uint64_t bits; /* an integer, or a double's bits (wresume_get_f64) */
} wresume_scalar;

typedef struct wresume_state {
    int n;
    wresume_scalar s[WRESUME_MAX_SCALARS];
} wresume_state;

/* Scalars by name: set (replacing) / get. get returns 0, or -ENOENT naming the missing scalar. */
void wresume_set_i64(wresume_state *st, const char *name, int64_t v);
void wresume_set_f64(wresume_state *st, const char *name, double v);
int wresume_get_i64(const wresume_state *st, const char *name, int64_t *v);
int wresume_get_f64(const wresume_state *st, const char *name, double *v);

/* Writes worker `rank` of W's worker files (the pair) for checkpoint `step` under root: the backbone of m
 * (with the model extras x[0..nx), nx <= MODEL_EXTRAS_MAX - CKPT_IDENT_EXTRAS, then the identity id as
 * extras), then the .snap with id in its header (and its HMAC under key when key is not NULL), st and the
 * optimizer arrays arrays[0..narrays) of nparams floats each (host memory). Both files follow the temp +
 * fsync + rename discipline. Returns 0 or -EIO / -ENOMEM / -EINVAL (too many extras) naming the file; a
 * failure leaves earlier checkpoints untouched. */
int wresume_save(const char *root, int64_t step, int rank, int W, const model *m, const model_extra *x,
                 int nx, const wresume_state *st, const float *const *arrays, int narrays, size_t nparams,
                 const ckpt_ident *id, const snapfile_key *key);

/* Checks that checkpoint `step` under root is usable by this worker (rank of W): it holds the worker files of
 * worker (rank mod W0), W0 the writers' count, both regular files, the .snap's header agreeing with its name,
 * its HMAC verified when key is not NULL, the .snap verified whole, the .model's digest matching the one the
 * .snap recorded and its identity extras equal to the .snap's header (run_id, seed, config_digest). Returns
 * 0 (with *src_rank, *src_W the pair used and *id the pair's identity), or a negative code naming the file
 * and the problem (the field, for a header or identity). */
int wresume_check(const char *root, int64_t step, int rank, int W, const snapfile_key *key, int *src_rank,
                  int *src_W, ckpt_ident *id);

/* Loads checkpoint `step` for worker rank of W into m (model_load_ex: the network must match), st and the
 * optimizer arrays (narrays x nparams floats, host). The pair is re-verified as it is read (wresume_check
 * with key), and must carry identity *expect (when not NULL). Returns 0 or a negative code naming the file
 * and the problem (m may then hold the loaded backbone; do not train on). */
int wresume_load(const char *root, int64_t step, int rank, int W, const snapfile_key *key,
                 const ckpt_ident *expect, model *m, wresume_state *st, float *const *arrays, int narrays,
                 size_t nparams);

/* Prunes old checkpoints after this worker (rank) wrote one: ckpt_prune (common/ckpt.h) for role "worker",
 * keeping the newest `keep` complete ones; steps holding another run's files (run: this run's identity) are
 * left alone. */
void wresume_prune(const char *root, int rank, int keep, const ckpt_ident *run);

#endif
