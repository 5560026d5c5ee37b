/* arcface_torch's verification sets (lfw.bin, cfp_fp.bin, agedb_30.bin ...): a Python pickle of the
 * tuple `(bins, issame_list)`, bins a list of 2N encoded images (JPEG bytes; pair i is images 2i and
 * 2i+1), issame_list a list of N bools (eval/verification.py, load_bin: `pickle.load(f, encoding='bytes')`).
 *
 * The pickle runs on the allow-list interpreter of common/pickle.h, allowing ONLY the opcodes such files use
 * (names as in CPython's Lib/pickletools.py):
 *   framing   PROTO (0..5), FRAME, STOP
 *   values    EMPTY_LIST, MARK, APPEND, APPENDS, EMPTY_TUPLE, TUPLE, TUPLE1, TUPLE2, TUPLE3,
 *             BINBYTES, SHORT_BINBYTES, BINBYTES8 (Python 3 bytes),
 *             BINSTRING, SHORT_BINSTRING (Python 2 str, i.e. the sets as written by Python 2),
 *             NEWTRUE, NEWFALSE, and INT (protocol 0/1 bools: `I01\n`; any other int is refused as an
 *             image or an issame value that is not a bool)
 *   memo      BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET (indices must be dense, as every
 *             pickler writes them: a PUT names an existing slot or the next one)
 * Every other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, unicode, BININT*, floats,
 * dicts, sets, PERSID ...) is refused with its name and byte offset: nothing is ever constructed or
 * called. Every length is checked against the bytes left; the values pushed are counted against
 * BINSET_MAX_VALUES, nesting (and MARKs open at once) against BINSET_MAX_DEPTH, and the bytes the machine
 * allocates against BINSET_MEM_FIXED + BINSET_MEM_PER_BYTE x the file's size, so a truncated or hostile
 * file is refused with -EPROTO and a message naming the byte offset, and memory stays within that bound.
 * Bytes objects are not copied: the images point into the caller's buffer. */
#ifndef PFCPS_WORKER_EVAL_BINSET_H
#define PFCPS_WORKER_EVAL_BINSET_H

#include <stddef.h>
#include <stdint.h>

/* Values (pushes, incl. BINGET) one file may create: 2^22 (about 1.4 M pairs); also the most memo entries and
 * the most elements of one list. */
#define BINSET_MAX_VALUES (1u << 22)

/* Container nesting, and MARKs open at once: a set is a tuple of two lists of leaves (depth 2). */
#define BINSET_MAX_DEPTH 8

/* Bytes of one image. */
#define BINSET_MAX_IMAGE (64u << 20)

/* Memory the pickle machine's stack, memo and containers may take for one file: BINSET_MEM_FIXED plus
 * BINSET_MEM_PER_BYTE per byte of the file (a real set, whose images are kilobytes each, needs well under
 * 1 byte per byte; a file built to fill the memory, such as 4 MB of empty tuples, is refused at the byte
 * where it would exceed this, instead of taking gigabytes first). */
#define BINSET_MEM_FIXED    (16 << 20)
#define BINSET_MEM_PER_BYTE 16

typedef struct eval_binset {
    int64_t n_pairs;     /* N >= 1 */
    const uint8_t **img; /* 2N pointers into the parsed buffer; pair i = img[2i], img[2i+1] */
    size_t *img_len;     /* 2N byte counts */
    uint8_t *issame;     /* N values, 1 = same identity */
    uint8_t *owned;      /* the file's bytes when loaded by eval_binset_load (else NULL) */
    size_t owned_len;
} eval_binset;

/* Parses a .bin pickle held in data[0..size) (borrowed: the images point into it, so it must outlive
 * s). Returns 0, or -EPROTO with a message such as "verification set: pickle opcode GLOBAL (0x63) at
 * offset 12 not allowed", "verification set: pickle offset 5: truncated: a bytes value of 200 bytes, 12
 * left", "verification set: expected a tuple (list of 2N images, list of N bools), got ...", -ENOMEM.
 * On failure s is empty. */
int eval_binset_parse(eval_binset *s, const uint8_t *data, size_t size);

/* Reads the whole file at path and parses it (s owns the bytes). Errors: -ENOENT / -EIO naming the
 * path, and those of eval_binset_parse prefixed with the path. */
int eval_binset_load(eval_binset *s, const char *path);

/* Frees what s holds (safe on a zeroed or freed set). */
void eval_binset_free(eval_binset *s);

#endif
