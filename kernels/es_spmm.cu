// ES-SpMM: sparse-dense aggregation with deterministic per-row edge sampling (CUDA).
//
// The specification is kernels/spmm.py (module docstring); this kernel follows its formulas:
//
//   row i has d_i edges at positions 0 .. d_i-1 of its CSR slice; with sampling width S > 0 and
//   d_i > S it keeps k_i = S edges at positions p_i(t), t = 0 .. k_i-1, otherwise all of them
//   (k_i = d_i, p(t) = t):
//     bucket:   p(t) = t
//     fastrand: p(t) = ((t * 577) mod d_i + t / m_i) mod d_i,  m_i = d_i / gcd(577, d_i)
//   coefficient of a kept edge (i, j) with weight w_ij (1 when unweighted):
//     sum:  w_ij * d_i / k_i
//     mean: w_ij / k_i
//     gcn:  w_ij * d_i / k_i * dinv_i * dinv_j,  plus the self term dinv_i^2 * x_i
//   out_i = sum over kept edges of coefficient * x_j; rows with no edges give zeros (gcn: self term).
//
// Shapes: indptr int64 [N + 1]; indices I [E] (int or long long); weights float32 [E] (or unused);
// x T [N, F] row-major contiguous; dinv A [N] (gcn only); out O [N, F] row-major contiguous.
//
// Value types. T is float, double, or a 16-bit storage type: half_t (IEEE binary16) or bf16_t
// (bfloat16), both held as their bit patterns. Arithmetic runs in A = Acc<T>: T itself for float
// and double, float for the 16-bit types (fp32 accumulation; coefficients, dinv and the shared-memory
// stage are float). Every element of x is widened to A when read; a stored output is rounded once,
// to nearest even, into O = T, except for launches that split rows (SPLIT = true), whose chunks add
// into a float output (O = A: atomic adds of 16-bit partial sums would round every add; the launcher
// narrows that output to T afterwards, also to nearest even).
//
// Work layout ("cache-first", Lin, Luo and Ceze): one thread group of G lanes (G a power of two,
// 4..32, inside one warp) per work item; lanes split the feature columns, each lane owning CPT
// columns of a pass, and an item takes ceil(F / (G * CPT)) passes. Columns of a lane:
//   scalar (VEC = false): f0 + lane + c * G, c < CPT (a warp-wide load per c, coalesced);
//   vector (VEC = true):  V consecutive columns f0 + (lane + j * G) * V + e, j < CPT / V, e < V, with
//                         V = 16 / sizeof(T) (float4 / double2: one 128-bit load per j); needs F % V == 0
//                         and x 16-byte aligned, so that every row of x starts on a 16-byte boundary.
// The kept (column, coefficient) pairs of an item are staged in shared memory, `tile` entries at a
// time; with a sampling width S <= tile (the normal case: the host picks tile = S) the whole sample of
// a row is staged once and every pass reads it from shared memory. Exact mode (S = 0) and S > tile
// stream the item through shared memory tile by tile. Lanes of a group synchronise with
// __syncwarp(group mask).
//
// Work items. Without a schedule (work_row == nullptr) item r is row r, whole, in index order. With
// one (built once per graph and width by kernels/spmm_cuda.py), item i is (work_row[i], work_chunk[i]):
// a row whose kept count k exceeds split_edges is cut into ceil(k / split_edges) chunks, chunk c
// covering kept positions [c * split_edges, min(k, (c + 1) * split_edges)), each its own item, so no
// group walks more than split_edges edges; the host puts these chunks first and the whole rows after
// them, longest first. Chunks of a row add their partial sums into `out` with atomicAdd (the host
// zeroes `out` first); the row factor (mean's 1/k, the sampled d/k, gcn's dinv_i) is part of every
// coefficient, so partial sums merge by plain addition, and chunk 0 alone adds gcn's self term.
// Rows that are not split are stored, never read.
//
// The item body is __host__ __device__ and takes its synchronisation as a functor, so the tests can
// run this exact code on the CPU with one coroutine per lane (tests/es_spmm_host_harness.cpp); there
// atomicAdd is a plain add (one lane runs at a time) and 128-bit loads are element loads with an
// alignment check. No #include: the file is compiled by NVRTC (CuPy RawModule) and by nvcc, and as
// plain C++ (the host emulation), where the CUDA qualifiers are defined away and the kernel itself is
// left out.

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ES_SPMM_CUDA 1
#else
#define ES_SPMM_CUDA 0
#define __host__
#define __device__
#endif

// Host-emulation hooks (tests/es_spmm_host_harness.cpp defines them before including this file).
#ifndef ES_SPMM_HOST_CHECK_ALIGN16
#define ES_SPMM_HOST_CHECK_ALIGN16(p) ((void)(p))
#endif
#ifndef ES_SPMM_HOST_ATOMIC_ADD
#define ES_SPMM_HOST_ATOMIC_ADD(p, v) (*(p) += (v))
#endif

// Tuning knobs, compile-time (kernels/spmm_cuda.py COMPILE_DEFINES sets them for benchmarks; the defaults
// are what the launcher ships): the edges a lane's 128-bit gather loop unrolls when a lane owns two or
// more vectors (F >= 256 float32), and the blocks per SM that split (and double) instances are held to.
#ifndef ES_SPMM_VEC_UNROLL
#define ES_SPMM_VEC_UNROLL 2
#endif
#ifndef ES_SPMM_SPLIT_MIN_BLOCKS
#define ES_SPMM_SPLIT_MIN_BLOCKS 3
#endif

namespace es_spmm {

enum Strategy : int { kFastrand = 0, kBucket = 1 };
enum Aggregator : int { kSum = 0, kMean = 1, kGcn = 2 };

constexpr long long kPrime = 577;
constexpr int kWarp = 32;

// ----------------------------------------------------------------------------- value types
// 16-bit storage types: the bit pattern only; arithmetic happens in float (Acc).
struct half_t {
    unsigned short bits;
};
struct bf16_t {
    unsigned short bits;
};

template <typename T>
struct Acc {
    using type = T;  // float, double: computed in their own type
};
template <>
struct Acc<half_t> {
    using type = float;
};
template <>
struct Acc<bf16_t> {
    using type = float;
};

// The output's element type: T, or A for a launch whose split rows add into out.
template <typename T, bool SPLIT>
struct Out {
    using type = typename Acc<T>::type;
};
template <typename T>
struct Out<T, false> {
    using type = T;
};

__host__ __device__ inline unsigned float_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    unsigned u;
    __builtin_memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

__host__ __device__ inline float bits_float(unsigned u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

// bfloat16 <-> float: the high half of a float; rounding to nearest even, NaN kept a (quiet) NaN.
__host__ __device__ inline float bf16_to_float(unsigned short h) {
    return bits_float(static_cast<unsigned>(h) << 16);
}

__host__ __device__ inline unsigned short float_to_bf16(float f) {
    const unsigned u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
    return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// IEEE binary16 <-> float. The device uses the hardware conversions (cvt, round to nearest even);
// the host build computes the same results in integer arithmetic. (These four conversions test
// __CUDA_ARCH__, not ES_SPMM_CUDA: nvcc's host pass compiles __host__ __device__ code too.)
__host__ __device__ inline float half_to_float(unsigned short h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    const unsigned sign = static_cast<unsigned>(h & 0x8000u) << 16;
    const unsigned exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
        const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
        return bits_float(float_bits(v) | sign);
    }
    if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));  // inf, NaN
    return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

__host__ __device__ inline unsigned short float_to_half(float f) {
#ifdef __CUDA_ARCH__
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    const unsigned u = float_bits(f);
    const unsigned sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<unsigned short>(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return static_cast<unsigned short>(sign | 0x7c00u);  // >= 65520 rounds to inf
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), round(|f| * 2^24)
        const unsigned e = a >> 23;
        if (e < 102u) return static_cast<unsigned short>(sign);  // below 2^-25: rounds to zero
        const unsigned mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;  // 14 <= shift <= 24
        unsigned m = mant >> shift;
        const unsigned rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (m & 1u))) ++m;
        return static_cast<unsigned short>(sign | m);
    }
    unsigned base = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
    const unsigned rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (base & 1u))) ++base;  // a carry moves into the exponent
    return static_cast<unsigned short>(sign | base);
#endif
}

// Read an element as its accumulation type; store an accumulated value as an element (rounded).
__host__ __device__ inline float widen(float v) { return v; }
__host__ __device__ inline double widen(double v) { return v; }
__host__ __device__ inline float widen(half_t v) { return half_to_float(v.bits); }
__host__ __device__ inline float widen(bf16_t v) { return bf16_to_float(v.bits); }

template <typename T>
struct Narrow {
    __host__ __device__ static T from(T v) { return v; }
};
template <>
struct Narrow<half_t> {
    __host__ __device__ static half_t from(float v) {
        half_t r;
        r.bits = float_to_half(v);
        return r;
    }
};
template <>
struct Narrow<bf16_t> {
    __host__ __device__ static bf16_t from(float v) {
        bf16_t r;
        r.bits = float_to_bf16(v);
        return r;
    }
};

template <typename O>
__host__ __device__ inline O narrow(typename Acc<O>::type v) {
    return Narrow<O>::from(v);
}

template <typename T, typename I, typename O>
struct Args {
    using A = typename Acc<T>::type;
    const long long* indptr;  // [N + 1]
    const I* indices;         // [E]
    const float* weights;     // [E] or nullptr (unweighted)
    const T* x;               // [N, F]
    const A* dinv;            // [N] (gcn) or nullptr
    O* out;                   // [N, F]: Out<T, SPLIT>
    const long long* work_row;  // [num_items] or nullptr (item r = row r)
    const int* work_chunk;      // [num_items] or nullptr (chunk of the item's row)
    long long num_items;        // N without a schedule
    long long split_edges;      // rows with more kept edges are cut into chunks of this many; 0 = never
    long long num_rows;       // N
    long long num_features;   // F
    long long width;          // S, 0 = exact
    int strategy;             // Strategy
    int aggregator;           // Aggregator
    int group_size;           // G: lanes per row, power of two in [1, 32]
    int tile;                 // shared-memory entries per row and stage
};

// Position of the t-th kept edge of a sampled fastrand row with d edges (0 <= t < S < d).
__host__ __device__ inline long long fastrand_position(long long t, long long d) {
    const long long m = (d % kPrime == 0) ? d / kPrime : d;  // d / gcd(577, d); 577 is prime
    if (d <= 7443000LL) {
        // t < d, so t * 577 < 2^32: 32-bit unsigned arithmetic is exact and much cheaper
        const unsigned ut = static_cast<unsigned>(t), ud = static_cast<unsigned>(d);
        const unsigned um = static_cast<unsigned>(m);
        return static_cast<long long>(((ut * 577u) % ud + ut / um) % ud);
    }
    // general case: t * 577 < 2^63 for every realistic t (t < S <= 2^31)
    return ((t * kPrime) % d + t / m) % d;
}

// Lane coordinates of one thread of a block of `block_threads` threads (a multiple of 32).
struct GroupCoords {
    int lane;              // lane inside the row group, 0 .. G-1
    int group;             // group index inside the block
    int groups_per_block;  // rows a block works on at a time
    unsigned mask;         // the group's lanes inside its warp (for __syncwarp)
};

__host__ __device__ inline GroupCoords group_coords(int thread, int block_threads, int group_size) {
    GroupCoords c;
    const int lane_in_warp = thread % kWarp;
    const int warp = thread / kWarp;
    const int groups_per_warp = kWarp / group_size;
    const int sub = lane_in_warp / group_size;
    c.lane = lane_in_warp % group_size;
    c.group = warp * groups_per_warp + sub;
    c.groups_per_block = (block_threads / kWarp) * groups_per_warp;
    c.mask = group_size == kWarp ? 0xffffffffu : (((1u << group_size) - 1u) << (sub * group_size));
    return c;
}

// Dynamic shared memory layout, shared by kernel and host (the Python side computes the same size):
// [groups_per_block * (tile + 1)] coefficients of type A (Acc<T>), padded to 16 bytes, then as many indices.
// The "+ 1" staggers the rows of neighbouring groups across shared-memory banks.
__host__ __device__ inline long long smem_value_bytes(int groups_per_block, int tile, int value_size) {
    const long long b = static_cast<long long>(groups_per_block) * (tile + 1) * value_size;
    return (b + 15) / 16 * 16;
}

// ----------------------------------------------------------------------------- 128-bit accesses
// V = 16 / sizeof(T) elements per access (4 float, 2 double, 8 half_t / bf16_t). The device build
// uses float4 / double2 / uint4; the host build reads element by element and checks the 16-byte
// alignment a vector access needs. Loads widen to A, stores narrow from it.
template <typename T>
struct Vec {
    static constexpr int kWidth = 16 / static_cast<int>(sizeof(T));
};

template <typename T>
__host__ __device__ inline void load16(const T* p, typename Acc<T>::type (&r)[Vec<T>::kWidth]) {
#if ES_SPMM_CUDA
    if constexpr (sizeof(T) == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
    } else if constexpr (sizeof(T) == 8) {
        const double2 v = *reinterpret_cast<const double2*>(p);
        r[0] = v.x; r[1] = v.y;
    } else {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // little endian: element 2i is the low half of word i
            T lo, hi;
            lo.bits = static_cast<unsigned short>(w[i] & 0xffffu);
            hi.bits = static_cast<unsigned short>(w[i] >> 16);
            r[2 * i] = widen(lo);
            r[2 * i + 1] = widen(hi);
        }
    }
#else
    ES_SPMM_HOST_CHECK_ALIGN16(p);
    for (int e = 0; e < Vec<T>::kWidth; ++e) r[e] = widen(p[e]);
#endif
}

template <typename T>
__host__ __device__ inline void store16(T* p, const typename Acc<T>::type (&r)[Vec<T>::kWidth]) {
#if ES_SPMM_CUDA
    if constexpr (sizeof(T) == 4) {
        float4 v;
        v.x = r[0]; v.y = r[1]; v.z = r[2]; v.w = r[3];
        *reinterpret_cast<float4*>(p) = v;
    } else if constexpr (sizeof(T) == 8) {
        double2 v;
        v.x = r[0]; v.y = r[1];
        *reinterpret_cast<double2*>(p) = v;
    } else {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = static_cast<unsigned>(narrow<T>(r[2 * i]).bits) |
                   (static_cast<unsigned>(narrow<T>(r[2 * i + 1]).bits) << 16);
        }
        uint4 v;
        v.x = w[0]; v.y = w[1]; v.z = w[2]; v.w = w[3];
        *reinterpret_cast<uint4*>(p) = v;
    }
#else
    ES_SPMM_HOST_CHECK_ALIGN16(p);
    for (int e = 0; e < Vec<T>::kWidth; ++e) p[e] = narrow<T>(r[e]);
#endif
}

template <typename A>
__host__ __device__ inline void atomic_add(A* p, A v) {
#if ES_SPMM_CUDA
    atomicAdd(p, v);
#else
    ES_SPMM_HOST_ATOMIC_ADD(p, v);
#endif
}

// Column of accumulator c of this lane, relative to the pass start f0 (see "Columns of a lane").
template <typename T, int CPT, bool VEC>
__host__ __device__ inline long long lane_column(int lane, int G, int c) {
    if constexpr (VEC) {
        constexpr int V = Vec<T>::kWidth;
        return (static_cast<long long>(lane) + static_cast<long long>(c / V) * G) * V + c % V;
    } else {
        return static_cast<long long>(lane) + static_cast<long long>(c) * G;
    }
}

// acc[c] += sum_s sh_val[s] * x[sh_col[s], f0 + lane_column(c)] over the n staged entries.
template <typename T, typename I, int CPT, bool VEC>
__host__ __device__ inline void accumulate_tile(const T* __restrict__ x, long long F, long long f0, int lane,
                                                int G, const typename Acc<T>::type* sh_val, const I* sh_col, int n,
                                                typename Acc<T>::type (&acc)[CPT]) {
    using A = typename Acc<T>::type;
    if constexpr (VEC) {
        constexpr int V = Vec<T>::kWidth;
        constexpr int NV = CPT / V;  // 128-bit loads per edge and lane
        static_assert(NV * V == CPT, "vector layout needs CPT to be a multiple of the vector width");
        const T* __restrict__ xl = x + f0 + static_cast<long long>(lane) * V;
        // F % V == 0, so each of the lane's vectors is wholly inside or wholly past the row's end
        const long long rest = F - f0 - static_cast<long long>(lane) * V;
        const int valid = rest <= 0 ? 0 : static_cast<int>(rest >= static_cast<long long>(NV) * G * V
                                                              ? NV : (rest + static_cast<long long>(G) * V - 1) / (static_cast<long long>(G) * V));
        if (valid == NV) {
            constexpr int kUnroll = NV >= 2 ? ES_SPMM_VEC_UNROLL : 4;
            (void)kUnroll;  // read only by the pragma, which plain C++ ignores
#pragma unroll kUnroll
            for (int s = 0; s < n; ++s) {
                const A v = sh_val[s];
                const T* __restrict__ xr = xl + static_cast<long long>(sh_col[s]) * F;
#pragma unroll
                for (int j = 0; j < NV; ++j) {
                    A r[V];
                    load16<T>(xr + static_cast<long long>(j) * G * V, r);
#pragma unroll
                    for (int e = 0; e < V; ++e) acc[j * V + e] += v * r[e];
                }
            }
        } else {
            for (int s = 0; s < n; ++s) {
                const A v = sh_val[s];
                const T* __restrict__ xr = xl + static_cast<long long>(sh_col[s]) * F;
#pragma unroll
                for (int j = 0; j < NV; ++j) {
                    if (j < valid) {
                        A r[V];
                        load16<T>(xr + static_cast<long long>(j) * G * V, r);
#pragma unroll
                        for (int e = 0; e < V; ++e) acc[j * V + e] += v * r[e];
                    }
                }
            }
        }
    } else {
        const T* __restrict__ xl = x + f0 + lane;  // this lane's first column of the pass, in row 0
        if (f0 + static_cast<long long>(G) * CPT <= F) {
            // full pass: every lane owns CPT valid columns, no bounds checks in the hot loop; unrolled so
            // that 8..16 independent loads of x are in flight per lane
            constexpr int kUnroll = CPT >= 4 ? 2 : 4;
            (void)kUnroll;  // read only by the pragma, which plain C++ ignores
#pragma unroll kUnroll
            for (int s = 0; s < n; ++s) {
                const A v = sh_val[s];
                const T* __restrict__ xr = xl + static_cast<long long>(sh_col[s]) * F;
#pragma unroll
                for (int c = 0; c < CPT; ++c) acc[c] += v * widen(xr[c * G]);
            }
        } else {
            const long long rest = F - f0 - lane;  // columns from this lane's first one to the end
            const int valid = rest <= 0 ? 0 : static_cast<int>(rest < static_cast<long long>(CPT - 1) * G + 1
                                                                   ? (rest + G - 1) / G : CPT);
            for (int s = 0; s < n; ++s) {
                const A v = sh_val[s];
                const T* __restrict__ xr = xl + static_cast<long long>(sh_col[s]) * F;
#pragma unroll
                for (int c = 0; c < CPT; ++c) {
                    if (c < valid) acc[c] += v * widen(xr[c * G]);
                }
            }
        }
    }
}

// One work item (a whole row, or chunk `chunk` of a split row), executed by the G lanes of its
// group. `sync` is called with the group mask wherever the group's lanes must meet (before
// overwriting and after filling the shared-memory stage).
template <typename T, typename I, int CPT, bool VEC, bool SPLIT, typename Sync>
__host__ __device__ void process_item(const Args<T, I, typename Out<T, SPLIT>::type>& a, long long row, int chunk,
                                      int lane, unsigned mask, typename Acc<T>::type* sh_val, I* sh_col,
                                      const Sync& sync) {
    using A = typename Acc<T>::type;
    using O = typename Out<T, SPLIT>::type;
    const int G = a.group_size;
    const long long F = a.num_features;
    const long long start = a.indptr[row];
    const long long d = a.indptr[row + 1] - start;
    const bool sampled = a.width > 0 && d > a.width;
    const long long k = sampled ? a.width : d;
    const bool fastrand = sampled && a.strategy == kFastrand;
    // kept positions [t_begin, t_end) of this item; a split row's chunks add into out
    const bool split = SPLIT && a.split_edges > 0 && k > a.split_edges;
    const long long t_begin = split ? static_cast<long long>(chunk) * a.split_edges : 0;
    // kept edges of this item (a chunk has at most split_edges; a whole row fewer than 2^31)
    const int m = static_cast<int>(split ? (k - t_begin < a.split_edges ? k - t_begin : a.split_edges) : k);

    // row factor of every kept coefficient (spec: scale_i, times dinv_i for gcn)
    A scale;
    if (a.aggregator == kMean) {
        scale = k > 0 ? A(1) / static_cast<A>(k) : A(0);
    } else {
        scale = sampled ? static_cast<A>(d) / static_cast<A>(k) : A(1);
    }
    // gcn's self term dinv_i^2 x_i comes once per row: with the whole row, or with chunk 0
    const bool with_self = a.aggregator == kGcn && chunk == 0;
    A self = A(0);
    if (a.aggregator == kGcn) {
        const A di = a.dinv[row];
        scale *= di;
        self = di * di;
    }

    const int n_tiles = (m + a.tile - 1) / a.tile;
    const int pass = G * CPT;
    for (long long f0 = 0; f0 < F; f0 += pass) {
        A acc[CPT];
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[c] = A(0);
        for (int tb = 0; tb < n_tiles; ++tb) {
            const int s0 = tb * a.tile;  // first entry of the stage, relative to t_begin
            const int n = m - s0 < a.tile ? m - s0 : a.tile;
            if (n_tiles > 1 || f0 == 0) {  // one tile: staged once, reused by every pass
                sync(mask);  // no lane still reads the previous stage
                for (int s = lane; s < n; s += G) {
                    const long long t = t_begin + s0 + s;
                    const long long e = start + (fastrand ? fastrand_position(t, d) : t);
                    const I col = a.indices[e];
                    A v = a.weights != nullptr ? static_cast<A>(a.weights[e]) : A(1);
                    v *= scale;
                    if (a.aggregator == kGcn) v *= a.dinv[col];
                    sh_col[s] = col;
                    sh_val[s] = v;
                }
                sync(mask);  // the stage is complete
            }
            accumulate_tile<T, I, CPT, VEC>(a.x, F, f0, lane, G, sh_val, sh_col, n, acc);
        }
        O* __restrict__ o = a.out + row * F + f0;
        const T* __restrict__ xs = a.x + row * F + f0;
        if constexpr (SPLIT) {
            if (split) {
                // partial sum of one chunk: merged into the zeroed output; chunk 0 brings the self term
#pragma unroll
                for (int c = 0; c < CPT; ++c) {
                    const long long f = lane_column<T, CPT, VEC>(lane, G, c);
                    if (f0 + f < F) atomic_add(o + f, with_self ? acc[c] + self * widen(xs[f]) : acc[c]);
                }
                continue;
            }
        }
        if constexpr (VEC && sizeof(O) == sizeof(T)) {  // O = T: the stores are 128-bit too
            constexpr int V = Vec<T>::kWidth;
#pragma unroll
            for (int j = 0; j < CPT / V; ++j) {
                const long long f = lane_column<T, CPT, VEC>(lane, G, j * V);
                if (f0 + f < F) {  // F % V == 0: the whole vector is inside the row
                    A r[V];
                    if (with_self) {
                        A xv[V];
                        load16<T>(xs + f, xv);
#pragma unroll
                        for (int e = 0; e < V; ++e) r[e] = acc[j * V + e] + self * xv[e];
                    } else {
#pragma unroll
                        for (int e = 0; e < V; ++e) r[e] = acc[j * V + e];
                    }
                    store16<T>(reinterpret_cast<T*>(o) + f, r);
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < CPT; ++c) {
                const long long f = lane_column<T, CPT, VEC>(lane, G, c);
                if (f0 + f < F) o[f] = narrow<O>(with_self ? acc[c] + self * widen(xs[f]) : acc[c]);
            }
        }
    }
}

// Everything one thread does in a launch: find its group, carve its group's stage out of the block's
// dynamic shared memory, process work items (grid-stride, so any number fits in any grid).
template <typename T, typename I, int CPT, bool VEC, bool SPLIT, typename Sync>
__host__ __device__ void run_thread(const Args<T, I, typename Out<T, SPLIT>::type>& a, long long block, long long grid,
                                    int thread, int block_threads, unsigned char* smem, const Sync& sync) {
    using A = typename Acc<T>::type;
    const GroupCoords g = group_coords(thread, block_threads, a.group_size);
    A* sh_val = reinterpret_cast<A*>(smem) + static_cast<long long>(g.group) * (a.tile + 1);
    I* sh_col = reinterpret_cast<I*>(smem + smem_value_bytes(g.groups_per_block, a.tile, sizeof(A))) +
                static_cast<long long>(g.group) * (a.tile + 1);
    for (long long item = block * g.groups_per_block + g.group; item < a.num_items;
         item += grid * g.groups_per_block) {
        long long row = item;
        int chunk = 0;
        if (SPLIT && a.work_row != nullptr) {
            row = a.work_row[item];
            chunk = a.work_chunk[item];
        }
        process_item<T, I, CPT, VEC, SPLIT>(a, row, chunk, g.lane, g.mask, sh_val, sh_col, sync);
    }
}

#if ES_SPMM_CUDA
struct WarpSync {
    __device__ void operator()(unsigned mask) const { __syncwarp(mask); }
};

// Launch with blockDim.x = a multiple of 32 (<= 256), dynamic shared memory
// smem_value_bytes(gpb, tile, sizeof(A)) + gpb * (tile + 1) * sizeof(I), gpb = groups per block.
// VEC = true needs F % (16 / sizeof(T)) == 0, x and out 16-byte aligned, CPT a multiple of
// 16 / sizeof(T). SPLIT = false: item r is row r (work_row, work_chunk and split_edges are not read),
// exactly the kernel without long-row splitting. SPLIT = true: the schedule's items; `out` (of type
// A) must be zero on entry wherever a row is split.
// Register budget: float instances without SPLIT are held to 64 registers (4 blocks of 256 threads
// per SM, as before the split existed; ptxas fits them without spills); SPLIT instances and double
// ones may take up to 85 (ES_SPMM_SPLIT_MIN_BLOCKS = 3 blocks per SM) instead of spilling.
template <typename T, typename I, int CPT, bool VEC, bool SPLIT>
__global__ void __launch_bounds__(256, (SPLIT || sizeof(T) == 8) ? ES_SPMM_SPLIT_MIN_BLOCKS : 4)
    es_spmm_kernel(const long long* __restrict__ indptr, const I* __restrict__ indices,
                   const float* __restrict__ weights, const T* __restrict__ x,
                   const typename Acc<T>::type* __restrict__ dinv, typename Out<T, SPLIT>::type* __restrict__ out,
                   const long long* __restrict__ work_row, const int* __restrict__ work_chunk,
                   long long num_items, long long split_edges, long long num_rows, long long num_features,
                   long long width, int strategy, int aggregator, int has_weights, int group_size, int tile) {
    extern __shared__ __align__(16) unsigned char smem[];
    Args<T, I, typename Out<T, SPLIT>::type> a;
    a.indptr = indptr;
    a.indices = indices;
    a.weights = has_weights ? weights : nullptr;
    a.x = x;
    a.dinv = aggregator == kGcn ? dinv : nullptr;
    a.out = out;
    a.work_row = work_row;
    a.work_chunk = work_chunk;
    a.num_items = num_items;
    a.split_edges = split_edges;
    a.num_rows = num_rows;
    a.num_features = num_features;
    a.width = width;
    a.strategy = strategy;
    a.aggregator = aggregator;
    a.group_size = group_size;
    a.tile = tile;
    run_thread<T, I, CPT, VEC, SPLIT>(a, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x, smem, WarpSync{});
}
#endif

}  // namespace es_spmm
