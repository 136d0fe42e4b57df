// NVFP4 on libtorch tensors: the canonical codec (qwen3/nvfp4/nvfp4.h) for CPU tensors and the CUDA kernels
// (kernels/qwen3_kernels.h) for CUDA tensors, which give the same bytes.
#pragma once
#include <ATen/core/Tensor.h>

#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3::nvfp4 {

struct Quantized {
  at::Tensor codes;   // uint8 [rows, cols/2]: element 2j in the low nibble
  at::Tensor scales;  // uint8 [rows, cols/16]: E4M3FN codes
};

// x: 2-D float32/bfloat16/float16 on CPU or CUDA, cols % 16 == 0; the result is on x's device. float64 is
// accepted too (tests, references) and rounded to its fp32 view first.
// Non-finite input: on CPU a qwen3::Error naming the row and column. On CUDA the check would cost a device
// synchronization per call, so it is only done when `check_finite` is true (then the same Error, without the
// position); otherwise the bytes of a block with a non-finite value are unspecified.
Quantized quantize(const at::Tensor& x, ScaleMode mode = ScaleMode::rne, bool check_finite = false);

// codes uint8 [rows, cols/2]; scales [rows, cols/16] as uint8 E4M3 codes, or float16/float32 numeric scales
// (older files). The result is [rows, cols] in `dtype` (float32, bfloat16, float16 or float64), on the codes'
// device. With E4M3 scales every value is exact in each of them; numeric scales are multiplied in fp32.
at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype);

// CUDA quantize calls without check_finite raise a sticky per-device flag when they meet a non-finite input.
// This reads and clears it (one device synchronization: call it where the caller synchronizes anyway, e.g.
// once per training step). Always false for a CPU device, whose quantize throws at once.
bool take_nonfinite_flag(const at::Device& device);
// The same without synchronizing: the flag's value as an int32 [1] tensor on the device (undefined for a CPU
// device), the flag itself cleared in stream order, for the caller to read with its other step results.
at::Tensor take_nonfinite_flag_async(const at::Device& device);
// The flag itself (int32 [1] on the device; undefined for a CPU device or a build without CUDA), for a kernel
// outside this module that quantizes and raises it the same way (the AdamW update writing a weight's operand).
at::Tensor nonfinite_flag_of(const at::Device& device);

}  // namespace qwen3::nvfp4
