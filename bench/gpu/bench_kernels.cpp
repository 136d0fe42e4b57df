// GPU benchmarks of the kernels (Google Benchmark, cudaEvent timing, manual time):
//  - quantize: effective bandwidth (input bytes read + codes and scales written) against a device-to-device
//    cudaMemcpy of the input bytes on the same device (a copy moves 2x its size); quantize_operand: the same pass
//    also writing the bf16 product operand (or that alone), the training forward's form;
//  - dequantize: codes and scales to the bf16 operand, against the copy of its bytes;
//  - the NVFP4-weight product against cuBLAS bf16 (cublasGemmEx, fp32 compute: what torch::matmul runs) on the
//    Qwen3-4B projection shapes, M in {1, 4, 16, 64, 128, 256, 512, 1024, 2048} (M <= 4: the GEMV; the rows below which training and
//    generation take the kernel, kNvfp4KernelMaxRows, are set from where it stops beating cuBLAS): TFLOP/s of
//    both and the speedup.
//  - the fused AdamW step (every moment storage, fp32 and bf16 masters) on a 4096 x 2560 parameter holding a
//    trained model's values (weights of about 0.02, gradients of about 1e-3, moments and their scales from five
//    steps before the timing, as a run's state is): the bytes the update must move per second, as a fraction of
//    the copy;
//  - the fused activation kernels (RMSNorm forward/backward, RoPE, SwiGLU forward/backward) at Qwen3-4B
//    training shapes (2048 tokens), and the sliced loss's two passes over a [2048, 8192] slice of bf16 logits (the
//    default slice at 2048 rows): bytes moved per second as a fraction of the copy;
//  - a group's gradient clipping (one Qwen3-4B block's gradients, fp32 and bf16): bytes read per second as a
//    fraction of the copy;
//  - the sliced loss's three cuBLAS products on one slice: 2,047 rows at 8,192 and 8,196 columns, 2,048 at 8,192
//    (loss_slice/*).
// Weights rotate through enough copies to exceed the L2 cache, so small-M runs measure memory, not L2.
// Results go to docs/performance.md with the date and the device. Exits 0 with a message when there is no GPU.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "qwen3_kernels.h"

namespace {

using qwen3::kernels::KernelDType;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}
void check(int status, const char* what) { check(static_cast<cudaError_t>(status), what); }

struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) { check(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T = uint8_t>
  T* as() const { return static_cast<T*>(ptr); }
};

// Uniform values in [-scale, scale) from a fixed LCG: fast enough for 100 MB inputs, and reproducible.
std::vector<float> host_uniform(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t state = seed * 2654435761u + 1;
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(state >> 8) * 0x1p-23f - 1.0f);
  }
  return v;
}

std::vector<uint16_t> to_16bit(KernelDType type, const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = type == KernelDType::bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(values[i]))
                                        : __half_as_ushort(__float2half_rn(values[i]));
  return bits;
}

// Mean seconds per call of `launch` over enough back-to-back calls to fill ~5 ms (at least 3).
template <typename Launch>
double seconds_per_call(Launch&& launch) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  launch(0);  // warm-up (and cuBLAS heuristics)
  check(cudaEventRecord(start), "record");
  launch(1);
  check(cudaEventRecord(stop), "record");
  check(cudaEventSynchronize(stop), "sync");
  float first_ms = 0.0f;
  check(cudaEventElapsedTime(&first_ms, start, stop), "elapsed");
  const int calls = std::clamp(static_cast<int>(5.0 / std::max(first_ms, 1e-3f)), 3, 2000);
  check(cudaEventRecord(start), "record");
  for (int i = 0; i < calls; ++i) launch(i);
  check(cudaEventRecord(stop), "record");
  check(cudaEventSynchronize(stop), "sync");
  float total_ms = 0.0f;
  check(cudaEventElapsedTime(&total_ms, start, stop), "elapsed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return total_ms * 1e-3 / calls;
}

size_t l2_bytes() {
  int device = 0, bytes = 0;
  check(cudaGetDevice(&device), "device");
  check(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device), "L2 size");
  return static_cast<size_t>(bytes);
}

// How many copies of a `bytes`-sized operand make a rotation 3x larger than L2.
int rotation_copies(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((3 * l2_bytes() + bytes - 1) / bytes, 1, 64));
}

// operand: 0 codes and scales; 1 those and the bf16 operand (the training forward's one pass); 2 the operand alone
// (a checkpointed block's forward and recompute).
void BM_Quantize(benchmark::State& state, KernelDType type, int mode, int64_t rows, int64_t cols, int operand = 0) {
  const int64_t n = rows * cols;
  const size_t in_bytes = n * (type == KernelDType::f32 ? 4 : 2);
  const size_t out_bytes = (operand == 2 ? 0 : n / 2 + n / 16) + (operand > 0 ? n * 2 : 0);
  DeviceMemory x(in_bytes), copy(in_bytes), codes(n / 2), scales(n / 16), flag(sizeof(int)), bf16_operand(n * 2);
  const std::vector<float> values = host_uniform(n, 0.05f, 3);
  if (type == KernelDType::f32) {
    check(cudaMemcpy(x.ptr, values.data(), in_bytes, cudaMemcpyHostToDevice), "upload");
  } else {
    const std::vector<uint16_t> bits = to_16bit(type, values);
    check(cudaMemcpy(x.ptr, bits.data(), in_bytes, cudaMemcpyHostToDevice), "upload");
  }
  check(cudaMemset(flag.ptr, 0, sizeof(int)), "memset");
  double quantize_s = 0.0, copy_s = 0.0;
  for (auto _ : state) {
    quantize_s = seconds_per_call([&](int) {
      check(qwen3::kernels::launch_nvfp4_quantize_with_operand(
                x.ptr, type, rows, cols, operand == 2 ? nullptr : codes.as(), operand == 2 ? nullptr : scales.as(),
                mode, flag.as<int>(), operand > 0 ? bf16_operand.ptr : nullptr, nullptr),
            "quantize");
    });
    copy_s = seconds_per_call([&](int) {
      check(cudaMemcpyAsync(copy.ptr, x.ptr, in_bytes, cudaMemcpyDeviceToDevice), "copy");
    });
    state.SetIterationTime(quantize_s);
  }
  const double quantize_rate = (in_bytes + out_bytes) / quantize_s, copy_rate = 2.0 * in_bytes / copy_s;
  state.counters["GB/s"] = quantize_rate * 1e-9;
  state.counters["copy_GB/s"] = copy_rate * 1e-9;
  state.counters["of_copy"] = quantize_rate / copy_rate;
}

// Codes and scales to bf16 (the product's operand from 256 rows on, and the backward's without checkpointing):
// bytes read and written per second against the copy of the output's bytes.
void BM_Dequantize(benchmark::State& state, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  DeviceMemory w(n * 4), codes(n / 2), scales(n / 16), out(n * 2), copy(n * 2), flag(sizeof(int));
  const std::vector<float> values = host_uniform(n, 0.05f, 4);
  check(cudaMemcpy(w.ptr, values.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  check(qwen3::kernels::launch_nvfp4_quantize(w.ptr, KernelDType::f32, rows, cols, codes.as(), scales.as(), 0,
                                              flag.as<int>(), nullptr),
        "quantize");
  double dequantize_s = 0.0, copy_s = 0.0;
  for (auto _ : state) {
    dequantize_s = seconds_per_call([&](int) {
      check(qwen3::kernels::launch_nvfp4_dequantize(codes.as(), scales.as(), rows, cols, out.ptr, KernelDType::bf16,
                                                    nullptr),
            "dequantize");
    });
    copy_s = seconds_per_call([&](int) { check(cudaMemcpyAsync(copy.ptr, out.ptr, n * 2, cudaMemcpyDeviceToDevice), "copy"); });
    state.SetIterationTime(dequantize_s);
  }
  const double rate = (n / 2 + n / 16 + n * 2) / dequantize_s, copy_rate = 2.0 * n * 2 / copy_s;
  state.counters["GB/s"] = rate * 1e-9;
  state.counters["copy_GB/s"] = copy_rate * 1e-9;
  state.counters["of_copy"] = rate / copy_rate;
}

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      std::exit(1);
    }
    return h;
  }();
  return handle;
}

// One cuBLAS product of bf16 operands with fp32 accumulation (what torch::matmul and aten::mm.dtype run),
// column-major as cuBLAS takes it; the output bf16 or fp32. Exits on a cuBLAS error.
void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
               const void* b, int64_t ldb, void* c, cudaDataType_t c_type, int64_t ldc) {
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublasGemmEx(cublas(), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
                   CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF, static_cast<int>(ldb), &beta, c, c_type,
                   static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(status));
    std::exit(1);
  }
}

void BM_Matmul(benchmark::State& state, int64_t M, int64_t N, int64_t K) {
  const size_t code_bytes = N * K / 2, scale_bytes = N * K / 16, dense_bytes = N * K * 2;
  const int nvfp4_copies = rotation_copies(code_bytes + scale_bytes), dense_copies = rotation_copies(dense_bytes);
  DeviceMemory x(M * K * 2), y(M * N * 2), w_fp32(N * K * 4), flag(sizeof(int));
  DeviceMemory codes(code_bytes * nvfp4_copies), scales(scale_bytes * nvfp4_copies), dense(dense_bytes * dense_copies);
  DeviceMemory scratch(dense_bytes);  // the one buffer the dequantize-then-cuBLAS path reuses
  {
    const std::vector<float> w = host_uniform(N * K, 0.03f, 5);
    check(cudaMemcpy(w_fp32.ptr, w.data(), N * K * 4, cudaMemcpyHostToDevice), "upload W");
    const std::vector<uint16_t> xb = to_16bit(KernelDType::bf16, host_uniform(M * K, 1.0f, 6));
    check(cudaMemcpy(x.ptr, xb.data(), M * K * 2, cudaMemcpyHostToDevice), "upload X");
  }
  for (int c = 0; c < nvfp4_copies; ++c)
    check(qwen3::kernels::launch_nvfp4_quantize(w_fp32.ptr, KernelDType::f32, N, K, codes.as() + c * code_bytes,
                                                scales.as() + c * scale_bytes, 0, flag.as<int>(), nullptr),
          "quantize W");
  for (int c = 0; c < dense_copies; ++c)  // cuBLAS gets exactly deq(W), in bf16
    check(qwen3::kernels::launch_nvfp4_dequantize(codes.as(), scales.as(), N, K, dense.as() + c * dense_bytes,
                                                  KernelDType::bf16, nullptr),
          "dequantize W");
  check(cudaDeviceSynchronize(), "setup");

  double ours_s = 0.0, cublas_s = 0.0, path_s = 0.0;
  for (auto _ : state) {
    ours_s = seconds_per_call([&](int i) {
      const int c = i % nvfp4_copies;
      check(qwen3::kernels::launch_nvfp4_matmul(x.ptr, KernelDType::bf16, M, K, codes.as() + c * code_bytes,
                                                scales.as() + c * scale_bytes, N, y.ptr, KernelDType::bf16, nullptr),
            "nvfp4 matmul");
    });
    cublas_s = seconds_per_call([&](int i) {
      const int c = i % dense_copies;
      // Row-major Y[M,N] = X[M,K] · Wᵀ is column-major Yᵀ[N,M] = W[K,N]ᵀ-as-stored · Xᵀ: op(A) = T on W.
      gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, dense.as() + c * dense_bytes, K, x.ptr, K, y.ptr, CUDA_R_16BF, N);
    });
    // What the kernel replaces below kNvfp4KernelMaxRows (nvfp4_linear.cpp): deq(W) into the scratch, then cuBLAS.
    path_s = seconds_per_call([&](int i) {
      const int c = i % nvfp4_copies;
      check(qwen3::kernels::launch_nvfp4_dequantize(codes.as() + c * code_bytes, scales.as() + c * scale_bytes, N, K,
                                                    scratch.as(), KernelDType::bf16, nullptr),
            "dequantize W");
      gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, scratch.as(), K, x.ptr, K, y.ptr, CUDA_R_16BF, N);
    });
    state.SetIterationTime(ours_s);
  }
  const double flops = 2.0 * M * N * K;
  state.counters["TFLOP/s"] = flops / ours_s * 1e-12;
  state.counters["cublas_TFLOP/s"] = flops / cublas_s * 1e-12;
  state.counters["speedup"] = cublas_s / ours_s;
  state.counters["weight_GB/s"] = (code_bytes + scale_bytes) / ours_s * 1e-9;
  state.counters["us"] = ours_s * 1e6;
  state.counters["cublas_us"] = cublas_s * 1e6;
  // Against the path the kernel stands in for (dequantize, then cuBLAS): > 1 where the kernel should run.
  state.counters["path_us"] = path_s * 1e6;
  state.counters["speedup_vs_path"] = path_s / ours_s;
}

// The sliced loss's three products on one [rows, V] slice of Qwen3's head (H = 2560) with cuBLAS as at::matmul and
// aten::mm.dtype call it: the logits (bf16 out), the input's gradient and the head's (fp32 out from bf16
// operands). kind 0, 1, 2. The third GPU round's packed 2048-token batch (2,047 rows, then 8,196-column slices)
// ran all three on cutlass_80_..._align2 kernels, a 512 x 4 batch (2,044 rows, 8,208 columns) on Hopper ones;
// loss_slice_width (lm_loss.h) makes slices a multiple of 128 columns on the reading that the width, the logits'
// leading dimension, decides. These rows say it without the trainer around it: 2,047 rows at 8,192 and at 8,196
// columns, 2,048 rows at 8,192.
void BM_LossSliceProduct(benchmark::State& state, int kind, int64_t rows, int64_t V) {
  const int64_t H = 2560;
  DeviceMemory hidden(rows * H * 2), weight(V * H * 2), logits(rows * V * 2), out(std::max(rows, V) * H * 4);
  {
    const std::vector<uint16_t> h = to_16bit(KernelDType::bf16, host_uniform(rows * H, 1.0f, 21));
    const std::vector<uint16_t> w = to_16bit(KernelDType::bf16, host_uniform(V * H, 0.03f, 22));
    const std::vector<uint16_t> l = to_16bit(KernelDType::bf16, host_uniform(rows * V, 1e-4f, 23));
    check(cudaMemcpy(hidden.ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload hidden");
    check(cudaMemcpy(weight.ptr, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "upload weight");
    check(cudaMemcpy(logits.ptr, l.data(), l.size() * 2, cudaMemcpyHostToDevice), "upload logits");
  }
  double s = 0.0;
  for (auto _ : state) {
    s = seconds_per_call([&](int) {
      // Row-major products as column-major ones with the operands' roles swapped.
      if (kind == 0)  // logits[rows, V] = hidden[rows, H] · W[V, H]ᵀ
        gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, V, rows, H, weight.ptr, H, hidden.ptr, H, logits.ptr, CUDA_R_16BF, V);
      else if (kind == 1)  // dX[rows, H] (fp32) = d[rows, V] · W[V, H]
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, H, rows, V, weight.ptr, H, logits.ptr, V, out.ptr, CUDA_R_32F, H);
      else  // dW[V, H] (fp32) = d[rows, V]ᵀ · hidden[rows, H]
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, H, V, rows, hidden.ptr, H, logits.ptr, V, out.ptr, CUDA_R_32F, H);
    });
    state.SetIterationTime(s);
  }
  state.counters["TFLOP/s"] = 2.0 * rows * V * H / s * 1e-12;
  state.counters["us"] = s * 1e6;
}

const char* type_name(KernelDType type) { return type == KernelDType::f32 ? "f32" : type == KernelDType::bf16 ? "bf16" : "f16"; }

}  // namespace

// ---- The fused AdamW step -------------------------------------------------------------------------------------

// Bytes per parameter the update must move (read + write): gradient, master, both moments and their scales.
double adamw_bytes_per_param(qwen3::kernels::adamw::Moments moments, bool bf16_master) {
  const double master = bf16_master ? 2 : 4, grad = master;
  const double state[] = {8, 4, 2.125, 1.128};
  return grad + 2 * master + 2 * state[static_cast<int>(moments)];
}

// operand: --keep-weight-operands always's write of the stepped master's bf16 operand (rne) in the same pass, 2
// bytes a parameter more.
void BM_AdamWStep(benchmark::State& state, qwen3::kernels::adamw::Moments moments, bool bf16_master, bool operand) {
  namespace ka = qwen3::kernels::adamw;
  const int64_t rows = 4096, cols = 2560, n = rows * cols;
  const int64_t block = moments == ka::Moments::int8 ? ka::kInt8Block : (moments == ka::Moments::nvfp4 ? ka::kNvfp4Block : 1);
  const size_t elem = bf16_master ? 2 : 4;
  const double state_bytes[] = {4, 2, 1, 0.5};
  const size_t state_size = static_cast<size_t>(n * state_bytes[static_cast<int>(moments)]) + 64;
  DeviceMemory master(n * elem), grad(n * elem), m(state_size), v(state_size), ms(n / block * 4 + 64),
      vs(n / block * 4 + 64), mr(rows * 4), vr(rows * 4), copy_in(n * elem), copy_out(n * elem);
  // A trained model's values: weights ~0.02, gradients ~1e-3 (an all-equal gradient would make every block's
  // scale the same and the compressed moments' rounding trivial); moments start at zero, as a run's do, and hold
  // five steps' worth before the timing.
  const auto upload = [&](DeviceMemory& to, float scale, uint32_t seed) {
    const std::vector<float> values = host_uniform(n, scale, seed);
    if (bf16_master) {
      const std::vector<uint16_t> bits = to_16bit(KernelDType::bf16, values);
      check(cudaMemcpy(to.ptr, bits.data(), n * 2, cudaMemcpyHostToDevice), "upload");
    } else {
      check(cudaMemcpy(to.ptr, values.data(), n * 4, cudaMemcpyHostToDevice), "upload");
    }
  };
  upload(master, 0.02f, 11);
  upload(grad, 1e-3f, 12);
  for (DeviceMemory* state_buffer : {&m, &v}) check(cudaMemset(state_buffer->ptr, 0, state_size), "memset");
  for (DeviceMemory* scale_buffer : {&ms, &vs}) check(cudaMemset(scale_buffer->ptr, 0, n / block * 4 + 64), "memset");
  for (DeviceMemory* row_buffer : {&mr, &vr}) check(cudaMemset(row_buffer->ptr, 0, rows * 4), "memset");
  ka::ParamView p{};
  p.master = master.ptr, p.master_bf16 = bf16_master, p.grad = grad.ptr, p.grad_bf16 = bf16_master;
  p.exp_avg = m.ptr, p.exp_avg_sq = v.ptr, p.exp_avg_scale = ms.ptr, p.exp_avg_sq_scale = vs.ptr;
  p.exp_avg_row_scale = mr.as<float>(), p.exp_avg_sq_row_scale = vr.as<float>();
  p.rows = rows, p.cols = cols, p.stored_cols = cols, p.moments = moments;
  DeviceMemory operand_buffer(operand ? n * 2 : 16);
  if (operand) p.operand = operand_buffer.as<uint16_t>();
  ka::StepScalars sc{};
  sc.beta1 = 0.9f, sc.one_minus_beta1 = 0.1f, sc.beta2 = 0.999f, sc.one_minus_beta2 = 0.001f;
  ka::set_bias_correction2(sc, 0.1f);
  sc.eps = 1e-8f, sc.neg_step_size = -1e-5f, sc.decay_factor = 1.0f, sc.grad_scale = 1.0f;
  for (int step = 0; step < 5; ++step) check(qwen3::kernels::launch_adamw_step(p, sc, nullptr), "adamw warm-up");
  check(cudaDeviceSynchronize(), "warm-up");
  double step_s = 0, copy_s = 0;
  for (auto _ : state) {
    step_s = seconds_per_call([&](int) { check(qwen3::kernels::launch_adamw_step(p, sc, nullptr), "adamw"); });
    copy_s = seconds_per_call([&](int) {
      check(cudaMemcpyAsync(copy_out.ptr, copy_in.ptr, n * elem, cudaMemcpyDeviceToDevice), "copy");
    });
    state.SetIterationTime(step_s);
  }
  const double bytes_per_param = adamw_bytes_per_param(moments, bf16_master) + (operand ? 2 : 0);
  const double rate = bytes_per_param * n / step_s, copy_rate = 2.0 * n * elem / copy_s;
  state.counters["bytes_per_param"] = bytes_per_param;
  state.counters["GB/s"] = rate * 1e-9;
  state.counters["of_copy"] = rate / copy_rate;
  state.counters["ms_per_Mparam"] = step_s * 1e3 / (n * 1e-6);
}

// ---- A group's gradient clipping ------------------------------------------------------------------------------

// One Qwen3-4B block's gradients (q, k, v, o, gate, up, down and the four norms) in fp32 or bf16: the group the
// in-backward update clips at once. One launch (and a 4-byte memset) reads every gradient byte once; against the
// copy of the same bytes.
void BM_GradClip(benchmark::State& state, KernelDType type) {
  const int64_t sizes[] = {4096 * 2560, 1024 * 2560, 1024 * 2560, 2560 * 4096, 9728 * 2560, 9728 * 2560,
                           2560 * 9728, 2560,        2560,        128,         128};
  const size_t elem = type == KernelDType::bf16 ? 2 : 4;
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  DeviceMemory grads(total * elem), copy_out(total * elem), sum(8), factors(64);
  check(cudaMemset(grads.ptr, 0x3a, total * elem), "memset");  // small finite values in either dtype
  std::vector<qwen3::kernels::GradClipTensor> tensors;
  int64_t at = 0;
  for (int64_t n : sizes) {
    tensors.push_back({grads.as<uint8_t>() + at * elem, n, type});
    at += n;
  }
  const int count = static_cast<int>(tensors.size());
  DeviceMemory workspace(qwen3::kernels::grad_clip_workspace_doubles(tensors.data(), count) * 8);
  qwen3::kernels::GradClipGroup group;
  group.max_norm = 1.0, group.trainable = 4.0e9, group.counted_elements = static_cast<double>(total);
  group.sum = sum.as<double>(), group.factors = factors.as<float>();
  double clip_s = 0, copy_s = 0;
  for (auto _ : state) {
    clip_s = seconds_per_call([&](int) {
      check(qwen3::kernels::launch_grad_clip(tensors.data(), count, group, workspace.as<double>(), nullptr), "grad clip");
    });
    copy_s = seconds_per_call([&](int) {
      check(cudaMemcpyAsync(copy_out.ptr, grads.ptr, total * elem, cudaMemcpyDeviceToDevice), "copy");
    });
    state.SetIterationTime(clip_s);
  }
  const double rate = static_cast<double>(total * elem) / clip_s, copy_rate = 2.0 * total * elem / copy_s;
  state.counters["GB/s"] = rate * 1e-9;
  state.counters["of_copy"] = rate / copy_rate;
}

// ---- The fused activation kernels -------------------------------------------------------------------------------

// kind: 0 rmsnorm forward, 1 rmsnorm backward, 2 rope, 3 swiglu forward, 4 swiglu backward, 5 the loss slice's
// statistics, 6 its gradient, 7 and 8 the q norm's forward and backward (2,048 tokens x 32 heads rows of 128: its
// weight gradient sums 2,048 chunks of partials), 9 and 10 the q norm with RoPE as one pass (forward, backward),
// 11 and 12 the same as the two kernels it replaces (the norm then RoPE; RoPE's backward then the norm's: the bytes
// of 9 and 10 over their time, so the of_copy ratios compare the two forms); bf16 activations.
void BM_FusedOp(benchmark::State& state, int kind) {
  const int64_t tokens = 2048, hidden = 2560, inter = 9728, heads = 32, head_dim = 128, slice = 8192;
  const bool q_norm = kind >= 7;  // 7 to 12: the q norm's shape
  const int64_t norm_rows = q_norm ? tokens * heads : tokens, norm_cols = q_norm ? head_dim : hidden;
  const int64_t n = kind <= 1 || q_norm ? norm_rows * norm_cols
                                        : (kind == 2 ? tokens * heads * head_dim : (kind <= 4 ? tokens * inter : tokens * slice));
  DeviceMemory a(n * 2), b(n * 2), c(n * 2), d(n * 2), e(n * 2), w(hidden * 4), rstd(tokens * heads * 4), dw(hidden * 4),
      work(qwen3::kernels::rmsnorm_backward_workspace_floats(norm_rows, norm_cols) * 4), tables(tokens * head_dim * 4 * 2);
  check(cudaMemset(a.ptr, 0x3c, n * 2), "memset");
  check(cudaMemset(b.ptr, 0x3c, n * 2), "memset");
  check(cudaMemset(c.ptr, 0x3c, n * 2), "memset");
  check(cudaMemset(w.ptr, 0, hidden * 4), "memset");
  check(cudaMemset(tables.ptr, 0, tokens * head_dim * 8), "memset");
  // The loss's per-row arrays: targets (zeros: column 0 of the slice), running max/sum, target logit, lse, scale.
  DeviceMemory targets(tokens * 8), row_floats(tokens * 4 * 5);
  check(cudaMemset(targets.ptr, 0, tokens * 8), "memset");
  check(cudaMemset(row_floats.ptr, 0, tokens * 4 * 5), "memset");
  float* rows = row_floats.as<float>();
  const auto* target_ids = static_cast<const int64_t*>(targets.ptr);
  const auto bf16 = KernelDType::bf16;
  const char* names[] = {"rmsnorm_forward", "rmsnorm_backward", "rope",         "swiglu_forward",
                         "swiglu_backward", "loss_statistics",  "loss_gradient", "q_norm_forward", "q_norm_backward",
                         "q_norm_rope_forward", "q_norm_rope_backward", "q_norm_then_rope", "rope_then_q_norm_backward"};
  // Bytes each must move: reads and writes of activations (2 bytes an element).
  const double moved[] = {2.0 * n * 2, 4.0 * n * 2, 2.0 * n * 2, 3.0 * n * 2, 5.0 * n * 2,
                          1.0 * n * 2, 2.0 * n * 2, 2.0 * n * 2, 4.0 * n * 2,
                          2.0 * n * 2, 3.0 * n * 2, 2.0 * n * 2, 3.0 * n * 2};
  const float* cos = tables.as<float>();
  const float* sin = tables.as<float>() + tokens * head_dim;
  double op_s = 0, copy_s = 0;
  for (auto _ : state) {
    op_s = seconds_per_call([&](int) {
      switch (kind) {
        case 0: case 7: check(qwen3::kernels::launch_rmsnorm_forward(a.ptr, bf16, w.ptr, KernelDType::f32, norm_rows, norm_cols, 1e-6f, b.ptr, rstd.as<float>(), nullptr), "rmsnorm"); break;
        case 1: case 8: check(qwen3::kernels::launch_rmsnorm_backward(c.ptr, a.ptr, bf16, w.ptr, KernelDType::f32, rstd.as<float>(), norm_rows, norm_cols, d.ptr, dw.as<float>(), work.as<float>(), nullptr), "rmsnorm backward"); break;
        case 2: check(qwen3::kernels::launch_rope(a.ptr, b.ptr, bf16, 1, tokens, heads, head_dim, tables.as<float>(), tables.as<float>() + tokens * head_dim, tokens, 0, nullptr), "rope"); break;
        case 3: check(qwen3::kernels::launch_swiglu_forward(a.ptr, b.ptr, d.ptr, bf16, n, nullptr), "swiglu"); break;
        case 5: check(qwen3::kernels::launch_loss_slice_stats(a.ptr, bf16, tokens, slice, 0, target_ids, rows, rows + tokens, rows + 2 * tokens, nullptr), "loss statistics"); break;
        case 6: check(qwen3::kernels::launch_loss_slice_gradient(a.ptr, b.ptr, bf16, tokens, slice, 0, target_ids, rows + 3 * tokens, rows + 4 * tokens, nullptr), "loss gradient"); break;
        case 9: check(qwen3::kernels::launch_head_norm_rope_forward(a.ptr, bf16, w.ptr, KernelDType::f32, 1, tokens, heads, head_dim, 1e-6f, cos, sin, tokens, b.ptr, rstd.as<float>(), nullptr), "q norm rope"); break;
        case 10: check(qwen3::kernels::launch_head_norm_rope_backward(c.ptr, a.ptr, bf16, w.ptr, KernelDType::f32, rstd.as<float>(), 1, tokens, heads, head_dim, cos, sin, tokens, d.ptr, dw.as<float>(), work.as<float>(), nullptr), "q norm rope backward"); break;
        case 11:
          check(qwen3::kernels::launch_rmsnorm_forward(a.ptr, bf16, w.ptr, KernelDType::f32, norm_rows, norm_cols, 1e-6f, e.ptr, rstd.as<float>(), nullptr), "rmsnorm");
          check(qwen3::kernels::launch_rope(e.ptr, b.ptr, bf16, 1, tokens, heads, head_dim, cos, sin, tokens, 0, nullptr), "rope");
          break;
        case 12:
          check(qwen3::kernels::launch_rope(c.ptr, e.ptr, bf16, 1, tokens, heads, head_dim, cos, sin, tokens, 1, nullptr), "rope backward");
          check(qwen3::kernels::launch_rmsnorm_backward(e.ptr, a.ptr, bf16, w.ptr, KernelDType::f32, rstd.as<float>(), norm_rows, norm_cols, d.ptr, dw.as<float>(), work.as<float>(), nullptr), "rmsnorm backward");
          break;
        default: check(qwen3::kernels::launch_swiglu_backward(c.ptr, a.ptr, b.ptr, d.ptr, e.ptr, bf16, n, nullptr), "swiglu backward"); break;
      }
    });
    copy_s = seconds_per_call([&](int) { check(cudaMemcpyAsync(e.ptr, a.ptr, n * 2, cudaMemcpyDeviceToDevice), "copy"); });
    state.SetIterationTime(op_s);
  }
  const double rate = moved[kind] / op_s, copy_rate = 2.0 * n * 2 / copy_s;
  state.SetLabel(names[kind]);
  state.counters["GB/s"] = rate * 1e-9;
  state.counters["of_copy"] = rate / copy_rate;
}

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (qwen3::kernels::cuda_device_count() == 0) {
    std::printf("bench_kernels: no CUDA device; nothing measured\n");
    return 0;
  }
  const int64_t shapes[][2] = {{4096, 2560}, {1024, 2560}, {2560, 4096}, {9728, 2560}, {2560, 9728}};
  for (KernelDType type : {KernelDType::f32, KernelDType::bf16})
    for (int mode : {0, 1})
      for (const auto& nk : shapes) {
        const std::string name = std::string("quantize/") + type_name(type) + (mode ? "/search/" : "/rne/") +
                                 std::to_string(nk[0]) + "x" + std::to_string(nk[1]);
        benchmark::RegisterBenchmark(name.c_str(), BM_Quantize, type, mode, nk[0], nk[1], 0)
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMicrosecond);
      }
  // The training forward's pass over a trained weight's master (fp32 or bf16), rne: codes and operand, or the
  // operand alone; against the plain quantize rows above.
  for (KernelDType type : {KernelDType::f32, KernelDType::bf16})
    for (int operand : {1, 2})
      for (const auto& nk : shapes) {
        const std::string name = std::string("quantize_operand/") + type_name(type) +
                                 (operand == 1 ? "/codes_and_operand/" : "/operand_only/") + std::to_string(nk[0]) +
                                 "x" + std::to_string(nk[1]);
        benchmark::RegisterBenchmark(name.c_str(), BM_Quantize, type, 0, nk[0], nk[1], operand)
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMicrosecond);
      }
  for (const auto& nk : shapes)
    benchmark::RegisterBenchmark(("dequantize/bf16/" + std::to_string(nk[0]) + "x" + std::to_string(nk[1])).c_str(),
                                 BM_Dequantize, nk[0], nk[1])
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMicrosecond);
  for (int64_t M : {1, 4, 16, 64, 128, 256, 512, 1024, 2048})
    for (const auto& nk : shapes) {
      const std::string name = "matmul_bf16/M" + std::to_string(M) + "/N" + std::to_string(nk[0]) + "/K" +
                               std::to_string(nk[1]);
      benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, M, nk[0], nk[1])
          ->UseManualTime()
          ->Iterations(3)
          ->Unit(benchmark::kMicrosecond);
    }
  for (int kind = 0; kind < 3; ++kind)
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{2047, 8192}, {2047, 8196}, {2048, 8192}}) {
      const char* names[] = {"logits", "dx_f32", "dw_f32"};
      const std::string name =
          "loss_slice/" + std::string(names[kind]) + "/rows" + std::to_string(rows) + "_cols" + std::to_string(cols);
      benchmark::RegisterBenchmark(name.c_str(), BM_LossSliceProduct, kind, rows, cols)
          ->UseManualTime()
          ->Iterations(3)
          ->Unit(benchmark::kMicrosecond);
    }
  namespace ka = qwen3::kernels::adamw;
  const char* moment_names[] = {"f32", "bf16", "int8", "nvfp4"};
  for (ka::Moments moments : {ka::Moments::f32, ka::Moments::bf16, ka::Moments::int8, ka::Moments::nvfp4})
    for (bool bf16_master : {false, true})
      for (bool operand : {false, true}) {
        const std::string name = std::string("adamw/") + moment_names[static_cast<int>(moments)] + "_moments/" +
                                 (bf16_master ? "bf16" : "fp32") + "_master" + (operand ? "_operand" : "");
        benchmark::RegisterBenchmark(name.c_str(), BM_AdamWStep, moments, bf16_master, operand)
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMicrosecond);
      }
  for (KernelDType type : {KernelDType::f32, KernelDType::bf16})
    benchmark::RegisterBenchmark((std::string("grad_clip/qwen3_4b_block/") + type_name(type)).c_str(), BM_GradClip, type)
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMicrosecond);
  for (int kind = 0; kind < 13; ++kind)
    benchmark::RegisterBenchmark(("fused/" + std::to_string(kind)).c_str(), BM_FusedOp, kind)
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMicrosecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
