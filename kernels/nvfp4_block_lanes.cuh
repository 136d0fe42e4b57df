// One NVFP4 block held an element a lane by 16 consecutive lanes of a warp: the canonical quantizer's choice of
// scale (nvfp4_codec.cuh, docs/nvfp4.md) where no thread holds a whole block. For kernels whose threads own
// consecutive elements and that want a block's dense operand deq(Q(x)) next to their own work: the AdamW
// update writing the next forward's bf16 operand of the master it has just stepped (--keep-weight-operands
// always, kernels/adamw_step.md).
//
// What the lanes combine: the block maximum (exact in any order) and, in search mode, each candidate's squared
// errors. Lane i adds lane (i ^ w)'s partial sum for w = 8, 4, 2, 1: for i < w that is e_i + e_{i+w}, the sum
// block_squared_error's tree forms there, and an IEEE sum does not depend on the order of its two terms, so every
// lane ends with the tree's total, bit for bit. tests/test_nvfp4_block_lanes.cpp runs these steps lane by lane on
// the host against the CPU codec; the GPU tests check the kernel that uses them.
#pragma once
#include "nvfp4_codec.cuh"

namespace qwen3::kernels::block_lanes {

// The exchange distances run w = kFirstWidth, then halved to 1: block_squared_error's tree from its first level.
constexpr int kFirstWidth = codec::kBlock / 2;

// The best of the search so far: candidate error e (the block's total) replaces the best when it is a candidate
// and strictly smaller, or the first candidate (ties and all-infinite errors keep the smaller code).
QWEN3_HD void keep_better(bool valid, int code, float error, int& best_code, float& best_error, bool& have_best) {
  if (valid && (!have_best || error < best_error)) {
    best_code = code;
    best_error = error;
    have_best = true;
  }
}

#if defined(__CUDACC__)
// The block's scale code; every lane of the warp calls it (the shuffles span the warp, whose two halves are two
// blocks), each with its element, 0 where it has none (a whole block past the data's end: its result is not
// used). kNonFiniteBlockScale for a block with an infinite or NaN element.
__device__ __forceinline__ uint8_t scale_code(float x, bool search) {
  float amax = codec::max_abs_nan(0.0f, x);
#pragma unroll
  for (int w = kFirstWidth; w >= 1; w /= 2) amax = codec::max_abs_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, w));
  if (!codec::finite_maximum(amax)) return codec::kNonFiniteBlockScale;
  const int center = codec::rne_scale_code(amax);
  if (!search) return static_cast<uint8_t>(center);
  int best_code = center;
  float best_error = 0.0f;
  bool have_best = false;
  // Five candidates for every lane, valid or not (a block's lanes agree on its center, the warp's two blocks
  // need not): the shuffles run in all 32 lanes each time.
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    bool valid = false;
    const int code = codec::search_candidate(center, k, valid);
    const float scale = codec::e4m3_to_float(static_cast<uint8_t>(code));
    float error = codec::element_squared_error(x, scale, scale > 0.0f ? codec::recip_rn(scale) : 0.0f);
#pragma unroll
    for (int w = kFirstWidth; w >= 1; w /= 2) error = codec::add_rn(error, __shfl_xor_sync(0xFFFFFFFFu, error, w));
    keep_better(valid, code, error, best_code, best_error, have_best);
  }
  return static_cast<uint8_t>(best_code);
}

// The lane's element of deq(Q(block)) under the block's scale code (NaN for kNonFiniteBlockScale).
__device__ __forceinline__ float operand(float x, uint8_t scale_code) {
  const float scale = codec::e4m3_to_float(scale_code);
  return codec::element_operand(x, scale, scale > 0.0f ? codec::recip_rn(scale) : 0.0f);
}
#endif

}  // namespace qwen3::kernels::block_lanes
