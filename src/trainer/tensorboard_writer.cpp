// TensorBoard event files (tensorboard_writer.h): TFRecord framing, CRC-32C, and the few protocol-buffer fields of
// tensorflow.Event / Summary / Summary.Value they need.
#include "tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "qwen3/base/error.h"

namespace qwen3 {
namespace {

// The reflected CRC-32C table (polynomial 0x1EDC6F41, reversed 0x82F63B78).
const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol-buffer wire format: varints, and fields by number and wire type.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
void bytes_field(std::string& out, int field, const std::string& bytes) {
  tag(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}
template <typename T>
void fixed_field(std::string& out, int field, T value) {  // double (wire type 1) or float (wire type 5)
  tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(raw, sizeof(T));
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (Summary).
std::string event(double wall_time, int64_t step) {
  std::string e;
  fixed_field(e, 1, wall_time);
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "host";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& table = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("--tensorboard " + dir + ": cannot create the folder (" + ec.message() + ")");
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                                         std::to_string(::getpid()) + ".qwen3-train"))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error("--tensorboard: cannot write " + path_);
  std::string first = event(static_cast<double>(seconds), 0);
  bytes_field(first, 3, "brain.Event:2");
  write_record(first);
}

void TensorBoardWriter::add_scalars(int64_t step, double wall_time,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  // Summary: repeated Value value = 1; Value: tag = 1 (string), simple_value = 2 (float).
  std::string summary;
  for (const auto& [name, value] : scalars) {
    std::string v;
    bytes_field(v, 1, name);
    fixed_field(v, 2, static_cast<float>(value));
    bytes_field(summary, 1, v);
  }
  std::string e = event(wall_time, step);
  bytes_field(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::add_session_start(int64_t step, double wall_time) {
  // Event.session_log = 7 (SessionLog: status = 1, START = 1).
  std::string log;
  tag(log, 1, 0);
  varint(log, 1);
  std::string e = event(wall_time, step);
  bytes_field(e, 7, log);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  const uint64_t length = event.size();
  char header[12];
  std::memcpy(header, &length, 8);
  const uint32_t length_crc = masked_crc32c(crc32c(header, 8));
  std::memcpy(header + 8, &length_crc, 4);
  const uint32_t data_crc = masked_crc32c(crc32c(event.data(), event.size()));
  out_.write(header, sizeof header);
  out_.write(event.data(), static_cast<std::streamsize>(event.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  out_.flush();
  if (!out_) throw Error(path_ + ": write failed (TensorBoard events; the device may be full)");
}

}  // namespace qwen3
