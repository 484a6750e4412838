// The tensor-core grouped GEMMs (CUTLASS 3.x Hopper kernels with device-side problem shapes), one translation unit
// per operand pairing so that a build compiles them in parallel. Built only when the CUTLASS headers are found
// (setup.py defines TE_WITH_CUTLASS); grouped_gemm_cuda.cu picks one or falls back to its portable kernel.
#pragma once

#include <cuda_runtime.h>

#include "grouped_gemm.h"

namespace te {
namespace grouped {

// Operands and rhs layout a CUTLASS kernel covers; D is bf16 in every one.
// FP8 kinds come in two accumulations: promoted to FP32 every few K steps (SPEC §6.3's split accumulator), or
// FastAccum (the tensor cores' own).
enum class CutlassKind : int {
  kNone = 0, kBf16Nk, kBf16Kn, kE4m3E4m3Nk, kE5m2E4m3Nk, kE4m3E4m3NkFast, kE5m2E4m3NkFast,
  kBf16Wgrad,  // d[g] [n, k] = dy rows ᵀ · x rows: A = dy (M-major), B = x (N-major), K = the group's rows
  kBlockE4m3E4m3, kBlockE5m2E4m3,  // FP8 blocks: lhs 1x128, rhs 128x128 tiles, [groups, n, k]
};

template <CutlassKind K> struct Cutlass {
  static const char* name();
  // The kernel's own workspace (per-SM TMA descriptors, scheduler state) plus the problem table for a.groups.
  static size_t workspace(const GroupedGemmArgs& a, int sms);
  // Setup kernel (problem table, zeroed tail) then the grouped kernel, on `stream`.
  static void run(const GroupedGemmArgs& a, cudaStream_t stream, int sms);
};

}  // namespace grouped
}  // namespace te
