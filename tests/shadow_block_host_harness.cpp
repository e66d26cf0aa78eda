// Host emulation of kernels/shadow_block.cu, for tests/test_shadow_block.py (no GPU needed).
//
// Compiled as plain C++17. It includes the kernel source, where the CUDA qualifiers are defined away,
// and runs shadow_block::run_thread -- the code every GPU thread runs -- for every thread of every block
// of a launch. Each GPU thread is a coroutine (ucontext) on its own stack; a scheduler runs the threads
// of a block round-robin, and the sync functor (__syncthreads on the device) parks a thread until every
// thread of the block has arrived. Single-threaded and deterministic.
//
// Besides the answers it checks what the host can check about the device side:
//   * the shared-memory size the Python launcher computed is the kernel's own (exit 3), and nothing is
//     written past it (guard bytes; exit 3);
//   * every thread reaches the same barriers: a thread that finishes while others wait at a barrier
//     would hang or be undefined on a GPU (exit 5);
//   * every answer the host unpacks is written (out starts as a poison pattern; exit 8).
//
// Threads run in index order between barriers unless HARNESS_ORDER says `reverse` or `shuffle` (another
// seeded permutation every round): a phase whose answers depend on that order has a race. Built with
// -DHARNESS_EXACT (and AddressSanitizer), the shared memory and the input arrays are allocated to their
// exact sizes, so that a read past their end is caught too (the guard bytes only catch writes).
//
// usage: harness DIR B K WIDTH FASTRAND GCN LAYERS H C POOL0 POOL1 CAP WANT_EMB SCRATCH HAS_WEIGHTS THREADS
//                SHARED_BYTES OUT_FLOATS   (the kernel's 13 int parameters in its order, then the launch's)
// reads DIR/{ids,lptr,lnodes,eptr}.bin (int64), DIR/{src,dst}.bin (int32), DIR/ew.bin (float32, with
// HAS_WEIGHTS), DIR/{p,wt,bias,wc,bc}.bin (float32); writes DIR/out.bin (OUT_FLOATS float32).
// Exit status: 0 ok, 2 usage or I/O error, 3 shared memory, 5 divergent barrier, 8 an answer not written.

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "host_harness.h"

#include SHADOW_BLOCK_SOURCE

namespace {

struct Thread {
    ucontext_t ctx;
    std::vector<char> stack = std::vector<char>(kHarnessStack);
    int index = 0;
    bool waiting = false;
    bool done = false;
};

ucontext_t g_sched;
Thread* g_current = nullptr;
const shadow_block::Args* g_args = nullptr;
int g_block = 0;
int g_threads = 0;
unsigned char* g_smem = nullptr;

struct HostSync {
    void operator()() const {
        g_current->waiting = true;
        swapcontext(&g_current->ctx, &g_sched);
    }
};

void thread_entry() {
    shadow_block::run_thread(*g_args, g_block, g_current->index, g_threads, g_smem, HostSync{});
    g_current->done = true;
}

RunOrder g_order;

// Run one block: every thread until done, in g_order each round; release the barrier when all threads
// wait at it.
int run_block(std::vector<Thread>& threads) {

    for (auto& t : threads) {
        t.waiting = t.done = false;
        start_coroutine(t.ctx, t.stack, &g_sched, thread_entry);
    }
    for (;;) {
        for (const size_t i : g_order.next(threads.size())) {
            Thread& t = threads[i];
            if (t.done || t.waiting) continue;
            g_current = &t;
            swapcontext(&g_sched, &t.ctx);
        }
        int waiting = 0, done = 0;
        for (const auto& t : threads) {
            waiting += t.waiting;
            done += t.done;
        }
        if (done == static_cast<int>(threads.size())) return 0;
        if (waiting + done != static_cast<int>(threads.size())) continue;
        if (done > 0) return 5;  // some threads left while others wait at a barrier
        for (auto& t : threads) t.waiting = false;
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 19) {
        std::fprintf(stderr, "usage: %s DIR B K WIDTH FASTRAND GCN LAYERS H C POOL0 POOL1 CAP WANT_EMB SCRATCH "
                     "HAS_WEIGHTS THREADS SHARED_BYTES OUT_FLOATS\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    int v[14];  // B K WIDTH FASTRAND GCN LAYERS H C POOL0 POOL1 CAP WANT_EMB SCRATCH HAS_WEIGHTS
    for (int i = 0; i < 14; ++i) v[i] = std::atoi(argv[2 + i]);
    const int B = v[0], K = v[1], H = v[6], C = v[7], pool0 = v[8], pool1 = v[9], cap = v[10], scratch = v[12];
    const bool weighted = v[13] != 0;
    const int threads = std::atoi(argv[16]);
    const long long shared = std::atoll(argv[17]);
    const long long out_floats = std::atoll(argv[18]);
    const int E = H * (1 + (pool0 != 0) + (pool1 != 0));
    if (shadow_block::shared_bytes(K, H, C, E, cap, scratch) != shared) {
        std::fprintf(stderr, "shared bytes: the kernel's %lld, the launcher's %lld\n",
                     shadow_block::shared_bytes(K, H, C, E, cap, scratch), shared);
        return 3;
    }
    std::vector<long long> ids, lptr, lnodes, eptr;
    std::vector<int> src, dst;
    std::vector<float> ew, p, wt, bias, wc, bc;
    bool ok = read_array(dir + "/ids.bin", ids) && read_array(dir + "/lptr.bin", lptr) &&
              read_array(dir + "/lnodes.bin", lnodes) && read_array(dir + "/eptr.bin", eptr) &&
              read_array(dir + "/src.bin", src) && read_array(dir + "/dst.bin", dst) &&
              read_array(dir + "/p.bin", p) && read_array(dir + "/wt.bin", wt) &&
              read_array(dir + "/bias.bin", bias) && read_array(dir + "/wc.bin", wc) && read_array(dir + "/bc.bin", bc);
    if (ok && weighted) ok = read_array(dir + "/ew.bin", ew);
    if (!ok) {
        std::fprintf(stderr, "cannot read the inputs in %s\n", dir.c_str());
        return 2;
    }
    std::vector<float> out(static_cast<size_t>(out_floats));
    poison(out);
    const shadow_block::Args a{ids.data(), lptr.data(), lnodes.data(), eptr.data(), src.data(), dst.data(),
                               weighted ? ew.data() : nullptr, p.data(), wt.data(), bias.data(), wc.data(), bc.data(),
                               out.data(), B, K, v[2], v[3], v[4], v[5], H, C, pool0, pool1, cap, v[11], scratch};
#ifdef HARNESS_EXACT
    constexpr int guard = 0;
#else
    constexpr int guard = kGuard;
#endif
    std::vector<unsigned char> smem(static_cast<size_t>(shared) + guard);
    std::vector<Thread> pool(static_cast<size_t>(threads));
    for (int i = 0; i < threads; ++i) pool[static_cast<size_t>(i)].index = i;
    g_args = &a;
    g_threads = threads;
    for (int blk = 0; blk < B; ++blk) {
        std::memset(smem.data(), 0x5C, smem.size());  // shared memory is not zeroed on a GPU either
        std::memset(smem.data() + shared, kGuardByte, guard);
        g_block = blk;
        g_smem = smem.data();
        const int rc = run_block(pool);
        if (rc != 0) return rc;
        for (int i = 0; i < guard; ++i)
            if (smem[static_cast<size_t>(shared + i)] != kGuardByte) return 3;
    }
    if (!all_written(out)) return 8;
    return write_array(dir + "/out.bin", out) ? 0 : 2;
}
