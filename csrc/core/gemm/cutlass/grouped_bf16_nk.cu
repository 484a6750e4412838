// bf16 lhs × bf16 rhs [groups, n, k] → bf16 (grouped_cutlass.cuh).
#include "grouped_cutlass.cuh"
TE_GROUPED_CUTLASS_KIND(kBf16Nk, cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, false, false,
                        "cutlass sm90 grouped bf16 NK")
