// The CUDA side of the nvfp4 module: libtorch tensors in, kernels/ launchers called on the current stream.
// Compiled for real only with both the CUDA kernels and a CUDA libtorch; otherwise every function throws
// qwen3::Error (no CUDA tensor can reach them in such a build anyway).
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3::nvfp4 {

// x: contiguous 2-D float32/bfloat16/float16 CUDA tensor; codes and scales: preallocated uint8 outputs on
// x's device. A non-finite input raises the device's sticky flag (see take_nonfinite_flag); with
// check_finite the flag is read at once and the input re-quantized on the CPU to name the position.
void quantize_cuda(const at::Tensor& x, ScaleMode mode, bool check_finite, const at::Tensor& codes,
                   const at::Tensor& scales);

// quantize_cuda (check_finite off: the sticky flag) that also writes deq(codes, scales) in bf16 into `operand`
// (a contiguous bf16 [rows, cols] CUDA tensor) in the same pass: byte for byte dequantize_cuda's bf16 output.
// codes and scales may both be undefined tensors: then only the operand is written.
void quantize_with_operand_cuda(const at::Tensor& x, ScaleMode mode, const at::Tensor& codes, const at::Tensor& scales,
                                const at::Tensor& operand);

// quantize_with_operand_cuda of several inputs of one dtype and shape [rows, cols] into stacked outputs
// (codes [G, rows, cols/2] and scales [G, rows, cols/16], both undefined or both defined; operands [G, rows,
// cols] bf16): one launch for every 128 inputs (a mixture-of-experts block's experts).
void quantize_batch_with_operand_cuda(const std::vector<at::Tensor>& xs, ScaleMode mode, const at::Tensor& codes,
                                      const at::Tensor& scales, const at::Tensor& operands);

// A bf16 [rows, cols] view of the reused scratch buffer dequantize_into_scratch_cuda writes (same rules).
at::Tensor scratch_operand_cuda(const at::Device& device, int64_t rows, int64_t cols);

// codes/scales: contiguous uint8 CUDA tensors (E4M3 scales).
at::Tensor dequantize_cuda(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype);

// deq(codes, scales) in `dtype` written into a buffer that is reused across calls (one per device and dtype,
// grown to the largest weight seen, never freed): a view of it, valid until the next call on the same device.
// Every use is stream-ordered on the current stream, so the next call's dequantization waits for the products
// that read the previous one.
at::Tensor dequantize_into_scratch_cuda(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype);

// Whether matmul_cuda takes this activation (a bfloat16/float16 CUDA tensor with the kernels built).
bool matmul_cuda_supports(const at::Tensor& x);

// y [M, N] = x [M, K] · deq(W)ᵀ with W given as codes [N, K/2] and scales [N, K/16]; y in x's dtype, fp32
// accumulation, deq(W) never written to memory.
at::Tensor matmul_cuda(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales);

}  // namespace qwen3::nvfp4
