// Opening the files a user names: one message shape everywhere, `WHAT PATH: cannot open (REASON)`, with the OS's
// reason ("No such file or directory", "Permission denied"), a directory named as one (an ifstream opens a
// directory on Linux and then reads nothing, which surfaced as "not valid JSON" or an empty file), and a FIFO or
// device refused as one before it is opened.
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

// What a path that is not a regular file is, in words ("" for a regular file or one that is not there).
inline std::string special_file_kind(const struct stat& info) {
  if (S_ISREG(info.st_mode)) return {};
  if (S_ISDIR(info.st_mode)) return "a directory";
  if (S_ISFIFO(info.st_mode)) return "a FIFO (a pipe)";
  if (S_ISCHR(info.st_mode)) return "a character device";
  if (S_ISBLK(info.st_mode)) return "a block device";
  if (S_ISSOCK(info.st_mode)) return "a socket";
  return "not a regular file";
}

// Error when `path` is anything but a regular file: opening a FIFO without a writer blocks (a run waited there,
// deaf to SIGTERM), a device or a pipe can be read only once while inputs are read twice (their content hash,
// then their records), and /dev/zero never ends. stat() itself never blocks.
inline void refuse_special_input(const std::string& path, const std::string& what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return;  // opening names what is wrong
  const std::string kind = special_file_kind(info);
  if (kind == "a directory") throw Error(what + " " + path + ": is a directory, not a file");
  if (!kind.empty())
    throw Error(what + " " + path + ": is " + kind + ", not a regular file; inputs are read more than once "
                "(hashed, then parsed): save it to a file first");
}

inline std::ifstream open_input_file(const std::string& path, const std::string& what,
                                     std::ios::openmode mode = std::ios::in) {
  refuse_special_input(path, what);
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
