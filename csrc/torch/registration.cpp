// The `te` operator library: every op's schema, defined once (SPEC §1.4). CPU and CUDA kernels are registered
// next to their implementations, the autograd of `act` in activation_autograd.cpp; fake kernels live in
// transformer_engine_torch/_ops.py; the Python module `_C` (python_call.cpp) holds only the wrappers' eager entry.
#include "bridge.h"

// Quantizer spec arguments shared by every quantizing op (SPEC §1.4). The trailing ones have defaults so that a
// wrapper can leave them out when they are at them: torch's Python binding checks every argument passed (is it a
// tensor, does it carry __torch_function__), about 0.9 us for the six trailing fields on a 2-core host.
#define TE_QSPEC                                                                                             \
  "int qkind, int qdtype, bool rowwise, bool columnwise, int qflags=0, float amax_epsilon=0., int block_dim=1, " \
  "Tensor? scale=None, Tensor(a!)? amax=None, Tensor? noop=None"
// The activation code and clamped SwiGLU's parameters (SPEC §3.3; the other activations ignore them), with their
// defaults where nothing follows them.
#define TE_ACT_ARGS "int act, float limit, float alpha, float offset"
#define TE_ACT_ARGS_DEFAULTED "int act, float limit=7., float alpha=1.702, float offset=1."
// The quantized pieces, as a fixed tuple (a Tensor[] return beside a mutable argument cannot be functionalized
// by torch.compile): row_data, row_scale_inv, col_data, col_scale_inv, amax_row, amax_col.
#define TE_QOUT "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor"

namespace {

#if !defined(TE_WITH_CUDA)
// A CPU-only build (TE_FORCE_CPU=1, or no CUDA toolkit or a CPU-only torch when it was built) has CPU kernels only.
// Without a kernel for the CUDA key, a CUDA tensor would meet the dispatcher's "Could not run 'te::act' with
// arguments from the 'CUDA' backend" and its list of keys; this one names the op, the cause and the fix.
void no_cuda_kernel(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(), ": got a CUDA tensor, but transformer_engine_torch was built "
                              "without CUDA (a CPU-only build: TE_FORCE_CPU=1, or no CUDA toolkit or a CPU-only torch "
                              "at build time), so it has CPU kernels only. Rebuild it with a CUDA toolkit and a CUDA "
                              "build of torch (TE_FORCE_CPU unset), or move the tensors to the CPU with .cpu()");
}
#endif

// Defines an op that takes tensors; in a CPU-only build it also gets the CUDA kernel above, so every op answers a
// CUDA tensor with that message (the op list is written once, here).
void def_op(torch::Library& m, const char* schema, const std::vector<at::Tag>& tags = {}) {
  m.def(schema, tags);
#if !defined(TE_WITH_CUDA)
  const std::string s(schema);
  m.impl(s.substr(0, s.find('(')).c_str(),
         torch::dispatch(c10::DispatchKey::CUDA, torch::CppFunction::makeFromBoxedFunction<&no_cuda_kernel>()));
#endif
}

}  // namespace

TORCH_LIBRARY(te, m) {
  def_op(m, "act(Tensor x, " TE_ACT_ARGS_DEFAULTED ") -> Tensor");
  def_op(m, "dact(Tensor grad, Tensor x, " TE_ACT_ARGS_DEFAULTED ") -> Tensor");
  // Quantizing ops may draw random bits (NVFP4 stochastic rounding) from the device's default generator.
  const std::vector<at::Tag> seeded = {at::Tag::nondeterministic_seeded};
  def_op(m, "act_quantize(Tensor x, " TE_ACT_ARGS ", " TE_QSPEC ") -> (" TE_QOUT ")", seeded);
  def_op(m, "dact_quantize(Tensor grad, Tensor x, " TE_ACT_ARGS ", " TE_QSPEC ") -> (" TE_QOUT ")", seeded);
  def_op(m, "dbias_dact(Tensor grad, Tensor x, int act, " TE_QSPEC ") -> (Tensor, " TE_QOUT ")", seeded);
  // rng_seed >= 0 fixes NVFP4 stochastic rounding's (seed, offset) instead of drawing them (ours).
  def_op(m, "quantize(Tensor x, " TE_QSPEC ", int rng_seed=-1, int rng_offset=0) -> (" TE_QOUT ")", seeded);
  def_op(m, "quantize_into(Tensor x, " TE_QSPEC
            ", Tensor(b!)? row_data=None, Tensor(c!)? row_scale_inv=None, Tensor(d!)? col_data=None, "
            "Tensor(e!)? col_scale_inv=None) -> ()", seeded);
  def_op(m, "bgrad_quantize(Tensor x, " TE_QSPEC ") -> (Tensor, " TE_QOUT ")", seeded);
  // LayerNorm / RMSNorm (SPEC §11; csrc/core/ops/norm_op.h): TE's argument order, ln_out handled by the wrapper;
  // otype is the plain output's DType code (qkind 0). Returns the six quantized pieces (the plain output in the
  // first), then mu (0 elements for RMSNorm) and rsigma, FP32 [rows].
  def_op(m, "layernorm_fwd(Tensor input, Tensor weight, Tensor bias, float eps, int otype, int sm_margin, "
            "bool zero_centered_gamma, " TE_QSPEC ") -> (" TE_QOUT ", Tensor, Tensor)", seeded);
  def_op(m, "rmsnorm_fwd(Tensor input, Tensor weight, float eps, int otype, int sm_margin, bool zero_centered_gamma, "
            TE_QSPEC ") -> (" TE_QOUT ", Tensor, Tensor)", seeded);
  def_op(m, "layernorm_bwd(Tensor dz, Tensor x, Tensor mu, Tensor rsigma, Tensor gamma, int sm_margin, "
            "bool zero_centered_gamma) -> (Tensor, Tensor, Tensor)");
  def_op(m, "rmsnorm_bwd(Tensor dz, Tensor x, Tensor rsigma, Tensor gamma, int sm_margin, bool zero_centered_gamma) "
            "-> (Tensor, Tensor)");
  def_op(m, "dequantize_fp8(Tensor data, Tensor scale_inv, int fp8_dtype, ScalarType otype) -> Tensor");
  def_op(m, "compute_amax(Tensor x, Tensor(a!) amax) -> ()");
  def_op(m, "fused_amax_and_scale_update(Tensor? amax_reduction_buffer, Tensor(a!)[] amax_histories, "
            "Tensor(b!)[] scales, str amax_compute_algo, int fp8_dtype, float margin) -> ()");
  def_op(m, "fp8_transpose(Tensor x) -> Tensor");
  def_op(m, "fp8_transpose_into(Tensor x, Tensor(a!) out) -> ()");
  // GEMM (SPEC §6): D = alpha·op(B)·op(A) + beta·D with the epilogue picked by (bias, gelu, grad) and written into
  // the caller's buffers. Operands are plain tensors or FP8 codes (uint8) with their scale_inv and DType code;
  // A_scaling/B_scaling name a quantized operand's scaling (te::GemmScaling: 1 per-tensor, 2 MXFP8, 3 NVFP4,
  // 4 FP8 block 1x128, 5 FP8 block 128x128; 0 = per-tensor when the operand is FP8). alpha_beta: device
  // [alpha, beta] replacing the scalars. A_amax/B_amax: NVFP4 copies' global amaxes (the core folds the global
  // decode scales into alpha). The FP8-output fields are the output quantizer's scale and amax and the output's
  // scale_inv.
  def_op(m, "gemm(Tensor A, Tensor? A_scale_inv, int A_dtype, bool transA, Tensor B, Tensor? B_scale_inv, "
            "int B_dtype, bool transB, Tensor(a!) D, int D_dtype, Tensor? bias=None, Tensor(b!)? bias_grad=None, "
            "Tensor(c!)? pre_gelu_out=None, Tensor? gelu_in=None, Tensor? D_scale=None, Tensor(d!)? D_amax=None, "
            "Tensor(e!)? D_scale_inv=None, Tensor? workspace=None, int workspace_size=0, bool gelu=False, "
            "bool grad=False, bool use_split_accumulator=False, float alpha=1., float beta=0., int A_scaling=0, "
            "int B_scaling=0, Tensor? alpha_beta=None, Tensor? A_amax=None, Tensor? B_amax=None) -> ()");
  // Grouped GEMM with the group sizes on the device (csrc/core/ops/grouped_gemm_op.h): lhs [m_total, k], rhs
  // [groups, n, k] (rhs_kn: [groups, k, n]), group_sizes int32 [groups] -> out [m_total, n] of DType out_dtype. FP8
  // operands: codes with lhs_scale_inv [1] and rhs_scale_inv [groups]; use_split_accumulator=False: FastAccum.
  // wgrad: the weight-gradient form, lhs [m_total, n] (dy), rhs [m_total, k] (x) -> out [groups, n, k].
  def_op(m, "grouped_gemm(Tensor lhs, Tensor rhs, Tensor group_sizes, Tensor? lhs_scale_inv, Tensor? rhs_scale_inv, "
            "int lhs_dtype, int rhs_dtype, bool rhs_kn, int out_dtype, bool use_split_accumulator=True, "
            "bool wgrad=False) -> Tensor");
  // Collective GEMM (csrc/core/ops/collective_gemm_op.h): kind 1 all-gather + GEMM (x [m, k] shard, w [n, k] ->
  // [tp·m, n], and the gathered x [tp·m, k] with its FP8 scales [tp] when return_gathered), kind 2 GEMM +
  // reduce-scatter (x [tp·m, k], w [n, k] -> [m, n]) over torch.distributed's group `group_name`; FP8 operands as
  // codes with scale_inv [1]. The loopback form simulates rank `rank` of `tp` on one GPU, its peers' bytes in
  // `peers` (all-gather: the whole x and peers_scale_inv [tp]; reduce-scatter: the partials arriving, FP32 [tp-1, m, n]).
  // sm_margin: SMs the chunk GEMMs leave to the exchanges' kernels (CUDA; 0: none; -1: the transport's default).
  // window (CUDA reduce-scatter): [bytes, base of rank 0's window, …] — every rank's copy-engine window mapped into
  // this process (comm/transport.h CopyEngineWindow); empty: the process group's NCCL send/receive.
  def_op(m, "collective_gemm(Tensor x, Tensor? x_scale_inv, int x_dtype, Tensor w, Tensor? w_scale_inv, int w_dtype, "
            "int kind, str group_name, int out_dtype, bool overlap=True, bool use_split_accumulator=True, "
            "bool return_gathered=False, int sm_margin=-1, int[] window=[]) -> (Tensor, Tensor, Tensor)");
  def_op(m, "collective_gemm_loopback(Tensor x, Tensor? x_scale_inv, int x_dtype, Tensor w, Tensor? w_scale_inv, "
            "int w_dtype, int kind, int rank, int tp, Tensor peers, Tensor? peers_scale_inv, int out_dtype, "
            "bool overlap=True, bool use_split_accumulator=True, bool return_gathered=False, int sm_margin=-1) "
            "-> (Tensor, Tensor, Tensor)");
  // The collective GEMM's transport on CUDA ("copy_engine" / "nccl": NVTE_COLLECTIVE_GEMM_TRANSPORT, else the copy
  // engine for a node-local group) and the copy-engine window's bytes for a reduce-scatter of x [rows, k] into
  // [rows/tp, n]: the core decides both (collective_gemm_op.h).
  m.def("collective_transport(bool node_local) -> str");
  m.def("collective_window_bytes(int kind, int rows, int n, int tp) -> int");
  m.def("cublaslt_version() -> int");
}
