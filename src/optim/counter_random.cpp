#include "optim/counter_random.h"

#include <ATen/ATen.h>

#include "adamw_update.cuh"

#include "qwen3/optim/optim.h"

namespace qwen3::optim_detail {
namespace {

// SplitMix64's finalizer, on the host (unsigned arithmetic wraps by definition).
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t step_key(uint64_t seed, int64_t step, int64_t param_index) {
  uint64_t key = mix64(seed ^ 0x6A09E667F3BCC909ULL);
  key = mix64(key ^ static_cast<uint64_t>(step));
  return mix64(key ^ static_cast<uint64_t>(param_index));
}

// The tensor forms below run the element rules of kernels/adamw_update.cuh on the host (tests and
// to_bfloat16_stochastic); the optimizer itself calls the element rules directly.

at::Tensor random_bits(uint64_t key, int64_t first_index, int64_t rows, int64_t cols, const at::Device& device) {
  at::Tensor bits = at::empty({rows, cols}, at::kLong);
  int64_t* out = bits.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows * cols; ++i)
    out[i] = kernels::adamw::random_bits(key, static_cast<uint64_t>(first_index + i));
  return bits.to(device);
}

at::Tensor uniform_from_bits(const at::Tensor& bits) {
  const at::Tensor in = bits.to(at::kCPU, at::kLong).contiguous();
  at::Tensor out = at::empty(in.sizes(), at::kFloat);
  for (int64_t i = 0; i < in.numel(); ++i)
    out.data_ptr<float>()[i] = kernels::adamw::uniform_from_bits(static_cast<uint32_t>(in.data_ptr<int64_t>()[i]));
  return out.to(bits.device());
}

at::Tensor bfloat16_stochastic_from_bits(const at::Tensor& x_fp32, const at::Tensor& bits) {
  const at::Tensor x = x_fp32.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor b = bits.to(at::kCPU, at::kLong).contiguous();
  at::Tensor out = at::empty(x.sizes(), at::kBFloat16);
  auto* rounded = static_cast<uint16_t*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i)
    rounded[i] = kernels::adamw::bf16_stochastic(x.data_ptr<float>()[i], static_cast<uint32_t>(b.data_ptr<int64_t>()[i]));
  return out.to(x_fp32.device());
}

}  // namespace qwen3::optim_detail

namespace qwen3 {

at::Tensor to_bfloat16_stochastic(const at::Tensor& x, at::Generator& gen) {
  const at::Tensor x_fp32 = x.to(at::kFloat);
  const at::Tensor bits =
      at::randint(0, 1 << 16, x_fp32.sizes(), gen, at::TensorOptions().dtype(at::kLong).device(x.device()));
  return optim_detail::bfloat16_stochastic_from_bits(x_fp32, bits);
}

}  // namespace qwen3
