// How the GPU's int8-moment AdamW step divides a parameter among threads, as __host__ __device__ functions:
// eight lanes a 64-block, eight consecutive elements a lane. The kernel (adamw_step.cu) runs them with shuffles
// between (the block's |m| and v maxima over its eight lanes); a CPU test (tests/test_adamw_int8_lanes.cpp) runs
// them in host loops in the kernel's order and demands the CPU step's bytes, so the indexing (the block's row
// and column, the narrow division, padding, the draws' indices) is checked on every CI run, GPU or not.
#pragma once
#include <cstdint>

#include "adamw_update.cuh"

namespace qwen3::kernels::adamw::int8_lanes {

constexpr int kLanesPerBlock = 8;
constexpr int kPerLane = kInt8Block / kLanesPerBlock;  // 8

// Where a lane's eight elements are: the block's row, the lane's first column, and its first state index.
struct LanePosition {
  int64_t row, col0, base;
};

// `narrow`: every block index the launch reaches is below 2^32, so the row comes from a 32-bit division (a 64-bit
// one is a subroutine of tens of instructions on the GPU, once a pass for every 8 elements).
QWEN3_HD LanePosition position(const ParamView& p, int64_t block, int lane, bool narrow) {
  const int64_t blocks_per_row = p.stored_cols / kInt8Block;
  int64_t row, block_in_row;
  if (narrow) {
    const uint32_t r = static_cast<uint32_t>(block) / static_cast<uint32_t>(blocks_per_row);
    row = r, block_in_row = static_cast<uint32_t>(block) - r * static_cast<uint32_t>(blocks_per_row);
  } else {
    row = block / blocks_per_row, block_in_row = block - row * blocks_per_row;
  }
  const int64_t col0 = block_in_row * kInt8Block + lane * kPerLane;
  return {row, col0, row * p.stored_cols + col0};
}

// A lane's eight elements after this step's moment update (fp32; padding columns see a zero gradient, as the CPU
// step's padded rows do), its masters (0 on padding), and its largest |m| and v.
struct LaneState {
  float m[kPerLane], v[kPerLane], master[kPerLane];
  float m_amax, v_max;
};

// Reads the lane's state under the block's old step and maximum and updates it. The masters are loaded with the
// rest, before anything is stored: a store may alias a later load as far as the compiler knows.
template <typename Levels>
QWEN3_HD LaneState fresh(const ParamView& p, const StepScalars& s, int64_t block, LanePosition at, Levels level) {
  const auto* m_codes = static_cast<const int8_t*>(p.exp_avg);
  const auto* v_codes = static_cast<const uint8_t*>(p.exp_avg_sq);
  const float m_step = static_cast<const float*>(p.exp_avg_scale)[block];
  const float v_block_max = static_cast<const float*>(p.exp_avg_sq_scale)[block];
  LaneState out;
  out.m_amax = 0.0f, out.v_max = 0.0f;
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i)
    out.master[i] = at.col0 + i < p.cols ? master_of(p, at.row * p.cols + at.col0 + i) : 0.0f;
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    out.m[i] = int8_linear_decode(m_codes[at.base + i], m_step);
    out.v[i] = int8_log_decode(v_codes[at.base + i], v_block_max, level);
    update_moments(grad_of(p, s, at.row, at.col0 + i), out.m[i], out.v[i], s);
    out.m_amax = fmaxf(out.m_amax, fabsf(out.m[i]));
    out.v_max = fmaxf(out.v_max, out.v[i]);
  }
  return out;
}

// Encodes the lane's elements under the block's maxima (met over its eight lanes), steps the masters, and (lane 0)
// writes the block's step and maximum. Every lane of the block must have read the old ones first (the kernel's
// shuffles come between).
template <typename Levels>
QWEN3_HD void store(const ParamView& p, const StepScalars& s, int64_t block, LanePosition at, int lane,
                    const LaneState& st, float m_amax, float v_max, Levels level) {
  auto* m_codes = static_cast<int8_t*>(p.exp_avg);
  auto* v_codes = static_cast<uint8_t*>(p.exp_avg_sq);
  // One division a lane for each of the block's two divisors, where each element divided twice.
  const float step = int8_linear_step(m_amax);
  const BlockDivisor m_divisor = block_divisor(step), v_divisor = block_divisor(v_max);
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const ElementDraws draws = element_draws(s.random_key, static_cast<uint64_t>(at.base + i));
    m_codes[at.base + i] = int8_linear_encode(st.m[i], m_divisor, uniform_from_draw(draws.m));
    v_codes[at.base + i] = int8_log_encode(st.v[i], v_divisor, uniform_from_draw(draws.v), level);
    if (at.col0 + i < p.cols)
      step_master(p, s, at.row * p.cols + at.col0 + i, st.master[i], st.m[i], st.v[i], draws.master);
  }
  if (lane == 0) {
    static_cast<float*>(p.exp_avg_scale)[block] = step;
    static_cast<float*>(p.exp_avg_sq_scale)[block] = v_max;
  }
}

}  // namespace qwen3::kernels::adamw::int8_lanes
