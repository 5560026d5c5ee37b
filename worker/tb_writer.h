/* TensorBoard event files: the scalars of a training run (loss, lr, ...) in the format TensorBoard reads, so
 * that `tensorboard --logdir <output>/tensorboard` plots them.
 *
 * Format (the one tensorboard.summary.writer.event_file_writer / record_writer.py writes, and TensorFlow's
 * tensorflow/core/lib/io/record_writer.cc):
 *   file   <dir>/events.out.tfevents.<unix time, 10 digits>.<hostname>.<pid>.<n>   (EventFileWriter's name:
 *          time, hostname, pid, then a counter of the files this process opened)
 *   record uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32
 *          masked_crc32c(data), both CRCs little-endian
 *   data   one serialized tensorboard.Event (proto/tb_event.proto): the first record has file_version
 *          "brain.Event:2"; each scalar is an Event {wall_time, step, summary {value {tag, simple_value}}}.
 *
 * Writes are buffered in memory and go to the file at tb_flush (call it once per step, after the step's
 * scalars) and tb_close. Not thread-safe: one writer per thread. */
#ifndef PFCPS_WORKER_TB_WRITER_H
#define PFCPS_WORKER_TB_WRITER_H

#include <stddef.h>
#include <stdint.h>

/* Longest tag in bytes that tb_scalar accepts. */
#define TB_TAG_MAX 256

typedef struct tb_writer tb_writer;

/* Creates `dir` and its parents (mode 0755, like mkdir -p), creates a new event file in it (never overwrites
 * one: O_EXCL) and writes the file_version record to it. On success *out is the writer; tb_close frees it.
 * Errors (message in pf_errmsg, naming the directory or file): -EINVAL (NULL or empty dir), the negative
 * errno of mkdir/open/write (-EACCES or -EROFS for a directory that cannot be written, -ENOTDIR, -ENOSPC,
 * ...), -ENOMEM. */
int tb_open(tb_writer **out, const char *dir);

/* Appends one scalar event: tag (1..TB_TAG_MAX bytes of printable ASCII, 0x20..0x7e, e.g. "loss" or
 * "train/lr"), the global step, wall_time in seconds since the Unix epoch (as Python's time.time(); finite),
 * the value (any float, NaN and inf included). The event reaches the file at the next tb_flush / tb_close.
 * Errors: -EINVAL (NULL writer or tag, tag empty, too long or not printable ASCII, wall_time not finite),
 * -ENOMEM; or the error of an earlier failed write (see tb_flush). */
int tb_scalar(tb_writer *w, const char *tag, int64_t step, double wall_time, float value);

/* Writes the buffered events to the file (to the kernel: no fsync; TensorBoard reads the file as it grows).
 * Errors: -EINVAL (NULL writer), the negative errno of write(2) (-ENOSPC disk full, -EIO, -EFBIG, ...) with a
 * message naming the file. A failed write is final: the file may end in a partial record (TensorBoard's
 * reader stops there), and every later tb_scalar / tb_flush returns the same code with the message
 * "<file>: an earlier write failed: ...", so the caller can report it once and stop writing. */
int tb_flush(tb_writer *w);

/* Flushes, closes and frees the writer (NULL is a no-op). Returns 0, or the error of this flush / close or of
 * an earlier failed write; the writer is freed either way. */
int tb_close(tb_writer *w);

/* Path of the event file (valid until tb_close). */
const char *tb_path(const tb_writer *w);

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78, initial value and final xor 0xffffffff) of n bytes:
 * the checksum TFRecord uses (RFC 3720 appendix B.4; crc32c("123456789") = 0xe3069283). */
uint32_t tb_crc32c(const void *data, size_t n);

/* TFRecord's masked CRC: ((c >> 15) | (c << 17)) + 0xa282ead8 with c = tb_crc32c(data, n)
 * (tensorflow/core/lib/hash/crc32c.h Mask; tensorboard's masked_crc32c). */
uint32_t tb_masked_crc32c(const void *data, size_t n);

#endif
