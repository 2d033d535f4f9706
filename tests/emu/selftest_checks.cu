// The emulator's sanitizer checks check themselves (ctest:
// test_emu_selftest_checks): each check fires on a small kernel written to
// break it, naming the bug, and stays quiet on the corrected kernel, so no
// check can go blind unnoticed. Each case runs in its own process (a fault
// is sticky): `selftest_checks bad N` / `selftest_checks good N`.
// Compiled like cuda/*.cu: cu2cpp.py, then host C++ with cuda_emu.h.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>

// Missing __syncthreads: thread t reads what thread 63 - t (another warp)
// wrote.
__global__ void block_sync_kernel(float *out, int good) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    if (good)
        __syncthreads();
    out[threadIdx.x] = s[63 - threadIdx.x];
}

// The same in a kernel template (whose statics GCC would not place where
// the runtime looks: __shared__ is rewritten by cu2cpp.py).
template <int N> __global__ void tmpl_sync_kernel(float *out, int good) {
    __shared__ float s[N];
    s[threadIdx.x] = (float)threadIdx.x;
    if (good)
        __syncthreads();
    out[threadIdx.x] = s[N - 1 - threadIdx.x];
}

// Missing __syncwarp: lane l reads what lane l ^ 1 wrote.
__global__ void warp_sync_kernel(float *out, int good) {
    __shared__ float s[32];
    s[threadIdx.x] = (float)threadIdx.x;
    if (good)
        __syncwarp();
    out[threadIdx.x] = s[threadIdx.x ^ 1];
}

// __syncwarp orders a warp only: across warps it takes __syncthreads.
__global__ void syncwarp_across_warps_kernel(float *out, int good) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    if (good)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = s[(threadIdx.x + 32) % 64];
}

// A warp shuffle orders the lanes it names (here all): the good kernel
// exchanges through shared memory after one. Bad: the shuffle names lanes
// 0..15 only, and lane 16 reads what lane 17 wrote.
__global__ void shfl_orders_kernel(float *out, int good) {
    __shared__ float s[32];
    s[threadIdx.x] = (float)threadIdx.x;
    float v = 0.0f;
    if (good)
        v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    else if (threadIdx.x < 16)
        v = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);
    out[threadIdx.x] = s[threadIdx.x ^ 1] + v;
}

// Write after read: every thread reads its right neighbour's element and
// then overwrites its own, without a barrier between the two steps.
__global__ void war_kernel(float *out, int good) {
    __shared__ float s[65];
    s[threadIdx.x] = (float)threadIdx.x;
    if (threadIdx.x == 0)
        s[64] = 0.0f;
    __syncthreads();
    const float r = s[threadIdx.x + 1];
    if (good)
        __syncthreads();
    s[threadIdx.x] = r;
    out[threadIdx.x] = r;
}

// Two threads write one shared word in the same interval (WAW).
__global__ void waw_kernel(float *out, int good) {
    __shared__ float s[1];
    if (good ? threadIdx.x == 0 : threadIdx.x < 2)
        s[0] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[0];
}

// Shared-memory atomics are not hazards.
__global__ void smem_atomic_kernel(int *out, int good) {
    __shared__ int count;
    if (threadIdx.x == 0)
        count = 0;
    __syncthreads();
    atomicAdd(&count, 1);
    __syncthreads();
    out[threadIdx.x] = count + good * 0;
}

// Reads device memory nobody wrote (the good run memsets it first).
__global__ void uninit_kernel(const float *in, float *out) {
    out[threadIdx.x] = in[threadIdx.x] * 2.0f;
}

// A float4 load at an address that is not a multiple of 16.
__global__ void misaligned_kernel(const float *in, float *out, int off) {
    const float4 v = ((const float4 *)(in + off))[threadIdx.x];
    out[threadIdx.x] = v.x + v.w;
}

// Reads n floats of a 64-float allocation: n = 65 runs off its end (into
// its red zone, where the next allocation might otherwise be).
__global__ void oob_kernel(const float *in, float *out, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += in[i];
    out[threadIdx.x] = s;
}

// A cp.async with zero-fill whose 16-byte source window runs past the end
// of a 250-byte allocation (bad: bytes 240..255, 10 read and 6 zero-filled)
// or lies inside it (good: bytes 224..239): compute-sanitizer flags the
// first as an out-of-bounds read although PTX reads only the 10 bytes.
__global__ void cp_async_window_kernel(const unsigned char *in, float *out, int off) {
    __shared__ float4 s4[1]; // 16-byte aligned
    __pipeline_memcpy_async(s4, in + off, 16, 6);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    out[threadIdx.x] = (float)((const unsigned char *)s4)[threadIdx.x];
}

// Every block writes out[0] (bad) or adds to it atomically (good).
__global__ void block_race_kernel(int *out, int good) {
    if (threadIdx.x != 0)
        return;
    if (good)
        atomicAdd(out, 1);
    else
        out[0] = (int)blockIdx.x;
}

// For the schedule test: the order blocks ran in, and thread 1 reading a
// global value thread 0 writes with no barrier (a race only a different
// thread order exposes; racecheck does not watch global memory within a
// block).
__global__ void order_kernel(int *order, int *count, int *flag, int *seen) {
    if (threadIdx.x == 0) {
        order[blockIdx.x] = atomicAdd(count, 1);
        flag[blockIdx.x] = 1;
    }
    if (threadIdx.x == 1)
        seen[blockIdx.x] = flag[blockIdx.x];
}

// For the traffic counters (VELA_EMU_TRAFFIC): 32 lanes load 32 floats,
// stride 1 (one request, 4 sectors) or 32 (one request, 32 sectors).
__global__ void stride_kernel(const float *in, float *out, int stride) {
    out[threadIdx.x] = in[threadIdx.x * stride];
}

struct check_case {
    const char *name;
    const char *expect; // in the bad run's error message
};
static const check_case k_cases[] = {
    {"missing __syncthreads", "racecheck: WAR hazard on static shared memory + 128"},
    {"missing __syncwarp", "racecheck: WAR hazard"},
    {"__syncwarp across warps", "racecheck: RAW hazard"},
    {"shuffle naming some lanes", "racecheck: WAR hazard"},
    {"write after read", "racecheck: WAR hazard"},
    {"two writers", "racecheck: WAW hazard"},
    {"shared atomics", nullptr}, // no bad variant
    {"uninitialised global read", "initcheck: 4-byte global read"},
    {"uninitialised copy to the host", "initcheck: 256 bytes read"},
    {"misaligned float4", "memcheck: misaligned 16-byte global read"},
    {"out of bounds of one allocation", "memcheck: out-of-bounds 4-byte global read"},
    {"cross-block write race", "racecheck: global write race"},
    {"missing __syncthreads in a template", "racecheck: WAR hazard on static shared memory"},
    {"cp.async zero-fill window past an allocation", "memcheck: cp.async zero-fill copy"},
};
enum { N_CASES = sizeof k_cases / sizeof k_cases[0] };

static int child(bool bad, int which) {
    const int good = !bad;
    float *a, *b, *out, h[64];
    int *io;
    cudaMalloc((void **)&a, 64 * sizeof(float));
    cudaMalloc((void **)&b, 64 * sizeof(float));
    cudaMalloc((void **)&out, 64 * sizeof(float));
    cudaMalloc((void **)&io, 64 * sizeof(int));
    cudaMemset(b, 0, 64 * sizeof(float));
    cudaMemset(io, 0, 64 * sizeof(int));
    switch (which) {
    case 0:
        block_sync_kernel<<<1, 64>>>(out, good);
        break;
    case 1:
        warp_sync_kernel<<<1, 32>>>(out, good);
        break;
    case 2:
        syncwarp_across_warps_kernel<<<1, 64>>>(out, good);
        break;
    case 3:
        shfl_orders_kernel<<<1, 32>>>(out, good);
        break;
    case 4:
        war_kernel<<<1, 64>>>(out, good);
        break;
    case 5:
        waw_kernel<<<1, 32>>>(out, good);
        break;
    case 6:
        smem_atomic_kernel<<<1, 64>>>(io, good);
        break;
    case 7:
        if (good)
            cudaMemset(a, 0, 64 * sizeof(float));
        uninit_kernel<<<1, 64>>>(a, out);
        break;
    case 8:
        if (good)
            cudaMemset(a, 0, 64 * sizeof(float));
        cudaMemcpy(h, a, sizeof h, cudaMemcpyDeviceToHost);
        break;
    case 9:
        misaligned_kernel<<<1, 8>>>(b, out, bad ? 1 : 0);
        break;
    case 10:
        oob_kernel<<<1, 1>>>(b, out, bad ? 65 : 64);
        break;
    case 11:
        block_race_kernel<<<4, 32>>>(io, good);
        break;
    case 12:
        tmpl_sync_kernel<64><<<1, 64>>>(out, good);
        break;
    case 13: {
        unsigned char *c;
        cudaMalloc((void **)&c, 250);
        cudaMemset(c, 0, 250);
        cp_async_window_kernel<<<1, 1>>>(c, out, bad ? 240 : 224);
        break;
    }
    }
    const cudaError_t e = cudaDeviceSynchronize();
    const char *msg = e != cudaSuccess ? cudaGetErrorString(e) : "no error";
    if (bad) {
        const bool ok = e != cudaSuccess && strstr(msg, k_cases[which].expect);
        fprintf(stderr, "%s: %s (want \"%s\")\n", ok ? "(expected)" : "NOT REPORTED", msg,
                k_cases[which].expect);
        return ok ? 0 : 1;
    }
    if (e != cudaSuccess)
        fprintf(stderr, "FALSE POSITIVE on the corrected kernel: %s\n", msg);
    return e == cudaSuccess ? 0 : 1;
}

// Prints the block order and what thread 1 saw, for the schedule test.
static int order_child(void) {
    enum { NB = 16 };
    int *order, *count, *flag, *seen, h[2 * NB];
    cudaMalloc((void **)&order, NB * sizeof(int));
    cudaMalloc((void **)&count, sizeof(int));
    cudaMalloc((void **)&flag, NB * sizeof(int));
    cudaMalloc((void **)&seen, NB * sizeof(int));
    cudaMemset(count, 0, sizeof(int));
    cudaMemset(flag, 0, NB * sizeof(int));
    order_kernel<<<NB, 64>>>(order, count, flag, seen);
    cudaMemcpy(h, order, NB * sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpy(h + NB, seen, NB * sizeof(int), cudaMemcpyDeviceToHost);
    if (cudaDeviceSynchronize() != cudaSuccess)
        return 1;
    for (int i = 0; i < 2 * NB; i++) // the block order, then what thread 1 saw
        printf("%d%s", h[i], i == NB - 1 ? "\n" : " ");
    printf("\n");
    return 0;
}

// Runs the strided loads with VELA_EMU_TRAFFIC set (by the parent).
static int traffic_child(void) {
    float *in, *out;
    cudaMalloc((void **)&in, 32 * 32 * sizeof(float));
    cudaMalloc((void **)&out, 32 * sizeof(float));
    cudaMemset(in, 0, 32 * 32 * sizeof(float));
    stride_kernel<<<1, 32>>>(in, out, 1);
    stride_kernel<<<1, 32>>>(in, out, 32);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}

static int run(const char *cmd, char *out, size_t n) {
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t k = fread(out, 1, n - 1, f);
    out[k] = 0;
    return pclose(f);
}

int main(int argc, char **argv) {
    if (argc == 3)
        return child(strcmp(argv[1], "bad") == 0, atoi(argv[2]));
    if (argc == 2 && strcmp(argv[1], "order") == 0)
        return order_child();
    if (argc == 2 && strcmp(argv[1], "traffic") == 0)
        return traffic_child();
    int fail = 0;
    char cmd[4200], out[4096];
    for (int k = 0; k < N_CASES; k++) {
        for (int bad = 0; bad < 2; bad++) {
            if (bad && !k_cases[k].expect)
                continue;
            snprintf(cmd, sizeof cmd, "%s %s %d", argv[0], bad ? "bad" : "good", k);
            const int rc = system(cmd);
            if (rc != 0) {
                fprintf(stderr, "FAIL: %s (%s kernel)\n", k_cases[k].name,
                        bad ? "not reported on the broken" : "reported on the corrected");
                fail++;
            }
        }
    }
    // The schedules: forward runs blocks in order and thread 0 before
    // thread 1; random:SEED runs blocks and threads in a seeded order (the
    // same for the same seed), so an order dependence shows up for some seed.
    char fwd[4096], first[4096];
    snprintf(cmd, sizeof cmd, "VELA_EMU_SCHEDULE=forward %s order 2>/dev/null", argv[0]);
    if (run(cmd, fwd, sizeof fwd) != 0) {
        fprintf(stderr, "FAIL: order child (forward)\n");
        fail++;
    }
    const char *want = "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 \n";
    if (strcmp(fwd, want) != 0) {
        fprintf(stderr, "FAIL: forward schedule: %s", fwd);
        fail++;
    }
    int differ = 0, stale = 0;
    for (int seed = 1; seed <= 4; seed++) {
        snprintf(cmd, sizeof cmd, "VELA_EMU_SCHEDULE=random:%d %s order 2>/dev/null", seed,
                 argv[0]);
        if (run(cmd, out, sizeof out) != 0) {
            fprintf(stderr, "FAIL: order child (seed %d)\n", seed);
            fail++;
            continue;
        }
        if (seed == 1) {
            strcpy(first, out);
            if (run(cmd, out, sizeof out) != 0 || strcmp(first, out) != 0) {
                fprintf(stderr, "FAIL: random:1 is not reproducible\n");
                fail++;
            }
        }
        const char *nl = strchr(out, '\n');
        differ += !nl || strncmp(out, want, (size_t)(nl - out)) != 0; // the block order
        stale += nl && strstr(nl, "0 ") != NULL; // thread 1 ran before thread 0
    }
    if (differ < 4 || stale == 0) {
        fprintf(stderr,
                "FAIL: random schedule: %d of 4 seeds reorder blocks, %d see thread 1 "
                "run first\n",
                differ, stale);
        fail++;
    }
    // Traffic: a coalesced warp load is one request of 4 sectors (128
    // bytes), a stride-32 one touches 32 sectors where 4 would do; the
    // stores are coalesced in both.
    char tmp[] = "/tmp/vela_emu_traffic_XXXXXX";
    const int fd = mkstemp(tmp);
    if (fd >= 0)
        close(fd);
    snprintf(cmd, sizeof cmd, "VELA_EMU_TRAFFIC=%s %s traffic 2>/dev/null", tmp, argv[0]);
    FILE *tf = fd >= 0 && run(cmd, out, sizeof out) == 0 ? fopen(tmp, "r") : NULL;
    const char *want_lines[2] = {
        "\"loads\": {\"requests\": 1, \"bytes\": 128, \"sectors\": 4, \"ideal_sectors\": 4}, "
        "\"stores\": {\"requests\": 1, \"bytes\": 128, \"sectors\": 4, \"ideal_sectors\": 4}",
        "\"loads\": {\"requests\": 1, \"bytes\": 128, \"sectors\": 32, \"ideal_sectors\": 4}, "
        "\"stores\": {\"requests\": 1, \"bytes\": 128, \"sectors\": 4, \"ideal_sectors\": 4}"};
    for (int i = 0; i < 2; i++) {
        char line[1024] = "";
        if (!tf || !fgets(line, sizeof line, tf) || !strstr(line, "stride_kernel") ||
            !strstr(line, want_lines[i])) {
            fprintf(stderr, "FAIL: traffic of stride_kernel launch %d: %s(want %s)\n", i, line,
                    want_lines[i]);
            fail++;
        }
    }
    if (tf)
        fclose(tf);
    remove(tmp);
    printf("%s\n", fail ? "selftest_checks FAILED" : "selftest_checks passed");
    return fail != 0;
}
