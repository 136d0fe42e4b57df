// DatReader: indexes a `.dat` file by walking its headers and seeking past every payload, so opening a 3 GB
// file reads a few tens of kilobytes. Every header field is checked before it sizes anything.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "qwen3/dat/dat.h"
#include "qwen3/dat/leb128.h"

namespace qwen3 {
namespace {

// Sane bounds on header fields; every real file is far inside them.
constexpr uint64_t kMaxKeyBytes = 64 * 1024;
constexpr uint64_t kMaxDims = 16;
constexpr uint64_t kMaxDim = uint64_t{1} << 48;
// Headers are tens of bytes and each is followed by a payload we skip, so a window refill should be small.
constexpr uint64_t kWindowBytes = 4096;

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    // O_NONBLOCK: a FIFO without a writer would block the open (a run hung there, deaf to SIGTERM); on a regular
    // file it changes nothing.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw DatError(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      // A folder is no stream to save first: the advice is for pipes and devices only.
      if (S_ISDIR(st.st_mode)) throw DatError(path + ": is a directory, not a .dat file");
      const char* kind = S_ISFIFO(st.st_mode) ? "is a FIFO (a pipe), not a regular file"
                         : S_ISCHR(st.st_mode)  ? "is a character device, not a regular file"
                                                : "is not a regular file";
      throw DatError(path + ": " + kind + "; tensors are read at their offsets: save it to a file first");
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }
  void read_at(uint64_t offset, void* dst, uint64_t n) const override {
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
      const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw DatError(path_ + ": read error at byte " + std::to_string(offset) + ": " + std::strerror(errno));
      }
      if (got == 0)
        throw DatError(path_ + ": file ended at byte " + std::to_string(offset) + " (truncated or changed)");
      out += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::string name, const void* data, size_t size)
      : name_(std::move(name)), data_(static_cast<const uint8_t*>(data)), size_(size) {}
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void read_at(uint64_t offset, void* dst, uint64_t n) const override {
    if (offset > size_ || n > size_ - offset)
      throw DatError(name_ + ": read past the end at byte " + std::to_string(offset));
    if (n > 0) std::memcpy(dst, data_ + offset, n);  // dst may be null for an empty payload
  }

 private:
  std::string name_;
  const uint8_t* data_;
  size_t size_;
};

// Sequential header reading through a small window, refilled by read_at.
class HeaderCursor {
 public:
  explicit HeaderCursor(const ByteSource& src)
      : src_(src), buf_(static_cast<size_t>(std::min<uint64_t>(kWindowBytes, src.size()))) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return src_.size() - pos_; }
  void skip(uint64_t n) { pos_ += n; }  // callers check n <= remaining()

  // Returns the decoded value or sets *why and returns false.
  bool leb(uint64_t* value, const char** why) {
    fill(leb128::kMaxBytes);
    const size_t avail = static_cast<size_t>(std::min<uint64_t>(win_end_ - pos_, leb128::kMaxBytes));
    const auto d = leb128::decode(buf_.data() + (pos_ - win_start_), avail);
    if (d.status != leb128::DecodeStatus::ok) {
      *why = leb128::describe(d.status);
      return false;
    }
    pos_ += d.length;
    *value = d.value;
    return true;
  }

  void bytes(char* dst, size_t n) {  // callers check n <= remaining()
    if (n > buf_.size()) {  // only when the window is smaller than the key
      src_.read_at(pos_, dst, n);
      pos_ += n;
      return;
    }
    fill(n);
    std::memcpy(dst, buf_.data() + (pos_ - win_start_), n);
    pos_ += n;
  }

 private:
  // Makes [pos_, pos_ + min(want, remaining)) available in the window.
  void fill(size_t want) {
    const uint64_t need_end = pos_ + std::min<uint64_t>(want, remaining());
    if (pos_ >= win_start_ && need_end <= win_end_) return;
    const uint64_t len = std::min<uint64_t>(buf_.size(), remaining());
    src_.read_at(pos_, buf_.data(), len);
    win_start_ = pos_;
    win_end_ = pos_ + len;
  }

  const ByteSource& src_;
  std::vector<uint8_t> buf_;
  uint64_t pos_ = 0;
  uint64_t win_start_ = 0;
  uint64_t win_end_ = 0;
};

std::string where(const ByteSource& src, uint64_t index, const std::string& key, uint64_t offset) {
  std::string s = src.name() + ": entry " + std::to_string(index);
  if (!key.empty()) s += " '" + key + "'";
  return s + " (header at byte " + std::to_string(offset) + "): ";
}

// A safetensors file starts with its JSON header's length (8 bytes, little-endian) and then '{': given where a
// .dat is expected (a Hugging Face folder's model.safetensors), it is named as what it is.
bool looks_like_safetensors(const ByteSource& src) {
  if (src.size() < 10) return false;
  uint8_t head[9];
  src.read_at(0, head, sizeof head);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | head[i];
  return head[8] == '{' && length >= 2 && length <= src.size() - 8;
}

std::vector<DatEntry> parse_index(const ByteSource& src) {
  HeaderCursor cur(src);
  const char* why = nullptr;
  uint64_t count = 0;
  if (src.size() == 0) throw DatError(src.name() + ": empty file (no entry count)");
  if (looks_like_safetensors(src))
    throw DatError(src.name() + ": a safetensors file (Hugging Face), not a .dat: convert the model's folder once "
                   "with `qwen3-train convert --hf-dir FOLDER --out FOLDER/model.dat --nvfp4` (docs/export.md), then "
                   "give that .dat");
  if (!cur.leb(&count, &why)) throw DatError(src.name() + ": entry count at byte 0: " + why);
  // Each entry needs at least 4 header bytes, which bounds a corrupt count before anything is reserved.
  if (count > cur.remaining() / 4 + 1)
    throw DatError(src.name() + ": entry count " + std::to_string(count) + " cannot fit in " +
                   std::to_string(src.size()) + " bytes");
  std::vector<DatEntry> entries;
  entries.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    DatEntry e;
    e.header_offset = cur.pos();
    auto fail = [&](const std::string& what) { return DatError(where(src, i, e.key, e.header_offset) + what); };
    uint64_t key_len = 0;
    if (cur.remaining() == 0)
      throw fail("file ends before this entry (" + std::to_string(count) + " entries announced)");
    if (!cur.leb(&key_len, &why)) throw fail(std::string("key length: ") + why);
    if (key_len == 0) throw fail("empty key");
    if (key_len > kMaxKeyBytes || key_len > cur.remaining())
      throw fail("key length " + std::to_string(key_len) + " exceeds the file or the " +
                 std::to_string(kMaxKeyBytes) + "-byte bound");
    e.key.resize(static_cast<size_t>(key_len));
    cur.bytes(e.key.data(), e.key.size());
    if (!is_valid_utf8(e.key)) {
      e.key.clear();  // don't print invalid bytes
      throw fail("key is not valid UTF-8");
    }
    uint64_t type_id = 0, ndim = 0;
    if (!cur.leb(&type_id, &why)) throw fail(std::string("element type: ") + why);
    if (!is_known_elem_type(type_id)) throw fail("unknown element type " + std::to_string(type_id));
    e.type = static_cast<ElemType>(type_id);
    if (!cur.leb(&ndim, &why)) throw fail(std::string("rank: ") + why);
    if (ndim > kMaxDims) throw fail("rank " + std::to_string(ndim) + " exceeds " + std::to_string(kMaxDims));
    e.shape.resize(static_cast<size_t>(ndim));
    for (auto& d : e.shape) {
      uint64_t dim = 0;
      if (!cur.leb(&dim, &why)) throw fail(std::string("dimension: ") + why);
      if (dim > kMaxDim) throw fail("dimension " + std::to_string(dim) + " exceeds 2^48");
      d = static_cast<int64_t>(dim);
    }
    try {
      e.nbytes = payload_bytes(e.type, e.shape);
    } catch (const DatError& err) {
      throw fail(err.what());
    }
    e.payload_offset = cur.pos();
    if (e.nbytes > cur.remaining())
      throw fail("payload of " + std::to_string(e.nbytes) + " bytes at byte " + std::to_string(e.payload_offset) +
                 " runs past the end of the file (" + std::to_string(cur.remaining()) + " bytes left)");
    cur.skip(e.nbytes);
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace

std::unique_ptr<ByteSource> open_file_source(const std::string& path) { return std::make_unique<FileSource>(path); }

std::unique_ptr<ByteSource> memory_source(std::string name, const void* data, size_t size) {
  return std::make_unique<MemorySource>(std::move(name), data, size);
}

DatReader::DatReader(const std::string& path, DatRules rules) : DatReader(open_file_source(path), rules) {}

DatReader::DatReader(std::unique_ptr<ByteSource> source, DatRules rules) : source_(std::move(source)) {
  try {
    entries_ = parse_index(*source_);
  } catch (const DatError& e) {
    // A .dat whose index does not parse and whose first byte is '{' is most likely a JSON file given for one (a
    // config.json as --weights): say so beside what the parse found. ('{' alone proves nothing: it is also the
    // entry count of a 123-entry file.)
    unsigned char first = 0;
    if (source_->size() > 0) source_->read_at(0, &first, 1);
    if (first != '{') throw;
    throw DatError(std::string(e.what()) +
                   " (it starts with '{': a JSON file, such as a config.json, given for a .dat?)");
  }
  index_.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto& e = entries_[i];
    if (!index_.emplace(e.key, i).second) {
      const auto& first = entries_[index_.at(e.key)];
      throw DatError(where(*source_, i, e.key, e.header_offset) + "duplicate key (first at byte " +
                     std::to_string(first.header_offset) + ")");
    }
  }
  if (rules == DatRules::model_file) validate_nvfp4_pairs(entries_, source_->name());
}

DatReader::~DatReader() = default;
DatReader::DatReader(DatReader&&) noexcept = default;
DatReader& DatReader::operator=(DatReader&&) noexcept = default;

const DatEntry* DatReader::find(std::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const DatEntry& DatReader::at(std::string_view key) const {
  const DatEntry* e = find(key);
  if (!e) throw DatError(source_->name() + ": no entry '" + std::string(key) + "'");
  return *e;
}

uint64_t DatReader::file_size() const { return source_->size(); }
const std::string& DatReader::path() const { return source_->name(); }

void DatReader::read(const DatEntry& entry, void* dst, uint64_t dst_bytes) const {
  if (dst_bytes != entry.nbytes)
    throw Error(source_->name() + ": entry '" + entry.key + "' has " + std::to_string(entry.nbytes) +
                " payload bytes, the destination " + std::to_string(dst_bytes));
  source_->read_at(entry.payload_offset, dst, entry.nbytes);
}

void DatReader::read_range(const DatEntry& entry, uint64_t offset, void* dst, uint64_t n) const {
  if (offset > entry.nbytes || n > entry.nbytes - offset)
    throw Error(source_->name() + ": range [" + std::to_string(offset) + ", +" + std::to_string(n) +
                ") is outside entry '" + entry.key + "' (" + std::to_string(entry.nbytes) + " bytes)");
  source_->read_at(entry.payload_offset + offset, dst, n);
}

void validate_nvfp4_pairs(const std::vector<DatEntry>& entries, const std::string& source_name) {
  std::unordered_map<std::string_view, const DatEntry*> by_key;
  by_key.reserve(entries.size());
  for (const auto& e : entries) by_key.emplace(e.key, &e);
  auto fail = [&](const DatEntry& e, const std::string& what) {
    return DatError(source_name + ": entry '" + e.key + "' (header at byte " + std::to_string(e.header_offset) +
                    "): " + what);
  };
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  for (const auto& e : entries) {
    if (ends_with(e.key, kQdataSuffix)) {
      const std::string base = e.key.substr(0, e.key.size() - kQdataSuffix.size());
      if (e.type != ElemType::UInt8 && e.type != ElemType::Float4E2M1x2)
        throw fail(e, std::string("NVFP4 codes must be uint8 or float4_e2m1fn_x2, not ") + elem_type_name(e.type));
      if (e.shape.size() != 2) throw fail(e, "NVFP4 codes must be 2-D, shape is " + shape_str(e.shape));
      if ((2 * e.shape[1]) % 16 != 0)
        throw fail(e, "NVFP4 codes " + shape_str(e.shape) + ": unpacked columns " + std::to_string(2 * e.shape[1]) +
                          " are not a multiple of 16");
      auto it = by_key.find(base + std::string(kScaleSuffix));
      if (it == by_key.end()) throw fail(e, "NVFP4 codes without their scale entry '" + base + ".scale'");
      const DatEntry& s = *it->second;
      if (s.type != ElemType::Float8E4M3 && s.type != ElemType::Float16 && s.type != ElemType::Float32)
        throw fail(s, std::string("NVFP4 scales must be float8_e4m3fn, float16 or float32, not ") +
                          elem_type_name(s.type));
      const std::vector<int64_t> want{e.shape[0], 2 * e.shape[1] / 16};
      if (s.shape != want)
        throw fail(s, "scale shape " + shape_str(s.shape) + " does not match codes " + shape_str(e.shape) +
                          " (expected " + shape_str(want) + ")");
    } else if (ends_with(e.key, kScaleSuffix)) {
      const std::string base = e.key.substr(0, e.key.size() - kScaleSuffix.size());
      if (by_key.find(base + std::string(kQdataSuffix)) == by_key.end())
        throw fail(e, "NVFP4 scale without its codes entry '" + base + ".qdata'");
    }
  }
}

}  // namespace qwen3
