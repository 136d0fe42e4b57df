// The group clipping kernel (kernels/grad_clip.cu) run on the host in its order, with its own functions
// (kernels/grad_clip.cuh): what tests/test_grad_clip_rules.cpp checks against plain sums, and what the GPU tests
// (tests/gpu/test_grad_clip_kernel.cpp, the in-backward updater's) check the kernel against, bit for bit.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "grad_clip.cuh"

namespace qwen3::grad_clip_test {

namespace gc = kernels::grad_clip;

// One chunk's sum: each thread's pieces in order, its eight positions pairwise, then the CTA's tree.
inline double chunk_sum_on_host(const float* x, int64_t numel, int64_t chunk) {
  std::vector<double> threads(gc::kThreads);
  for (int t = 0; t < gc::kThreads; ++t) {
    gc::ThreadSums sums{};
    for (int k = 0; k < gc::kPieces; ++k) {
      float piece[gc::kPieceElements];
      for (int j = 0; j < gc::kPieceElements; ++j) {
        const int64_t e = gc::element_index(chunk, t, k, j);
        piece[j] = e < numel ? x[e] : 0.0f;
      }
      gc::add_piece(sums, piece);
    }
    threads[t] = gc::thread_total(sums);
  }
  return gc::tree_total_on_host(threads.data());
}

// Chunk sums met as the kernel meets them: strided sums, then the tree.
inline double chunk_sums_total_on_host(const std::vector<double>& chunk_sums) {
  std::vector<double> threads(gc::kThreads);
  for (int t = 0; t < gc::kThreads; ++t)
    threads[t] = gc::strided_sum(chunk_sums.data(), static_cast<int64_t>(chunk_sums.size()), t);
  return gc::tree_total_on_host(threads.data());
}

inline std::vector<double> chunk_sums_on_host(const std::vector<float>& v) {
  std::vector<double> sums;
  for (int64_t c = 0; c < gc::chunks_of(static_cast<int64_t>(v.size())); ++c)
    sums.push_back(chunk_sum_on_host(v.data(), static_cast<int64_t>(v.size()), c));
  return sums;
}

// The group's squared norm as the kernel forms it: every tensor's chunk sums in order, then strided sums and the
// tree. `values`: each tensor as the kernel reads it (fp32, a bf16 gradient widened).
inline double group_square_on_host(const std::vector<std::vector<float>>& values) {
  std::vector<double> chunk_sums;
  for (const auto& v : values) {
    const std::vector<double> own = chunk_sums_on_host(v);
    chunk_sums.insert(chunk_sums.end(), own.begin(), own.end());
  }
  return chunk_sums_total_on_host(chunk_sums);
}

// One tensor's own square (the kernel's tensor_squares): its chunk sums alone, met the same way.
inline double tensor_square_on_host(const std::vector<float>& v) { return chunk_sums_total_on_host(chunk_sums_on_host(v)); }

// The same for tensors (any device, fp32 or bf16).
inline double group_square_on_host(const std::vector<at::Tensor>& grads) {
  std::vector<std::vector<float>> values;
  for (const at::Tensor& g : grads) {
    const at::Tensor f = g.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
    values.emplace_back(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  }
  return group_square_on_host(values);
}

}  // namespace qwen3::grad_clip_test
