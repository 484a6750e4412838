// CUDA utilities shared by the kernel families (activation, MXFP8, FP8 block): 8-element vector IO (Vec8, load8,
// store8), FP8 encoding of 8 values, warp / lane-group / block amax, division by a multiply (FastDiv), register
// double buffering, cp.async copies, and the host side of a launch (check_launch, SM count, residency).
// They live in namespace te::act_cuda, where the activation kernels first defined them; the other families name
// them act_cuda::... . Nothing here knows an activation or an output format.
// Invariant: every amax here is amax_update's (NaN-ignoring, |v|), so block and warp maxima equal the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "numerics.h"
#include "scaling.h"

namespace te {
namespace act_cuda {

constexpr int kVec = 8;        // positions per thread

template <typename T> struct alignas(16) Vec8 { T e[kVec]; };

// Loads 8 consecutive raw elements (or the `n` valid ones, zero-filled): conversion to float happens at use,
// so four rows of raw vectors stay in flight with few registers.
template <typename T> __device__ __forceinline__ Vec8<T> load8(const T* ptr, bool vec, int n) {
  if (vec && n == kVec) return *reinterpret_cast<const Vec8<T>*>(ptr);
  Vec8<T> r;
#pragma unroll
  for (int k = 0; k < kVec; ++k) r.e[k] = k < n ? ptr[k] : from_float<T>(0.0f);
  return r;
}

// load8 for data read once (a streamed input): a whole aligned chunk bypasses L1 (ld.global.nc.L1::no_allocate), so
// that what every row reuses (a norm's staged gamma aside, the partial sums' lines) is not evicted by the stream.
// Only for inputs the kernel does not write.
template <typename T> __device__ __forceinline__ Vec8<T> load8_stream(const T* ptr, bool vec, int n) {
  if (!(vec && n == kVec)) return load8(ptr, vec, n);
  Vec8<T> r;
  uint4* w = reinterpret_cast<uint4*>(&r);
#pragma unroll
  for (int i = 0; i < int(sizeof(r)) / 16; ++i) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(w[i].x), "=r"(w[i].y), "=r"(w[i].z), "=r"(w[i].w)
        : "l"(reinterpret_cast<const uint4*>(ptr) + i));
  }
  return r;
}

// The bits of raw elements 2w, 2w+1 (16-bit types) or w (float) in one 32-bit word.
template <typename T> __device__ __forceinline__ uint32_t raw_word(const Vec8<T>& raw, int w) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(raw.e[w]);
  } else {
    return uint32_t(raw.e[2 * w].bits) | (uint32_t(raw.e[2 * w + 1].bits) << 16);
  }
}

// Eight values to the input dtype at a 16-byte aligned `ptr`, in 16-byte stores of packed words spelled out: in the
// gated 2-D kernel the compiler split the struct copy of store8 into four 4-byte stores per chunk. An output only:
// the asm store is not ordered against the kernel's other memory accesses.
template <typename T> __device__ __forceinline__ void store8_packed(T* ptr, const float (&v)[kVec]) {
  Vec8<T> raw;
#pragma unroll
  for (int k = 0; k < kVec; ++k) raw.e[k] = from_float<T>(v[k]);
  constexpr int kWords = int(sizeof(raw)) / 4;
#pragma unroll
  for (int w = 0; w < kWords; w += 4) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(ptr) + w / 4),
                 "r"(raw_word(raw, w)), "r"(raw_word(raw, w + 1)), "r"(raw_word(raw, w + 2)),
                 "r"(raw_word(raw, w + 3)));
  }
}

template <typename T> __device__ __forceinline__ void store8(T* ptr, bool vec, int n, const float (&v)[kVec]) {
  Vec8<T> raw;
#pragma unroll
  for (int k = 0; k < kVec; ++k) raw.e[k] = from_float<T>(v[k]);
  if (vec && n == kVec) {
    *reinterpret_cast<Vec8<T>*>(ptr) = raw;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (k < n) ptr[k] = raw.e[k];
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = amax_update(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Eight values -> eight FP8 codes (little-endian in two words). kRound: current scaling rounds each value to the
// input dtype first (fp8_scaled_value's rule with the mode fixed at compile time).
template <typename InT, bool kRound, bool kE4m3>
__device__ __forceinline__ uint2 encode8_t(const float (&v)[kVec], float scale) {
  uint32_t w[2];
#pragma unroll
  for (int k = 0; k < kVec; k += 4) {
    float s[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = (kRound ? round_to<InT>(v[k + j]) : v[k + j]) * scale;
    w[k / 4] = uint32_t(float2_to_fp8x2<kE4m3>(s[0], s[1])) | (uint32_t(float2_to_fp8x2<kE4m3>(s[2], s[3])) << 16);
  }
  return make_uint2(w[0], w[1]);
}

// Block-wide amax of a kBlock-thread block, then one atomic per block. Non-negative floats order like their bit
// patterns.
// The block's amax (amax_update over its threads' values), valid in warp 0; `red` holds kBlock / 32 floats.
template <int kBlock> __device__ __forceinline__ float block_amax_warp0(float amax, float* red) {
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  float a = 0.0f;
  if (threadIdx.x < 32) {
    a = threadIdx.x < kBlock / 32 ? red[threadIdx.x] : 0.0f;
    a = warp_max(a);
  }
  return a;
}

template <int kBlock> __device__ __forceinline__ void block_amax_to_global(float amax, float* red, float* out) {
  const float a = block_amax_warp0<kBlock>(amax, red);
  if (threadIdx.x == 0 && a > 0.0f) atomicMax(reinterpret_cast<int*>(out), __float_as_int(a));
}

// its 33rd bit; exact for n < 2^31.
struct FastDiv {
  uint32_t m_lo = 0, m_hi = 1, l = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) {
    const uint64_t d = div < 1 ? 1 : div;
    while ((uint64_t(1) << l) < d) ++l;
    const uint64_t m = ((uint64_t(1) << (32 + l)) + d - 1) / d;
    m_lo = uint32_t(m);
    m_hi = uint32_t(m >> 32);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (n * m_hi + __umulhi(n, m_lo)) >> l; }
};

// The whole steps first, first + stride, .. < full_end of a resident grid with two register sets: the next step's
// loads are in flight during this step's math (the caller has issued the first step's loads into r0).
template <class Regs, class Load, class Compute>
__device__ __forceinline__ void walk_double_buffered(uint32_t first, uint32_t full_end, uint32_t stride, Regs& r0,
                                                     Regs& r1, Load&& load, Compute&& compute) {
  for (uint32_t step = first; step < full_end; step += 2 * stride) {
    if (step + stride < full_end) load(r1, step + stride);
    compute(r0, step);
    if (step + stride >= full_end) break;
    if (step + 2 * stride < full_end) load(r0, step + 2 * stride);
    compute(r1, step + stride);
  }
}

// 16-byte asynchronous global -> shared copies (cp.async.cg on sm_80+: bypasses L1, no registers held while in
// flight; a plain synchronous copy on older archs, where commit and wait have nothing to do). With `valid` false the
// destination is zero-filled without reading global memory.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
#else
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// The two halves of an f16x2 bit pattern (the low half is element 0) as floats, exactly (sm_53+ conversions).
__device__ __forceinline__ void half2_bits_to_float2(uint32_t h2, float& lo, float& hi) {
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(h2));
}

// Blocks of `threads` for a grid-stride loop over `items` work items: one block per `threads` items, at least 1 and
// at most 2^20 (the loop strides over the rest).
inline unsigned grid_stride_blocks(int64_t items, int threads) {
  const int64_t blocks = (items + threads - 1) / threads;
  return unsigned(blocks < 1 ? 1 : (blocks > (int64_t(1) << 20) ? (int64_t(1) << 20) : blocks));
}

// Two FP8 codes (the low byte is element 0) as floats, exactly (every E4M3 / E5M2 value is an f16): one hardware
// conversion to f16x2 on sm_89+, the bit rule elsewhere. The decoders' inner loop (formats/*/decode_*_cuda.cu).
template <bool kE4M3> __device__ __forceinline__ void fp8x2_to_float2(uint32_t two, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  const uint16_t in = uint16_t(two);
  if constexpr (kE4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(in));
  }
  half2_bits_to_float2(h2, lo, hi);
#else
  lo = fp8_to_float(uint8_t(two), kE4M3);
  hi = fp8_to_float(uint8_t(two >> 8), kE4M3);
#endif
}
using ::te::float2_to_bf16x2;  // numerics.h

// The amax of a block of kLanes consecutive lanes x 8 values (v already rounded to the input dtype, rnd_in of
// SPEC §5.1). The lanes of a block are all active or all idle together; kFull: the whole warp is (a full-mask
// shuffle, no mask computed per call).
template <int kLanes, bool kFull>
__device__ __forceinline__ float block_amax8(const float (&v)[kVec]) {
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) a = amax_update(a, v[k]);
  const unsigned group = kFull ? 0xFFFFFFFFu : ((1u << kLanes) - 1u) << (threadIdx.x & (32u - kLanes));
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) a = amax_update(a, __shfl_xor_sync(group, a, o));
  return a;
}

// MXFP8 rowwise output of one chunk (kOut == kMxRow, SPEC §4.5): v = the values rounded to the input dtype; the

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

// SM count of the current device, cached per device (0 if unknown).
inline int device_sm_count() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < 64 && cache[dev] > 0) return cache[dev];
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  if (dev < 64) cache[dev] = n;
  return n;
}

// Grid sizing needs a count even when the query fails: then that of an H100/H200.
inline int device_sm_count_or_default() {
  const int n = device_sm_count();
  return n > 0 ? n : 132;
}

// Blocks of `kernel` resident per SM with `smem` bytes of dynamic shared memory, after allowing that much (cached
// per kernel; 0 if unknown). The allowance is set for any dynamic size: without it, static plus dynamic shared
// memory may not exceed 48 KB (e.g. 48 KB of dynamic next to a few KB of static would not launch).
template <auto kernel> int resident_per_sm(int threads, size_t smem) {
  static int per_sm = -1;
  if (per_sm < 0) {
    if (smem > 0) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    int n = 0;
    per_sm = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) == cudaSuccess ? n : 0;
  }
  return per_sm;
}

// Zero the padding of a scale grid (grid-stride over the padding only): the entries right of the data on its
// `rows` data rows, then the whole rows below, up to [pad_rows, pad_cols]. `offset(r, j)` places entry (r, j).
template <class Offset>
__device__ __forceinline__ void zero_scale_padding(uint8_t* scale, int64_t rows, int64_t cols, int64_t pad_rows,
                                                   int64_t pad_cols, Offset offset) {
  const int64_t right = rows * (pad_cols - cols), below = (pad_rows - rows) * pad_cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < right + below;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i < right ? i / (pad_cols - cols) : rows + (i - right) / pad_cols;
    const int64_t j = i < right ? cols + i % (pad_cols - cols) : (i - right) % pad_cols;
    scale[offset(r, j)] = 0;
  }
}

}  // namespace act_cuda
}  // namespace te
