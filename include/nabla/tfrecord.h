/* nabla — TFRecord files: a sequence of records, each framed as
 *   uint64 length (little-endian)
 *   uint32 masked CRC32C of those 8 length bytes
 *   length bytes of data
 *   uint32 masked CRC32C of the data
 * where a masked CRC is ((crc >> 15) | (crc << 17)) + 0xa282ead8. The format
 * TensorFlow's TFRecordWriter and TensorBoard's event files use (uncompressed). */
#ifndef NABLA_TFRECORD_H
#define NABLA_TFRECORD_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_tfrecord_writer nb_tfrecord_writer;
typedef struct nb_tfrecord_reader nb_tfrecord_reader;

/* ---- writing --------------------------------------------------------------------------- */

/* Creates (or truncates) the file at path for writing records. Returns a writer
 * the caller owns and ends with nb_tfrecord_writer_close, or NULL with
 * NB_ERR_INVALID_ARGUMENT when path is NULL, NB_ERR_IO naming the file when it
 * cannot be created, NB_ERR_OUT_OF_MEMORY. Writes are buffered: nothing is
 * promised to be on disk before nb_tfrecord_writer_flush or _close. A writer
 * is used by one thread at a time. */
nb_tfrecord_writer *nb_tfrecord_writer_open(const char *path);

/* Appends one record of size bytes at data (NULL allowed when size is 0); the
 * caller keeps data. Returns NB_OK, NB_ERR_INVALID_ARGUMENT for a NULL writer
 * or NULL data with size > 0, or NB_ERR_IO naming the file and the byte offset
 * of the record when the write fails (the file may then hold part of it). */
nb_status nb_tfrecord_write(nb_tfrecord_writer *w, const void *data, size_t size);

/* Hands the buffered records to the operating system (no fsync). Returns NB_OK,
 * NB_ERR_INVALID_ARGUMENT for NULL, or NB_ERR_IO naming the file. */
nb_status nb_tfrecord_writer_flush(nb_tfrecord_writer *w);

/* Flushes, closes the file and frees the writer, also when the flush fails.
 * NULL is ignored (NB_OK). Returns NB_OK or NB_ERR_IO naming the file when the
 * last records could not be written. */
nb_status nb_tfrecord_writer_close(nb_tfrecord_writer *w);

/* ---- reading --------------------------------------------------------------------------- */

/* Opens the file at path for reading records from its start. Returns a reader
 * the caller owns and ends with nb_tfrecord_reader_close, or NULL with
 * NB_ERR_INVALID_ARGUMENT when path is NULL, NB_ERR_IO naming the file when it
 * cannot be opened, NB_ERR_OUT_OF_MEMORY. Used by one thread at a time. */
nb_tfrecord_reader *nb_tfrecord_reader_open(const char *path);

/* Reads the next record. Returns NB_OK with *data and *size set to it: the
 * bytes belong to the reader and stay valid until the next call or close (a
 * record of 0 bytes has a non-NULL *data). At the end of the file it returns
 * NB_ERR_OUT_OF_RANGE (as a dataset iterator does) with *data NULL and *size 0,
 * recording no error, and again on every later call:
 *     while ((st = nb_tfrecord_next(r, &data, &size)) == NB_OK) { ... }
 * ends with st == NB_ERR_OUT_OF_RANGE, or another code (recorded). A corrupt
 * file returns NB_ERR_IO with a message naming the function, the file and the
 * byte offset where the record or field starts: a truncated header or data, a
 * length whose CRC does not match, a length larger than what is left of the
 * file (checked before anything is allocated), a data CRC that does not
 * match; *data is then NULL and *size 0, and further calls fail the same way.
 * NB_ERR_INVALID_ARGUMENT when r, data or size is NULL; NB_ERR_OUT_OF_MEMORY
 * when a record's bytes cannot be held. */
nb_status nb_tfrecord_next(nb_tfrecord_reader *r, const void **data, size_t *size);

/* Moves past the next record without reading its data: reads its header,
 * checks the length's CRC and that the data and their CRC fit in the file,
 * then seeks past them (the data's CRC is not checked: the bytes are never
 * read). Returns NB_OK; NB_ERR_OUT_OF_RANGE at the end, recording no error, as
 * nb_tfrecord_next does; NB_ERR_IO naming the file and byte offset for a
 * truncated or corrupt header (kept, like nb_tfrecord_next's failures), or when
 * the file cannot seek (a pipe); NB_ERR_INVALID_ARGUMENT when r is NULL. A
 * sharded dataset skips the records of the other shards this way. */
nb_status nb_tfrecord_skip(nb_tfrecord_reader *r);

/* The byte offset in the file where the next record starts (after a failure:
 * where the bad record starts). 0 for NULL. */
uint64_t nb_tfrecord_reader_offset(const nb_tfrecord_reader *r);

/* Closes the file and frees the reader and its record buffer. NULL is ignored. */
void nb_tfrecord_reader_close(nb_tfrecord_reader *r);

#ifdef __cplusplus
}
#endif
#endif
