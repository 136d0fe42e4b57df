// How the GPU's plain-moment (fp32 or bf16) AdamW step divides a parameter among threads when it also writes the
// next forward's operand (--keep-weight-operands always), as __host__ __device__ functions: four consecutive
// elements a lane, so an NVFP4 16-block is four lanes of one warp and its scale comes from them
// (nvfp4_block_lanes.cuh, kPer = 4). The plain kernel without the operand keeps its own split (an element of a
// lane every kThreads, adamw_step.cu), which streams at the memory's rate; with the operand that split gave every
// element a 16-block of its own lanes, so each element found the block's maximum by four exchanges and made the
// block's scale code, its decoding and reciprocal by itself: sixteen lanes doing one block's work sixteen times.
// Here a lane does it once for its four elements, after two exchanges, and moves its elements as whole pieces
// (one 16- or 8-byte access an array) where the buffers allow. Each element's rules are adamw_update.cuh's,
// keyed by its own index, so the bytes do not depend on the split: a CPU test (tests/test_adamw_plain_lanes.cpp)
// runs these functions on the host and demands the CPU step's bytes and the codec's operand.
#pragma once
#include <cstdint>

#include "adamw_pieces.cuh"
#include "adamw_update.cuh"
#include "nvfp4_block_lanes.cuh"

namespace qwen3::kernels::adamw::plain_lanes {

constexpr int kPerLane = 4;
constexpr int kLanesPerBlock = codec::kBlock / kPerLane;  // 4: a 16-block's lanes, aligned within a warp

// Whether lanes move whole pieces: every buffer aligned to 16 bytes (an fp32 piece of four; a bf16 one needs
// 8) and the tensor a whole number of pieces (a lane's first element is a multiple of four, so its piece is
// aligned wherever the buffer is). Asked once a launch; a lane past the end, or any lane where this is false,
// takes elements.
QWEN3_HD bool moves_whole_pieces(const ParamView& p) {
  return (p.rows * p.cols) % kPerLane == 0 && aligned_to(p.master, 16) && aligned_to(p.grad, 16) &&
         aligned_to(p.exp_avg, 16) && aligned_to(p.exp_avg_sq, 16) &&
         (p.operand == nullptr || aligned_to(p.operand, 8));
}

// A lane's four elements after this step's moment update, and its masters as read (0 past the end).
struct LaneState {
  float m[kPerLane], v[kPerLane], master[kPerLane];
};

// Reads the lane's elements first .. first + 3 (those below `total`) and updates their moments. Every load comes
// before any store (a store may alias a later load as far as the compiler knows: adamw_step.cu's plain split).
template <bool kBf16Moments>
QWEN3_HD LaneState fresh(const ParamView& p, const StepScalars& s, int64_t first, int64_t total, bool pieces) {
  LaneState out;
  float grad[kPerLane];
  if (pieces && first + kPerLane <= total) {
    load_values<kPerLane>(p.exp_avg, kBf16Moments, first, out.m);
    load_values<kPerLane>(p.exp_avg_sq, kBf16Moments, first, out.v);
    load_values<kPerLane>(p.grad, p.grad_bf16 != 0, first, grad);
    load_values<kPerLane>(p.master, p.master_bf16 != 0, first, out.master);
  } else {
    QWEN3_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t e = first + i;
      const bool in = e < total;
      out.m[i] = in ? master_at<kBf16Moments>(p.exp_avg, e) : 0.0f;  // master_at: a value of either dtype
      out.v[i] = in ? master_at<kBf16Moments>(p.exp_avg_sq, e) : 0.0f;
      grad[i] = !in ? 0.0f : p.grad_bf16 ? master_at<true>(p.grad, e) : master_at<false>(p.grad, e);
      out.master[i] = in ? master_of(p, e) : 0.0f;
    }
  }
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const float g = p.grad_bf16 ? scaled_grad<true>(grad[i], s.grad_scale) : scaled_grad<false>(grad[i], s.grad_scale);
    update_moments(g, out.m[i], out.v[i], s);
  }
  return out;
}

// The lane's masters after the step, as stored (a bf16 one after its rounding), as floats: what the next forward's
// operand is made from.
struct SteppedMasters {
  float value[kPerLane];
};

// Stores the lane's moments (bf16 ones rounded stochastically with the element's m and v draws) and steps and
// stores its masters (a bf16 one rounded with its master draw: drawn for fp32 moments only where the master is
// bf16, as step_master_drawing). Returns the stepped masters (0 past the end).
template <bool kBf16Moments>
QWEN3_HD SteppedMasters store(const ParamView& p, const StepScalars& s, int64_t first, int64_t total,
                              const LaneState& st, bool pieces) {
  const bool bf16_master = p.master_bf16 != 0;
  uint32_t m_bits[kPerLane], v_bits[kPerLane], master[kPerLane];
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const uint64_t e = static_cast<uint64_t>(first + i);
    uint32_t master_draw = 0u;
    if (kBf16Moments) {
      const ElementDraws draws = element_draws(s.random_key, e);
      m_bits[i] = bf16_stochastic(st.m[i], sixteen_bits_of_draw(draws.m));
      v_bits[i] = bf16_stochastic(st.v[i], sixteen_bits_of_draw(draws.v));
      master_draw = draws.master;
    } else {
      m_bits[i] = float_bits(st.m[i]);
      v_bits[i] = float_bits(st.v[i]);
      if (bf16_master) master_draw = element_draws(s.random_key, e).master;  // a branch: fp32 makes no hash
    }
    master[i] = stepped_master_bits(bf16_master, s, st.master[i], st.m[i], st.v[i], master_draw);
  }
  if (pieces && first + kPerLane <= total) {
    store_value_bits(p.exp_avg, kBf16Moments, first, m_bits);
    store_value_bits(p.exp_avg_sq, kBf16Moments, first, v_bits);
    store_value_bits(p.master, bf16_master, first, master);
  } else {
    QWEN3_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t e = first + i;
      if (e >= total) continue;
      store_bits_at(p.exp_avg, kBf16Moments, e, m_bits[i]);
      store_bits_at(p.exp_avg_sq, kBf16Moments, e, v_bits[i]);
      store_master_bits(p, e, master[i]);
    }
  }
  SteppedMasters stepped;
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i)
    stepped.value[i] = first + i < total ? stored_master_value(bf16_master, master[i]) : 0.0f;
  return stepped;
}

// The lane's four elements of the next forward's bf16 operand deq(Q(master)), [rows, cols] as the master (the
// launcher asks for cols a multiple of 16, so a 16-block lies within a row and its four lanes are all in or all
// past the end). Every lane of the warp calls (`here` false: zeros, nothing stored); `exchange(v, d)` gives lane
// (lane ^ d)'s v. One 8-byte store where the lanes move whole pieces.
template <typename Exchange>
QWEN3_HD void write_operand(const ParamView& p, int64_t first, int lane, bool here, const SteppedMasters& stepped,
                            bool pieces, const Exchange& exchange) {
  write_lane_operand(p, first, here, pieces, lane % kLanesPerBlock == 0, stepped.value, exchange);
}

}  // namespace qwen3::kernels::adamw::plain_lanes
