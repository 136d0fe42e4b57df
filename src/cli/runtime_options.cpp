#include "runtime_options.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <climits>

#include "qwen3/base/error.h"

namespace qwen3::cli {

void add_runtime_options(CLI::App* sub, RuntimeOptions& o) {
  sub->add_option("--device", o.device, "cpu or cuda (cuda:N for another GPU)")->capture_default_str();
  sub->add_option("--dtype", o.dtype, "weights and activations: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}))
      ->capture_default_str();
}

c10::Device resolve_device(const std::string& name) {
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(name);
  } catch (const c10::Error&) {
    throw UsageError("--device: '" + name + "' is not a device (cpu, cuda, cuda:N)");
  }
  if (device.is_cuda() && !at::hasCUDA())
    throw Error("--device " + name + ": this build's libtorch has no CUDA support or no GPU is visible");
  if (device.is_cuda() && device.has_index() && static_cast<size_t>(device.index()) >= at::getNumGPUs())
    throw Error(fmt::format("--device {}: this machine shows {} GPU(s), cuda:0 to cuda:{}", name, at::getNumGPUs(),
                            static_cast<int64_t>(at::getNumGPUs()) - 1));
  if (!device.is_cpu() && !device.is_cuda()) throw UsageError("--device: only cpu and cuda are supported");
  return device;
}

c10::ScalarType resolve_dtype(const std::string& name, const c10::Device& device) {
  if (name == "auto") return device.is_cuda() ? c10::kBFloat16 : c10::kFloat;
  if (name == "float32") return c10::kFloat;
  if (name == "bfloat16") return c10::kBFloat16;
  if (name == "float16") {
    // libtorch's CPU kernels lack half-precision matrix products ("addmm_impl_cpu_ not implemented for 'Half'").
    if (!device.is_cuda()) throw UsageError("--dtype float16 runs on CUDA only; on CPU use float32 or bfloat16");
    return c10::kHalf;
  }
  throw UsageError("--dtype: unknown '" + name + "' (auto, float32, bfloat16 or float16)");
}

std::vector<int64_t> parse_token_ids(const std::string& text, const std::string& where) {
  // Spaces or commas between ids, brackets around them: a list pasted from Python reads as it is.
  static constexpr const char* kSeparators = " \t\r,[]";
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (true) {
    pos = text.find_first_not_of(kSeparators, pos);
    if (pos == std::string::npos) break;
    const size_t end = std::min(text.find_first_of(kSeparators, pos), text.size());
    const std::string tok = text.substr(pos, end - pos);
    const bool digits = tok.find_first_not_of("0123456789") == std::string::npos && tok.size() <= 10;
    const long long id = digits ? std::stoll(tok) : -1;
    if (id < 0 || id > INT32_MAX) throw Error(where + ": '" + tok + "' is not a token id");
    ids.push_back(id);
    pos = end;
  }
  return ids;
}

}  // namespace qwen3::cli
