// The CPU GEMM (SPEC §6.7): same args and epilogues as the cuBLASLt path, computed as a reference would —
// exact decode to FP32, FP64 accumulation, epilogue in FP32, one rounding. Slow by design (tests, CPU CI).
#include <vector>

#include "../formats/mxfp8/mxfp8.h"
#include "../formats/nvfp4/quantize_nvfp4.h"
#include "gemm_epilogue.h"

namespace te {

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kGeluAux: return "gelu_aux";
    case GemmEpilogue::kGeluAuxBias: return "gelu_aux_bias";
    case GemmEpilogue::kDGelu: return "dgelu";
    case GemmEpilogue::kDGeluBGrad: return "dgelu_bgrad";
    case GemmEpilogue::kBGradB: return "bgradb";
  }
  return "?";
}

const char* gemm_scaling_name(GemmScaling s) {
  switch (s) {
    case GemmScaling::kNone: return "unscaled";
    case GemmScaling::kFp8PerTensor: return "FP8 per-tensor";
    case GemmScaling::kMxfp8: return "MXFP8";
    case GemmScaling::kNvfp4: return "NVFP4";
    case GemmScaling::kFp8Block1d: return "FP8 block 1x128";
    case GemmScaling::kFp8Block2d: return "FP8 block 128x128";
  }
  return "?";
}

const char* dtype_short_name(DType d) {
  switch (d) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "E4M3";
    case DType::kFloat8E5M2: return "E5M2";
    case DType::kFloat4E2M1: return "E2M1";
    case DType::kByte: return "uint8";
    default: return "?";
  }
}

namespace {

// An operand element decoded exactly to FP32 (FP8: code · scale_inv).
float load(const void* p, int64_t i, DType d, float scale_inv) {
  switch (d) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16: return gemm_load(p, i, d);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return fp8_to_float(static_cast<const uint8_t*>(p)[i], d == DType::kFloat8E4M3) * scale_inv;
    default: break;
  }
  core_fail(std::string("gemm_cpu: operand dtype ") + dtype_short_name(d) +
            " is not supported; accepted: fp32, fp16, bf16, E4M3, E5M2");
}

// op(X) as a contiguous FP32 matrix [outer, k]: op(A)ᵀ = [m, k] for A, op(B) = [n, k] for B.
// `k_major` says whether the stored operand already runs along k in memory (A with trans, B without).
// FP8 blocks: the scale_inv of the stored element (r, c), by gemm.h's layouts (SPEC §4.8).
float block_scale_inv(const GemmOperand& x, int64_t r, int64_t c) {
  return static_cast<const float*>(x.scale_inv)[gemm_fp8_block_scale_index(x.scaling == GemmScaling::kFp8Block1d, r,
                                                                           c, x.rows, x.cols)];
}

std::vector<float> decode_k_contiguous(const GemmOperand& x, bool k_major, int64_t outer, int64_t k,
                                       const ParallelFor& pf) {
  std::vector<float> out(size_t(outer) * size_t(k));
  const bool block = x.scaling == GemmScaling::kFp8Block1d || x.scaling == GemmScaling::kFp8Block2d;
  const bool mx = x.scaling == GemmScaling::kMxfp8;  // exact: fl(code · 2^(e - 127)), the swizzled scales
  const bool nv = x.scaling == GemmScaling::kNvfp4;  // exact: fl(e2m1 · sf); the global factors are in alpha
  const float s = (x.scaling == GemmScaling::kFp8PerTensor) ? *static_cast<const float*>(x.scale_inv) : 1.0f;
  pf(outer, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = k_major ? o : j, c = k_major ? j : o;  // the stored element
        out[size_t(o) * k + j] =
            nv ? nv_gemm_decode(static_cast<const uint8_t*>(x.data), static_cast<const uint8_t*>(x.scale_inv), r, c,
                                x.cols)
            : mx ? mx_gemm_decode(static_cast<const uint8_t*>(x.data), static_cast<const uint8_t*>(x.scale_inv), r, c,
                                x.rows, x.cols, k_major, x.dtype == DType::kFloat8E4M3)
               : load(x.data, r * x.cols + c, x.dtype, block ? block_scale_inv(x, r, c) : s);
      }
  });
  return out;
}

}  // namespace

void gemm_cpu(const GemmArgs& g, const ParallelFor& pf) {
  const GemmDims dm = gemm_dims(g);
  const int64_t m = dm.m, n = dm.n, k = dm.k;
  const std::vector<float> at = decode_k_contiguous(g.a, g.a.trans, m, k, pf);    // [m, k]
  const std::vector<float> bt = decode_k_contiguous(g.b, !g.b.trans, n, k, pf);   // [n, k]
  const bool fp8_out = gemm_is_fp8(g.d_dtype);
  if (!fp8_out && g.d_dtype != DType::kFloat32 && g.d_dtype != DType::kFloat16 && g.d_dtype != DType::kBFloat16)
    core_fail(std::string("gemm_cpu: output dtype ") + dtype_short_name(g.d_dtype) + " is not supported here");
  const float d_scale = fp8_out ? *g.d_scale : 1.0f;
  const GemmEpilogue ep = g.epilogue;
  const GemmEpilogueParams p = gemm_epilogue_params(g);
  // Per-row results in FP32 (before the output rounding) feed the amax and the DGELU bias gradient; both are
  // reduced per row block and merged in row order, so the result does not depend on the thread count.
  std::vector<double> bgrad_rows(ep == GemmEpilogue::kDGeluBGrad ? size_t(n) * size_t(m) : 0);
  std::vector<float> amax_rows(fp8_out ? size_t(n) : 0, 0.0f);
  pf(n, [&](int64_t rb, int64_t re) {
    for (int64_t i = rb; i < re; ++i) {
      const float* brow = bt.data() + size_t(i) * k;
      float amax = 0.0f;
      for (int64_t j = 0; j < m; ++j) {
        const float* acol = at.data() + size_t(j) * k;
        double acc = 0.0;
        for (int64_t t = 0; t < k; ++t) acc += double(brow[t]) * double(acol[t]);
        const int64_t idx = i * m + j;
        const float r = gemm_epilogue_value(p, idx, j, g.alpha * float(acc), g.beta);
        if (ep == GemmEpilogue::kDGeluBGrad) bgrad_rows[size_t(idx)] = double(r);
        gemm_store_output(p, idx, r, d_scale, amax);
      }
      if (fp8_out) amax_rows[size_t(i)] = amax;
    }
  });
  if (fp8_out) {
    float amax = 0.0f;
    for (float a : amax_rows) amax = a > amax ? a : amax;
    *g.d_amax = amax;
  }
  if (ep == GemmEpilogue::kDGeluBGrad) {
    pf(m, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        double s = 0.0;
        for (int64_t i = 0; i < n; ++i) s += bgrad_rows[size_t(i) * m + j];
        gemm_store(g.bias_grad, j, g.bias_dtype, float(s));
      }
    });
  }
  if (ep == GemmEpilogue::kBGradB) {
    pf(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        double s = 0.0;
        for (int64_t t = 0; t < k; ++t) s += double(bt[size_t(i) * k + t]);
        gemm_store(g.bias_grad, i, g.bias_dtype, float(s));
      }
    });
  }
}

}  // namespace te
