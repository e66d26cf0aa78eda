// What the host emulations of the CUDA kernels share (tests/es_spmm_host_harness.cpp,
// tests/shadow_block_host_harness.cpp, tests/resident_head_host_harness.cpp): a GPU thread as a coroutine
// (ucontext) on its own stack, the inputs read from raw files, the answers' poison check and the
// shared-memory guard.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// (Re)start `ctx` to run `entry` on `stack`; when `entry` returns, control switches to `link` (the scheduler).
inline void start_coroutine(ucontext_t& ctx, std::vector<char>& stack, ucontext_t* link, void (*entry)()) {
    getcontext(&ctx);
    ctx.uc_stack.ss_sp = stack.data();
    ctx.uc_stack.ss_size = stack.size();
    ctx.uc_link = link;
    makecontext(&ctx, entry, 0);
}

constexpr size_t kHarnessStack = 64 * 1024;  // one GPU thread's stack
constexpr int kGuard = 256;                   // guard bytes after the launch's shared memory
constexpr unsigned char kGuardByte = 0xA5;
constexpr uint32_t kPoison = 0x7fbadbadu;  // a NaN no arithmetic produces: an answer never written

// The order a block's threads run in between two waits: HARNESS_ORDER `forward` (index order, the default),
// `reverse`, or `shuffle` (a seeded permutation, another each round). A phase whose answers depend on it
// reads what another thread of the same phase writes: a race on a GPU.
class RunOrder {
   public:
    RunOrder() {
        if (const char* mode = std::getenv("HARNESS_ORDER")) mode_ = mode;
    }
    const std::vector<size_t>& next(size_t n) {
        order_.resize(n);
        for (size_t i = 0; i < n; ++i) order_[i] = i;
        if (mode_ == "reverse") {
            std::reverse(order_.begin(), order_.end());
        } else if (mode_ == "shuffle") {
            std::shuffle(order_.begin(), order_.end(), rng_);
        }
        return order_;
    }

   private:
    std::string mode_ = "forward";
    std::mt19937 rng_{12345};
    std::vector<size_t> order_;
};

// A raw little-endian array file into `out`. With HARNESS_EXACT (AddressSanitizer builds) exactly its
// elements (one for an empty file, a valid pointer); otherwise one more, never read.
template <typename V>
bool read_array(const std::string& path, std::vector<V>& out) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return false;
    std::fseek(f, 0, SEEK_END);
    const long bytes = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    const size_t n = static_cast<size_t>(bytes) / sizeof(V);
#ifdef HARNESS_EXACT
    out.resize(n > 0 ? n : 1);
#else
    out.resize(n + 1);
#endif
    const bool ok = n == 0 || std::fread(out.data(), sizeof(V), n, f) == n;
    std::fclose(f);
    return ok;
}

// The answers start poisoned; after the launch every one must have been written.
inline void poison(std::vector<float>& out) {
    for (auto& o : out) std::memcpy(&o, &kPoison, 4);
}

inline bool all_written(const std::vector<float>& out) {
    for (const auto& o : out) {
        uint32_t bits;
        std::memcpy(&bits, &o, 4);
        if (bits == kPoison) return false;
    }
    return true;
}

inline bool write_array(const std::string& path, const std::vector<float>& out) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return false;
    const bool ok = std::fwrite(out.data(), 4, out.size(), f) == out.size();
    return std::fclose(f) == 0 && ok;
}
