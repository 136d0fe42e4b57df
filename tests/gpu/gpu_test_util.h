// Helpers for the CUDA kernel tests: device buffers, host bf16/f16 conversions, NaN-aware bit comparison.
// Plain CUDA runtime API and host vectors; no libtorch tensors.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test.h"
#include "qwen3_kernels.h"

namespace qwen3::gpu_test {

inline bool have_gpu() { return kernels::cuda_device_count() > 0; }

// A kernel test's first line (gpu_test.h: the test's name must contain "Gpu").
#define QWEN3_REQUIRE_GPU() QWEN3_GPU_TEST(::qwen3::gpu_test::have_gpu())

// What a launcher returns for arguments it refuses. Argument tests compare with it, not with "non-zero": without a
// device a launch that should have been refused fails too (cudaErrorInsufficientDriver), so "non-zero" could
// not catch a check that went missing on the machines without a GPU.
inline constexpr int kInvalidValue = static_cast<int>(cudaErrorInvalidValue);

#define QWEN3_CUDA_OK(call)                                                          \
  do {                                                                               \
    const cudaError_t status_ = (call);                                              \
    ASSERT_EQ(status_, cudaSuccess) << #call << ": " << cudaGetErrorString(status_); \
  } while (0)

// Device memory with `slack` spare bytes in front, so a test can hand a kernel a deliberately misaligned
// pointer (data() + offset) and still stay inside the allocation.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&base_, bytes + kSlack) != cudaSuccess) base_ = nullptr;
  }
  ~DeviceBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool ok() const { return base_ != nullptr; }
  // cudaMalloc is 256-byte aligned, so offset 0 is aligned for every vector width.
  uint8_t* at(size_t offset = 0) const { return static_cast<uint8_t*>(base_) + offset; }
  static constexpr size_t kSlack = 64;

 private:
  void* base_ = nullptr;
  size_t bytes_;
};

template <typename T>
void upload(const std::vector<T>& host, uint8_t* device) {
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
void download(const uint8_t* device, std::vector<T>& host) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
}

// 16-bit element types by their bits, with round-to-nearest-even conversions from fp32 (the cuda_*.h host
// paths) and exact conversions back.
inline uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
inline uint16_t f16_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
inline float bf16_value(uint16_t bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
inline float f16_value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

inline uint16_t to_bits(kernels::KernelDType type, float v) {
  return type == kernels::KernelDType::bf16 ? bf16_bits(v) : f16_bits(v);
}
inline float from_bits(kernels::KernelDType type, uint16_t bits) {
  return type == kernels::KernelDType::bf16 ? bf16_value(bits) : f16_value(bits);
}
inline const char* dtype_name(kernels::KernelDType type) {
  return type == kernels::KernelDType::f32 ? "f32" : type == kernels::KernelDType::bf16 ? "bf16" : "f16";
}

inline uint32_t float_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
// Bitwise equality, except that any NaN equals any NaN (payloads are not part of the contract).
inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

}  // namespace qwen3::gpu_test
