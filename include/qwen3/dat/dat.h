// The `.dat` weight container (docs/dat.md): a streaming reader that
// indexes headers only and reads payloads on demand, and an atomic streaming writer.
// No libtorch here: dat_tensor.h adds the tensor conversions.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qwen3/base/error.h"

// Payloads are little-endian and are copied into tensors byte for byte (x86-64 and aarch64 Linux are both
// little-endian); a big-endian host would read every number wrong, so it does not compile.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .dat code assumes a little-endian host");

namespace qwen3 {

enum class ElemType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  Int16 = 2,
  Int32 = 3,
  Int64 = 4,
  Float16 = 5,
  Float32 = 6,
  Float64 = 7,
  Bool = 11,
  BFloat16 = 15,
  Float4E2M1x2 = 100,  // two FP4 codes a byte: NVFP4 packed codes
  Float8E4M3 = 101,    // NVFP4 block scales
};

bool is_known_elem_type(uint64_t id);
size_t elem_size(ElemType type);
const char* elem_type_name(ElemType type);  // "uint8", "float16", "float4_e2m1fn_x2", ...
// Parses a name as printed by elem_type_name; throws UsageError for anything else.
ElemType elem_type_from_name(std::string_view name);

// A malformed file. The message already names the file, the entry (index and key when known) and the byte offset.
class DatError : public Error {
 public:
  using Error::Error;
};

struct DatEntry {
  std::string key;
  ElemType type = ElemType::UInt8;
  std::vector<int64_t> shape;
  uint64_t header_offset = 0;   // where the entry's key length starts
  uint64_t payload_offset = 0;  // where its payload starts
  uint64_t nbytes = 0;          // payload bytes
  uint64_t numel() const;
};

// The NVFP4 pair naming of dat-format.md: "NAME.weight.qdata" + "NAME.weight.scale".
constexpr std::string_view kQdataSuffix = ".qdata";
constexpr std::string_view kScaleSuffix = ".scale";
bool ends_with(std::string_view s, std::string_view suffix);

// Where bytes come from: a file (pread, so a file that shrinks under us is an error, not a SIGBUS as with mmap)
// or a memory buffer (tests, fuzzing).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly n bytes at offset or throws DatError (short file, I/O error).
  virtual void read_at(uint64_t offset, void* dst, uint64_t n) const = 0;
  virtual const std::string& name() const = 0;
};

std::unique_ptr<ByteSource> open_file_source(const std::string& path);
std::unique_ptr<ByteSource> memory_source(std::string name, const void* data, size_t size);

// Model files must also satisfy the NVFP4 pair rules; the project's own containers (checkpoints) use the
// format for arbitrary names and skip them.
enum class DatRules { model_file, container_only };

class DatReader {
 public:
  // Indexes the file (headers only) and validates it: every rule of dat-format.md "What readers must do".
  explicit DatReader(const std::string& path, DatRules rules = DatRules::model_file);
  explicit DatReader(std::unique_ptr<ByteSource> source, DatRules rules = DatRules::model_file);
  ~DatReader();
  DatReader(DatReader&&) noexcept;
  DatReader& operator=(DatReader&&) noexcept;

  const std::vector<DatEntry>& entries() const { return entries_; }
  const DatEntry* find(std::string_view key) const;
  const DatEntry& at(std::string_view key) const;  // throws DatError naming the key
  uint64_t file_size() const;
  const std::string& path() const;

  // Reads the whole payload; dst_bytes must equal entry.nbytes.
  void read(const DatEntry& entry, void* dst, uint64_t dst_bytes) const;
  // Reads payload bytes [offset, offset + n) of the entry: for streaming a payload in pieces.
  void read_range(const DatEntry& entry, uint64_t offset, void* dst, uint64_t n) const;

 private:
  std::unique_ptr<ByteSource> source_;
  std::vector<DatEntry> entries_;
  std::unordered_map<std::string_view, size_t> index_;  // views into entries_[i].key
};

// Checks NVFP4 pairs: each qdata has its scale and the reverse, element types, shapes agree
// (scale == [qdata.rows, 2 * qdata.cols / 16]). Throws DatError naming the key and offset.
void validate_nvfp4_pairs(const std::vector<DatEntry>& entries, const std::string& source_name);

// Streams entries to `target` atomically: everything goes to a temporary file in the target's directory,
// which commit() fsyncs and renames over the target. If commit() is not reached (an exception, a write
// error, a full disk), the temporary file is removed and nothing exists under the target name that was not
// there before.
class DatWriter {
 public:
  DatWriter(const std::string& target, uint64_t entry_count);
  ~DatWriter();
  DatWriter(const DatWriter&) = delete;
  DatWriter& operator=(const DatWriter&) = delete;

  // Writes an entry's header; its payload (exactly numel * elem_size bytes) follows in one or more
  // write_payload calls.
  void begin_entry(std::string_view key, ElemType type, const std::vector<int64_t>& shape);
  void write_payload(const void* data, uint64_t n);
  void write_entry(std::string_view key, ElemType type, const std::vector<int64_t>& shape, const void* data,
                   uint64_t nbytes);
  // Checks that every announced entry and payload byte was written, then fsync + rename.
  void commit();

  const std::string& target() const { return target_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void write_raw(const void* data, size_t n);
  void flush_buffer();
  void check_entry_complete() const;
  void discard() noexcept;

  std::string target_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t entry_count_ = 0;
  uint64_t entries_begun_ = 0;
  uint64_t payload_left_ = 0;  // bytes still owed by the current entry
  std::string current_key_;
  std::vector<uint8_t> buffer_;
  size_t buffered_ = 0;
  bool committed_ = false;
};

// Copies one entry from `in` to `out` byte for byte (header re-encoded minimally), its payload streamed through
// `buffer` in pieces of the buffer's (non-zero) size.
void copy_dat_entry(const DatReader& in, const DatEntry& entry, DatWriter& out, std::vector<uint8_t>& buffer);

// Header bytes of one entry, minimal LEB128: shared by the writer and tools that build files by hand.
std::vector<uint8_t> encode_entry_header(std::string_view key, ElemType type, const std::vector<int64_t>& shape);

// Byte count of a payload, or throws DatError if it overflows 64 bits.
uint64_t payload_bytes(ElemType type, const std::vector<int64_t>& shape);

bool is_valid_utf8(std::string_view s);

}  // namespace qwen3
