// The sliced loss's two passes over a slice of logits [rows, width] (in the activation dtype, as the product
// wrote them): the statistics (max, sum of exponentials, the target's logit) merged into each row's running ones,
// and the gradient written over the logits in place. Rules: lm_loss_slice.cuh; design: lm_loss_slice.md.
#include <cuda_runtime.h>

#include <cstdint>

#include "lm_loss_slice.cuh"
#include "qwen3_kernels.h"
#include "vector_access.cuh"

namespace qwen3::kernels {
namespace {

namespace l = loss;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// 16 bytes of a row: 8 bf16 or 4 fp32 values.
template <bool kBf16>
constexpr int kVector = kBf16 ? 8 : 4;

__device__ __forceinline__ l::SoftmaxStats warp_merge(l::SoftmaxStats s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const l::SoftmaxStats other{__shfl_xor_sync(0xFFFFFFFFu, s.max, offset), __shfl_xor_sync(0xFFFFFFFFu, s.sum, offset)};
    s = l::merge(s, other);
  }
  return s;
}

// A CTA per row: every thread folds its columns into its own statistics (16 bytes at a time where the row is
// aligned), the CTA merges them, thread 0 merges the slice's into the row's running statistics.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads) stats_kernel(const void* logits, int64_t rows, int64_t width, int64_t first_column,
                                                         const int64_t* targets, float* running_max, float* running_sum,
                                                         float* target_logit, int vectorized) {
  __shared__ float shared_max[kWarps], shared_sum[kWarps];
  constexpr int kV = kVector<kBf16>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * width;
    l::SoftmaxStats s = l::empty_stats();
    if (vectorized) {
      for (int64_t c = threadIdx.x * static_cast<int64_t>(kV); c < width; c += static_cast<int64_t>(kThreads) * kV) {
        float v[kV];
        vec::load<kBf16, kV>(logits, base + c, v);
        for (int k = 0; k < kV; ++k) s = l::add(s, v[k]);
      }
    } else {
      for (int64_t c = threadIdx.x; c < width; c += kThreads) s = l::add(s, l::load<kBf16>(logits, base + c));
    }
    s = warp_merge(s);
    if (threadIdx.x % 32 == 0) shared_max[threadIdx.x / 32] = s.max, shared_sum[threadIdx.x / 32] = s.sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      l::SoftmaxStats slice = l::empty_stats();
      for (int w = 0; w < kWarps; ++w) slice = l::merge(slice, l::SoftmaxStats{shared_max[w], shared_sum[w]});
      const l::SoftmaxStats total = l::merge(l::SoftmaxStats{running_max[row], running_sum[row]}, slice);
      running_max[row] = total.max;
      running_sum[row] = total.sum;
      const int64_t t = targets[row];
      if (t >= first_column && t < first_column + width) target_logit[row] = l::load<kBf16>(logits, base + t - first_column);
    }
    __syncthreads();  // the shared slots are reused by the next row
  }
}

// The gradient of every logit, over the logits (out may be logits): a thread per 16 bytes where rows are aligned.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads) gradient_kernel(const void* logits, void* out, int64_t rows, int64_t width,
                                                            int64_t first_column, const int64_t* targets, const float* lse,
                                                            const float* row_scale, int vectorized) {
  constexpr int kV = kVector<kBf16>;
  const int64_t step = vectorized ? kV : 1;
  const int64_t items = rows * width / step;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = item * step, row = i / width, column = first_column + i % width;
    const float row_lse = lse[row], scale = row_scale[row];
    const int64_t t = targets[row];
    if (vectorized) {
      float v[kV];
      vec::load<kBf16, kV>(logits, i, v);
      for (int k = 0; k < kV; ++k) v[k] = l::logit_gradient<kBf16>(v[k], row_lse, column + k == t, scale);
      vec::store<kBf16, kV>(out, i, v);
    } else {
      l::store<kBf16>(out, i, l::logit_gradient<kBf16>(l::load<kBf16>(logits, i), row_lse, column == t, scale));
    }
  }
}

bool supported(KernelDType t) { return t == KernelDType::f32 || t == KernelDType::bf16; }

// 16-byte loads need an aligned start and rows of whole vectors.
bool vectorizable(const void* p, KernelDType t, int64_t width) {
  return t == KernelDType::bf16 ? vec::aligned_for<true, kVector<true>>(p) && width % kVector<true> == 0
                                : vec::aligned_for<false, kVector<false>>(p) && width % kVector<false> == 0;
}

int grid_for(int64_t items) {
  const int64_t ctas = (items + kThreads - 1) / kThreads;
  return static_cast<int>(ctas < 1 ? 1 : (ctas > 65535 ? 65535 : ctas));
}

}  // namespace

int launch_loss_slice_stats(const void* logits, KernelDType type, int64_t rows, int64_t width, int64_t first_column,
                            const int64_t* targets, float* running_max, float* running_sum, float* target_logit,
                            void* stream) {
  if (!supported(type) || rows < 0 || width <= 0 || first_column < 0 || !logits || !targets || !running_max ||
      !running_sum || !target_logit)
    return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const int grid = static_cast<int>(rows < 65535 ? rows : 65535);
  const int vec = vectorizable(logits, type, width) ? 1 : 0;
  if (type == KernelDType::bf16)
    stats_kernel<true><<<grid, kThreads, 0, s>>>(logits, rows, width, first_column, targets, running_max, running_sum,
                                                 target_logit, vec);
  else
    stats_kernel<false><<<grid, kThreads, 0, s>>>(logits, rows, width, first_column, targets, running_max, running_sum,
                                                  target_logit, vec);
  return static_cast<int>(cudaGetLastError());
}

int launch_loss_slice_gradient(const void* logits, void* out, KernelDType type, int64_t rows, int64_t width,
                               int64_t first_column, const int64_t* targets, const float* lse, const float* row_scale,
                               void* stream) {
  if (!supported(type) || rows < 0 || width <= 0 || first_column < 0 || !logits || !out || !targets || !lse ||
      !row_scale)
    return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool vec = vectorizable(logits, type, width) && vectorizable(out, type, width);
  const int64_t items = rows * width / (vec ? (type == KernelDType::bf16 ? 8 : 4) : 1);
  if (type == KernelDType::bf16)
    gradient_kernel<true><<<grid_for(items), kThreads, 0, s>>>(logits, out, rows, width, first_column, targets, lse,
                                                               row_scale, vec ? 1 : 0);
  else
    gradient_kernel<false><<<grid_for(items), kThreads, 0, s>>>(logits, out, rows, width, first_column, targets, lse,
                                                                row_scale, vec ? 1 : 0);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace qwen3::kernels
