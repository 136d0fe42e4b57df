// DatWriter: streams entries into a temporary file beside the target and renames it into place only after
// every announced byte was written and fsynced, so a crash or a full disk never leaves a partial file under
// the target name.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "qwen3/dat/dat.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/dat/leb128.h"

namespace qwen3 {
namespace {

constexpr size_t kBufferBytes = 4 << 20;

std::string base_of(const std::string& path) {
  std::string copy = path;
  return ::basename(copy.data());
}

// Temporaries of `target` left by a writer that died (a killed export leaves tens of GB): each live writer holds
// an exclusive flock on its temporary, so one that can be locked now has no writer and is provably stale.
void remove_stale_temporaries(const std::string& dir, const std::string& base) {
  const std::string prefix = "." + base + ".tmp-";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());
    ::close(fd);
  }
  ::closedir(d);
}

}  // namespace

DatWriter::DatWriter(const std::string& target, uint64_t entry_count)
    : target_(target), entry_count_(entry_count), buffer_(kBufferBytes) {
  if (target.empty()) throw Error("output path is empty");
  const std::string dir = parent_folder(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(target + ": directory '" + dir + "' does not exist");
  remove_stale_temporaries(dir, base_of(target));
  std::string pattern = dir + "/." + base_of(target) + ".tmp-XXXXXX";
  fd_ = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (fd_ < 0) throw Error(target + ": cannot create a temporary file in '" + dir + "': " + std::strerror(errno));
  ::flock(fd_, LOCK_EX);  // held until the file is renamed or discarded: marks it as live for other writers
  temp_path_ = pattern;
  ::fchmod(fd_, new_file_mode());  // mkstemp creates 0600; a weight file is as readable as any other output
  uint8_t tmp[leb128::kMaxBytes];
  const size_t n = leb128::encode(entry_count, tmp);
  write_raw(tmp, n);
}

DatWriter::~DatWriter() {
  if (!committed_) discard();
}

void DatWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void DatWriter::check_entry_complete() const {
  if (payload_left_ != 0)
    throw Error(target_ + ": entry '" + current_key_ + "' is missing " + std::to_string(payload_left_) +
                " payload bytes");
}

void DatWriter::begin_entry(std::string_view key, ElemType type, const std::vector<int64_t>& shape) {
  check_entry_complete();
  if (entries_begun_ == entry_count_)
    throw Error(target_ + ": more entries than the " + std::to_string(entry_count_) + " announced (at '" +
                std::string(key) + "')");
  if (key.empty() || !is_valid_utf8(key)) throw Error(target_ + ": entry key is empty or not UTF-8");
  payload_left_ = payload_bytes(type, shape);
  current_key_ = std::string(key);
  const auto header = encode_entry_header(key, type, shape);
  write_raw(header.data(), header.size());
  ++entries_begun_;
}

void DatWriter::write_payload(const void* data, uint64_t n) {
  if (n > payload_left_)
    throw Error(target_ + ": entry '" + current_key_ + "' payload overrun: " + std::to_string(n) + " bytes given, " +
                std::to_string(payload_left_) + " owed");
  write_raw(data, static_cast<size_t>(n));
  payload_left_ -= n;
}

void DatWriter::write_entry(std::string_view key, ElemType type, const std::vector<int64_t>& shape,
                            const void* data, uint64_t nbytes) {
  begin_entry(key, type, shape);
  write_payload(data, nbytes);
  check_entry_complete();
}

void DatWriter::write_raw(const void* data, size_t n) {
  if (fd_ < 0) throw Error(target_ + ": writer is closed");
  const auto* p = static_cast<const uint8_t*>(data);
  if (buffered_ + n <= buffer_.size()) {
    std::memcpy(buffer_.data() + buffered_, p, n);
    buffered_ += n;
    return;
  }
  flush_buffer();
  if (n >= buffer_.size()) {  // large payloads skip the copy
    while (n > 0) {
      const ssize_t put = ::write(fd_, p, n);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) {
        const std::string why = put < 0 ? std::strerror(errno) : "no progress";
        discard();
        throw Error(target_ + ": write failed (" + why + "); nothing was written under that name");
      }
      p += put;
      n -= static_cast<size_t>(put);
    }
    return;
  }
  std::memcpy(buffer_.data(), p, n);
  buffered_ = n;
}

void DatWriter::flush_buffer() {
  size_t off = 0;
  while (off < buffered_) {
    const ssize_t put = ::write(fd_, buffer_.data() + off, buffered_ - off);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      const std::string why = put < 0 ? std::strerror(errno) : "no progress";
      discard();
      throw Error(target_ + ": write failed (" + why + "); nothing was written under that name");
    }
    off += static_cast<size_t>(put);
  }
  buffered_ = 0;
}

void DatWriter::commit() {
  if (committed_) return;
  check_entry_complete();
  if (entries_begun_ != entry_count_)
    throw Error(target_ + ": " + std::to_string(entries_begun_) + " entries written, " +
                std::to_string(entry_count_) + " announced");
  flush_buffer();
  if (::fsync(fd_) != 0) {
    const std::string why = std::strerror(errno);
    discard();
    throw Error(target_ + ": fsync failed (" + why + "); nothing was written under that name");
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(temp_path_.c_str(), target_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    discard();
    throw Error(target_ + ": cannot rename the finished file into place: " + why);
  }
  committed_ = true;
  fsync_path(parent_folder(target_), true);
}

void copy_dat_entry(const DatReader& in, const DatEntry& entry, DatWriter& out, std::vector<uint8_t>& buffer) {
  out.begin_entry(entry.key, entry.type, entry.shape);
  for (uint64_t off = 0; off < entry.nbytes; off += buffer.size()) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), entry.nbytes - off);
    in.read_range(entry, off, buffer.data(), n);
    out.write_payload(buffer.data(), n);
  }
}

}  // namespace qwen3
