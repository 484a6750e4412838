// Kernel-level API of LayerNorm / RMSNorm (SPEC §11): params structs, launchers for CPU and CUDA, and THE summation
// order of a row, written once here and followed by both sides, so statistics, outputs and gradients are bytes-equal
// on CPU and CUDA.
//
// Summation order of a row of H values t(0..H-1) (the ONE rule): L = norm_lanes(H) lanes; the row is cut in chunks
// of kNormVec consecutive elements, chunk c = elements [c·V, min(c·V + V, H)); lane l owns chunks l, l + L, l + 2L, …
// and adds their elements into one FP32 accumulator in increasing element order, starting from 0. The L lane sums
// are then combined by a pairwise tree: for off = 1, 2, 4, …, L/2, s[l] = fl(s[l] + s[l + off]) for every l that is
// a multiple of 2·off; the row sum is s[0]. (CUDA: each thread is a lane; the tree is an xor butterfly, first by
// shuffles inside a warp, then across the row's warps in shared memory: every lane ends with s[0]'s bits, since
// fl(a + b) = fl(b + a).)
//
// Statistics (FP32, no FMA, correctly rounded sqrt and division): LayerNorm mu = fl(Σx / H),
// var = fl(Σ fl(fl(x − mu)²) / H), rsigma = fl(1 / fl(sqrt(fl(var + eps)))); RMSNorm rsigma =
// fl(1 / fl(sqrt(fl(fl(Σ fl(x²)) / H) + eps))). Output y = fl(fl(fl(x − mu)·rsigma)·g) + beta (RMSNorm
// fl(fl(x·rsigma)·g)), g = fl(1 + gamma) when zero-centred.
// Backward per row: xhat = fl(fl(x − mu)·rsigma) (RMSNorm fl(x·rsigma)), dyg = fl(dz·g), ma = fl(Σdyg / H),
// mb = fl(Σ fl(dyg·xhat) / H); LayerNorm dx = fl(rsigma·fl(fl(dyg − ma) − fl(xhat·mb))), RMSNorm
// dx = fl(rsigma·fl(dyg − fl(xhat·mb))). dgamma / dbeta: FP32 column partial sums of fl(dz·xhat) / dz over blocks of
// norm_bwd_rows(rows, H) consecutive rows (rows in increasing order), then per column the partial rows reduced in
// two levels (norm_bwd_group_sum, norm_bwd_total) and rounded once to gamma's dtype.
#pragma once

#include <cstdint>

#include "../../rules/common.h"
#include "../../rules/numerics.h"
#include "../../rules/parallel.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {

enum class NormKind : int { kLayerNorm = 0, kRmsNorm = 1 };

constexpr int kNormVec = 8;       // elements per chunk
constexpr int kNormMaxWarps = 8;  // warps (of 32 lanes) per row at most

// Warps per row: 1 up to H = 1024, then doubling per doubling of H, at most 8 (H > 4096). Lanes = 32 × warps.
TE_HD int norm_warps(int64_t h) {
  int w = 1;
  while (w < kNormMaxWarps && int64_t(w) * 1024 < h) w *= 2;
  return w;
}
TE_HD int norm_lanes(int64_t h) { return 32 * norm_warps(h); }
// Chunks a lane owns at most.
TE_HD int64_t norm_lane_chunks(int64_t h) {
  const int64_t chunks = (h + kNormVec - 1) / kNormVec;
  const int64_t lanes = norm_lanes(h);
  return (chunks + lanes - 1) / lanes;
}

// Rows per dgamma / dbeta partial row: 128, halved (down to 4) while there would be fewer than 1024 partial rows.
// A pure function of the shape: CPU and CUDA fill the same [norm_bwd_blocks, H] partials.
TE_HD int64_t norm_bwd_rows(int64_t rows, int64_t /*h*/) {
  int64_t r = 128;
  while (r > 4 && (rows + r - 1) / r < 1024) r /= 2;
  return r;
}
TE_HD int64_t norm_bwd_blocks(int64_t rows, int64_t h) {
  const int64_t n = (rows + norm_bwd_rows(rows, h) - 1) / norm_bwd_rows(rows, h);
  return n < 1 ? 1 : n;
}

// The partial rows' reduction, per column: groups of kNormReduceGroup consecutive partial rows, each added in
// increasing order starting from 0, then the group sums added in increasing group order starting from 0. Two levels
// so that the CUDA reduction has (groups x columns) threads instead of one thread per column walking every partial
// row (1024 rows of 8 MB for 8192 x 2048: 62 us on 16 SMs; tools/prof_model.py).
constexpr int64_t kNormReduceGroup = 32;
TE_HD int64_t norm_bwd_groups(int64_t blocks) { return (blocks + kNormReduceGroup - 1) / kNormReduceGroup; }
// Group g's sum of column c of the [blocks, h] partials.
TE_HD float norm_bwd_group_sum(const float* part, int64_t blocks, int64_t h, int64_t g, int64_t c) {
  const int64_t b1 = (g + 1) * kNormReduceGroup < blocks ? (g + 1) * kNormReduceGroup : blocks;
  float s = 0.0f;
  for (int64_t b = g * kNormReduceGroup; b < b1; ++b) s += part[b * h + c];
  return s;
}
// The total of column c from the group sums stored at partial rows g * kNormReduceGroup (in place of the first row
// of each group: the CUDA kernels' layout; the CPU writes them there too).
TE_HD float norm_bwd_total(const float* part, int64_t blocks, int64_t h, int64_t c) {
  float s = 0.0f;
  for (int64_t g = 0; g < norm_bwd_groups(blocks); ++g) s += part[g * kNormReduceGroup * h + c];
  return s;
}

// Correctly rounded FP32 division and square root on both sides (never rsqrtf / approximate division).
TE_HD float norm_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TE_HD float norm_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}
TE_HD float norm_rsigma(float var_or_ms, float eps) { return norm_div(1.0f, norm_sqrt(var_or_ms + eps)); }

// ---- Forward ------------------------------------------------------------------------------------------------------
// x [rows, hidden] (x_dtype); gamma, beta [hidden] (gamma_dtype); y [rows, hidden] of out_dtype (float32 / float16 /
// bfloat16: y rounded once); mu (LayerNorm), rsigma [rows] FP32.
// The tensors the forward reads and the statistics it writes, as the op layer (ops/norm_op.h NormFwdIO) receives
// them from a frontend and the kernels take them: one list, copied as a whole. beta: LayerNorm only.
struct NormFwdTensors {
  const void* x = nullptr;
  const void* gamma = nullptr;
  const void* beta = nullptr;
  float* mu = nullptr;
  float* rsigma = nullptr;
};

struct NormFwdParams : NormFwdTensors {
  NormKind kind = NormKind::kLayerNorm;
  void* y = nullptr;
  int64_t rows = 0, hidden = 0;
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  DType x_dtype = DType::kFloat32, gamma_dtype = DType::kFloat32, out_dtype = DType::kFloat32;
  // CUDA fused outputs (norm_fwd_cuda only; the CPU writes y): fp8_mode 1 per-tensor FP8 delayed (y written as
  // codes of fl(y·scale); the amax of y accumulated into amax with an atomic max), 2 per-tensor FP8 current (amax,
  // which the launcher zeroes, gets the amax of y in a first launch; then the codes with its scale; amax_out, when
  // set, receives it), 4 current with the amax given in amax (no first launch), 3 MXFP8 rowwise (y written as codes, mx_scale the E8M0 scales, compact or swizzled).
  // scale_inv (modes 1, 2) is written as fl(1/scale). noop: 1.0 writes none of these (the statistics still).
  int fp8_mode = 0;
  float* amax_out = nullptr;
  uint8_t* mx_scale = nullptr;
  bool mx_swizzled = false;
  bool e4m3 = true;
  bool force_pow2 = false;
  float amax_epsilon = 0.0f;
  const float* scale = nullptr;
  float* amax = nullptr;
  float* scale_inv = nullptr;
  const float* noop = nullptr;
};

// ---- Backward -----------------------------------------------------------------------------------------------------
// dz, x, dx [rows, hidden] (x_dtype); mu (LayerNorm), rsigma [rows] FP32; gamma [hidden] (gamma_dtype);
// dgamma_part / dbeta_part FP32 [norm_bwd_blocks(rows, hidden), hidden]; dgamma / dbeta [hidden] (gamma_dtype).
// The tensors the backward reads and writes, as the op layer (ops/norm_op.h NormBwdIO) receives them from a frontend
// and the kernels take them: one list, copied as a whole. mu and dbeta: LayerNorm only.
struct NormBwdTensors {
  const void* dz = nullptr;
  const void* x = nullptr;
  const float* mu = nullptr;
  const float* rsigma = nullptr;
  const void* gamma = nullptr;
  void* dx = nullptr;
  void* dgamma = nullptr;
  void* dbeta = nullptr;
};

struct NormBwdParams : NormBwdTensors {
  NormKind kind = NormKind::kLayerNorm;
  float* dgamma_part = nullptr;
  float* dbeta_part = nullptr;
  int64_t rows = 0, hidden = 0;
  bool zero_centered_gamma = false;
  DType x_dtype = DType::kFloat32, gamma_dtype = DType::kFloat32;
};

void norm_fwd_cpu(const NormFwdParams& p, const ParallelFor& parallel_for);
void norm_bwd_cpu(const NormBwdParams& p, const ParallelFor& parallel_for);
#if defined(TE_WITH_CUDA)
void norm_fwd_cuda(const NormFwdParams& p, cudaStream_t s);
void norm_bwd_cuda(const NormBwdParams& p, cudaStream_t s);
#endif

}  // namespace te
