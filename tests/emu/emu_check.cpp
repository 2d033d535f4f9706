// vela CUDA emulator (tests/emu): what compute-sanitizer checks, on the CPU.
//
// The converted kernels (cuda/*.cu through cu2cpp.py, selftest*.cu) are
// compiled with GCC's ThreadSanitizer instrumentation (-fsanitize=thread)
// but not linked against libtsan: every load and store the compiler emits
// calls one of the __tsan_* functions defined here, with its address, size
// and (through the return address) its source line. The kernels' source is
// unchanged and nothing in cuda/ knows about it. While a kernel runs
// (emu_chk_launch_begin .. emu_chk_launch_end, on the launching OS thread),
// an access is classified by address:
//   - static or dynamic shared memory: racecheck. Per byte, the last writer
//     and up to two readers (thread, barrier interval, call site) since the
//     block began; an access by another thread not ordered after them is a
//     RAW / WAR / WAW hazard. __syncthreads orders the whole block;
//     __syncwarp and the warp intrinsics (shuffles, ballot, match, the wmma
//     collectives) order only the lanes they name. Atomics are not hazards.
//   - a fiber stack (local memory, the kernel's parameters): nothing.
//   - a device allocation or its red zones: memcheck (out of bounds of that
//     allocation, misaligned naturally-aligned accesses such as a float4 at
//     an address not a multiple of 16), initcheck (a read of bytes that no
//     copy, memset or kernel has written since cudaMalloc) and, for plain
//     (non-atomic) writes, two different blocks of one launch writing the
//     same byte.
//   - anything else (host statics and __constant__ tables, the heap): nothing.
// The first finding of a launch is a kernel fault (emu_kernel_fault): sticky,
// with kernel, block, threads, address and the cuda/ source lines.
//
// Shadow memory: per device allocation one uint32 per byte: 0 never written,
// 1 written by the host side (copy, memset, GEMM, NCCL) or an earlier
// launch, >= 2 the tag of the block of the current launch that wrote it
// (tags are handed out per launch in increasing order, so a tag below the
// launch's base is "earlier"). Per shared byte a sh_ent (below).
//
// Everything here runs under the runtime's g_mu (kernels run under it; the
// runtime takes it around the host-side calls), so there are no locks.
#include <dlfcn.h>
#include <elf.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_emu.h"
#include "emu_internal.h"

// --- device allocations --------------------------------------------------------------

struct chk_alloc {
    uintptr_t base;
    size_t bytes;
    uint32_t *shadow; // [bytes], 0 = never written
};
static std::map<uintptr_t, chk_alloc *> g_allocs; // base -> allocation

static uint32_t *shadow_new(size_t bytes) {
    // mmap: zero pages on demand, so a large allocation nobody touches costs
    // nothing.
    void *p = mmap(NULL, (bytes ? bytes : 1) * sizeof(uint32_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        perror("vela-emu: mmap of an allocation's shadow");
        abort();
    }
    return (uint32_t *)p;
}

void emu_chk_alloc(void *base, size_t bytes) {
    chk_alloc *a = new chk_alloc{(uintptr_t)base, bytes, shadow_new(bytes)};
    g_allocs[a->base] = a;
}

static chk_alloc *g_cache[4]; // the allocations the running kernel touched last
static unsigned g_cache_next;

void emu_chk_free(void *base) {
    auto it = g_allocs.find((uintptr_t)base);
    if (it == g_allocs.end())
        return;
    for (auto &c : g_cache)
        if (c == it->second)
            c = nullptr;
    munmap(it->second->shadow, (it->second->bytes ? it->second->bytes : 1) * sizeof(uint32_t));
    delete it->second;
    g_allocs.erase(it);
}

// The allocation whose bytes or red zones contain p, or NULL.
static chk_alloc *find_padded(uintptr_t p) {
    for (chk_alloc *c : g_cache)
        if (c && p - (c->base - EMU_ALLOC_RZ) < c->bytes + 2 * EMU_ALLOC_RZ)
            return c;
    auto it = g_allocs.upper_bound(p + EMU_ALLOC_RZ);
    if (it == g_allocs.begin())
        return nullptr;
    --it;
    chk_alloc *a = it->second;
    if (p - (a->base - EMU_ALLOC_RZ) >= a->bytes + 2 * EMU_ALLOC_RZ)
        return nullptr;
    g_cache[g_cache_next++ & 3] = a;
    return a;
}

void emu_chk_host_write(const void *dst, size_t n) {
    for (size_t done = 0; done < n;) {
        chk_alloc *a = find_padded((uintptr_t)dst + done);
        if (!a)
            return;
        const size_t off = (uintptr_t)dst + done - a->base;
        if (off >= a->bytes)
            return;
        const size_t k = std::min(n - done, a->bytes - off);
        for (size_t i = 0; i < k; i++)
            a->shadow[off + i] = 1;
        done += k;
    }
}

bool emu_chk_host_read(const void *src, size_t n, char *msg, size_t msg_size) {
    chk_alloc *a = find_padded((uintptr_t)src);
    if (!a || (uintptr_t)src < a->base || emu_sample_blocks())
        return true;
    const size_t off = (uintptr_t)src - a->base;
    for (size_t i = 0; i < n && off + i < a->bytes; i++)
        if (!a->shadow[off + i]) {
            snprintf(msg, msg_size,
                     "initcheck: %zu bytes read from %p (allocation %p of %zu "
                     "bytes + %zu): byte +%zu was never written since cudaMalloc",
                     n, src, (void *)a->base, a->bytes, off, off + i);
            return false;
        }
    return true;
}

// --- symbolisation ----------------------------------------------------------------------

// "cuda/norm.cu:57" for a return address inside instrumented code: the
// innermost inlined frame that is not the emulator's own header.
static std::string site_name(const void *ra) {
    char fallback[64];
    snprintf(fallback, sizeof fallback, "%p", ra);
    Dl_info di;
    if (!ra || !dladdr(ra, &di) || !di.dli_fbase)
        return fallback;
    uintptr_t a = (uintptr_t)ra - 1;
    if (((const Elf64_Ehdr *)di.dli_fbase)->e_type == ET_DYN)
        a -= (uintptr_t)di.dli_fbase;
    char exe[1024] = "";
    if (!di.dli_fname || di.dli_fname[0] != '/') { // the main program, named as started
        const ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[k > 0 ? k : 0] = 0;
    }
    const char *file = exe[0] ? exe : di.dli_fname;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "addr2line -i -e '%s' 0x%lx 2>/dev/null", file, (unsigned long)a);
    FILE *f = popen(cmd, "r");
    if (!f)
        return fallback;
    std::string first, pick;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *d = strstr(line, " (discriminator");
        if (d)
            *d = 0;
        if (line[0] == '?')
            continue;
        if (first.empty())
            first = line;
        if (pick.empty() && !strstr(line, "/tests/emu/cuda_emu") &&
            !strstr(line, "/tests/emu/include/") && strncmp(line, "/usr/", 5) != 0)
            pick = line;
    }
    pclose(f);
    std::string s = !pick.empty() ? pick : !first.empty() ? first : fallback;
    // Some units' line tables name the converted file (gen/X.cu.cpp) instead
    // of the #line name; cu2cpp.py keeps the line numbers, so only the
    // name changes.
    const size_t g = s.find("/gen/");
    const size_t e = s.find(".cu.cpp:");
    if (g != std::string::npos && e != std::string::npos && e > g) {
        const std::string name = s.substr(g + 5, e + 3 - (g + 5));
        s = (name.compare(0, 8, "selftest") == 0 ? "/tests/emu/" : "/cuda/") + name +
            s.substr(e + 7);
    }
    const size_t c = s.rfind("/cuda/");
    const size_t t = s.rfind("/tests/");
    if (c != std::string::npos)
        s = s.substr(c + 1);
    else if (t != std::string::npos)
        s = s.substr(t + 1);
    return s;
}

// --- traffic (VELA_EMU_TRAFFIC=FILE) ------------------------------------------------------
// Global loads and stores grouped into warp instructions, as the hardware's
// load/store units see them: the k-th execution of one instruction (return
// address) by each lane of a warp is one request. Per request: the bytes the
// lanes asked for and the distinct 32-byte sectors they touch; per launch:
// the distinct sectors loaded and stored, and how many of them more than one
// block touched. One JSON object per launch is appended to FILE, labelled
// with emu_traffic_case's JSON if one is set (bench/kernels/emu_report.py
// makes bench/results/kernels-emulated.json of them; tests/emu/
// traffic_report.py folds any such file by kernel and grid).
struct tr_key {
    uintptr_t site;
    uint32_t warp, k;
    bool operator==(const tr_key &o) const {
        return site == o.site && warp == o.warp && k == o.k;
    }
};
struct tr_key_hash {
    size_t operator()(const tr_key &k) const {
        return std::hash<uint64_t>()(k.site * 0x9e3779b97f4a7c15ull ^
                                     ((uint64_t)k.warp << 32 | k.k));
    }
};
struct tr_req {
    uint32_t bytes = 0;
    uint32_t width = 0; // the widest lane access: the instruction's width (LDG.128: 16)
    bool store = false;
    std::vector<uint64_t> sectors;                // distinct
    std::vector<std::pair<uintptr_t, size_t>> at; // distinct addresses (lanes may share one)
};
struct tr_dir { // loads or stores of one launch
    uint64_t requests = 0, bytes = 0, sectors = 0, ideal = 0;
    std::map<uint32_t, uint64_t> widths; // lane width in bytes -> requests
};
static FILE *g_traffic;
static const void *g_kernel_fn;

// "matvec_kernel<(ggml_type)12, 4>" for a kernel's address: the template
// arguments of the instance (the launch names only the source's T, NT).
static std::string instance_name(const void *fn) {
    static std::map<const void *, std::string> cache;
    auto it = cache.find(fn);
    if (it != cache.end())
        return it->second;
    std::string name;
    Dl_info di;
    if (fn && dladdr(fn, &di) && di.dli_fbase) {
        uintptr_t a = (uintptr_t)fn;
        if (((const Elf64_Ehdr *)di.dli_fbase)->e_type == ET_DYN)
            a -= (uintptr_t)di.dli_fbase;
        char exe[1024] = "", cmd[1200], line[2048];
        const ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[k > 0 ? k : 0] = 0;
        snprintf(cmd, sizeof cmd, "addr2line -f -C -e '%s' 0x%lx 2>/dev/null", exe,
                 (unsigned long)a);
        FILE *f = popen(cmd, "r");
        if (f && fgets(line, sizeof line, f)) {
            int depth = 0;
            for (const char *c = line; *c && *c != '\n'; c++) {
                if (*c == '(' && depth == 0)
                    break; // the parameter list
                depth += *c == '<' ? 1 : *c == '>' ? -1 : 0;
                name += *c;
            }
        }
        if (f)
            pclose(f);
    }
    if (name.empty() || name[0] == '?')
        name = "";
    cache[fn] = name;
    return name;
}

// s as the inside of a JSON string.
static std::string json_text(const char *s) {
    std::string o;
    for (const char *c = s; *c; c++) {
        if (*c == '"' || *c == '\\')
            o += '\\';
        o += (unsigned char)*c >= 0x20 ? *c : ' ';
    }
    return o;
}
static std::unordered_map<uint64_t, uint32_t> g_tr_count; // (site, thread) -> executions
static std::unordered_map<tr_key, tr_req, tr_key_hash> g_tr_req;
static std::unordered_set<uint64_t> g_tr_distinct; // sectors of this launch
// [store]: the sectors this launch loaded / stored -> the block that touched
// them first, or TR_SHARED once a second block did (a sampled launch scales
// only the others: README.md, Traffic).
static std::unordered_map<uint64_t, uint64_t> g_tr_dist_dir[2];
static const uint64_t TR_SHARED = ~0ull;
static uint64_t g_tr_block;   // linear index of the running block
static std::string g_tr_case; // emu_traffic_case's label
static uint64_t g_tr_blocks_run, g_tr_blocks_total;
static tr_dir g_tr_ld, g_tr_st;
static uintptr_t g_tr_sh_lo, g_tr_sh_hi; // static shared bytes this launch touched

static void traffic_access(uintptr_t p, size_t n, bool store, const void *ra) {
    const unsigned t = (unsigned)emu_cur_thread();
    const uint32_t k = g_tr_count[(uint64_t)(uintptr_t)ra << 10 | t]++;
    tr_req &r = g_tr_req[tr_key{(uintptr_t)ra, t >> 5, k}];
    r.bytes += (uint32_t)n;
    r.width = std::max(r.width, (uint32_t)n);
    r.store = store;
    if (std::find(r.at.begin(), r.at.end(), std::make_pair(p, n)) == r.at.end())
        r.at.emplace_back(p, n);
    for (uint64_t s = p >> 5; s <= (p + n - 1) >> 5; s++) {
        if (std::find(r.sectors.begin(), r.sectors.end(), s) == r.sectors.end())
            r.sectors.push_back(s);
        g_tr_distinct.insert(s);
        auto ins = g_tr_dist_dir[store].emplace(s, g_tr_block);
        if (!ins.second && ins.first->second != g_tr_block)
            ins.first->second = TR_SHARED;
    }
}

extern "C" void emu_traffic_case(const char *json) {
    g_tr_case = json ? json : "";
}

uint64_t emu_sample_blocks(void) {
    static const uint64_t n = [] {
        const char *e = getenv("VELA_EMU_SAMPLE_BLOCKS");
        const uint64_t v = e && *e ? strtoull(e, NULL, 10) : 0;
        if (v == 1)
            fprintf(stderr, "vela-emu: VELA_EMU_SAMPLE_BLOCKS=1: need at least 2 (first and "
                            "last block); running every block\n");
        if (v >= 2)
            fprintf(stderr,
                    "vela-emu: at most %llu blocks per launch (VELA_EMU_SAMPLE_BLOCKS): "
                    "initcheck is off, results are incomplete\n",
                    (unsigned long long)v);
        return v >= 2 ? v : 0;
    }();
    return n;
}

void emu_chk_launch_blocks(uint64_t run, uint64_t total) {
    g_tr_blocks_run = run;
    g_tr_blocks_total = total;
}

static void traffic_block_end(void) {
    for (auto &kv : g_tr_req) {
        tr_dir &d = kv.second.store ? g_tr_st : g_tr_ld;
        d.requests++;
        d.widths[kv.second.width]++;
        d.bytes += kv.second.bytes;
        d.sectors += kv.second.sectors.size();
        size_t distinct = 0; // what a perfectly coalesced access needs: each byte once
        for (auto &a : kv.second.at)
            distinct += a.second;
        d.ideal += (distinct + 31) / 32;
    }
    g_tr_req.clear();
    g_tr_count.clear();
}

// --- kernel state ------------------------------------------------------------------------

// On while this OS thread runs a kernel's threads; the __tsan_* hooks are
// also called from host code in the converted files (launchers), off then.
static __thread bool t_on;
static const char *g_kernel;
static uintptr_t g_stacks_lo, g_stacks_len;
static uintptr_t g_sh_lo, g_sh_len;   // static shared memory (emu_static_smem)
static uintptr_t g_dyn_lo, g_dyn_len; // dynamic shared memory of this launch
static size_t g_dyn_rz;               // its red zone
static dim3 g_grid, g_block;          // gridDim, blockDim
static uint32_t g_launch_base;        // first block tag of this launch
static uint32_t g_next_tag = 2;
static uint32_t g_tag; // tag of the running block (0: not tracked)
static bool g_random;  // VELA_EMU_SCHEDULE=random:SEED

// Racecheck: one entry per shared byte. gen: the block it belongs to (older
// entries are empty); seq: the barrier interval of the access (g_seq then).
struct sh_ent {
    uint32_t gen, wseq, rseq, r2seq;
    uint16_t wtid, rtid, r2tid, pad;
    const void *wsite, *rsite, *r2site;
};
static sh_ent *g_sh_shadow; // [g_sh_len + EMU_SMEM_OPTIN + red zone]
static size_t g_sh_shadow_n;
static uint32_t g_gen;
static uint32_t g_seq;           // barriers released in this block + 1
static uint32_t g_last_block;    // g_seq when the last __syncthreads released
static uint32_t g_warp_full[32]; // g_seq when the last barrier naming every lane released
struct warp_pairs {
    uint32_t gen;
    uint32_t seq[32][32]; // [lane][lane]: last partial barrier naming both
};
static warp_pairs g_pairs[32];

void emu_chk_launch_begin(const char *kernel, const void *fn, dim3 grid, dim3 block,
                          const void *stacks, size_t stacks_bytes, const void *sh, size_t sh_bytes,
                          const void *dyn, size_t dyn_bytes, size_t dyn_redzone, bool random) {
    g_kernel = kernel;
    g_kernel_fn = fn;
    const uint64_t n_blocks = (uint64_t)grid.x * grid.y * grid.z;
    g_grid = grid;
    g_stacks_lo = (uintptr_t)stacks;
    g_stacks_len = stacks_bytes;
    g_sh_lo = (uintptr_t)sh;
    g_sh_len = sh ? sh_bytes : 0;
    g_dyn_lo = (uintptr_t)dyn;
    g_dyn_len = dyn ? dyn_bytes : 0;
    g_dyn_rz = dyn ? dyn_redzone : 0;
    g_block = block;
    g_random = random;
    const size_t need = g_sh_len + EMU_SMEM_OPTIN + dyn_redzone;
    if (!g_sh_shadow || g_sh_shadow_n < need) {
        if (g_sh_shadow)
            munmap(g_sh_shadow, g_sh_shadow_n * sizeof(sh_ent));
        g_sh_shadow = (sh_ent *)mmap(NULL, need * sizeof(sh_ent), PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g_sh_shadow == MAP_FAILED) {
            perror("vela-emu: mmap of the shared-memory shadow");
            abort();
        }
        g_sh_shadow_n = need;
    }
    // Block tags of this launch: g_launch_base + linear block index. Near
    // the end of the 32-bit range, every tag becomes "written earlier" (1).
    if (n_blocks > 0x40000000u) {
        g_launch_base = 0; // too many blocks to tag: no cross-block check
    } else {
        if (g_next_tag + n_blocks > 0xf0000000u) {
            for (auto &kv : g_allocs)
                for (size_t i = 0; i < kv.second->bytes; i++)
                    if (kv.second->shadow[i] > 1)
                        kv.second->shadow[i] = 1;
            g_next_tag = 2;
        }
        g_launch_base = g_next_tag;
        g_next_tag += (uint32_t)n_blocks;
    }
    for (auto &c : g_cache)
        c = nullptr;
    static const char *traffic = getenv("VELA_EMU_TRAFFIC");
    if (traffic && *traffic && !g_traffic && !(g_traffic = fopen(traffic, "a")))
        perror(traffic);
    g_tr_ld = g_tr_st = tr_dir();
    g_tr_distinct.clear();
    g_tr_dist_dir[0].clear();
    g_tr_dist_dir[1].clear();
    g_tr_blocks_run = g_tr_blocks_total = (uint64_t)grid.x * grid.y * grid.z;
    g_tr_sh_lo = UINTPTR_MAX;
    g_tr_sh_hi = 0;
    t_on = true;
}

void emu_chk_launch_end(void) {
    t_on = false;
    if (!g_traffic)
        return;
    traffic_block_end();
    const std::string name = json_text(g_kernel),
                      inst = json_text(instance_name(g_kernel_fn).c_str());
    fprintf(g_traffic,
            "{\"kernel\": \"%s\", \"instance\": \"%s\", \"grid\": [%u, %u, %u], "
            "\"block\": [%u, %u, %u], "
            "\"smem_dynamic\": %zu, \"smem_static\": %zu, \"distinct_sectors\": %zu",
            name.c_str(), inst.c_str(), g_grid.x, g_grid.y, g_grid.z, g_block.x, g_block.y,
            g_block.z, (size_t)g_dyn_len,
            g_tr_sh_hi > g_tr_sh_lo ? (size_t)(g_tr_sh_hi - g_tr_sh_lo) : 0, g_tr_distinct.size());
    size_t shared[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        for (auto &kv : g_tr_dist_dir[i])
            shared[i] += kv.second == TR_SHARED;
    fprintf(g_traffic,
            ", \"distinct_load_sectors\": %zu, \"distinct_store_sectors\": %zu, "
            "\"shared_load_sectors\": %zu, \"shared_store_sectors\": %zu, "
            "\"blocks_run\": %llu, \"blocks_total\": %llu",
            g_tr_dist_dir[0].size(), g_tr_dist_dir[1].size(), shared[0], shared[1],
            (unsigned long long)g_tr_blocks_run, (unsigned long long)g_tr_blocks_total);
    if (!g_tr_case.empty())
        fprintf(g_traffic, ", \"case\": %s", g_tr_case.c_str());
    const tr_dir *d[2] = {&g_tr_ld, &g_tr_st};
    for (int i = 0; i < 2; i++)
        fprintf(g_traffic,
                ", \"%s\": {\"requests\": %llu, \"bytes\": %llu, \"sectors\": %llu, "
                "\"ideal_sectors\": %llu}",
                i ? "stores" : "loads", (unsigned long long)d[i]->requests,
                (unsigned long long)d[i]->bytes, (unsigned long long)d[i]->sectors,
                (unsigned long long)d[i]->ideal);
    // Load requests by lane width: which of a kernel's alternative load
    // paths ran (bench/kernels/perf_model.py picks its SASS path by them).
    fprintf(g_traffic, ", \"load_widths\": {");
    const char *sep = "";
    for (auto &w : g_tr_ld.widths) {
        fprintf(g_traffic, "%s\"%u\": %llu", sep, w.first, (unsigned long long)w.second);
        sep = ", ";
    }
    fprintf(g_traffic, "}}\n");
    fflush(g_traffic);
    g_tr_distinct.clear();
    g_tr_dist_dir[0].clear();
    g_tr_dist_dir[1].clear();
}

void emu_chk_block_begin(uint64_t linear_block) {
    if (g_traffic)
        traffic_block_end(); // the previous block's requests
    g_tag = g_launch_base ? g_launch_base + (uint32_t)linear_block : 0;
    g_tr_block = linear_block;
    g_gen++;
    if (g_gen == 0) { // wrapped: forget every entry
        memset(g_sh_shadow, 0, g_sh_shadow_n * sizeof(sh_ent));
        for (auto &w : g_pairs)
            w.gen = 0;
        g_gen = 1;
    }
    g_seq = 1;
    g_last_block = 0;
    memset(g_warp_full, 0, sizeof g_warp_full);
}

void emu_chk_block_barrier(void) {
    g_last_block = ++g_seq;
}

void emu_chk_warp_barrier(int warp, unsigned mask, unsigned present) {
    const uint32_t s = ++g_seq;
    if ((mask & present) == present) {
        g_warp_full[warp] = s;
        return;
    }
    warp_pairs &p = g_pairs[warp];
    if (p.gen != g_gen) {
        memset(p.seq, 0, sizeof p.seq);
        p.gen = g_gen;
    }
    for (unsigned m = mask; m; m &= m - 1) {
        const int a = __builtin_ctz(m);
        for (unsigned m2 = mask; m2; m2 &= m2 - 1)
            p.seq[a][__builtin_ctz(m2)] = s;
    }
}

// Is thread a's access in interval sa ordered before the current access of
// thread b (program order, a __syncthreads, or a warp barrier naming both)?
static inline bool ordered(unsigned a, uint32_t sa, unsigned b) {
    if (a == b || sa < g_last_block)
        return true;
    if ((a >> 5) != (b >> 5))
        return false;
    const unsigned w = a >> 5;
    if (g_warp_full[w] > sa)
        return true;
    return g_pairs[w].gen == g_gen && g_pairs[w].seq[a & 31][b & 31] > sa;
}

// --- reports --------------------------------------------------------------------------------

static std::string thread_name(unsigned t) {
    char b[48];
    snprintf(b, sizeof b, "(%u,%u,%u)", t % g_block.x, t / g_block.x % g_block.y,
             t / (g_block.x * g_block.y));
    return b;
}

static void report(const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t_on = false; // one finding per launch; the launch stops at the next barrier
    emu_kernel_fault(msg);
}

static std::string shared_name(uintptr_t p) {
    char b[96];
    if (p - g_sh_lo < g_sh_len)
        snprintf(b, sizeof b, "static shared memory + %zu", (size_t)(p - g_sh_lo));
    else
        snprintf(b, sizeof b, "dynamic shared memory + %zu", (size_t)(p - g_dyn_lo));
    return b;
}

static void race(const char *kind, uintptr_t p, unsigned t1, const char *what1, const void *s1,
                 unsigned t2, const char *what2, const void *s2) {
    report("racecheck: %s hazard on %s: %s by thread %s at %s, %s by thread %s at %s with no "
           "barrier between them that orders both threads",
           kind, shared_name(p).c_str(), what1, thread_name(t1).c_str(), site_name(s1).c_str(),
           what2, thread_name(t2).c_str(), site_name(s2).c_str());
}

// --- the accesses -----------------------------------------------------------------------------

enum { A_READ = 1, A_WRITE = 2, A_ALIGNED = 4, A_ATOMIC = 8 };

static void shared_access(uintptr_t p, size_t n, int kind, const void *ra) {
    size_t idx;
    if (p - g_sh_lo < g_sh_len) {
        if (p + n > g_sh_lo + g_sh_len)
            n = g_sh_lo + g_sh_len - p;
        idx = p - g_sh_lo;
    } else {
        const size_t off = p - g_dyn_lo;
        if (off + n > g_dyn_len) {
            report("memcheck: out-of-bounds %zu-byte %s of dynamic shared memory at +%zu (%zu "
                   "bytes) by thread %s at %s",
                   n, kind & A_WRITE ? "write" : "read", off, (size_t)g_dyn_len,
                   thread_name((unsigned)emu_cur_thread()).c_str(), site_name(ra).c_str());
            return;
        }
        idx = g_sh_len + off;
    }
    if (kind & A_ATOMIC)
        return;
    const unsigned t = (unsigned)emu_cur_thread();
    const uint32_t s = g_seq;
    for (size_t i = 0; i < n; i++) {
        sh_ent &e = g_sh_shadow[idx + i];
        if (e.gen != g_gen) {
            memset(&e, 0, sizeof e);
            e.gen = g_gen;
        }
        if (e.wseq && !ordered(e.wtid, e.wseq, t)) {
            race(kind & A_WRITE ? "WAW" : "RAW", p + i, e.wtid, "write", e.wsite, t,
                 kind & A_WRITE ? "write" : "read", ra);
            return;
        }
        if (kind & A_WRITE) {
            if (e.rseq && !ordered(e.rtid, e.rseq, t)) {
                race("WAR", p + i, e.rtid, "read", e.rsite, t, "write", ra);
                return;
            }
            if (e.r2seq && !ordered(e.r2tid, e.r2seq, t)) {
                race("WAR", p + i, e.r2tid, "read", e.r2site, t, "write", ra);
                return;
            }
            e.wtid = (uint16_t)t;
            e.wseq = s;
            e.wsite = ra;
            e.rseq = e.r2seq = 0;
        } else if (!e.rseq || e.rtid == t || ordered(e.rtid, e.rseq, t)) {
            e.rtid = (uint16_t)t;
            e.rseq = s;
            e.rsite = ra;
        } else if (!e.r2seq || e.r2tid == t || ordered(e.r2tid, e.r2seq, t) ||
                   ((e.r2tid >> 5) == (e.rtid >> 5) && (t >> 5) != (e.rtid >> 5))) {
            // Two unordered readers kept: prefer one of another warp than
            // the first, which only a __syncthreads orders.
            e.r2tid = (uint16_t)t;
            e.r2seq = s;
            e.r2site = ra;
        }
    }
}

static void global_access(chk_alloc *a, uintptr_t p, size_t n, int kind, const void *ra) {
    const char *what = kind & A_ATOMIC ? "atomic" : kind & A_WRITE ? "write" : "read";
    if (p < a->base || p + n > a->base + a->bytes) {
        char where[96];
        if (p < a->base)
            snprintf(where, sizeof where, "%zu bytes before", (size_t)(a->base - p));
        else
            snprintf(where, sizeof where, "%zu bytes after the end of",
                     (size_t)(p + n - (a->base + a->bytes)));
        report("memcheck: out-of-bounds %zu-byte global %s at %p, %s allocation %p (%zu bytes), "
               "by thread %s at %s",
               n, what, (void *)p, where, (void *)a->base, a->bytes,
               thread_name((unsigned)emu_cur_thread()).c_str(), site_name(ra).c_str());
        return;
    }
    const size_t off = p - a->base;
    uint32_t *sh = a->shadow + off;
    // Sampled launches (VELA_EMU_SAMPLE_BLOCKS) leave outputs of skipped
    // blocks unwritten: no initcheck then.
    if ((kind & (A_READ | A_ATOMIC)) && !emu_sample_blocks()) {
        for (size_t i = 0; i < n; i++)
            if (!sh[i]) {
                report("initcheck: %zu-byte global %s at %p (allocation %p of %zu bytes + %zu): "
                       "byte +%zu was never written since cudaMalloc, by thread %s at %s",
                       n, what, (void *)p, (void *)a->base, a->bytes, off, off + i,
                       thread_name((unsigned)emu_cur_thread()).c_str(), site_name(ra).c_str());
                return;
            }
    }
    if (kind & A_ATOMIC)
        return;
    if (kind & A_WRITE) {
        for (size_t i = 0; i < n; i++) {
            const uint32_t v = sh[i];
            if (g_tag && v >= g_launch_base && v != g_tag) {
                const uint64_t other = v - g_launch_base;
                report("racecheck: global write race at %p (allocation %p of %zu bytes + %zu): "
                       "written by block %llu and by this block (thread %s at %s) in one "
                       "launch, not atomically",
                       (void *)(p + i), (void *)a->base, a->bytes, off + i,
                       (unsigned long long)other, thread_name((unsigned)emu_cur_thread()).c_str(),
                       site_name(ra).c_str());
                return;
            }
            sh[i] = g_tag ? g_tag : 1;
        }
    }
}

static inline void chk_access(const void *ptr, size_t n, int kind, const void *ra) {
    const uintptr_t p = (uintptr_t)ptr;
    if (p - g_stacks_lo < g_stacks_len)
        return; // local memory
    const bool shared = p - g_sh_lo < g_sh_len || p - g_dyn_lo < g_dyn_len + g_dyn_rz;
    chk_alloc *a = shared ? nullptr : find_padded(p);
    if (!shared && !a)
        return;
    if ((kind & A_ALIGNED) && (p & (n - 1)) != 0) {
        report("memcheck: misaligned %zu-byte %s %s at %p (a hardware fault: the address must be "
               "a multiple of %zu) by thread %s at %s",
               n, shared ? "shared" : "global", kind & A_WRITE ? "write" : "read", ptr, n,
               thread_name((unsigned)emu_cur_thread()).c_str(), site_name(ra).c_str());
        return;
    }
    if (shared)
        shared_access(p, n, kind, ra);
    else
        global_access(a, p, n, kind, ra);
    if (g_traffic && t_on) {
        if (!shared && !(kind & A_ATOMIC))
            traffic_access(p, n, kind & A_WRITE, ra);
        else if (shared && p - g_sh_lo < g_sh_len) {
            g_tr_sh_lo = std::min(g_tr_sh_lo, p);
            g_tr_sh_hi = std::max(g_tr_sh_hi, (uintptr_t)(p + n));
        }
    }
    if (g_random && t_on && (emu_rand() & 7) == 0)
        emu_yield(); // another thread may run between any two accesses
}

void emu_chk_access(const void *p, size_t n, int write, int atomic, const void *ra) {
    if (t_on && n)
        chk_access(p, n, atomic ? A_ATOMIC : write ? A_WRITE : A_READ, ra);
}

void emu_chk_cp_async_window(const void *src, size_t window, size_t zfill, const void *ra) {
    const uintptr_t p = (uintptr_t)src;
    chk_alloc *a = t_on && zfill ? find_padded(p) : nullptr;
    // A window starting before the allocation: the src-size bytes are
    // checked as a read when the copy lands.
    if (!a || p < a->base || p + window <= a->base + a->bytes)
        return;
    report("memcheck: cp.async zero-fill copy of %zu bytes (%zu zero-filled) at %p: its %zu-byte "
           "source window ends %zu bytes after the end of allocation %p (%zu bytes), by thread %s "
           "at %s. PTX reads only the first %zu bytes, but compute-sanitizer memcheck reports the "
           "window as an out-of-bounds read: copy a partial last chunk another way",
           window, zfill, src, window, (size_t)(p + window - (a->base + a->bytes)), (void *)a->base,
           a->bytes, thread_name((unsigned)emu_cur_thread()).c_str(), site_name(ra).c_str(),
           window - zfill);
}

// --- the ThreadSanitizer ABI that -fsanitize=thread code calls ------------------------------

#define RA __builtin_return_address(0)
#define EMU_TSAN_HOOK(name, n, kind)                                                               \
    extern "C" void __tsan_##name(void *p) {                                                       \
        if (t_on)                                                                                  \
            chk_access(p, n, kind, RA);                                                            \
    }
// Volatile accesses are plain ones here (no ordering is modelled).
#define EMU_TSAN_RW(n)                                                                             \
    EMU_TSAN_HOOK(read##n, n, A_READ | A_ALIGNED)                                                  \
    EMU_TSAN_HOOK(write##n, n, A_WRITE | A_ALIGNED)                                                \
    EMU_TSAN_HOOK(unaligned_read##n, n, A_READ)                                                    \
    EMU_TSAN_HOOK(unaligned_write##n, n, A_WRITE)                                                  \
    EMU_TSAN_HOOK(volatile_read##n, n, A_READ | A_ALIGNED)                                         \
    EMU_TSAN_HOOK(volatile_write##n, n, A_WRITE | A_ALIGNED)
EMU_TSAN_RW(2)
EMU_TSAN_RW(4)
EMU_TSAN_RW(8)
EMU_TSAN_RW(16)
EMU_TSAN_HOOK(read1, 1, A_READ)
EMU_TSAN_HOOK(write1, 1, A_WRITE)
EMU_TSAN_HOOK(unaligned_read1, 1, A_READ)
EMU_TSAN_HOOK(unaligned_write1, 1, A_WRITE)
extern "C" void __tsan_read_range(void *p, unsigned long n) {
    if (t_on && n)
        chk_access(p, n, A_READ, RA);
}
extern "C" void __tsan_write_range(void *p, unsigned long n) {
    if (t_on && n)
        chk_access(p, n, A_WRITE, RA);
}
extern "C" void __tsan_init(void) {
}
extern "C" void __tsan_func_entry(void *) {
}
extern "C" void __tsan_func_exit(void) {
}
extern "C" void __tsan_vptr_update(void **, void *) {
}
extern "C" void __tsan_vptr_read(void **) {
}
extern "C" void __tsan_acquire(void *) {
}
extern "C" void __tsan_release(void *) {
}

// Atomics in instrumented code (libstdc++'s shared_ptr, std::function):
// the real operation, nothing checked (kernels use atomicAdd & co, which
// cuda_emu.h reports through emu_chk_access).
#define EMU_TSAN_RMW(bits, T, name, builtin)                                                       \
    extern "C" T __tsan_atomic##bits##_##name(volatile T *a, T v, int) {                           \
        return builtin(a, v, __ATOMIC_SEQ_CST);                                                    \
    }
#define EMU_TSAN_ATOMIC(bits, T)                                                                   \
    extern "C" T __tsan_atomic##bits##_load(const volatile T *a, int) {                            \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                               \
    }                                                                                              \
    extern "C" void __tsan_atomic##bits##_store(volatile T *a, T v, int) {                         \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                  \
    }                                                                                              \
    EMU_TSAN_RMW(bits, T, exchange, __atomic_exchange_n)                                           \
    EMU_TSAN_RMW(bits, T, fetch_add, __atomic_fetch_add)                                           \
    EMU_TSAN_RMW(bits, T, fetch_sub, __atomic_fetch_sub)                                           \
    EMU_TSAN_RMW(bits, T, fetch_and, __atomic_fetch_and)                                           \
    EMU_TSAN_RMW(bits, T, fetch_or, __atomic_fetch_or)                                             \
    EMU_TSAN_RMW(bits, T, fetch_xor, __atomic_fetch_xor)                                           \
    EMU_TSAN_RMW(bits, T, fetch_nand, __atomic_fetch_nand)                                         \
    extern "C" int __tsan_atomic##bits##_compare_exchange_strong(volatile T *a, T *c, T v, int,    \
                                                                 int) {                            \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);    \
    }                                                                                              \
    extern "C" int __tsan_atomic##bits##_compare_exchange_weak(volatile T *a, T *c, T v, int m,    \
                                                               int f) {                            \
        return __tsan_atomic##bits##_compare_exchange_strong(a, c, v, m, f);                       \
    }                                                                                              \
    extern "C" T __tsan_atomic##bits##_compare_exchange_val(volatile T *a, T c, T v, int m,        \
                                                            int f) {                               \
        __tsan_atomic##bits##_compare_exchange_strong(a, &c, v, m, f);                             \
        return c;                                                                                  \
    }
EMU_TSAN_ATOMIC(8, uint8_t)
EMU_TSAN_ATOMIC(16, uint16_t)
EMU_TSAN_ATOMIC(32, uint32_t)
EMU_TSAN_ATOMIC(64, uint64_t)
extern "C" void __tsan_atomic_thread_fence(int) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
extern "C" void __tsan_atomic_signal_fence(int) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
