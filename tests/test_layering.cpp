// Modules depend in one direction. Each public header belongs to one module; a module may include the headers of
// the modules below it in this order and its own, never one above it (a cycle starts there). A new public header
// must be given its module here. The order and what each module is: docs/build.md, "Modules".
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <vector>

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

// Lowest first.
const std::vector<std::string> kOrder = {"base", "dat",   "config",     "tokenizer", "nvfp4",   "memory",  "optim",
                                         "model", "data", "checkpoint", "export",    "convert", "trainer", "cli"};

const std::map<std::string, std::string> kHeaderModule = {
    {"error", "base"},          {"json_limits", "base"},     {"file_io", "base"},         {"message_text", "base"},
    {"dat", "dat"},             {"leb128", "dat"},           {"durable_file", "dat"},     {"layout", "model"},
    {"dat_tensor", "dat"},      {"config", "config"},        {"tokenizer", "tokenizer"},  {"chat_format", "tokenizer"},
    {"nvfp4", "nvfp4"},         {"nvfp4_ops", "nvfp4"},      {"nvfp4_linear", "nvfp4"},   {"nvfp4_pair_writer", "nvfp4"},
    {"memory_probe", "memory"}, {"optim", "optim"},          {"model", "model"},          {"model_loader", "model"},
    {"generate", "model"},      {"lm_loss", "model"},        {"synth", "model"},          {"data", "data"},
    {"checkpoint", "checkpoint"}, {"exporter", "export"},    {"checkpoint_export", "export"},
    {"output_target", "export"}, {"quantize_dat", "export"}, {"hf_convert", "convert"},    {"safetensors", "convert"},
    {"trainer", "trainer"},     {"memory_model", "trainer"}, {"step_time_model", "trainer"}, {"evaluate", "trainer"}};

int rank(const std::string& module) {
  for (size_t i = 0; i < kOrder.size(); ++i)
    if (kOrder[i] == module) return static_cast<int>(i);
  return -1;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Layering, ModulesIncludeOnlyWhatLiesBelowThem) {
  const fs::path root(QWEN3_SOURCE_DIR);
  for (const auto& e : fs::directory_iterator(root / "include/qwen3"))
    EXPECT_TRUE(kHeaderModule.count(e.path().stem().string())) << e.path() << " has no module in this test's table";
  std::vector<std::pair<fs::path, std::string>> files;  // file, its module
  for (const auto& e : fs::directory_iterator(root / "include/qwen3")) {
    const auto it = kHeaderModule.find(e.path().stem().string());
    if (it != kHeaderModule.end()) files.emplace_back(e.path(), it->second);
  }
  for (const auto& dir : fs::directory_iterator(root / "src")) {
    if (!dir.is_directory()) continue;
    EXPECT_GE(rank(dir.path().filename().string()), 0) << dir.path() << " is not in the module order";
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().extension() == ".cpp" || e.path().extension() == ".h")
        files.emplace_back(e.path(), dir.path().filename().string());
  }
  const std::regex include_pattern(R"(#include\s+"([a-z_0-9]+)/([a-z_0-9]+)\.h")");
  for (const auto& [file, module] : files) {
    const std::string text = slurp(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), include_pattern); it != std::sregex_iterator(); ++it) {
      const std::string folder = (*it)[1].str(), name = (*it)[2].str();
      std::string target;
      if (folder == "qwen3") {
        const auto m = kHeaderModule.find(name);
        if (m == kHeaderModule.end()) continue;  // checked above
        target = m->second;
      } else if (rank(folder) >= 0) {
        target = folder;  // a module's private header: only that module may use it
        EXPECT_EQ(target, module) << file << " includes " << folder << "/" << name << ".h, private to " << folder;
        continue;
      } else {
        continue;
      }
      if (target == module) continue;
      EXPECT_LT(rank(target), rank(module))
          << fs::relative(file, root) << " (" << module << ") includes qwen3/" << name << ".h of " << target
          << ", which lies above it";
    }
  }
}

}  // namespace
}  // namespace qwen3
