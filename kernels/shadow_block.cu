// A resident shaDow-GNN batch in one launch: one block per target, its subgraph in shared memory.
//
// Specification (its torch twin): kernels.resident.ResidentShadow.forward followed by .pack -- for
// target t at PPR budget K and width S: the first cnt = min(|L_t|, K) entries of its list as rows, the
// induced table's stored pairs of t inside that prefix, each row's kept pairs (S per row, positions of
// kernels.spmm.sample_positions; every pair at the exact width), the layers on that block (GCN: the
// subgraph's own degrees g = (1 + sum_j w_ij)^(-1/2) and self loops g_i^2; GraphSAGE: the mean of the
// kept neighbours beside the root term), ReLU, the readout (target row, mean and / or max over the
// rows), the classifier, softmax and arg-max, and the edge counts -- written into the packed float32
// layout the host unpacks (ResidentShadow.unpack_host):
//
//   [B * C probabilities][B labels as floats][2 * B kept counts][2 * B total counts][B * E readouts, if want_emb]
//
// (the counts as float64 bit patterns, two float32 words each, as float64.view(float32) packs them).
//
// Layout of the work: every phase spreads (row, feature) pairs over the block's threads, features
// fastest, so loads of a projection row and of a weight row are coalesced and a row of the block is a
// broadcast. The subgraph never leaves shared memory:
//
//   rs [K + 1]       int    first stored pair of each row (relative to the target's run; rs[K] ends the last)
//   deg, ks [K]      int    pairs inside the prefix (a prefix of the row's run: columns ascend), kept pairs
//                           min(deg, S)
//   koff [K + 1]     int    each row's first kept pair in kcol / kcoef (an exclusive scan of ks)
//   g [K]            float  GCN's subgraph D^(-1/2) (0 outside the prefix)
//   kcol, kcoef [cap]       the kept pairs: column and coefficient (cap >= sum ks, checked)
//   h, x [K * H]     float  the rows' activations and the aggregate (rows >= cnt stay 0)
//   s [R * H]        float  GraphSAGE's transform of R rows at a time (it reads h and x, then writes h);
//                           R = 0 for GCN, K where the block's shared memory allows, else fewer
//   r [E], z [C]     float  the readout and the logits
//
// Layers: layer 0 reads the projection table P (already transformed by the first layer's weight: H
// columns for GCN, [root | neighbour] 2H for GraphSAGE); layer l >= 1 transforms with wt[l - 1], the
// layer's weight transposed ([H, H] GCN, [H, 2H] GraphSAGE: root columns, then neighbour ones), after
// aggregating (A (h W^T) = (A h) W^T: one [K, H] buffer less than the specification's order). A thread of
// a transform computes one output column for kRowTile rows at once: each weight it loads serves kRowTile
// independent sums (one target's block is latency-bound, not bandwidth-bound).
//
// The thread body is __host__ __device__ and takes __syncthreads as a functor, so tests run this exact
// code on the CPU with one coroutine per thread (tests/shadow_block_host_harness.cpp). NVRTC (CuPy)
// compiles it after the text of device_helpers.cuh, which nvcc and the host builds reach through the
// #include below.

#ifndef KDEV_HELPERS  // NVRTC gets device_helpers.cuh's text in front of this file's (kernels/resident_head.py)
#include "device_helpers.cuh"
#endif

namespace shadow_block {

constexpr long long kPrime = 577;
constexpr int kRowTile = 4;  // rows a thread of a transform computes together
enum Pool : int { kNoPool = 0, kMean = 1, kMax = 2 };

struct Args {
    const long long* ids;     // [B] targets (rows of lptr / eptr)
    const long long* lptr;    // [N + 1] each node's PPR list in lnodes
    const long long* lnodes;  // the lists' global node ids, the node itself first
    const long long* eptr;    // [N + 1] each node's stored pairs in src / dst / ew
    const int* src;           // local row of each stored pair (row-major: ascending)
    const int* dst;           // local column (ascending within a row)
    const float* ew;          // pair weights, or nullptr (unweighted: 1)
    const float* p;           // [num nodes, PD] the projection table, PD = H (GCN) or 2H (GraphSAGE)
    const float* wt;          // [(layers - 1), H, OW] layers >= 1, transposed; OW = H or 2H
    const float* bias;        // [layers, H] (zeros where a layer has none)
    const float* wc;          // [E, C] the classifier's weight, transposed
    const float* bc;          // [C]
    float* out;               // the packed answers
    int B, K, width, fastrand, gcn, layers, H, C, pool0, pool1, cap, want_emb, scratch;  // scratch: R
};

// Shared memory of a block, in bytes (kernels/shadow_block.py shared_bytes computes the same).
__host__ __device__ inline long long shared_bytes(int K, int H, int C, int E, int cap, int R) {
    return 4LL * (5LL * K + 2 + 2LL * cap + 2LL * K * H + static_cast<long long>(R) * H + E + C);
}

using kdev::exp_;
using kdev::nan_;
using kdev::neg_inf;
using kdev::rsqrt_;

// torch.relu and torch.amax keep a NaN
__host__ __device__ inline float relu(float v) { return (v > 0.f || v != v) ? v : 0.f; }
__host__ __device__ inline float max_nan(float m, float v) { return (v != v || v > m) ? v : m; }

// kernels.spmm.sample_positions for a sampled fastrand row with d pairs (0 <= t < S < d)
__host__ __device__ inline int fastrand_position(int t, int d) {
    const long long m = (d % kPrime == 0) ? d / kPrime : d;  // d / gcd(577, d); 577 is prime
    return static_cast<int>(((t * kPrime) % d + t / m) % d);
}

// A block whose kept pairs exceed the launch's capacity: NaN answers, label -1 (the host refuses the
// batch), counts 0 -- written by one thread. Out of line: the common path keeps its registers.
#if KDEV_CUDA
__noinline__
#endif
__host__ __device__ void refuse(float* out, int B, int C, int E, int block, int want_emb) {
    const long long base = static_cast<long long>(B) * C;
    for (int c = 0; c < C; ++c) out[static_cast<long long>(block) * C + c] = nan_();
    out[base + block] = -1.f;
    float* kept = out + base + B + 2LL * block;
    float* total = out + base + 3LL * B + 2LL * block;
    kept[0] = kept[1] = total[0] = total[1] = 0.f;
    if (want_emb)
        for (int j = 0; j < E; ++j) out[base + 5LL * B + static_cast<long long>(block) * E + j] = nan_();
}

// Everything one thread of block `block` does.
template <typename Sync>
__host__ __device__ void run_thread(const Args& a, int block, int thread, int threads, unsigned char* smem,
                                    const Sync& sync) {
    const int K = a.K, H = a.H, C = a.C;
    const int R = a.scratch;
    const int pools = (a.pool0 != kNoPool) + (a.pool1 != kNoPool);
    const int E = H * (1 + pools);
    int* rs = reinterpret_cast<int*>(smem);
    int* deg = rs + K + 1;
    int* ks = deg + K;
    int* koff = ks + K;
    float* g = reinterpret_cast<float*>(koff + K + 1);
    int* kcol = reinterpret_cast<int*>(g + K);
    float* kcoef = reinterpret_cast<float*>(kcol + a.cap);
    float* h = kcoef + a.cap;
    float* x = h + K * H;
    float* s = x + K * H;
    float* r = s + R * H;
    float* z = r + E;

    const long long t = a.ids[block];
    const long long lo = a.lptr[t];
    const long long listed = a.lptr[t + 1] - lo;
    const int cnt = listed < K ? static_cast<int>(listed) : K;
    const long long e0 = a.eptr[t];
    const long long ne = a.eptr[t + 1] - e0;
    const int sw = a.width > 0 ? a.width : K;  // kept slots per row: S, or every pair at the exact width
    const int PD = a.gcn ? H : 2 * H;
    // shared-memory indices fit an int (the block's shared memory bounds K * H); 32-bit division is cheap
    const int KH = K * H;
    const int cH = cnt * H;

    // 1. the inputs; where each row's run of stored pairs starts (rs, K + 1 entries: rs[K] ends row K - 1)
    // and where its pairs inside the prefix end (in deg until the next step), from one coalesced pass over
    // the target's pairs: they are sorted by row, and columns ascend within a row, so a row's pairs inside
    // the prefix are a prefix of its run. (Binary searches per row were a chain of dependent global loads.)
    for (int i = thread; i < K; i += threads) deg[i] = -1;
    for (int e = thread; e < KH; e += threads) {
        const int i = e / H, f = e - i * H;
        float v0 = 0.f, v1 = 0.f;
        if (i < cnt) {
            const float* row = a.p + a.lnodes[lo + i] * PD;
            v0 = row[f];
            if (!a.gcn) v1 = row[H + f];  // GraphSAGE: the neighbour half
        }
        h[e] = v0;
        x[e] = v1;
    }
    sync();
    for (long long q = thread; q <= ne; q += threads) {
        const int row = q < ne ? a.src[e0 + q] : 0x7fffffff;  // q = ne: past the last pair
        const int prev = q > 0 ? a.src[e0 + q - 1] : -1;
        if (prev < K && row != prev) {  // pair q starts rows prev + 1 .. min(row, K) (empty ones start here too)
            const int top = row < K ? row : K;
            for (int i = prev + 1; i <= top; ++i) rs[i] = static_cast<int>(q);
        }
        if (q < ne && row < cnt && a.dst[e0 + q] < cnt &&
            (q + 1 == ne || a.src[e0 + q + 1] != row || a.dst[e0 + q + 1] >= cnt))
            deg[row] = static_cast<int>(q + 1);  // the last pair of its row inside the prefix
    }
    sync();
    for (int i = thread; i < K; i += threads) {  // pairs inside, GCN's subgraph degree, kept pairs
        int d = 0;
        float gi = 0.f;
        if (i < cnt) {
            const int start = rs[i];
            d = deg[i] >= 0 ? deg[i] - start : 0;
            float ws = 0.f;
            for (int q = 0; q < d; ++q) ws += a.ew != nullptr ? a.ew[e0 + start + q] : 1.f;
            gi = rsqrt_(ws + 1.f);
        }
        deg[i] = d;  // this thread read deg[i] above: no other thread touches it in this phase
        ks[i] = d < sw ? d : sw;
        g[i] = gi;
    }
    sync();
    if (thread == 0) {
        int acc = 0;
        for (int i = 0; i < K; ++i) {
            koff[i] = acc;
            acc += ks[i];
        }
        koff[K] = acc;
    }
    sync();
    if (koff[K] > a.cap) {  // the host's capacity is a bound by construction; never write past it
        if (thread == 0) refuse(a.out, a.B, C, E, block, a.want_emb);
        return;
    }

    // 2. the kept pairs and their coefficients, a thread per kept pair (its row found in koff)
    const int kept = koff[K];
    for (int slot = thread; slot < kept; slot += threads) {
        int i = 0, hi = K;  // the last row i with koff[i] <= slot (empty rows share their offset)
        while (hi - i > 1) {
            const int mid = (i + hi) >> 1;
            if (koff[mid] <= slot) i = mid; else hi = mid;
        }
        const int q = slot - koff[i], d = deg[i], k = ks[i];
        const float kf = static_cast<float>(k > 1 ? k : 1);
        const bool sampled = a.width > 0 && a.fastrand && d > a.width;
        const long long e = e0 + rs[i] + (sampled ? fastrand_position(q, d) : q);
        const int col = a.dst[e];
        const float w = a.ew != nullptr ? a.ew[e] : 1.f;
        kcol[slot] = col;
        kcoef[slot] = a.gcn ? w * ((static_cast<float>(d) / kf) * g[i]) * g[col] : w / kf;
    }
    sync();

    // 3. the layers
    for (int l = 0; l < a.layers; ++l) {
        const float* b = a.bias + static_cast<long long>(l) * H;
        // aggregate: GCN x = A h (self loops g_i^2); GraphSAGE layer 0 h += A x (root + neighbour
        // halves of P), later layers x = A h
        const bool into_h = !a.gcn && l == 0;
        const float* from = into_h ? x : h;
        float* to = into_h ? h : x;
        for (int e = thread; e < cH; e += threads) {
            const int i = e / H, f = e - i * H;
            float acc = a.gcn ? g[i] * g[i] * h[e] : (into_h ? h[e] : 0.f);
            float sum = 0.f;
            for (int q = koff[i]; q < koff[i + 1]; ++q) sum += kcoef[q] * from[kcol[q] * H + f];
            to[e] = acc + sum;
        }
        sync();
        if (l == 0) {  // P holds the first layer's transform already
            for (int e = thread; e < cH; e += threads) h[e] = relu((a.gcn ? x[e] : h[e]) + b[e % H]);
            sync();
            continue;
        }
        const float* w = a.wt + static_cast<long long>(l - 1) * H * PD;
        if (a.gcn) {  // h = relu(x W^T + b): reads x, writes h
            const int tiles = (cnt + kRowTile - 1) / kRowTile;
            for (int e = thread; e < tiles * H; e += threads) {
                const int tile = e / H, o = e - tile * H;
                const float* rows[kRowTile];
                for (int q = 0; q < kRowTile; ++q) {  // rows past cnt read row cnt - 1 and are not stored
                    const int i = tile * kRowTile + q;
                    rows[q] = x + (i < cnt ? i : cnt - 1) * H;
                }
                float acc[kRowTile] = {};
                for (int f = 0; f < H; ++f) {
                    const float wv = w[f * H + o];
#pragma unroll
                    for (int q = 0; q < kRowTile; ++q) acc[q] += rows[q][f] * wv;
                }
                for (int q = 0; q < kRowTile; ++q)
                    if (tile * kRowTile + q < cnt) h[(tile * kRowTile + q) * H + o] = relu(acc[q] + b[o]);
            }
            sync();
        } else {  // h = relu(h W_r^T + x W_n^T + b), R rows at a time through s
            for (int r0 = 0; r0 < cnt; r0 += R) {
                const int rows_now = cnt - r0 < R ? cnt - r0 : R;
                const int tiles = (rows_now + kRowTile - 1) / kRowTile;
                for (int e = thread; e < tiles * H; e += threads) {
                    const int tile = e / H, o = e - tile * H;
                    int at[kRowTile];
                    for (int q = 0; q < kRowTile; ++q) {
                        const int ii = tile * kRowTile + q;
                        at[q] = (r0 + (ii < rows_now ? ii : rows_now - 1)) * H;
                    }
                    float acc[kRowTile] = {};
                    for (int f = 0; f < H; ++f) {
                        const float* wf = w + f * PD;
                        const float wr = wf[o], wn = wf[H + o];
#pragma unroll
                        for (int q = 0; q < kRowTile; ++q) acc[q] += h[at[q] + f] * wr + x[at[q] + f] * wn;
                    }
                    for (int q = 0; q < kRowTile; ++q)
                        if (tile * kRowTile + q < rows_now) s[(tile * kRowTile + q) * H + o] = acc[q] + b[o];
                }
                sync();
                for (int e = thread; e < rows_now * H; e += threads) h[r0 * H + e] = relu(s[e]);
                sync();
            }
        }
    }

    // 4. readout: the target's row, then each pool over the rows (the rows past cnt are 0, as the
    // specification's mask leaves them: a max over K rows includes one when cnt < K)
    float* emb = a.out + static_cast<long long>(a.B) * C + 5LL * a.B + static_cast<long long>(block) * E;
    for (int f = thread; f < H; f += threads) {
        r[f] = h[f];
        int at = 1;
        for (int k = 0; k < 2; ++k) {
            const int kind = k == 0 ? a.pool0 : a.pool1;
            if (kind == kNoPool) continue;
            float v;
            if (kind == kMean) {
                v = 0.f;
                for (int i = 0; i < cnt; ++i) v += h[i * H + f];
                v = v / static_cast<float>(cnt > 1 ? cnt : 1);
            } else {
                v = cnt < K ? 0.f : neg_inf();
                for (int i = 0; i < cnt; ++i) v = max_nan(v, h[i * H + f]);
            }
            r[at * H + f] = v;
            ++at;
        }
        if (a.want_emb)
            for (int j = 0; j < at; ++j) emb[j * H + f] = r[j * H + f];
    }
    sync();
    for (int c = thread; c < C; c += threads) {
        float acc = 0.f;
        for (int j = 0; j < E; ++j) acc += r[j] * a.wc[static_cast<long long>(j) * C + c];
        z[c] = acc + a.bc[c];
    }
    sync();

    // 5. softmax, arg-max as torch's (the first of equal maxima; a NaN above every number), the counts
    if (thread == 0) {
        float m = neg_inf();
        for (int c = 0; c < C; ++c) m = max_nan(m, z[c]);
        float sum = 0.f;
        for (int c = 0; c < C; ++c) sum += exp_(z[c] - m);
        float best = 0.f;
        int arg = 0;
        for (int c = 0; c < C; ++c) {
            const float pc = exp_(z[c] - m) / sum;
            a.out[static_cast<long long>(block) * C + c] = pc;
            if (c == 0 || (best == best && (pc != pc || pc > best))) {
                best = pc;
                arg = c;
            }
        }
        long long total = 0;
        for (int i = 0; i < cnt; ++i) total += deg[i];
        const long long base = static_cast<long long>(a.B) * C;
        a.out[base + block] = static_cast<float>(arg);
        const long long kept_edges = static_cast<long long>(koff[K]) * a.layers;
        kdev::store_f64_words(a.out + base + a.B + 2LL * block, static_cast<double>(kept_edges));
        kdev::store_f64_words(a.out + base + 3LL * a.B + 2LL * block, static_cast<double>(total * a.layers));
    }
}

#if KDEV_CUDA
struct BlockSync {
    __device__ void operator()() const { __syncthreads(); }
};
#endif

}  // namespace shadow_block

#if KDEV_CUDA
// Held to 64 registers (4 blocks of 256 threads per SM; without the bound ptxas chose 48 and spilled).
// Launch: one block per target (B blocks), blockDim.x threads (any count; 256 by the launcher), dynamic
// shared memory shadow_block::shared_bytes(K, H, C, E, cap, scratch); scratch >= 1 for GraphSAGE.
extern "C" __global__ void __launch_bounds__(256, 4) shadow_block_kernel(
    const long long* __restrict__ ids, const long long* __restrict__ lptr, const long long* __restrict__ lnodes,
    const long long* __restrict__ eptr, const int* __restrict__ src, const int* __restrict__ dst,
    const float* __restrict__ ew, const float* __restrict__ p, const float* __restrict__ wt,
    const float* __restrict__ bias, const float* __restrict__ wc, const float* __restrict__ bc,
    float* __restrict__ out, int B, int K, int width, int fastrand, int gcn, int layers, int H, int C, int pool0,
    int pool1, int cap, int want_emb, int scratch) {
    extern __shared__ __align__(16) unsigned char smem[];
    const shadow_block::Args a{ids, lptr, lnodes, eptr, src, dst, ew, p, wt, bias, wc, bc, out,
                               B, K, width, fastrand, gcn, layers, H, C, pool0, pool1, cap, want_emb, scratch};
    shadow_block::run_thread(a, blockIdx.x, threadIdx.x, blockDim.x, smem, shadow_block::BlockSync{});
}
#endif
