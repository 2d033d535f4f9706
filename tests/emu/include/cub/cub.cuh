// vela CUDA emulator (tests/emu): the cub calls cuda/sample.cu makes, as a
// host shim: BlockScan (InclusiveSum / ExclusiveSum, serial over the block
// in shared memory), DoubleBuffer and DeviceRadixSort::SortKeys (std::sort
// of the keys' bit range, stable). Summation order differs from cub's tree.
#ifndef VELA_EMU_CUB_CUH
#define VELA_EMU_CUB_CUH
#include <algorithm>
#include <vector>

namespace cub {

template <typename T, int BLOCK_THREADS> class BlockScan {
  public:
    struct TempStorage {
        T buf[BLOCK_THREADS];
        T total;
    };
    explicit BlockScan(TempStorage &ts) : ts_(ts) {}
    void InclusiveSum(T x, T &incl, T &total) {
        scan(x, true);
        incl = out_;
        total = tot_;
    }
    void InclusiveSum(T x, T &incl) {
        scan(x, true);
        incl = out_;
    }
    void ExclusiveSum(T x, T &excl, T &total) {
        scan(x, false);
        excl = out_;
        total = tot_;
    }
    void ExclusiveSum(T x, T &excl) {
        scan(x, false);
        excl = out_;
    }

  private:
    TempStorage &ts_;
    T out_, tot_;
    void scan(T x, bool inclusive) {
        const int tid = (int)(threadIdx.x + threadIdx.y * blockDim.x +
                              threadIdx.z * blockDim.x * blockDim.y);
        if ((int)(blockDim.x * blockDim.y * blockDim.z) != BLOCK_THREADS)
            emu_trap("cub::BlockScan: block size differs from BLOCK_THREADS");
        ts_.buf[tid] = x;
        __syncthreads();
        if (tid == 0) {
            T run = T();
            for (int i = 0; i < BLOCK_THREADS; i++) {
                const T before = run;
                run = run + ts_.buf[i];
                ts_.buf[i] = inclusive ? run : before;
            }
            ts_.total = run;
        }
        __syncthreads();
        out_ = ts_.buf[tid];
        tot_ = ts_.total;
        __syncthreads(); // as cub: the storage may be reused after a barrier
    }
};

template <typename T> struct DoubleBuffer {
    T *d_buffers[2];
    int selector;
    DoubleBuffer() : d_buffers{nullptr, nullptr}, selector(0) {}
    DoubleBuffer(T *cur, T *alt) : d_buffers{cur, alt}, selector(0) {}
    T *Current() { return d_buffers[selector]; }
    T *Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
    template <typename K>
    static cudaError_t SortKeys(void *temp, size_t &temp_bytes, DoubleBuffer<K> &db, int n,
                                int begin_bit = 0, int end_bit = (int)sizeof(K) * 8,
                                cudaStream_t stream = 0) {
        if (!temp) {
            temp_bytes = 256;
            return cudaSuccess;
        }
        (void)stream; // the emulator runs everything at once, in order
        K *cur = db.Current(), *alt = db.Alternate();
        const int bits = end_bit - begin_bit;
        const K mask = bits >= (int)sizeof(K) * 8 ? ~(K)0 : (((K)1 << bits) - 1);
        // The sort runs here, on the host side: initcheck sees its reads and
        // writes through the runtime.
        emu_check_written(cur, (size_t)n * sizeof(K), "cub::DeviceRadixSort::SortKeys");
        std::vector<K> v(cur, cur + n);
        std::stable_sort(v.begin(), v.end(), [&](K a, K b) {
            return ((a >> begin_bit) & mask) < ((b >> begin_bit) & mask);
        });
        std::copy(v.begin(), v.end(), alt);
        emu_mark_written(alt, (size_t)n * sizeof(K));
        db.selector ^= 1;
        return cudaSuccess;
    }
};

} // namespace cub
#endif
