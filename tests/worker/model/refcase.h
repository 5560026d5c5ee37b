/* The backbone reference cases ($PFCPS_REFERENCE/backbone/<case>: meta.json, params/, grads/,
 * running/, input.npy, grad_output.npy, ...) as the model tests read them. */
#ifndef PFCPS_TESTS_WORKER_MODEL_REFCASE_H
#define PFCPS_TESTS_WORKER_MODEL_REFCASE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "worker/model/model.h"

/* dir (dir_size bytes) = <root>/backbone/<name>; d = the iresnet of dir/meta.json (layers, widths,
 * num_features) named name, *B = its batch. Returns 0 with *meta = the meta.json text (the caller
 * frees it); when meta.json is not readable, ref_missing's result (77, SKIP printed, or 1 under
 * PFCPS_REQUIRE_REFERENCES=1); 1 (FAIL printed) when a field is missing. */
static inline int refcase_meta(char *dir, size_t dir_size, const char *root, const char *name, model_desc *d,
                               int *B, char **meta)
{
    snprintf(dir, dir_size, "%s/backbone/%s", root, name);
    *B = 0;
    *meta = npy_read_text(dir, "meta.json");
    if (!*meta)
        return ref_missing("%s/meta.json not readable", dir);
    memset(d, 0, sizeof *d);
    d->kind = MODEL_IRESNET;
    snprintf(d->name, sizeof d->name, "%.31s", name);
    d->embedding_size = (int)npy_json_number(*meta, "num_features", 0);
    *B = (int)npy_json_number(*meta, "batch", 0);
    if (npy_json_int4(*meta, "layers", d->layers) || npy_json_int4(*meta, "widths", d->widths) ||
        d->embedding_size <= 0 || *B <= 0) {
        printf("FAIL: %s/meta.json: layers/widths/num_features/batch not found\n", dir);
        free(*meta);
        *meta = NULL;
        return 1;
    }
    return 0;
}

/* dir/file as floats when it holds n values; else (or unreadable) NULL. */
static inline float *refcase_f32(const char *dir, const char *file, size_t n)
{
    npy_array a;
    float *v = NULL;
    if (!npy_load2(dir, file, &a)) {
        v = a.count == n ? npy_to_f32(&a) : NULL;
        npy_free(&a);
    }
    return v;
}

#endif
