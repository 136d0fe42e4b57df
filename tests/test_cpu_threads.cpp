// The CPU thread count: the choice's order (flag, the user's environment, Linux's cores shared among the ranks,
// libtorch's default) and, through the binary, that the flag and the default reach libtorch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_util.h"
#include "qwen3/base/cpu_threads.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

CpuThreadInputs inputs(int flag, bool env_set, int library_default, int cores, int processes) {
  CpuThreadInputs in;
  in.flag = flag;
  in.env_set = env_set;
  in.library_default = library_default;
  in.physical_cores = cores;
  in.processes_per_machine = processes;
  return in;
}

TEST(CpuThreads, TheFlagThenTheEnvironmentThenTheCoresThenLibtorch) {
  // libtorch counted one core of two (this project's KVM machines): Linux's count wins.
  EXPECT_EQ(choose_cpu_threads(inputs(0, false, 1, 2, 1)).threads, 2);
  EXPECT_EQ(choose_cpu_threads(inputs(0, false, 1, 2, 1)).why, "2 cores");
  EXPECT_EQ(choose_cpu_threads(inputs(3, false, 1, 2, 1)).threads, 3);
  EXPECT_EQ(choose_cpu_threads(inputs(3, true, 5, 2, 1)).threads, 3);
  EXPECT_EQ(choose_cpu_threads(inputs(0, true, 5, 2, 1)).threads, 5);  // OMP_NUM_THREADS=5, applied by libtorch
  EXPECT_EQ(choose_cpu_threads(inputs(0, false, 4, 0, 1)).threads, 4);  // no topology: libtorch's default
  EXPECT_EQ(choose_cpu_threads(inputs(0, false, 1, 16, 4)).threads, 4);  // 4 ranks on a 16-core machine
  EXPECT_EQ(choose_cpu_threads(inputs(0, false, 1, 16, 4)).why, "16 cores shared by 4 ranks");
  EXPECT_EQ(choose_cpu_threads(inputs(0, false, 1, 2, 8)).threads, 1);   // never 0
}

// Sets launcher variables for one test and restores the process's environment after it.
class LauncherEnv {
 public:
  LauncherEnv() {
    for (const char* name : kNames)
      if (const char* value = std::getenv(name)) saved_.emplace_back(name, value);
    for (const char* name : kNames) unsetenv(name);
  }
  ~LauncherEnv() {
    for (const char* name : kNames) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  static constexpr const char* kNames[] = {"LOCAL_WORLD_SIZE",     "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
                                           "SLURM_TASKS_PER_NODE", "RANK",                       "WORLD_SIZE",
                                           "MASTER_ADDR"};

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST(CpuThreads, RanksOnOneMachineComeFromTheLauncher) {
  LauncherEnv env;
  EXPECT_EQ(processes_per_machine_from_environment(), 1);
  setenv("RANK", "0", 1), setenv("WORLD_SIZE", "2", 1);  // by hand, a file:// store: one machine
  EXPECT_EQ(processes_per_machine_from_environment(), 2);
  setenv("MASTER_ADDR", "10.0.0.1", 1);  // by hand across machines: unknown, so not shared
  EXPECT_EQ(processes_per_machine_from_environment(), 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2),1", 1);
  EXPECT_EQ(processes_per_machine_from_environment(), 4);
  setenv("SLURM_NTASKS_PER_NODE", "3", 1);
  EXPECT_EQ(processes_per_machine_from_environment(), 3);
  setenv("LOCAL_WORLD_SIZE", "8", 1);  // torchrun's
  EXPECT_EQ(processes_per_machine_from_environment(), 8);
}

// Where the topology can be read (a chroot or container without /sys cannot: the count is then 0 and libtorch's
// default stands, checked below).
bool sysfs_topology_readable() { return std::ifstream("/sys/devices/system/cpu/cpu0/topology/core_id").good(); }

TEST(CpuThreads, LinuxCountsTheCoresThisProcessMayUse) {
  const int cores = physical_cores_available();
  if (!sysfs_topology_readable()) {
    EXPECT_EQ(cores, 0);
    GTEST_SKIP() << "no /sys/devices/system/cpu topology here (a chroot without /sys?)";
  }
  ASSERT_GT(cores, 0);
  EXPECT_LE(cores, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

TEST(CpuThreadsCli, TheBinaryAppliesTheFlagAndTheDefault) {
  test::TempDir dir;
  auto r = test::run_cli("--log-level debug --threads 3 synth --preset tiny --out-dir " + dir.file("m"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("CPU threads: 3 (--threads)"), std::string::npos) << r.err;
  r = test::run_shell(std::string("env -u OMP_NUM_THREADS -u MKL_NUM_THREADS -u LOCAL_WORLD_SIZE ") +
                      "-u SLURM_NTASKS_PER_NODE -u OMPI_COMM_WORLD_LOCAL_SIZE " + test::binary_command() +
                      " --log-level debug synth --preset tiny --out-dir " + dir.file("n"));
  ASSERT_EQ(r.code, 0) << r.err;
  const int cores = physical_cores_available();
  const bool topology = sysfs_topology_readable();
  EXPECT_NE(r.err.find(topology ? "CPU threads: " + std::to_string(cores) + " (" + std::to_string(cores) + " core"
                                : std::string("(libtorch's default)")),
            std::string::npos)
      << r.err;
  // One CPU allowed (taskset is util-linux, on every Debian): one core.
  r = test::run_shell(std::string("taskset -c 0 env -u OMP_NUM_THREADS ") + test::binary_command() +
                      " --log-level debug synth --preset tiny --out-dir " + dir.file("o"));
  ASSERT_EQ(r.code, 0) << r.err;
  if (topology) {
    EXPECT_NE(r.err.find("CPU threads: 1 (1 core)"), std::string::npos) << r.err;
  }
  r = test::run_shell(std::string("OMP_NUM_THREADS=1 ") + test::binary_command() +
                      " --log-level debug synth --preset tiny --out-dir " + dir.file("p"));
  EXPECT_NE(r.err.find("CPU threads: 1 (OMP_NUM_THREADS/MKL_NUM_THREADS)"), std::string::npos) << r.err;
  r = test::run_cli("--threads 0 synth --preset tiny --out-dir " + dir.file("q"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qwen3
