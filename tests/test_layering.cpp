// Modules depend in one direction. A public header's module is its folder (include/qwen3/<module>/), a source's
// is its folder (src/<module>/); a module may include the headers of the modules below it in this order and its
// own, never one above it (a cycle starts there), and never another module's private headers
// (src/<module>/*.h). The order and what each module is: docs/build.md, "Modules".
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>
#include "build_paths.h"
#include "gpu_test.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

// Lowest first.
const std::vector<std::string> kOrder = {"base", "dat",   "config",     "tokenizer", "nvfp4",   "memory",  "optim",
                                         "model", "data", "checkpoint", "export",    "convert", "dist",    "trainer", "cli"};

int rank(const std::string& module) {
  for (size_t i = 0; i < kOrder.size(); ++i)
    if (kOrder[i] == module) return static_cast<int>(i);
  return -1;
}

std::string source_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Layering, ModulesIncludeOnlyWhatLiesBelowThem) {
  const fs::path root(test::source_dir());
  std::vector<std::pair<fs::path, std::string>> files;  // file, its module
  for (const char* top : {"include/qwen3", "src"})
    for (const auto& entry : fs::directory_iterator(root / top)) {
      if (!entry.is_directory()) {
        EXPECT_NE(std::string(top), "include/qwen3") << entry.path() << ": a public header belongs in its module's folder";
        continue;
      }
      const std::string module = entry.path().filename().string();
      EXPECT_GE(rank(module), 0) << entry.path() << " is not in the module order";
      for (const auto& e : fs::directory_iterator(entry.path()))
        if (e.path().extension() == ".cpp" || e.path().extension() == ".h") files.emplace_back(e.path(), module);
    }
  ASSERT_GT(files.size(), 100u);
  const std::regex public_include(R"(#include\s+"qwen3/([a-z_0-9]+)/[a-z_0-9]+\.h")");
  const std::regex private_include(R"(#include\s+"([a-z_0-9]+)/[a-z_0-9]+\.h")");
  size_t checked = 0;
  for (const auto& [file, module] : files) {
    const std::string text = source_text(file);
    const std::string where = fs::relative(file, root).string() + " (" + module + ")";
    for (auto it = std::sregex_iterator(text.begin(), text.end(), public_include); it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1].str();
      ++checked;
      EXPECT_GE(rank(target), 0) << where << " includes a header of unknown module " << target;
      if (target != module) {
        EXPECT_LT(rank(target), rank(module)) << where << " includes " << it->str() << ", above it";
      }
    }
    for (auto it = std::sregex_iterator(text.begin(), text.end(), private_include); it != std::sregex_iterator(); ++it) {
      const std::string folder = (*it)[1].str();
      if (rank(folder) >= 0) {
        EXPECT_EQ(folder, module) << where << " includes " << it->str() << ", private to " << folder;
      }
    }
  }
  EXPECT_GT(checked, 200u);
}

// Every device check of the tests sits inside QWEN3_GPU_TEST (gpu_test.h), which also makes the test carry "Gpu"
// in its name: so the GPU machine's filter (*Gpu*) runs, and sanitizes, every test that needs a device.
TEST(TestConventions, GpuTestsSkipOnlyThroughTheMacro) {
  const fs::path root(test::source_dir());
  const std::regex device_check(R"(hasCUDA\s*\(|have_gpu\s*\(|cuda_device_count\s*\(|cuda::is_available\s*\()");
  int checked = 0;
  for (const char* folder : {"tests", "tests/gpu"})
    for (const auto& entry : fs::directory_iterator(root / folder)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || name.rfind("test_", 0) != 0) continue;
      std::istringstream lines(source_text(entry.path()));
      std::string line;
      for (int n = 1; std::getline(lines, line); ++n) {
        if (!std::regex_search(line, device_check)) continue;
        ++checked;
        EXPECT_NE(line.find("QWEN3_GPU_TEST("), std::string::npos)
            << folder << "/" << name << ":" << n << " checks for a device outside QWEN3_GPU_TEST: " << line;
      }
    }
  EXPECT_GT(checked, 0) << "no test checks for a device: the scan reads the wrong folder";
}

// A test that needs a device but is not named for the filter fails, with or without a device.
TEST(TestConventions, ADeviceTestMustCarryTheFiltersWordInItsName) {
  EXPECT_FATAL_FAILURE(QWEN3_GPU_TEST(true), "'Gpu' in its suite or test name");
}

}  // namespace
}  // namespace qwen3
