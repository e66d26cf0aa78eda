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
//     computed, and nothing is written past it (guard bytes; exit 3).
//
// usage: harness DIR VALUE(f32|f64) INDEX(i32|i64) CPT G TILE BLOCK_THREADS BLOCKS SHARED_BYTES
//                N F WIDTH STRATEGY AGGREGATOR HAS_WEIGHTS
// reads DIR/{indptr,indices,weights,x,dinv}.bin (raw little-endian arrays), writes DIR/out.bin.
// Exit status: 0 ok, 2 usage or I/O error, 3 shared memory, 4 bad sync mask, 5 divergent sync.

#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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

constexpr size_t kStack = 64 * 1024;
constexpr int kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;

struct Lane {
    ucontext_t ctx;
    std::vector<char> stack = std::vector<char>(kStack);
    int thread = 0;
    int group = 0;
    bool waiting = false;
    bool done = false;
};

// scheduler state (one launch at a time, single-threaded)
ucontext_t g_sched;
Lane* g_current = nullptr;
int g_error = 0;
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

// Run one block: every thread until done; release a group whenever all of its lanes wait.
int run_block(std::vector<Lane>& lanes, int groups) {
    for (auto& l : lanes) {
        l.waiting = l.done = false;
        getcontext(&l.ctx);
        l.ctx.uc_stack.ss_sp = l.stack.data();
        l.ctx.uc_stack.ss_size = l.stack.size();
        l.ctx.uc_link = &g_sched;
        makecontext(&l.ctx, lane_entry, 0);
    }
    std::vector<int> waiting(groups), done(groups), size(groups);
    for (const auto& l : lanes) ++size[l.group];
    for (;;) {
        bool ran = false;
        for (auto& l : lanes) {
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

template <typename T, typename I, int CPT>
struct Launch {
    static es_spmm::Args<T, I> args;
    static unsigned char* smem;
    static long long block, blocks;
    static int block_threads;
    static void body(int thread) {
        es_spmm::run_thread<T, I, CPT>(args, block, blocks, thread, block_threads, smem, HostSync{args.group_size});
    }
};
template <typename T, typename I, int CPT> es_spmm::Args<T, I> Launch<T, I, CPT>::args;
template <typename T, typename I, int CPT> unsigned char* Launch<T, I, CPT>::smem;
template <typename T, typename I, int CPT> long long Launch<T, I, CPT>::block;
template <typename T, typename I, int CPT> long long Launch<T, I, CPT>::blocks;
template <typename T, typename I, int CPT> int Launch<T, I, CPT>::block_threads;

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

template <typename T, typename I, int CPT>
int launch(const std::string& dir, int tile, int block_threads, long long blocks, long long smem_bytes,
           long long n, long long f, long long width, int strategy, int aggregator, int has_weights, int g) {
    const auto indptr = read_array<long long>(dir + "/indptr.bin");
    const auto indices = read_array<I>(dir + "/indices.bin");
    const auto weights = read_array<float>(dir + "/weights.bin");
    const auto x = read_array<T>(dir + "/x.bin");
    const auto dinv = read_array<T>(dir + "/dinv.bin");
    if (static_cast<long long>(indptr.size()) != n + 1 || static_cast<long long>(x.size()) != n * f) return 2;
    if (!stages_fit<T, I>(block_threads, g, tile, smem_bytes)) return 3;
    std::vector<T> out(static_cast<size_t>(n * f), T(-12345));  // poison: every entry must be written

    using L = Launch<T, I, CPT>;
    es_spmm::Args<T, I>& a = L::args;
    a.indptr = indptr.data();
    a.indices = indices.data();
    a.weights = has_weights ? weights.data() : nullptr;
    a.x = x.data();
    a.dinv = aggregator == es_spmm::kGcn ? dinv.data() : nullptr;
    a.out = out.data();
    a.num_rows = n;
    a.num_features = f;
    a.width = width;
    a.strategy = strategy;
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
    std::fwrite(out.data(), sizeof(T), out.size(), fo);
    std::fclose(fo);
    return 0;
}

template <typename T, typename I>
int by_cpt(int cpt, const std::string& dir, int tile, int bt, long long blocks, long long smem, long long n,
           long long f, long long w, int s, int agg, int hw, int g) {
    switch (cpt) {
        case 1: return launch<T, I, 1>(dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
        case 2: return launch<T, I, 2>(dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
        case 4: return launch<T, I, 4>(dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
        case 8: return launch<T, I, 8>(dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
        default: return 2;
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 16) {
        std::fprintf(stderr, "usage: %s DIR VALUE INDEX CPT G TILE BLOCK_THREADS BLOCKS SHARED_BYTES N F WIDTH "
                             "STRATEGY AGGREGATOR HAS_WEIGHTS\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1], value = argv[2], index = argv[3];
    const int cpt = std::atoi(argv[4]), g = std::atoi(argv[5]), tile = std::atoi(argv[6]);
    const int bt = std::atoi(argv[7]);
    const long long blocks = std::atoll(argv[8]), smem = std::atoll(argv[9]);
    const long long n = std::atoll(argv[10]), f = std::atoll(argv[11]), w = std::atoll(argv[12]);
    const int s = std::atoi(argv[13]), agg = std::atoi(argv[14]), hw = std::atoi(argv[15]);
    if (bt <= 0 || bt % 32 != 0 || g <= 0 || 32 % g != 0 || tile <= 0) return 2;
    if (value == "f32" && index == "i32") return by_cpt<float, int>(cpt, dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
    if (value == "f32" && index == "i64") return by_cpt<float, long long>(cpt, dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
    if (value == "f64" && index == "i32") return by_cpt<double, int>(cpt, dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
    if (value == "f64" && index == "i64") return by_cpt<double, long long>(cpt, dir, tile, bt, blocks, smem, n, f, w, s, agg, hw, g);
    return 2;
}
