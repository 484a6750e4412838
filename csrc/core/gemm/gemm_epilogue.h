// The GEMM epilogue of one output element (SPEC §6.2), one definition for the CPU GEMM (gemm_cpu.cpp) and for the
// CUDA fallback (gemm_epilogue.cu) that runs an epilogue cuBLASLt has no kernel for after a plain GEMM into FP32.
// Invariant: both sides feed it r = alpha·op(B)op(A) in FP32 and round once, to D's format, after it, so the fallback
// computes what the CPU kernel computes (up to the accumulation order of the product).
#pragma once

#include "../producers/act_functors.h"
#include "../rules/numerics.h"
#include "../rules/scaling.h"
#include "gemm.h"

namespace te {

TE_HD bool gemm_is_fp8(DType d) { return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2; }
TE_HD bool gemm_is_plain(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }
// Bytes per element of a GEMM operand or output: FP8 codes 1, fp32 4, fp16/bf16 2.
TE_HD int64_t gemm_elt_bytes(DType d) { return gemm_is_fp8(d) ? 1 : (d == DType::kFloat32 ? 4 : 2); }

// What the epilogue of D [n, m] (row-major) reads and writes; pointers on the device that runs it.
struct GemmEpilogueParams {
  int64_t n = 0, m = 0;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  void* d = nullptr;              // [n, m] d_dtype (FP8: uint8 codes); read first as D_in when beta != 0
  DType d_dtype = DType::kBFloat16;
  const float* d_scale = nullptr; // [1] FP8 D: D = fp8(r · d_scale)
  const void* bias = nullptr;     // [m] bias_dtype (kBias, kGeluAuxBias)
  DType bias_dtype = DType::kBFloat16;
  void* aux = nullptr;            // [n, m] aux_dtype: written by kGeluAux*, read by kDGelu*
  DType aux_dtype = DType::kBFloat16;
};

// The epilogue of a launcher request, in field order.
inline GemmEpilogueParams gemm_epilogue_params(const GemmArgs& g) {
  const GemmDims dm = gemm_dims(g);
  return GemmEpilogueParams{dm.n,      dm.m,         g.epilogue, g.d,     g.d_dtype,
                            g.d_scale, g.bias,       g.bias_dtype, g.aux, g.aux_dtype};
}

// The value D gets at element idx = row·m + col before its one rounding, from r = alpha·op(B)op(A): + beta·D_in,
// + bias, then GELU (the pre-activation written to aux in aux's format) or the product with GELU'(aux).
TE_HD float gemm_epilogue_value(const GemmEpilogueParams& p, int64_t idx, int64_t col, float r, float beta) {
  const GemmEpilogue ep = p.epilogue;
  if (beta != 0.0f) r = r + beta * (gemm_is_fp8(p.d_dtype) ? 0.0f : gemm_load(p.d, idx, p.d_dtype));
  if (ep == GemmEpilogue::kBias || ep == GemmEpilogue::kGeluAuxBias) r = r + gemm_load(p.bias, col, p.bias_dtype);
  const ActArgs act_args;
  if (ep == GemmEpilogue::kGeluAux || ep == GemmEpilogue::kGeluAuxBias) {
    gemm_store(p.aux, idx, p.aux_dtype, r);
    r = Gelu::fwd(r, act_args);
  } else if (ep == GemmEpilogue::kDGelu || ep == GemmEpilogue::kDGeluBGrad) {
    r = r * Gelu::bwd(gemm_load(p.aux, idx, p.aux_dtype), act_args);
  }
  return r;
}

// Stores the final value: FP8 codes of r · d_scale (amax tracks |r|, NaN ignored), else D's dtype.
TE_HD void gemm_store_output(const GemmEpilogueParams& p, int64_t idx, float r, float d_scale, float& amax) {
  if (gemm_is_fp8(p.d_dtype)) {
    amax = amax_update(amax, r);
    static_cast<uint8_t*>(p.d)[idx] = float_to_fp8(r * d_scale, p.d_dtype == DType::kFloat8E4M3);
  } else {
    gemm_store(p.d, idx, p.d_dtype, r);
  }
}

#if defined(TE_WITH_CUDA)
// The unfused epilogue on `stream` (SPEC §6.2 fallback): acc [n, m] float32 holds alpha·op(B)op(A); D (and aux) are
// written from it by gemm_epilogue_value + gemm_store_output. beta is *beta_dev when beta_dev is set (device
// pointer mode), else `beta`. FP8 D: the amax of the results is max-merged into *amax (zeroed by the caller).
// kDGeluBGrad: acc is overwritten with the final values and bias_grad[m] = Σ_rows of them (bias_grad_dtype).
void gemm_epilogue_cuda(const GemmEpilogueParams& p, float* acc, float beta, const float* beta_dev, float* amax,
                        void* bias_grad, DType bias_grad_dtype, cudaStream_t stream);
// bias_grad[n] = Σ_k op(B)[n, k] of the operand as the kernel sees it (the wgrad bias gradient, kBGradB), its values
// decoded exactly: plain, FP8 per tensor, FP8 block 1x128 / 128x128 (SPEC §4.8 scale matrices).
void gemm_bgrad_b_cuda(const GemmOperand& b, void* bias_grad, DType bias_grad_dtype, cudaStream_t stream);
// FP8 D's bookkeeping after the GEMM (SPEC §6.3): amax = max(amax, amax_tmp) (NaN in amax stays), scale_inv =
// 1/scale.
void gemm_fp8_finish_cuda(const float* amax_tmp, float* amax, const float* scale, float* scale_inv,
                          cudaStream_t stream);
#endif

}  // namespace te
