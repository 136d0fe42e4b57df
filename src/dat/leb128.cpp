#include "qwen3/dat/leb128.h"

namespace qwen3::leb128 {

size_t encode(uint64_t value, uint8_t* out) {
  size_t n = 0;
  do {
    uint8_t byte = value & 0x7F;
    value >>= 7;
    if (value != 0) byte |= 0x80;
    out[n++] = byte;
  } while (value != 0);
  return n;
}

Decoded decode(const uint8_t* data, size_t available) {
  uint64_t value = 0;
  for (size_t i = 0; i < kMaxBytes; ++i) {
    if (i >= available) return {DecodeStatus::truncated, 0, 0};
    const uint64_t group = data[i] & 0x7F;
    // The tenth group holds bit 63 only; anything above it does not fit in 64 bits.
    if (i == kMaxBytes - 1 && group > 1) return {DecodeStatus::overflow, 0, 0};
    value |= group << (7 * i);
    if ((data[i] & 0x80) == 0) return {DecodeStatus::ok, value, i + 1};
  }
  return {DecodeStatus::too_long, 0, 0};
}

const char* describe(DecodeStatus status) {
  switch (status) {
    case DecodeStatus::ok: return "ok";
    case DecodeStatus::truncated: return "truncated LEB128 integer (file ends inside it)";
    case DecodeStatus::too_long: return "LEB128 integer longer than 10 bytes";
    case DecodeStatus::overflow: return "LEB128 integer overflows 64 bits";
  }
  return "unknown LEB128 status";
}

}  // namespace qwen3::leb128
