// A streaming safetensors writer (the format of safetensors.h): the tensors' names, dtypes and shapes are
// announced up front, which fixes the header and every offset; the payloads then follow in that order, in as
// many pieces as the caller likes, so no tensor is ever held whole. The header is padded with spaces to a
// multiple of 8 bytes, as the reference library writes it. The file is written under a temporary name and
// moved into place by commit() (durable_file.h); a writer destroyed before commit() leaves nothing.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace qwen3 {

struct SafetensorsSpec {
  std::string name;
  std::string dtype;  // "BF16", "F32", "U8", "F8_E4M3", ...
  std::vector<int64_t> shape;  // {} for a scalar
  uint64_t nbytes() const;
};

class SafetensorsWriter {
 public:
  // `metadata`: string to string ("format": "pt" is what transformers expects).
  SafetensorsWriter(const std::string& target, std::vector<SafetensorsSpec> tensors, const nlohmann::json& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next bytes of the payloads, in announced order; Error past the end of the last tensor.
  void write(const void* data, uint64_t n);
  // Error unless every announced byte was written; then fsync and rename into place.
  void commit();

 private:
  std::string target_, temp_;
  FILE* file_ = nullptr;
  uint64_t expected_ = 0, written_ = 0;
};

}  // namespace qwen3
