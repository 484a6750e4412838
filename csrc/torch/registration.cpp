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

TORCH_LIBRARY(te, m) {
  m.def("act(Tensor x, " TE_ACT_ARGS_DEFAULTED ") -> Tensor");
  m.def("dact(Tensor grad, Tensor x, " TE_ACT_ARGS_DEFAULTED ") -> Tensor");
  // Quantizing ops may draw random bits (NVFP4 stochastic rounding) from the device's default generator.
  const std::vector<at::Tag> seeded = {at::Tag::nondeterministic_seeded};
  m.def("act_quantize(Tensor x, " TE_ACT_ARGS ", " TE_QSPEC ") -> (" TE_QOUT ")", seeded);
  m.def("dact_quantize(Tensor grad, Tensor x, " TE_ACT_ARGS ", " TE_QSPEC ") -> (" TE_QOUT ")", seeded);
  m.def("dbias_dact(Tensor grad, Tensor x, int act, " TE_QSPEC ") -> (Tensor, " TE_QOUT ")", seeded);
  // rng_seed >= 0 fixes NVFP4 stochastic rounding's (seed, offset) instead of drawing them (ours).
  m.def("quantize(Tensor x, " TE_QSPEC ", int rng_seed=-1, int rng_offset=0) -> (" TE_QOUT ")", seeded);
  m.def("quantize_into(Tensor x, " TE_QSPEC
        ", Tensor(b!)? row_data=None, Tensor(c!)? row_scale_inv=None, Tensor(d!)? col_data=None, "
        "Tensor(e!)? col_scale_inv=None) -> ()", seeded);
  m.def("bgrad_quantize(Tensor x, " TE_QSPEC ") -> (Tensor, " TE_QOUT ")", seeded);
  m.def("dequantize_fp8(Tensor data, Tensor scale_inv, int fp8_dtype, ScalarType otype) -> Tensor");
  m.def("compute_amax(Tensor x, Tensor(a!) amax) -> ()");
  m.def("fused_amax_and_scale_update(Tensor? amax_reduction_buffer, Tensor(a!)[] amax_histories, "
        "Tensor(b!)[] scales, str amax_compute_algo, int fp8_dtype, float margin) -> ()");
  m.def("fp8_transpose(Tensor x) -> Tensor");
  m.def("fp8_transpose_into(Tensor x, Tensor(a!) out) -> ()");
  // GEMM (SPEC §6): D = alpha·op(B)·op(A) + beta·D with the epilogue picked by (bias, gelu, grad) and written into
  // the caller's buffers. Operands are plain tensors or FP8 codes (uint8) with their scale_inv and DType code;
  // A_scaling/B_scaling name a quantized operand's scaling (te::GemmScaling: 1 per-tensor, 2 MXFP8, 3 NVFP4,
  // 4 FP8 block 1x128, 5 FP8 block 128x128; 0 = per-tensor when the operand is FP8). alpha_beta: device
  // [alpha, beta] replacing the scalars (NVFP4 folds its global scales into alpha on the device). The FP8-output
  // fields are the output quantizer's scale and amax and the output's scale_inv.
  m.def("gemm(Tensor A, Tensor? A_scale_inv, int A_dtype, bool transA, Tensor B, Tensor? B_scale_inv, int B_dtype, "
        "bool transB, Tensor(a!) D, int D_dtype, Tensor? bias=None, Tensor(b!)? bias_grad=None, "
        "Tensor(c!)? pre_gelu_out=None, Tensor? gelu_in=None, Tensor? D_scale=None, Tensor(d!)? D_amax=None, "
        "Tensor(e!)? D_scale_inv=None, Tensor? workspace=None, int workspace_size=0, bool gelu=False, "
        "bool grad=False, bool use_split_accumulator=False, float alpha=1., float beta=0., int A_scaling=0, "
        "int B_scaling=0, Tensor? alpha_beta=None) -> ()");
  m.def("cublaslt_version() -> int");
}
