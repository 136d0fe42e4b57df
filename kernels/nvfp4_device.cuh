// Small device-side helpers shared by the NVFP4 kernels: element types, 16-byte loads converted to fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "qwen3_kernels.h"

namespace qwen3::kernels::device {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// 16 loaded bytes of T as 16 / sizeof(T) fp32 values.
template <typename T>
__device__ __forceinline__ void vector_as_float(const uint4& raw, float* out) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = static_cast<uint16_t>(words[i] & 0xFFFFu);
      const uint16_t hi = static_cast<uint16_t>(words[i] >> 16);
      if constexpr (sizeof(T) == 2 && std::is_same_v<T, __nv_bfloat16>) {
        out[2 * i] = __uint_as_float(static_cast<uint32_t>(lo) << 16);  // bf16 is the top half of an fp32
        out[2 * i + 1] = __uint_as_float(static_cast<uint32_t>(hi) << 16);
      } else {
        out[2 * i] = __half2float(__ushort_as_half(lo));
        out[2 * i + 1] = __half2float(__ushort_as_half(hi));
      }
    }
  }
}

// The 16 bytes at p (16-byte aligned) as 16 / sizeof(T) fp32 values; a streaming load, since every input
// element is read exactly once.
template <typename T>
__device__ __forceinline__ void load16_as_float(const T* p, float* out) {
  vector_as_float<T>(__ldcs(reinterpret_cast<const uint4*>(p)), out);
}

// The same through the read-only cache, for data many threads read again (the GEMV's x).
template <typename T>
__device__ __forceinline__ void load16_as_float_cached(const T* p, float* out) {
  vector_as_float<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

// n elements starting at p, any alignment.
template <typename T>
__device__ __forceinline__ void load_as_float(const T* p, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = to_float(p[i]);
}

inline bool is_aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline int element_size(KernelDType type) { return type == KernelDType::f32 ? 4 : 2; }

inline bool valid_dtype(KernelDType type) {
  return type == KernelDType::f32 || type == KernelDType::bf16 || type == KernelDType::f16;
}

}  // namespace qwen3::kernels::device
