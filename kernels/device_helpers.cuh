// What the one-launch kernels (shadow_block.cu, resident_head.cu) share: the CUDA / host switch, so that
// their thread code also compiles as plain C++ for the tests' host emulations, and the few device
// intrinsics they use with a host twin of each.
//
// NVRTC compiles a kernel from one string without include paths: kernels/resident_head.py puts this file's
// text in front of the kernel's (which also keys CuPy's cache on it). nvcc and the host builds reach it
// through the kernel's own #include, which that text's KDEV_HELPERS guard skips under NVRTC.

#ifndef KDEV_HELPERS
#define KDEV_HELPERS 1

// KDEV_CUDA: a CUDA compiler builds this (NVRTC, or nvcc's device and host passes): kernels define their
// __global__ entry only then. KDEV_DEVICE: this pass generates device code (NVRTC, nvcc's device pass): the
// helpers below take the intrinsic there and the host twin otherwise (nvcc's host pass and the plain C++
// of the host emulations), so `nvcc -c` builds the file too.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KDEV_CUDA 1
#else
#define KDEV_CUDA 0
#define __host__
#define __device__
#endif
#if defined(__CUDA_ARCH__)
#define KDEV_DEVICE 1
#else
#define KDEV_DEVICE 0
#endif
#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstring>
#endif

namespace kdev {

__host__ __device__ inline float exp_(float v) {
#if KDEV_DEVICE
    return expf(v);
#else
    return std::exp(v);
#endif
}

__host__ __device__ inline float rsqrt_(float v) {
#if KDEV_DEVICE
    return rsqrtf(v);
#else
    return 1.0f / std::sqrt(v);
#endif
}

__host__ __device__ inline float max_(float a, float b) {
#if KDEV_DEVICE
    return fmaxf(a, b);
#else
    return std::fmax(a, b);
#endif
}

__host__ __device__ inline float neg_inf() {
#if KDEV_DEVICE
    return __int_as_float(0xff800000);
#else
    return -INFINITY;
#endif
}

__host__ __device__ inline float nan_() {
#if KDEV_DEVICE
    return __int_as_float(0x7fc00000);
#else
    return NAN;
#endif
}

__host__ __device__ inline unsigned long long double_bits(double v) {
#if KDEV_DEVICE
    return static_cast<unsigned long long>(__double_as_longlong(v));
#else
    unsigned long long u;
    std::memcpy(&u, &v, sizeof u);
    return u;
#endif
}

// A float whose bits are u (a word of a float64 count, written into the float32 answers).
__host__ __device__ inline float bits_float(unsigned u) {
#if KDEV_DEVICE
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

// The two float32 words of a count as float64 bits (little-endian, as float64.view(float32) packs them).
__host__ __device__ inline void store_f64_words(float* at, double v) {
    const unsigned long long bits = double_bits(v);
    at[0] = bits_float(static_cast<unsigned>(bits & 0xffffffffu));
    at[1] = bits_float(static_cast<unsigned>(bits >> 32));
}

}  // namespace kdev

#endif  // KDEV_HELPERS
