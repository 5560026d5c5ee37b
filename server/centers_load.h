/* pretrained_centers (docs/configuration.md): the class centers a new run's servers start from, instead of
 * the generated ones (server/shard.h). Each server reads only the rows it owns (class c at local row c div S
 * of server c mod S), for any number of servers S:
 * - a safetensors file (common/safetensors.h) with a C x D F32 tensor `weight` (arcface_torch's name) or
 *   `centers` (what `pfcps export --centers` writes; not both), and optionally a C x D F32 `momentum` or
 *   `momentum_buffer` (not both); without one the momentum starts at 0;
 * - one of arcface_torch's `checkpoint_gpu_<rank>.pt` files (common/torch_pt.h): then the whole set
 *   checkpoint_gpu_0.pt .. checkpoint_gpu_<W-1>.pt of its folder is read (W: the highest rank present + 1;
 *   every rank below it must be there). Rank r of W holds classes [(C div W) r + min(r, C mod W), + C div W +
 *   (r < C mod W)) as `state_dict_softmax_fc/weight` (arcface_torch's PartialFC_V2 split), and its SGD
 *   momentum at state_optimizer/state/<P>/momentum_buffer with P = state_optimizer/param_groups/1/params/0
 *   (the head's parameter group), taken when present (every rank or none). `global_step` and `epoch` are
 *   logged; the lr schedule does not continue from them (yet).
 * Refused, with a message naming the file and the tensor: a missing tensor or rank file, a dtype other than
 * F32, a shape other than C x D (for a rank file: D columns and its split's rows; rank files whose rows do
 * not add up to C are named with their counts), a NaN or infinity (naming the row, its class and the
 * element). Under optimizer = adamw only the weights are taken, from a safetensors file without momentum
 * (AdamW's moments start at zero): a momentum tensor or a checkpoint_gpu set is refused (the AdamW state of
 * arcface_torch's checkpoints is not carried over). */
#ifndef PFCPS_SERVER_CENTERS_LOAD_H
#define PFCPS_SERVER_CENTERS_LOAD_H

#include "server/shard.h"

/* Loads the rows of sh from path (above) and marks them generated. Call before the fill starts and before
 * serving (nothing else may touch the table). Returns 0, -EINVAL (the checks above), -EPROTO (a malformed
 * file: st_parse, tp_open), -ENOENT / -EACCES / -EIO, -ENOMEM; a message naming the file. */
int centers_load(shard *sh, const char *path);

#endif
