#include "qwen3/convert/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>

#include "qwen3/base/json_limits.h"

namespace qwen3 {
namespace {

// The reference library's bound (safetensors MAX_HEADER_SIZE): a larger length is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeSize {
  std::string_view name;
  size_t bytes;
};
constexpr DtypeSize kDtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                 {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                 {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};

uint64_t to_u64(const nlohmann::json& v, const std::string& what) {
  if (!v.is_number_unsigned()) throw Error(what + " is not a non-negative integer: " + json_excerpt(v));
  return v.get<uint64_t>();
}

}  // namespace

size_t safetensors_dtype_size(std::string_view dtype) {
  for (const auto& d : kDtypes)
    if (d.name == dtype) return d.bytes;
  return 0;
}

uint64_t SafetensorsTensor::numel() const {
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : SafetensorsFile(open_file_source(path)) {}

SafetensorsFile::SafetensorsFile(std::unique_ptr<ByteSource> source) : source_(std::move(source)) { parse_header(); }

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const std::string& SafetensorsFile::path() const { return source_->name(); }

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_range(const SafetensorsTensor& t, uint64_t offset, void* dst, uint64_t n) const {
  if (offset > t.nbytes || n > t.nbytes - offset)
    throw Error(path() + ": tensor '" + t.name + "': read past its " + std::to_string(t.nbytes) + " bytes");
  source_->read_at(t.offset + offset, dst, n);
}

void SafetensorsFile::parse_header() {
  const std::string& file = path();
  const uint64_t size = source_->size();
  if (size < 8) throw Error(file + ": not a safetensors file (" + std::to_string(size) + " bytes, under the 8-byte header length)");
  uint8_t len_bytes[8];
  source_->read_at(0, len_bytes, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    throw Error(file + ": safetensors header length " + std::to_string(header_len) + " exceeds the 100 MB bound");
  if (header_len > size - 8)
    throw Error(file + ": safetensors header length " + std::to_string(header_len) + " runs past the end of the " +
                std::to_string(size) + "-byte file");
  std::string text(static_cast<size_t>(header_len), '\0');
  source_->read_at(8, text.data(), header_len);
  if (text.empty() || text[0] != '{') throw Error(file + ": safetensors header does not start with '{'");

  // nlohmann keeps the last of duplicate keys silently; a duplicate tensor name is an error here, as in `.dat`.
  std::set<std::string> names;
  std::string duplicate;
  const auto note_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, depth_limited(file, note_keys));
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": safetensors header is not valid JSON: " + json_error_text(e));
  }
  if (!duplicate.empty()) throw Error(file + ": safetensors header names tensor '" + duplicate + "' twice");
  if (!header.is_object()) throw Error(file + ": safetensors header is not a JSON object");

  const uint64_t data_start = 8 + header_len, data_bytes = size - data_start;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) relative to the data section, per tensor
  for (auto& [name, info] : header.items()) {
    const std::string where = file + ": tensor '" + name + "': ";
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(file + ": __metadata__ is not a JSON object");
      for (auto& [k, v] : info.items())
        if (!v.is_string()) throw Error(file + ": __metadata__ value of '" + k + "' is not a string");
      continue;
    }
    if (!info.is_object()) throw Error(where + "entry is not a JSON object");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!info.contains(field)) throw Error(where + "no \"" + field + "\"");
    SafetensorsTensor t;
    t.name = name;
    if (!info["dtype"].is_string()) throw Error(where + "dtype is not a string");
    t.dtype = info["dtype"].get<std::string>();
    const size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0) throw Error(where + "unknown dtype '" + t.dtype + "'");
    const nlohmann::json& shape = info["shape"];
    if (!shape.is_array()) throw Error(where + "shape is not an array");
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : shape) {
      const uint64_t dim = to_u64(d, where + "shape dimension");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
      else if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      else numel *= dim;
      t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(dim, std::numeric_limits<int64_t>::max())));
    }
    if (overflow || numel > std::numeric_limits<uint64_t>::max() / elem)
      throw Error(where + "shape " + json_excerpt(shape) + " overflows 64-bit byte counts");
    const nlohmann::json& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) throw Error(where + "data_offsets is not [begin, end]");
    const uint64_t begin = to_u64(offsets[0], where + "data_offsets begin");
    const uint64_t end = to_u64(offsets[1], where + "data_offsets end");
    if (end < begin) throw Error(where + "data_offsets " + json_excerpt(offsets) + " end before they begin");
    if (end > data_bytes)
      throw Error(where + "data_offsets " + json_excerpt(offsets) + " run past the " + std::to_string(data_bytes) +
                  "-byte data section");
    t.nbytes = end - begin;
    if (t.nbytes != numel * elem)
      throw Error(where + "data_offsets " + offsets.dump() + " hold " + std::to_string(t.nbytes) + " bytes; " +
                  t.dtype + " " + shape.dump() + " needs " + std::to_string(numel * elem));
    t.offset = data_start + begin;
    spans.emplace_back(begin, end);
    tensors_.push_back(std::move(t));
  }
  // The tensors must tile the data section: no overlap (two tensors sharing bytes), no gap, nothing after.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a] < spans[b]; });
  uint64_t covered = 0;
  for (size_t i : order) {
    const auto [begin, end] = spans[i];
    if (begin < covered)
      throw Error(file + ": tensor '" + tensors_[i].name + "': data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + "] overlap another tensor's bytes");
    if (begin > covered)
      throw Error(file + ": tensor '" + tensors_[i].name + "': data_offsets begin at " + std::to_string(begin) +
                  ", leaving a gap after byte " + std::to_string(covered) + " of the data section");
    covered = end;
  }
  if (covered != data_bytes)
    throw Error(file + ": the tensors cover " + std::to_string(covered) + " of the data section's " +
                std::to_string(data_bytes) + " bytes (a truncated or padded file)");
  std::vector<SafetensorsTensor> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(std::move(tensors_[i]));
  tensors_ = std::move(sorted);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

}  // namespace qwen3
