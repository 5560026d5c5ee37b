/* The backbone as an ONNX model (`pfcps export --format onnx`), written with protobuf-c from ONNX's own
 * onnx.proto (Debian's libonnx-dev ships /usr/include/onnx/onnx.proto, ONNX 1.12, Apache-2.0; compiled by
 * protoc-c at build time, worker/model/meson.build). */
#ifndef PFCPS_WORKER_MODEL_ONNX_EXPORT_H
#define PFCPS_WORKER_MODEL_ONNX_EXPORT_H

#include "worker/model/model.h"

/* Opsets written: the graph below uses only operators whose definitions are the same from opset 13 to 17
 * (Conv-11, BatchNormalization-9/14/15 in inference, PRelu-9/16, Add-13/14, Flatten-13, Gemm-13), so any of
 * them gives the same numbers; 13 (IR version 7) by default, IR version 8 from opset 15. Debian's
 * python3-onnx 1.12 checks up to opset 17 / IR 8; onnxruntime 1.32 runs them all. */
#define ONNX_EXPORT_OPSET     13
#define ONNX_EXPORT_OPSET_MIN 13
#define ONNX_EXPORT_OPSET_MAX 17
#define ONNX_EXPORT_OPSETS    "13..17"

/* Writes m as an inference-mode ONNX model to path (path.tmp, fsync'd, renamed):
 *   input  "data"      float (N, 3, 112, 112), N symbolic ("N"), the model_forward input (NCHW,
 * (x/255-0.5)/0.5); output "embedding" float (N, D): model_forward with train = 0. One node per layer of the
 * model's list, in order: Conv (group = the depthwise groups of mbf, no bias), BatchNormalization kept as a
 * node (epsilon 1e-5, the running statistics; not folded into the convolution, so the ONNX graph computes
 * what pfcps computes and its initializers are the state_dict's tensors under the same names), PRelu (slope
 * stored as (C,1,1) so it broadcasts over (N,C,H,W)), Add, Flatten(axis 1), Gemm (transB = 1, with the bias
 * when the layer has one) and the features BatchNormalization on (N, D); dropout (eval: the identity) is left
 * out. Initializers are the model's F32 tensors (read from the device through host copies) named as in
 * PyTorch's state_dict. metadata_props: network, embedding_size. Returns 0, -EINVAL (opset outside
 * ONNX_EXPORT_OPSET_MIN..MAX, a layer this exporter does not know), -ENOMEM, -EIO (errno text in the
 * message), or the device's error. */
int model_export_onnx(const model *m, const char *path, int opset);

#endif
