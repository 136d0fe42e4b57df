// The repository's documents stand alone: every repository path they (and the code's comments) cite exists, and
// none points outside the repository (the project's background notes are not shipped with it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include "build_paths.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> cited_from() {
  const fs::path root(test::source_dir());
  std::vector<fs::path> files = {root / "README.md"};
  for (const char* dir : {"docs", "kernels", "src", "include", "tests", "scripts", "bench"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir))
      if (e.is_regular_file()) files.push_back(e.path());
  return files;
}

TEST(Docs, CitedPathsExistAndStayInTheRepository) {
  const fs::path root(test::source_dir());
  // A repository path: one of the top folders, then path characters, ending in a known extension; not preceded
  // by a path character (so "build/docs/x.md" or "a_docs/x.md" are not citations).
  const std::regex path_pattern(R"((^|[^\w/.-])((docs|kernels|src|include|tests|scripts|bench|cmake)/[\w./-]+\.(md|h|cpp|cuh|cu|sh|cmake|json|txt)))");
  std::set<std::string> missing, outside;
  for (const fs::path& file : cited_from()) {
    const std::string text = slurp(file);
    const std::string name = fs::relative(file, root).string();
    if (name == "tests/test_docs.cpp") continue;
    if (text.find("../shared") != std::string::npos) outside.insert(name);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path_pattern); it != std::sregex_iterator(); ++it) {
      const std::string cited = (*it)[2].str();
      if (!fs::exists(root / cited)) missing.insert(name + " cites " + cited);
    }
  }
  for (const std::string& m : missing) ADD_FAILURE() << m;
  for (const std::string& o : outside) ADD_FAILURE() << o << " points outside the repository (../shared)";
}

}  // namespace
}  // namespace qwen3
