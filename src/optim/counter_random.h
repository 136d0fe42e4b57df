// Counter-based random bits for stochastic rounding: the bits of an element are a hash of (stream key, element
// index), so they do not depend on how a tensor is cut into chunks, on the device, or on any generator state.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace qwen3::optim_detail {

// The 64-bit key of one (seed, step, parameter), computed on the host: every stochastic rounding of that
// parameter's step draws from kernels::adamw::element_draws(key, element index).
uint64_t step_key(uint64_t seed, int64_t step, int64_t param_index);

// int64 tensor [rows, cols] on `device` of 32-bit hash values (0 .. 2^32-1) of the element indices
// first_index + r * cols + c under `key`. All arithmetic stays below 2^63, so it is the same on every device.
at::Tensor random_bits(uint64_t key, int64_t first_index, int64_t rows, int64_t cols, const at::Device& device);

// float32 uniform in [0, 1) from the top 24 of the 32 bits (exact in fp32).
at::Tensor uniform_from_bits(const at::Tensor& bits);

// fp32 -> bf16 rounding up (in magnitude) when the 16 discarded bits plus the low 16 random bits carry:
// unbiased, E[result] = x. Non-finite values stay non-finite.
at::Tensor bfloat16_stochastic_from_bits(const at::Tensor& x_fp32, const at::Tensor& bits);

}  // namespace qwen3::optim_detail
