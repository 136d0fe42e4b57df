// Element rules of the fused activation kernels (fused_ops.cu): RMSNorm, RoPE and SwiGLU, forward and backward,
// as __host__ __device__ functions. The kernels run them on the GPU; tests/test_fused_ops.cpp runs them on the
// host against the model's libtorch formulas (the CPU path), so the arithmetic is checked in every CI run.
// Values are fp32 in registers; stores round to the activation dtype exactly where the libtorch formula rounds
// (each libtorch op on bf16 tensors computes in fp32 and rounds its result). Design: kernels/fused_ops.md.
#pragma once
#include <cmath>
#include <cstdint>

#include "adamw_update.cuh"

namespace qwen3::kernels::fused {

using adamw::bf16_nearest;
using adamw::bf16_to_float;
using codec::add_rn;
using codec::mul_rn;
using codec::sub_rn;

// Rounds an fp32 value to the activation dtype and back (identity for fp32). On the device one conversion
// each way and no NaN test: an intermediate NaN stays a NaN, and its payload is not the host's either way (the
// GPU's arithmetic returns its own canonical NaN; a bf16 store, bf16_nearest, writes 0x7FC0 on both).
template <bool kBf16>
QWEN3_HD float round_to(float x) {
#if defined(__CUDA_ARCH__)
  return kBf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
#else
  return kBf16 ? bf16_to_float(bf16_nearest(x)) : x;
#endif
}

template <bool kBf16>
QWEN3_HD float load(const void* p, int64_t i) {
  return kBf16 ? bf16_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

template <bool kBf16>
QWEN3_HD void store(void* p, int64_t i, float x) {
  if (kBf16)
    static_cast<uint16_t*>(p)[i] = bf16_nearest(x);
  else
    static_cast<float*>(p)[i] = x;
}

// ---- RMSNorm: y = T(w) * T(x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) over the row, in fp32 ------------------

QWEN3_HD float rmsnorm_rstd(float sum_of_squares, int64_t cols, float eps) {
  return 1.0f / sqrtf(add_rn(sum_of_squares / static_cast<float>(cols), eps));
}

// One output element: the weight cast to the activation dtype times the normalized value cast to it, rounded.
template <bool kBf16>
QWEN3_HD float rmsnorm_output(float x, float rstd, float weight) {
  return round_to<kBf16>(mul_rn(round_to<kBf16>(weight), round_to<kBf16>(mul_rn(x, rstd))));
}

// Backward: with n = x rstd and g = dy T(w) (the gradient reaching n through its cast), dx = rstd (g - n mean(g n))
// and the weight's gradient dy T(n) (summed over rows by the caller, in fp32).
template <bool kBf16>
QWEN3_HD float rmsnorm_grad_n(float dy, float weight) {
  return mul_rn(dy, round_to<kBf16>(weight));
}
QWEN3_HD float rmsnorm_dx(float grad_n, float n, float mean_grad_n_times_n, float rstd) {
  return mul_rn(rstd, sub_rn(grad_n, mul_rn(n, mean_grad_n_times_n)));
}
template <bool kBf16>
QWEN3_HD float rmsnorm_dw_term(float dy, float n) {
  return mul_rn(dy, round_to<kBf16>(n));
}

// The weight gradient's order of summation, fixed (deterministic, and what the GPU test reproduces bit for bit):
// rows in chunks (rmsnorm_rows_per_chunk), each chunk's rows in order into a partial; a column's partials in
// kDwRuns runs of consecutive chunks, each run in order; then the runs in order. Run r holds the chunks
// [dw_run_first(chunks, r), dw_run_first(chunks, r + 1)): as even as integers allow. Summing the partials in
// one sequence was a dependent chain of 2,048 loads for a q norm (65,536 rows of 128): the chunk sums took 4.9 ms
// of the second GPU round's profiled step, 145 norm backwards.
constexpr int kDwRuns = 32;
QWEN3_HD int64_t dw_run_first(int64_t chunks, int run) { return chunks * run / kDwRuns; }

// ---- RoPE on one (first half, second half) pair of a head: HF's x cos + rotate_half(x) sin ----------------------

// One element's output, as the lane that holds it computes it (head_norm_rope.cu: each lane its own element, from
// the tables at its own index; rope_kernel through rope_pair below). Forward, `partner` is the pair's other
// element: the first half's x1 c1 - x2 s1, the second half's x2 c2 + x1 s2, both products and their sum rounded to
// the activation dtype, and the tables cast to it first, as libtorch's ops round them.
template <bool kBf16>
QWEN3_HD float rope_lane(float own, float partner, float c, float s, bool first) {
  const float tc = round_to<kBf16>(c), ts = round_to<kBf16>(s);
  return round_to<kBf16>(add_rn(round_to<kBf16>(mul_rn(own, tc)), round_to<kBf16>(mul_rn(first ? -partner : partner, ts))));
}
// Backward, the transposed rotation, dx1 = dy1 c1 + dy2 s2 and dx2 = dy2 c2 - dy1 s1, each product and the sum
// rounded as autograd's accumulation of the two branches' gradients rounds them: each lane's term for its partner
// is its own gradient times the sine at its own index (rope_lane_term), and each lane adds the partner's term to
// its own gradient times its own cosine (rope_lane_backward).
template <bool kBf16>
QWEN3_HD float rope_lane_term(float dy, float s) {
  return round_to<kBf16>(mul_rn(dy, round_to<kBf16>(s)));
}
template <bool kBf16>
QWEN3_HD float rope_lane_backward(float dy, float partner_term, float c, bool first) {
  return round_to<kBf16>(add_rn(round_to<kBf16>(mul_rn(dy, round_to<kBf16>(c))), first ? partner_term : -partner_term));
}

// A whole pair, c1, s1 at the first half's index, c2, s2 at the second's (the tables repeat, so they are equal, but
// the rules do not need it).
template <bool kBf16>
QWEN3_HD void rope_pair(float& x1, float& x2, float c1, float s1, float c2, float s2) {
  const float o1 = rope_lane<kBf16>(x1, x2, c1, s1, true), o2 = rope_lane<kBf16>(x2, x1, c2, s2, false);
  x1 = o1;
  x2 = o2;
}
template <bool kBf16>
QWEN3_HD void rope_pair_backward(float& dy1, float& dy2, float c1, float s1, float c2, float s2) {
  const float d1 = rope_lane_backward<kBf16>(dy1, rope_lane_term<kBf16>(dy2, s2), c1, true);
  const float d2 = rope_lane_backward<kBf16>(dy2, rope_lane_term<kBf16>(dy1, s1), c2, false);
  dy1 = d1;
  dy2 = d2;
}

// ---- The q/k norms and RoPE as one pass (fused_ops.cu's head_norm_rope kernels) --------------------------------

// Lanes a head row takes when its RMSNorm and RoPE run as one pass, or 0 where they do not: the row in 8-element
// pieces, a lane each, as the RMSNorm kernels' vector path lays out a narrow row (the same lanes, so the same sum
// of squares), and a RoPE pair's second element head_dim / 2 further, in the lane half a row away, which one
// shuffle reaches. So head_dim / 8 is a power of two from 2 to 32: 16, 32, 64, 128 (Qwen3: 16 lanes) or 256.
QWEN3_HD constexpr int head_norm_rope_lanes(int64_t head_dim) {
  return head_dim >= 16 && head_dim <= 256 && head_dim % 8 == 0 && ((head_dim / 8) & (head_dim / 8 - 1)) == 0
             ? static_cast<int>(head_dim / 8)
             : 0;
}

// ---- SwiGLU: h = T(silu(g)) * u, rounded ---------------------------------------------------------------------

QWEN3_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// libtorch's form, x / (1 + e^-x).
QWEN3_HD float silu(float x) { return x / (1.0f + expf(-x)); }

template <bool kBf16>
QWEN3_HD float swiglu(float gate, float up) {
  return round_to<kBf16>(mul_rn(round_to<kBf16>(silu(gate)), up));
}

// dgate = dh u silu'(g), dup = dh T(silu(g)); silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
template <bool kBf16>
QWEN3_HD void swiglu_backward(float dh, float gate, float up, float& dgate, float& dup) {
  const float s = sigmoid(gate);
  dup = round_to<kBf16>(mul_rn(dh, round_to<kBf16>(silu(gate))));
  const float dsilu = round_to<kBf16>(mul_rn(dh, up));
  dgate = round_to<kBf16>(mul_rn(dsilu, mul_rn(s, add_rn(1.0f, mul_rn(gate, sub_rn(1.0f, s))))));
}

}  // namespace qwen3::kernels::fused
