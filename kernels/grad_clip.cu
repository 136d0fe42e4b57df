// A group's gradient clipping in one launch (a launch per 64 tensors): every CTA sums the squares of one chunk of
// one tensor, the last CTA to finish sums the chunks' sums and writes the group's square and clipping factors.
// The rules and the summation order: grad_clip.cuh; why and what it replaces: grad_clip.md.
#include <cuda_runtime.h>

#include <cstdint>

#include "grad_clip.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

namespace gc = grad_clip;

constexpr int kTensorsPerLaunch = 64;

// This launch's tensors: CTA b reads chunk b - first_chunk[i] of the tensor i whose range holds b.
struct LaunchTensors {
  const void* data[kTensorsPerLaunch];
  int64_t numel[kTensorsPerLaunch];
  int64_t first_chunk[kTensorsPerLaunch + 1];  // within this launch; first_chunk[count] = its CTAs
  uint8_t bf16[kTensorsPerLaunch];
  int count;
  int64_t chunk_base;  // this launch's first chunk within the group
};

struct GroupWork {
  double* chunk_sums;             // [group_chunks]
  unsigned int* finished;         // CTAs of the group done so far (zeroed before the first launch)
  unsigned int* tensor_finished;  // [group_count]: CTAs of each tensor done so far (zeroed too)
  int64_t group_chunks;
  int group_count;  // tensors in the group (the factors' length)
  int first_tensor; // this launch's first tensor in the group
};

// Loads piece k of this thread (eight elements as fp32): one 16-byte load of bf16, two of fp32, where the chunk
// is whole and the tensor 16-byte aligned; element by element otherwise (a zero past the end adds nothing).
__device__ void load_piece(const LaunchTensors& t, int i, int64_t chunk, int piece, bool vector, float (&x)[gc::kPieceElements]) {
  const int64_t first = gc::element_index(chunk, threadIdx.x, piece, 0);
  if (vector) {
    if (t.bf16[i]) {
      const uint4 bits = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(t.data[i]) + first));
      const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
      QWEN3_UNROLL
      for (int w = 0; w < 4; ++w) {
        x[2 * w] = gc::bf16_value(static_cast<uint16_t>(words[w] & 0xFFFFu));
        x[2 * w + 1] = gc::bf16_value(static_cast<uint16_t>(words[w] >> 16));
      }
    } else {
      const float4* at = reinterpret_cast<const float4*>(static_cast<const float*>(t.data[i]) + first);
      const float4 lo = __ldg(at), hi = __ldg(at + 1);
      x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
    }
    return;
  }
  QWEN3_UNROLL
  for (int j = 0; j < gc::kPieceElements; ++j) {
    const int64_t e = first + j;
    x[j] = e >= t.numel[i] ? 0.0f
           : t.bf16[i]     ? gc::bf16_value(static_cast<const uint16_t*>(t.data[i])[e])
                           : static_cast<const float*>(t.data[i])[e];
  }
}

// The CTA's kThreads values summed by halving (grad_clip.cuh, tree_total_on_host); every thread gets the total.
__device__ double cta_total(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int h = gc::kThreads / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) shared[threadIdx.x] += shared[threadIdx.x + h];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // shared is reused
  return total;
}

// Chunk sums met in the rules' order (strided_sum, then the tree): a tensor's own, or the whole group's.
__device__ double chunk_sums_total(const double* chunk_sums, int64_t chunks, double* shared) {
  return cta_total(gc::strided_sum(chunk_sums, chunks, threadIdx.x), shared);
}

__global__ void __launch_bounds__(gc::kThreads) grad_clip_kernel(LaunchTensors t, GroupWork w, GradClipGroup g) {
  __shared__ double shared[gc::kThreads];
  __shared__ bool last;
  const int64_t b = blockIdx.x;
  int i = 0;
  while (i + 1 < t.count && t.first_chunk[i + 1] <= b) ++i;
  const int64_t chunk = b - t.first_chunk[i];
  const bool vector = (chunk + 1) * gc::kChunkElements <= t.numel[i] &&
                      reinterpret_cast<uintptr_t>(t.data[i]) % 16 == 0;
  gc::ThreadSums sums{};
  // Two halves of four pieces, each half's loads issued before its squares are summed.
  QWEN3_UNROLL
  for (int half = 0; half < 2; ++half) {
    float x[gc::kPieces / 2][gc::kPieceElements];
    QWEN3_UNROLL
    for (int k = 0; k < gc::kPieces / 2; ++k) load_piece(t, i, chunk, half * (gc::kPieces / 2) + k, vector, x[k]);
    QWEN3_UNROLL
    for (int k = 0; k < gc::kPieces / 2; ++k) gc::add_piece(sums, x[k]);
  }
  const double chunk_sum = cta_total(gc::thread_total(sums), shared);
  __shared__ bool last_of_tensor;
  if (threadIdx.x == 0) {
    w.chunk_sums[t.chunk_base + b] = chunk_sum;
    __threadfence();  // the sum is visible to every CTA before this one counts as finished
    const auto tensor_chunks = static_cast<unsigned int>(t.first_chunk[i + 1] - t.first_chunk[i]);
    last_of_tensor = g.tensor_squares && atomicAdd(w.tensor_finished + w.first_tensor + i, 1u) + 1 == tensor_chunks;
    last = atomicAdd(w.finished, 1u) + 1 == static_cast<unsigned int>(w.group_chunks);
  }
  __syncthreads();
  if (last_of_tensor) {  // the tensor's own square, from its chunk sums alone (grad_clip.cuh, tensor order)
    __threadfence();
    const double square = chunk_sums_total(w.chunk_sums + t.chunk_base + t.first_chunk[i],
                                           t.first_chunk[i + 1] - t.first_chunk[i], shared);
    if (threadIdx.x == 0) g.tensor_squares[w.first_tensor + i] = square;
  }
  if (!last) return;
  // The group's last CTA: every other chunk's sum was made visible before it was counted.
  __threadfence();
  const double square = chunk_sums_total(w.chunk_sums, w.group_chunks, shared);
  __shared__ float scale;
  if (threadIdx.x == 0 && g.sum) {
    *g.sum = g.accumulate ? *g.sum + square : square;
  }
  if (threadIdx.x == 0) {
    double counted = g.counted_elements;
    if (g.ranks_with_gradient) {
      counted = 0.0;
      for (int k = 0; k < w.group_count; ++k) counted += g.numels_device[k] * (g.ranks_with_gradient[k] > 0 ? 1.0 : 0.0);
    }
    scale = gc::clip_scale(square, counted, g.trainable, g.max_norm);
  }
  __syncthreads();
  if (g.factors)
    for (int k = threadIdx.x; k < w.group_count; k += gc::kThreads)
      g.factors[k] = g.ranks_with_gradient && !(g.ranks_with_gradient[k] > 0) ? __int_as_float(0x7FC00000) : scale;
}

}  // namespace

int64_t grad_clip_workspace_doubles(const GradClipTensor* tensors, int count) {
  int64_t chunks = 0;
  for (int i = 0; i < count; ++i) chunks += grad_clip::chunks_of(tensors[i].numel);
  // Then the group's finished-CTA counter and one a tensor, 32-bit each, in whole doubles.
  return chunks + 1 + (count + 1) / 2;
}

int launch_grad_clip(const GradClipTensor* tensors, int count, const GradClipGroup& group, double* workspace,
                     void* stream) {
  if (count < 1 || !tensors || !workspace || (!group.sum && !group.tensor_squares) ||
      (group.ranks_with_gradient && !group.numels_device))
    return static_cast<int>(cudaErrorInvalidValue);
  for (int i = 0; i < count; ++i)
    if (tensors[i].numel < 0 || (tensors[i].numel > 0 && !tensors[i].data) ||
        (tensors[i].dtype != KernelDType::f32 && tensors[i].dtype != KernelDType::bf16))
      return static_cast<int>(cudaErrorInvalidValue);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  int64_t group_chunks = 0;
  for (int i = 0; i < count; ++i) group_chunks += grad_clip::chunks_of(tensors[i].numel);
  auto* counters = reinterpret_cast<unsigned int*>(workspace + group_chunks);
  GroupWork work{workspace, counters, counters + 1, group_chunks, count, 0};
  const size_t counter_bytes = sizeof(unsigned int) * (1 + static_cast<size_t>(count));
  if (const cudaError_t e = cudaMemsetAsync(counters, 0, counter_bytes, cuda_stream); e != cudaSuccess)
    return static_cast<int>(e);
  int64_t chunk_base = 0;
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    LaunchTensors t{};
    t.count = count - first < kTensorsPerLaunch ? count - first : kTensorsPerLaunch;
    t.chunk_base = chunk_base;
    work.first_tensor = first;
    for (int i = 0; i < t.count; ++i) {
      const GradClipTensor& x = tensors[first + i];
      t.data[i] = x.data;
      t.numel[i] = x.numel;
      t.bf16[i] = x.dtype == KernelDType::bf16 ? 1 : 0;
      t.first_chunk[i + 1] = t.first_chunk[i] + grad_clip::chunks_of(x.numel);
    }
    const int64_t ctas = t.first_chunk[t.count];
    if (ctas > 2147483647) return static_cast<int>(cudaErrorInvalidValue);
    grad_clip_kernel<<<static_cast<unsigned int>(ctas), grad_clip::kThreads, 0, cuda_stream>>>(t, work, group);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
    chunk_base += ctas;
  }
  return 0;
}

}  // namespace qwen3::kernels
