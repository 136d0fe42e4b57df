// One NVFP4 block spread over a group of lanes, kPer consecutive elements a lane: the canonical quantizer's
// choice of scale (nvfp4_codec.cuh, docs/nvfp4.md) where no thread holds a whole block. For kernels whose threads
// own consecutive elements and that want a block's dense operand deq(Q(x)) next to their own work: the AdamW
// update writing the next forward's bf16 operand of the master it has just stepped (--keep-weight-operands
// always, kernels/adamw_step.md), whose kernels hold a block as 4 lanes of 4 (plain and nvfp4 moments) and 2
// lanes of 8 (int8); kPer = 1 (16 lanes of one element) is the rule's simplest form, tested beside them.
//
// Lane q of a group holds elements q * kPer .. q * kPer + kPer - 1. What the lanes combine: the block maximum
// (exact in any order) and, in search mode, each candidate's squared errors, summed as block_squared_error's tree
// (e_i + e_{i+w} for w = 8, 4, 2, 1). A level whose width w spans lanes (w >= kPer) is an exchange with lane
// q ^ (w / kPer): the lane whose elements sit w further on (or back), each element with its counterpart, and an
// IEEE sum does not depend on the order of its two terms, so both lanes hold the tree's sums from then on; the
// levels within a lane (w < kPer) it forms alone. So every lane ends with the tree's total, bit for bit.
//
// `exchange(v, d)` gives lane (q ^ d)'s v, every lane of the group calling it alike: __shfl_xor_sync on the
// device (ShuffleXor), host threads in lock-step in the tests (tests/lane_lockstep.h), which run these functions
// against the CPU codec (tests/test_nvfp4_block_lanes.cpp); the GPU tests check the kernels that use them.
#pragma once
#include "nvfp4_codec.cuh"

namespace qwen3::kernels::block_lanes {

// The best of the search so far: candidate error e (the block's total) replaces the best when it is a candidate
// and strictly smaller, or the first candidate (ties and all-infinite errors keep the smaller code).
QWEN3_HD void keep_better(bool valid, int code, float error, int& best_code, float& best_error, bool& have_best) {
  if (valid && (!have_best || error < best_error)) {
    best_code = code;
    best_error = error;
    have_best = true;
  }
}

// The block's largest magnitude (NaN where an element is: max_abs_nan), in every lane of the group.
template <int kPer, typename Exchange>
QWEN3_HD float spread_block_max(const float (&x)[kPer], const Exchange& exchange) {
  float amax = 0.0f;
  QWEN3_UNROLL
  for (int i = 0; i < kPer; ++i) amax = codec::max_abs_nan(amax, x[i]);
  QWEN3_UNROLL
  for (int d = 1; d < codec::kBlock / kPer; d *= 2) amax = codec::max_abs_nan(amax, exchange(amax, d));
  return amax;
}

// block_squared_error of the block under a scale s > 0 with reciprocal RN(1/s) (or 0 and 0), in every lane.
template <int kPer, typename Exchange>
QWEN3_HD float spread_squared_error(const float (&x)[kPer], float scale, float reciprocal, const Exchange& exchange) {
  float sum[kPer];
  QWEN3_UNROLL
  for (int i = 0; i < kPer; ++i) sum[i] = codec::element_squared_error(x[i], scale, reciprocal);
  QWEN3_UNROLL
  for (int width = codec::kBlock / 2; width >= 1; width /= 2) {
    if (width >= kPer) {
      QWEN3_UNROLL
      for (int i = 0; i < kPer; ++i) sum[i] = codec::add_rn(sum[i], exchange(sum[i], width / kPer));
    } else {
      QWEN3_UNROLL
      for (int i = 0; i < width; ++i) sum[i] = codec::add_rn(sum[i], sum[i + width]);
    }
  }
  return sum[0];
}

// The block's scale code from this lane's elements (zeros for a group past the data: its result is not used);
// kNonFiniteBlockScale for a block with an infinite or NaN element. Every lane makes the same exchanges whatever
// its block holds: in search mode a non-finite block's lanes search too (over zeros, the result dropped), since on
// the device a full-warp shuffle that some of the warp's lanes skip is undefined (they would meet the others'
// exchanges at a later shuffle). Nvfp4BlockLanes.EveryLaneOfAWarpMakesTheSameExchanges holds it.
template <int kPer, typename Exchange>
QWEN3_HD uint8_t spread_scale_code(const float (&x)[kPer], bool search, const Exchange& exchange) {
  const float amax = spread_block_max(x, exchange);
  const bool finite = codec::finite_maximum(amax);
  if (!search) return finite ? static_cast<uint8_t>(codec::rne_scale_code(amax)) : codec::kNonFiniteBlockScale;
  float y[kPer];
  QWEN3_UNROLL
  for (int i = 0; i < kPer; ++i) y[i] = finite ? x[i] : 0.0f;
  const int center = codec::rne_scale_code(finite ? amax : 0.0f);
  int best_code = center;
  float best_error = 0.0f;
  bool have_best = false;
  // Five candidates in every lane, valid or not (a group agrees on its center, so on which are valid; on the
  // device a warp's groups need not agree, and the shuffles run in all its lanes each time).
  QWEN3_UNROLL
  for (int k = 0; k < 5; ++k) {
    bool valid = false;
    const int code = codec::search_candidate(center, k, valid);
    const float scale = codec::e4m3_to_float(static_cast<uint8_t>(code));
    const float error = spread_squared_error(y, scale, scale > 0.0f ? codec::recip_rn(scale) : 0.0f, exchange);
    keep_better(valid, code, error, best_code, best_error, have_best);
  }
  return finite ? static_cast<uint8_t>(best_code) : codec::kNonFiniteBlockScale;
}

// The lane's elements of deq(Q(block)) under the block's scale code (NaN for kNonFiniteBlockScale), the scale
// tested once for the lane's elements (they share it).
template <int kPer>
QWEN3_HD void spread_operand(const float (&x)[kPer], uint8_t scale_code, float (&out)[kPer]) {
  const float scale = codec::e4m3_to_float(scale_code);
  if (!(scale > 0.0f)) {  // an all-zero block (0) or a non-finite one (NaN): 0 * scale, 0 or NaN
    QWEN3_UNROLL
    for (int i = 0; i < kPer; ++i) out[i] = 0.0f * scale;
    return;
  }
  const float reciprocal = codec::recip_rn(scale);
  QWEN3_UNROLL
  for (int i = 0; i < kPer; ++i) out[i] = codec::scaled_operand(x[i], scale, reciprocal);
}

// Two operand values as one word of bf16 halves, `low` first, as bf16 round-to-nearest-even (bf16_nearest) makes
// them: an E2M1 value times an E4M3 scale has at most five significant bits and lies within bf16's normal range,
// so its bf16 is its fp32's top half exactly (one byte permute on the device for the pair, where each value took
// a conversion and a NaN test); a non-finite block's values are NaN, whose bf16 bf16_nearest makes 0x7FC0.
QWEN3_HD uint32_t operand_bf16_pair(float low, float high, uint8_t scale_code) {
  if (scale_code == codec::kNonFiniteBlockScale) return 0x7FC07FC0u;
#if defined(__CUDA_ARCH__)
  return __byte_perm(codec::float_bits(low), codec::float_bits(high), 0x7632u);
#else
  return (codec::float_bits(low) >> 16) | (codec::float_bits(high) & 0xFFFF0000u);
#endif
}

// A lane's part of the operand of the values it holds where `here` (zeros otherwise, as a lane past the data
// takes part in the exchanges all the same); returns the block's scale code, for the non-finite flag.
template <int kPer, typename Exchange>
QWEN3_HD uint8_t spread_lane_operand(const float (&values)[kPer], bool here, bool search, const Exchange& exchange,
                                     float (&out)[kPer]) {
  float x[kPer];
  QWEN3_UNROLL
  for (int i = 0; i < kPer; ++i) x[i] = here ? values[i] : 0.0f;
  const uint8_t code = spread_scale_code(x, search, exchange);
  spread_operand(x, code, out);
  return code;
}

#if defined(__CUDACC__)
// A group of lanes within a warp, aligned to its size; every lane of the warp must call (a shuffle spans it).
struct ShuffleXor {
  __device__ float operator()(float v, int d) const { return __shfl_xor_sync(0xFFFFFFFFu, v, d); }
};
#endif

}  // namespace qwen3::kernels::block_lanes
