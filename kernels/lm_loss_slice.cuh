// Element rules of the sliced loss's kernels (lm_loss_slice.cu): the online softmax statistics of a row of logits
// (running max and sum of exponentials, merged slice by slice) and the gradient of one logit. __host__ __device__:
// the kernels run them on the GPU; tests/test_lm_loss.cpp runs them on the host against linear_cross_entropy's
// libtorch path (the CPU one), so the arithmetic is checked in every CI run. Design: kernels/lm_loss_slice.md.
#pragma once
#include <cmath>
#include <cstdint>

#include "fused_ops.cuh"

namespace qwen3::kernels::loss {

using fused::load;
using fused::round_to;
using fused::store;

// A row's (max, sum of exp(x - max)) so far. The empty row is (-inf, 0).
struct SoftmaxStats {
  float max;
  float sum;
};

QWEN3_HD SoftmaxStats empty_stats() { return {-INFINITY, 0.0f}; }

// Two rows' statistics as one. (The max is never NaN: a NaN logit makes the sum NaN, and that stays.)
QWEN3_HD SoftmaxStats merge(SoftmaxStats a, SoftmaxStats b) {
  const float m = a.max > b.max ? a.max : b.max;
  if (m == -INFINITY) return {m, a.sum + b.sum};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// One more logit: the running maximum rescales the sum when it grows.
QWEN3_HD SoftmaxStats add(SoftmaxStats s, float x) {
  if (x > s.max) return {x, s.sum * expf(s.max - x) + 1.0f};
  return {s.max, s.sum + expf(x - s.max)};  // x NaN: expf(NaN) makes the sum NaN
}

// d loss / d logit of one logit: (softmax - onehot) * row_scale, in the order the libtorch path computes it
// (exp(l - lse), the target's -1 added, the row's scale multiplied; each op rounded to fp32 on its own), then
// rounded to the activation dtype as its cast does. row_scale = valid * upstream gradient / count of valid targets.
template <bool kBf16>
QWEN3_HD float logit_gradient(float logit, float lse, bool is_target, float row_scale) {
  const float p = expf(codec::sub_rn(logit, lse));
  return round_to<kBf16>(codec::mul_rn(is_target ? codec::add_rn(p, -1.0f) : p, row_scale));
}

}  // namespace qwen3::kernels::loss
