// A lane's elements as whole pieces: 8, 16 or 32 aligned bytes by one or two vector accesses, and two code bytes
// by one 2-byte access, where each element was an access of its own. The int8 and nvfp4 AdamW lanes
// (adamw_int8_lanes.cuh, adamw_nvfp4_lanes.cuh) move them where a row and its buffers allow. On the host the same
// bytes by memcpy (both little-endian), so the CPU tests of the lanes run these very functions.
#pragma once
#include <cstdint>
#include <cstring>

#include "adamw_update.cuh"      // bf16_to_float, bits_to_float; QWEN3_HD, QWEN3_UNROLL
#include "nvfp4_block_lanes.cuh"  // operand_bf16_pair

namespace qwen3::kernels::adamw {

QWEN3_HD bool aligned_to(const void* pointer, uint64_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// kBytes (8, 16 or 32) aligned bytes as 32-bit words: one 8-byte or one or two 16-byte accesses on the device.
template <int kBytes>
QWEN3_HD void load_piece(const void* from, uint32_t (&words)[kBytes / 4]) {
#if defined(__CUDA_ARCH__)
  if constexpr (kBytes == 8) {
    const uint2 w = *static_cast<const uint2*>(from);
    words[0] = w.x, words[1] = w.y;
  } else {
    QWEN3_UNROLL
    for (int k = 0; k < kBytes / 16; ++k) {
      const uint4 w = static_cast<const uint4*>(from)[k];
      words[4 * k] = w.x, words[4 * k + 1] = w.y, words[4 * k + 2] = w.z, words[4 * k + 3] = w.w;
    }
  }
#else
  std::memcpy(words, from, kBytes);
#endif
}
template <int kBytes>
QWEN3_HD void store_piece(void* to, const uint32_t (&words)[kBytes / 4]) {
#if defined(__CUDA_ARCH__)
  if constexpr (kBytes == 8) {
    *static_cast<uint2*>(to) = make_uint2(words[0], words[1]);
  } else {
    QWEN3_UNROLL
    for (int k = 0; k < kBytes / 16; ++k)
      static_cast<uint4*>(to)[k] = make_uint4(words[4 * k], words[4 * k + 1], words[4 * k + 2], words[4 * k + 3]);
  }
#else
  std::memcpy(to, words, kBytes);
#endif
}

// A lane's K (4 or 8) 32-bit words each holding a value's bits, stored as one piece of K values: bf16 (the low
// halves, paired into words, the first value lowest: 2K bytes) or fp32 (4K bytes). What the lanes store of their
// masters and plain moments.
template <int K>
QWEN3_HD void store_value_bits(void* to, bool bf16, int64_t first, const uint32_t (&bits)[K]) {
  if (bf16) {
    uint32_t words[K / 2];
    QWEN3_UNROLL
    for (int k = 0; k < K / 2; ++k) words[k] = (bits[2 * k] & 0xFFFFu) | (bits[2 * k + 1] << 16);
    store_piece<2 * K>(static_cast<uint16_t*>(to) + first, words);
  } else {
    store_piece<4 * K>(static_cast<float*>(to) + first, bits);
  }
}

// Two bytes at an even address, low byte first.
QWEN3_HD uint32_t load_two_bytes(const void* from) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const uint16_t*>(from);
#else
  uint16_t v;
  std::memcpy(&v, from, 2);
  return v;
#endif
}
QWEN3_HD void store_two_bytes(void* to, uint32_t value) {
  const auto v = static_cast<uint16_t>(value);
#if defined(__CUDA_ARCH__)
  *static_cast<uint16_t*>(to) = v;
#else
  std::memcpy(to, &v, 2);
#endif
}

// Whether a lane whose K elements start at column col0 moves them as whole pieces: the kernel's choice `pieces`
// (each lanes header's moves_whole_pieces, asked once a launch) and all K within the row (a lane at a row's padded
// end takes elements).
template <int K>
QWEN3_HD bool lane_in_pieces(const ParamView& p, int64_t col0, bool pieces) {
  return pieces && col0 + K <= p.cols;
}

// A lane's K (4 or 8) fp32 or bf16 values from element `first` on (a whole piece: 8 to 32 bytes), as floats.
template <int K>
QWEN3_HD void load_values(const void* buffer, bool bf16, int64_t first, float (&out)[K]) {
  if (bf16) {
    uint32_t w[K / 2];
    load_piece<2 * K>(static_cast<const uint16_t*>(buffer) + first, w);
    QWEN3_UNROLL
    for (int i = 0; i < K; ++i) out[i] = bf16_to_float(static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2))));
  } else {
    uint32_t w[K];
    load_piece<4 * K>(static_cast<const float*>(buffer) + first, w);
    QWEN3_UNROLL
    for (int i = 0; i < K; ++i) out[i] = bits_to_float(w[i]);
  }
}

// --keep-weight-operands always: a lane's K (4 or 8) values of the next forward's operand (spread_lane_operand's,
// under the block's `scale_code`) out to `out` in bf16: as one 2K-byte piece where `whole` (the lane moves whole
// pieces and the operand is aligned to them), else value by value.
template <int K>
QWEN3_HD void store_operand_values(uint16_t* out, const float (&operand)[K], uint8_t scale_code, bool whole) {
  if (whole) {
    uint32_t w[K / 2];
    QWEN3_UNROLL
    for (int k = 0; k < K / 2; ++k)
      w[k] = block_lanes::operand_bf16_pair(operand[2 * k], operand[2 * k + 1], scale_code);
    store_piece<2 * K>(out, w);
  } else {
    QWEN3_UNROLL
    for (int i = 0; i < K; ++i) out[i] = bf16_nearest(operand[i]);
  }
}

// The write every lanes header's write_operand makes: the lane's K stepped masters' operand values under their
// block's scale (spread_lane_operand: every lane of the warp calls, `here` false bringing zeros and storing nothing)
// out to element `first` of p.operand by store_operand_values (`whole`: as one piece); `flag_lane`: the one lane of
// the block that raises the non-finite flag for a block with an infinite or NaN master.
template <int K, typename Exchange>
QWEN3_HD void write_lane_operand(const ParamView& p, int64_t first, bool here, bool whole, bool flag_lane,
                                 const float (&stepped)[K], const Exchange& exchange) {
  float operand[K];
  const uint8_t code = block_lanes::spread_lane_operand(stepped, here, p.operand_search != 0, exchange, operand);
  if (!here) return;
  store_operand_values(p.operand + first, operand, code, whole);
  if (code == codec::kNonFiniteBlockScale && p.operand_nonfinite_flag != nullptr && flag_lane)
    *p.operand_nonfinite_flag = 1;
}

}  // namespace qwen3::kernels::adamw
