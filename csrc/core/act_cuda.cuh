// CUDA kernel of the activation / cast family (included by the act_*.cu translation units, which instantiate
// it for a few activations each so the build parallelises).
//
// Tiling: a block of 256 threads owns 64 positions x 128 rows per step and walks down the rows (grid-stride).
// Thread t takes the 8 consecutive positions 8*(t%8).. and the 4 consecutive rows 4*(t/8)..: 16-byte loads of
// bf16/fp16 (two for fp32), all four rows in flight before any math. FP8 codes of the transposed copy go
// through shared memory as 4-row words, swizzled so that neither the stores nor the 16-byte reads conflict,
// and leave as 16-byte rows of out_t. Invariant: every value is computed by act_forward/act_backward and
// encoded by fp8_scaled_value + float2_to_fp8x2, exactly as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include "activation.h"

namespace te {
namespace act_cuda {

constexpr int kThreads = 256;
constexpr int kTileCols = int(kActTileCols);  // positions per block
constexpr int kVec = 8;        // positions per thread
constexpr int kRowsPerThread = 4;

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

// Swizzled word index of (position j in tile, 4-row group w) in the transposed shared tile.
__device__ __forceinline__ int tile_word(int j, int w) { return j * 32 + (w ^ (4 * ((j >> 3) & 7))); }

// Two resident blocks per SM (<= 128 registers, no spills); bandwidth comes from each block walking several row
// tiles; single-stream kernels (unary forward, the casts) keep the next tile's loads in flight while computing the
// current one (two or three input streams leave no registers for a second set).

// kVecPath: every chunk is 8 aligned elements (cols % 8 == 0, aligned pointers), so rows load and store as 16-byte
// vectors; the general instantiation handles ragged shapes element by element.
template <class Op, bool kBwd, typename InT, bool kVecPath>
__global__ void __launch_bounds__(kThreads, 2) act_kernel(const ActKernelParams p) {
  constexpr bool vec = kVecPath;
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  constexpr int kOuts = kTwoOut ? 2 : 1;
  __shared__ uint32_t tile[kOuts][kTileCols * 32];
  __shared__ float red[kThreads / 32];

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t x_stride = kGated ? 2 * cols : cols;
  const int64_t o_cols = kTwoOut ? 2 * cols : cols;
  const bool fp8 = mode_writes_fp8(p.mode);
  const bool plain = p.mode == ScaleMode::kPlain;
  const bool track_amax = mode_tracks_amax(p.mode);
  const bool want_t = fp8 && p.out_t != nullptr;
  const float scale = fp8 ? mode_scale(p) : 1.0f;
  if (fp8 && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;

  const int tid = threadIdx.x;
  const int cchunk = tid % 8, rgroup = tid / 8;
  const int64_t col_base = int64_t(blockIdx.x) * kTileCols;
  const int64_t c0 = col_base + cchunk * kVec;
  const int n_valid = int(max(int64_t(0), min(int64_t(kVec), cols - c0)));
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  float amax = 0.0f;
  float dsum[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) dsum[k] = 0.0f;

  constexpr bool kPrefetch = !kGated && !kBwd;
  const int64_t m_step = int64_t(gridDim.y) * kActBlockRows;
  Vec8<InT> ra[kRowsPerThread], rb[kRowsPerThread], rg[kRowsPerThread];
  auto load_tile = [&](int64_t m, Vec8<InT>(&la)[kRowsPerThread], Vec8<InT>(&lb)[kRowsPerThread],
                       Vec8<InT>(&lg)[kRowsPerThread]) {
    const int64_t r = m + rgroup * kRowsPerThread;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int n = r + i < rows ? n_valid : 0;
      la[i] = load8(x + (r + i) * x_stride + c0, vec, n);
      if (kGated) lb[i] = load8(x + (r + i) * x_stride + cols + c0, vec, n);
      if (kBwd) lg[i] = load8(g + (r + i) * cols + c0, vec, n);
    }
  };
  if (kPrefetch && int64_t(blockIdx.y) * kActBlockRows < rows) load_tile(int64_t(blockIdx.y) * kActBlockRows, ra, rb, rg);
  for (int64_t m0 = int64_t(blockIdx.y) * kActBlockRows; m0 < rows; m0 += m_step) {
    const int64_t r0 = m0 + rgroup * kRowsPerThread;
    Vec8<InT> na[kRowsPerThread], nb[kRowsPerThread], ng[kRowsPerThread];
    if (kPrefetch) {
      if (m0 + m_step < rows) load_tile(m0 + m_step, na, nb, ng);
    } else {
      load_tile(m0, ra, rb, rg);
    }
    uint32_t tw[kOuts][kVec];  // transposed copy: byte i of word k = code of (row r0+i, position c0+k)
#pragma unroll
    for (int h = 0; h < kOuts; ++h)
#pragma unroll
      for (int k = 0; k < kVec; ++k) tw[h][k] = 0u;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int n = r0 + i < rows ? n_valid : 0;
      float out[kOuts][kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float a = to_float(ra[i].e[k]);
        const float b = kGated ? to_float(rb[i].e[k]) : 0.0f;
        if constexpr (kBwd) {
          float da, db;
          act_backward<Op>(to_float(rg[i].e[k]), a, b, p.act, da, db);
          out[0][k] = da;
          if constexpr (kTwoOut) out[kOuts - 1][k] = db;
        } else {
          out[0][k] = act_forward<Op>(a, b, p.act);
        }
      }
#pragma unroll
      for (int h = 0; h < kOuts; ++h) {
        if (track_amax || p.dbias_partial != nullptr) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            if (k < n) {
              if (track_amax) amax = amax_update(amax, out[h][k]);
              if (p.dbias_partial != nullptr) dsum[k] += out[h][k];
            }
          }
        }
        const int64_t o_off = (r0 + i) * o_cols + h * cols + c0;
        if (plain) {
          if (n > 0) store8(static_cast<InT*>(p.out) + o_off, vec, n, out[h]);
        } else if (fp8) {
          uint32_t w[2] = {0u, 0u};
#pragma unroll
          for (int k = 0; k < kVec; k += 2) {
            const uint32_t two = float2_to_fp8x2(fp8_scaled_value<InT>(out[h][k], p.mode, scale),
                                                 fp8_scaled_value<InT>(out[h][k + 1], p.mode, scale), p.e4m3);
            w[k / 4] |= two << (8 * (k % 4));
            tw[h][k] |= (two & 0xFFu) << (8 * i);
            tw[h][k + 1] |= (two >> 8) << (8 * i);
          }
          if (p.out != nullptr && n > 0) {
            uint8_t* dst = static_cast<uint8_t*>(p.out) + o_off;
            if (vec && n == kVec) {
              *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
            } else {
#pragma unroll
              for (int k = 0; k < kVec; ++k)
                if (k < n) dst[k] = uint8_t(w[k / 4] >> (8 * (k % 4)));
            }
          }
        }
      }
    }
    if (want_t) {
      // Stage the 128 x 64 code tile transposed: word (j, w) holds rows 4w..4w+3 of position j.
#pragma unroll
      for (int h = 0; h < kOuts; ++h)
#pragma unroll
        for (int k = 0; k < kVec; ++k) tile[h][tile_word(cchunk * kVec + k, rgroup)] = tw[h][k];
      __syncthreads();
      const bool rows_vec = (rows % 16 == 0) && ((reinterpret_cast<uintptr_t>(p.out_t) & 15) == 0);
#pragma unroll
      for (int h = 0; h < kOuts; ++h) {
#pragma unroll
        for (int it = 0; it < 2; ++it) {
          const int v = tid + it * kThreads;
          const int j = v / 8, s = v % 8;
          const int64_t pos = col_base + j;
          const int64_t m = m0 + 16 * s;
          if (pos < cols && m < rows) {
            const uint4 w = *reinterpret_cast<const uint4*>(&tile[h][tile_word(j, 4 * s)]);
            uint8_t* dst = p.out_t + (pos + h * cols) * rows + m;
            if (rows_vec && m + 16 <= rows) {
              *reinterpret_cast<uint4*>(dst) = w;
            } else {
#pragma unroll
              for (int b = 0; b < 16; ++b) {
                const uint32_t word = b < 4 ? w.x : (b < 8 ? w.y : (b < 12 ? w.z : w.w));
                if (m + b < rows) dst[b] = uint8_t(word >> (8 * (b % 4)));
              }
            }
          }
        }
      }
      __syncthreads();
    }
    if (kPrefetch) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        ra[i] = na[i];
        if (kGated) rb[i] = nb[i];
        if (kBwd) rg[i] = ng[i];
      }
    }
  }

  if (track_amax) {
    amax = warp_max(amax);
    if (tid % 32 == 0) red[tid / 32] = amax;
    __syncthreads();
    if (tid < 32) {
      float a = tid < kThreads / 32 ? red[tid] : 0.0f;
      a = warp_max(a);
      // Non-negative floats order like their bit patterns.
      if (tid == 0 && a > 0.0f) atomicMax(reinterpret_cast<int*>(p.amax), __float_as_int(a));
    }
  }
  if (p.dbias_partial != nullptr) {
    // Column sums over this block's rows: reduce the 32 row groups that share a position chunk. The transposed
    // tile's storage is free by now and large enough (32 x 64 floats).
    float* dred = reinterpret_cast<float*>(&tile[0][0]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kVec; ++k) dred[rgroup * kTileCols + cchunk * kVec + k] = dsum[k];
    __syncthreads();
    if (tid < kTileCols && col_base + tid < cols) {
      float s = 0.0f;
      for (int w = 0; w < 32; ++w) s += dred[w * kTileCols + tid];
      p.dbias_partial[int64_t(blockIdx.y) * o_cols + col_base + tid] = s;
    }
  }
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

template <class Op, bool kBwd>
void launch_act(DType in_dtype, const ActKernelParams& p, cudaStream_t stream) {
  const int64_t col_blocks = (p.cols + kTileCols - 1) / kTileCols;
  if (col_blocks > 2147483647LL) core_fail("activation: too many columns");
  // An empty tensor still launches one block so that scale_inv is written (SPEC §4.10).
  const dim3 grid(unsigned(col_blocks < 1 ? 1 : col_blocks), unsigned(act_row_blocks(p.rows, p.cols)));
  const int elt = in_dtype == DType::kFloat32 ? 4 : 2;
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const bool vec = p.cols % kVec == 0 && aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
                   (p.out == nullptr || aligned(p.out, p.mode == ScaleMode::kPlain ? 16 : 8)) && elt > 0;
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    if (vec) {
      act_kernel<Op, kBwd, T, true><<<grid, kThreads, 0, stream>>>(p);
    } else {
      act_kernel<Op, kBwd, T, false><<<grid, kThreads, 0, stream>>>(p);
    }
  });
  check_launch("activation kernel");
}

}  // namespace act_cuda
}  // namespace te

// Explicit instantiation of the forward and backward launchers of one activation.
#define TE_INSTANTIATE_ACT_CUDA(code, F, gated)                                                              \
  template void te::act_cuda::launch_act<te::ActOp<te::F, gated>, false>(te::DType, const te::ActKernelParams&, \
                                                                         cudaStream_t);                      \
  template void te::act_cuda::launch_act<te::ActOp<te::F, gated>, true>(te::DType, const te::ActKernelParams&,  \
                                                                        cudaStream_t);
