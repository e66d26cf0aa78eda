// Host emulation of kernels/es_spmm.cu, for tests/test_spmm_cuda.py (no GPU needed).
//
// Compiled as plain C++17. It includes the kernel source itself, where the CUDA qualifiers are
// defined away, and runs es_spmm::run_thread -- the code every GPU thread runs -- for every thread
// of every block of a launch. Each GPU thread is a coroutine (ucontext) on its own stack; a
// scheduler runs all threads of a block round-robin, so the row groups of a block interleave as
// they would on a GPU, and a call of the sync functor (the __syncwarp(mask) of the device build)
// parks the thread until every lane of its group has arrived. Single-threaded and deterministic.
//
// Besides the output, it checks what the host can check about the device side:
//   * each sync names a mask of G lanes that contains the calling lane (exit 4);
//   * all lanes of a group reach the same syncs: no lane finishes while others of its group wait
//     at a sync, which on a GPU would hang or be undefined (exit 5);
//   * the groups' shared-memory stages are disjoint and inside the size the Python launcher
//     computed, and nothing is written past it (guard bytes; exit 3);
//   * every 128-bit access (float4 / double2 on the device) is 16-byte aligned (exit 6);
//   * atomicAdd (a plain add here: one lane runs at a time, so it is atomic) only ever targets a
//     row that the schedule splits (exit 7), and every other entry of out is stored: out starts as
//     poison except on split rows, which start at zero as the launcher's torch.zeros makes them.
//
// usage: harness DIR VALUE(f32|f64|f16|bf16) INDEX(i32|i64) CPT VEC G TILE BLOCK_THREADS BLOCKS SHARED_BYTES
//                N F WIDTH STRATEGY AGGREGATOR HAS_WEIGHTS SPLIT_EDGES NUM_ITEMS
// reads DIR/{indptr,indices,weights,x,dinv}.bin (raw little-endian arrays; x in VALUE's type, f16 and
// bf16 as their bit patterns; dinv in the accumulation type, float32 for f16 and bf16) and, with
// SPLIT_EDGES > 0, the schedule DIR/{work_row (int64), work_chunk (int32)}.bin of NUM_ITEMS items (the
// SPLIT = true instance runs); writes DIR/out.bin (VALUE's type; the accumulation type when
// SPLIT_EDGES > 0) and prints "atomics N" (atomic adds done).
//
// usage: harness convert IN OUT: IN holds float32 values; OUT gets, per value, its float16 bits, its
// bfloat16 bits (uint16 each) and both widened back (float32 each), as four consecutive arrays: the
// kernel's host conversions, for the test to hold against numpy's and torch's.
// Exit status: 0 ok, 2 usage or I/O error, 3 shared memory, 4 bad sync mask, 5 divergent sync,
// 6 misaligned 128-bit access, 7 atomic add outside a split row.

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "host_harness.h"

// hooks of the kernel source's host build (see ES_SPMM_HOST_* in es_spmm.cu)
int g_error = 0;
const unsigned char* g_out_begin = nullptr;  // out, [N, F]
long long g_out_row_bytes = 0;               // F * sizeof(T)
long long g_out_rows = 0;
std::vector<char> g_split_row;  // rows whose chunks add into out
long long g_atomics = 0;

inline void host_check_align16(const void* p) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) g_error = 6;
}

template <typename T>
inline void host_atomic_add(T* p, T v) {
    const long long off = reinterpret_cast<const unsigned char*>(p) - g_out_begin;
    const long long row = off >= 0 ? off / g_out_row_bytes : -1;
    if (row < 0 || row >= g_out_rows || !g_split_row[static_cast<size_t>(row)]) g_error = 7;
    ++g_atomics;
    *p += v;
}

#define ES_SPMM_HOST_CHECK_ALIGN16(p) host_check_align16(p)
#define ES_SPMM_HOST_ATOMIC_ADD(p, v) host_atomic_add((p), (v))

#include ES_SPMM_SOURCE

namespace {

template <typename V>
std::vector<V> read_array(const std::string& path) {
    std::vector<V> out;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return out;
    std::fseek(f, 0, SEEK_END);
    const long bytes = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    out.resize(static_cast<size_t>(bytes) / sizeof(V));
    if (!out.empty() && std::fread(out.data(), sizeof(V), out.size(), f) != out.size()) out.clear();
    std::fclose(f);
    return out;
}

struct Lane {
    ucontext_t ctx;
    std::vector<char> stack = std::vector<char>(kHarnessStack);
    int thread = 0;
    int group = 0;
    bool waiting = false;
    bool done = false;
};

// scheduler state (one launch at a time, single-threaded)
ucontext_t g_sched;
Lane* g_current = nullptr;
void (*g_body)(int thread) = nullptr;  // runs one GPU thread of the current block

struct HostSync {
    int group_size;
    void operator()(unsigned mask) const {
        const int lane_in_warp = g_current->thread % 32;
        if (((mask >> lane_in_warp) & 1u) == 0u || __builtin_popcount(mask) != group_size) g_error = 4;
        g_current->waiting = true;
        swapcontext(&g_current->ctx, &g_sched);
    }
};

void lane_entry() {
    g_body(g_current->thread);
    g_current->done = true;
    // returning switches to uc_link (the scheduler)
}

RunOrder g_order;  // HARNESS_ORDER: forward (default), reverse, shuffle (tests/host_harness.h)

// Run one block: every thread until done; release a group whenever all of its lanes wait.
int run_block(std::vector<Lane>& lanes, int groups) {
    for (auto& l : lanes) {
        l.waiting = l.done = false;
        start_coroutine(l.ctx, l.stack, &g_sched, lane_entry);
    }
    std::vector<int> waiting(groups), done(groups), size(groups);
    for (const auto& l : lanes) ++size[l.group];
    for (;;) {
        bool ran = false;
        for (const size_t i : g_order.next(lanes.size())) {
            Lane& l = lanes[i];
            if (l.done || l.waiting) continue;
            g_current = &l;
            swapcontext(&g_sched, &l.ctx);
            ran = true;
        }
        std::fill(waiting.begin(), waiting.end(), 0);
        std::fill(done.begin(), done.end(), 0);
        for (const auto& l : lanes) {
            waiting[l.group] += l.waiting;
            done[l.group] += l.done;
        }
        bool released = false, all_done = true;
        for (int g = 0; g < groups; ++g) {
            if (done[g] != size[g]) all_done = false;
            if (waiting[g] == 0) continue;
            if (waiting[g] + done[g] == size[g] && done[g] > 0) return 5;  // some lanes left, others wait
            if (waiting[g] == size[g]) {
                for (auto& l : lanes) {
                    if (l.group == g) l.waiting = false;
                }
                released = true;
            }
        }
        if (all_done) return 0;
        if (!ran && !released) return 5;  // nobody can move: a sync some lanes never reach
    }
}

template <typename T, typename I, int CPT, bool VEC, bool SPLIT>
struct Launch {
    static es_spmm::Args<T, I, typename es_spmm::Out<T, SPLIT>::type> args;
    static unsigned char* smem;
    static long long block, blocks;
    static int block_threads;
    static void body(int thread) {
        es_spmm::run_thread<T, I, CPT, VEC, SPLIT>(args, block, blocks, thread, block_threads, smem,
                                                   HostSync{args.group_size});
    }
};
template <typename T, typename I, int CPT, bool VEC, bool SPLIT>
es_spmm::Args<T, I, typename es_spmm::Out<T, SPLIT>::type> Launch<T, I, CPT, VEC, SPLIT>::args;
template <typename T, typename I, int CPT, bool VEC, bool SPLIT> unsigned char* Launch<T, I, CPT, VEC, SPLIT>::smem;
template <typename T, typename I, int CPT, bool VEC, bool SPLIT> long long Launch<T, I, CPT, VEC, SPLIT>::block;
template <typename T, typename I, int CPT, bool VEC, bool SPLIT> long long Launch<T, I, CPT, VEC, SPLIT>::blocks;
template <typename T, typename I, int CPT, bool VEC, bool SPLIT> int Launch<T, I, CPT, VEC, SPLIT>::block_threads;

// A 16-byte aligned copy (what a CUDA allocation gives; std::vector promises only alignof(T)).
template <typename T>
struct Aligned {
    std::vector<unsigned char> raw;
    T* data = nullptr;
    explicit Aligned(size_t n) : raw(n * sizeof(T) + 16) {
        const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(raw.data());
        data = reinterpret_cast<T*>(raw.data() + (16 - a % 16) % 16);
    }
};

// The stage pointers run_thread derives for each group must be disjoint and inside smem_bytes.
template <typename T, typename I>
bool stages_fit(int block_threads, int g, int tile, long long smem_bytes) {
    const int gpb = block_threads / 32 * (32 / g);
    const long long vbytes = es_spmm::smem_value_bytes(gpb, tile, sizeof(T));
    const long long per = static_cast<long long>(tile) + 1;
    // values [grp * per * sizeof(T), +per * sizeof(T)), indices after vbytes likewise
    return gpb * per * static_cast<long long>(sizeof(T)) <= vbytes &&
           vbytes + gpb * per * static_cast<long long>(sizeof(I)) <= smem_bytes && vbytes % alignof(I) == 0;
}

struct Params {
    int tile, block_threads, g;
    long long blocks, smem_bytes, n, f, width, split_edges, num_items;
    int strategy, aggregator, has_weights;
};

template <typename T, typename I, int CPT, bool VEC, bool SPLIT>
int launch(const std::string& dir, const Params& p) {
    const int tile = p.tile, block_threads = p.block_threads, g = p.g, aggregator = p.aggregator;
    const long long n = p.n, f = p.f, blocks = p.blocks, smem_bytes = p.smem_bytes;
    const auto indptr = read_array<long long>(dir + "/indptr.bin");
    const auto indices = read_array<I>(dir + "/indices.bin");
    const auto weights = read_array<float>(dir + "/weights.bin");
    using A = typename es_spmm::Acc<T>::type;
    using O = typename es_spmm::Out<T, SPLIT>::type;
    const auto x_file = read_array<T>(dir + "/x.bin");
    const auto dinv = read_array<A>(dir + "/dinv.bin");
    std::vector<long long> work_row;
    std::vector<int> work_chunk;
    if (SPLIT) {
        work_row = read_array<long long>(dir + "/work_row.bin");
        work_chunk = read_array<int>(dir + "/work_chunk.bin");
        if (static_cast<long long>(work_row.size()) != p.num_items ||
            static_cast<long long>(work_chunk.size()) != p.num_items) return 2;
    } else if (p.num_items != n) {
        return 2;
    }
    if (static_cast<long long>(indptr.size()) != n + 1 || static_cast<long long>(x_file.size()) != n * f) return 2;
    if (!stages_fit<A, I>(block_threads, g, tile, smem_bytes)) return 3;
    Aligned<T> x(x_file.size());
    Aligned<O> out(static_cast<size_t>(n * f));
    if (!x_file.empty()) std::memcpy(x.data, x_file.data(), x_file.size() * sizeof(T));
    // poison: every entry must be written; rows the schedule splits start at zero (chunks add into them)
    g_split_row.assign(static_cast<size_t>(n), 0);
    for (long long r = 0; r < n; ++r) {
        const long long d = indptr[r + 1] - indptr[r];
        const long long k = p.width > 0 && d > p.width ? p.width : d;
        g_split_row[r] = SPLIT && p.split_edges > 0 && k > p.split_edges;
        const O fill = es_spmm::narrow<O>(g_split_row[r] ? A(0) : A(-12345));
        for (long long c = 0; c < f; ++c) out.data[r * f + c] = fill;
    }
    g_out_begin = reinterpret_cast<const unsigned char*>(out.data);
    g_out_row_bytes = f * static_cast<long long>(sizeof(O));
    g_out_rows = n;

    using L = Launch<T, I, CPT, VEC, SPLIT>;
    es_spmm::Args<T, I, O>& a = L::args;
    a.indptr = indptr.data();
    a.indices = indices.data();
    a.weights = p.has_weights ? weights.data() : nullptr;
    a.x = x.data;
    a.dinv = aggregator == es_spmm::kGcn ? dinv.data() : nullptr;
    a.out = out.data;
    a.work_row = SPLIT ? work_row.data() : nullptr;
    a.work_chunk = SPLIT ? work_chunk.data() : nullptr;
    a.num_items = p.num_items;
    a.split_edges = SPLIT ? p.split_edges : 0;
    a.num_rows = n;
    a.num_features = f;
    a.width = p.width;
    a.strategy = p.strategy;
    a.aggregator = aggregator;
    a.group_size = g;
    a.tile = tile;
    L::blocks = blocks;
    L::block_threads = block_threads;
    g_body = &L::body;

    std::vector<Lane> lanes(static_cast<size_t>(block_threads));
    int groups = 0;
    for (int t = 0; t < block_threads; ++t) {
        const es_spmm::GroupCoords c = es_spmm::group_coords(t, block_threads, g);
        lanes[t].thread = t;
        lanes[t].group = c.group;
        if (c.group + 1 > groups) groups = c.group + 1;
    }
    std::vector<unsigned char> smem(static_cast<size_t>(smem_bytes + kGuard));
    for (long long b = 0; b < blocks; ++b) {
        std::fill(smem.begin(), smem.end(), kGuardByte);
        L::smem = smem.data();
        L::block = b;
        const int rc = run_block(lanes, groups);
        if (rc != 0) return rc;
        if (g_error != 0) return g_error;
        for (int i = 0; i < kGuard; ++i) {
            if (smem[static_cast<size_t>(smem_bytes + i)] != kGuardByte) return 3;
        }
    }
    FILE* fo = std::fopen((dir + "/out.bin").c_str(), "wb");
    if (fo == nullptr) return 2;
    std::fwrite(out.data, sizeof(O), static_cast<size_t>(n * f), fo);
    std::fclose(fo);
    std::printf("atomics %lld\n", g_atomics);
    return 0;
}

template <typename T, typename I, int CPT>
int by_flags(bool vec, bool split, const std::string& dir, const Params& p) {
    if (vec) {
        if constexpr (CPT % es_spmm::Vec<T>::kWidth == 0) {
            return split ? launch<T, I, CPT, true, true>(dir, p) : launch<T, I, CPT, true, false>(dir, p);
        }
        return 2;  // no such instance: the launcher never asks for it
    }
    return split ? launch<T, I, CPT, false, true>(dir, p) : launch<T, I, CPT, false, false>(dir, p);
}

template <typename T, typename I>
int by_cpt(int cpt, bool vec, bool split, const std::string& dir, const Params& p) {
    switch (cpt) {
        case 1: return by_flags<T, I, 1>(vec, split, dir, p);
        case 2: return by_flags<T, I, 2>(vec, split, dir, p);
        case 4: return by_flags<T, I, 4>(vec, split, dir, p);
        case 8: return by_flags<T, I, 8>(vec, split, dir, p);
        default: return 2;
    }
}

int convert(const std::string& in, const std::string& out_path) {
    const auto v = read_array<float>(in);
    std::vector<unsigned short> h(v.size()), b(v.size());
    std::vector<float> hf(v.size()), bf(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        h[i] = es_spmm::float_to_half(v[i]);
        b[i] = es_spmm::float_to_bf16(v[i]);
        hf[i] = es_spmm::half_to_float(h[i]);
        bf[i] = es_spmm::bf16_to_float(b[i]);
    }
    FILE* fo = std::fopen(out_path.c_str(), "wb");
    if (fo == nullptr) return 2;
    std::fwrite(h.data(), 2, h.size(), fo);
    std::fwrite(b.data(), 2, b.size(), fo);
    std::fwrite(hf.data(), 4, hf.size(), fo);
    std::fwrite(bf.data(), 4, bf.size(), fo);
    std::fclose(fo);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 4 && std::string(argv[1]) == "convert") return convert(argv[2], argv[3]);
    if (argc != 19) {
        std::fprintf(stderr, "usage: %s DIR VALUE INDEX CPT VEC G TILE BLOCK_THREADS BLOCKS SHARED_BYTES N F WIDTH "
                             "STRATEGY AGGREGATOR HAS_WEIGHTS SPLIT_EDGES NUM_ITEMS\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1], value = argv[2], index = argv[3];
    const int cpt = std::atoi(argv[4]);
    const bool vec = std::atoi(argv[5]) != 0;
    Params p{};
    p.g = std::atoi(argv[6]);
    p.tile = std::atoi(argv[7]);
    p.block_threads = std::atoi(argv[8]);
    p.blocks = std::atoll(argv[9]);
    p.smem_bytes = std::atoll(argv[10]);
    p.n = std::atoll(argv[11]);
    p.f = std::atoll(argv[12]);
    p.width = std::atoll(argv[13]);
    p.strategy = std::atoi(argv[14]);
    p.aggregator = std::atoi(argv[15]);
    p.has_weights = std::atoi(argv[16]);
    p.split_edges = std::atoll(argv[17]);
    p.num_items = std::atoll(argv[18]);
    const bool split = p.split_edges > 0;
    const int bt = p.block_threads, g = p.g;
    if (bt <= 0 || bt % 32 != 0 || g <= 0 || 32 % g != 0 || p.tile <= 0) return 2;
    if (value == "f32" && index == "i32") return by_cpt<float, int>(cpt, vec, split, dir, p);
    if (value == "f32" && index == "i64") return by_cpt<float, long long>(cpt, vec, split, dir, p);
    if (value == "f64" && index == "i32") return by_cpt<double, int>(cpt, vec, split, dir, p);
    if (value == "f64" && index == "i64") return by_cpt<double, long long>(cpt, vec, split, dir, p);
    if (value == "f16" && index == "i32") return by_cpt<es_spmm::half_t, int>(cpt, vec, split, dir, p);
    if (value == "f16" && index == "i64") return by_cpt<es_spmm::half_t, long long>(cpt, vec, split, dir, p);
    if (value == "bf16" && index == "i32") return by_cpt<es_spmm::bf16_t, int>(cpt, vec, split, dir, p);
    if (value == "bf16" && index == "i64") return by_cpt<es_spmm::bf16_t, long long>(cpt, vec, split, dir, p);
    return 2;
}
