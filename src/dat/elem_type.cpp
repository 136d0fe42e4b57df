// Element types, header encoding and the small validity helpers shared by the reader and the writer.
#include <string>

#include "qwen3/dat/dat.h"
#include "qwen3/dat/leb128.h"

namespace qwen3 {
namespace {

struct ElemInfo {
  ElemType type;
  size_t size;
  const char* name;
};

constexpr ElemInfo kElemTypes[] = {
    {ElemType::UInt8, 1, "uint8"},       {ElemType::Int8, 1, "int8"},
    {ElemType::Int16, 2, "int16"},       {ElemType::Int32, 4, "int32"},
    {ElemType::Int64, 8, "int64"},       {ElemType::Float16, 2, "float16"},
    {ElemType::Float32, 4, "float32"},   {ElemType::Float64, 8, "float64"},
    {ElemType::Bool, 1, "bool"},         {ElemType::BFloat16, 2, "bfloat16"},
    {ElemType::Float4E2M1x2, 1, "float4_e2m1fn_x2"}, {ElemType::Float8E4M3, 1, "float8_e4m3fn"},
};

const ElemInfo* info(uint64_t id) {
  for (const auto& e : kElemTypes)
    if (static_cast<uint64_t>(e.type) == id) return &e;
  return nullptr;
}

}  // namespace

bool is_known_elem_type(uint64_t id) { return info(id) != nullptr; }

size_t elem_size(ElemType type) {
  const ElemInfo* e = info(static_cast<uint64_t>(type));
  if (!e) throw Error("unknown element type id " + std::to_string(static_cast<uint64_t>(type)));
  return e->size;
}

const char* elem_type_name(ElemType type) {
  const ElemInfo* e = info(static_cast<uint64_t>(type));
  return e ? e->name : "unknown";
}

ElemType elem_type_from_name(std::string_view name) {
  for (const auto& e : kElemTypes)
    if (name == e.name) return e.type;
  throw UsageError("unknown element type name '" + std::string(name) + "'");
}

uint64_t DatEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

uint64_t payload_bytes(ElemType type, const std::vector<int64_t>& shape) {
  uint64_t n = elem_size(type);
  for (int64_t d : shape) {
    if (d < 0) throw DatError("negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      throw DatError("shape byte count overflows 64 bits");
  }
  return n;
}

std::vector<uint8_t> encode_entry_header(std::string_view key, ElemType type, const std::vector<int64_t>& shape) {
  std::vector<uint8_t> out;
  out.reserve(key.size() + 16 + 10 * shape.size());
  uint8_t tmp[leb128::kMaxBytes];
  auto put = [&](uint64_t v) {
    size_t n = leb128::encode(v, tmp);
    out.insert(out.end(), tmp, tmp + n);
  };
  put(key.size());
  out.insert(out.end(), key.begin(), key.end());
  put(static_cast<uint64_t>(type));
  put(shape.size());
  for (int64_t d : shape) put(static_cast<uint64_t>(d));
  return out;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points beyond U+10FFFF are not UTF-8.
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace qwen3
