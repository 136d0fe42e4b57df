// Device discovery for `--version` and for the tests that skip cleanly without a GPU.
#include <cuda_runtime.h>

#include "qwen3_kernels.h"

namespace qwen3::kernels {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace qwen3::kernels
