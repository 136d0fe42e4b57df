// Launchers of the CUDA kernels: plain C++ over raw device pointers, sizes and a stream, so nothing in
// kernels/ depends on libtorch. Every launcher returns a cudaError_t-compatible int (0 = success).
#pragma once
#include <cstdint>

namespace qwen3::kernels {

// Number of CUDA devices usable by this process; 0 when there is no driver or no device (never fails).
int cuda_device_count();

}  // namespace qwen3::kernels
