// How the GPU's int8-moment AdamW step divides a parameter among threads, as __host__ __device__ functions:
// eight lanes a 64-block, eight consecutive elements a lane. The kernel (adamw_step.cu) runs them with shuffles
// between (the block's |m| and v maxima over its eight lanes); a CPU test (tests/test_adamw_int8_lanes.cpp) runs
// them in host loops in the kernel's order and demands the CPU step's bytes, so the indexing (the block's row
// and column, the narrow division, padding, the draws' indices) is checked on every CI run, GPU or not.
#pragma once
#include <cstdint>
#include <cstring>

#include "adamw_pieces.cuh"
#include "adamw_update.cuh"
#include "nvfp4_block_lanes.cuh"

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

// Whether lanes whose eight elements all lie in the row move them as whole pieces: master and gradient by 16-byte
// accesses (two for fp32), each code array by one 8-byte access, where every element was an access of its own (a
// warp's 1- and 2-byte accesses, lanes 8 or 16 bytes apart, each touching the same lines again): 56 memory
// instructions a lane for 8 elements become 7 (bf16 master and gradient) or 10 (fp32). A lane's first element
// index is a multiple of 8 wherever cols is (the state's, row * stored_cols + col0, always is), so buffers
// aligned to a piece keep every piece aligned. The kernel asks once; lanes at a row's padded end, or any lane
// where this is false, take elements.
QWEN3_HD bool moves_whole_pieces(const ParamView& p) {
  return p.cols % kPerLane == 0 && aligned_to(p.master, 16) && aligned_to(p.grad, 16) && aligned_to(p.exp_avg, 8) &&
         aligned_to(p.exp_avg_sq, 8);
}

// Eight one-byte codes from `first` on, and back.
QWEN3_HD void load_codes(const void* codes, int64_t first, uint32_t (&out)[kPerLane]) {
  uint32_t w[2];
  load_piece<8>(static_cast<const uint8_t*>(codes) + first, w);
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) out[i] = (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
}
QWEN3_HD void store_codes(void* codes, int64_t first, const uint32_t (&in)[kPerLane]) {
  uint32_t w[2] = {0u, 0u};
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) w[i / 4] |= (in[i] & 0xFFu) << (8 * (i % 4));
  store_piece<8>(static_cast<uint8_t*>(codes) + first, w);
}

// A lane's eight elements after this step's moment update (fp32; padding columns see a zero gradient, as the CPU
// step's padded rows do), its masters (0 on padding), and its largest |m| and v.
struct LaneState {
  float m[kPerLane], v[kPerLane], master[kPerLane];
  float m_amax, v_max;
};

// Reads the lane's state under the block's old step and maximum and updates it. Everything is loaded before
// anything is stored (a store may alias a later load as far as the compiler knows). `pieces`:
// moves_whole_pieces(p).
template <typename Levels>
QWEN3_HD LaneState fresh(const ParamView& p, const StepScalars& s, int64_t block, LanePosition at, Levels level,
                         bool pieces) {
  const float m_step = static_cast<const float*>(p.exp_avg_scale)[block];
  const float v_block_max = static_cast<const float*>(p.exp_avg_sq_scale)[block];
  LaneState out;
  float grad[kPerLane];  // as read; 0 on padding
  uint32_t m_code[kPerLane], v_code[kPerLane];
  const int64_t first = at.row * p.cols + at.col0;
  if (lane_in_pieces<kPerLane>(p, at.col0, pieces)) {
    load_values(p.master, p.master_bf16 != 0, first, out.master);
    load_values(p.grad, p.grad_bf16 != 0, first, grad);
    load_codes(p.exp_avg, at.base, m_code);
    load_codes(p.exp_avg_sq, at.base, v_code);
  } else {
    QWEN3_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const bool in_row = at.col0 + i < p.cols;
      out.master[i] = in_row ? master_of(p, first + i) : 0.0f;
      grad[i] = !in_row ? 0.0f
                : p.grad_bf16 ? bf16_to_float(static_cast<const uint16_t*>(p.grad)[first + i])
                              : static_cast<const float*>(p.grad)[first + i];
      m_code[i] = static_cast<const uint8_t*>(p.exp_avg)[at.base + i];
      v_code[i] = static_cast<const uint8_t*>(p.exp_avg_sq)[at.base + i];
    }
  }
  out.m_amax = 0.0f, out.v_max = 0.0f;
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    out.m[i] = int8_linear_decode(static_cast<int8_t>(static_cast<uint8_t>(m_code[i])), m_step);
    out.v[i] = int8_log_decode(static_cast<uint8_t>(v_code[i]), v_block_max, level);
    // A padding column's 0 scales to 0, as grad_of gives it.
    const float g = p.grad_bf16 ? scaled_grad<true>(grad[i], s.grad_scale) : scaled_grad<false>(grad[i], s.grad_scale);
    update_moments(g, out.m[i], out.v[i], s);
    out.m_amax = fmaxf(out.m_amax, fabsf(out.m[i]));
    out.v_max = fmaxf(out.v_max, out.v[i]);
  }
  return out;
}

// The lane's masters after the step, as stored (a bf16 one after its rounding), as floats: what the next forward's
// operand is made from.
struct SteppedMasters {
  float value[kPerLane];
};

// Encodes the lane's elements under the block's maxima (met over its eight lanes), steps the masters, and (lane 0)
// writes the block's step and maximum. Every lane of the block must have read the old ones first (the kernel's
// shuffles come between). Returns the stepped masters (0 past the row's end).
template <typename Levels>
QWEN3_HD SteppedMasters store(const ParamView& p, const StepScalars& s, int64_t block, LanePosition at, int lane,
                    const LaneState& st, float m_amax, float v_max, Levels level, bool pieces) {
  // One division a lane for each of the block's two divisors, where each element divided twice.
  const float step = int8_linear_step(m_amax);
  const BlockDivisor m_divisor = block_divisor(step), v_divisor = block_divisor(v_max);
  const bool bf16_master = p.master_bf16 != 0;
  uint32_t m_code[kPerLane], v_code[kPerLane], master[kPerLane];
  // The lane's eight state indices share their high 32 bits (the first, row * stored_cols + col0, is a multiple of
  // 8), so the draws take them as one low word plus i and one high word: element_draws's bits, with the key's
  // mixing of the high word made once a lane instead of a 64-bit index split every element.
  const uint32_t index_low = static_cast<uint32_t>(static_cast<uint64_t>(at.base));
  const uint32_t index_high = static_cast<uint32_t>(static_cast<uint64_t>(at.base) >> 32);
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const ElementDraws draws = element_draws_split(s.random_key, index_low + static_cast<uint32_t>(i), index_high);
    m_code[i] = static_cast<uint8_t>(int8_linear_encode(st.m[i], m_divisor, uniform_from_draw(draws.m)));
    v_code[i] = int8_log_encode(st.v[i], v_divisor, uniform_from_draw(draws.v), level);
    master[i] = stepped_master_bits(bf16_master, s, st.master[i], st.m[i], st.v[i], draws.master);
  }
  const int64_t first = at.row * p.cols + at.col0;
  if (lane_in_pieces<kPerLane>(p, at.col0, pieces)) {
    store_codes(p.exp_avg, at.base, m_code);
    store_codes(p.exp_avg_sq, at.base, v_code);
    store_value_bits(p.master, bf16_master, first, master);
  } else {
    QWEN3_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      static_cast<uint8_t*>(p.exp_avg)[at.base + i] = static_cast<uint8_t>(m_code[i]);
      static_cast<uint8_t*>(p.exp_avg_sq)[at.base + i] = static_cast<uint8_t>(v_code[i]);
      if (at.col0 + i < p.cols) store_master_bits(p, first + i, master[i]);
    }
  }
  if (lane == 0) {
    static_cast<float*>(p.exp_avg_scale)[block] = step;
    static_cast<float*>(p.exp_avg_sq_scale)[block] = v_max;
  }
  SteppedMasters stepped;
  QWEN3_UNROLL
  for (int i = 0; i < kPerLane; ++i)
    stepped.value[i] = at.col0 + i < p.cols ? stored_master_value(bf16_master, master[i]) : 0.0f;
  return stepped;
}

// --keep-weight-operands always: the lane's eight elements of the next forward's bf16 operand deq(Q(master)) of the
// masters it has just stepped, [rows, cols] unpadded. A lane holds half of an NVFP4 16-block (the launcher asks
// for rows of whole 16-blocks, so a lane pair's sixteen columns are all in the row or all past it), and the
// block's scale comes from the pair (nvfp4_block_lanes.cuh; `exchange(v, 1)`: the other lane's v). Every lane of
// the warp calls, `here` false (zeros, nothing stored) for a lane past the row's end or the tensor's blocks. One
// 16-byte store where the lanes move whole pieces and the operand is aligned to them.
template <typename Exchange>
QWEN3_HD void write_operand(const ParamView& p, LanePosition at, int lane, bool here, const SteppedMasters& stepped,
                            bool pieces, const Exchange& exchange) {
  write_lane_operand(p, at.row * p.cols + at.col0, here, pieces && aligned_to(p.operand, 16), lane % 2 == 0,
                     stepped.value, exchange);
}

}  // namespace qwen3::kernels::adamw::int8_lanes
