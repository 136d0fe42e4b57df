// Hugging Face safetensors files, read the way the `.dat` reader reads: the header is parsed and validated up
// front (as strictly as the reference `safetensors` library, plus duplicate names), payloads are read on demand
// with pread, never the whole shard. Format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the data;
// offsets are relative to the data section, which the tensors cover exactly, back to back.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qwen3/dat/dat.h"

namespace qwen3 {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as written: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t offset = 0;         // absolute file offset of the first byte
  uint64_t nbytes = 0;
  uint64_t numel() const;
};

// Bytes per element of a safetensors dtype name; 0 for a name the format does not define (or a sub-byte one).
size_t safetensors_dtype_size(std::string_view dtype);

class SafetensorsFile {
 public:
  // Throws Error naming the file (and the tensor) for any malformed header.
  explicit SafetensorsFile(const std::string& path);
  explicit SafetensorsFile(std::unique_ptr<ByteSource> source);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const;
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data order
  const SafetensorsTensor* find(std::string_view name) const;
  // Payload bytes [offset, offset + n) of a tensor.
  void read_range(const SafetensorsTensor& t, uint64_t offset, void* dst, uint64_t n) const;

 private:
  void parse_header();

  std::unique_ptr<ByteSource> source_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace qwen3
