// The GEMM op below every frontend (SPEC §6): `plan_gemm` checks a request over raw views — operand codes, scaling
// modes, the SPEC §4.8 block-scale shapes, the §6.1 layout and inner-dim rules, the §6.3 FP8 rules, the §6.5
// alignment rules, the §6.2 epilogue buffers — and lays out what the call needs (output shapes and dtypes, one
// workspace); `run_gemm` then runs it: the CPU kernel, or cuBLASLt on ctx.stream with the unfused epilogue of SPEC
// §6.2 where cuBLASLt has no kernel (a plain GEMM into an FP32 accumulator carved from the workspace, then the
// epilogue kernels of gemm/gemm_epilogue.cu).
// Invariant: a plan is computed from shapes, dtypes, flags and the device kind alone (no data pointer is read), so JAX
// asks for it at trace time; every check raises te::Error naming the op, the shapes, formats, arch and the rule
// broken; nothing on the run path allocates or synchronises (the torch frontend may hand in an allocator for the
// fallback accumulator instead of reserving it).
#pragma once

#include "../gemm/gemm.h"
#include "buffers.h"

namespace te {
namespace ops {

// An optional caller buffer: present or not, contiguous or not (the frontend knows; the core reports it), its view.
struct GemmBuffer {
  bool present = false;
  bool contiguous = true;
  TensorView v;
};

// One operand as the caller holds it: the stored copy the frontend picked (SPEC §6.4) as a buffer of any rank,
// flattened to [rows, cols] (cols = last dim), the values' DType code and the te::GemmScaling code (0 with FP8 codes
// means per-tensor), whether the kernel transposes it, and its scale_inv.
// data.v.dtype is the buffer's element type: the values' type for plain operands; uint8 (kByte) or the FP8 type
// itself for FP8 codes; uint8 for packed E2M1 (two codes per byte).
struct GemmOperandRequest {
  GemmBuffer data;
  int64_t dtype_code = int64_t(DType::kBFloat16);
  int64_t scaling = 0;
  bool trans = false;
  GemmBuffer scale_inv;
};

// The call as generic_gemm's arguments give it. Row-major meaning: D = alpha·op(B)·op(A) + beta·D_in (+ epilogue).
// Epilogue (SPEC §6.2): gelu && !grad: GELU with pre_gelu_out written (+ bias); gelu && grad: dGELU reading gelu_in
// (+ bias_grad[m]); grad && bias_grad: the wgrad bias gradient bias_grad[n] = Σ_k op(B); !grad && bias: + bias[m].
struct GemmRequest {
  const char* op = "generic_gemm";
  GemmOperandRequest a, b;
  int64_t d_dtype = int64_t(DType::kBFloat16);  // D's DType code (FP8 with FP8 per-tensor operands and d_scale)
  GemmBuffer d;                                 // [..., m] with n·m elements (FP8: uint8 codes)
  GemmBuffer bias, bias_grad, pre_gelu_out, gelu_in;
  GemmBuffer d_scale, d_amax, d_scale_inv;      // FP8 D: the quantizer's scale and amax [1], D's scale_inv [1]
  GemmBuffer alpha_beta;                        // device float32 [alpha, beta] replacing the scalars (CUDA only)
  // NVFP4 operands: the global amax of each operand's copy (float32 [1], on the operands' device). The core folds
  // both global decode scales into alpha (nvfp4_gemm_alpha, SPEC §6.7) on the stream; alpha_beta is not taken.
  GemmBuffer a_amax, b_amax;
  bool gelu = false, grad = false;
  double alpha = 1.0, beta = 0.0;
  bool use_split_accumulator = false;           // FP8 per-tensor: fast accumulation = !use_split_accumulator
  bool allow_tf32 = true;                       // FP32 operands: TF32 tensor cores allowed
  int sm_count = 0;                             // CUDA: SMs the GEMM may occupy (0: all; GemmArgs::sm_count)
  // Planning the outputs (GemmPlanOptions::plan_outputs): whether a bias gradient is wanted, and the dtype of
  // pre_gelu_out (D's dtype when -1).
  bool want_bias_grad = false;
  int64_t aux_dtype = -1;
};

struct GemmPlanOptions {
  // false: D, pre_gelu_out and bias_grad are the caller's buffers, checked against the plan (torch; JAX at run time
  // with its results). true: they are planned, and the plan says their shapes and dtypes (JAX at trace time).
  bool plan_outputs = false;
  // The cuBLASLt workspace (kLtWorkspaceBytes) is part of the plan's workspace (JAX); otherwise the frontend hands one
  // in (torch: the user's, or torch's own per stream).
  bool reserve_lt_workspace = false;
  // The unfused epilogue's FP32 accumulator is part of the plan's workspace whenever the call may need it (JAX);
  // otherwise the frontend allocates it on demand through GemmIO::alloc (torch's caching allocator).
  bool reserve_fallback = false;
};

// cuBLASLt workspace a plan reserves (SPEC §6.1: 32 MiB + 1 KiB recommended on sm_90 and newer).
constexpr int64_t kLtWorkspaceBytes = (int64_t(32) << 20) + 1024;
constexpr int64_t kWorkspaceAlign = int64_t(kGemmWorkspaceAlign);

struct GemmPlan {
  GemmRequest req;
  GemmArgs args;       // the launcher's arguments without pointers (run_gemm fills them in)
  GemmDims dims;       // m = D's last dim, n = D's rows, k = contraction
  bool cuda = false;
  bool fp8_out = false;
  // Outputs, planned or checked: D [n, m] (d_storage: uint8 for FP8 codes); pre_gelu_out [n, m]; bias_grad [len].
  Shape d_shape;
  DType d_storage = DType::kBFloat16;
  bool has_pre_gelu = false;
  DType pre_gelu_dtype = DType::kBFloat16;
  bool has_bias_grad = false;
  DType bias_grad_dtype = DType::kBFloat16;
  int64_t bias_grad_len = 0;
  // Workspace: byte offsets from the workspace pointer aligned up to kWorkspaceAlign; workspace_bytes includes the
  // alignment slack. -1: not in the workspace.
  int64_t workspace_bytes = 0;
  int64_t amax_offset = -1;        // float [1]: FP8 D's fresh amax, max-merged into d_amax afterwards
  int64_t fallback_offset = -1;    // the unfused epilogue's scratch (fallback_bytes), when reserved
  int64_t lt_offset = -1;          // cuBLASLt's workspace (kLtWorkspaceBytes), when reserved
  int64_t alpha_offset = -1;       // float [2]: NVFP4's device [alpha', beta] (CUDA)
  // The unfused epilogue's scratch: [alpha, 0] device scalars (kWorkspaceAlign bytes), then the FP32 accumulator
  // [n, m]. 0 when the call cannot take that path (CPU; no epilogue and k > 0).
  int64_t fallback_bytes = 0;
  // MXFP8 / NVFP4 operands on a GPU without their native GEMM (sm_90, SPEC §6.7): each operand is decoded once into
  // a bf16 [rows, cols] matrix at these offsets (-1: not decoded), then the bf16 GEMM runs with the same layout (and
  // NVFP4's global factors in the device alpha'). decode_block says the plan takes this path.
  bool decode_block = false;
  int64_t a_decode_offset = -1;
  int64_t b_decode_offset = -1;
};

// Whether MXFP8 / NVFP4 GEMMs run natively on the context's device (sm_100+ with cuBLASLt >= 12.8); false on the
// CPU and without CUDA. Elsewhere plan_gemm decodes the operands (GemmPlan::decode_block).
bool gemm_block_native(const ExecCtx& ctx);
// The workspace bytes the decode of one MXFP8 / NVFP4 operand of [rows, cols] elements takes (bf16, aligned).
int64_t gemm_decode_bytes(int64_t rows, int64_t cols);

GemmPlan plan_gemm(const GemmRequest& r, const ExecCtx& ctx, GemmPlanOptions opt = {});

// The buffers of one call; pointers per the plan (absent pieces null). io.alloc (optional) returns fallback_bytes of
// device memory, stream-ordered, for a frontend whose plan did not reserve it.
struct GemmIO {
  const void* a = nullptr;
  const void* a_scale_inv = nullptr;
  const void* b = nullptr;
  const void* b_scale_inv = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  void* bias_grad = nullptr;
  void* pre_gelu_out = nullptr;
  const void* gelu_in = nullptr;
  const float* d_scale = nullptr;
  float* d_amax = nullptr;
  float* d_scale_inv = nullptr;
  const float* alpha_beta = nullptr;
  const float* a_amax = nullptr;    // NVFP4: the operands' global amaxes
  const float* b_amax = nullptr;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  void* lt_workspace = nullptr;     // when the plan reserves none
  int64_t lt_workspace_bytes = 0;
  void* (*alloc)(void* alloc_ctx, int64_t bytes) = nullptr;
  void* alloc_ctx = nullptr;
};

void run_gemm(const GemmPlan& plan, const GemmIO& io, const ExecCtx& ctx);

// The GEMM-operand description used in every message: "A [32, 24] E4M3".
std::string gemm_operand_desc(const char* name, const Shape& s, DType d);

}  // namespace ops
}  // namespace te
