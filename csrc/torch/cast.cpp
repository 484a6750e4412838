// Cast-family ops that are not activations: FP8 dequantize, byte transpose, and the delayed-scaling update.
#include <cmath>

#include "bridge.h"

namespace te_torch {
namespace {

bool fp8_is_e4m3(const char* op, int64_t fp8_dtype) {
  TORCH_CHECK_VALUE(fp8_dtype == int64_t(te::DType::kFloat8E4M3) || fp8_dtype == int64_t(te::DType::kFloat8E5M2), op,
                    ": fp8_dtype must be kFloat8E4M3 (7) or kFloat8E5M2 (8), got ", std::to_string(fp8_dtype));
  return fp8_dtype == int64_t(te::DType::kFloat8E4M3);
}

Tensor dequantize_fp8(const Tensor& data, const Tensor& scale_inv, int64_t fp8_dtype, at::ScalarType otype) {
  const char* op = "dequantize_fp8";
  const bool e4m3 = fp8_is_e4m3(op, fp8_dtype);
  TORCH_CHECK_TYPE(data.scalar_type() == at::kByte, op, ": data must be uint8 FP8 codes, got ",
                   dtype_name(data.scalar_type()), " ", shape_str(data), "; pass the Float8Tensor's _data");
  check_scalar_f32(scale_inv, data, op, "scale_inv");
  Tensor out = new_empty(data.sizes(), data.options().dtype(otype));
  const te::DType odt = input_dtype(out, op, "output dtype");
  const Tensor d = data.contiguous();
  TE_DEVICE_GUARD(data);
  if (data.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::dequantize_fp8_cuda(d.data_ptr<uint8_t>(), scale_inv.data_ptr<float>(), d.numel(), e4m3, odt, out.data_ptr(),
                            current_stream());
#endif
  } else {
    te::dequantize_fp8_cpu(d.data_ptr<uint8_t>(), scale_inv.data_ptr<float>(), d.numel(), e4m3, odt, out.data_ptr());
  }
  return out;
}

// Flattened [M, K] view of a byte tensor: K = last dim.
std::pair<int64_t, int64_t> rows_cols(const Tensor& x) {
  const int64_t k = x.dim() == 0 ? 1 : x.size(-1);
  return {k > 0 ? x.numel() / k : 0, k};
}

void fp8_transpose_into(const Tensor& x, const Tensor& out) {
  const char* op = "fp8_transpose";
  TORCH_CHECK_TYPE(x.scalar_type() == at::kByte, op, ": input must be uint8 FP8 codes, got ",
                   dtype_name(x.scalar_type()), " ", shape_str(x), " on ", x.device().str(),
                   "; pass FP8 bytes (a Float8Tensor's _data, or a float8_e4m3fn / float8_e5m2 tensor)");
  const auto [rows, cols] = rows_cols(x);
  TORCH_CHECK_VALUE(out.scalar_type() == at::kByte && out.numel() == x.numel() && out.is_contiguous() &&
                        out.device() == x.device() && (out.dim() == 0 || out.size(0) == cols),
                    op, ": out must be a contiguous uint8 tensor of shape [", std::to_string(cols), ", ", std::to_string(rows), "] on ",
                    x.device().str(), ", got ", dtype_name(out.scalar_type()), " ", shape_str(out));
  const Tensor xc = x.contiguous();
  TE_DEVICE_GUARD(x);
  if (x.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::transpose_bytes_cuda(xc.data_ptr<uint8_t>(), rows, cols, out.data_ptr<uint8_t>(), current_stream());
#endif
  } else {
    te::transpose_bytes_cpu(xc.data_ptr<uint8_t>(), rows, cols, out.data_ptr<uint8_t>());
  }
}

Tensor fp8_transpose(const Tensor& x) {
  const auto [rows, cols] = rows_cols(x);
  Tensor out = new_empty({cols, rows}, x.options());
  fp8_transpose_into(x, out);
  return out;
}

void fused_amax_and_scale_update(const c10::optional<Tensor>& reduction_buffer, at::TensorList histories,
                                 at::TensorList scales, c10::string_view algo, int64_t fp8_dtype, double margin) {
  const char* op = "fused_amax_and_scale_update_after_reduction";
  TORCH_CHECK_VALUE(histories.size() == scales.size(), op, ": got ", std::to_string(histories.size()), " amax histories but ",
                    std::to_string(scales.size()), " scale tensors");
  te::AmaxAlgo a;
  if (algo == "max") {
    a = te::AmaxAlgo::kMax;
  } else if (algo == "most_recent") {
    a = te::AmaxAlgo::kMostRecent;
  } else {
    TORCH_CHECK_VALUE(false, op, ": amax_compute_algo must be \"max\" or \"most_recent\", got \"", algo, "\"");
  }
  const float max_over_margin = float(te::fp8_max(fp8_is_e4m3(op, fp8_dtype))) * std::exp2f(-float(margin));
  int64_t offset = 0;
  for (size_t i = 0; i < histories.size(); ++i) {
    const Tensor& h = histories[i];
    const Tensor& s = scales[i];
    TORCH_CHECK_VALUE(h.scalar_type() == at::kFloat && h.dim() == 2 && h.is_contiguous(), op, ": amax_histories[", std::to_string(i),
                      "] must be a contiguous float32 [L, n] tensor, got ", dtype_name(h.scalar_type()), " ",
                      shape_str(h));
    // Row 0 is the current step's amax: a history without rows has nowhere to keep it (and nothing to roll).
    TORCH_CHECK_VALUE(h.size(0) >= 1, op, ": amax_histories[", std::to_string(i), "] ", shape_str(h),
                      " has length 0; an amax history needs at least one row (row 0 holds the current amax). Use "
                      "amax_history_len >= 1");
    const int64_t n = h.size(1);
    TORCH_CHECK_VALUE(s.scalar_type() == at::kFloat && s.numel() == n && s.is_contiguous() && s.device() == h.device(),
                      op, ": scales[", std::to_string(i), "] must be a contiguous float32 tensor of ", std::to_string(n),
                      " elements on ",
                      h.device().str(), ", got ", dtype_name(s.scalar_type()), " ", shape_str(s));
    const float* red = nullptr;
    if (reduction_buffer.has_value() && reduction_buffer->numel() > 0) {
      const Tensor& b = *reduction_buffer;
      TORCH_CHECK_VALUE(b.scalar_type() == at::kFloat && b.is_contiguous() && b.device() == h.device() &&
                            b.numel() >= offset + n,
                        op, ": amax_reduction_buffer must be a contiguous float32 tensor holding the row-0 amaxes of "
                        "every history (", std::to_string(offset + n), "+ elements), got ", shape_str(b));
      red = b.data_ptr<float>() + offset;
    }
    offset += n;
    TE_DEVICE_GUARD(h);
    if (h.is_cuda()) {
#if defined(TE_WITH_CUDA)
      te::delayed_update_cuda(h.data_ptr<float>(), h.size(0), n, s.data_ptr<float>(), red, a, max_over_margin,
                              current_stream());
#endif
    } else {
      te::delayed_update_cpu(h.data_ptr<float>(), h.size(0), n, s.data_ptr<float>(), red, a, max_over_margin);
    }
  }
}

}  // namespace

static void cast_impls(torch::Library& m) {
  m.impl("dequantize_fp8", &dequantize_fp8);
  m.impl("fp8_transpose", &fp8_transpose);
  m.impl("fp8_transpose_into", &fp8_transpose_into);
  m.impl("fused_amax_and_scale_update", &fused_amax_and_scale_update);
}
TE_IMPL_CPU_AND_CUDA(cast_impls)

}  // namespace te_torch
