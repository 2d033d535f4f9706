// Test helper (header-only, included by the gpu/test_cuda_*.c op tests): a CPU reference backend
// and a CUDA backend on device 0, made by setup() and destroyed by teardown() (the file's TestSuite
// names them); without a CUDA device both stay NULL and every test skips itself through
// REQUIRE_GPU(). dbuf: one buffer on both backends.
#ifndef VELA_TESTS_GPU_FIXTURE_H
#define VELA_TESTS_GPU_FIXTURE_H

#include <criterion/criterion.h>

#include "host/ops/backend.h"

static struct backend *cpu, *gpu;

static void setup(void) {
    cpu = gpu = NULL;
    if (backend_cuda_device_count() == 0)
        return; // every test skips
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&cpu, 0, &err), 0, "backend_cpu_create: %s", err.msg);
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "backend_cuda_create: %s", err.msg);
    // f32 activations on both sides unless a test asks for act_q8 on both
    cpu->act_q8 = gpu->act_q8 = false;
}

static void teardown(void) {
    backend_destroy(gpu);
    backend_destroy(cpu);
    gpu = cpu = NULL;
}

#define REQUIRE_GPU()                                                                              \
    do {                                                                                           \
        if (!gpu)                                                                                  \
            cr_skip_test("no CUDA device present");                                                \
    } while (0)

#define OK(be, call) cr_assert_eq((call), 0, "%s: %s", (be)->ops->name, (be)->err.msg)

// One buffer on both backends holding the same bytes.
struct dbuf {
    void *c, *g;
    size_t bytes;
};

static inline struct dbuf dbuf_new(const void *host, size_t bytes) {
    struct dbuf b = {NULL, NULL, bytes};
    OK(cpu, cpu->ops->alloc(cpu, bytes, &b.c));
    OK(gpu, gpu->ops->alloc(gpu, bytes, &b.g));
    if (host) {
        OK(cpu, cpu->ops->upload(cpu, b.c, host, bytes));
        OK(gpu, gpu->ops->upload(gpu, b.g, host, bytes));
    } else {
        OK(cpu, cpu->ops->memset_zero(cpu, b.c, bytes));
        OK(gpu, gpu->ops->memset_zero(gpu, b.g, bytes));
    }
    return b;
}

static inline void dbuf_free(struct dbuf *b) {
    cpu->ops->free(cpu, b->c);
    gpu->ops->free(gpu, b->g);
    b->c = b->g = NULL;
}

#endif
