// `vela gguf dump`: the text layout (gguf_dump.py style), the JSON output,
// exit codes and messages. Runs the vela binary named by VELA_BIN (ctest
// sets it); skips itself when it is not set.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf/gguf.h"

static char tmp_dir[64];

static void make_tmp(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vela_test_dump_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir));
}

static void remove_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_dir);
}

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static const char *vela_bin(void) {
    const char *bin = getenv("VELA_BIN");
    if (!bin || access(bin, X_OK) != 0)
        cr_skip_test("VELA_BIN is not set to the vela binary (ctest sets it)");
    return bin;
}

// Runs `vela ARGS` (stdout and stderr together); returns the exit status and
// the output in a malloc'd string.
static int run_vela(const char *args, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", vela_bin(), args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 4096)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#define EXPECT_HAS(out, s) cr_expect(strstr(out, s) != NULL, "output lacks [%s]:\n%s", s, out)

static void write_sample(const char *path) {
    struct gguf_writer *w = gguf_writer_new();
    struct verr err = {0};
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", 4096);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_writer_set_i64(w, "x.i64", -12345678901234ll);
    gguf_writer_set_u64(w, "x.u64", 18446744073709551615ull);
    gguf_writer_set_str(w, "x.long", "0123456789012345678901234567890123456789012345678901234567890123456789");
    gguf_writer_set_str(w, "x.quote", "it's \"here\"\n");
    int32_t ten[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    gguf_writer_set_arr(w, "x.ten", GGUF_VT_INT32, ten, 10);
    gguf_writer_set_arr(w, "x.three", GGUF_VT_INT32, ten, 3);
    const char *toks[] = {"<s>", "</s>", "a", "b", "c", "d", "e"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 7);
    struct gguf_value inner[2];
    memset(inner, 0, sizeof inner);
    inner[0].type = inner[1].type = GGUF_VT_ARRAY;
    inner[0].arr = (struct gguf_array){.type = GGUF_VT_INT32, .n = 2, .data = ten};
    inner[1].arr = (struct gguf_array){.type = GGUF_VT_INT32, .n = 1, .data = ten + 2};
    struct gguf_value nested = {.type = GGUF_VT_ARRAY};
    nested.arr = (struct gguf_array){.type = GGUF_VT_ARRAY, .n = 2, .elems = inner};
    gguf_writer_set_value(w, "x.nested", &nested);
    // Bytes that are not UTF-8 must still give valid output.
    struct gguf_value bad = {.type = GGUF_VT_STRING};
    bad.str = (struct gguf_str){3, "\xff\x00z"};
    gguf_writer_set_value(w, "x.bytes", &bad);
    static float data[4096 * 2];
    int64_t ne[] = {4096, 2};
    int64_t neq[] = {256};
    static uint8_t q[144];
    cr_assert_eq(gguf_writer_add_tensor(w, "token_embd.weight", GGML_TYPE_F32, 2, ne, data, &err), 0);
    cr_assert_eq(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", GGML_TYPE_Q4_K, 1, neq, q, &err), 0);
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
}

Test(gguf_dump, text_layout, .init = make_tmp, .fini = remove_tmp) {
    const char *path = tmp_path("s.gguf");
    write_sample(path);
    char args[512], *out;
    snprintf(args, sizeof args, "gguf dump '%s'", path);
    cr_assert_eq(run_vela(args, &out), 0, "%s", out);
    EXPECT_HAS(out, "* GGUF version 3, LITTLE endian, 2 tensor(s), 14 key/value pair(s), alignment 32");
    EXPECT_HAS(out, "* Dumping 17 key/value pair(s)\n");
    EXPECT_HAS(out, "      1: UINT32     |        1 | GGUF.version = 3\n");
    EXPECT_HAS(out, "      2: UINT64     |        1 | GGUF.tensor_count = 2\n");
    EXPECT_HAS(out, "      3: UINT64     |        1 | GGUF.kv_count = 14\n");
    EXPECT_HAS(out, "      4: STRING     |        1 | general.architecture = 'llama'\n");
    EXPECT_HAS(out, "      5: UINT32     |        1 | llama.context_length = 4096\n");
    EXPECT_HAS(out, "      6: FLOAT32    |        1 | llama.rope.freq_base = 10000.0\n");
    EXPECT_HAS(out, "| llama.attention.layer_norm_rms_epsilon = 1e-05\n");
    EXPECT_HAS(out, "      8: BOOL       |        1 | tokenizer.ggml.add_bos_token = True\n");
    EXPECT_HAS(out, "      9: INT64      |        1 | x.i64 = -12345678901234\n");
    EXPECT_HAS(out, "     10: UINT64     |        1 | x.u64 = 18446744073709551615\n");
    // 70 characters: cut to 57 plus "...".
    EXPECT_HAS(out, "| x.long = '012345678901234567890123456789012345678901234567890123456...'\n");
    EXPECT_HAS(out, "| x.quote = 'it\\'s \"here\"\\n'\n");
    EXPECT_HAS(out, "     13: [INT32]    |       10 | x.ten = [1, 2, 3, 4, 5, ...]\n");
    EXPECT_HAS(out, "     14: [INT32]    |        3 | x.three = [1, 2, 3]\n");
    EXPECT_HAS(out, "     15: [STRING]   |        7 | tokenizer.ggml.tokens = ['<s>', '</s>', 'a', 'b', 'c', ...]\n");
    EXPECT_HAS(out, "     16: [[INT32]]  |        2 | x.nested = [[1, 2], [3]]\n");
    EXPECT_HAS(out, "     17: STRING     |        1 | x.bytes = '\\xff\\x00z'\n");
    EXPECT_HAS(out, "* Dumping 2 tensor(s)\n");
    EXPECT_HAS(out, "      1: token_embd.weight   |  4096,     2,     1,     1 | F32     |            0 |        32768\n");
    EXPECT_HAS(out, "      2: blk.0.attn_q.weight |   256,     1,     1,     1 | Q4_K    |        32768 |          144\n");
    free(out);

    snprintf(args, sizeof args, "gguf dump --no-tensors '%s'", path);
    cr_assert_eq(run_vela(args, &out), 0, "%s", out);
    cr_expect_null(strstr(out, "tensor(s)\n"), "%s", out);
    cr_expect_null(strstr(out, "token_embd"), "%s", out);
    free(out);
}

// Checks that braces and brackets balance outside strings and that strings
// contain no raw control characters: enough to catch broken JSON here.
static bool json_shape_ok(const char *s) {
    int depth = 0;
    bool in_str = false;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (in_str) {
            if (c == '\\')
                s++;
            else if (c == '"')
                in_str = false;
            else if (c < 0x20)
                return false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0)
                return false;
        }
    }
    return depth == 0 && !in_str;
}

Test(gguf_dump, json, .init = make_tmp, .fini = remove_tmp) {
    const char *path = tmp_path("s.gguf");
    write_sample(path);
    char args[512], *out;
    snprintf(args, sizeof args, "gguf dump --json '%s'", path);
    cr_assert_eq(run_vela(args, &out), 0, "%s", out);
    cr_expect(json_shape_ok(out), "%s", out);
    EXPECT_HAS(out, "\"endian\":\"LITTLE\"");
    EXPECT_HAS(out, "\"version\":3");
    EXPECT_HAS(out, "\"GGUF.kv_count\":{\"index\":2,\"type\":\"UINT64\",\"offset\":16,\"value\":14}");
    EXPECT_HAS(out, "\"llama.context_length\":{\"index\":4,\"type\":\"UINT32\",\"offset\":");
    EXPECT_HAS(out, "\"value\":4096}");
    EXPECT_HAS(out, "\"value\":10000.0}");
    EXPECT_HAS(out, "\"value\":true}");
    EXPECT_HAS(out, "\"value\":18446744073709551615}");
    EXPECT_HAS(out, "\"array_types\":[\"INT32\"],\"count\":10,\"value\":[1,2,3,4,5,6,7,8,9,10]}");
    EXPECT_HAS(out, "\"array_types\":[\"ARRAY\",\"INT32\"],\"count\":2,\"value\":[[1,2],[3]]}");
    EXPECT_HAS(out, "\"value\":[\"<s>\",\"</s>\",\"a\",\"b\",\"c\",\"d\",\"e\"]}");
    EXPECT_HAS(out, "\"value\":\"it's \\\"here\\\"\\n\"}");
    EXPECT_HAS(out, "\"value\":\"\xef\xbf\xbd\xef\xbf\xbdz\"}");
    EXPECT_HAS(out, "\"token_embd.weight\":{\"index\":0,\"shape\":[4096,2],\"type\":\"F32\","
                    "\"offset\":0,\"bytes\":32768}");
    free(out);
}

Test(gguf_dump, usage_and_errors, .init = make_tmp, .fini = remove_tmp) {
    char args[512], *out;
    cr_expect_eq(run_vela("gguf --help", &out), 0);
    EXPECT_HAS(out, "usage: vela gguf");
    free(out);
    cr_expect_eq(run_vela("gguf dump --help", &out), 0);
    EXPECT_HAS(out, "usage: vela gguf dump FILE");
    free(out);
    cr_expect_eq(run_vela("gguf", &out), 2);
    EXPECT_HAS(out, "usage: vela gguf");
    free(out);
    cr_expect_eq(run_vela("gguf frob", &out), 2);
    EXPECT_HAS(out, "unknown subcommand 'frob'");
    free(out);
    cr_expect_eq(run_vela("gguf dump", &out), 2);
    EXPECT_HAS(out, "missing FILE");
    free(out);

    const char *path = tmp_path("s.gguf");
    write_sample(path);
    snprintf(args, sizeof args, "gguf dump --bogus '%s'", path);
    cr_expect_eq(run_vela(args, &out), 2);
    EXPECT_HAS(out, "unknown option '--bogus'");
    free(out);
    snprintf(args, sizeof args, "gguf dump '%s' '%s'", path, path);
    cr_expect_eq(run_vela(args, &out), 2);
    EXPECT_HAS(out, "more than one FILE");
    free(out);

    snprintf(args, sizeof args, "gguf dump '%s'", tmp_path("absent.gguf"));
    cr_expect_eq(run_vela(args, &out), 1);
    EXPECT_HAS(out, "absent.gguf: cannot open: No such file or directory");
    free(out);

    // A file cut short: exit 1 with the reader's message.
    FILE *fp = fopen(tmp_path("cut.gguf"), "wb");
    fwrite("GGUF\3\0\0\0\1\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\5\0\0", 1, 27, fp);
    fclose(fp);
    snprintf(args, sizeof args, "gguf dump '%s'", tmp_path("cut.gguf"));
    cr_expect_eq(run_vela(args, &out), 1);
    EXPECT_HAS(out, "cut.gguf: offset 16: key/value count 1 cannot fit in the 3 bytes after the header");
    free(out);
}

Test(gguf_dump, vocab_file) {
    const char *dir = getenv("VELA_SHARED_DIR");
    char path[1024], args[1200], *out;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", dir ? dir : "");
    if (!dir || access(path, R_OK) != 0)
        cr_skip_test("ggml-vocab-llama-spm.gguf not found (VELA_SHARED_DIR unset or no vocab/)");
    snprintf(args, sizeof args, "gguf dump '%s'", path);
    cr_assert_eq(run_vela(args, &out), 0, "%s", out);
    EXPECT_HAS(out, "     16: STRING     |        1 | tokenizer.ggml.model = 'llama'\n");
    EXPECT_HAS(out, "     18: [STRING]   |    32000 | tokenizer.ggml.tokens = ['<unk>', '<s>', '</s>', '<0x00>', '<0x01>', ...]\n");
    EXPECT_HAS(out, "     19: [FLOAT32]  |    32000 | tokenizer.ggml.scores = [0.0, 0.0, 0.0, 0.0, 0.0, ...]\n");
    free(out);
    snprintf(args, sizeof args, "gguf dump --json '%s'", path);
    cr_assert_eq(run_vela(args, &out), 0);
    cr_expect(json_shape_ok(out));
    EXPECT_HAS(out, "\"tokenizer.ggml.model\":{\"index\":15,");
    free(out);
}

Test(gguf_dump, damaged_files_never_crash, .init = make_tmp, .fini = remove_tmp) {
    // Byte flips in the metadata: dump either prints or fails with exit 1,
    // never crashes (the binary may be built with sanitizers).
    const char *path = tmp_path("s.gguf");
    write_sample(path);
    FILE *fp = fopen(path, "rb");
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    uint64_t rng = 99;
    for (int it = 0; it < 40; it++) {
        static uint8_t copy[sizeof buf];
        memcpy(copy, buf, n);
        for (int k = 0; k < 3; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            copy[(rng >> 33) % 700] ^= (uint8_t)(rng >> 20);
        }
        fp = fopen(tmp_path("f.gguf"), "wb");
        fwrite(copy, 1, n, fp);
        fclose(fp);
        char args[512], *out;
        snprintf(args, sizeof args, "gguf dump %s '%s'", it % 2 ? "--json" : "", tmp_path("f.gguf"));
        int rc = run_vela(args, &out);
        cr_expect(rc == 0 || rc == 1, "iteration %d: exit %d\n%s", it, rc, out);
        if (rc == 0 && it % 2)
            cr_expect(json_shape_ok(out), "iteration %d: broken JSON", it);
        free(out);
    }
}
