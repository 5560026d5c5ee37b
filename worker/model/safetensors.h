/* The backbone as arcface_torch's state_dict: exported to and loaded from safetensors files (the format:
 * common/safetensors.h) and arcface_torch's torch.save files (common/torch_pt.h). */
#ifndef PFCPS_WORKER_MODEL_SAFETENSORS_H
#define PFCPS_WORKER_MODEL_SAFETENSORS_H

#include "common/safetensors.h"
#include "worker/model/model.h"

/* The backbone's parameters and BN running statistics as arcface_torch's state_dict (the model's tensor
 * names are PyTorch's: iresnet `conv1.weight`, `layer1.0.bn1.running_mean`, ..., `fc.weight` (D, C*49),
 * `features.*`; mbf `layers.0.layers.0.weight`, ..., `features.layers.3.*`), all F32 in the model's shapes,
 * plus one I64 scalar `<bn>.num_batches_tracked` = 0 per batch norm (PyTorch's BatchNorm buffer that
 * load_state_dict(strict=True) asks for; pfcps does not count batches: 0 is what a fresh module holds, and
 * it only matters to BatchNorm with momentum=None). __metadata__: format "pt", producer "pfcps", network,
 * embedding_size. Read from the device through host copies. Returns 0, -EIO, -ENOMEM, the device's error. */
int model_export_safetensors(const model *m, const char *path);

/* Initialises m's parameters and BN running statistics from path:
 * - a pfcps checkpoint (starts with "PFCPSBB1"): model_load (same network and D, verified);
 * - a torch.save zip archive (starts with "PK\3\4"): arcface_torch's `model.pt` (the backbone's
 *   state_dict) or a `checkpoint_gpu_<rank>.pt` (its "state_dict_backbone"), read by tp_read_backbone
 *   (common/torch_pt.h; a legacy pre-zip torch.save file is refused by name) into a safetensors image
 *   held to the rules below;
 * - else a safetensors file in arcface_torch's names (as model_export_safetensors writes, or
 *   `safetensors.torch.save_file(backbone.state_dict(), path)` in PyTorch): every parameter and running
 *   statistic of m present, F32, in m's shape; `*.num_batches_tracked` entries ignored; any other tensor
 *   refused.
 * Either way every value must be finite (a NaN or an infinity is refused naming the file, the tensor and the
 * element). The file is opened with pf_open_regular (a FIFO, device or folder is refused at once).
 * The whole file is checked before m changes (a model.ckpt with a non-finite value is loaded and m put
 * back). Returns 0; -EINVAL naming the missing, extra, mismatched (dtype, shape) or non-finite tensor;
 * -EPROTO (malformed file: st_parse, tp_read_backbone); -ENOENT / -EACCES / -EIO (pf_open_regular); -ENOMEM;
 * the device's error. */
int model_load_pretrained(model *m, const char *path);

#endif
