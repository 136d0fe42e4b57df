#include "qwen3/convert/safetensors_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "qwen3/base/error.h"
#include "qwen3/convert/safetensors.h"
#include "qwen3/dat/durable_file.h"

namespace qwen3 {

uint64_t SafetensorsSpec::nbytes() const {
  uint64_t n = safetensors_dtype_size(dtype);
  if (n == 0) throw Error("safetensors: dtype '" + dtype + "' has no whole-byte size");
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsWriter::SafetensorsWriter(const std::string& target, std::vector<SafetensorsSpec> tensors,
                                     const nlohmann::json& metadata)
    : target_(target), temp_(parent_folder(target) + "/." + target.substr(target.rfind('/') + 1) + ".tmp-" +
                             std::to_string(::getpid())) {
  // Keys of a JSON object are sorted on output; the offsets, not the key order, say where each tensor is.
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsSpec& t : tensors) {
    const uint64_t n = t.nbytes();
    if (header.contains(t.name)) throw Error("safetensors: tensor '" + t.name + "' announced twice");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {expected_, expected_ + n}}};
    expected_ += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  file_ = std::fopen(temp_.c_str(), "wb");
  if (!file_) throw Error(target_ + ": cannot create (" + std::strerror(errno) + ")");
  const uint64_t length = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(length >> (8 * i));
  if (std::fwrite(le, 1, 8, file_) != 8 || std::fwrite(text.data(), 1, text.size(), file_) != text.size())
    throw Error(target_ + ": cannot write (" + std::strerror(errno) + ")");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(temp_.c_str());
  }
}

void SafetensorsWriter::write(const void* data, uint64_t n) {
  if (written_ + n > expected_)
    throw Error(target_ + ": " + std::to_string(written_ + n - expected_) + " bytes more than the tensors announced");
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) throw Error(target_ + ": cannot write (" + std::strerror(errno) + ")");
  written_ += n;
}

void SafetensorsWriter::commit() {
  if (written_ != expected_)
    throw Error(target_ + ": " + std::to_string(expected_ - written_) + " announced payload bytes were not written");
  const bool flushed = std::fflush(file_) == 0;
  const int err = errno;
  std::fclose(file_);
  file_ = nullptr;
  if (!flushed) {
    std::remove(temp_.c_str());
    throw Error(target_ + ": cannot write (" + std::strerror(err) + ")");
  }
  move_into_place(temp_, target_);
}

}  // namespace qwen3
