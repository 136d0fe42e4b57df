#include "qwen3/memory/memory_probe.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "qwen3/base/error.h"

#if defined(QWEN3_TORCH_HAS_CUDA)
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace qwen3 {
namespace {

#if defined(QWEN3_TORCH_HAS_CUDA)
// The caching allocator's statistics exist only once CUDA is initialised: before the first tensor reaches the
// device they throw "Invalid device argument ...: did you call init?" (the first GPU round met this, a report
// being made before the weights were loaded). One byte allocated on the device initialises it, for every device,
// once a process (take_device_peak_bytes runs every step).
int ready_cuda_index(const c10::Device& device) {
  const int index = device.index() < 0 ? 0 : device.index();
  static std::once_flag initialised;
  std::call_once(initialised, [index] {
    (void)at::empty({1}, at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::kCUDA, index)));
  });
  return index;
}
#endif

std::atomic<uint64_t> g_live{0};
std::atomic<uint64_t> g_peak{0};

// Wraps libtorch's CPU allocator and counts the bytes of every block it hands out. The block's size sits in a
// 64-byte header in front of the data (which keeps the data 64-byte aligned), so freeing needs no lookup.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;

  CountingCpuAllocator() = default;

// PyTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t bytes) override {
#else
  c10::DataPtr allocate(size_t bytes) const override {
#endif
    void* base = c10::alloc_cpu(bytes + kHeader);
    *static_cast<size_t*>(base) = bytes;
    const uint64_t live = g_live.fetch_add(bytes) + bytes;
    uint64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    // Data and context must be the same pointer: raw_allocate() (used inside some operators) asserts it.
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif

 private:
  static void release(void* data) {
    void* base = static_cast<char*>(data) - kHeader;
    g_live.fetch_sub(*static_cast<size_t*>(base));
    c10::free_cpu(base);
  }
};

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingCpuAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
}

// A field of /proc/self/status in kB, as bytes.
uint64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      uint64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  return 0;
}

struct MachineMemory {
  uint64_t total = 0, available = 0;  // bytes
};

MachineMemory machine_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  MachineMemory m;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.total = kb * 1024;
    if (key == "MemAvailable:") m.available = kb * 1024;
  }
  return m;
}

uint64_t rss_now() {
  std::ifstream in("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  in >> size_pages >> resident_pages;
  return resident_pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

struct MemoryProbe::RssSampler {
  std::atomic<uint64_t> peak{0};
  std::atomic<bool> stop{false};
  std::thread thread;

  RssSampler() {
    peak = rss_now();
    thread = std::thread([this] {
      while (!stop.load()) {
        raise(rss_now());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~RssSampler() {
    stop = true;
    thread.join();
  }
  void raise(uint64_t value) {
    uint64_t seen = peak.load();
    while (value > seen && !peak.compare_exchange_weak(seen, value)) {
    }
  }
};

uint64_t process_rss_bytes() { return rss_now(); }
uint64_t machine_memory_bytes() { return machine_memory().total; }

uint64_t cpu_tensor_bytes() { return g_live.load(); }
uint64_t cpu_tensor_peak_bytes() { return g_peak.load(); }

std::optional<CudaDeviceInfo> cuda_device_info(const c10::Device& device) {
#if defined(QWEN3_TORCH_HAS_CUDA)
  cudaDeviceProp prop{};
  if (device.is_cuda() && cudaGetDeviceProperties(&prop, device.index() < 0 ? 0 : device.index()) == cudaSuccess)
    return CudaDeviceInfo{prop.major, prop.minor, prop.integrated != 0, static_cast<uint64_t>(prop.totalGlobalMem),
                          prop.multiProcessorCount};
#endif
  return std::nullopt;
}

void synchronize_device(const c10::Device& device) {
#if defined(QWEN3_TORCH_HAS_CUDA)
  if (!device.is_cuda()) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device.index() < 0 ? 0 : device.index()));
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess) throw Error(std::string("CUDA device synchronize: ") + cudaGetErrorString(status));
#endif
}

bool shares_memory_with_cpu(const c10::Device& device) {
  if (device.is_cpu()) return true;
  const auto info = cuda_device_info(device);
  return info && (info->integrated || (info->major == 12 && info->minor == 1));
}

MemoryProbe::MemoryProbe(c10::Device device)
    : device_(device), shared_pool_(shares_memory_with_cpu(device)), sampler_(std::make_unique<RssSampler>()) {
  if (device_.is_cpu()) install_counting_allocator();
#if !defined(QWEN3_TORCH_HAS_CUDA)
  if (device_.is_cuda()) throw Error("memory report: this build's libtorch has no CUDA");
#endif
  reset_peaks();
}

MemoryProbe::~MemoryProbe() = default;

MemoryReading MemoryProbe::read() const {
  MemoryReading r;
  r.rss = rss_now();
  sampler_->raise(r.rss);
  r.rss_peak = sampler_->peak.load();
  r.rss_peak_since_start = proc_status_bytes("VmHWM");
  if (device_.is_cpu()) {
    const MachineMemory m = machine_memory();
    r.allocated = g_live.load();
    r.peak = g_peak.load();
    r.device_used = m.total - std::min(m.total, m.available);
    r.pool_peak = r.rss_peak;
    r.pool_total = m.total;
    return r;
  }
  if (shared_pool_) r.pool_total = machine_memory().total;
#if defined(QWEN3_TORCH_HAS_CUDA)
  // Index 0 is StatType::AGGREGATE in every version; naming the type would tie this to one (it moved to
  // c10::CachingAllocator in PyTorch 2.5).
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(ready_cuda_index(device_));
  r.allocated = static_cast<uint64_t>(stats.allocated_bytes[0].current);
  r.peak = static_cast<uint64_t>(stats.allocated_bytes[0].peak);
  r.reserved = static_cast<uint64_t>(stats.reserved_bytes[0].current);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) r.device_used = total_bytes - free_bytes;
  // Counted twice if the driver maps the allocator's blocks into the RSS too: to be checked on a GB10
  // (docs/dgx-spark.md).
  if (shared_pool_) r.pool_peak = r.rss_peak + *r.reserved;
#endif
  return r;
}

std::optional<uint64_t> take_device_peak_bytes(const c10::Device& device) {
#if defined(QWEN3_TORCH_HAS_CUDA)
  if (device.is_cuda()) {
    const int index = ready_cuda_index(device);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);  // [0]: the aggregate (above)
    const auto peak = static_cast<uint64_t>(stats.allocated_bytes[0].peak);
    c10::cuda::CUDACachingAllocator::resetPeakStats(index);
    return peak;
  }
#endif
  (void)device;
  return std::nullopt;
}

void MemoryProbe::reset_peaks() {
  sampler_->peak = rss_now();
  if (device_.is_cpu()) {
    g_peak.store(g_live.load());
    return;
  }
#if defined(QWEN3_TORCH_HAS_CUDA)
  c10::cuda::CUDACachingAllocator::resetPeakStats(ready_cuda_index(device_));
#endif
}

}  // namespace qwen3
