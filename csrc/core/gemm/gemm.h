// GEMM kernel-level API (SPEC §6): one args struct with raw pointers, dims, dtypes, scale pointers and the
// epilogue, one canonicalize step shared by the CPU kernel and the cuBLASLt wrapper, and the two launchers.
//
// Row-major meaning (TE's): D = alpha·op(B)·op(A) + beta·D_in (+ epilogue), op(X) = Xᵀ when its flag is set.
//   A [a_rows, a_cols] row-major    op(A) = [k, m]        (transA: A is [m, k], else [k, m])
//   B [b_rows, b_cols] row-major    op(B) = [n, k]        (transB: B is [k, n], else [n, k])
//   D [n, m] row-major, row stride m
// cuBLAS sees the column-major views: D_cmᵀ layout [m, n] (ld m) = op_a(A_cm [a_cols, a_rows]) · op_b(B_cm), with
// op_a = T iff transA and op_b = T iff transB, so the flags pass through unchanged. Invariant: the CPU kernel and
// the cuBLASLt wrapper read the same struct and the same GemmDims; the user-facing checks live in the GEMM op above
// them (csrc/core/ops/gemm_op.h, shared by both frontends), these launchers only refuse what they cannot run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "../rules/common.h"
#include "../rules/parallel.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {

// How an operand's values are scaled. kNone and kFp8PerTensor run everywhere; the FP8 block modes run natively
// through cuBLASLt on sm_90, MXFP8 and NVFP4 on sm_100+ (SPEC §6.6). The CPU kernel decodes FP8 blocks exactly
// (fl(code · scale_inv), as dequantize does) and refuses MXFP8 / NVFP4 (the Python wrappers dequantize them exactly
// there, and emulate them on GPUs without a native kernel).
enum class GemmScaling : int { kNone = 0, kFp8PerTensor = 1, kMxfp8 = 2, kNvfp4 = 3, kFp8Block1d = 4, kFp8Block2d = 5 };

// SPEC §4.8: where the scale_inv of element (r, c) of a stored [rows, cols] FP8-block matrix (cols = K) lives — 1x128
// blocks: [ceil(cols/128), roundup(rows, 4)], rows contiguous; 128x128 tiles: [ceil(rows/128), roundup(ceil(cols/128),
// 4)]. The grouped GEMM's lhs uses the first with rows = m_total and r its absolute row.
TE_HD int64_t gemm_fp8_block_scale_index(bool one_d, int64_t r, int64_t c, int64_t rows, int64_t cols) {
  constexpr int64_t b = 128;
  return one_d ? (c / b) * ((rows + 3) / 4 * 4) + r : (r / b) * (((cols + b - 1) / b + 3) / 4 * 4) + c / b;
}

// Epilogue applied after alpha·op(B)op(A) + beta·D_in (SPEC §6.2).
enum class GemmEpilogue : int {
  kNone = 0,
  kBias = 1,        // + bias[m]
  kGeluAux = 2,     // aux = r (+ bias), D = gelu(aux)       (kGeluAuxBias when bias is set)
  kGeluAuxBias = 3,
  kDGelu = 4,       // D = r ⊙ gelu'(aux), aux = the saved pre-activation [n, m]
  kDGeluBGrad = 5,  // + bias_grad[m] = Σ_rows D
  kBGradB = 6,      // bias_grad[n] = Σ_k op(B)[n, k]: the wgrad bias gradient (needs transB)
};

const char* gemm_epilogue_name(GemmEpilogue e);
const char* gemm_scaling_name(GemmScaling s);
const char* dtype_short_name(DType d);  // "bf16", "E4M3", ...

struct GemmOperand {
  const void* data = nullptr;     // [rows, cols] row-major, `dtype` elements (FP8: uint8 codes; E2M1: two per byte)
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kBFloat16;
  GemmScaling scaling = GemmScaling::kNone;
  // On the operand's device. Per-tensor FP8: float32 [1]. FP8 block, for the stored [rows, cols] matrix (cols = K):
  // float32 1x128 [ceil(cols/128), roundup(rows, 4)] (rows contiguous); 128x128 [ceil(rows/128),
  // roundup(ceil(cols/128), 4)]. MXFP8 / NVFP4: the GEMM-swizzled uint8 E8M0 / E4M3 block scales (SPEC §4.8).
  const void* scale_inv = nullptr;
  bool trans = false;
};

struct GemmArgs {
  GemmOperand a, b;
  void* d = nullptr;                 // [n, m] row-major: float32/fp16/bf16, or uint8 FP8 codes (d_dtype E4M3/E5M2)
  DType d_dtype = DType::kBFloat16;
  const float* d_scale = nullptr;    // [1] FP8 output: D = fp8(r · d_scale)
  float* d_amax = nullptr;           // [1] FP8 output: set to max|r| (the caller max-merges it into the quantizer's)
  const void* bias = nullptr;        // kBias/kGeluAuxBias: [m], bias_dtype
  void* bias_grad = nullptr;         // kDGeluBGrad: [m]; kBGradB: [n]; bias_dtype
  DType bias_dtype = DType::kBFloat16;
  void* aux = nullptr;               // kGeluAux*: written; kDGelu*: read. [n, m], aux_dtype
  DType aux_dtype = DType::kBFloat16;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  float alpha = 1.0f;
  float beta = 0.0f;                 // beta ≠ 0 reads D as D_in
  const float* alpha_beta = nullptr; // device [alpha, beta] replacing the two above (NVFP4: alpha folds the global
                                     // scales, computed on the device without a host sync)
  bool fast_accum = false;           // FP8 per-tensor: cuBLASLt's reduced-precision accumulation
  bool allow_tf32 = true;            // FP32 operands: TF32 tensor cores unless matmul precision is "highest"
  int sm_count = 0;                  // CUDA: the SMs the GEMM may occupy (0: all). A collective GEMM leaves the rest
                                     // to the communication kernels running beside it (cuBLASLt SM_COUNT_TARGET).
  void* workspace = nullptr;         // [workspace_bytes] device memory, stream-ordered (null: none)
  size_t workspace_bytes = 0;
};

// Workspaces are used from their first 256-byte boundary (cuBLASLt's and TMA's alignment); plans reserve the slack.
constexpr size_t kGemmWorkspaceAlign = 256;
inline void* gemm_align_workspace(void* p) {
  const uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((raw + kGemmWorkspaceAlign - 1) & ~uintptr_t(kGemmWorkspaceAlign - 1));
}

// The layout-independent sizes of a request (SPEC §6.1): m = D's last dim, n = D's rows, k = contraction.
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
};
inline GemmDims gemm_dims(const GemmArgs& g) {
  GemmDims d;
  d.m = g.a.trans ? g.a.rows : g.a.cols;
  d.k = g.a.trans ? g.a.cols : g.a.rows;
  d.n = g.b.trans ? g.b.cols : g.b.rows;
  return d;
}

// CPU (SPEC §6.7): operands decoded exactly to FP32 (FP8: code · scale_inv), products accumulated in FP64,
// then alpha, beta, bias and the epilogue in FP32 and one rounding to the output format. Every pointer is host
// memory; `workspace` is ignored.
void gemm_cpu(const GemmArgs& g, const ParallelFor& parallel_for);

#if defined(TE_WITH_CUDA)
// Thrown when cuBLASLt's heuristics find no kernel for the request (typically an epilogue the format or shape
// lacks), so that the caller can run the epilogue separately (SPEC §6.2) instead of failing.
struct GemmNoKernel : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// cuBLASLt on `stream` (current device). Throws std::invalid_argument (core_fail) with shapes, formats and the
// cuBLAS status name when the library refuses; never synchronises the host, never allocates.
void gemm_cublaslt(const GemmArgs& g, cudaStream_t stream);
// Creates (once) the cached cuBLASLt handle of the current device. gemm_cublaslt creates it on first use too; a frontend
// whose execute stage may run under stream capture (XLA command buffers) calls this first, outside any capture
// (the JAX initialize stage), so execute only looks the handle up.
void cublaslt_prepare();
// "cuBLASLt 130200" style version number of the loaded library.
size_t cublaslt_version();
#endif

}  // namespace te
