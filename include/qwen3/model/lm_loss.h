// Mean next-token cross-entropy of `hidden · weightᵀ` without ever holding the [N, vocab] logits: the vocabulary
// is walked in slices (an online log-sum-exp in forward, the same slices recomputed in backward), so memory is
// N × slice instead of 3 × N × 151936 floats, and the weight gradient is written slice by slice in place.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

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

// The vocabulary columns of one slice for N = `rows`: the most that keep rows × slice within `slice_elements`, in
// whole multiples of 128 (at least 256, at most the vocabulary). A multiple of 8 keeps every row of a bf16 slice's
// logits 16-byte aligned, which cuBLAS's Hopper kernels and the loss kernels' vector paths need: 2^24 / 2,047 rows
// (a packed 2048-token batch) was 8,196 columns, whose 16,392-byte rows sent the slice's three products to
// cuBLAS's Ampere kernels for 2-element-aligned operands (the third GPU round: 24.8 ms of its packed Qwen3-4B step,
// where a 512 x 4 batch's 2,044 rows gave 8,208 columns and Hopper kernels) and the gradient kernel to its
// element-a-thread path (92 µs a slice against 24). The loss, the memory model and the step-time model all take it.
int64_t loss_slice_width(int64_t rows, int64_t vocab, int64_t slice_elements = int64_t{1} << 24);

// transformers' load_balancing_loss_func (Switch Transformer's auxiliary loss) over the sparse blocks' router
// logits, each [N, E] for the same N tokens: softmax over the experts (fp32), the top k of each token, then
// E · Σ_e f_e · P_e with f_e the share of tokens that chose expert e in one of their k slots and P_e the mean
// routing probability of e, both over every block's tokens where `token_mask` [N] (bool; undefined: all) holds,
// as transformers weighs them by the attention mask. 0-dim fp32; differentiable in the logits (f_e is a count
// and carries no gradient). k for perfectly balanced routing.
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t top_k,
                               const at::Tensor& token_mask = {});

}  // namespace qwen3
