/* nabla — TensorBoard summaries: scalars and histograms written to an event
 * file that TensorBoard reads (`tensorboard --logdir DIR`). The file is a
 * TFRecord file (nabla/tfrecord.h) of Event protocol buffers. */
#ifndef NABLA_SUMMARY_H
#define NABLA_SUMMARY_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_summary_writer nb_summary_writer;

/* Creates logdir (and its parents) when missing and a new event file in it,
 * events.out.tfevents.<unix seconds>.<hostname> (with .<pid>.<n> added when
 * that name is taken), whose first record is an Event with file_version
 * "brain.Event:2". Returns a writer the caller owns and ends with
 * nb_summary_writer_close, or NULL with NB_ERR_INVALID_ARGUMENT when logdir is
 * NULL or empty, NB_ERR_IO naming the directory or file when either cannot be
 * made, NB_ERR_OUT_OF_MEMORY. Writes are buffered and cheap: the file is
 * flushed (no fsync) after a write that comes 2 s or 1000 records after the
 * last flush, by nb_summary_writer_flush, and at close. The calls on one
 * writer may come from several threads; each takes the writer's lock. */
nb_summary_writer *nb_summary_writer_open(const char *logdir);

/* The event file's path; owned by the writer, valid until close. NULL for NULL. */
const char *nb_summary_writer_path(const nb_summary_writer *w);

/* Writes an Event at step holding one scalar (TensorBoard's simple_value, a
 * float) under tag. Returns NB_OK, NB_ERR_INVALID_ARGUMENT for a NULL writer
 * or a NULL or empty tag, NB_ERR_IO naming the file when writing fails,
 * NB_ERR_OUT_OF_MEMORY. */
nb_status nb_summary_scalar(nb_summary_writer *w, const char *tag, int64_t step, double value);

/* Writes an Event at step holding a histogram of values' elements under tag:
 * their min, max, count, sum and sum of squares, and counts in TensorFlow's
 * default buckets (limits ±1e-12 * 1.1^k up to 1e20, then ±DBL_MAX, and 0; a
 * bucket counts the values below its limit and at or above the one before),
 * runs of empty buckets merged as TensorFlow does. values is any float tensor
 * (f32, f64, f16, bf16) of any shape on any device; it is read to the host and
 * left as it was (the caller keeps it). NaN elements are left out of every
 * figure. An empty tensor gives a histogram of 0 values. Returns NB_OK,
 * NB_ERR_INVALID_ARGUMENT for a NULL writer, tag or values (a NULL values
 * keeps the earlier error), NB_ERR_DTYPE for a tensor that is not floating,
 * NB_ERR_IO naming the file, NB_ERR_OUT_OF_MEMORY, or the error of reading
 * the tensor back from its device. */
nb_status nb_summary_histogram(nb_summary_writer *w, const char *tag, int64_t step, const nb_tensor *values);

/* Hands every buffered event to the operating system (no fsync). Returns NB_OK,
 * NB_ERR_INVALID_ARGUMENT for NULL, NB_ERR_IO naming the file. */
nb_status nb_summary_writer_flush(nb_summary_writer *w);

/* Flushes, closes the file and frees the writer, also when the flush fails.
 * NULL is ignored (NB_OK). Returns NB_OK or NB_ERR_IO naming the file. */
nb_status nb_summary_writer_close(nb_summary_writer *w);

#ifdef __cplusplus
}
#endif
#endif
