#include "qwen3/dat/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "qwen3/base/error.h"

namespace qwen3 {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open to sync (" + std::strerror(errno) + ")");
  const int rc = ::fsync(fd);
  const int why = errno;
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed (" + std::strerror(why) + ")");
}

std::string parent_folder(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

unsigned new_file_mode() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Umask:", 0) == 0) return 0666u & ~static_cast<unsigned>(std::stoul(line.substr(6), nullptr, 8));
  return 0644u;
}

void move_into_place(const std::string& temp, const std::string& target) {
  try {
    fsync_path(temp, false);
    if (::rename(temp.c_str(), target.c_str()) != 0)
      throw Error(target + ": cannot rename the finished file into place (" + std::strerror(errno) + ")");
  } catch (...) {
    std::remove(temp.c_str());
    throw;
  }
  fsync_path(parent_folder(target), true);
}

void write_file_durably(const std::string& target, std::string_view content) {
  const std::string folder = parent_folder(target);
  const std::string name = target.substr(target.find_last_of('/') == std::string::npos ? 0 : target.find_last_of('/') + 1);
  const std::string temp = folder + "/." + name + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(target + ": cannot write (" + std::strerror(errno) + ")");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::remove(temp.c_str());
      throw Error(target + ": write failed (" + why + "); nothing was written under that name");
    }
  }
  move_into_place(temp, target);
}

}  // namespace qwen3
