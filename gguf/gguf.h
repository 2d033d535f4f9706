// GGUF v2/v3 reader (mmap, every read bounds-checked) and writer.
//
// Reader contract: gguf_open maps the file read-only and parses the header,
// every key/value pair and every tensor info up front; after it returns 0 all
// pointers in the structs below stay valid until gguf_close. Any malformed
// input (truncation, absurd counts or lengths, unknown types, tensor data past
// the end, misaligned offsets, overflowing dimension products, duplicate keys
// or tensor names, v1 or big-endian files) makes it fail with a message that
// names the file, the byte offset and what was wrong. Memory allocated while
// parsing is bounded by the file size.
#ifndef VELA_GGUF_H
#define VELA_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf/types.h"
#include "gguf/verr.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

// Metadata value types, with the ids the format uses.
enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
};

// "UINT8", ..., "FLOAT64" as gguf-dump prints them; "UNKNOWN" otherwise.
const char *gguf_vtype_name(uint32_t vtype);
// Bytes of one element of a fixed-size type; 0 for STRING / ARRAY / unknown.
size_t gguf_vtype_size(uint32_t vtype);

// A string inside the mapping (not NUL-terminated) or owned by a writer.
struct gguf_str {
    uint64_t len;
    const char *data;
};

struct gguf_value;

struct gguf_array {
    enum gguf_vtype type; // element type
    uint64_t n;
    // Fixed-size element types: n packed little-endian elements inside the
    // mapping; may be unaligned, so read them with memcpy or gguf_arr_* below.
    const void *data;
    struct gguf_str *strs;     // STRING elements: n entries (else NULL)
    struct gguf_value *elems;  // ARRAY elements: n nested arrays (else NULL)
};

struct gguf_value {
    enum gguf_vtype type;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
        bool b;
        struct gguf_str str;
        struct gguf_array arr;
    };
};

struct gguf_kv {
    char *key;          // NUL-terminated copy
    uint64_t offset;    // byte offset of the key in the file
    struct gguf_value val;
};

struct gguf_tensor_info {
    char *name;                 // NUL-terminated copy
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];  // ne[0] is the fastest-varying (row length); unused dims are 1
    enum ggml_type type;
    uint64_t offset;            // relative to the start of the data section
    uint64_t nbytes;
    const void *data;           // inside the mapping
};

struct gguf_file {
    char *path;
    uint32_t version;           // 2 or 3
    uint64_t n_kv;
    struct gguf_kv *kv;         // [n_kv]
    uint64_t n_tensors;
    struct gguf_tensor_info *tensors; // [n_tensors]
    uint64_t alignment;         // general.alignment or 32
    uint64_t data_offset;       // start of the data section in the file
    const uint8_t *map;         // [size]
    uint64_t size;
    void *priv;                 // reader-private state
};

// Opens and parses `path`. On failure *out is NULL and err says why.
int gguf_open(struct gguf_file **out, const char *path, struct verr *err);
// Parses a GGUF image already in memory (tests, fuzzing). `name` is used in
// messages. The buffer must outlive the returned file; it is not copied.
int gguf_open_memory(struct gguf_file **out, const void *buf, size_t size, const char *name,
                     struct verr *err);
void gguf_close(struct gguf_file *f);

// Index of a key, or -1.
int64_t gguf_find_key(const struct gguf_file *f, const char *key);
const struct gguf_value *gguf_get(const struct gguf_file *f, const char *key);
const struct gguf_tensor_info *gguf_find_tensor(const struct gguf_file *f, const char *name);

// Typed getters. Return VERR_NOTFOUND when the key is absent (callers use it
// to apply defaults) and VERR_TYPE when the value has another type, with a
// message "FILE: key 'K': expected UINT32, found STRING". Integer getters
// accept any integer type whose value fits; float getters accept FLOAT32,
// FLOAT64 and integers.
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct verr *err);
int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *out, struct verr *err);
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out, struct verr *err);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct verr *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct verr *err);
// The string is copied, NUL-terminated, into a malloc'd buffer the caller frees.
int gguf_get_str(const struct gguf_file *f, const char *key, char **out, struct verr *err);
// An array whose elements have type `elem` (GGUF_VT_COUNT accepts any).
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                 const struct gguf_array **out, struct verr *err);

// Element i of a fixed-size numeric array, converted (no bounds beyond i < n
// checked by the caller).
double gguf_arr_get_f64(const struct gguf_array *a, uint64_t i);
int64_t gguf_arr_get_i64(const struct gguf_array *a, uint64_t i);

// ---------------------------------------------------------------------------
// Writer. Metadata and tensor infos are declared first; the file is then
// written in one pass. Tensor data is either given with the tensor (the
// pointer must stay valid until gguf_writer_save / the tensor is written) or
// streamed in declaration order after gguf_writer_begin, so multi-gigabyte
// files never need to sit in memory.
struct gguf_writer;

struct gguf_writer *gguf_writer_new(void);
void gguf_writer_free(struct gguf_writer *w);

// Setting a key that is already set replaces its value (keeping its place in
// the key order). Strings and arrays are copied. These calls have no verr
// argument: the first failure (NULL or empty key, bad alignment, arrays
// nested more than 8 deep, out of memory) is remembered and makes
// gguf_writer_save / gguf_writer_begin fail with its message.
int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8(struct gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(struct gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_f64(struct gguf_writer *w, const char *key, double v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
// n packed elements of a fixed-size type.
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                        const void *data, uint64_t n);
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                            uint64_t n);
// Copies any value (including nested arrays) read from another file. Note
// that llama.cpp's C reader refuses arrays of arrays (gguf-py and vela read
// them), so files meant for llama.cpp should not use them.
int gguf_writer_set_value(struct gguf_writer *w, const char *key, const struct gguf_value *v);
// general.alignment (power of two); also written as the key.
int gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment);

// Declares a tensor; `data` may be NULL when it will be streamed. Names are
// 1..63 bytes (ggml's limit), dims 0..4 (0: a scalar), each ne > 0, ne[0] a
// multiple of the type's block size. Offsets are assigned in declaration
// order, each tensor padded to the alignment, as llama.cpp requires.
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type,
                           uint32_t n_dims, const int64_t *ne, const void *data,
                           struct verr *err);

// Whole file at once: every tensor must have been given data.
int gguf_writer_save(struct gguf_writer *w, const char *path, struct verr *err);

// Streaming: begin writes header, metadata and tensor infos; then each
// tensor's data in declaration order (one call per tensor, or several chunks
// that add up to its size); finish pads, flushes and closes. Writing more
// bytes than the current tensor declares, or finishing before every tensor
// is complete, fails and removes the partial file, as does freeing the
// writer mid-stream.
int gguf_writer_begin(struct gguf_writer *w, const char *path, struct verr *err);
int gguf_writer_write_tensor_data(struct gguf_writer *w, const void *data, size_t nbytes,
                                  struct verr *err);
int gguf_writer_finish(struct gguf_writer *w, struct verr *err);

#endif
