// How the GPU's nvfp4-moment AdamW step divides a row among threads, as __host__ __device__ functions: four
// lanes a 16-block, four consecutive elements a lane. The kernel (adamw_step.cu) runs them with shuffles and
// barriers between; a CPU test (tests/test_adamw_nvfp4_lanes.cpp) runs them in host loops in the kernel's order
// and demands the CPU step's bytes, so the indexing is checked on every CI run, GPU or not.
//
// Why this shape (kernels/adamw_step.md): a warp's loads and stores are contiguous (a lane's four elements
// follow the previous lane's), a lane's values fit in registers (sixteen elements a thread spilled 256 bytes a
// thread to local memory), and a block's two scale codes are decoded once a lane instead of once an element.
#pragma once
#include <cstdint>

#include "adamw_pieces.cuh"
#include "adamw_update.cuh"
#include "nvfp4_block_lanes.cuh"

namespace qwen3::kernels::adamw::nvfp4_lanes {

constexpr int kLanesPerBlock = 4;
constexpr int kPerLane = kNvfp4Block / kLanesPerBlock;  // 4: two bytes of packed codes a lane

// A lane's four elements of one 16-block after this step's moment update (fp32; padding columns see a zero
// gradient, as the CPU step's padded rows do).
struct LaneMoments {
  float m[kPerLane], v[kPerLane];
};

QWEN3_HD int64_t first_column(int64_t block, int lane) { return block * kNvfp4Block + lane * kPerLane; }

// Whether lanes whose four elements all lie in the row move them as whole pieces: gradient and master by one 8-byte
// (bf16) or 16-byte (fp32) access, each moment's two code bytes by one 2-byte access, where every element was an
// access of its own (12 to 16 memory instructions a lane for 4 elements become 4, the gradient's twice: both
// passes read it). A lane's first element, row * cols + col0, is a multiple of 4 wherever cols is, and its code
// bytes start at an even offset, so buffers aligned to a piece keep every piece aligned. The kernel asks once;
// lanes at a row's padded end, or any lane where this is false, take elements.
QWEN3_HD bool moves_whole_pieces(const ParamView& p) {
  return p.cols % kPerLane == 0 && aligned_to(p.master, p.master_bf16 ? 8 : 16) &&
         aligned_to(p.grad, p.grad_bf16 ? 8 : 16) && aligned_to(p.exp_avg, 2) && aligned_to(p.exp_avg_sq, 2);
}

// Decodes the lane's m and sqrt(v) under the row scales the state was written with, and updates them with
// the gradient. `pieces`: moves_whole_pieces(p).
QWEN3_HD LaneMoments fresh(const ParamView& p, const StepScalars& s, int64_t row, int64_t block, int lane,
                           float old_m_row, float old_v_row, bool pieces = false) {
  const int64_t col0 = first_column(block, lane);
  const int64_t code_byte = row * (p.stored_cols / 2) + col0 / 2;
  const int64_t scale_index = row * (p.stored_cols / kNvfp4Block) + block;
  const auto* m_packed = static_cast<const uint8_t*>(p.exp_avg) + code_byte;
  const auto* v_packed = static_cast<const uint8_t*>(p.exp_avg_sq) + code_byte;
  // Element k's code is nibble k: even columns are the low nibble of their byte.
  uint32_t m_codes, v_codes;
  float grad[kPerLane];
  if (lane_in_pieces<kPerLane>(p, col0, pieces)) {
    m_codes = load_two_bytes(m_packed);
    v_codes = load_two_bytes(v_packed);
    load_values(p.grad, p.grad_bf16 != 0, row * p.cols + col0, grad);
    QWEN3_UNROLL
    for (int k = 0; k < kPerLane; ++k)
      grad[k] = p.grad_bf16 ? scaled_grad<true>(grad[k], s.grad_scale) : scaled_grad<false>(grad[k], s.grad_scale);
  } else {
    m_codes = m_packed[0] | static_cast<uint32_t>(m_packed[1]) << 8;
    v_codes = v_packed[0] | static_cast<uint32_t>(v_packed[1]) << 8;
    QWEN3_UNROLL
    for (int k = 0; k < kPerLane; ++k) grad[k] = grad_of(p, s, row, col0 + k);
  }
  const float m_scale = codec::e4m3_to_float(static_cast<const uint8_t*>(p.exp_avg_scale)[scale_index]);
  const float v_scale = codec::e4m3_to_float(static_cast<const uint8_t*>(p.exp_avg_sq_scale)[scale_index]);
  LaneMoments out;
  QWEN3_UNROLL
  for (int k = 0; k < kPerLane; ++k) {
    out.m[k] = nvfp4_decode_value((m_codes >> (4 * k)) & 0xFu, m_scale, old_m_row);
    const float root = nvfp4_decode_value((v_codes >> (4 * k)) & 0xFu, v_scale, old_v_row);
    out.v[k] = mul_rn(root, root);
    update_moments(grad[k], out.m[k], out.v[k], s);
  }
  return out;
}

// The lane's largest |m| and v: what the row's fp32 scales are made from (v's through sqrt of the row's largest:
// sqrt is correctly rounded and so monotone, so sqrt of the largest v is the largest sqrt(v), one square root a
// row where there was one an element).
QWEN3_HD void row_maxima(const LaneMoments& lane, float& m_max, float& v_max) {
  QWEN3_UNROLL
  for (int k = 0; k < kPerLane; ++k) {
    m_max = fmaxf(m_max, fabsf(lane.m[k]));
    v_max = fmaxf(v_max, lane.v[k]);
  }
}

// The lane's masters (0 on padding), loaded by the second pass before anything is stored: a store may alias a
// later load as far as the compiler knows, so a load left between the stores would wait for the one before it,
// a memory round trip each.
struct LaneMasters {
  float value[kPerLane];
};

QWEN3_HD LaneMasters load_masters(const ParamView& p, int64_t row, int64_t block, int lane, bool pieces = false) {
  const int64_t col0 = first_column(block, lane);
  LaneMasters out;
  if (lane_in_pieces<kPerLane>(p, col0, pieces)) {
    load_values(p.master, p.master_bf16 != 0, row * p.cols + col0, out.value);
    return out;
  }
  QWEN3_UNROLL
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = col0 + k;
    out.value[k] = col < p.cols ? master_of(p, row * p.cols + col) : 0.0f;
  }
  return out;
}

// |m| and sqrt(v) over the new row scales (`m_row`, `v_row`: their block_divisor), and the lane's largest of
// each (the block's scale codes come from the largest over its four lanes: maxima are exact in any order).
struct LaneNormalized {
  float m[kPerLane], root[kPerLane];
  float m_amax, root_amax;
};

QWEN3_HD LaneNormalized normalize(const LaneMoments& lane, BlockDivisor m_row, BlockDivisor v_row) {
  LaneNormalized out;
  out.m_amax = 0.0f, out.root_amax = 0.0f;
  QWEN3_UNROLL
  for (int k = 0; k < kPerLane; ++k) {
    out.m[k] = divide(fabsf(lane.m[k]), m_row);
    out.root[k] = divide(sqrtf(lane.v[k]), v_row);
    out.m_amax = fmaxf(out.m_amax, out.m[k]);
    out.root_amax = fmaxf(out.root_amax, out.root[k]);
  }
  return out;
}

// The lane's masters after the step, as stored (a bf16 one after its rounding), as floats (0 past the row's end):
// what the next forward's operand is made from.
struct SteppedMasters {
  float value[kPerLane];
};

// Encodes the lane's four elements under the block's scale codes (stochastic rounding from the element's
// draws), writes its two code bytes of each moment and, lane 0, the block's scale codes, and steps the master.
// Every lane must have read the block's old scale codes before any lane calls this (the kernel's shuffles of
// the block maxima come between). Returns the stepped masters.
template <typename SquareGaps = ComputedSquareGaps>
QWEN3_HD SteppedMasters store(const ParamView& p, const StepScalars& s, int64_t row, int64_t block, int lane,
                    const LaneMoments& moments, const LaneMasters& masters, const LaneNormalized& normalized,
                    uint8_t m_code, uint8_t v_code, SquareGaps square_gaps = SquareGaps(), bool pieces = false) {
  const int64_t col0 = first_column(block, lane);
  const BlockDivisor m_scale = block_divisor(codec::e4m3_to_float(m_code));
  const BlockDivisor v_scale = block_divisor(codec::e4m3_to_float(v_code));
  uint32_t m_codes = 0, v_codes = 0, master_bits[kPerLane];
  const bool whole = lane_in_pieces<kPerLane>(p, col0, pieces), bf16_master = p.master_bf16 != 0;
  // The lane's four state indices share their high 32 bits (the first, row * stored_cols + col0, is a multiple of
  // 4), so the draws take one low word plus k and one high word: element_draws's bits, the key's mixing of the high
  // word made once a lane.
  const auto first_index = static_cast<uint64_t>(row * p.stored_cols + col0);
  const uint32_t index_low = static_cast<uint32_t>(first_index), index_high = static_cast<uint32_t>(first_index >> 32);
  QWEN3_UNROLL
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = col0 + k;
    const ElementDraws draws = element_draws_split(s.random_key, index_low + static_cast<uint32_t>(k), index_high);
    uint32_t mc = nvfp4_stochastic_magnitude<false>(normalized.m[k], m_scale, uniform_from_draw(draws.m));
    if (mc != 0 && moments.m[k] < 0.0f) mc |= 8u;
    const uint32_t vc =
        nvfp4_stochastic_magnitude<true>(normalized.root[k], v_scale, uniform_from_draw(draws.v), square_gaps);
    m_codes |= mc << (4 * k);
    v_codes |= vc << (4 * k);
    master_bits[k] = stepped_master_bits(bf16_master, s, masters.value[k], moments.m[k], moments.v[k], draws.master);
    if (!whole && col < p.cols) store_master_bits(p, row * p.cols + col, master_bits[k]);
  }
  const int64_t code_byte = row * (p.stored_cols / 2) + col0 / 2;
  auto* m_packed = static_cast<uint8_t*>(p.exp_avg) + code_byte;
  auto* v_packed = static_cast<uint8_t*>(p.exp_avg_sq) + code_byte;
  if (whole) {
    store_two_bytes(m_packed, m_codes);
    store_two_bytes(v_packed, v_codes);
    store_value_bits(p.master, bf16_master, row * p.cols + col0, master_bits);
  } else {
    m_packed[0] = static_cast<uint8_t>(m_codes), m_packed[1] = static_cast<uint8_t>(m_codes >> 8);
    v_packed[0] = static_cast<uint8_t>(v_codes), v_packed[1] = static_cast<uint8_t>(v_codes >> 8);
  }
  if (lane == 0) {
    const int64_t scale_index = row * (p.stored_cols / kNvfp4Block) + block;
    static_cast<uint8_t*>(p.exp_avg_scale)[scale_index] = m_code;
    static_cast<uint8_t*>(p.exp_avg_sq_scale)[scale_index] = v_code;
  }
  SteppedMasters stepped;
  QWEN3_UNROLL
  for (int k = 0; k < kPerLane; ++k)
    stepped.value[k] = col0 + k < p.cols ? stored_master_value(bf16_master, master_bits[k]) : 0.0f;
  return stepped;
}

// --keep-weight-operands always: the lane's four elements of the next forward's bf16 operand deq(Q(master)) of the
// masters it has just stepped, [rows, cols] unpadded. The lane group that holds a moment block holds the operand's
// 16-block too (the launcher asks for rows of whole 16-blocks), and its scale comes from the four lanes
// (nvfp4_block_lanes.cuh; `exchange(v, d)`: lane ^ d's v, d = 1, 2). Every lane of the warp calls, `here` false
// (zeros, nothing stored) for a group past the row's blocks. One 8-byte store where the lanes move whole pieces
// and the operand is aligned to them.
template <typename Exchange>
QWEN3_HD void write_operand(const ParamView& p, int64_t row, int64_t block, int lane, bool here,
                            const SteppedMasters& stepped, bool pieces, const Exchange& exchange) {
  write_lane_operand(p, row * p.cols + first_column(block, lane), here, pieces && aligned_to(p.operand, 8), lane == 0,
                     stepped.value, exchange);
}

}  // namespace qwen3::kernels::adamw::nvfp4_lanes
