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
    const int warps = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    float* part = sm;                    // [warps][H]
    float* agg = part + warps * H;       // [H]
    float* z = agg + H;                  // [C]
    const int i = blockIdx.x;
    const long long t = ids[i];
    const long long start = crow[t];
    const long long kt = k[t];

    for (int f = threadIdx.x; f < warps * H; f += blockDim.x) part[f] = 0.f;
    __syncthreads();
    float* mine = part + warp * H;
    long long q = warp;
    // two edges per step: their loads are in flight together
    for (; q + warps < kt; q += 2 * warps) {
        const long long e0 = start + q, e1 = e0 + warps;
        const float c0 = coef[e0], c1 = coef[e1];
        const float* h0 = h + col[e0] * (long long)H;
        const float* h1 = h + col[e1] * (long long)H;
        for (int f = lane; f < H; f += 32) {
            const float a = h0[f], b = h1[f];
            mine[f] += c0 * a;
            mine[f] += c1 * b;
        }
    }
    if (q < kt) {
        const long long e = start + q;
        const float c0 = coef[e];
        const float* h0 = h + col[e] * (long long)H;
        for (int f = lane; f < H; f += 32) mine[f] += c0 * h0[f];
    }
    __syncthreads();

    const float* ht = h + t * (long long)H;
    const float g2 = dinv != nullptr ? dinv[t] * dinv[t] : 0.f;
    const long long emb_at = (long long)B * C + B + (kept2 != nullptr ? 2LL * B : 0LL) + (long long)i * H;
    for (int f = threadIdx.x; f < H; f += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < warps; ++w) s += part[w * H + f];
        const float x = ht[f];
        agg[f] = dinv != nullptr ? g2 * x + s : s;
        if (want_emb) out[emb_at + f] = x;
    }
    __syncthreads();

    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int f = 0; f < H; ++f) s += agg[f] * w_agg[(long long)f * C + c];
        if (w_self != nullptr) {
            float r = 0.f;
            for (int f = 0; f < H; ++f) r += ht[f] * w_self[(long long)f * C + c];
            s = r + s;
        }
        z[c] = s + bias[c];
    }
    __syncthreads();

    if (warp == 0) {
        float m = __int_as_float(0xff800000);  // -inf
        for (int c = lane; c < C; c += 32) m = fmaxf(m, z[c]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.f;
        for (int c = lane; c < C; c += 32) s += expf(z[c] - m);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        // arg-max as torch's: the first of equal maxima, and a NaN above every number (the first NaN)
        float best = -1.f;
        int arg = C;
        for (int c = lane; c < C; c += 32) {
            const float p = expf(z[c] - m) / s;
            out[(long long)i * C + c] = p;
            // lanes walk their classes upwards: a later equal never replaces
            if ((p != p && best == best) || p > best) { best = p; arg = c; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
            const bool o_nan = ob != ob, b_nan = best != best;
            const bool take = o_nan != b_nan ? o_nan : (o_nan ? oa < arg : (ob > best || (ob == best && oa < arg)));
            if (take) { best = ob; arg = oa; }
        }
        if (lane == 0) {
            out[(long long)B * C + i] = (float)arg;
            if (kept2 != nullptr) {
                const unsigned long long bits = (unsigned long long)__double_as_longlong((double)kept2[t]);
                unsigned int* words = reinterpret_cast<unsigned int*>(out + (long long)B * C + B + 2LL * i);
                words[0] = (unsigned int)(bits & 0xffffffffu);  // little-endian, as float64.view(float32)
                words[1] = (unsigned int)(bits >> 32);
            }
        }
    }
}
