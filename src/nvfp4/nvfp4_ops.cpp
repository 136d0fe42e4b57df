// Tensor-level NVFP4: shape and dtype checks, then the CPU codec or the CUDA kernels by device.
#include "qwen3/nvfp4/nvfp4_ops.h"

#include <ATen/ATen.h>

#include <array>
#include <string>

#include "nvfp4/nvfp4_cuda.h"
#include "qwen3/base/error.h"
#include "qwen3/base/message_text.h"

namespace qwen3::nvfp4 {
namespace {


// float64 is accepted for tests and references: quantize rounds it to the fp32 view first.
bool is_float_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble;
}

void check_quantize_input(const at::Tensor& x) {
  if (x.dim() != 2 || x.size(1) % kBlock != 0)
    throw Error("nvfp4 quantize: input shape " + shape_text(x.sizes()) + " must be 2-D with columns a multiple of 16");
  if (!is_float_dtype(x.scalar_type()))
    throw Error(std::string("nvfp4 quantize: input dtype ") + c10::toString(x.scalar_type()) +
                " is not float32, bfloat16, float16 or float64");
}

void check_dequantize_input(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype) {
  if (codes.dim() != 2 || codes.scalar_type() != at::kByte)
    throw Error("nvfp4 dequantize: codes must be a 2-D uint8 tensor, got " + shape_text(codes.sizes()) + " " +
                c10::toString(codes.scalar_type()));
  if (scales.dim() != 2 || scales.size(0) != codes.size(0) || scales.size(1) * (kBlock / 2) != codes.size(1))
    throw Error("nvfp4 dequantize: scales shape " + shape_text(scales.sizes()) + " does not match codes shape " +
                shape_text(codes.sizes()) + " (expected [rows, 2 * code_cols / 16])");
  const at::ScalarType scale_type = scales.scalar_type();
  if (scale_type != at::kByte && scale_type != at::kHalf && scale_type != at::kFloat)
    throw Error(std::string("nvfp4 dequantize: scales dtype ") + c10::toString(scale_type) +
                " is not uint8 (E4M3), float16 or float32");
  if (!is_float_dtype(dtype))
    throw Error(std::string("nvfp4 dequantize: output dtype ") + c10::toString(dtype) +
                " is not float32, bfloat16, float16 or float64");
  if (codes.device() != scales.device())
    throw Error("nvfp4 dequantize: codes and scales are on different devices");
}

// Numeric (float16/float32) scales come from older files only; plain tensor ops on any device suffice.
at::Tensor dequantize_numeric_scales(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype) {
  const int64_t rows = codes.size(0);
  const int64_t cols = codes.size(1) * 2;
  std::array<float, 16> e2m1_table;
  for (int code = 0; code < 16; ++code) e2m1_table[code] = e2m1_to_float(static_cast<uint8_t>(code));
  const at::Tensor e2m1_values = at::tensor(e2m1_table, at::kFloat).to(codes.device());
  const at::Tensor wide = codes.to(at::kLong);
  // Element 2j is the low nibble: stacking (low, high) on a last axis puts them in that order.
  const at::Tensor nibbles = at::stack({at::bitwise_and(wide, 15), at::bitwise_right_shift(wide, 4)}, -1);
  const at::Tensor values = e2m1_values.index_select(0, nibbles.flatten()).view({rows, cols / kBlock, kBlock});
  return (values * scales.to(at::kFloat).unsqueeze(-1)).view({rows, cols}).to(dtype);
}

}  // namespace

Quantized quantize(const at::Tensor& x, ScaleMode mode, bool check_finite) {
  check_quantize_input(x);
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const auto byte_options = x.options().dtype(at::kByte);
  Quantized result{at::empty({rows, cols / 2}, byte_options), at::empty({rows, cols / kBlock}, byte_options)};
  if (x.is_cuda()) {
    const at::Tensor x_view = x.scalar_type() == at::kDouble ? x.to(at::kFloat) : x.contiguous();
    quantize_cuda(x_view, mode, check_finite, result.codes, result.scales);
    return result;
  }
  if (!x.device().is_cpu())
    throw Error("nvfp4 quantize: unsupported device " + x.device().str());
  const at::Tensor x_fp32 = x.to(at::kFloat).contiguous();
  quantize_rows_cpu(x_fp32.data_ptr<float>(), rows, cols, result.codes.data_ptr<uint8_t>(),
                    result.scales.data_ptr<uint8_t>(), mode);
  return result;
}

at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype) {
  check_dequantize_input(codes, scales, dtype);
  if (scales.scalar_type() != at::kByte) return dequantize_numeric_scales(codes, scales, dtype);
  if (codes.is_cuda()) {
    if (dtype == at::kDouble) return dequantize_cuda(codes.contiguous(), scales.contiguous(), at::kFloat).to(dtype);
    return dequantize_cuda(codes.contiguous(), scales.contiguous(), dtype);
  }
  if (!codes.device().is_cpu())
    throw Error("nvfp4 dequantize: unsupported device " + codes.device().str());
  const at::Tensor codes_cpu = codes.contiguous();
  const at::Tensor scales_cpu = scales.contiguous();
  at::Tensor out = at::empty({codes.size(0), codes.size(1) * 2}, codes.options().dtype(at::kFloat));
  dequantize_rows_cpu(codes_cpu.data_ptr<uint8_t>(), scales_cpu.data_ptr<uint8_t>(), out.size(0), out.size(1),
                      out.data_ptr<float>());
  // Every E2M1 x E4M3 product is exact in bf16, fp16 and fp64 too, so this conversion loses nothing.
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace qwen3::nvfp4
