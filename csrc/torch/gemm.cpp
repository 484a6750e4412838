// The GEMM op (SPEC §6) on torch tensors: te::gemm writes D (and the epilogue's outputs) into buffers the Python
// wrapper allocated. Quantized tensors never reach here: operands arrive as codes + scale_inv + DType and scaling
// codes, with the stored copy already picked (SPEC §6.4). The checks, the epilogue choice and the run (cuBLASLt and
// its unfused fallback, or the CPU kernel) are the core's (csrc/core/ops/gemm_op.h); what stays here is torch's:
// devices, contiguity, the workspace tensors, the current stream and the error classes.
#include "../core/ops/gemm_op.h"
#include "../core/ops/grouped_gemm_op.h"
#include "bridge.h"

namespace te_torch {
namespace {

constexpr const char* kOp = "generic_gemm";

// An optional tensor as the core's buffer, after the device check every tensor of the call gets.
te::ops::GemmBuffer buffer(const c10::optional<Tensor>& t, const char* what, const Tensor& ref) {
  te::ops::GemmBuffer b;
  if (!t.has_value()) return b;
  TORCH_CHECK_VALUE(t->device() == ref.device(), kOp, ": ", what, " is on ", t->device().str(),
                    " but the operands are on ", ref.device().str());
  b.present = true;
  b.contiguous = t->is_contiguous();
  b.v = view_of(*t, storage_dtype(*t, what, kOp), kOp);
  return b;
}

te::ops::GemmOperandRequest operand(const Tensor& x, const c10::optional<Tensor>& scale_inv, int64_t code,
                                    int64_t scaling, bool trans, const char* name, const Tensor& ref) {
  TORCH_CHECK_VALUE(x.device() == ref.device(), kOp, ": operands must be on one device, got ", name, " on ",
                    x.device().str(), " and A on ", ref.device().str(), "; move them with .to(device)");
  te::ops::GemmOperandRequest o;
  o.data = buffer(x, name, ref);
  o.scale_inv = buffer(scale_inv, name[0] == 'A' ? "A scale_inv" : "B scale_inv", ref);
  o.dtype_code = code;
  o.scaling = scaling;
  o.trans = trans;
  return o;
}

// The unfused epilogue's scratch (SPEC §6.2), allocated only when cuBLASLt turns out to lack a kernel: from torch's
// caching allocator on the current stream, held until the op returns (stream-ordered reuse, graph-capture safe).
struct Scratch {
  at::TensorOptions options;
  Tensor t;
  static void* alloc(void* self, int64_t bytes) {
    Scratch* s = static_cast<Scratch*>(self);
    s->t = new_empty_in_guard({bytes}, s->options);
    return s->t.data_ptr();
  }
};

const void* ptr(const c10::optional<Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; }
float* fptr(const c10::optional<Tensor>& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; }

// te::gemm: the torch tensors as the core's request (operands made contiguous: a view is copied), the core's plan
// with its checks, the workspace and the cuBLASLt workspace (the user's, else torch's own of this stream), the run.
void gemm(const Tensor& A_in, const c10::optional<Tensor>& A_scale_inv, int64_t A_dtype, bool transA,
          const Tensor& B_in, const c10::optional<Tensor>& B_scale_inv, int64_t B_dtype, bool transB, const Tensor& D,
          int64_t D_dtype, const c10::optional<Tensor>& bias, const c10::optional<Tensor>& bias_grad,
          const c10::optional<Tensor>& pre_gelu_out, const c10::optional<Tensor>& gelu_in,
          const c10::optional<Tensor>& D_scale, const c10::optional<Tensor>& D_amax,
          const c10::optional<Tensor>& D_scale_inv, const c10::optional<Tensor>& workspace, int64_t workspace_size,
          bool gelu, bool grad, bool use_split_accumulator, double alpha, double beta, int64_t A_scaling,
          int64_t B_scaling, const c10::optional<Tensor>& alpha_beta, const c10::optional<Tensor>& A_amax,
          const c10::optional<Tensor>& B_amax) {
  with_torch_errors([&] {
    const Tensor& ref = A_in;
    const Tensor a = A_in.contiguous(), b = B_in.contiguous();
    te::ops::GemmRequest r;
    r.op = kOp;
    r.a = operand(a, A_scale_inv, A_dtype, A_scaling, transA, "A", ref);
    r.b = operand(b, B_scale_inv, B_dtype, B_scaling, transB, "B", ref);
    r.d_dtype = D_dtype;
    r.d = buffer(D, "D", ref);
    r.bias = buffer(bias, "bias", ref);
    r.bias_grad = buffer(bias_grad, "bias_grad", ref);
    r.pre_gelu_out = buffer(pre_gelu_out, "pre_gelu_out", ref);
    r.gelu_in = buffer(gelu_in, "gelu_in", ref);
    r.d_scale = buffer(D_scale, "output quantizer scale", ref);
    r.d_amax = buffer(D_amax, "output quantizer amax", ref);
    r.d_scale_inv = buffer(D_scale_inv, "output scale_inv", ref);
    r.alpha_beta = buffer(alpha_beta, "alpha_beta", ref);
    r.a_amax = buffer(A_amax, "A_amax", ref);
    r.b_amax = buffer(B_amax, "B_amax", ref);
    r.gelu = gelu;
    r.grad = grad;
    r.alpha = alpha;
    r.beta = beta;
    r.use_split_accumulator = use_split_accumulator;
    r.allow_tf32 = at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
#if defined(TE_WITH_CUDA)
    const c10::cuda::OptionalCUDAGuard guard(ref.is_cuda() ? c10::optional<c10::Device>(ref.device()) : c10::nullopt);
#endif
    const te::ops::ExecCtx ctx = exec_ctx(ref);
    const te::ops::GemmPlan plan = te::ops::plan_gemm(r, ctx);

    te::ops::GemmIO io;
    io.a = a.data_ptr();
    io.a_scale_inv = ptr(A_scale_inv);
    io.b = b.data_ptr();
    io.b_scale_inv = ptr(B_scale_inv);
    io.d = D.data_ptr();
    io.bias = ptr(bias);
    io.bias_grad = bias_grad.has_value() ? bias_grad->data_ptr() : nullptr;
    io.pre_gelu_out = pre_gelu_out.has_value() ? pre_gelu_out->data_ptr() : nullptr;
    io.gelu_in = ptr(gelu_in);
    io.d_scale = fptr(D_scale);
    io.d_amax = fptr(D_amax);
    io.d_scale_inv = fptr(D_scale_inv);
    io.alpha_beta = fptr(alpha_beta);
    io.a_amax = fptr(A_amax);
    io.b_amax = fptr(B_amax);
    // Workspace (SPEC §6.1): uint8 on the operands' device holding at least workspace_size bytes.
    if (workspace.has_value() && workspace->numel() > 0) {
      const Tensor& w = *workspace;
      TORCH_CHECK_VALUE(w.scalar_type() == at::kByte && w.is_contiguous() && w.device() == ref.device() &&
                            workspace_size >= 0 && w.numel() >= workspace_size,
                        kOp, ": workspace must be a contiguous uint8 tensor on ", ref.device().str(),
                        " with at least workspace_size=", std::to_string(workspace_size), " bytes, got ",
                        dtype_name(w.scalar_type()), " ", shape_str(w), " on ", w.device().str(),
                        ". Recommended: 32 MiB + 1 KiB on sm_90 and newer");
      io.lt_workspace = w.data_ptr();
      io.lt_workspace_bytes = workspace_size;
    }
#if defined(TE_WITH_CUDA)
    if (ref.is_cuda() && io.lt_workspace == nullptr) {
      // torch's cuBLASLt workspace of this stream (the one torch's own matmuls use, allocated by its caching
      // allocator, so also under CUDA-graph capture).
      io.lt_workspace = at::cuda::getCUDABlasLtWorkspace();
      io.lt_workspace_bytes = int64_t(at::cuda::getCUDABlasLtWorkspaceSize());
    }
#endif
    const at::TensorOptions bytes = ref.options().dtype(at::kByte);
    Tensor ws;
    if (plan.workspace_bytes > 0) {
      ws = new_empty_in_guard({plan.workspace_bytes}, bytes);
      io.workspace = ws.data_ptr();
      io.workspace_bytes = plan.workspace_bytes;
    }
    Scratch scratch{bytes, Tensor()};
    io.alloc = &Scratch::alloc;
    io.alloc_ctx = &scratch;
    te::ops::run_gemm(plan, io, ctx);
  });
}

// te::grouped_gemm (csrc/core/ops/grouped_gemm_op.h): out [m_total, n] planned by the core, allocated here; the group
// sizes stay on the device. Operands must be contiguous (a view is copied); the workspace comes from torch's caching
// allocator on the current stream (graph-capture safe).
Tensor grouped_gemm(const Tensor& lhs_in, const Tensor& rhs_in, const Tensor& group_sizes,
                    const c10::optional<Tensor>& lhs_scale_inv, const c10::optional<Tensor>& rhs_scale_inv,
                    int64_t lhs_dtype, int64_t rhs_dtype, bool rhs_kn, int64_t out_dtype,
                    bool use_split_accumulator, bool wgrad) {
  constexpr const char* op = "grouped_gemm";
  Tensor out;
  with_torch_errors([&] {
    const Tensor lhs = lhs_in.contiguous(), rhs = rhs_in.contiguous();
    const auto buf = [&](const c10::optional<Tensor>& t, const char* what) {
      te::ops::GemmBuffer b;
      if (!t.has_value()) return b;
      TORCH_CHECK_VALUE(t->device() == lhs.device(), op, ": ", what, " is on ", t->device().str(), " but lhs is on ",
                        lhs.device().str());
      b.present = true;
      b.contiguous = t->is_contiguous();
      b.v = view_of(*t, storage_dtype(*t, what, op), op);
      return b;
    };
    te::ops::GroupedGemmRequest r;
    r.op = op;
    r.lhs = buf(lhs, "lhs");
    r.rhs = buf(rhs, "rhs");
    r.group_sizes = buf(group_sizes, "group_sizes");
    r.lhs_scale_inv = buf(lhs_scale_inv, "lhs_scale_inv");
    r.rhs_scale_inv = buf(rhs_scale_inv, "rhs_scale_inv");
    r.lhs_dtype_code = lhs_dtype;
    r.rhs_dtype_code = rhs_dtype;
    r.rhs_kn = rhs_kn;
    r.d_dtype = out_dtype;
    r.use_split_accumulator = use_split_accumulator;
    r.wgrad = wgrad;
#if defined(TE_WITH_CUDA)
    const c10::cuda::OptionalCUDAGuard guard(lhs.is_cuda() ? c10::optional<c10::Device>(lhs.device()) : c10::nullopt);
#endif
    const te::ops::ExecCtx ctx = exec_ctx(lhs);
    const te::ops::GroupedGemmPlan plan = te::ops::plan_grouped_gemm(r, ctx, /*plan_outputs=*/true);
    out = new_empty_in_guard(c10::IntArrayRef(plan.d_shape.dims, size_t(plan.d_shape.ndim)),
                             lhs.options().dtype(scalar_type_of(plan.d_dtype)));
    Tensor ws;
    te::ops::GroupedGemmIO io;
    if (plan.workspace_bytes > 0) {
      ws = new_empty_in_guard({plan.workspace_bytes}, lhs.options().dtype(at::kByte));
      io.workspace = ws.data_ptr();
      io.workspace_bytes = plan.workspace_bytes;
    }
    io.lhs = lhs.data_ptr();
    io.rhs = rhs.data_ptr();
    io.group_sizes = group_sizes.data_ptr<int32_t>();
    io.lhs_scale_inv = fptr(lhs_scale_inv);
    io.rhs_scale_inv = fptr(rhs_scale_inv);
    io.d = out.data_ptr();
    te::ops::run_grouped_gemm(plan, io, ctx);
  });
  return out;
}

int64_t cublaslt_version() {
#if defined(TE_WITH_CUDA)
  return int64_t(te::cublaslt_version());
#else
  return 0;
#endif
}

}  // namespace

static void gemm_impls(torch::Library& m) {
  m.impl("gemm", &gemm);
  m.impl("grouped_gemm", &grouped_gemm);
}
TE_IMPL_CPU_AND_CUDA(gemm_impls)

// No tensor arguments: one kernel for every dispatch key.
TORCH_LIBRARY_IMPL(te, CompositeImplicitAutograd, m) { m.impl("cublaslt_version", &cublaslt_version); }

}  // namespace te_torch
