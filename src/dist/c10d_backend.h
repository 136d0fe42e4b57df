// The one place PyTorch's versions differ for the trainer's collectives: in PyTorch 2.x the process groups that
// run them (ProcessGroupGloo, ProcessGroupNCCL) derive from c10d::Backend, in 1.13 (Debian 12's libtorch) from
// c10d::ProcessGroup. Both have the same allreduce / reduce / broadcast calls, so the group is held by this name.
#pragma once
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

// NCCL where this libtorch is a CUDA build with it (USE_C10D_NCCL comes with the torch_cuda target).
#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define QWEN3_HAVE_NCCL 1
#elif defined(QWEN3_REQUIRE_NCCL)  // scripts/cuda-libtorch-check.sh: the check must not pass without the NCCL path
#error "USE_C10D_NCCL and ProcessGroupNCCL.hpp expected (scripts/cuda-libtorch-check.sh)"
#endif

namespace qwen3 {

#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

}  // namespace qwen3
