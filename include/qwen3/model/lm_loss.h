// Mean next-token cross-entropy of `hidden · weightᵀ` without ever holding the [N, vocab] logits: the vocabulary
// is walked in slices (an online log-sum-exp in forward, the same slices recomputed in backward), so memory is
// N × slice instead of 3 × N × 151936 floats, and the weight gradient is written slice by slice in place.
#pragma once
#include <ATen/core/Tensor.h>

namespace qwen3 {

// hidden [N, H], weight [V, H] (same dtype), targets int64 [N] with -100 = ignored. Logits are formed in the
// weights' dtype (as a plain linear layer would) and reduced in fp32. Returns a 0-dim fp32 tensor: the mean
// over non-ignored targets (0 when there are none). `slice_elements` bounds N × slice.
// `accumulate_into_weight_grad` (for a leaf weight that requires grad): backward adds the weight's gradient
// into weight.grad() in place, slice by slice, instead of returning a [V, H] gradient for autograd to
// accumulate; that saves one or two [V, H] tensors (for a tied embedding, autograd would otherwise sum the
// head's and the lookup's gradients out of place). torch::autograd::grad then gets no gradient for the weight.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t slice_elements = int64_t{1} << 24, bool accumulate_into_weight_grad = false);

}  // namespace qwen3
