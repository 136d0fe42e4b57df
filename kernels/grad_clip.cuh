// The clipping of one group of gradients on the GPU (grad_clip.cu), as __host__ __device__ rules: the group's
// squared L2 norm summed in an order that the constants below fix (never the device's size, the grid or the
// schedule, so a group gives the same bits on every GPU and every run), and the clipping factor from it. The
// kernel runs these functions; tests/grad_clip_host_run.h runs them on the host in the kernel's order, which
// the CPU tests check against a plain fp64 sum and the GPU tests check the kernel against, bit for bit.
// Design and costs: kernels/grad_clip.md.
#pragma once
#include <cmath>
#include <cstdint>

#include "nvfp4_codec.cuh"  // QWEN3_HD, QWEN3_UNROLL, bits_to_float

namespace qwen3::kernels::grad_clip {

// A CTA reads one chunk of one tensor: kThreads threads, each kPieces pieces of kPieceElements consecutive
// elements (16 bytes of bf16, 32 of fp32), piece k of thread t at (k * kThreads + t) * kPieceElements within the
// chunk: a warp's loads are contiguous.
constexpr int kThreads = 256;
constexpr int kPieceElements = 8;
constexpr int kPieces = 8;
constexpr int64_t kChunkElements = static_cast<int64_t>(kThreads) * kPieces * kPieceElements;  // 16,384

// Chunks a tensor of `numel` elements takes; an empty tensor takes one (it sums to zero), so every group of at
// least one tensor runs at least one CTA, which is the one that finishes the group.
QWEN3_HD int64_t chunks_of(int64_t numel) {
  return numel <= 0 ? 1 : (numel + kChunkElements - 1) / kChunkElements;
}

// Element j of piece k of thread t of chunk c: its index in the tensor.
QWEN3_HD int64_t element_index(int64_t chunk, int thread, int piece, int j) {
  return chunk * kChunkElements + (static_cast<int64_t>(piece) * kThreads + thread) * kPieceElements + j;
}

QWEN3_HD float bf16_value(uint16_t bits) { return codec::bits_to_float(static_cast<uint32_t>(bits) << 16); }

// A thread's running sums, one per position in a piece: position j adds the square of element j of every piece
// in piece order. An fp32 value squared in fp64 is exact (24 significant bits twice is 48 < 53), so a fused
// multiply-add gives the same bits as a multiply then an add: only the additions round, in this order.
struct ThreadSums {
  double lane[kPieceElements];
};
QWEN3_HD void add_piece(ThreadSums& sums, const float (&x)[kPieceElements]) {
  QWEN3_UNROLL
  for (int j = 0; j < kPieceElements; ++j) {
    const double d = static_cast<double>(x[j]);
    sums.lane[j] += d * d;
  }
}
// The thread's sum: its eight positions pairwise, ((0+1)+(2+3))+((4+5)+(6+7)).
QWEN3_HD double thread_total(const ThreadSums& s) {
  return ((s.lane[0] + s.lane[1]) + (s.lane[2] + s.lane[3])) + ((s.lane[4] + s.lane[5]) + (s.lane[6] + s.lane[7]));
}

// A CTA's kThreads values meet by halving: value t += value t + h for h = kThreads/2, ..., 1; value 0 is the sum.
// (The kernel runs each level across threads with a barrier between; the host runs the same additions.)
inline double tree_total_on_host(double* values) {
  for (int h = kThreads / 2; h > 0; h /= 2)
    for (int t = 0; t < h; ++t) values[t] += values[t + h];
  return values[0];
}

// The group's square from its chunks' sums (every tensor's chunks, tensor by tensor, in order): thread t sums
// chunk sums t, t + kThreads, ... in order, then the CTA's tree as above. A tensor's own square (written where
// the caller asks for each tensor's) is the same over its chunks alone.
// (On the device the sums are read through L2, __ldcg: other CTAs wrote them during this kernel.)
QWEN3_HD double strided_sum(const double* chunk_sums, int64_t chunks, int thread) {
  double s = 0.0;
#if defined(__CUDA_ARCH__)
  for (int64_t i = thread; i < chunks; i += kThreads) s += __ldcg(chunk_sums + i);
#else
  for (int64_t i = thread; i < chunks; i += kThreads) s += chunk_sums[i];
#endif
  return s;
}

// The group's clipping factor, the host's clip_factor on its share of the limit (docs/trainer.md, "Clipping is
// per group"): limit = max_norm * sqrt(counted / trainable); the factor is limit / (norm + 1e-6) where the norm
// exceeds a positive limit, else 1; 1 without clipping (max_norm <= 0); NaN when the norm is not finite (the
// update skips the group). fp64 throughout, one IEEE operation a step, rounded to fp32 once at the end.
QWEN3_HD float clip_scale(double square, double counted, double trainable, double max_norm) {
  const double norm = sqrt(square);
  if (!(norm <= 1.7976931348623157e308)) return codec::bits_to_float(0x7FC00000u);  // inf or NaN: a quiet NaN
  if (!(max_norm > 0)) return 1.0f;
  const double limit = max_norm * sqrt(counted / trainable);
  return static_cast<float>(limit > 0 && norm > limit ? limit / (norm + 1e-6) : 1.0);
}

}  // namespace qwen3::kernels::grad_clip
