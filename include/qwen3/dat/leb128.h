// Unsigned LEB128, the integer encoding of every `.dat` header field (dat-format.md): 7 bits a byte, least
// significant group first, high bit set while more bytes follow.
#pragma once
#include <cstddef>
#include <cstdint>

namespace qwen3::leb128 {

constexpr size_t kMaxBytes = 10;  // 64 bits need at most ceil(64/7) = 10 groups

// Writes the minimal encoding of `value` to `out` (room for kMaxBytes); returns the number of bytes written.
size_t encode(uint64_t value, uint8_t* out);

enum class DecodeStatus { ok, truncated, too_long, overflow };

struct Decoded {
  DecodeStatus status;
  uint64_t value;
  size_t length;  // bytes consumed when ok
};

// Decodes from `data[0 .. available)`. Rejects more than kMaxBytes bytes and values above 2^64 - 1.
Decoded decode(const uint8_t* data, size_t available);

const char* describe(DecodeStatus status);

}  // namespace qwen3::leb128
