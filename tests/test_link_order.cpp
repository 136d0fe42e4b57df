// The program's shared libraries load libstdc++ first (cmake/Dependencies.cmake says why: PyTorch's wheels
// export copies of parts of libstdc++, std::filesystem among them, which would otherwise serve our calls).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dat_test_util.h"
#include "qwen3/base/remove_tree.h"

namespace qwen3 {
namespace {

// Every loaded object's path, in the dynamic linker's order: the program, the vDSO, LD_PRELOAD's libraries, then
// the program's DT_NEEDED libraries in the order of its link line, then theirs.
std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name ? info->dlpi_name : "");
        return 0;
      },
      &names);
  return names;
}

bool preloaded(const std::string& path) {
  const char* list = std::getenv("LD_PRELOAD");
  if (list == nullptr) return false;
  std::string entry;
  std::istringstream in(list);
  while (std::getline(in, entry, ':')) {
    std::istringstream words(entry);
    for (std::string word; words >> word;)
      if (path == word ||
          (path.size() >= word.size() && path.compare(path.size() - word.size(), word.size(), word) == 0))
        return true;
  }
  return false;
}

TEST(LinkOrder, LibstdcxxIsTheFirstLibraryTheProgramNeeds) {
  const std::vector<std::string> names = loaded_objects();
  std::string order;
  for (const auto& n : names) order += "\n  " + (n.empty() ? std::string("(the program)") : n);
  size_t first = 0;
  while (first < names.size() &&
         (names[first].empty() || names[first].find("vdso") != std::string::npos || preloaded(names[first])))
    ++first;
  ASSERT_LT(first, names.size()) << order;
  EXPECT_NE(names[first].find("libstdc++"), std::string::npos) << "load order:" << order;
}

// The binding itself: the dynamic linker's answer for a std::filesystem function the tests and the program call
// (TempDir, checkpoint rotation) is libstdc++'s. Where no library exports a copy (this machine's libtorch, most
// likely) it is libstdc++'s whatever the order; on a PyTorch wheel it is what the order decides.
TEST(LinkOrder, FilesystemResolvesToLibstdcxx) {
  for (const char* symbol : {"_ZNSt10filesystem19temp_directory_pathB5cxx11Ev",
                             "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE",
                             "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code"}) {
    void* address = dlsym(RTLD_DEFAULT, symbol);
    ASSERT_NE(address, nullptr) << symbol;
    Dl_info info{};
    ASSERT_NE(dladdr(address, &info), 0) << symbol;
    EXPECT_NE(std::string(info.dli_fname).find("libstdc++"), std::string::npos)
        << symbol << " from " << info.dli_fname;
  }
}


// remove_tree, which checkpoints, exports, --overwrite and the tests' folders remove through instead of
// remove_all: a folder's whole tree goes, a link is removed and not followed, an absent path is no error, and
// a path it cannot walk says why.
TEST(RemoveTree, RemovesTheWholeTreeAndNeverFollowsALink) {
  test::TempDir dir;
  const std::filesystem::path outside = dir.path() / "outside", tree = dir.path() / "tree";
  std::filesystem::create_directories(outside);
  std::ofstream(outside / "kept.txt") << "kept";
  std::filesystem::create_directories(tree / "a" / "b" / "c");
  std::ofstream(tree / "top.txt") << "x";
  std::ofstream(tree / "a" / "b" / "c" / "deep.bin") << "y";
  std::filesystem::create_directory_symlink(outside, tree / "a" / "link-to-outside");
  std::filesystem::create_symlink(tree / "missing", tree / "dangling");
  std::error_code ec;
  remove_tree(tree, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(tree)));
  EXPECT_TRUE(std::filesystem::exists(outside / "kept.txt")) << "the link was followed";

  std::ofstream(dir.path() / "file.txt") << "z";
  remove_tree(dir.path() / "file.txt", ec);  // a file alone
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "file.txt"));
}

TEST(RemoveTree, AnAbsentPathIsNoErrorAndAnUnwalkableOneSaysWhy) {
  test::TempDir dir;
  std::error_code ec = std::make_error_code(std::errc::io_error);
  remove_tree(dir.path() / "never-made", ec);
  EXPECT_FALSE(ec) << ec.message();
  std::ofstream(dir.path() / "plain") << "p";
  remove_tree(dir.path() / "plain" / "below", ec);  // a file's path as a folder's
  EXPECT_EQ(ec, std::make_error_code(std::errc::not_a_directory)) << ec.message();
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "plain"));
}

}  // namespace
}  // namespace qwen3
