// Per-tensor FP8 (SPEC §4.3, §4.4, §5.1): delayed and current scaling. The encode rule of a scaled value, and the
// format's standalone kernels: dequantize, the byte transpose of the codes (the columnwise copy), the delayed-scaling
// update. The codecs themselves (float2_to_fp8x2, fp8_to_float) are rules/numerics.h's; the current scale rule is
// rules/scaling.h's.
#pragma once

#include "../../rules/common.h"
#include "../../rules/numerics.h"
#include "../../rules/scaling.h"
#include "../scale_mode.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {

// The scaled value an FP8 mode encodes (SPEC §5.1): current scaling rounds to the input dtype first.
template <typename InT> TE_HD float fp8_scaled_value(float v, ScaleMode mode, float scale) {
  const float w = mode == ScaleMode::kCurrent ? round_to<InT>(v) : v;
  return w * scale;
}

// out[i] = round_to(out_dtype, fp8(code[i]) * scale_inv[0]).
void dequantize_fp8_cpu(const uint8_t* codes, const float* scale_inv, int64_t n, bool e4m3, DType out_dtype,
                        void* out);
// out[k, m] = in[m, k] for bytes.
void transpose_bytes_cpu(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out);
// SPEC §4.3 for one history/scale pair; `reduced` points at this pair's slice of the reduction buffer or null.
void delayed_update_cpu(float* history, int64_t hist_len, int64_t n, float* scale, const float* reduced,
                        AmaxAlgo algo, float max_over_margin);

#if defined(TE_WITH_CUDA)
void dequantize_fp8_cuda(const uint8_t* codes, const float* scale_inv, int64_t n, bool e4m3, DType out_dtype,
                         void* out, cudaStream_t s);
// `noop` (device, optional): 1.0 writes nothing (the norm's fused FP8 path passes its quantizer's flag).
void transpose_bytes_cuda(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t s,
                          const float* noop = nullptr);
void delayed_update_cuda(float* history, int64_t hist_len, int64_t n, float* scale, const float* reduced,
                         AmaxAlgo algo, float max_over_margin, cudaStream_t s);
#endif

}  // namespace te
