// libFuzzer target for the GGUF reader: parses any input with
// gguf_open_memory and, when it is accepted, walks every key/value, every
// array element and every tensor's data, and calls the typed getters.
//
// Build and run (clang only; see tests/fuzz/README.md):
//   CC=clang cmake -S . -B build-fuzz -G Ninja -DVELA_CUDA=OFF -DVELA_FUZZ=ON \
//       -DVELA_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
//   ninja -C build-fuzz fuzz_gguf
//   mkdir -p build-fuzz/corpus && ./build-fuzz/tests/fuzz/fuzz_gguf -max_total_time=120 \
//       -max_len=8192 -rss_limit_mb=2048 build-fuzz/corpus tests/fuzz/corpus
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

static volatile uint64_t sink;

static void walk_array(const struct gguf_array *a) {
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->type == GGUF_VT_STRING) {
            const struct gguf_str *s = &a->strs[i];
            for (uint64_t k = 0; k < s->len; k++)
                sink += (uint8_t)s->data[k];
        } else if (a->type == GGUF_VT_ARRAY) {
            walk_array(&a->elems[i].arr);
        } else {
            sink += (uint64_t)gguf_arr_get_i64(a, i);
            sink += gguf_arr_get_f64(a, i) > 0;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf_file *f = NULL;
    struct verr err;
    if (gguf_open_memory(&f, data, size, "fuzz.gguf", &err) != 0) {
        // A failure must leave a message naming the input.
        if (strncmp(err.msg, "fuzz.gguf: ", 11) != 0 || f != NULL)
            abort();
        return 0;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (gguf_find_key(f, kv->key) != (int64_t)i)
            abort();
        if (kv->val.type == GGUF_VT_STRING) {
            for (uint64_t k = 0; k < kv->val.str.len; k++)
                sink += (uint8_t)kv->val.str.data[k];
        } else if (kv->val.type == GGUF_VT_ARRAY) {
            walk_array(&kv->val.arr);
        }
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f32;
        bool b;
        char *s = NULL;
        const struct gguf_array *a;
        sink += (uint64_t)gguf_get_u32(f, kv->key, &u32, &err);
        sink += (uint64_t)gguf_get_i32(f, kv->key, &i32, &err);
        sink += (uint64_t)gguf_get_u64(f, kv->key, &u64, &err);
        sink += (uint64_t)gguf_get_f32(f, kv->key, &f32, &err);
        sink += (uint64_t)gguf_get_bool(f, kv->key, &b, &err);
        sink += (uint64_t)gguf_get_arr(f, kv->key, GGUF_VT_COUNT, &a, &err);
        if (gguf_get_str(f, kv->key, &s, &err) == 0)
            free(s);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        if (gguf_find_tensor(f, t->name) != t)
            abort();
        const uint8_t *d = t->data;
        if (t->offset % f->alignment != 0 || t->nbytes == 0 || d < data ||
            t->nbytes > (uint64_t)(data + size - d))
            abort();
        sink += d[0] + d[t->nbytes - 1];
    }
    gguf_close(f);
    return 0;
}
