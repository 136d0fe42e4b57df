// Launchers of the CUDA kernels: plain C++ over raw device pointers, sizes and a stream, so nothing in
// kernels/ depends on libtorch. Every launcher returns a cudaError_t-compatible int (0 = success); it checks
// its arguments, enqueues on `stream` (a cudaStream_t passed as void*, nullptr = the legacy default stream)
// and never synchronizes. NVFP4 layout and rules: docs/nvfp4.md; design: kernels/nvfp4_kernels.md.
#pragma once
#include <cstdint>

#include "adamw_update.cuh"

namespace qwen3::kernels {

// Number of CUDA devices usable by this process; 0 when there is no driver or no device (never fails).
int cuda_device_count();

enum class KernelDType : int { f32 = 0, bf16 = 1, f16 = 2 };

// x [rows, cols] (f32/bf16/f16, row-major, cols % 16 == 0) -> codes [rows, cols/2] (element 2j in the low
// nibble) and E4M3 scales [rows, cols/16], byte-identical to qwen3::nvfp4::quantize_rows_cpu on the fp32 view
// of x. search_mode: 0 = rne (s = e4m3_rne(amax/6)), 1 = search (s and its two neighbours either side).
// nonfinite_flag_device (nullable, device memory): set to 1 if any input is inf/NaN (never cleared here); such
// a block gets scale 0x7F (NaN) and zero codes. Any pointer alignment is accepted (16-byte-aligned x and
// 4-byte-aligned codes take the vectorized path).
int launch_nvfp4_quantize(const void* x, KernelDType x_type, int64_t rows, int64_t cols, uint8_t* codes,
                          uint8_t* scales, int search_mode, int* nonfinite_flag_device, void* stream);

// The same, also writing deq(codes, scales) as bf16 [rows, cols] into bf16_operand (nullable; 2-byte aligned, 16
// for the vector path): byte for byte launch_nvfp4_dequantize's bf16 output, from the one pass (the training
// forward's product operand without reading the codes back). With an operand, codes and scales may both be null:
// only the operand (and the non-finite flag) is written.
int launch_nvfp4_quantize_with_operand(const void* x, KernelDType x_type, int64_t rows, int64_t cols, uint8_t* codes,
                                       uint8_t* scales, int search_mode, int* nonfinite_flag_device,
                                       void* bf16_operand, void* stream);

// The same for `count` inputs of one dtype and shape in one launch (1 <= count <= kNvfp4QuantizeMaxBatch): input
// g's codes, scales and operand are the g-th of stacked outputs [count, rows, cols/2], [count, rows, cols/16] and
// [count, rows, cols] (the experts of a mixture-of-experts block, quantized for one grouped product).
constexpr int kNvfp4QuantizeMaxBatch = 128;
int launch_nvfp4_quantize_batch(const void* const* inputs, int count, KernelDType x_type, int64_t rows, int64_t cols,
                                uint8_t* codes, uint8_t* scales, int search_mode, int* nonfinite_flag_device,
                                void* bf16_operand, void* stream);

// codes [rows, cols/2] + scales [rows, cols/16] -> out [rows, cols] in f32/bf16/f16, exact (every E2M1 x E4M3
// product is representable in all three). Scale codes 0x7F/0xFF give NaN. `out` needs only its element
// alignment (16-byte-aligned out and 8-byte-aligned codes take the vectorized path).
int launch_nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, void* out,
                            KernelDType out_type, void* stream);

// y [M, N] = x [M, K] · deq(W)ᵀ with W [N, K] given as codes [N, K/2] + E4M3 scales [N, K/16]; x bf16 or f16,
// y f32/bf16/f16, fp32 accumulation on the tensor cores; deq(W) is decoded in registers, never stored.
// K % 16 == 0; any M >= 0, N >= 0. Needs x 16-byte aligned and codes 8-byte aligned (cudaErrorInvalidValue
// otherwise; a fresh or row-sliced contiguous tensor always is). Needs a device of compute capability >= 9.0.
// (Products with 1 <= M <= 4 rows and K % 32 == 0 go to launch_nvfp4_gemv when x and codes are 16-byte aligned.)
int launch_nvfp4_matmul(const void* x, KernelDType x_type, int64_t M, int64_t K, const uint8_t* codes,
                        const uint8_t* scales, int64_t N, void* y, KernelDType y_type, void* stream);

// The same product for 1 <= M <= 4 (gemv::kMaxRows) with fp32 FMAs instead of tensor cores, a warp per two rows of
// W, every code byte read once (nvfp4_gemv.cu). K % 32 == 0, x and codes 16-byte aligned (cudaErrorInvalidValue
// otherwise). Within the same error bound as launch_nvfp4_matmul (kernels/nvfp4_kernels.md), not the same bits.
int launch_nvfp4_gemv(const void* x, KernelDType x_type, int64_t M, int64_t K, const uint8_t* codes,
                      const uint8_t* scales, int64_t N, void* y, KernelDType y_type, void* stream);

// One fused AdamW step of one parameter (adamw_update.cuh's rules, the CPU step's bytes): every gradient,
// master and moment byte read once and written once (nvfp4 moments: the gradient and the packed state twice,
// for the per-row scale). All pointers device memory, contiguous, as kernels/adamw_step.md lays out.
// `max_ctas` > 0 caps the grid (the kernels stride over what it leaves: the tests run every pass of that loop
// with a cap of 1); 0 is each kernel's own grid, the int8 one's the CTAs the device holds at once.
int launch_adamw_step(const adamw::ParamView& param, const adamw::StepScalars& scalars, void* stream,
                      int max_ctas = 0);

// ---- A group's gradient clipping (grad_clip.cu; rules and summation order in grad_clip.cuh; grad_clip.md) -----
// One tensor of the group: f32 or bf16, contiguous, device memory (numel 0: no data needed).
struct GradClipTensor {
  const void* data;
  int64_t numel;
  KernelDType dtype;
};
// What the group's last CTA writes: the group's squared L2 norm into *sum (fp64; added to it with accumulate),
// and where `factors` is given, each tensor's clipping factor (grad_clip::clip_scale on the group's share of
// max_norm: counted_elements of trainable; with ranks_with_gradient, the elements of the tensors whose count is
// above zero, from numels_device, and NaN for the others). With `tensor_squares`, each tensor's last CTA writes
// its own squared norm there (fp64, from its chunks alone). `sum` or `tensor_squares` must be given. All
// pointers device memory.
struct GradClipGroup {
  double max_norm = 0, trainable = 1, counted_elements = 0;
  const float* ranks_with_gradient = nullptr;  // [count], nullable
  const double* numels_device = nullptr;       // [count], with ranks_with_gradient
  double* sum = nullptr;
  int accumulate = 0;
  float* factors = nullptr;         // [count], nullable
  double* tensor_squares = nullptr;  // [count], nullable
};
// The workspace launch_grad_clip needs, in doubles: one a chunk (grad_clip::chunks_of) and the counters.
int64_t grad_clip_workspace_doubles(const GradClipTensor* tensors, int count);
// Every gradient byte read once; one launch per 64 tensors and a memset of the counters; nothing read back on
// the host.
int launch_grad_clip(const GradClipTensor* tensors, int count, const GradClipGroup& group, double* workspace,
                     void* stream);

// ---- Fused activation kernels (fused_ops.cu; element rules in fused_ops.cuh; design: fused_ops.md) ----------
// Activations f32 or bf16, contiguous; the RMSNorm weight f32 or bf16. Each launcher checks its arguments,
// enqueues on `stream` and never synchronizes.

// y [rows, cols] = T(w) * T(x * rstd) with rstd = 1 / sqrt(mean(x^2) + eps) per row (written to rstd [rows]).
int launch_rmsnorm_forward(const void* x, KernelDType x_type, const void* w, KernelDType w_type, int64_t rows,
                           int64_t cols, float eps, void* y, float* rstd, void* stream);

// Lanes of a warp that take one row in the RMSNorm kernels: 32, or on the vector path (`vectorized`: rows of whole
// 8-element pieces, aligned) the power of two that covers a narrow row's pieces (128 columns: 16), a warp then
// taking 32 / lanes rows.
int rmsnorm_row_lanes(int64_t cols, int vectorized);

// Rows a chunk of the weight gradient's deterministic reduction sums (32, more past 65,535 chunks): the sum's
// order depends on the row count only. The workspace holds a row of partial sums a chunk.
int64_t rmsnorm_rows_per_chunk(int64_t rows);
int64_t rmsnorm_backward_workspace_floats(int64_t rows, int64_t cols);

// dx [rows, cols] (x's dtype) and dw [cols] (fp32, the sum over rows, in a fixed order) from dy, x, w and the
// forward's rstd; workspace: rmsnorm_backward_workspace_floats(rows, cols) floats of device memory. dx_add
// (nullable, [rows, cols] of x's dtype, not dx): a gradient x gets by another path (the residual stream's), added
// into dx as autograd adds two gradients (dx rounded to x's dtype, then the sum): one pass instead of two.
int launch_rmsnorm_backward(const void* dy, const void* x, KernelDType x_type, const void* w, KernelDType w_type,
                            const float* rstd, int64_t rows, int64_t cols, void* dx, float* dw, float* workspace,
                            void* stream, const void* dx_add = nullptr);

// HF's rotary embedding of x [batch, seq, heads, head_dim] (contiguous) into out (which may be x: in place) with
// fp32 tables cos/sin [table_rows, head_dim]: table_rows == seq (every row of the batch at positions 0..seq-1) or
// batch * seq (a table row for each token: packed rows, whose positions restart with every sample); backward != 0
// applies the transposed rotation (the gradient's).
int launch_rope(const void* x, void* out, KernelDType type, int64_t batch, int64_t seq, int64_t heads,
                int64_t head_dim, const float* cos, const float* sin, int64_t table_rows, int backward, void* stream);

// The q/k norms and RoPE as one pass: y = rope(rmsnorm(x, w)) over x [batch, seq, heads, head_dim] (contiguous),
// byte for byte launch_rmsnorm_forward over [batch * seq * heads, head_dim] followed by launch_rope (rstd [batch *
// seq * heads] as the norm writes it), without the normalized row going to memory. head_dim: one that
// fused::head_norm_rope_lanes takes (16, 32, 64, 128, 256); every pointer aligned for 8-element pieces (16 bytes).
// Tables as launch_rope's.
int launch_head_norm_rope_forward(const void* x, KernelDType x_type, const void* w, KernelDType w_type, int64_t batch,
                                  int64_t seq, int64_t heads, int64_t head_dim, float eps, const float* cos,
                                  const float* sin, int64_t table_rows, void* y, float* rstd, void* stream);
// Its backward from dy (the gradient of y): dx and dw byte for byte launch_rope's backward followed by
// launch_rmsnorm_backward; workspace: rmsnorm_backward_workspace_floats(batch * seq * heads, head_dim) floats.
int launch_head_norm_rope_backward(const void* dy, const void* x, KernelDType x_type, const void* w, KernelDType w_type,
                                   const float* rstd, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                   const float* cos, const float* sin, int64_t table_rows, void* dx, float* dw,
                                   float* workspace, void* stream);

// out = T(silu(gate)) * up over n elements; and its backward (dgate, dup from dout).
int launch_swiglu_forward(const void* gate, const void* up, void* out, KernelDType type, int64_t n, void* stream);
int launch_swiglu_backward(const void* dout, const void* gate, const void* up, void* dgate, void* dup, KernelDType type,
                           int64_t n, void* stream);

// ---- The sliced loss's passes (lm_loss_slice.cu; rules in lm_loss_slice.cuh; design: lm_loss_slice.md) --------
// logits [rows, width] f32 or bf16, contiguous: the columns first_column .. first_column + width - 1 of the
// vocabulary; targets [rows] int64 (-100 or any value outside the slice picks nothing); the float arrays [rows].

// Folds the slice into each row's running (max, sum of exp(logit - max)) and writes the target's logit where the
// target lies in the slice. Start a row at (-inf, 0).
int launch_loss_slice_stats(const void* logits, KernelDType type, int64_t rows, int64_t width, int64_t first_column,
                            const int64_t* targets, float* running_max, float* running_sum, float* target_logit,
                            void* stream);

// out [rows, width] (logits' dtype; may be logits) = (exp(logit - lse) - [column == target]) * row_scale.
int launch_loss_slice_gradient(const void* logits, void* out, KernelDType type, int64_t rows, int64_t width,
                               int64_t first_column, const int64_t* targets, const float* lse, const float* row_scale,
                               void* stream);

}  // namespace qwen3::kernels
