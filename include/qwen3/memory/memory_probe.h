// Memory as the trainer's one-step report measures it: tensor bytes live and at their peak (the CUDA caching
// allocator's statistics on a GPU; on CPU a counting wrapper around libtorch's CPU allocator), what the device
// holds, and the process's resident set and its peak. Peaks can be reset, so each phase reports its own.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace qwen3 {

struct MemoryReading {
  uint64_t allocated = 0;          // tensor bytes live now
  uint64_t peak = 0;               // most tensor bytes live at once since the last reset
  std::optional<uint64_t> reserved;       // bytes the CUDA caching allocator holds (none on CPU)
  std::optional<uint64_t> device_used;    // whole device in use (cudaMemGetInfo); CPU: the machine's used memory
  uint64_t rss = 0;                // process resident set now
  uint64_t rss_peak = 0;           // its peak since the last reset, sampled every millisecond
  uint64_t rss_peak_since_start = 0;  // the kernel's high-water mark (VmHWM), never reset
  // Where the CPU and the device draw on one memory (a CPU; GB10 and other integrated GPUs, whose "GPU memory" is
  // the machine's): this process's use of it at its peak in the phase -- the RSS peak plus what the CUDA caching
  // allocator holds -- and the pool's size (MemTotal). None on a discrete GPU, whose memory is its own.
  std::optional<uint64_t> pool_peak;
  std::optional<uint64_t> pool_total;
};

// What the trainer needs to know of a CUDA device: its compute capability, whether it is integrated (its memory is
// the machine's), and its memory.
struct CudaDeviceInfo {
  int major = 0, minor = 0;
  bool integrated = false;
  uint64_t total_memory = 0;  // bytes
  int multiprocessors = 0;     // SMs
};
// The device's properties; nothing for a CPU device, in a build without CUDA, or when the device cannot be read.
std::optional<CudaDeviceInfo> cuda_device_info(const c10::Device& device);

// Whether `device` shares one memory with the CPU: the CPU itself, or a CUDA device that reports itself integrated
// or is compute capability 12.1 (GB10, DGX Spark).
bool shares_memory_with_cpu(const c10::Device& device);

// Waits until `device` has finished the work queued on it (CUDA; nothing to wait for on a CPU), so that a clock
// read afterwards counts that work: a phase's duration, not the time its kernels took to be launched.
void synchronize_device(const c10::Device& device);

// The RSS peak per phase comes from a thread that reads /proc/self/statm every millisecond, not from resetting
// the kernel's high-water mark: that reset would also reset what `/usr/bin/time -v` reports for the process.
class MemoryProbe {
 public:
  // On CPU this installs the counting allocator (once per process): only tensors allocated afterwards count.
  explicit MemoryProbe(c10::Device device);
  ~MemoryProbe();
  MemoryProbe(const MemoryProbe&) = delete;
  MemoryProbe& operator=(const MemoryProbe&) = delete;
  MemoryReading read() const;
  void reset_peaks();  // the tensor and RSS peaks become the current figures
  const c10::Device& device() const { return device_; }

 private:
  struct RssSampler;
  c10::Device device_;
  bool shared_pool_;
  std::unique_ptr<RssSampler> sampler_;
};

// The peak of the device's allocated tensor bytes since the previous call (or the process start), then reset:
// the per-step figure of the metrics. CUDA only (its caching allocator keeps the peak); none on a CPU.
std::optional<uint64_t> take_device_peak_bytes(const c10::Device& device);

// This process's resident set now, and the machine's memory (MemTotal), in bytes.
uint64_t process_rss_bytes();
uint64_t machine_memory_bytes();

// Bytes of CPU tensors live now / at the peak since reset, by the counting allocator (0 before it is installed).
uint64_t cpu_tensor_bytes();
uint64_t cpu_tensor_peak_bytes();

}  // namespace qwen3
