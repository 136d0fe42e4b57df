#include "qwen3/export/output_target.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "qwen3/base/error.h"

namespace qwen3 {
namespace {

namespace fs = std::filesystem;

fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

bool inside(const fs::path& child, const fs::path& dir) {
  auto c = child.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++c)
    if (c == child.end() || *c != *d) return false;
  return true;
}

}  // namespace

void refuse_input_as_output(std::string_view flag, const std::string& out, const std::vector<std::string>& input_files,
                            const std::vector<std::string>& input_dirs) {
  const std::string name(flag);
  const fs::path target = resolved(out);
  std::error_code ec;
  for (const std::string& in : input_files) {
    if (in.empty()) continue;
    const bool same = resolved(in) == target || (fs::exists(in, ec) && fs::exists(out, ec) && fs::equivalent(in, out, ec));
    if (same) throw UsageError(name + " " + out + " is the input file " + in + " of this command; write somewhere else");
  }
  for (const std::string& dir : input_dirs) {
    if (dir.empty()) continue;
    if (inside(target, resolved(dir)))
      throw UsageError(name + " " + out + " is inside " + dir + ", which this command reads; write somewhere else");
  }
}

void prepare_output_target(std::string_view flag, const std::string& out, bool overwrite,
                         const std::vector<std::string>& input_files, const std::vector<std::string>& input_dirs) {
  refuse_input_as_output(flag, out, input_files, input_dirs);
  const std::string name(flag);
  std::error_code ec;
  if (fs::is_directory(out, ec)) throw UsageError(name + " " + out + " is a directory; give a file path");
  if (fs::exists(out, ec) && !overwrite)
    throw UsageError(name + " " + out + " exists; pass --overwrite to replace it (or choose another path)");
  prepare_output_folder(flag, out);
}

void prepare_output_folder(std::string_view flag, const std::string& out) {
  const std::string name(flag);
  std::error_code ec;
  if (fs::is_directory(out, ec)) throw UsageError(name + " " + out + " is a directory; give a file path");
  const fs::path folder = fs::absolute(out).parent_path();
  fs::create_directories(folder, ec);
  if (ec) throw Error(name + " " + out + ": cannot create its folder " + folder.string() + ": " + ec.message());
  if (::access(folder.c_str(), W_OK) != 0)
    throw Error(name + " " + out + ": its folder " + folder.string() + " is not writable: " + std::strerror(errno));
}

}  // namespace qwen3
