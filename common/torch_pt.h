/* torch.save files (PyTorch >= 1.6, its default "zipfile" serialization), read without running Python's
 * pickle: what arcface_torch writes as `model.pt` (torch.save(backbone.state_dict())) and, with
 * save_all_states, `checkpoint_gpu_<rank>.pt` (torch.save({"epoch", "global_step", "state_dict_backbone",
 * "state_dict_softmax_fc", "state_optimizer", "state_lr_scheduler"})).
 *
 * The file is a zip archive (read through libzip) whose entries all lie in one folder, named after the file's
 * stem by the writer (`model/...`); the reader takes the folder from the first entry, as torch's own reader
 * does: `<folder>/data.pkl` (the pickle, protocol 2), `<folder>/data/<key>` (one storage each: raw
 * little-endian elements, stored uncompressed by torch), `<folder>/version`, and in newer torch versions
 * `<folder>/byteorder` ("little"; "big" is refused) and other small records, ignored.
 *
 * data.pkl runs on the allow-list interpreter of common/pickle.h, which builds values and never calls
 * anything:
 *   opcodes PROTO FRAME STOP MARK EMPTY_DICT EMPTY_LIST EMPTY_TUPLE BINUNICODE SHORT_BINUNICODE BININT
 * BININT1 BININT2 LONG1 (at most 8 bytes) BINFLOAT NEWTRUE NEWFALSE NONE TUPLE TUPLE1 TUPLE2 TUPLE3 SETITEM
 * SETITEMS APPEND APPENDS BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET GLOBAL REDUCE BINPERSID BUILD; GLOBAL
 * only for collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and the
 * storage types torch.{Float,Double,Half,BFloat16,Long,Int}Storage (also under torch.cuda, as older torch
 * versions name a GPU tensor's storage); REDUCE only of OrderedDict with no arguments (an empty ordered
 * dict), of _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[,
 * metadata]) (a tensor) and of _rebuild_parameter(tensor, requires_grad, backward_hooks) (the same tensor);
 *   BINPERSID only of torch's storage reference ('storage', <storage type>, key, location, numel) (a
 * storage); BUILD only on an OrderedDict, with a dict or None as state (Module.state_dict() pickles its
 * `_metadata` attribute this way; the state is checked, kept nowhere). Anything else is refused with -EPROTO
 * naming the opcode (or the global) and its byte offset in data.pkl. The interpreter also refuses: dict keys
 * other than str and int, a key twice in one dict, a string that is not UTF-8 or holds a NUL, a container
 * changed after it was placed inside another value (so values form a tree with shared leaves, never a cycle),
 * nesting deeper than TP_MAX_DEPTH, more than TP_MAX_ITEMS elements in one container, one storage key
 * declared with two dtypes or sizes, memory beyond TP_MEM_FIXED + TP_MEM_PER_BYTE x the pickle's size. */
#ifndef PFCPS_COMMON_TORCH_PT_H
#define PFCPS_COMMON_TORCH_PT_H

#include <stddef.h>
#include <stdint.h>

#include "common/pickle.h"
#include "common/safetensors.h"

#define TP_MAX_DIMS     8
#define TP_MAX_PICKLE   (16u << 20) /* bytes of data.pkl (arcface_torch's: tens of KiB) */
#define TP_MAX_DEPTH    64          /* container nesting, and MARKs open at once */
#define TP_MAX_STR      (1u << 20)  /* bytes of one string */
#define TP_MAX_ITEMS    (1u << 24)  /* elements of one container (a dict's pairs count twice) */
#define TP_MAX_MEMO     (1u << 24)  /* memo entries */
#define TP_MEM_FIXED    (1u << 20)
#define TP_MEM_PER_BYTE 64
#define TP_MAX_INFLATE  1032 /* deflate's largest ratio: a compressed entry declaring more is refused */

/* Element types of torch's storages, named as safetensors names them (tp_dtype_name). */
typedef enum tp_dtype { TP_F32 = 1, TP_F64, TP_F16, TP_BF16, TP_I64, TP_I32 } tp_dtype;

/* Bytes per element (4, 8, 2, 2, 8, 4), 0 for another value. */
size_t tp_dtype_size(tp_dtype d);
/* "F32", "F64", "F16", "BF16", "I64", "I32" (st_dtype_size knows them), "?" for another value. */
const char *tp_dtype_name(tp_dtype d);

/* Kinds of values: common/pickle.h's, and torch_pt's own two (u.obj.p points to a tp_tensor / tp_storage:
 * tp_tensor_of, tp_storage_of). */
typedef enum tp_kind {
    TP_NONE = PK_NONE,
    TP_BOOL = PK_BOOL,
    TP_INT = PK_INT,
    TP_FLOAT = PK_FLOAT,
    TP_STR = PK_STR,
    TP_TUPLE = PK_TUPLE,
    TP_LIST = PK_LIST,
    TP_DICT = PK_DICT,
    TP_GLOBAL = PK_GLOBAL,    /* an allowed class or function not called (e.g. a storage type in a tuple) */
    TP_TENSOR = PK_USER,      /* a tensor (_rebuild_tensor_v2, _rebuild_parameter) */
    TP_STORAGE = PK_USER + 1, /* a storage reference not passed to _rebuild_tensor_v2 */
} tp_kind;

/* "None", "bool", "int", "float", "str", "tuple", "list", "dict", "tensor", "global", "storage". */
const char *tp_kind_name(tp_kind k);

/* A storage: data/<key> of the archive, numel elements of dtype; location as pickled ("cpu", "cuda:0"; the
 * bytes are the same wherever the tensor lived). */
typedef struct tp_storage {
    tp_dtype dtype;
    const char *key;
    const char *location;
    int64_t numel;
} tp_storage;

/* A tensor: a view of its storage. Element (i0, .., i{n-1}) is storage element
 * offset + sum_k i_k x stride[k] (strides in elements, never negative). shape and stride hold ndim values
 * (0 .. TP_MAX_DIMS; 0 is a scalar). The interpreter only checks signs and ndim; tp_tensor_check checks the
 * view against its storage (tp_state_dict and tp_tensor_read call it). */
typedef struct tp_tensor {
    const tp_storage *storage;
    tp_dtype dtype; /* = storage->dtype */
    int ndim;
    int64_t shape[TP_MAX_DIMS], stride[TP_MAX_DIMS];
    int64_t offset;
    int requires_grad;
} tp_tensor;

/* One value of the pickle (common/pickle.h's pk_value), read only. Values are shared (the pickle's memo): the
 * same pointer may appear in several containers; they live as long as the tp_pickle / tp_file that made them.
 * A dict made by collections.OrderedDict() has `ordered` set; a global's u.g.arg is a storage type's
 * tp_dtype. */
typedef pk_value tp_value;

/* The tensor of a TP_TENSOR value, the storage of a TP_STORAGE one; NULL for v NULL or of another kind. */
const tp_tensor *tp_tensor_of(const tp_value *v);
const tp_storage *tp_storage_of(const tp_value *v);

typedef struct tp_pickle tp_pickle;

/* Runs the allow-list interpreter over buf[0..size) (a data.pkl; buf may be freed afterwards). `what` names
 * the input in messages. Returns 0 with *out (tp_pickle_free it), or -EPROTO with a message "<what>: ..."
 * naming the problem and its byte offset (an opcode or global outside the allow-list: "<what>: pickle opcode
 * STACK_GLOBAL (0x93) at offset 12 not allowed", "<what>: pickle GLOBAL 'posix system' at offset 2 not
 * allowed (...)"; truncation; stack underflow; a limit of the header comment), or -ENOMEM. */
int tp_parse_pickle(tp_pickle **out, const void *buf, size_t size, const char *what);

/* The value the pickle returns (its STOP). */
const tp_value *tp_pickle_root(const tp_pickle *p);

void tp_pickle_free(tp_pickle *p);

/* d[key] of a TP_DICT for a str key (tp_dict_get) or an int key (tp_dict_get_int); NULL when d is not a
 * dict or has no such key. */
const tp_value *tp_dict_get(const tp_value *d, const char *key);
const tp_value *tp_dict_get_int(const tp_value *d, int64_t key);

/* The value at a '/'-separated path below v: each component is a str key of a dict, else (written in
 * decimal) an int key of a dict or an index into a list or tuple. "state_optimizer/state/0/momentum_buffer",
 * "state_dict_softmax_fc/weight", "state_optimizer/param_groups/1/lr". NULL when a component is missing. */
const tp_value *tp_find(const tp_value *v, const char *path);

/* A tensor of a state_dict with its name. */
typedef struct tp_named {
    const char *name;
    const tp_tensor *t;
} tp_named;

/* The tensors of a flat state_dict (a dict of str -> tensor, in the dict's order) into *out (malloc'd, n
 * entries in *n; free() it; the pointers are sd's). Every tensor passes tp_tensor_check. Returns 0, or
 * -EPROTO "<what>: ..." when sd is not a dict, a key is not a str, a value is not a tensor (naming the key
 * and what it is) or a tensor fails tp_tensor_check, or -ENOMEM. */
int tp_state_dict(const tp_value *sd, tp_named **out, int *n, const char *what);

/* Elements of t's view (prod(shape); 1 for a scalar), or -1 when the product overflows int64. */
int64_t tp_tensor_numel(const tp_tensor *t);

/* Checks t's view against its storage: ndim within TP_MAX_DIMS, prod(shape) and the storage's bytes within
 * int64, and offset + 1 + sum_k (shape[k] - 1) x stride[k] <= storage numel (nothing to check when a
 * dimension is 0). Returns 0 or -EPROTO "<what>: tensor '<name>': ..." naming the view and the storage. */
int tp_tensor_check(const tp_tensor *t, const char *name, const char *what);

typedef struct tp_file tp_file;

/* Opens a torch.save file: pf_open_regular (a FIFO, device or folder is refused before any read), the zip
 * directory (libzip, with its consistency checks), the folder of the first entry, `byteorder` when present,
 * and data.pkl (at most TP_MAX_PICKLE bytes, CRC checked) through tp_parse_pickle. Returns 0 with *out
 * (tp_close it), or, with a message naming the path: the errors of pf_open_regular; -EPROTO for a file that
 * is not a zip archive (a legacy torch.save file, torch < 1.6 or _use_new_zipfile_serialization=False, is
 * named as such), a damaged or truncated archive, a TorchScript archive (torch.jit.save: it holds
 * <folder>/constants.pkl; named as such), one without <folder>/data.pkl, a big-endian one, a data.pkl too
 * large or failing its CRC, and every error of tp_parse_pickle; -EIO (read error); -ENOMEM. */
int tp_open(tp_file **out, const char *path);

/* tp_open of an archive held in buf[0..size) (not copied: buf must outlive *out); what names it in
 * messages. The same checks and errors (no file open). */
int tp_open_buffer(tp_file **out, const void *buf, size_t size, const char *what);

void tp_close(tp_file *f);

/* The pickle's value (data.pkl's root: a state_dict, or arcface_torch's checkpoint dict). */
const tp_value *tp_root(const tp_file *f);

/* The name the file was opened with (its path, or tp_open_buffer's what). */
const char *tp_name(const tp_file *f);

/* Rows [row0, row0 + nrows) of t along its first dimension (for a scalar: row0 = 0, nrows = 1, the one
 * element), as C-order contiguous elements of t's dtype into dst (dst_bytes must equal nrows x the row's
 * elements x tp_dtype_size). Handles any strides, from data/<key>: the entry must exist and hold exactly
 * storage numel x element size bytes (a compressed entry declaring more than TP_MAX_INFLATE x its compressed
 * size is refused before any read); only the bytes the rows span are read (a storage read whole also has its
 * CRC checked). `name` names t in messages. Returns 0, or -EPROTO "<file>: tensor '<name>': ..." (the view
 * outside its storage, rows out of range, dst_bytes wrong, the entry missing, of another size, truncated or
 * failing its CRC), -ENOMEM. */
int tp_tensor_read_rows(tp_file *f, const tp_tensor *t, const char *name, int64_t row0, int64_t nrows,
                        void *dst, size_t dst_bytes);

/* The whole tensor: tp_tensor_read_rows over every row (dst_bytes = tp_tensor_numel x element size). */
int tp_tensor_read(tp_file *f, const tp_tensor *t, const char *name, void *dst, size_t dst_bytes);

/* The backbone's state_dict of a torch.save file as a safetensors image: path is arcface_torch's `model.pt`
 * (the root is a state_dict) or a `checkpoint_gpu_<rank>.pt` (the root is a dict with "state_dict_backbone").
 * Every tensor keeps its name, dtype and shape, its elements copied in C order; *out parses the image
 * (st_parse), which lives in *image (free() it after st_free(*out)). model_load_pretrained checks the
 * result exactly as it checks a safetensors file. A view holding more elements than its storage (an
 * expanded tensor) is refused, so the image is never larger than the storages it copies. Returns 0, or the
 * errors of tp_open, tp_state_dict and tp_tensor_read, -EPROTO "<path>: ..." when the root is neither, or
 * -ENOMEM. */
int tp_read_backbone(const char *path, st_file **out, unsigned char **image);

#endif
