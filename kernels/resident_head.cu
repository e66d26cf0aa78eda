// The last layer of a resident plain 2-layer GCN / GraphSAGE in one launch: one block per target.
//
// Specification (its torch twin): kernels.resident.ResidentPlain.forward followed by .pack -- the
// width's kept edges of the target (crow/col/coef/k of a WidthCSR) aggregated from the first-layer
// table h, the classifier, bias, softmax and arg-max, written into the packed float32 layout the host
// unpacks (ResidentPlain.unpack_host):
//
//   [B * C probabilities][B labels as floats][2 * B kept counts as float64 bits, if kept2][B * H rows of h, if want_emb]
//
// gcn:  z_t = (g_t^2 h_t + sum_q coef_q h_{col_q}) W^T + b    (dinv = g, w_agg = W^T, w_self = nullptr)
// sage: z_t = h_t W_r^T + (sum_q coef_q h_{col_q}) W_n^T + b  (dinv = nullptr, w_agg = W_n^T, w_self = W_r^T)
//
// Layout of the work. The block's warps take the target's kept edges round robin (edge q to warp
// q mod W); each warp adds coef_q * h[col_q] into its own row of shared partial sums, its lanes over the
// features (coalesced loads of one row of h per edge, the edge's column and coefficient broadcast). The
// partial rows are summed in warp order (deterministic), the classifier takes one thread per class,
// and warp 0 does the softmax and the arg-max (the first of equal probabilities, as torch's argmax).
//
// ids and out may be host memory mapped into the device's address space (the host then reads the
// answers without a copy); the kernel only needs them readable / writable from the device.
//
// The thread body is __host__ __device__ and takes __syncthreads and the warp's __shfl_xor_sync as
// functors, so tests run this exact code on the CPU with one coroutine per thread
// (tests/resident_head_host_harness.cpp). NVRTC (CuPy) compiles it after the text
// of device_helpers.cuh, which nvcc and the host builds reach through the #include below.

#ifndef KDEV_HELPERS  // NVRTC gets device_helpers.cuh's text in front of this file's (kernels/resident_head.py)
#include "device_helpers.cuh"
#endif

namespace rhead {

struct Args {
    const long long* ids;    // [B] the targets' rows
    const float* h;          // [N, H] relu(layer 1) of every node at this width
    const long long* crow;   // [N + 1] row t's kept edges are crow[t] .. crow[t] + k[t] - 1
    const long long* col;    // [K + 1]
    const float* coef;       // [K + 1]
    const long long* k;      // [N]
    const float* dinv;       // [N] GCN's D^{-1/2}, or nullptr (GraphSAGE)
    const long long* kept2;  // [N] 2-layer kept edge counts, or nullptr (not packed)
    const float* w_agg;      // [H, C] applied to the aggregate
    const float* w_self;     // [H, C] applied to h_t (GraphSAGE), or nullptr
    const float* bias;       // [C]
    float* out;              // the packed answers
    int B, H, C, want_emb;
};

using kdev::exp_;
using kdev::max_;
using kdev::neg_inf;

// Everything thread `thread` of block `i` does. sync(): the block's barrier; shfl(v, o): the value of v in
// the lane `lane ^ o` of the calling warp (warp 0 alone calls it, all its 32 lanes together). The loops
// strided by the block's threads are not unrolled: the code the kernel had when it read blockDim.x itself,
// as measured on the H200 (2026-11-26).
template <typename Sync, typename Shfl>
__host__ __device__ void run_thread(const Args& a, int i, int thread, int threads, float* sm, const Sync& sync,
                                    const Shfl& shfl) {
    const int B = a.B, H = a.H, C = a.C;
    const int warps = threads >> 5;
    const int warp = thread >> 5;
    const int lane = thread & 31;
    float* part = sm;                    // [warps][H]
    float* agg = part + warps * H;       // [H]
    float* z = agg + H;                  // [C]
    const long long t = a.ids[i];
    const long long start = a.crow[t];
    const long long kt = a.k[t];

#pragma unroll 1
    for (int f = thread; f < warps * H; f += threads) part[f] = 0.f;
    sync();
    float* mine = part + warp * H;
    long long q = warp;
    // two edges per step: their loads are in flight together
    for (; q + warps < kt; q += 2 * warps) {
        const long long e0 = start + q, e1 = e0 + warps;
        const float c0 = a.coef[e0], c1 = a.coef[e1];
        const float* h0 = a.h + a.col[e0] * (long long)H;
        const float* h1 = a.h + a.col[e1] * (long long)H;
        for (int f = lane; f < H; f += 32) {
            const float x0 = h0[f], x1 = h1[f];
            mine[f] += c0 * x0;
            mine[f] += c1 * x1;
        }
    }
    if (q < kt) {
        const long long e = start + q;
        const float c0 = a.coef[e];
        const float* h0 = a.h + a.col[e] * (long long)H;
        for (int f = lane; f < H; f += 32) mine[f] += c0 * h0[f];
    }
    sync();

    const float* ht = a.h + t * (long long)H;
    const float g2 = a.dinv != nullptr ? a.dinv[t] * a.dinv[t] : 0.f;
    const long long emb_at = (long long)B * C + B + (a.kept2 != nullptr ? 2LL * B : 0LL) + (long long)i * H;
#pragma unroll 1
    for (int f = thread; f < H; f += threads) {
        float s = 0.f;
        for (int w = 0; w < warps; ++w) s += part[w * H + f];
        const float x = ht[f];
        agg[f] = a.dinv != nullptr ? g2 * x + s : s;
        if (a.want_emb) a.out[emb_at + f] = x;
    }
    sync();

#pragma unroll 1
    for (int c = thread; c < C; c += threads) {
        float s = 0.f;
        for (int f = 0; f < H; ++f) s += agg[f] * a.w_agg[(long long)f * C + c];
        if (a.w_self != nullptr) {
            float r = 0.f;
            for (int f = 0; f < H; ++f) r += ht[f] * a.w_self[(long long)f * C + c];
            s = r + s;
        }
        z[c] = s + a.bias[c];
    }
    sync();

    if (warp == 0) {
        float m = neg_inf();
        for (int c = lane; c < C; c += 32) m = max_(m, z[c]);
        for (int o = 16; o > 0; o >>= 1) m = max_(m, shfl(m, o));
        float s = 0.f;
        for (int c = lane; c < C; c += 32) s += exp_(z[c] - m);
        for (int o = 16; o > 0; o >>= 1) s += shfl(s, o);
        // arg-max as torch's: the first of equal maxima, and a NaN above every number (the first NaN)
        float best = -1.f;
        int arg = C;
        for (int c = lane; c < C; c += 32) {
            const float p = exp_(z[c] - m) / s;
            a.out[(long long)i * C + c] = p;
            // lanes walk their classes upwards: a later equal never replaces
            if ((p != p && best == best) || p > best) { best = p; arg = c; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = shfl(best, o);
            const int oa = shfl(arg, o);
            const bool o_nan = ob != ob, b_nan = best != best;
            const bool take = o_nan != b_nan ? o_nan : (o_nan ? oa < arg : (ob > best || (ob == best && oa < arg)));
            if (take) { best = ob; arg = oa; }
        }
        if (lane == 0) {
            a.out[(long long)B * C + i] = (float)arg;
            if (a.kept2 != nullptr) {
                kdev::store_f64_words(a.out + (long long)B * C + B + 2LL * i, (double)a.kept2[t]);
            }
        }
    }
}

#if KDEV_CUDA
struct BlockSync {
    __device__ void operator()() const { __syncthreads(); }
};
struct WarpShfl {
    __device__ float operator()(float v, int o) const { return __shfl_xor_sync(0xffffffffu, v, o); }
    __device__ int operator()(int v, int o) const { return __shfl_xor_sync(0xffffffffu, v, o); }
};
#endif

}  // namespace rhead

#if KDEV_CUDA
extern "C" __global__ void resident_head(
    const long long* __restrict__ ids,    // [B] the targets' rows
    const float* __restrict__ h,          // [N, H] relu(layer 1) of every node at this width
    const long long* __restrict__ crow,   // [N + 1] row t's kept edges are crow[t] .. crow[t] + k[t] - 1
    const long long* __restrict__ col,    // [K + 1]
    const float* __restrict__ coef,       // [K + 1]
    const long long* __restrict__ k,      // [N]
    const float* __restrict__ dinv,       // [N] GCN's D^{-1/2}, or nullptr (GraphSAGE)
    const long long* __restrict__ kept2,  // [N] 2-layer kept edge counts, or nullptr (not packed)
    const float* __restrict__ w_agg,      // [H, C] applied to the aggregate
    const float* __restrict__ w_self,     // [H, C] applied to h_t (GraphSAGE), or nullptr
    const float* __restrict__ bias,       // [C]
    float* __restrict__ out,              // the packed answers
    int B, int H, int C, int want_emb)
{
    extern __shared__ float sm[];
    const rhead::Args a{ids, h, crow, col, coef, k, dinv, kept2, w_agg, w_self, bias, out, B, H, C, want_emb};
    rhead::run_thread(a, blockIdx.x, threadIdx.x, blockDim.x, sm, rhead::BlockSync{}, rhead::WarpShfl{});
}
#endif
