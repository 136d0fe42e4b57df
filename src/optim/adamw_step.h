// The fused AdamW step of one parameter: every element's gradient, master and moment state read once and
// written once, by the shared element rules of kernels/adamw_update.cuh. The CPU runs rows over
// at::parallel_for; the GPU runs the kernel of kernels/adamw_step.cu on the current stream.
#pragma once
#include <cstdint>
#include <vector>

#include "adamw_update.cuh"

namespace qwen3::optim_detail {

// One row of a moment (second: v, else m) of CPU state, as fp32 [stored_cols]; and back, rounded with the
// stream `key`.
void decode_moment_row(const kernels::adamw::ParamView& param, bool second, int64_t row, float* out);
void encode_moment_row(const kernels::adamw::ParamView& param, bool second, int64_t row, const float* in,
                       uint64_t key);

// rows_per_task > 0: the rows a parallel task covers (--optimizer-step-chunk-rows); 0: about 32 K elements.
// Any split gives the same bytes.
void adamw_step_cpu(const kernels::adamw::ParamView& param, const kernels::adamw::StepScalars& scalars,
                    int64_t rows_per_task);

// Throws qwen3::Error in a build without the CUDA kernels or without a CUDA libtorch.
void adamw_step_cuda(const kernels::adamw::ParamView& param, const kernels::adamw::StepScalars& scalars,
                     int device_index);

}  // namespace qwen3::optim_detail
