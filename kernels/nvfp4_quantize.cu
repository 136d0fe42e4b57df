// NVFP4 quantize: f32/bf16/f16 [rows, cols] -> E2M1 codes + E4M3 scales, byte-identical to the CPU codec.
//
// A row-major matrix with cols % 16 == 0 is, as a flat array, just consecutive 16-element blocks; the
// kernels never look at rows. Memory-bound, so:
//  - rne mode: each thread reads one 16-byte vector (4 fp32 or 8 bf16/f16 elements) and a group of 4 (fp32)
//    or 2 (16-bit) neighbouring lanes owns one block: a warp load is 512 contiguous bytes, the block's amax is
//    two (or one) shuffles, and each thread writes its 2 (or 4) code bytes; every thread keeps UNROLL vectors
//    in flight before it touches the first.
//  - search mode: one thread per block runs codec::quantize_block, whose candidate errors must be summed in
//    the CPU codec's order; it does ~5x the arithmetic of rne, where one thread per block costs nothing extra.
// The per-element arithmetic is codec::* (nvfp4_codec.cuh), the code the host-side tests check bytewise.
// With `operand` (kOperand), the same pass also writes deq(codes, scales) in bf16: what the training forward's
// product reads, decoded from the codes just made, so it is byte for byte what nvfp4_dequantize.cu writes; the
// codes are then never read back for the forward product (issue 28, point 4: one kernel instead of two).
#include <cuda_runtime.h>

#include <climits>
#include <type_traits>

#include "nvfp4_codec.cuh"
#include "nvfp4_device.cuh"
#include "nvfp4_pairs.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

constexpr int kRneThreads = 256;
constexpr int kRneUnroll = 4;
constexpr int kSearchThreads = 128;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The inputs of one launch (kernel parameter space holds the table: 1 KB of pointers): blockIdx.y picks input g,
// whose outputs are the g-th of the stacked codes, scales and operand (g times one input's sizes further on).
template <typename T>
struct Sources {
  const T* inputs[kNvfp4QuantizeMaxBatch];
};

// Input g of a launch and its outputs: every kernel starts here.
template <typename T>
struct Source {
  const T* x;
  uint8_t* codes;
  uint8_t* scales;
  __nv_bfloat16* operand;
  __device__ __forceinline__ Source(const Sources<T>& table, int64_t n_elements, uint8_t* all_codes,
                                    uint8_t* all_scales, __nv_bfloat16* all_operand) {
    const int64_t g = blockIdx.y;
    x = table.inputs[g];
    codes = all_codes != nullptr ? all_codes + g * (n_elements / 2) : nullptr;
    scales = all_scales != nullptr ? all_scales + g * (n_elements / codec::kBlock) : nullptr;
    operand = all_operand != nullptr ? all_operand + g * n_elements : nullptr;
  }
};

// n values of one block decoded from their packed nibbles (element i = nibble i) into bf16 at out. kVectorized:
// out is aligned to the n values' bytes, which go out as 16-byte stores of packed-pair decodes (n = 8 or 16:
// 16-bit inputs, search) or one 8-byte store (n = 4: an fp32 input's vector; four 2-byte stores a lane before, a
// warp's store then covering 64 of its 256 bytes at a time); else one value at a time.
template <bool kVectorized>
__device__ __forceinline__ void store_operand(uint64_t nibbles, int n, uint8_t scale_code, __nv_bfloat16* out) {
  if (kVectorized && n % 8 == 0) {  // eight values at a time as packed pairs (nvfp4_pairs.cuh), as dequantize does
    const uint32_t scales = pairs::scale_pair<__nv_bfloat16>(scale_code);
#pragma unroll
    for (int i = 0; i < codec::kBlock; i += 8) {
      if (i >= n) break;
      uint32_t q[4];
      pairs::decode_word<__nv_bfloat16>(static_cast<uint32_t>(nibbles >> (4 * i)), scales, q);
      *reinterpret_cast<uint4*>(out + i) = make_uint4(q[0], q[1], q[2], q[3]);
    }
    return;
  }
  const float scale = codec::e4m3_to_float(scale_code);
  alignas(16) __nv_bfloat16 values[codec::kBlock];
#pragma unroll
  for (int i = 0; i < codec::kBlock; ++i)
    if (i < n) values[i] = device::from_float<__nv_bfloat16>(codec::e2m1_to_float((nibbles >> (4 * i)) & 0xFu) * scale);
  if (kVectorized && n == 4) {
    *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(values);
  } else {
    for (int i = 0; i < n; ++i) out[i] = values[i];
  }
}

template <typename T, bool kVectorized, bool kOperand>
__global__ void __launch_bounds__(kRneThreads)
    nvfp4_quantize_rne_kernel(const __grid_constant__ Sources<T> sources, int64_t n_vectors, uint8_t* all_codes,
                              uint8_t* all_scales, int* __restrict__ nonfinite_flag, __nv_bfloat16* all_operand) {
  constexpr int kPerThread = 16 / sizeof(T);             // elements in one 16-byte vector
  constexpr int kGroup = codec::kBlock / kPerThread;     // lanes sharing one block: 4 (fp32) or 2
  const Source<T> source(sources, n_vectors * kPerThread, all_codes, all_scales, all_operand);
  const T* __restrict__ x = source.x;
  uint8_t* __restrict__ codes = source.codes;
  uint8_t* __restrict__ scales = source.scales;
  __nv_bfloat16* __restrict__ operand = source.operand;
  const int64_t first_vector = static_cast<int64_t>(blockIdx.x) * kRneThreads * kRneUnroll + threadIdx.x;

  float values[kRneUnroll][kPerThread];
#pragma unroll
  for (int u = 0; u < kRneUnroll; ++u) {
    const int64_t v = first_vector + static_cast<int64_t>(u) * kRneThreads;
    if (v < n_vectors) {
      if constexpr (kVectorized) {
        device::load16_as_float(x + v * kPerThread, values[u]);
      } else {
        device::load_as_float(x + v * kPerThread, kPerThread, values[u]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) values[u][i] = 0.0f;
    }
  }

#pragma unroll
  for (int u = 0; u < kRneUnroll; ++u) {
    const int64_t v = first_vector + static_cast<int64_t>(u) * kRneThreads;
    // The block's largest magnitude, NaN or infinite when an element is not finite (one instruction an element).
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) amax = codec::max_abs_nan(amax, values[u][i]);
    // n_vectors is a multiple of kGroup and kGroup divides 32, so a group is wholly in range or wholly out;
    // every lane still takes part in the shuffles.
#pragma unroll
    for (int offset = 1; offset < kGroup; offset <<= 1)
      amax = codec::max_abs_nan(amax, __shfl_xor_sync(kFullMask, amax, offset));
    if (v >= n_vectors) continue;
    const bool nonfinite = !codec::finite_maximum(amax);

    uint32_t packed = 0;
    uint8_t scale_code = codec::kNonFiniteBlockScale;
    if (!nonfinite) {
      scale_code = codec::rne_scale_code(amax);
      const float scale = codec::e4m3_to_float(scale_code);
      if (scale != 0.0f) {
        const float reciprocal = codec::recip_rn(scale);
#pragma unroll
        for (int i = 0; i < kPerThread; ++i)
          packed |= codec::e2m1_encode(values[u][i], scale, reciprocal) << (4 * i);  // nibble i = element i
      }
    }
    if (codes != nullptr) {  // null only with an operand: the codes are not wanted
      uint8_t* out = codes + v * (kPerThread / 2);
      if constexpr (kVectorized && kPerThread == 4) {
        *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(packed);
      } else if constexpr (kVectorized && kPerThread == 8) {
        *reinterpret_cast<uint32_t*>(out) = packed;
      } else {
#pragma unroll
        for (int j = 0; j < kPerThread / 2; ++j) out[j] = static_cast<uint8_t>(packed >> (8 * j));
      }
    }
    if constexpr (kOperand)  // 4 (fp32 input) or 8 values: one 8- or 16-byte store when vectorized
      store_operand<kVectorized>(packed, kPerThread, scale_code, operand + v * kPerThread);
    if (v % kGroup == 0) {
      if (scales != nullptr) scales[v / kGroup] = scale_code;
      if (nonfinite && nonfinite_flag != nullptr) *nonfinite_flag = 1;
    }
  }
}

template <typename T, bool kVectorized, bool kOperand>
__global__ void __launch_bounds__(kSearchThreads)
    nvfp4_quantize_search_kernel(const __grid_constant__ Sources<T> sources, int64_t n_blocks, uint8_t* all_codes,
                                 uint8_t* all_scales, int* __restrict__ nonfinite_flag, __nv_bfloat16* all_operand) {
  const Source<T> source(sources, n_blocks * codec::kBlock, all_codes, all_scales, all_operand);
  const T* __restrict__ x = source.x;
  uint8_t* __restrict__ codes = source.codes;
  uint8_t* __restrict__ scales = source.scales;
  __nv_bfloat16* __restrict__ operand = source.operand;
  const int64_t block = static_cast<int64_t>(blockIdx.x) * kSearchThreads + threadIdx.x;
  if (block >= n_blocks) return;
  float values[codec::kBlock];
  const T* in = x + block * codec::kBlock;
  if constexpr (kVectorized) {
    constexpr int kPerLoad = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < codec::kBlock; i += kPerLoad) device::load16_as_float(in + i, values + i);
  } else {
    device::load_as_float(in, codec::kBlock, values);
  }
  uint8_t block_codes[codec::kBlock / 2];
  const uint8_t scale_code = codec::quantize_block(values, /*search=*/true, block_codes);
  if (codes != nullptr) {  // null only with an operand: the codes are not wanted
    uint8_t* out = codes + block * (codec::kBlock / 2);
    if constexpr (kVectorized) {
      uint2 word;
      word.x = block_codes[0] | (block_codes[1] << 8) | (block_codes[2] << 16) | (uint32_t(block_codes[3]) << 24);
      word.y = block_codes[4] | (block_codes[5] << 8) | (block_codes[6] << 16) | (uint32_t(block_codes[7]) << 24);
      *reinterpret_cast<uint2*>(out) = word;
    } else {
#pragma unroll
      for (int j = 0; j < codec::kBlock / 2; ++j) out[j] = block_codes[j];
    }
  }
  if (scales != nullptr) scales[block] = scale_code;
  if (scale_code == codec::kNonFiniteBlockScale && nonfinite_flag != nullptr) *nonfinite_flag = 1;
  if constexpr (kOperand) {
    uint64_t nibbles = 0;
#pragma unroll
    for (int j = 0; j < codec::kBlock / 2; ++j) nibbles |= static_cast<uint64_t>(block_codes[j]) << (8 * j);
    store_operand<kVectorized>(nibbles, codec::kBlock, scale_code, operand + block * codec::kBlock);
  }
}

template <typename T, bool kOperand>
cudaError_t launch_typed(const Sources<T>& sources, int count, int64_t n_elements, uint8_t* codes, uint8_t* scales,
                         bool search, int* nonfinite_flag, __nv_bfloat16* operand, cudaStream_t stream) {
  // The vectorized kernels load 16 bytes at a time and store 2, 4 or 8 code bytes (and 8 or 16 operand bytes) at once:
  // every input and the first outputs aligned (the g-th outputs are then too: n_elements is a multiple of 16).
  bool vectorized = device::is_aligned(codes, 8) && (!kOperand || device::is_aligned(operand, 16));
  for (int g = 0; g < count; ++g) vectorized = vectorized && device::is_aligned(sources.inputs[g], 16);
  if (search) {
    const int64_t n_blocks = n_elements / codec::kBlock;
    const dim3 grid(static_cast<unsigned>((n_blocks + kSearchThreads - 1) / kSearchThreads), static_cast<unsigned>(count));
    if (vectorized)
      nvfp4_quantize_search_kernel<T, true, kOperand><<<grid, kSearchThreads, 0, stream>>>(sources, n_blocks, codes,
                                                                                           scales, nonfinite_flag, operand);
    else
      nvfp4_quantize_search_kernel<T, false, kOperand><<<grid, kSearchThreads, 0, stream>>>(sources, n_blocks, codes,
                                                                                            scales, nonfinite_flag, operand);
  } else {
    const int64_t n_vectors = n_elements / (16 / sizeof(T));
    const int64_t per_cta = static_cast<int64_t>(kRneThreads) * kRneUnroll;
    const dim3 grid(static_cast<unsigned>((n_vectors + per_cta - 1) / per_cta), static_cast<unsigned>(count));
    if (vectorized)
      nvfp4_quantize_rne_kernel<T, true, kOperand><<<grid, kRneThreads, 0, stream>>>(sources, n_vectors, codes, scales,
                                                                                     nonfinite_flag, operand);
    else
      nvfp4_quantize_rne_kernel<T, false, kOperand><<<grid, kRneThreads, 0, stream>>>(sources, n_vectors, codes, scales,
                                                                                      nonfinite_flag, operand);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_sources(const void* const* inputs, int count, int64_t n_elements, uint8_t* codes, uint8_t* scales,
                           bool search, int* nonfinite_flag, void* operand, cudaStream_t stream) {
  Sources<T> sources{};
  for (int g = 0; g < count; ++g) sources.inputs[g] = static_cast<const T*>(inputs[g]);
  if (operand != nullptr)
    return launch_typed<T, true>(sources, count, n_elements, codes, scales, search, nonfinite_flag,
                                 static_cast<__nv_bfloat16*>(operand), stream);
  return launch_typed<T, false>(sources, count, n_elements, codes, scales, search, nonfinite_flag, nullptr, stream);
}

}  // namespace

int launch_nvfp4_quantize(const void* x, KernelDType x_type, int64_t rows, int64_t cols, uint8_t* codes,
                          uint8_t* scales, int search_mode, int* nonfinite_flag_device, void* stream) {
  return launch_nvfp4_quantize_with_operand(x, x_type, rows, cols, codes, scales, search_mode, nonfinite_flag_device,
                                            nullptr, stream);
}

int launch_nvfp4_quantize_with_operand(const void* x, KernelDType x_type, int64_t rows, int64_t cols, uint8_t* codes,
                                       uint8_t* scales, int search_mode, int* nonfinite_flag_device,
                                       void* bf16_operand, void* stream) {
  const void* inputs[1] = {x};
  return launch_nvfp4_quantize_batch(inputs, 1, x_type, rows, cols, codes, scales, search_mode, nonfinite_flag_device,
                                     bf16_operand, stream);
}

int launch_nvfp4_quantize_batch(const void* const* inputs, int count, KernelDType x_type, int64_t rows, int64_t cols,
                                uint8_t* codes, uint8_t* scales, int search_mode, int* nonfinite_flag_device,
                                void* bf16_operand, void* stream) {
  if (rows < 0 || cols < 0 || cols % codec::kBlock != 0 || !device::valid_dtype(x_type) ||
      (search_mode != 0 && search_mode != 1) || inputs == nullptr || count < 1 || count > kNvfp4QuantizeMaxBatch)
    return cudaErrorInvalidValue;
  const int64_t n_elements = rows * cols;
  if (n_elements == 0) return cudaSuccess;
  // Codes and scales may be left out (both null) when the operand is all that is wanted.
  for (int g = 0; g < count; ++g)
    if (inputs[g] == nullptr) return cudaErrorInvalidValue;
  if ((codes == nullptr) != (scales == nullptr) || (codes == nullptr && bf16_operand == nullptr))
    return cudaErrorInvalidValue;
  // The operand's stores take its element alignment.
  if (bf16_operand != nullptr && !device::is_aligned(bf16_operand, 2)) return cudaErrorInvalidValue;
  // The largest grid (search: one thread per block) must fit gridDim.x; it does for any tensor that fits in
  // device memory, but refuse rather than wrap.
  if ((n_elements / codec::kBlock + kSearchThreads - 1) / kSearchThreads > INT32_MAX) return cudaErrorInvalidValue;
  const bool search = search_mode == 1;
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  switch (x_type) {
    case KernelDType::f32:
      return launch_sources<float>(inputs, count, n_elements, codes, scales, search, nonfinite_flag_device,
                                   bf16_operand, cuda_stream);
    case KernelDType::bf16:
      return launch_sources<__nv_bfloat16>(inputs, count, n_elements, codes, scales, search, nonfinite_flag_device,
                                           bf16_operand, cuda_stream);
    case KernelDType::f16:
      return launch_sources<__half>(inputs, count, n_elements, codes, scales, search, nonfinite_flag_device,
                                    bf16_operand, cuda_stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qwen3::kernels
