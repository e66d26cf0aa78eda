// Host emulation of kernels/resident_head.cu, for tests/test_resident_head.py (no GPU needed).
//
// Compiled as plain C++17. It includes the kernel source, where the CUDA qualifiers are defined away,
// and runs rhead::run_thread -- the code every GPU thread runs -- for every thread of every block of a
// launch, each thread a coroutine (tests/host_harness.h) run round-robin. Two kinds of waits:
//   * sync(): the block's barrier, released when every thread of the block waits at it;
//   * shfl(v, o): the warp's exchange, released when all 32 lanes of the warp wait at one; each lane then
//     gets the value lane ^ o offered (taken at the release, so a lane that runs on cannot overwrite a
//     value another lane has not read yet).
// Threads run in index order between waits unless HARNESS_ORDER says `reverse` or `shuffle`; built with
// -DHARNESS_EXACT (and AddressSanitizer) the shared memory and the arrays have their exact sizes.
// Checks: shared memory written past the launcher's size (guard bytes; exit 3); threads that leave while
// others wait, or wait at different kinds of barrier, or lanes of one exchange with different offsets
// (exit 5); an answer the host unpacks left unwritten (out starts as a poison pattern; exit 8).
//
// usage: harness DIR B H C WANT_EMB HAS_DINV HAS_KEPT2 HAS_WSELF THREADS SHARED_BYTES OUT_FLOATS
// reads DIR/{ids,crow,col,k}.bin (int64), DIR/{h,coef,w_agg,bias}.bin (float32) and, where flagged,
// DIR/dinv.bin (float32), DIR/kept2.bin (int64), DIR/w_self.bin (float32); writes DIR/out.bin (float32).
// Exit status: 0 ok, 2 usage or I/O error, 3 shared memory, 5 divergent barrier or exchange, 8 an answer
// not written.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "host_harness.h"

#include RESIDENT_HEAD_SOURCE

namespace {

enum Wait { kRunning = 0, kBlock = 1, kWarp = 2 };

struct Thread {
    ucontext_t ctx;
    std::vector<char> stack = std::vector<char>(kHarnessStack);
    int index = 0;
    Wait wait = kRunning;
    bool done = false;
    uint32_t offered = 0;  // the value a lane offers at an exchange (its bits)
    int offset = 0;
    uint32_t got = 0;  // what it received
};

ucontext_t g_sched;
std::vector<Thread>* g_threads = nullptr;
Thread* g_current = nullptr;
const rhead::Args* g_args = nullptr;
int g_block = 0;
int g_count = 0;
float* g_smem = nullptr;

struct HostSync {
    void operator()() const {
        g_current->wait = kBlock;
        swapcontext(&g_current->ctx, &g_sched);
    }
};

struct HostShfl {
    uint32_t exchange(uint32_t bits, int o) const {
        g_current->offered = bits;
        g_current->offset = o;
        g_current->wait = kWarp;
        swapcontext(&g_current->ctx, &g_sched);
        return g_current->got;
    }
    float operator()(float v, int o) const {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        b = exchange(b, o);
        float r;
        std::memcpy(&r, &b, 4);
        return r;
    }
    int operator()(int v, int o) const { return static_cast<int>(exchange(static_cast<uint32_t>(v), o)); }
};

void thread_entry() {
    rhead::run_thread(*g_args, g_block, g_current->index, g_count, g_smem, HostSync{}, HostShfl{});
    g_current->done = true;
}

RunOrder g_order;

int run_block(std::vector<Thread>& threads) {
    for (auto& t : threads) {
        t.wait = kRunning;
        t.done = false;
        start_coroutine(t.ctx, t.stack, &g_sched, thread_entry);
    }
    const int n = static_cast<int>(threads.size());
    for (;;) {
        for (const size_t i : g_order.next(threads.size())) {
            Thread& t = threads[i];
            if (t.done || t.wait != kRunning) continue;
            g_current = &t;
            swapcontext(&g_sched, &t.ctx);
        }
        bool released = false;
        // warp exchanges: a warp whose 32 lanes all wait at one
        for (int w = 0; w * 32 < n; ++w) {
            int waiting = 0;
            for (int l = 0; l < 32 && w * 32 + l < n; ++l) waiting += threads[w * 32 + l].wait == kWarp;
            if (waiting == 0) continue;
            if (waiting < 32) continue;  // not all there yet (or a divergence the block check below catches)
            const int o = threads[w * 32].offset;
            for (int l = 0; l < 32; ++l) {
                Thread& t = threads[w * 32 + l];
                if (t.offset != o) return 5;
                t.got = threads[w * 32 + (l ^ o)].offered;
            }
            for (int l = 0; l < 32; ++l) threads[w * 32 + l].wait = kRunning;
            released = true;
        }
        if (released) continue;
        int block = 0, warp = 0, done = 0;
        for (const auto& t : threads) {
            block += t.wait == kBlock;
            warp += t.wait == kWarp;
            done += t.done;
        }
        if (done == n) return 0;
        if (warp > 0 || done > 0) return 5;  // nothing can run: a barrier some threads never reach
        if (block == n) {
            for (auto& t : threads) t.wait = kRunning;
            continue;
        }
        return 5;
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 12) {
        std::fprintf(stderr, "usage: %s DIR B H C WANT_EMB HAS_DINV HAS_KEPT2 HAS_WSELF THREADS SHARED_BYTES "
                     "OUT_FLOATS\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const int B = std::atoi(argv[2]), H = std::atoi(argv[3]), C = std::atoi(argv[4]), want_emb = std::atoi(argv[5]);
    const bool has_dinv = std::atoi(argv[6]) != 0, has_kept2 = std::atoi(argv[7]) != 0;
    const bool has_wself = std::atoi(argv[8]) != 0;
    const int threads = std::atoi(argv[9]);
    const long long shared = std::atoll(argv[10]), out_floats = std::atoll(argv[11]);
    std::vector<long long> ids, crow, col, k, kept2;
    std::vector<float> h, coef, w_agg, bias, dinv, w_self;
    bool ok = read_array(dir + "/ids.bin", ids) && read_array(dir + "/crow.bin", crow) &&
              read_array(dir + "/col.bin", col) && read_array(dir + "/k.bin", k) && read_array(dir + "/h.bin", h) &&
              read_array(dir + "/coef.bin", coef) && read_array(dir + "/w_agg.bin", w_agg) &&
              read_array(dir + "/bias.bin", bias);
    if (ok && has_dinv) ok = read_array(dir + "/dinv.bin", dinv);
    if (ok && has_kept2) ok = read_array(dir + "/kept2.bin", kept2);
    if (ok && has_wself) ok = read_array(dir + "/w_self.bin", w_self);
    if (!ok || threads % 32 != 0) {
        std::fprintf(stderr, "cannot read the inputs in %s, or threads not a multiple of 32\n", dir.c_str());
        return 2;
    }
    std::vector<float> out(static_cast<size_t>(out_floats));
    poison(out);
    const rhead::Args a{ids.data(), h.data(), crow.data(), col.data(), coef.data(), k.data(),
                        has_dinv ? dinv.data() : nullptr, has_kept2 ? kept2.data() : nullptr, w_agg.data(),
                        has_wself ? w_self.data() : nullptr, bias.data(), out.data(), B, H, C, want_emb};
#ifdef HARNESS_EXACT  // AddressSanitizer sees a write or read past the shared memory itself
    constexpr int guard_bytes = 0;
#else
    constexpr int guard_bytes = kGuard;
#endif
    std::vector<float> smem(static_cast<size_t>(shared) / 4 + guard_bytes / 4);
    unsigned char* guard = reinterpret_cast<unsigned char*>(smem.data()) + shared;
    std::vector<Thread> pool(static_cast<size_t>(threads));
    for (int i = 0; i < threads; ++i) pool[static_cast<size_t>(i)].index = i;
    g_args = &a;
    g_count = threads;
    g_threads = &pool;
    for (int blk = 0; blk < B; ++blk) {
        std::memset(smem.data(), 0x5C, shared);  // shared memory is not zeroed on a GPU either
        std::memset(guard, kGuardByte, guard_bytes);
        g_block = blk;
        g_smem = smem.data();
        const int rc = run_block(pool);
        if (rc != 0) return rc;
        for (int i = 0; i < guard_bytes; ++i)
            if (guard[i] != kGuardByte) return 3;
    }
    if (!all_written(out)) return 8;
    return write_array(dir + "/out.bin", out) ? 0 : 2;
}
