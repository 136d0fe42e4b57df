// The CPU thread count (include/qwen3/base/cpu_threads.h): a pure choice, the two readings it needs, and
// setting libtorch's pool to it.
#include "qwen3/base/cpu_threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace qwen3 {

CpuThreadChoice choose_cpu_threads(const CpuThreadInputs& in) {
  if (in.flag > 0) return {in.flag, "--threads"};
  if (in.env_set) return {in.library_default > 0 ? in.library_default : 1, "OMP_NUM_THREADS/MKL_NUM_THREADS"};
  if (in.physical_cores > 0) {
    const int share = in.physical_cores / (in.processes_per_machine > 0 ? in.processes_per_machine : 1);
    std::string why = std::to_string(in.physical_cores) + (in.physical_cores == 1 ? " core" : " cores");
    if (in.processes_per_machine > 1) why += " shared by " + std::to_string(in.processes_per_machine) + " ranks";
    return {share > 0 ? share : 1, why};
  }
  return {in.library_default > 0 ? in.library_default : 1, "libtorch's default"};
}

namespace {

bool read_int(const std::string& path, int& out) {
  std::ifstream in(path);
  return static_cast<bool>(in >> out);
}

int positive_env(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return (*end == '\0' && value > 0 && value < 1 << 20) ? static_cast<int>(value) : 0;
}

}  // namespace

int physical_cores_available() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topology = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = 0, core = 0;
    if (!read_int(topology + "physical_package_id", package) || !read_int(topology + "core_id", core)) return 0;
    cores.emplace(package, core);
  }
  return static_cast<int>(cores.size());
}

int processes_per_machine_from_environment() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"})
    if (const int n = positive_env(name)) return n;
  // Slurm's SLURM_TASKS_PER_NODE is "4" or "2(x3),1": the first count is this job's most per machine.
  if (const char* tasks = std::getenv("SLURM_TASKS_PER_NODE")) {
    const long n = std::strtol(tasks, nullptr, 10);
    if (n > 0 && n < 1 << 20) return static_cast<int>(n);
  }
  // RANK and WORLD_SIZE set by hand (docs/distributed.md) with no remote MASTER_ADDR: the ranks share this machine.
  const char* master = std::getenv("MASTER_ADDR");
  const std::string master_addr = master ? master : "";
  if (std::getenv("RANK") && (master_addr.empty() || master_addr == "127.0.0.1" || master_addr == "localhost"))
    if (const int n = positive_env("WORLD_SIZE")) return n;
  return 1;
}

CpuThreadChoice apply_cpu_threads(int flag) {
  CpuThreadInputs in;
  in.flag = flag;
  in.env_set = positive_env("OMP_NUM_THREADS") > 0 || positive_env("MKL_NUM_THREADS") > 0;
  in.library_default = at::get_num_threads();
  in.physical_cores = physical_cores_available();
  in.processes_per_machine = processes_per_machine_from_environment();
  const CpuThreadChoice choice = choose_cpu_threads(in);
  if (choice.threads != in.library_default) at::set_num_threads(choice.threads);
  return choice;
}

}  // namespace qwen3
