#include "optim/counter_random.h"

#include <ATen/ATen.h>

#include "qwen3/optim.h"

namespace qwen3::optim_detail {
namespace {

constexpr int64_t kLow32 = 0xFFFFFFFF;
constexpr int64_t kMultiplier1 = 0x7FEB352D;
constexpr int64_t kMultiplier2 = 0x2C1B3C6D;

// SplitMix64's finalizer, on the host (unsigned arithmetic wraps by definition).
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A 32-bit xorshift-multiply mixer (the shape of Wellons' lowbias32) on int64 tensors holding 32-bit values.
// Both multipliers are odd and below 2^31, so every product stays below 2^63: no signed overflow anywhere,
// which keeps CPU and CUDA results identical and defined.
void mix32_(at::Tensor& h) {
  h.bitwise_xor_(at::bitwise_right_shift(h, 16));
  h.mul_(kMultiplier1).bitwise_and_(kLow32);
  h.bitwise_xor_(at::bitwise_right_shift(h, 15));
  h.mul_(kMultiplier2).bitwise_and_(kLow32);
  h.bitwise_xor_(at::bitwise_right_shift(h, 16));
}

}  // namespace

uint64_t stream_key(uint64_t seed, int64_t step, int64_t param_index, RandomStream stream) {
  uint64_t key = mix64(seed ^ 0x6A09E667F3BCC909ULL);
  key = mix64(key ^ static_cast<uint64_t>(step));
  key = mix64(key ^ static_cast<uint64_t>(param_index));
  return mix64(key ^ static_cast<uint64_t>(stream));
}

at::Tensor random_bits(uint64_t key, int64_t first_index, int64_t rows, int64_t cols, const at::Device& device) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor index = at::arange(first_index, first_index + rows * cols, options).view({rows, cols});
  const int64_t key_low = static_cast<int64_t>(key & 0xFFFFFFFFULL);
  const int64_t key_high = static_cast<int64_t>(key >> 32);
  // Two keyed rounds: the low index bits with the low key, then the high index bits (0 below 2^32 elements)
  // with the high key, so different keys give unrelated streams rather than permutations of one another.
  at::Tensor h = at::bitwise_and(index, kLow32).bitwise_xor_(key_low);
  mix32_(h);
  h.bitwise_xor_(at::bitwise_right_shift(index, 32).bitwise_xor_(key_high));
  mix32_(h);
  return h;
}

at::Tensor uniform_from_bits(const at::Tensor& bits) {
  return at::bitwise_right_shift(bits, 8).to(at::kFloat).mul_(1.0 / 16777216.0);
}

at::Tensor bfloat16_stochastic_from_bits(const at::Tensor& x_fp32, const at::Tensor& bits) {
  // The fp32 bit pattern as an unsigned 32-bit value in int64, plus 16 random bits, keeps the top 16 bits: a
  // carry into them happens with probability (discarded bits) / 2^16. Sign-magnitude makes this symmetric.
  at::Tensor pattern = x_fp32.contiguous().view(at::kInt).to(at::kLong).bitwise_and_(kLow32);
  pattern.add_(at::bitwise_and(bits, int64_t{0xFFFF}));
  at::Tensor high = at::bitwise_right_shift(pattern, 16).bitwise_and_(int64_t{0xFFFF});
  // To int16's range without an out-of-range conversion: values >= 2^15 are the negative half.
  high.sub_(at::bitwise_right_shift(high, 15).mul_(int64_t{65536}));
  return high.to(at::kShort).view(at::kBFloat16);
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
