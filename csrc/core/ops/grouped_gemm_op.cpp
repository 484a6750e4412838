// plan_grouped_gemm and run_grouped_gemm (grouped_gemm_op.h).
#include "grouped_gemm_op.h"

#include "../gemm/gemm_epilogue.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {
namespace ops {
namespace {

bool is_fp8(DType d) { return gemm_is_fp8(d); }
bool is_plain(DType d) { return gemm_is_plain(d); }

struct Checker {
  const GroupedGemmRequest& r;
  const ExecCtx& ctx;
  std::string call;  // "lhs [40960, 4096] bf16, rhs [16, 2048, 4096] bf16 (NK), on cuda:0 (sm_90)"

  [[noreturn]] void fail_(ErrorKind k, const std::string& what) const {
    fail(k, msg(r.op, ": ", what, "; got ", call));
  }
  DType code(int64_t c, const char* name) const {
    if (c < 0 || c > 10) fail_(ErrorKind::kValue, msg(name, " DType code ", str(c), " is not known"));
    return static_cast<DType>(c);
  }
  // An operand's values' type, its buffer holding them (or uint8 FP8 codes).
  DType operand(const GemmBuffer& b, int64_t c, const char* name, int ndim, const char* dims) const {
    const DType d = code(c, name);
    if (!b.present || !b.contiguous) fail_(ErrorKind::kValue, msg(name, " must be a contiguous tensor"));
    if (b.v.shape.ndim != ndim) fail_(ErrorKind::kValue, msg(name, " must be ", str(ndim), "-D ", dims));
    if (!is_plain(d) && !is_fp8(d)) {
      fail_(ErrorKind::kType, msg(name, " must be bf16, fp16, fp32, E4M3 or E5M2"));
    }
    if (b.v.dtype != d && !(is_fp8(d) && b.v.dtype == DType::kByte)) {
      fail_(ErrorKind::kType, msg(name, " is stored as ", dtype_name(b.v.dtype), " but its values are said to be ",
                                  dtype_short_name(d)));
    }
    return d;
  }
  void scale(const GemmBuffer& b, const char* name, int64_t len) const {
    if (!b.present || !b.contiguous || b.v.dtype != DType::kFloat32 || b.v.shape.ndim != 1 ||
        b.v.shape.dims[0] != len) {
      fail_(ErrorKind::kValue, msg("FP8 operands need ", name, " as a contiguous float32 [", str(len), "] (",
                                   len == 1 ? "one per tensor" : "one per group", "), got ",
                                   b.present ? dtype_name(b.v.dtype) + " " + shape_str(b.v.shape) : "none"));
    }
  }
  // An FP8 block scale: float32, contiguous, exactly `want` (SPEC §4.8's padded shapes).
  void block_scale(const GemmBuffer& b, const char* name, const char* blocks, const Shape& want) const {
    if (!b.present || !b.contiguous || b.v.dtype != DType::kFloat32 || b.v.shape != want) {
      fail_(ErrorKind::kValue,
            msg("FP8 block operands (lhs 1x128 blocks, rhs 128x128 tiles; other block pairings are emulated by the "
                "frontends) need ", name, " (", blocks, ") as a contiguous float32 ", shape_str(want), ", got ",
                b.present ? std::string(dtype_short_name(b.v.dtype)) + " " + shape_str(b.v.shape) : "none"));
    }
  }
};

std::string describe(const GroupedGemmRequest& r, const ExecCtx& ctx) {
  const auto one = [](const char* name, const GemmBuffer& b, int64_t c) {
    return msg(name, " ", shape_str(b.v.shape), " ",
               c >= 0 && c <= 10 ? std::string(dtype_short_name(static_cast<DType>(c))) : "?");
  };
  return msg(one("lhs", r.lhs, r.lhs_dtype_code), ", ", one("rhs", r.rhs, r.rhs_dtype_code),
             r.wgrad ? " (wgrad)" : (r.rhs_kn ? " ([groups, k, n])" : " ([groups, n, k])"), ", group_sizes ", shape_str(r.group_sizes.v.shape),
             " ", dtype_name(r.group_sizes.v.dtype), ", on ", device_str(ctx), " (", arch_name(ctx), ")");
}

}  // namespace

GroupedGemmPlan plan_grouped_gemm(const GroupedGemmRequest& r, const ExecCtx& ctx, bool plan_outputs) {
  const Checker c{r, ctx, describe(r, ctx)};
  const DType ld = c.operand(r.lhs, r.lhs_dtype_code, "lhs", 2, r.wgrad ? "[m_total, n]" : "[m_total, k]");
  const DType rd = r.wgrad ? c.operand(r.rhs, r.rhs_dtype_code, "rhs", 2, "[m_total, k]")
                           : c.operand(r.rhs, r.rhs_dtype_code, "rhs", 3, r.rhs_kn ? "[groups, k, n]" : "[groups, n, k]");
  const Shape& ls = r.lhs.v.shape;
  const Shape& rs = r.rhs.v.shape;
  GroupedGemmPlan pl;
  pl.req = r;
  pl.cuda = ctx.cuda;
  GroupedGemmArgs& a = pl.args;
  a.lhs_dtype = ld;
  a.rhs_dtype = rd;
  a.rhs_kn = r.rhs_kn;
  a.wgrad = r.wgrad;
  a.m_total = ls.dims[0];
  if (r.wgrad) {
    // d[g] [n, k] = lhs rowsᵀ · rhs rows: the grouped rows are the contraction, so both operands have m_total rows.
    a.n = ls.dims[1];
    a.k = rs.dims[1];
    a.groups = r.group_sizes.v.shape.ndim == 1 ? r.group_sizes.v.shape.dims[0] : -1;
    if (rs.dims[0] != a.m_total) {
      c.fail_(ErrorKind::kValue, msg("the contracting (grouped row) dims differ: lhs has ", str(a.m_total),
                                     " rows, rhs ", str(rs.dims[0])));
    }
  } else {
    a.k = ls.dims[1];
    a.groups = rs.dims[0];
    a.n = r.rhs_kn ? rs.dims[2] : rs.dims[1];
    const int64_t rhs_k = r.rhs_kn ? rs.dims[1] : rs.dims[2];
    if (rhs_k != a.k) {
      c.fail_(ErrorKind::kValue, msg("the contracting dims differ: lhs has k = ", str(a.k), ", rhs ", str(rhs_k)));
    }
  }
  const GemmBuffer& gs = r.group_sizes;
  if (!gs.present || !gs.contiguous || gs.v.dtype != DType::kInt32 || gs.v.shape.ndim != 1 ||
      gs.v.shape.dims[0] != a.groups) {
    c.fail_(ErrorKind::kValue, r.wgrad ? std::string("group_sizes must be a contiguous 1-D int32 tensor")
                                       : msg("group_sizes must be a contiguous int32 [", str(a.groups),
                                             "] (one size per group of rhs)"));
  }
  // Formats (SPEC §6.3): plain operands of one type, or an FP8 pair that is not E5M2 x E5M2, TN only.
  if (is_fp8(ld) != is_fp8(rd) || (!is_fp8(ld) && ld != rd)) {
    c.fail_(ErrorKind::kType, "lhs and rhs must be both plain of one type, or both FP8");
  }
  const bool fp8 = is_fp8(ld);
  a.fast_accum = fp8 && !r.use_split_accumulator;
  if (fp8 && r.wgrad) {
    c.fail_(ErrorKind::kNotImplemented, "not yet supported: FP8 operands in the grouped weight-gradient form (its "
                                        "contraction runs along the grouped rows, which FP8's TN-only tensor cores "
                                        "cannot split at arbitrary row offsets); pass the bf16 dy and x");
  }
  if (fp8) {
    if (ld == DType::kFloat8E5M2 && rd == DType::kFloat8E5M2) {
      c.fail_(ErrorKind::kValue, "E5M2 x E5M2 is not a valid FP8 GEMM (SPEC §6.3: at most one E5M2 operand)");
    }
    if (r.rhs_kn) {
      c.fail_(ErrorKind::kValue, "FP8 grouped GEMM takes rhs as [groups, n, k] only (FP8 tensor cores are TN: quantize "
                                 "the transposed copy instead)");
    }
    // The scales' ranks tell the scaling: per-tensor lhs [1] and rhs [groups], or FP8 blocks (grouped_gemm.h).
    a.block_scaling = r.lhs_scale_inv.present && r.lhs_scale_inv.v.shape.ndim == 2;
    if (a.block_scaling) {
      c.block_scale(r.lhs_scale_inv, "lhs_scale_inv", "1x128 blocks along k",
                    Shape::of(grouped_kb(a.k), grouped_lhs_scale_ld(a.m_total)));
      Shape rs3;
      rs3.ndim = 3;
      rs3.dims[0] = a.groups;
      rs3.dims[1] = grouped_nb(a.n);
      rs3.dims[2] = grouped_rhs_scale_ld(a.k);
      c.block_scale(r.rhs_scale_inv, "rhs_scale_inv", "128x128 tiles per group", rs3);
    } else {
      c.scale(r.lhs_scale_inv, "lhs_scale_inv", 1);
      c.scale(r.rhs_scale_inv, "rhs_scale_inv", a.groups);
    }
  }
  const DType dd = c.code(r.d_dtype, "output");
  if (!is_plain(dd)) c.fail_(ErrorKind::kType, msg("the output must be bf16, fp16 or fp32, got ", dtype_short_name(dd)));
  a.d_dtype = dd;
  // Alignment (SPEC §6.5) on CUDA: every group's rows start 16-B aligned in lhs and out, as TMA needs.
  if (ctx.cuda && ((a.k * gemm_elt_bytes(ld)) % 16 != 0 || (a.n * gemm_elt_bytes(dd)) % 16 != 0 ||
                   (a.wgrad && (a.n * gemm_elt_bytes(ld)) % 16 != 0))) {
    c.fail_(ErrorKind::kValue, msg("on CUDA, k·", str(gemm_elt_bytes(ld)), " B and n·", str(gemm_elt_bytes(dd)),
                                   " B must be multiples of 16 B (k = ", str(a.k), ", n = ", str(a.n),
                                   "): each group's rows must start 16-byte aligned"));
  }
  pl.d_dtype = dd;
  if (r.wgrad) {
    pl.d_shape.ndim = 3;
    pl.d_shape.dims[0] = a.groups;
    pl.d_shape.dims[1] = a.n;
    pl.d_shape.dims[2] = a.k;
  } else {
    pl.d_shape = Shape::of(a.m_total, a.n);
  }
  if (!plan_outputs) {
    const GemmBuffer& d = r.d;
    if (!d.present || !d.contiguous || d.v.shape != pl.d_shape || d.v.dtype != dd) {
      c.fail_(ErrorKind::kValue, msg("the output must be a contiguous ", dtype_name(dd), " ", shape_str(pl.d_shape),
                                     ", got ", d.present ? dtype_name(d.v.dtype) + " " + shape_str(d.v.shape) : "none"));
    }
  }
  if (ctx.cuda) {
#if defined(TE_WITH_CUDA)
    pl.workspace_bytes = int64_t(grouped_gemm_workspace_bytes(a, grouped_gemm_max_sms()));
#endif
    pl.workspace_bytes += kWorkspaceAlign;
  }
  return pl;
}

const char* grouped_gemm_kernel(const GroupedGemmPlan& pl) {
#if defined(TE_WITH_CUDA)
  if (pl.cuda) return grouped_gemm_kernel_name(pl.args);
#endif
  (void)pl;
  return "cpu";
}

void run_grouped_gemm(const GroupedGemmPlan& pl, const GroupedGemmIO& io, const ExecCtx& ctx) {
  GroupedGemmArgs a = pl.args;
  static_cast<GroupedGemmOperands&>(a) = io;
  run_rewrapping_errors([&] {
    if (!ctx.cuda) {
      grouped_gemm_cpu(a, *ctx.parallel_for);
      return;
    }
#if defined(TE_WITH_CUDA)
    if (io.workspace_bytes < pl.workspace_bytes) {
      fail(ErrorKind::kRuntime, msg(pl.req.op, ": the workspace has ", str(io.workspace_bytes),
                                    " bytes, the plan needs ", str(pl.workspace_bytes)));
    }
    a.workspace = gemm_align_workspace(io.workspace);
    a.workspace_bytes = size_t(pl.workspace_bytes - kWorkspaceAlign);
    grouped_gemm_cuda(a, reinterpret_cast<cudaStream_t>(ctx.stream));
#else
    no_cuda(pl.req.op);
#endif
  });
}

}  // namespace ops
}  // namespace te
