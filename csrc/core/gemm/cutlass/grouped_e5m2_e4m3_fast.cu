// E5M2 lhs (gradients) × E4M3 rhs [groups, n, k], per-tensor lhs scale and per-group rhs scales → bf16,
// FastAccum (grouped_cutlass.cuh).
#include "grouped_cutlass.cuh"
TE_GROUPED_CUTLASS_KIND(kE5m2E4m3NkFast, cutlass::float_e5m2_t, cutlass::float_e4m3_t, cutlass::layout::ColumnMajor, true,
                        true, "cutlass sm90 grouped E5M2xE4M3 NK fast accum")
