// --overlap-update-sms: what the device and the libtorch must allow (product_sm_carveout.h).
#include "product_sm_carveout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "qwen3/base/error.h"
#include "qwen3/memory/memory_probe.h"

namespace qwen3::train_detail {

// The trainer has refused a CPU device already (--overlap-update needs CUDA).
void check_product_sm_carveout(int64_t sms, const c10::Device& device) {
  if (!product_sm_carveout_supported())
    throw UsageError(fmt::format("train: --overlap-update-sms needs libtorch 2.8 or newer (ATen's SM carveout for "
                                 "cuBLASLt); this build has libtorch {}",
                                 TORCH_VERSION));
  const auto gpu = cuda_device_info(device);
  if (!gpu) throw Error("train: --overlap-update-sms: the SM count of " + device.str() + " cannot be read");
  if (sms >= gpu->multiprocessors)
    throw UsageError(fmt::format("train: --overlap-update-sms {}: {} has {} SMs, and backward's products need at "
                                 "least one of them",
                                 sms, device.str(), gpu->multiprocessors));
  spdlog::info("--overlap-update-sms {}: backward's products target {} of {}'s {} SMs, leaving {} to the updates "
               "beside them",
               sms, gpu->multiprocessors - sms, device.str(), gpu->multiprocessors, sms);
}

}  // namespace qwen3::train_detail
