// K consecutive activation elements (fp32 or bf16) as one or two vector accesses, converted to and from fp32:
// what the fused activation kernels and the loss kernels use instead of a 2-byte access a thread. The caller
// checks alignment (aligned_for) and that the K elements lie in one row.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "fused_ops.cuh"

namespace qwen3::kernels::vec {

// K elements' bytes in one aligned piece: 16 bytes at most (two loads for 32 bytes of fp32).
template <int kBytes>
struct alignas(kBytes > 16 ? 16 : kBytes) Piece {
  uint32_t words[kBytes / 4];
};

template <bool kBf16, int K>
constexpr int kPieceBytes = K * (kBf16 ? 2 : 4);

// Whether K elements from element index 0 of p can be accessed as pieces (every multiple of K after it too).
template <bool kBf16, int K>
inline bool aligned_for(const void* p) {
  constexpr int align = kPieceBytes<kBf16, K> > 16 ? 16 : kPieceBytes<kBf16, K>;
  return reinterpret_cast<uintptr_t>(p) % align == 0;
}

template <bool kBf16, int K>
using PieceOf = Piece<kPieceBytes<kBf16, K>>;

// The K elements from element i as their stored bytes (what a kernel keeps in registers between two passes over
// them: half the registers of their floats in bf16), and those bytes as floats.
template <bool kBf16, int K>
__device__ __forceinline__ PieceOf<kBf16, K> load_piece(const void* p, int64_t i) {
  return *reinterpret_cast<const PieceOf<kBf16, K>*>(static_cast<const char*>(p) + i * (kBf16 ? 2 : 4));
}
template <bool kBf16, int K>
__device__ __forceinline__ void unpack(const PieceOf<kBf16, K>& piece, float (&out)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
    out[k] = kBf16 ? fused::bf16_to_float(static_cast<uint16_t>(piece.words[k / 2] >> (16 * (k % 2))))
                   : __uint_as_float(piece.words[k]);
}

template <bool kBf16, int K>
__device__ __forceinline__ void load(const void* p, int64_t i, float (&out)[K]) {
  unpack<kBf16, K>(load_piece<kBf16, K>(p, i), out);
}

// Stores round to bf16 as fused::store does (nearest even).
template <bool kBf16, int K>
__device__ __forceinline__ void store(void* p, int64_t i, const float (&v)[K]) {
  using P = Piece<kPieceBytes<kBf16, K>>;
  P piece;
#pragma unroll
  for (int w = 0; w < kPieceBytes<kBf16, K> / 4; ++w)
    piece.words[w] = kBf16 ? (static_cast<uint32_t>(fused::bf16_nearest(v[2 * w])) |
                              (static_cast<uint32_t>(fused::bf16_nearest(v[2 * w + 1])) << 16))
                           : __float_as_uint(v[w]);
  *reinterpret_cast<P*>(static_cast<char*>(p) + i * (kBf16 ? 2 : 4)) = piece;
}

}  // namespace qwen3::kernels::vec
