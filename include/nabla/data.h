/* nabla — reading data files. */
#ifndef NABLA_DATA_H
#define NABLA_DATA_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads an IDX file (the MNIST format), gzip-compressed or plain, into a new CPU
 * tensor of the file's shape and element type (u8 -> NB_U8, i8 -> NB_U8 bits,
 * i32 -> NB_I32, f32 -> NB_F32, f64 -> NB_F64; i16 is NB_ERR_UNSUPPORTED). Returns
 * it owned by the current scope, or NULL with NB_ERR_IO naming the file when it
 * is missing, truncated, or its header, dimensions or size disagree, or its dims
 * multiply past 2^48 bytes (a zero dim counted as 1, so that no order of the
 * dims gets past). */
nb_tensor *nb_idx_read(const char *path);

/* Rows index, index + count, index + 2 count, ... of the IDX file at path
 * (count processes each reading their share): a new CPU tensor whose first
 * dim is the number of those rows, owned by the current scope. The whole file
 * is read through (a compressed file must be inflated) and checked as
 * nb_idx_read checks it, but only the share is kept. NULL and nb_idx_read's
 * errors; NB_ERR_INVALID_ARGUMENT for count < 1 or index outside [0, count).
 * count 1, index 0 is nb_idx_read. */
nb_tensor *nb_idx_read_share(const char *path, int64_t count, int64_t index);

/* The same from an IDX image already in memory: size bytes at data, gzip-
 * compressed or plain. The bytes are copied; the caller keeps data. Returns a
 * new CPU tensor owned by the current scope, or NULL with NB_ERR_IO naming the
 * buffer's size when the image is truncated or its header, dimensions or size
 * disagree (NB_ERR_UNSUPPORTED for i16), NB_ERR_INVALID_ARGUMENT when data is
 * NULL and size is not 0. */
nb_tensor *nb_idx_read_memory(const void *data, size_t size);

/* ---- datasets ---------------------------------------------------------------
 *
 * A dataset is a recipe for a sequence of elements; an element is a fixed number
 * of tensors (its components, at most NB_DATASET_MAX_COMPONENTS), e.g. an image
 * and its label. Sources make elements (from tensors, IDX files, a C callback);
 * transformations make a new dataset from one (shuffle, repeat, batch, map,
 * prefetch). Nothing is read until an iterator asks: nb_dataset_iterate starts a
 * pass and nb_dataset_next gives one element at a time.
 *
 * Ownership: every dataset is freed with nb_dataset_free. A transformation takes
 * over its input: freeing the result frees the input too, so a pipeline is one
 * expression and one free. On failure a transformation frees its input as well,
 * so a chain like nb_dataset_batch(nb_dataset_shuffle(src, ...), ...) needs no
 * clean-up between the steps; a NULL input gives NULL (the earlier error stays).
 * A dataset must outlive its iterators and must not be changed while they run.
 * Datasets keep their own references to the tensors they hold, so the caller's
 * tensors may be released after the dataset is made.
 *
 * Elements handed out by nb_dataset_next belong to the caller's current scope
 * (or to the caller when no scope is open), like the result of any op; the
 * dataset's own temporaries never reach it. Functions a dataset calls (map,
 * generator) run inside a scope the dataset opens and ends around each call:
 * what they return is kept, the rest of what they make is released.
 *
 * End of data: nb_dataset_next returns NB_ERR_OUT_OF_RANGE (TensorFlow's
 * OutOfRangeError) and records no error, so nb_error() is unchanged and the loop
 *     while ((st = nb_dataset_next(it, batch)) == NB_OK) { ... }
 * ends with st == NB_ERR_OUT_OF_RANGE, or with another code (recorded) when the
 * pipeline failed.
 *
 * Mirrored strategies: nb_mirrored_step and nb_mirrored_run take a global batch
 * and already split it by rows over the replicas (include/nabla/distribute.h), so
 * a batch from nb_dataset_next is passed to them as it is. */

/* Most components an element may have. */
#define NB_DATASET_MAX_COMPONENTS 16

typedef struct nb_dataset nb_dataset;
typedef struct nb_dataset_iterator nb_dataset_iterator;

/* A dataset of the rows of n tensors: element i is (ts[0][i], ..., ts[n-1][i]),
 * each without the first dim. Every tensor needs at least one dim and all the
 * same first dim. The dataset keeps its own references (the elements are views of
 * them). Returns a dataset the caller frees with nb_dataset_free; NULL and
 * NB_ERR_INVALID_ARGUMENT for n outside 1 .. NB_DATASET_MAX_COMPONENTS, a NULL
 * array or tensor, a 0-d tensor, or first dims that differ (the message names
 * both lengths); NB_ERR_OUT_OF_MEMORY when memory runs out. */
nb_dataset *nb_dataset_from_tensors(int n, nb_tensor *const *ts);

/* The rows of one IDX file (nb_idx_read): element i is row i, in the file's
 * dtype. The header is read and checked now; the rows when the first iterator
 * is made (nb_dataset_iterate, or a pass of a dataset built on this one), once,
 * and then only the shard's rows when nb_dataset_shard is applied to this
 * source before that. NULL and nb_idx_read's error when the file cannot be
 * opened or its header is bad; an error in the data (truncated, trailing
 * bytes) is nb_dataset_iterate's, naming the file. */
nb_dataset *nb_dataset_from_idx(const char *path);

/* Images and labels from two IDX files (the MNIST layout): element i is (image
 * i, label i), as the files store them (NB_U8 for MNIST: map to cast). Read as
 * nb_dataset_from_idx reads (headers now, rows on the first pass). NULL and
 * NB_ERR_IO when either cannot be opened or has a bad header,
 * NB_ERR_INVALID_ARGUMENT when their first dims differ (both named). */
nb_dataset *nb_dataset_from_idx_pair(const char *images_path, const char *labels_path);

/* A source function: writes the n components of element `index` (0, 1, ... in
 * order, from 0 again for every pass) to out and returns NB_OK, returns
 * NB_ERR_OUT_OF_RANGE without recording an error when there are no more
 * elements, or fails with an error (recorded, as by any op). It runs inside a
 * scope the dataset opens: it simply returns tensors the ops gave it. It may run
 * on a prefetch thread, one call at a time. */
typedef nb_status (*nb_dataset_generator_fn)(void *user, int64_t index, int n, nb_tensor **out);

/* A dataset whose elements of n components come from fn (see above); user is
 * passed along and stays the caller's. NULL and NB_ERR_INVALID_ARGUMENT for a
 * NULL fn or n outside 1 .. NB_DATASET_MAX_COMPONENTS. */
nb_dataset *nb_dataset_from_generator(int n, nb_dataset_generator_fn fn, void *user);

/* Buffered shuffling as in TensorFlow: a buffer of buffer_size elements is
 * filled from ds; each element handed out is picked uniformly from the buffer
 * and its slot refilled from ds. buffer_size >= the dataset's length gives a
 * uniform permutation. Every pass (every iterator, and every epoch under
 * nb_dataset_repeat) draws with a new seed derived from seed and the pass
 * number, so epochs differ while two datasets built with the same seed give the
 * same sequence. Takes over ds. NULL and NB_ERR_INVALID_ARGUMENT for
 * buffer_size < 1 (ds is freed). */
nb_dataset *nb_dataset_shuffle(nb_dataset *ds, int64_t buffer_size, uint64_t seed);

/* Every count-th element of ds starting at index: elements index, index +
 * count, index + 2 count, ... (tf.data's shard). With count the number of
 * processes and index this one's rank (nb_mirrored_world_size and _rank), the
 * processes read disjoint shares that together make ds. Shard before
 * shuffling, parsing or mapping: the elements skipped are then neither
 * decoded nor mapped: an IDX source (nb_dataset_from_idx) keeps only its
 * share of the rows, a tensor source's other rows are not even made, and a
 * TFRecord file's other records are seeked over (only their 12-byte headers
 * are read, nb_tfrecord_skip) and not parsed. Takes over
 * ds. NULL and NB_ERR_INVALID_ARGUMENT for count < 1 or index outside
 * [0, count) (ds is freed). */
nb_dataset *nb_dataset_shard(nb_dataset *ds, int64_t count, int64_t index);

/* ds count times over (count < 0: forever; 0: empty). Takes over ds. A pass
 * that gives no element ends the repetition (so an empty dataset repeated
 * forever is empty, not a hang). */
nb_dataset *nb_dataset_repeat(nb_dataset *ds, int64_t count);

/* Stacks batch_size consecutive elements into one, component by component,
 * along a new leading dim. The last batch may be smaller unless drop_remainder.
 * Components must keep one shape and dtype within a batch (nb_stack's error
 * otherwise, from nb_dataset_next). Takes over ds. NULL and
 * NB_ERR_INVALID_ARGUMENT for batch_size < 1 (ds is freed). */
nb_dataset *nb_dataset_batch(nb_dataset *ds, int64_t batch_size, bool drop_remainder);

/* A map function: reads n_in components, writes n_out to out, returns NB_OK or
 * an error (recorded); returning NB_OK with an output NULL or an error pending
 * counts as failing. Runs inside a scope the dataset opens, possibly on a
 * prefetch thread, one call at a time. */
typedef nb_status (*nb_dataset_map_fn)(void *user, int n_in, nb_tensor *const *in, int n_out,
                                       nb_tensor **out);

/* Applies fn to every element, giving elements of n_out components. user stays
 * the caller's. Takes over ds. NULL and NB_ERR_INVALID_ARGUMENT for a NULL fn or
 * n_out outside 1 .. NB_DATASET_MAX_COMPONENTS (ds is freed). */
nb_dataset *nb_dataset_map(nb_dataset *ds, int n_out, nb_dataset_map_fn fn, void *user);

/* Reads ahead on a background thread: up to n elements are kept ready, already
 * copied to device ("/gpu:0", ...; NULL keeps them where ds makes them; a CPU
 * device simply reads ahead). The copy is nb_to_device's, queued on the device.
 * Gives the same sequence as ds. Errors on the thread reach nb_dataset_next in
 * order, after the elements made before them. Takes over ds. NULL and
 * NB_ERR_INVALID_ARGUMENT for n < 1, NB_ERR_DEVICE for an unknown device (ds is
 * freed in both cases). */
nb_dataset *nb_dataset_prefetch(nb_dataset *ds, int n, const char *device);

/* The records of a TFRecord file (include/nabla/tfrecord.h), in order: each
 * element is one NB_U8 [size] tensor of a record's bytes on /cpu:0. Every pass
 * reads the file again. Returns a dataset the caller frees with
 * nb_dataset_free; NULL and NB_ERR_IO naming the file when it cannot be opened
 * (checked now), NB_ERR_INVALID_ARGUMENT for NULL. A corrupt record stops the
 * pass with the reader's NB_ERR_IO (file and byte offset) from nb_dataset_next. */
nb_dataset *nb_dataset_from_tfrecord(const char *path);

/* Parses each element of ds, one 1-d NB_U8 tensor of a serialized
 * tf.train.Example (a TFRecord's record, say), with nb_example_parse: the result
 * has n components, one per spec, on the record's device. specs (and their
 * names) are copied. Takes over ds. NULL and NB_ERR_INVALID_ARGUMENT for n
 * outside 1 .. NB_DATASET_MAX_COMPONENTS, NULL specs or a spec without a name,
 * or ds with other than one component (ds is freed). A record that is not 1-d
 * u8 is NB_ERR_DTYPE from nb_dataset_next; a bad record, nb_example_parse's
 * error. nb_feature_spec is declared below. */
struct nb_feature_spec;
nb_dataset *nb_dataset_parse_examples(nb_dataset *ds, int n, const struct nb_feature_spec *specs);

/* Components per element; 0 for NULL. */
int nb_dataset_components(const nb_dataset *ds);

/* Frees ds and the datasets it took over. Its iterators must be freed first.
 * NULL is ignored. */
void nb_dataset_free(nb_dataset *ds);

/* Starts a pass over ds. Returns an iterator the caller frees with
 * nb_dataset_iterator_free (before freeing ds); NULL and NB_ERR_INVALID_ARGUMENT
 * for NULL, NB_ERR_OUT_OF_MEMORY when memory or a thread cannot be had. */
nb_dataset_iterator *nb_dataset_iterate(nb_dataset *ds);

/* Writes the next element's components to out (nb_dataset_components of them),
 * owned by the caller's current scope. Returns NB_OK; NB_ERR_OUT_OF_RANGE at the
 * end of the data, recording no error; or the error (recorded) that stopped the
 * pipeline: NB_ERR_INVALID_ARGUMENT for NULL, the error of a source, map or op
 * otherwise. On anything but NB_OK every out[i] is NULL. An iterator that
 * failed or ended keeps giving the same result. An error pending before the
 * call stays the pending one (the pipeline's functions do not see it). */
nb_status nb_dataset_next(nb_dataset_iterator *it, nb_tensor **out);

/* Stops the pass (joining a prefetch thread) and frees the iterator and the
 * elements it held. NULL is ignored. */
void nb_dataset_iterator_free(nb_dataset_iterator *it);

/* ---- tf.train.Example ---------------------------------------------------------
 *
 * A tf.train.Example is a protocol buffer: a map from feature names to lists of
 * floats, 64-bit integers or byte strings. nb_example_parse reads the features
 * it is asked for from one serialized Example (a TFRecord's payload, say), with
 * its own decoder: nothing else is needed. */

/* The kind of list a feature holds, and the tensor it becomes. */
typedef enum nb_feature_kind {
    NB_FEATURE_FLOAT = 0, /* float_list -> NB_F32 [count] */
    NB_FEATURE_INT64 = 1, /* int64_list -> NB_I64 [count] */
    NB_FEATURE_BYTES = 2  /* bytes_list of exactly one value -> NB_U8 [its length] */
} nb_feature_kind;

/* What to read: the feature's name, its kind, and how many elements it must
 * have (values; bytes of the one value for NB_FEATURE_BYTES), or -1 for any. */
typedef struct nb_feature_spec {
    const char *name;
    nb_feature_kind kind;
    int64_t count;
} nb_feature_spec;

/* Parses the n features specs names from the serialized Example at data (size
 * bytes) and writes one 1-d tensor per spec to out, on the current device and
 * owned by the current scope. data is only read. Returns NB_OK; on failure every
 * out[i] is NULL and it returns (and records) NB_ERR_IO for bytes that are not a
 * well-formed Example (the message names the byte offset), or
 * NB_ERR_INVALID_ARGUMENT naming the feature when one is missing, holds another
 * kind of list, holds other than one value for NB_FEATURE_BYTES, or has another
 * count than the spec's (both counts named), and for NULL arguments, n < 1 or a
 * spec without a name. Unknown fields of every wire type are skipped; when a
 * name appears twice the last entry counts, as protobuf's map does. */
nb_status nb_example_parse(const void *data, size_t size, int n, const nb_feature_spec *specs, nb_tensor **out);

struct nb_tfrecord_writer; /* tfrecord.h */

/* Writes one Example holding n features, names[i] -> the values of values[i]
 * (any shape, flattened; any device), as one record of w (see tfrecord.h):
 * NB_F32 and NB_F64 become a float_list (rounded to float), NB_I32, NB_I64 and
 * NB_BOOL an int64_list, NB_U8 a bytes_list of one value holding the tensor's
 * bytes -- what nb_example_parse reads back. Returns NB_OK, or NB_ERR_DTYPE for
 * f16 or bf16 (naming the feature), NB_ERR_INVALID_ARGUMENT for NULL arguments,
 * n < 1 or a feature without a name or tensor, NB_ERR_IO when the write fails. */
nb_status nb_example_write(struct nb_tfrecord_writer *w, int n, const char *const *names, nb_tensor *const *values);

#ifdef __cplusplus
}
#endif
#endif
