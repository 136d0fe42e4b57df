// Causal attention, and how packed rows reach it: libtorch's SDPA (or, before 2.0, the same math by hand), and
// on CUDA in half precision one flash attention node of our own whose backward gives the same bytes every run.
#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "qwen3/base/message_text.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/model/model.h"

// SDPA's enable_gqa (PyTorch 2.5+): causal attention hands it grouped k/v heads without copies.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define QWEN3_SDPA_GROUPED_HEADS 1
#endif

// libtorch's flash kernel as its own ops (_flash_attention_forward/_backward), in a CUDA build of PyTorch 2.x.
#if TORCH_VERSION_MAJOR >= 2 && defined(QWEN3_TORCH_HAS_CUDA)
#define QWEN3_FLASH_ATTENTION 1
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/autograd.h>
#endif

namespace qwen3 {

#ifdef QWEN3_FLASH_ATTENTION
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The flash kernel runs on Ampere and later (libtorch's build of it refuses older GPUs).
bool flash_kernel_on(at::Device device) {
  return device.is_cuda() && at::cuda::getDeviceProperties(device.index() < 0 ? at::cuda::current_device()
                                                                                : device.index())->major >= 8;
}

// Why the node does not take these rows (empty where it does): flash_attention_takes their device, dtype and head
// width, k and v are alike, and the GPU runs the kernel. The reason is what a slower path records.
std::string flash_node_missed_because(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!q.is_cuda()) return "a tensor off the GPU";
  if (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf)
    return "activations in " + dtype_text(q.scalar_type()) +
           " (the flash kernel takes bfloat16 and float16: --compute-dtype bfloat16)";
  if (!flash_attention_takes(q.device(), q.scalar_type(), q.size(3)))
    return "heads " + std::to_string(q.size(3)) + " wide (the flash kernel takes multiples of 8 up to 256)";
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() || k.device() != q.device() ||
      v.device() != q.device())
    return "k and v unlike q in dtype or device";
  if (!flash_kernel_on(q.device())) return "a GPU before Ampere (compute capability below 8.0)";
  return "";
}
bool flash_attention_runs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return flash_node_missed_because(q, k, v).empty();
}

// Flash attention's backward adds a query block's gradient over the key blocks with atomic adds, in whatever
// order the blocks finish (the fp32 sums, so dq's bits, change from run to run), unless ATen's deterministic
// flag is on when it runs: then each of a few splits adds its share in a fixed order into its own fp32
// workspace, and the splits are summed in order. The flag is global and other ops read it (cuBLAS then wants an
// environment variable, some ops refuse to run, and new tensors get filled): it is on for the kernel's call
// alone, without the filling, and put back as it was.
class DeterministicFlashBackward {
 public:
  DeterministicFlashBackward()
      : context_(at::globalContext()),
        was_on_(context_.deterministicAlgorithms()),
        warn_only_(context_.deterministicAlgorithmsWarnOnly()),
        filled_(context_.deterministicFillUninitializedMemory()) {
    context_.setDeterministicFillUninitializedMemory(false);
    context_.setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicFlashBackward() {
    context_.setDeterministicAlgorithms(was_on_, warn_only_);
    context_.setDeterministicFillUninitializedMemory(filled_);
  }
  DeterministicFlashBackward(const DeterministicFlashBackward&) = delete;
  DeterministicFlashBackward& operator=(const DeterministicFlashBackward&) = delete;

 private:
  at::Context& context_;
  bool was_on_, warn_only_, filled_;
};

// Causal attention by the flash kernel: q [B, T, nh, d] and k, v [B, T, nkv, d] (grouped heads as they are), or
// the same flattened to [B·T, heads, d] with `offsets` (int32, each segment's start, then B·T), each row or
// segment attending causally within itself; `longest` bounds a row or segment. Output [B, T, nh, d] (or
// [B·T, nh, d]). What autograd's own node for the op keeps, it keeps; its backward is the same kernel, run
// deterministically. Dense rows pass no offsets: std::nullopt, not an undefined tensor, which autograd's apply
// would take for an input variable and ask its device (PyTorch 2.11: "tensor does not have a device").
struct FlashAttentionFunction : torch::autograd::Function<FlashAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& offsets, int64_t longest) {
    auto [out, logsumexp, rng_state, rng_offset, unused_mask] = at::_flash_attention_forward(
        q, k, v, offsets, offsets, longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false);
    (void)unused_mask;
    ctx->save_for_backward({q, k, v, out, logsumexp, offsets.value_or(at::Tensor()), rng_state, rng_offset});
    ctx->saved_data["longest"] = longest;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const DeterministicFlashBackward deterministic;
    auto [dq, dk, dv] = at::_flash_attention_backward(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[5], longest,
                                                      longest, /*dropout_p=*/0.0, /*is_causal=*/true, s[6], s[7]);
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace
#endif

at::Tensor packed_attention_mask(const at::Tensor& documents) {
  const int64_t T = documents.size(1);
  const auto idx = at::TensorOptions().dtype(at::kLong).device(documents.device());
  const at::Tensor causal = at::arange(T, idx).unsqueeze(0) <= at::arange(T, idx).unsqueeze(1);  // [T(query), T(key)]
  const at::Tensor same = documents.unsqueeze(2) == documents.unsqueeze(1);                    // [B, T, T]
  return (same & causal).unsqueeze(1);
}

at::Tensor packed_segment_offsets(const at::Tensor& documents) {
  const at::Tensor docs = documents.to(at::kLong).contiguous();
  const auto d = docs.accessor<int64_t, 2>();
  const int64_t T = docs.size(1);
  std::vector<int32_t> offsets{0};
  for (int64_t r = 0; r < docs.size(0); ++r)
    for (int64_t j = 0; j < T; ++j)
      if ((j == 0 && r > 0) || (j > 0 && d[r][j] != d[r][j - 1])) offsets.push_back(static_cast<int32_t>(r * T + j));
  if (docs.numel() > 0) offsets.push_back(static_cast<int32_t>(docs.numel()));
  return at::tensor(offsets, at::kInt);
}

int64_t longest_segment(const at::Tensor& offsets) {
  const at::Tensor host = offsets.to(at::kCPU, at::kInt).contiguous();  // the host's offsets: no copy
  const auto o = host.accessor<int32_t, 1>();
  int64_t longest = 0;
  for (int64_t i = 1; i < o.size(0); ++i) longest = std::max<int64_t>(longest, o[i] - o[i - 1]);
  return longest;
}

double packed_attention_square(const at::Tensor& documents) {
  const at::Tensor offsets = packed_segment_offsets(documents);
  const auto o = offsets.accessor<int32_t, 1>();
  double square = 0;
  for (int64_t i = 1; i < o.size(0); ++i) square += static_cast<double>(o[i] - o[i - 1]) * (o[i] - o[i - 1]);
  return square;
}

bool flash_attention_takes(at::Device device, at::ScalarType dtype, int64_t head_dim) {
  return device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim <= 256 && head_dim % 8 == 0;
}

#ifndef QWEN3_FLASH_ATTENTION
namespace {
std::string flash_node_missed_because(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  return "this libtorch has no flash attention node (a CUDA build of libtorch 2.x has)";
}
}  // namespace
#endif

bool sdpa_takes_grouped_heads() {
#ifdef QWEN3_SDPA_GROUPED_HEADS
  return true;
#else
  return false;
#endif
}

at::Tensor packed_attention_layout(const at::Tensor& documents, at::Device device, at::ScalarType dtype,
                                   int64_t head_dim) {
#ifdef QWEN3_FLASH_ATTENTION
  // The flash kernel needs no mask (no B·T² bytes) and runs each sample alone, where SDPA under a mask falls back
  // to the memory-efficient kernel over full rows. The offsets stay on the host (pinned): each attention call
  // copies them to the device without waiting and reads the longest segment from them, which sizes the kernel's
  // grid (the row width would launch blocks for every segment as if it were a whole row, which exit at once, and
  // size its per-segment buffers so).
  if (flash_attention_takes(device, dtype, head_dim) && flash_kernel_on(device))
    return packed_segment_offsets(documents.cpu()).pin_memory();
#endif
  return packed_attention_mask(documents.to(device));
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const int64_t groups = q.size(1) / k.size(1);
  const int64_t T = q.size(2), S = k.size(2);
#ifdef QWEN3_FLASH_ATTENTION
  const bool segments = mask.defined() && mask.scalar_type() == at::kInt;
  if (segments || (T == S && !mask.defined() && flash_attention_runs(q, k, v))) {
    // [B, T, heads, d]: q, k and v are views of such tensors (the q/k norms' outputs, v's projection), so these
    // copy nothing, and neither does the caller's merge of the output's heads. Packed rows as segments: the rows
    // flattened to [B·T, heads, d]; the offsets give each segment its length, the longest one the kernel's grid.
    const int64_t B = q.size(0), nh = q.size(1), nkv = k.size(1), d = q.size(3);
    at::Tensor qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);
    if (!segments) return FlashAttentionFunction::apply(qt, kt, vt, std::optional<at::Tensor>(), T).transpose(1, 2);
    qt = qt.reshape({B * T, nh, d}), kt = kt.reshape({B * T, nkv, d}), vt = vt.reshape({B * T, nkv, d});
    const at::Tensor offsets = mask.to(q.device(), /*non_blocking=*/true);
    const at::Tensor out = FlashAttentionFunction::apply(qt, kt, vt, std::optional<at::Tensor>(offsets), longest_segment(mask));
    return out.view({B, T, nh, d}).transpose(1, 2);
  }
#endif
  // On a GPU, training and prefill (T == S) are built for the flash node; anything else there is recorded.
  if (q.is_cuda() && T == S) {
    const std::string why = flash_node_missed_because(q, k, v);
    record_slow_path(mask.defined() ? "attention of packed rows (as a [B, 1, T, T] mask, in T squared memory and time)"
                                    : "causal attention (SDPA's kernels, not the flash node)",
                     why.empty() ? "the rows handed as a mask" : why);
  }
#ifdef QWEN3_SDPA_GROUPED_HEADS
  // Training and prefill without a mask: SDPA's causal kernel (flash on CUDA) takes the grouped key/value heads
  // as they are (enable_gqa, PyTorch 2.5+), with no copy of k and v for each query head of a group.
  if (T == S && !mask.defined()) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, groups > 1);
#endif
  // Elsewhere every query head gets its own copy of its group's k and v: a mask sends SDPA to kernels that do
  // not take grouped heads (on CUDA the memory-efficient one), and libtorch before 2.5 has no such flag.
  const at::Tensor ke = groups == 1 ? k : k.repeat_interleave(groups, 1);
  const at::Tensor ve = groups == 1 ? v : v.repeat_interleave(groups, 1);
  // Query i is at absolute position (S - T) + i and sees keys j <= (S - T) + i.
  const auto idx = at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor allowed =
      mask.defined() ? mask : at::arange(S, idx).unsqueeze(0) <= (at::arange(T, idx) + (S - T)).unsqueeze(1);
#if TORCH_VERSION_MAJOR >= 2
  if (T == S && !mask.defined()) return at::scaled_dot_product_attention(q, ke, ve, {}, 0.0, /*is_causal=*/true);
  return at::scaled_dot_product_attention(q, ke, ve, allowed, 0.0, false);
#else
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, ke.transpose(-2, -1)).to(at::kFloat) * scale;
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1).to(q.scalar_type()), ve);
#endif
}

}  // namespace qwen3
