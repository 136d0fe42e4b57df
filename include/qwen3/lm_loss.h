// Mean next-token cross-entropy of `hidden · weightᵀ` without ever holding the [N, vocab] logits: the vocabulary
// is walked in slices (an online log-sum-exp in forward, the same slices recomputed in backward), so memory is
// N × slice instead of 3 × N × 151936 floats, and the weight gradient is written slice by slice in place.
#pragma once
#include <ATen/core/Tensor.h>

namespace qwen3 {

// hidden [N, H], weight [V, H] (same dtype), targets int64 [N] with -100 = ignored. Logits are formed in the
// weights' dtype (as a plain linear layer would) and reduced in fp32. Returns a 0-dim fp32 tensor: the mean
// over non-ignored targets (0 when there are none). `slice_elements` bounds N × slice.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t slice_elements = int64_t{1} << 24);

}  // namespace qwen3
