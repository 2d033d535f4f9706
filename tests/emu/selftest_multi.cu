// The emulator's several devices and its NCCL shim check themselves (ctest:
// test_emu_selftest_multi, run with VELA_EMU_DEVICES=3): per-device state
// behaves as CUDA's does, each cross-device bug a GPU would show is
// reported, and NCCL sends / receives deliver the right bytes in NCCL's
// order or fail as NCCL does. Compiled like cuda/*.cu (cu2cpp.py).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <thread>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

static int g_fail = 0;
#define EXPECT(c, ...)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

__global__ void fill_kernel(float *x, float v, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = v + (float)i;
}

static float *dev_alloc(int dev, int n) {
    float *p = NULL;
    cudaSetDevice(dev);
    EXPECT(cudaMalloc((void **)&p, sizeof(float) * n) == cudaSuccess, "cudaMalloc on %d", dev);
    return p;
}

// --- detections, one per process (sticky errors end a context) -----------------

// Returns 0 when the bug was reported with a message containing `needle`.
static int expect_error(cudaError_t e, const char *needle, const char *what) {
    if (e == cudaSuccess) {
        fprintf(stderr, "%s: not reported\n", what);
        return 1;
    }
    const char *msg = cudaGetErrorString(e);
    fprintf(stderr, "(expected) %s: %s\n", what, msg);
    if (needle && !strstr(msg, needle)) {
        fprintf(stderr, "%s: message lacks '%s'\n", what, needle);
        return 1;
    }
    return 0;
}

static int child(int which) {
    float *d0 = dev_alloc(0, 256), *d1 = dev_alloc(1, 256);
    float host[256] = {0};
    cudaStream_t s1;
    cudaSetDevice(1);
    cudaStreamCreate(&s1);
    cudaSetDevice(0);
    switch (which) {
    case 0: // a kernel on a stream of device 1 while device 0 is current
        fill_kernel<<<1, 256, 0, s1>>>(d1, 1.0f, 256);
        return expect_error(cudaDeviceSynchronize(), "stream of device 1 while device 0",
                            "launch on another device's stream");
    case 1: // a kernel on device 0 given device 1's memory
        fill_kernel<<<1, 256>>>(d1, 1.0f, 256);
        return expect_error(cudaDeviceSynchronize(), "allocation of device 1",
                            "kernel argument on another device");
    case 2: // the same bug through a graph captured on device 1, replayed
    {
        cudaSetDevice(1);
        cudaGraph_t g;
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal);
        fill_kernel<<<1, 256, 0, s1>>>(d0 + 8, 1.0f, 16);
        cudaStreamEndCapture(s1, &g);
        return expect_error(cudaDeviceSynchronize(), "allocation of device 0",
                            "captured kernel argument on another device");
    }
    case 3: // device-to-device copy across devices without peer access
        return expect_error(cudaMemcpy(d1, d0, 1024, cudaMemcpyDeviceToDevice), NULL,
                            "cudaMemcpyDeviceToDevice across devices");
    case 4: // wrong kind: device memory as the host source
        return expect_error(cudaMemcpy(d1, d0, 1024, cudaMemcpyHostToDevice), NULL,
                            "cudaMemcpyHostToDevice from device memory");
    case 5: // wrong kind: device memory as the host destination
        return expect_error(cudaMemcpy(d0, d1, 1024, cudaMemcpyDeviceToHost), NULL,
                            "cudaMemcpyDeviceToHost into device memory");
    case 6: // an event of device 0 recorded on device 1's stream
    {
        cudaEvent_t ev;
        cudaEventCreate(&ev);
        return expect_error(cudaEventRecord(ev, s1), NULL, "cudaEventRecord across devices");
    }
    case 7: // a graph of device 1 launched on device 0's stream
    {
        cudaSetDevice(1);
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal);
        fill_kernel<<<1, 256, 0, s1>>>(d1, 1.0f, 256);
        cudaStreamEndCapture(s1, &g);
        cudaGraphInstantiate(&ge, g, 0);
        cudaSetDevice(0);
        cudaStream_t s0;
        cudaStreamCreate(&s0);
        return expect_error(cudaGraphLaunch(ge, s0), NULL, "cudaGraphLaunch across devices");
    }
    case 8: // cuBLAS: a handle of device 0 with an operand on device 1
    {
        cublasHandle_t h;
        cublasCreate(&h);
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d0,
                                         CUDA_R_32F, 8, d1, CUDA_R_32F, 8, &zero, d0 + 64,
                                         CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st == CUBLAS_STATUS_SUCCESS)
            return 1;
        return expect_error(cudaDeviceSynchronize(), "operand B", "GEMM operand on another device");
    }
    case 9: // cudaMemsetAsync of device 1's memory on device 0's stream
        return expect_error(cudaMemsetAsync(d1, 0, 64, 0), NULL, "memset across devices");
    }
    (void)host;
    return 1;
}

// --- NCCL ---------------------------------------------------------------------------

static void upload(float *d, int dev, const float *h, int n) {
    cudaSetDevice(dev);
    cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice);
}

static void download(float *h, int dev, const float *d, int n) {
    cudaSetDevice(dev);
    cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost);
}

static void nccl_tests(void) {
    const int N = 64;
    ncclComm_t comm[3];
    float *buf[3], *out[3];
    cudaStream_t st[3];
    for (int r = 0; r < 3; r++) {
        buf[r] = dev_alloc(r, 4 * N);
        out[r] = dev_alloc(r, 4 * N);
        cudaStreamCreate(&st[r]);
    }
    // Bad communicators.
    const int dup[2] = {1, 1}, bad[2] = {0, 3};
    EXPECT(ncclCommInitAll(comm, 2, dup) == ncclInvalidUsage, "a device twice is refused");
    EXPECT(strstr(ncclGetLastError(NULL), "Duplicate GPU"), "%s", ncclGetLastError(NULL));
    EXPECT(ncclCommInitAll(comm, 2, bad) != ncclSuccess, "device 3 of 3 is refused");
    EXPECT(ncclCommInitAll(comm, 3, NULL) == ncclSuccess, "ncclCommInitAll over 3 devices");

    // A ring 0 -> 1 -> 2 -> 0 in one group, every receive posted before its
    // send: each rank gets its left neighbour's data.
    float h[4 * 64], g[4 * 64];
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < N; i++)
            h[i] = (float)(100 * r + i);
        upload(buf[r], r, h, N);
        cudaSetDevice(r);
        cudaMemset(out[r], 0, sizeof(float) * N);
    }
    EXPECT(ncclGroupStart() == ncclSuccess, "group start");
    for (int r = 0; r < 3; r++)
        EXPECT(ncclRecv(out[r], N, ncclFloat, (r + 2) % 3, comm[r], st[r]) == ncclSuccess, "recv");
    for (int r = 0; r < 3; r++)
        EXPECT(ncclSend(buf[r], N, ncclFloat, (r + 1) % 3, comm[r], st[r]) == ncclSuccess, "send");
    EXPECT(ncclGroupEnd() == ncclSuccess, "ring: %s", ncclGetLastError(NULL));
    for (int r = 0; r < 3; r++) {
        download(g, r, out[r], N);
        const int left = (r + 2) % 3;
        int bad_i = -1;
        for (int i = 0; i < N && bad_i < 0; i++)
            if (g[i] != (float)(100 * left + i))
                bad_i = i;
        EXPECT(bad_i < 0, "ring: rank %d element %d is %g", r, bad_i, bad_i < 0 ? 0 : g[bad_i]);
    }

    // Two sends 0 -> 1 match two receives in posting order.
    for (int i = 0; i < 2 * N; i++)
        h[i] = (float)i;
    upload(buf[0], 0, h, 2 * N);
    ncclGroupStart();
    ncclRecv(out[1], N, ncclFloat, 0, comm[1], st[1]);
    ncclRecv(out[1] + N, N, ncclFloat, 0, comm[1], st[1]);
    ncclSend(buf[0] + N, N, ncclFloat, 1, comm[0], st[0]); // first sent: second half
    ncclSend(buf[0], N, ncclFloat, 1, comm[0], st[0]);
    EXPECT(ncclGroupEnd() == ncclSuccess, "fifo: %s", ncclGetLastError(NULL));
    download(g, 1, out[1], 2 * N);
    EXPECT(g[0] == (float)N && g[N] == 0.0f && g[2 * N - 1] == (float)(N - 1),
           "fifo order: %g %g %g", g[0], g[N], g[2 * N - 1]);

    // Data written on the sender's stream before the send is what arrives;
    // what the receiver enqueues after the group sees it.
    cudaSetDevice(2);
    fill_kernel<<<1, 64, 0, st[2]>>>(buf[2], 7.0f, N);
    ncclGroupStart();
    ncclSend(buf[2], N, ncclFloat, 0, comm[2], st[2]);
    ncclRecv(out[0], N, ncclFloat, 2, comm[0], st[0]);
    EXPECT(ncclGroupEnd() == ncclSuccess, "after a kernel: %s", ncclGetLastError(NULL));
    cudaSetDevice(0);
    fill_kernel<<<1, 1, 0, st[0]>>>(out[0], -1.0f, 1); // after the receive
    download(g, 0, out[0], N);
    EXPECT(g[0] == -1.0f && g[1] == 8.0f && g[N - 1] == 7.0f + (N - 1), "stream order: %g %g %g",
           g[0], g[1], g[N - 1]);

    // Mismatched count or datatype.
    ncclGroupStart();
    ncclSend(buf[0], N, ncclFloat, 1, comm[0], st[0]);
    ncclRecv(out[1], N / 2, ncclFloat, 0, comm[1], st[1]);
    EXPECT(ncclGroupEnd() == ncclInvalidUsage, "count mismatch is an error");
    EXPECT(strstr(ncclGetLastError(NULL), "count and datatype"), "%s", ncclGetLastError(NULL));
    ncclGroupStart();
    ncclSend(buf[0], N, ncclFloat, 1, comm[0], st[0]);
    ncclRecv(out[1], N, ncclInt32, 0, comm[1], st[1]);
    EXPECT(ncclGroupEnd() == ncclInvalidUsage, "datatype mismatch is an error");

    // A buffer or a stream of another device than the communicator's.
    EXPECT(ncclSend(buf[1], N, ncclFloat, 1, comm[0], st[0]) == ncclInvalidArgument,
           "send from device 1 memory on rank 0 is refused");
    EXPECT(strstr(ncclGetLastError(NULL), "memory of device 1"), "%s", ncclGetLastError(NULL));
    EXPECT(ncclRecv(out[0], N, ncclFloat, 0, comm[1], st[1]) == ncclInvalidArgument,
           "receive into device 0 memory on rank 1 is refused");
    EXPECT(ncclSend(buf[0], N, ncclFloat, 1, comm[0], st[1]) == ncclInvalidArgument,
           "a stream of device 1 for rank 0 is refused");
    EXPECT(ncclSend(buf[0], 4 * N + 1, ncclFloat, 1, comm[0], st[0]) == ncclInvalidArgument,
           "a send past the allocation is refused");
    EXPECT(ncclSend(buf[0], N, ncclFloat, 3, comm[0], st[0]) == ncclInvalidArgument,
           "peer 3 of 3 is refused");
    // An error inside a group fails the group.
    ncclGroupStart();
    ncclSend(buf[0], N, ncclFloat, 1, comm[0], st[1]);
    ncclRecv(out[1], N, ncclFloat, 0, comm[1], st[1]);
    EXPECT(ncclGroupEnd() == ncclInvalidArgument, "a bad call fails its group");

    // A receive with no send in one thread: NCCL would hang; the shim fails
    // it after VELA_EMU_NCCL_TIMEOUT_MS (set short by ctest).
    EXPECT(ncclRecv(out[1], N, ncclFloat, 0, comm[1], st[1]) == ncclInvalidUsage,
           "an unmatched receive fails");
    EXPECT(strstr(ncclGetLastError(NULL), "no matching ncclSend"), "%s", ncclGetLastError(NULL));
    // ... and the queues are clean afterwards.
    ncclGroupStart();
    ncclSend(buf[0], N, ncclFloat, 1, comm[0], st[0]);
    ncclRecv(out[1], N, ncclFloat, 0, comm[1], st[1]);
    EXPECT(ncclGroupEnd() == ncclSuccess, "after the failure: %s", ncclGetLastError(NULL));
    for (int r = 0; r < 3; r++)
        EXPECT(ncclCommDestroy(comm[r]) == ncclSuccess, "destroy %d", r);

    // ncclCommInitRank from one thread per device, blocking sends and
    // receives outside groups: the peers' threads complete them.
    ncclUniqueId id;
    EXPECT(ncclGetUniqueId(&id) == ncclSuccess, "unique id");
    float got[3][64];
    ncclResult_t res[3];
    std::thread th[3];
    for (int r = 0; r < 3; r++)
        th[r] = std::thread([&, r]() {
            cudaSetDevice(r);
            ncclComm_t c;
            res[r] = ncclCommInitRank(&c, 3, id, r);
            if (res[r] != ncclSuccess)
                return;
            float hb[64];
            for (int i = 0; i < N; i++)
                hb[i] = (float)(1000 * r + i);
            cudaMemcpy(buf[r], hb, sizeof hb, cudaMemcpyHostToDevice);
            // rank r sends right, receives from the left; rank 0 starts with
            // the send, the others with the receive (no deadlock).
            if (r == 0) {
                res[r] = ncclSend(buf[r], N, ncclFloat, 1, c, st[r]);
                if (res[r] == ncclSuccess)
                    res[r] = ncclRecv(out[r], N, ncclFloat, 2, c, st[r]);
            } else {
                res[r] = ncclRecv(out[r], N, ncclFloat, r - 1, c, st[r]);
                if (res[r] == ncclSuccess)
                    res[r] = ncclSend(buf[r], N, ncclFloat, (r + 1) % 3, c, st[r]);
            }
            cudaMemcpy(got[r], out[r], sizeof got[r], cudaMemcpyDeviceToHost);
            ncclCommDestroy(c);
        });
    for (int r = 0; r < 3; r++)
        th[r].join();
    for (int r = 0; r < 3; r++) {
        EXPECT(res[r] == ncclSuccess, "threaded rank %d: %s", r, ncclGetErrorString(res[r]));
        const int left = (r + 2) % 3;
        EXPECT(got[r][0] == (float)(1000 * left) && got[r][N - 1] == (float)(1000 * left + N - 1),
               "threaded rank %d got %g..%g", r, got[r][0], got[r][N - 1]);
    }
    // Two ranks of one id on one device.
    ncclGetUniqueId(&id);
    ncclComm_t a, b;
    cudaSetDevice(0);
    EXPECT(ncclCommInitRank(&a, 2, id, 0) == ncclSuccess, "rank 0");
    EXPECT(ncclCommInitRank(&b, 2, id, 1) == ncclInvalidUsage, "rank 1 on the same device");
    ncclCommDestroy(a);
    for (int r = 0; r < 3; r++) {
        cudaSetDevice(r);
        cudaFree(buf[r]);
        cudaFree(out[r]);
        cudaStreamDestroy(st[r]);
    }
}

int main(int argc, char **argv) {
    if (argc == 2)
        return child(atoi(argv[1]));
    int n = 0;
    EXPECT(cudaGetDeviceCount(&n) == cudaSuccess && n == 3, "3 devices (VELA_EMU_DEVICES=3): %d",
           n);
    if (n != 3)
        return 1;
    // The current device is per host thread, 0 in a new thread.
    EXPECT(cudaSetDevice(3) == cudaErrorInvalidDevice, "device 3 of 3 does not exist");
    (void)cudaGetLastError();
    cudaSetDevice(2);
    int other = -1, mine = -1;
    std::thread([&]() { cudaGetDevice(&other); }).join();
    cudaGetDevice(&mine);
    EXPECT(mine == 2 && other == 0, "current device: this thread %d, a new thread %d", mine, other);
    // Properties and memory per device.
    cudaDeviceProp p1, p2;
    EXPECT(cudaGetDeviceProperties(&p1, 1) == cudaSuccess && p1.pciBusID == 1, "props of 1");
    EXPECT(cudaGetDeviceProperties(&p2, 2) == cudaSuccess && p2.pciBusID == 2, "props of 2");
    size_t f0a, f1a, f0b, f1b, tot;
    cudaSetDevice(0);
    cudaMemGetInfo(&f0a, &tot);
    cudaSetDevice(1);
    cudaMemGetInfo(&f1a, &tot);
    void *big;
    cudaMalloc(&big, (size_t)16 << 20);
    cudaMemGetInfo(&f1b, &tot);
    cudaSetDevice(0);
    cudaMemGetInfo(&f0b, &tot);
    EXPECT(f1a - f1b == (size_t)16 << 20 && f0a == f0b, "16 MiB on device 1: free %zu -> %zu, "
           "device 0 %zu -> %zu", f1a, f1b, f0a, f0b);
    cudaPointerAttributes at;
    cudaPointerGetAttributes(&at, (char *)big + 100);
    EXPECT(at.type == cudaMemoryTypeDevice && at.device == 1, "pointer attributes: device %d",
           at.device);
    cudaFree(big);
    // Correct multi-device use raises nothing: a kernel per device on its
    // own stream, a peer copy, waiting on another device's event.
    float *d0 = dev_alloc(0, 256), *d1 = dev_alloc(1, 256), h[256];
    cudaStream_t s1;
    cudaEvent_t e1;
    cudaSetDevice(1);
    cudaStreamCreate(&s1);
    cudaEventCreate(&e1);
    fill_kernel<<<1, 256, 0, s1>>>(d1, 3.0f, 256);
    EXPECT(cudaEventRecord(e1, s1) == cudaSuccess, "event on its own device");
    cudaSetDevice(0);
    EXPECT(cudaStreamWaitEvent(0, e1, 0) == cudaSuccess, "waiting on another device's event");
    EXPECT(cudaMemcpyPeerAsync(d0, 0, d1, 1, sizeof(float) * 256, 0) == cudaSuccess, "peer copy");
    EXPECT(cudaMemcpyPeerAsync(d0, 1, d1, 1, sizeof(float) * 256, 0) != cudaSuccess,
           "peer copy with the wrong device is refused");
    (void)cudaGetLastError();
    cudaMemcpy(h, d0, sizeof h, cudaMemcpyDeviceToHost);
    EXPECT(h[0] == 3.0f && h[255] == 258.0f, "peer copy: %g %g", h[0], h[255]);
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "no fault so far");

    nccl_tests();
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "no fault after the NCCL tests");

    // Each bug in its own process.
    for (int k = 0; k < 10; k++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s %d", argv[0], k);
        const int rc = system(cmd);
        EXPECT(rc == 0, "bug %d was not reported", k);
    }
    printf("%s\n", g_fail ? "selftest_multi FAILED" : "selftest_multi passed");
    return g_fail != 0;
}
