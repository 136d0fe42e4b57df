// The NVFP4 projection of training, as functions the trainer installs as the model's projection op: the
// forward sees the weight as the canonical quantizer produces it, y = x · deq(Q(W))ᵀ, and the gradient passes
// straight through to the master weight W: dX = dY · deq(Q(W)), dW = dYᵀ · X (the straight-through estimator,
// docs/nvfp4.md). Frozen weights are held as their codes only.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3::nvfp4 {

// Rows of x (tokens) below which a CUDA product runs in the NVFP4 kernels (generation, small batches: the GEMV
// to 4 rows, the tensor-core kernel to 16); from this many rows on, the weight is dequantized into one reused
// scratch buffer and cuBLAS multiplies. Measured (H200, second GPU round, bench_kernels' speedup_vs_path, the
// five Qwen3-4B shapes): the kernels beat dequantize + cuBLAS at 1, 4 and 16 rows on every shape (1.09-3.59x)
// and lose at 64 on four of five (0.54-0.70x); 32 rows were not measured, so the kernels take what was.
constexpr int64_t kNvfp4KernelMaxRows = 17;

// Whether a straight-through product's output is read. `unread`: a node whose output only carries a gradient
// back, as a block's last projection where activation checkpointing runs the block again in backward (the
// recompute differentiates the block's output; nothing reads its value, Qwen3Model::run_block). Such a node
// saves what backward needs as ever (the codes, or the operand, made from the weight) and its backward is the
// same; the product itself is not run, and the output's bytes are unspecified (an allocation, never written).
enum class ProductOutput { computed, unread };

// y = x2d · deq(codes, scales)ᵀ in x2d's dtype by the path above (CPU: dequantize, then mm).
at::Tensor quantized_product(const at::Tensor& x2d, const at::Tensor& codes, const at::Tensor& scales);

// x [..., in], weight [out, in] (in % 16 == 0) -> [..., out] in x's dtype. One autograd node; backward saves
// x and the quantized weight (codes + scales, 0.5625 B per weight), never a dense copy of deq(Q(W)). The
// product is quantized_product's; backward's dX = dY · deq(Q(W)) dequantizes into the same scratch on CUDA.
// On CUDA with bf16 activations at training shapes, one kernel writes the codes and the bf16 operand together;
// with keep_operand the node saves that operand instead of the codes (2 bytes an element held until backward,
// no dequantization there): --keep-weight-operands backward, auto's choice under --grad-checkpoint, where a
// block's recompute and its backward follow each other (docs/trainer.md). Elsewhere keep_operand changes nothing.
// dW = dYᵀ·X in the weight's dtype (product_in_dtype).
// output: ProductOutput::unread for a node whose output nobody reads, only differentiates; the product is not run.
at::Tensor ste_linear(const at::Tensor& x, const at::Tensor& weight, ScaleMode mode = ScaleMode::rne,
                      bool keep_operand = false, ProductOutput output = ProductOutput::computed);

// A trained weight's bf16 operand kept across steps (--keep-weight-operands always, docs/trainer.md): deq(Q(W)) of
// the weight as it was at its autograd version `version`. The optimizer's CUDA update writes `operand` beside the
// weight it steps (OptimParam::operand) by a raw write, which leaves the version alone; anything else that changes
// the weight in place (a resume's copy_) moves the version, and the next forward makes the operand again. `weight`
// holds the weight's storage alive, so no other tensor can take its address while the entry lives.
struct PersistentOperand {
  at::Tensor weight;
  at::Tensor operand;     // bf16, the weight's shape, contiguous, on its device
  int64_t version = -1;   // the weight's version the operand was made from (-1: never made)
};

// ste_linear whose operand is `kept`'s where it is current: on CUDA with bf16 activations at training shapes the
// forward multiplies kept.operand (made first by the quantize pass when the weight's version moved) and backward's
// dX reads it; no codes are made and nothing per step is allocated for the weight. Elsewhere ste_linear itself.
at::Tensor ste_linear_persistent(const at::Tensor& x, PersistentOperand& kept, ScaleMode mode = ScaleMode::rne,
                                 ProductOutput output = ProductOutput::computed);

// Projections of one input (a block's q, k and v; its gate and up) as one autograd node: output i is what
// ste_linear(x, weights[i], mode, keep_operand) gives, or ste_linear_persistent(x, *kept[i], mode) where kept[i]
// is set (its weight is weights[i]), and so are the weight gradients. dX = Σ dY_i · deq(Q(W_i)) is formed in one
// buffer, each product after the first adding into it (cuBLAS's beta = 1): separate nodes leave autograd to add
// their dX with a pass each, reading two [tokens, in] tensors and writing one. In the weights' order, each
// product rounded once with what it adds to: not the separate nodes' dX bit for bit, whose sum autograd rounds
// after each product.
std::vector<at::Tensor> ste_linear_shared_input(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                                const std::vector<PersistentOperand*>& kept,
                                                ScaleMode mode = ScaleMode::rne, bool keep_operand = false);

// a · b (2-D, one dtype) as a tensor of `dtype`. On CUDA with bf16/fp16 operands and an fp32 `dtype` (libtorch
// 2.9+), cuBLAS writes its fp32 accumulator as it is (aten::mm.dtype): the gradient of an fp32 master is then not
// rounded to the activations' 8 significant bits, and no half-precision product is widened afterwards. Elsewhere
// the product in the operands' dtype, converted. What dW of a trained projection and the sliced loss's head
// gradient use.
at::Tensor product_in_dtype(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype);

// out = a · b (2-D, a and b of one dtype) in out's dtype, written into out: on CUDA into out itself where out is
// contiguous (with half-precision operands and an fp32 out, libtorch 2.9+, cuBLAS's fp32 accumulator as
// product_in_dtype gives it); elsewhere product_in_dtype's tensor, copied in. For a gradient whose rows are each
// written once (the sliced loss's head): no zeroed buffer and no sum.
void product_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b);

// Grouped products (a mixture-of-experts block's experts over its tokens sorted by expert): group g owns the
// counts[g] rows ending at ends[g]; `ends` int32 [G] on the rows' device, `counts` on the host.
//
// Whether grouped_product runs as one native grouped GEMM here: a libtorch with at::_grouped_mm (PyTorch 2.8+)
// and rows on CUDA (bf16 on sm_90 is one CUTLASS kernel; libtorch itself falls back to a product per group
// elsewhere). Otherwise grouped_product is one product per non-empty group.
bool native_grouped_product(const at::Tensor& rows);

// rows [M, K] sorted by group, mats [G, N, K] in rows' dtype -> [M, N]: group g's rows times mats[g]ᵀ.
// Differentiable in both.
at::Tensor grouped_product(const at::Tensor& rows, const at::Tensor& mats, const at::Tensor& ends,
                           const std::vector<int64_t>& counts);

// The straight-through linear of G weights [out, in] (one shape) over grouped rows [M, in]: group g's rows times
// deq(Q(W_g))ᵀ, [M, out] in the rows' dtype. One autograd node: every weight is quantized into one stacked operand
// [G, out, in] (on CUDA with bf16 rows by one launch for every 128 weights of the kernel that writes codes and
// operand together), multiplied by
// grouped_product and freed; the node saves the rows and the codes (0.5625 B a weight, as ste_linear), and
// backward dequantizes all of them in one call. dX = dY · deq(Q(W)) by group; dW_g = dY_gᵀ X_g in W_g's dtype
// (one product per group on the CPU, as ste_linear computes it; one grouped GEMM on CUDA, in the rows' dtype
// and then widened: libtorch's grouped GEMM writes its input dtype only). A group without rows leaves its
// weight without a gradient, as a projection that never ran.
at::Tensor ste_grouped_linear(const at::Tensor& rows, const std::vector<at::Tensor>& weights, const at::Tensor& ends,
                              const std::vector<int64_t>& counts, ScaleMode mode = ScaleMode::rne);

// The same forward for a frozen weight held only as its NVFP4 codes and scales (what ste_linear would quantize
// it to): no master weight, no weight gradient; backward gives dX = dY · deq(codes, scales).
at::Tensor frozen_nvfp4_linear(const at::Tensor& x, const Quantized& weight);

}  // namespace qwen3::nvfp4
