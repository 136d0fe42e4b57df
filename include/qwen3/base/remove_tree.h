// Removing a folder and what it holds: what std::filesystem::remove_all does, through glibc's nftw instead.
// PyTorch's wheels export their own copies of parts of libstdc++'s std::filesystem (pytorch/pytorch#133437),
// and a program whose calls bind to them gets whatever those copies are: in the third GPU round (2026-11-27,
// PyTorch 2.11 wheel) every test process died at its first remove_all, by a call through a null pointer from
// libtorch.so's copy (the second round's died at the same place before the crash report could name it). The
// program's libraries name libstdc++ first (cmake/Dependencies.cmake) so
// that the copies serve nothing; removal, which checkpoints, exports and --overwrite rely on, does not depend
// on that: nftw is the C library's, which nothing else exports.
#pragma once
#include <ftw.h>
#include <stdio.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace qwen3 {

// Removes `path` and, where it is a folder, everything under it, deepest first; symbolic links are removed,
// never followed (a link to a folder elsewhere leaves that folder as it is). A path that is not there is no
// error. On the first entry that cannot be removed it stops and sets `ec` (what is left stays); else clears it.
inline void remove_tree(const std::filesystem::path& path, std::error_code& ec) {
  ec.clear();
  const int result = ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) -> int {
        return ::remove(entry) == 0 ? 0 : (errno != 0 ? errno : EIO);
      },
      /*nopenfd=*/32, FTW_DEPTH | FTW_PHYS);
  if (result == 0) return;
  const int err = result > 0 ? result : errno;  // > 0: the callback's errno; -1: nftw's own, in errno
  if (result < 0 && err == ENOENT) return;      // nothing there to remove
  ec = std::error_code(err, std::generic_category());
}

}  // namespace qwen3
