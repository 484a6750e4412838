// CPU kernels of per-tensor FP8 (fp8.h): dequantize, byte transpose, delayed-scaling update.
#include "fp8.h"

#include "../../rules/dispatch.h"

namespace te {

void dequantize_fp8_cpu(const uint8_t* codes, const float* scale_inv, int64_t n, bool e4m3, DType out_dtype,
                        void* out) {
  const float si = *scale_inv;
  TE_SWITCH_IN_DTYPE(out_dtype, T, {
    for (int64_t i = 0; i < n; ++i) static_cast<T*>(out)[i] = from_float<T>(fp8_to_float(codes[i], e4m3) * si);
  });
}

void transpose_bytes_cpu(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

void delayed_update_cpu(float* history, int64_t hist_len, int64_t n, float* scale, const float* reduced,
                        AmaxAlgo algo, float max_over_margin) {
  for (int64_t c = 0; c < n; ++c)
    delayed_update_slot(history, hist_len, n, c, scale, reduced != nullptr, reduced ? reduced[c] : 0.0f, algo,
                        max_over_margin);
}

}  // namespace te
