// The CPU grouped GEMM: the rules of grouped_gemm.h over host memory, each group through the exact CPU GEMM.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../rules/numerics.h"
#include "gemm_epilogue.h"
#include "grouped_gemm.h"

namespace te {

namespace {

// d[e] = lhs[rows of e]ᵀ · rhs[rows of e]: D [n, k] = op(B)·op(A) with B = lhs rows [rows, n] transposed and
// A = rhs rows [rows, k] (gemm.h); a group without rows gives zeros (k = 0 in the GEMM).
void grouped_wgrad_cpu(const GroupedGemmArgs& g, const ParallelFor& pf, size_t elt, size_t d_elt) {
  int64_t row = 0;
  for (int64_t e = 0; e < g.groups; ++e) {
    const int64_t begin = std::min(row, g.m_total);
    const int64_t end = std::min(row + grouped_gemm_clamp_size(g.group_sizes[e]), g.m_total);
    row = end;
    GemmArgs a;
    a.b.data = static_cast<const char*>(g.lhs) + size_t(begin) * size_t(g.n) * elt;
    a.b.rows = end - begin;
    a.b.cols = g.n;
    a.b.dtype = g.lhs_dtype;
    a.b.trans = true;
    a.a.data = static_cast<const char*>(g.rhs) + size_t(begin) * size_t(g.k) * elt;
    a.a.rows = end - begin;
    a.a.cols = g.k;
    a.a.dtype = g.rhs_dtype;
    a.d = static_cast<char*>(g.d) + size_t(e) * size_t(g.n) * size_t(g.k) * d_elt;
    a.d_dtype = g.d_dtype;
    gemm_cpu(a, pf);
  }
}

// An FP8 block lhs's rows [begin, end) decoded exactly as dequantize does (fl(code · scale_inv), FP32): its 1x128
// scales index the whole [m_total, k] tensor's (SPEC §4.8), which a GemmOperand of the group's rows cannot describe.
void decode_block_lhs(const GroupedGemmArgs& g, int64_t begin, int64_t end, std::vector<float>& out) {
  const bool e4m3 = g.lhs_dtype == DType::kFloat8E4M3;
  const uint8_t* codes = static_cast<const uint8_t*>(g.lhs);
  out.resize(size_t(end - begin) * size_t(g.k));
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t c = 0; c < g.k; ++c) {
      out[size_t(r - begin) * size_t(g.k) + size_t(c)] =
          fp8_to_float(codes[r * g.k + c], e4m3) *
          g.lhs_scale_inv[gemm_fp8_block_scale_index(true, r, c, g.m_total, g.k)];
    }
  }
}

}  // namespace

void grouped_gemm_cpu(const GroupedGemmArgs& g, const ParallelFor& pf) {
  const size_t d_elt = size_t(gemm_elt_bytes(g.d_dtype));
  const size_t lhs_elt = size_t(gemm_elt_bytes(g.lhs_dtype));
  const size_t rhs_elt = size_t(gemm_elt_bytes(g.rhs_dtype));
  const bool fp8 = gemm_is_fp8(g.lhs_dtype);
  if (g.wgrad) {
    grouped_wgrad_cpu(g, pf, lhs_elt, d_elt);
    return;
  }
  std::vector<float> lhs_values;  // an FP8 block lhs, decoded per group
  int64_t row = 0;
  for (int64_t e = 0; e < g.groups; ++e) {
    const int64_t begin = std::min(row, g.m_total);
    const int64_t end = std::min(row + grouped_gemm_clamp_size(g.group_sizes[e]), g.m_total);
    row = end;
    if (end == begin || g.n == 0) continue;
    GemmArgs a;
    // D = op(B)·op(A) (gemm.h): B = the group's lhs rows [rows, k], A = its weight ([n, k] transposed, or [k, n]).
    a.b.data = static_cast<const char*>(g.lhs) + size_t(begin) * size_t(g.k) * lhs_elt;
    a.b.rows = end - begin;
    a.b.cols = g.k;
    a.b.dtype = g.lhs_dtype;
    a.a.data = static_cast<const char*>(g.rhs) + size_t(e) * size_t(g.n) * size_t(g.k) * rhs_elt;
    a.a.rows = g.rhs_kn ? g.k : g.n;
    a.a.cols = g.rhs_kn ? g.n : g.k;
    a.a.dtype = g.rhs_dtype;
    a.a.trans = !g.rhs_kn;
    if (g.block_scaling) {  // exact decodes (the lhs here, rhs[e]'s 128x128 tiles in gemm_cpu), FP64 accumulation
      decode_block_lhs(g, begin, end, lhs_values);
      a.b.data = lhs_values.data();
      a.b.dtype = DType::kFloat32;
      a.a.scaling = GemmScaling::kFp8Block2d;
      a.a.scale_inv = g.rhs_scale_inv + size_t(e) * size_t(grouped_nb(g.n)) * size_t(grouped_rhs_scale_ld(g.k));
    } else if (fp8) {
      a.b.scaling = a.a.scaling = GemmScaling::kFp8PerTensor;
      a.b.scale_inv = g.lhs_scale_inv;
      a.a.scale_inv = g.rhs_scale_inv + e;
    }
    a.d = static_cast<char*>(g.d) + size_t(begin) * size_t(g.n) * d_elt;
    a.d_dtype = g.d_dtype;
    gemm_cpu(a, pf);
  }
  if (row < g.m_total) {
    std::memset(static_cast<char*>(g.d) + size_t(row) * size_t(g.n) * d_elt, 0,
                size_t(g.m_total - row) * size_t(g.n) * d_elt);
  }
}

}  // namespace te
