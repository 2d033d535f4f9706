// The CPU backend's attention op (struct backend_ops.attention, contract in
// host/ops/backend.h): the rotated-K cache and the unrotated one with RoPE
// inside attention (exact self-extend, host/ops/selfextend.h).
//
// One op family per file: backend_cpu.c keeps the op table and hands each
// call here with its thread pool and a per-backend state (buffers reused
// from call to call), which this file creates on first use.
#ifndef VELA_HOST_CPU_ATTENTION_H
#define VELA_HOST_CPU_ATTENTION_H

#include <stdbool.h>

#include "gguf/verr.h"
#include "host/backend/threadpool.h"
#include "host/ops/backend.h"

struct cpu_attn;

// One attention call on pool's threads. *st is created on the first call
// (NULL before) and kept for the next; one call at a time per state.
int cpu_attention_run(struct cpu_attn **st, struct threadpool *pool, const struct attn_args *a,
                      struct verr *err);

// Kernel experiments (tests and benchmarks compare the paths on one
// machine): with plain, states created from now on (a backend's first
// attention call creates its state) run the plain C kernels even where the
// AVX2 ones could run; they give the same bits. The product never calls it.
void cpu_attention_pin_plain(bool plain);

// Frees a state (NULL is fine).
void cpu_attention_free(struct cpu_attn *st);

#endif
