// libtorch glue to the CUDA kernels (kernels/qwen3_kernels.h). Everything CUDA is behind one guard so that
// the CPU-only CI libtorch (Debian 1.13) never sees a CUDA header; the stubs below keep the link complete.
#include "nvfp4/nvfp4_cuda.h"

#include <ATen/ATen.h>

#include "qwen3/base/error.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

#if defined(QWEN3_WITH_CUDA_KERNELS) && defined(QWEN3_TORCH_HAS_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "qwen3_kernels.h"

namespace qwen3::nvfp4 {
namespace {

kernels::KernelDType kernel_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return kernels::KernelDType::f32;
    case at::kBFloat16: return kernels::KernelDType::bf16;
    case at::kHalf: return kernels::KernelDType::f16;
    default: throw Error(std::string("nvfp4 CUDA: unsupported dtype ") + c10::toString(dtype));
  }
}

void* current_stream(const at::Device& device) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(device.index()).stream());
}

void check_launch(int status, const char* what) {
  if (status != 0)
    throw Error(std::string("nvfp4 ") + what + " CUDA kernel failed: " +
                cudaGetErrorString(static_cast<cudaError_t>(status)));
}

// One int32 per device, raised by the quantize kernel, cleared by take_nonfinite_flag. Never freed: a static
// tensor destroyed after the CUDA context at exit would crash.
std::mutex flag_mutex;
at::Tensor nonfinite_flag(const at::Device& device) {
  static auto* flags = new std::map<int, at::Tensor>();
  const std::lock_guard<std::mutex> lock(flag_mutex);
  at::Tensor& flag = (*flags)[device.index()];
  if (!flag.defined()) flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
  return flag;
}

}  // namespace

void quantize_cuda(const at::Tensor& x, ScaleMode mode, bool check_finite, const at::Tensor& codes,
                   const at::Tensor& scales) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor flag = nonfinite_flag(x.device());
  check_launch(kernels::launch_nvfp4_quantize(x.data_ptr(), kernel_dtype(x.scalar_type()), x.size(0), x.size(1),
                                              codes.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>(),
                                              mode == ScaleMode::search ? 1 : 0, flag.data_ptr<int>(),
                                              current_stream(x.device())),
               "quantize");
  if (check_finite && take_nonfinite_flag(x.device())) {
    // Rare and fatal: the CPU codec finds and names the first non-finite element (it throws).
    const at::Tensor x_cpu = x.to(at::kCPU, at::kFloat).contiguous();
    quantize(x_cpu, mode);
    throw Error("nvfp4 quantize: non-finite value in the CUDA input");  // unreachable unless the paths disagree
  }
}

at::Tensor nonfinite_flag_of(const at::Device& device) {
  if (!device.is_cuda()) return at::Tensor();
  return nonfinite_flag(device);
}

bool take_nonfinite_flag(const at::Device& device) {
  if (!device.is_cuda()) return false;
  const c10::cuda::CUDAGuard device_guard(device);
  at::Tensor flag = nonfinite_flag(device);
  const bool raised = flag.item<int>() != 0;  // synchronizes with the current stream
  if (raised) flag.zero_();
  return raised;
}

at::Tensor take_nonfinite_flag_async(const at::Device& device) {
  if (!device.is_cuda()) return at::Tensor();
  const c10::cuda::CUDAGuard device_guard(device);
  at::Tensor flag = nonfinite_flag(device);
  at::Tensor value = flag.clone();
  flag.zero_();
  return value;
}

void quantize_with_operand_cuda(const at::Tensor& x, ScaleMode mode, const at::Tensor& codes, const at::Tensor& scales,
                                const at::Tensor& operand) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor flag = nonfinite_flag(x.device());
  check_launch(kernels::launch_nvfp4_quantize_with_operand(
                   x.data_ptr(), kernel_dtype(x.scalar_type()), x.size(0), x.size(1),
                   codes.defined() ? codes.data_ptr<uint8_t>() : nullptr,
                   scales.defined() ? scales.data_ptr<uint8_t>() : nullptr, mode == ScaleMode::search ? 1 : 0,
                   flag.data_ptr<int>(), operand.data_ptr(), current_stream(x.device())),
               "quantize");
}

void quantize_batch_with_operand_cuda(const std::vector<at::Tensor>& xs, ScaleMode mode, const at::Tensor& codes,
                                      const at::Tensor& scales, const at::Tensor& operands) {
  const at::Tensor& first = xs.front();
  const c10::cuda::CUDAGuard device_guard(first.device());
  at::Tensor flag = nonfinite_flag(first.device());
  const int64_t rows = first.size(0), cols = first.size(1);
  for (size_t start = 0; start < xs.size(); start += kernels::kNvfp4QuantizeMaxBatch) {
    const auto count = static_cast<int>(std::min<size_t>(kernels::kNvfp4QuantizeMaxBatch, xs.size() - start));
    std::vector<const void*> inputs;
    for (int g = 0; g < count; ++g) {
      const at::Tensor& x = xs[start + static_cast<size_t>(g)];
      if (!x.is_contiguous() || x.scalar_type() != first.scalar_type() || !x.sizes().equals(first.sizes()))
        throw Error("nvfp4 CUDA: a batch quantize needs contiguous inputs of one dtype and shape");
      inputs.push_back(x.data_ptr());
    }
    const auto g0 = static_cast<int64_t>(start);
    check_launch(kernels::launch_nvfp4_quantize_batch(
                     inputs.data(), count, kernel_dtype(first.scalar_type()), rows, cols,
                     codes.defined() ? codes[g0].data_ptr<uint8_t>() : nullptr,
                     scales.defined() ? scales[g0].data_ptr<uint8_t>() : nullptr, mode == ScaleMode::search ? 1 : 0,
                     flag.data_ptr<int>(), operands[g0].data_ptr(), current_stream(first.device())),
                 "batch quantize");
  }
}

at::Tensor dequantize_cuda(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard device_guard(codes.device());
  at::Tensor out = at::empty({codes.size(0), codes.size(1) * 2}, codes.options().dtype(dtype));
  check_launch(kernels::launch_nvfp4_dequantize(codes.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>(),
                                                out.size(0), out.size(1), out.data_ptr(), kernel_dtype(dtype),
                                                current_stream(codes.device())),
               "dequantize");
  return out;
}

namespace {

// One buffer per device and dtype, grown to the largest weight seen, never freed (see nonfinite_flag): a
// [rows, cols] view of it.
at::Tensor scratch_view(const at::Device& device, at::ScalarType dtype, int64_t rows, int64_t cols) {
  static auto* buffers = new std::map<std::pair<int, int>, at::Tensor>();
  static std::mutex buffers_mutex;
  at::Tensor buffer;
  {
    const std::lock_guard<std::mutex> lock(buffers_mutex);
    at::Tensor& held = (*buffers)[{device.index(), static_cast<int>(dtype)}];
    if (!held.defined() || held.numel() < rows * cols)
      held = at::empty({rows * cols}, at::TensorOptions().device(device).dtype(dtype));
    buffer = held;
  }
  return buffer.narrow(0, 0, rows * cols).view({rows, cols});
}

}  // namespace

at::Tensor scratch_operand_cuda(const at::Device& device, int64_t rows, int64_t cols) {
  const c10::cuda::CUDAGuard device_guard(device);
  return scratch_view(device, at::kBFloat16, rows, cols);
}

at::Tensor dequantize_into_scratch_cuda(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard device_guard(codes.device());
  const int64_t rows = codes.size(0), cols = codes.size(1) * 2;
  at::Tensor out = scratch_view(codes.device(), dtype, rows, cols);
  check_launch(kernels::launch_nvfp4_dequantize(codes.contiguous().data_ptr<uint8_t>(),
                                                scales.contiguous().data_ptr<uint8_t>(), rows, cols, out.data_ptr(),
                                                kernel_dtype(dtype), current_stream(codes.device())),
               "dequantize");
  return out;
}

// The matmul kernel needs compute capability 9.0 or newer; older devices take the dequantize + mm path.
bool matmul_cuda_supports(const at::Tensor& x) {
  if (!x.is_cuda() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf)) return false;
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.device().index()) == cudaSuccess &&
         major >= 9;
}

// A contiguous tensor whose data starts on an `alignment`-byte boundary (a slice of a larger tensor may not).
at::Tensor aligned_contiguous(const at::Tensor& t, uintptr_t alignment) {
  at::Tensor contiguous = t.contiguous();
  if (reinterpret_cast<uintptr_t>(contiguous.data_ptr()) % alignment != 0) contiguous = contiguous.clone();
  return contiguous;
}

at::Tensor matmul_cuda(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  // The kernel's vector loads need x 16-byte and codes 8-byte aligned.
  const at::Tensor x_contiguous = aligned_contiguous(x, 16);
  const at::Tensor codes_contiguous = aligned_contiguous(codes, 8);
  const at::Tensor scales_contiguous = scales.contiguous();
  const int64_t rows = x.size(0), inner = x.size(1), out_features = codes.size(0);
  at::Tensor y = at::empty({rows, out_features}, x.options());
  check_launch(kernels::launch_nvfp4_matmul(x_contiguous.data_ptr(), kernel_dtype(x.scalar_type()), rows, inner,
                                            codes_contiguous.data_ptr<uint8_t>(),
                                            scales_contiguous.data_ptr<uint8_t>(), out_features, y.data_ptr(),
                                            kernel_dtype(y.scalar_type()), current_stream(x.device())),
               "matmul");
  return y;
}

}  // namespace qwen3::nvfp4

#else  // no CUDA kernels or a CPU-only libtorch: no CUDA tensor exists here

namespace qwen3::nvfp4 {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("nvfp4: this build has no CUDA kernels (needs nvcc and a CUDA libtorch at configure time)");
}
}  // namespace

void quantize_cuda(const at::Tensor&, ScaleMode, bool, const at::Tensor&, const at::Tensor&) { no_cuda(); }
void quantize_with_operand_cuda(const at::Tensor&, ScaleMode, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  no_cuda();
}
void quantize_batch_with_operand_cuda(const std::vector<at::Tensor>&, ScaleMode, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&) {
  no_cuda();
}
at::Tensor scratch_operand_cuda(const at::Device&, int64_t, int64_t) { no_cuda(); }
at::Tensor dequantize_cuda(const at::Tensor&, const at::Tensor&, at::ScalarType) { no_cuda(); }
bool matmul_cuda_supports(const at::Tensor&) { return false; }
at::Tensor dequantize_into_scratch_cuda(const at::Tensor&, const at::Tensor&, at::ScalarType) { no_cuda(); }
at::Tensor matmul_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&) { no_cuda(); }
bool take_nonfinite_flag(const at::Device&) { return false; }
at::Tensor take_nonfinite_flag_async(const at::Device&) { return at::Tensor(); }
at::Tensor nonfinite_flag_of(const at::Device&) { return at::Tensor(); }

}  // namespace qwen3::nvfp4
#endif
