// Grouped GEMM with the group sizes on the device (mixture-of-experts): one launch multiplies every expert's rows by
// its own weight, reading the sizes where they live, so nothing waits for the host and the call can be recorded
// into a CUDA graph or an XLA command buffer.
//
//   lhs [m_total, k] row-major, its rows grouped by expert in order;  rhs [groups, n, k] ("NK") or [groups, k, n]
//   ("KN");  group_sizes int32 [groups];  d [m_total, n] row-major:  d[rows of g] = lhs[rows of g] · rhs[g]ᵀ (NK).
//
// Group g owns rows [min(o_g, m_total), min(o_g + max(s_g, 0), m_total)), o_g = Σ_{h<g} max(s_h, 0): a negative size
// counts as 0 and sizes summing past m_total are cut at m_total (the groups past it get no rows); the rows past the
// last group's end are written as zeros. These are rules, not errors, because the sizes are only known on the device.
// FP8 per-tensor operands: lhs has one scale_inv [1], rhs one per group [groups]; d = (lhs·rhs[g]ᵀ)·s_lhs·s_rhs[g].
// FP8 block operands (block_scaling; SPEC §4.7/§4.8 layouts, [groups, n, k] rhs only): lhs 1x128 blocks along k,
// scale_inv [ceil(k/128), roundup(m_total, 4)] (rows contiguous); rhs[g] 128x128 tiles, scale_inv
// [groups, ceil(n/128), roundup(ceil(k/128), 4)]; d = Σ_kb (lhs block · rhs tile)·s_lhs[kb, row]·s_rhs[g, nb, kb].
//
// The weight-gradient form (wgrad) contracts the grouped rows instead: lhs [m_total, n] (dy), rhs [m_total, k] (x),
// d [groups, n, k] with d[g] = lhs[rows of g]ᵀ · rhs[rows of g] (zeros for a group without rows); plain operands only.
// Invariant: the CPU kernel and the CUDA launcher read the same args and the same rules; the user-facing checks live
// in the op above (ops/grouped_gemm_op.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gemm.h"

namespace te {

// The operands' and the output's memory, as the op layer (ops/grouped_gemm_op.h GroupedGemmIO) receives it from a
// frontend and the kernels take it: one list, copied as a whole.
struct GroupedGemmOperands {
  const void* lhs = nullptr;            // [m_total, k]
  const void* rhs = nullptr;            // [groups, n, k] or [groups, k, n] (rhs_kn)
  const int32_t* group_sizes = nullptr; // [groups], on the operands' device
  const float* lhs_scale_inv = nullptr; // FP8: [1]; block_scaling: [ceil(k/128), roundup(m_total, 4)]
  const float* rhs_scale_inv = nullptr; // FP8: [groups]; block_scaling: [groups, ceil(n/128), roundup(ceil(k/128), 4)]
  void* d = nullptr;                    // [m_total, n]
};

struct GroupedGemmArgs : GroupedGemmOperands {
  DType lhs_dtype = DType::kBFloat16;
  DType rhs_dtype = DType::kBFloat16;
  bool rhs_kn = false;
  bool wgrad = false;                   // the weight-gradient form above: rhs [m_total, k], d [groups, n, k]
  bool block_scaling = false;           // FP8 lhs 1x128 x rhs 128x128 (above) instead of per-tensor scales
  DType d_dtype = DType::kBFloat16;
  int64_t m_total = 0, n = 0, k = 0, groups = 0;
  bool fast_accum = false;              // FP8: the tensor cores' reduced-precision accumulation (no promotion)
  void* workspace = nullptr;            // CUDA: grouped_gemm_workspace_bytes(...) bytes, 256-B aligned
  size_t workspace_bytes = 0;
};

// A group's row count as the rules above count it (host and device).
TE_HD int64_t grouped_gemm_clamp_size(int32_t s) { return s > 0 ? int64_t(s) : 0; }

// The FP8 block-scale geometry of the layouts above (host and device).
constexpr int64_t kGroupedBlock = 128;
TE_HD int64_t grouped_kb(int64_t k) { return (k + kGroupedBlock - 1) / kGroupedBlock; }           // k blocks
TE_HD int64_t grouped_nb(int64_t n) { return (n + kGroupedBlock - 1) / kGroupedBlock; }           // n tiles
TE_HD int64_t grouped_lhs_scale_ld(int64_t m_total) { return (m_total + 3) / 4 * 4; }             // lhs: rows, padded
TE_HD int64_t grouped_rhs_scale_ld(int64_t k) { return (grouped_kb(k) + 3) / 4 * 4; }             // rhs: k blocks, padded

// CPU: each group through gemm_cpu (exact decode, FP64 accumulation, one rounding); group_sizes in host memory.
void grouped_gemm_cpu(const GroupedGemmArgs& g, const ParallelFor& parallel_for);

#if defined(TE_WITH_CUDA)
// Device bytes the CUDA launcher needs for `groups` groups on a device of up to `max_sms` multiprocessors (the
// per-group problem table and pointer arrays, and the kernel's own per-SM descriptors), without the 256-B slack.
size_t grouped_gemm_workspace_bytes(const GroupedGemmArgs& g, int max_sms);
// Whether a fast (tensor-core) kernel takes these operand formats and layout in this build; otherwise the launcher
// runs the portable kernel (correct, slow). "cutlass sm90 ..." / "portable": what runs, for messages and benchmarks.
const char* grouped_gemm_kernel_name(const GroupedGemmArgs& g);
// On `stream`: a setup kernel turns group_sizes into the problem table and zeroes the uncovered rows, then one
// persistent grouped kernel runs every group. Never synchronises the host, never allocates.
void grouped_gemm_cuda(const GroupedGemmArgs& g, cudaStream_t stream);
// The multiprocessor count plans reserve the workspace for (a device with more runs on this many).
int grouped_gemm_max_sms();
#endif

}  // namespace te
