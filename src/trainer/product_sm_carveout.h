// --overlap-update-sms N: while backward runs, its cuBLAS products target N fewer SMs than the device has, so that
// the block updates on their own stream (--overlap-update) find SMs free beside them. Why: cuBLAS's Hopper
// kernels are persistent (one thread block per SM, each SM held for the whole product), so without a carveout an
// update's blocks wait for a product to end, and the overlap hides nothing (the GPU round's "adamw beside
// products" figure says how much ran beside them). docs/trainer.md, "--overlap-update-sms".
//
// How: ATen's SM carveout, which its cuBLASLt path passes to each product as CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
// with cuBLASLt as ATen's preferred BLAS path for the time (its cuBLAS path takes no carveout, and the handle-level
// cublasSetSmCountTarget would not reach the autograd engine's device thread, whose own cuBLAS handle runs
// backward's products). Both are process-wide settings of ATen's context: set before loss.backward() and put back
// as it returns, so forward's products (no update runs beside them) keep every SM. libtorch 2.8 or newer.
#pragma once
#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstdint>
#include <optional>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define QWEN3_PRODUCT_SM_CARVEOUT 1
#endif

namespace qwen3::train_detail {

// Whether this libtorch can leave SMs to the updates (the trainer refuses the flag, naming the version, if not).
inline constexpr bool product_sm_carveout_supported() {
#if defined(QWEN3_PRODUCT_SM_CARVEOUT)
  return true;
#else
  return false;
#endif
}

// --overlap-update-sms N: UsageError unless this libtorch has the carveout (2.8+) and `device` keeps at least one SM
// for the products; then says once how many SMs the products target.
void check_product_sm_carveout(int64_t sms, const c10::Device& device);

// For its lifetime the products target `sms` fewer SMs (0: nothing changes); the settings it found come back when
// it ends, however the scope ends.
class ProductSmCarveout {
 public:
  explicit ProductSmCarveout(int64_t sms) {
#if defined(QWEN3_PRODUCT_SM_CARVEOUT)
    if (sms <= 0) return;
    // Both setters warn once that they are experimental, on stderr; the flag's help and docs say so instead.
    const c10::WarningUtils::WarningHandlerGuard quiet(&silent_);
    at::Context& context = at::globalContext();
    carveout_before_ = context._SMCarveout_EXPERIMENTAL();
    backend_before_ = context.blasPreferredBackend();
    // The backend first: the one setter that can refuse (a PyTorch built without cuBLASLt) leaves nothing changed.
    context.setBlasPreferredBackend(at::BlasBackend::Cublaslt);
    context._setSMCarveout_EXPERIMENTAL(static_cast<int32_t>(sms));
    active_ = true;
#else
    (void)sms;
#endif
  }
  ~ProductSmCarveout() {
#if defined(QWEN3_PRODUCT_SM_CARVEOUT)
    if (!active_) return;
    const c10::WarningUtils::WarningHandlerGuard quiet(&silent_);
    at::Context& context = at::globalContext();
    try {
      context._setSMCarveout_EXPERIMENTAL(carveout_before_);
      context.setBlasPreferredBackend(backend_before_);
    } catch (...) {  // putting back a setting ATen accepted before does not fail; a destructor must not throw
    }
#endif
  }
  ProductSmCarveout(const ProductSmCarveout&) = delete;
  ProductSmCarveout& operator=(const ProductSmCarveout&) = delete;

 private:
#if defined(QWEN3_PRODUCT_SM_CARVEOUT)
  struct Silent final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  };
  static inline Silent silent_;
  std::optional<int32_t> carveout_before_;
  at::BlasBackend backend_before_ = at::BlasBackend::Default;
  bool active_ = false;
#endif
};

}  // namespace qwen3::train_detail
