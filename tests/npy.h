/* Minimal NumPy .npy reader for tests (format 1.0/2.0, little-endian, C order; dtypes <f4 <f8 <i4 <i8).
 * Used to read the float64/float32 references in $PFCPS_REFERENCE (tests/reference). */
#ifndef PFCPS_TESTS_NPY_H
#define PFCPS_TESTS_NPY_H

#include <stddef.h>
#include <stdint.h>

typedef struct npy_array {
    char dtype;   /* 'f' float, 'i' int */
    int itemsize; /* 4 or 8 */
    int ndim;
    int64_t shape[8];
    size_t count; /* product of shape */
    void *data;   /* raw little-endian values, count * itemsize bytes */
} npy_array;

/* Loads `path`. Returns 0, or -ENOENT / -EINVAL (unsupported dtype, fortran order, truncated) with
 * pf_errmsg() naming the file and the problem. */
int npy_load(const char *path, npy_array *out);

/* Loads `dir/name` (joins with '/'). */
int npy_load2(const char *dir, const char *name, npy_array *out);

/* Newly malloc'd copies converted to float / double / int64 (NULL on out of memory). */
float *npy_to_f32(const npy_array *a);
double *npy_to_f64(const npy_array *a);
int64_t *npy_to_i64(const npy_array *a);

void npy_free(npy_array *a);

/* Reads a whole small text file (e.g. meta.json) into a malloc'd NUL-terminated string, or NULL. */
char *npy_read_text(const char *dir, const char *name);

/* Finds `"key": number` in JSON text and returns the number; returns `dflt` when absent. */
double npy_json_number(const char *json, const char *key, double dflt);

/* Finds `"key": [a, b, c, d]` (4 integers) in JSON text into out: 0, or -1 when absent or malformed. */
int npy_json_int4(const char *json, const char *key, int out[4]);

/* dir/name as a malloc'd float64 array that must hold `expect` values; NULL, with a "FAIL: ..." line
 * printed, when it cannot be read or holds another count. */
double *npy_load_f64(const char *dir, const char *name, size_t expect);

/* Relative error ||a - b||_2 / ||b||_2 (b the reference; returns ||a - b|| when ||b|| == 0). */
double rel_err_f32_f64(const float *a, const double *b, size_t n);

/* Max |a - b|. */
double max_abs_err_f32_f64(const float *a, const double *b, size_t n);

#endif
