/* export_forward CKPT IN.npy OUT.npy [PRETRAINED [SAVE]]: pfcps's own eval forward (model_forward with train
 * = 0 on the CPU device) of the float32 (B,3,112,112) inputs in IN.npy through the checkpoint CKPT, written
 * as (B,D) float32 to OUT.npy: what the export tests compare PyTorch and onnxruntime against. With
 * PRETRAINED, the model (CKPT's network and D) is then overwritten by model_load_pretrained(PRETRAINED)
 * before the forward.
 */
#include "common/err.h"
#include "tests/npy.h"
#include "worker/eval/embed.h"
#include "worker/model/safetensors.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: export_forward CKPT IN.npy OUT.npy [PRETRAINED [SAVE]]\n");
        return 2;
    }
    npy_array in;
    if (npy_load(argv[2], &in)) {
        fprintf(stderr, "export_forward: %s\n", pf_errmsg());
        return 1;
    }
    if (in.ndim != 4 || in.shape[1] != 3 || in.shape[2] != 112 || in.shape[3] != 112 || in.shape[0] < 1) {
        fprintf(stderr, "export_forward: %s is not (B,3,112,112)\n", argv[2]);
        return 1;
    }
    int B = (int)in.shape[0];
    float *x = npy_to_f32(&in);
    model *m;
    const float *emb;
    if (!x || eval_model_open(&m, argv[1], B, NULL) || (argc >= 5 && model_load_pretrained(m, argv[4])) ||
        (argc == 6 && model_save(m, argv[5])) || model_forward(m, x, B, 0, &emb)) {
        fprintf(stderr, "export_forward: %s\n", pf_errmsg());
        return 1;
    }
    int D = model_get_desc(m)->embedding_size;
    float *out = malloc((size_t)B * D * sizeof(float));
    const ops_device *dev = model_device(m);
    if (!out || dev->mem_d2h(model_ctx(m), out, emb, (size_t)B * D * sizeof(float)) ||
        eval_npy_write_f32(argv[3], out, B, D)) {
        fprintf(stderr, "export_forward: %s\n", pf_errmsg());
        return 1;
    }
    free(out);
    free(x);
    npy_free(&in);
    model_free(m);
    return 0;
}
