// bf16 lhs × bf16 rhs [groups, k, n] → bf16 (grouped_cutlass.cuh).
#include "grouped_cutlass.cuh"
TE_GROUPED_CUTLASS_KIND(kBf16Kn, cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, false, false,
                        "cutlass sm90 grouped bf16 KN")
