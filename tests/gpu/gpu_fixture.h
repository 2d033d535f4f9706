// Test helper (header-only, included by gpu/test_cuda_ops.c and
// gpu/test_cuda_sample.c): a CPU reference backend and a CUDA backend on
// device 0, made by setup() and destroyed by teardown() (the file's
// TestSuite names them); without a CUDA device both stay NULL and every test
// skips itself through REQUIRE_GPU().
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

#endif
