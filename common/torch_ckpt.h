/* arcface_torch's `checkpoint_gpu_<rank>.pt` files (save_all_states = True; layout in common/torch_pt.h): how a
 * run trained in arcface_torch continues in pfcps at the step where it stopped. The servers (their step clock)
 * and the workers (the lr schedule, the data position) take the step from the same file, the set named by
 * `pretrained_centers`; the workers take the backbone's SGD momentum from the file named by `pretrained`. */
#ifndef PFCPS_COMMON_TORCH_CKPT_H
#define PFCPS_COMMON_TORCH_CKPT_H

#include <stdint.h>

/* The rank r of a file name (no folder) `checkpoint_gpu_<r>.pt` (decimal, no leading zero, r < 65536), or -1
 * for any other name. */
int tpc_rank_of(const char *name);

/* What train_v2.py had done when it wrote a checkpoint_gpu file. */
typedef struct tpc_progress {
    int present;         /* 0: `path` is not named checkpoint_gpu_<r>.pt (nothing read, the rest 0) */
    int64_t global_step; /* optimizer steps done (train_v2.py's global_step) */
    int64_t epoch;       /* epochs done (its `epoch`: training restarts at this epoch) */
    double lr;           /* state_optimizer's param_groups[0]['lr']: the lr of step global_step + 1; -1 when the
                            file has no state_optimizer */
} tpc_progress;

/* Reads the root's "global_step" and "epoch" (ints >= 0) and, when the file has a state_optimizer,
 * "state_optimizer/param_groups/0/lr" (a float >= 0) from `path` when its name is checkpoint_gpu_<r>.pt (only the
 * pickle is read, no tensor data). Returns 0 (out->present 0 for another name), or the errors of tp_open, or
 * -EINVAL "<path>: ..." naming the key that is missing, of another type or negative. */
int tpc_read_progress(const char *path, tpc_progress *out);

#endif
