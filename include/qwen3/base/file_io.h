// Opening the files a user names: one message shape everywhere, `WHAT PATH: cannot open (REASON)`, with the OS's
// reason ("No such file or directory", "Permission denied") and a directory named as one (an ifstream opens a
// directory on Linux and then reads nothing, which surfaced as "not valid JSON" or an empty file).
#pragma once
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "qwen3/base/error.h"

namespace qwen3 {

// Error when `path` names a directory (an fstream would open it and then read or write nothing).
inline void refuse_directory(const std::string& path, const std::string& what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    throw Error(what + " " + path + ": is a directory, not a file");
}

inline std::ifstream open_input_file(const std::string& path, const std::string& what,
                                     std::ios::openmode mode = std::ios::in) {
  refuse_directory(path, what);
  std::ifstream in(path, mode);
  if (!in) throw Error(what + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  return in;
}

inline std::ofstream open_output_file(const std::string& path, const std::string& what,
                                      std::ios::openmode mode = std::ios::out) {
  refuse_directory(path, what);
  std::ofstream out(path, mode);
  if (!out) throw Error(what + " " + path + ": cannot open for writing (" + std::strerror(errno) + ")");
  return out;
}

}  // namespace qwen3
