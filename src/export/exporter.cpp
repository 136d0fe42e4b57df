#include "qwen3/export/exporter.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)

#include <map>

#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/export/quantize_dat.h"

namespace qwen3 {
namespace {

constexpr uint64_t kCopyChunk = 16 << 20;
// Trained tensors are converted and written this many elements at a time, so a 389 M-element embedding never
// needs a second full-size copy in its file type.
constexpr int64_t kChunkElements = 4 << 20;

std::string base_key(const std::string& key, std::string_view suffix) { return key.substr(0, key.size() - suffix.size()); }

bool is_float_type(ElemType t) {
  return t == ElemType::Float16 || t == ElemType::BFloat16 || t == ElemType::Float32 || t == ElemType::Float64;
}

// A trained dense tensor (norm, embedding, dense head) in the entry's own element type, chunk by chunk. A value
// that is not finite in that type (NaN, or past float16's 65504) is an error rather than a silently broken file.
void write_dense(const at::Tensor& w, const DatEntry& e, DatWriter& out) {
  out.begin_entry(e.key, e.type, e.shape);
  const at::Tensor flat = w.reshape({-1});
  const int64_t n = flat.numel();
  for (int64_t off = 0; off < n; off += kChunkElements) {
    const at::Tensor chunk =
        flat.narrow(0, off, std::min(kChunkElements, n - off)).to(at::kCPU, scalar_type_of(e.type)).contiguous();
    if (!at::isfinite(chunk).all().item<bool>())
      throw Error("trained tensor '" + e.key + "' has a value that is not finite as " + elem_type_name(e.type) +
                  " (elements " + std::to_string(off) + ".." + std::to_string(off + chunk.numel() - 1) + ")");
    out.write_payload(chunk.data_ptr(), static_cast<uint64_t>(chunk.numel()) * chunk.element_size());
  }
}

// Writes the codes of `w` as the qdata entry `e` (its element id kept) and returns the E4M3 scale bytes, which
// go out when the scale entry's turn comes (pairs need not be adjacent).
std::vector<uint8_t> write_codes(const at::Tensor& w, const DatEntry& e, DatWriter& out, nvfp4::ScaleMode mode) {
  const int64_t rows = w.size(0), cols = w.size(1);
  std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / nvfp4::kBlock)), codes;
  out.begin_entry(e.key, e.type, e.shape);
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / cols);
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r);
    const at::Tensor x = w.narrow(0, r, n).to(at::kCPU, at::kFloat).contiguous();
    codes.resize(static_cast<size_t>(n * cols / 2));
    try {
      nvfp4::quantize_rows_cpu(x.data_ptr<float>(), n, cols, codes.data(),
                               scales.data() + r * (cols / nvfp4::kBlock), mode);
    } catch (const Error& err) {  // its row numbers are relative to the chunk: name the tensor and chunk
      throw Error("trained tensor '" + base_key(e.key, kQdataSuffix) + "' (rows from " + std::to_string(r) +
                  "): " + err.what());
    }
    out.write_payload(codes.data(), codes.size());
  }
  return scales;
}

void write_scales(const std::vector<uint8_t>& codes, const DatEntry& e, DatWriter& out) {
  if (e.type == ElemType::Float8E4M3) {
    out.write_entry(e.key, e.type, e.shape, codes.data(), codes.size());
    return;
  }
  // Old files store the scale values as float16/float32: every E4M3 value is exact in both.
  std::vector<float> values(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) values[i] = nvfp4::e4m3_to_float(codes[i]);
  at::Tensor t = at::from_blob(values.data(), e.shape, at::kFloat).to(scalar_type_of(e.type));
  out.write_entry(e.key, e.type, e.shape, t.data_ptr(), e.nbytes);
}

// Every trained tensor must name an entry (dense or pair) of the input with its shape: checked before the
// output is created, and all problems are reported at once.
void check_trained(const DatReader& in, const std::map<std::string, at::Tensor>& by_key) {
  std::string problems;
  int count = 0;
  auto problem = [&](const std::string& text) { problems += (count++ ? "; " : "") + text; };
  for (const auto& [key, t] : by_key) {
    const DatEntry* dense = in.find(key);
    const DatEntry* q = in.find(key + std::string(kQdataSuffix));
    std::vector<int64_t> stored;
    if (dense) {
      stored = dense->shape;
      if (!is_float_type(dense->type))
        problem("'" + key + "' is " + elem_type_name(dense->type) + " in the file, not a floating-point tensor");
    } else if (q) {
      stored = {q->shape[0], q->shape[1] * 2};
    } else {
      problem("'" + key + "' has no entry");
      continue;
    }
    const std::vector<int64_t> have(t.sizes().begin(), t.sizes().end());
    if (have != stored)
      problem(fmt::format("'{}' is [{}] trained, [{}] in the file", key, fmt::join(have, ", "), fmt::join(stored, ", ")));
  }
  if (count)
    throw Error(in.path() + ": the trained tensors do not match the file (" + std::to_string(count) +
                " problems): " + problems);
}

}  // namespace

ExportReport export_dat(const DatReader& in, const std::string& output_dat, const NamedTensors& trained,
                        nvfp4::ScaleMode mode) {
  check_not_same_file(in.path(), output_dat);
  std::map<std::string, at::Tensor> by_key;
  for (const auto& [key, t] : trained)
    if (!by_key.emplace(key, t.detach()).second) throw Error("trained tensor '" + key + "' is given twice");
  check_trained(in, by_key);

  ExportReport rep;
  rep.entries = in.entries().size();
  DatWriter out(output_dat, rep.entries);
  std::vector<uint8_t> buf(kCopyChunk);
  std::map<std::string, std::vector<uint8_t>> pending_scales;
  for (const auto& e : in.entries()) {
    if (auto it = by_key.find(e.key); it != by_key.end()) {
      write_dense(it->second, e, out);
      ++rep.rewritten;
    } else if (ends_with(e.key, kQdataSuffix) && by_key.count(base_key(e.key, kQdataSuffix))) {
      const std::string base = base_key(e.key, kQdataSuffix);
      pending_scales[base] = write_codes(by_key.at(base), e, out, mode);
      ++rep.rewritten;
    } else if (ends_with(e.key, kScaleSuffix) && by_key.count(base_key(e.key, kScaleSuffix))) {
      const std::string base = base_key(e.key, kScaleSuffix);
      auto it = pending_scales.find(base);
      if (it == pending_scales.end())  // no real file does this; supporting it would mean holding the codes
        throw Error(in.path() + ": entry '" + e.key + "' precedes its codes; such files are not supported for export");
      write_scales(it->second, e, out);
      pending_scales.erase(it);
      ++rep.rewritten;
    } else {
      copy_dat_entry(in, e, out, buf);
      ++rep.copied;
    }
  }
  out.commit();
  return rep;
}

ExportReport export_dat(const std::string& input_dat, const std::string& output_dat, const NamedTensors& trained,
                        nvfp4::ScaleMode mode) {
  check_not_same_file(input_dat, output_dat);  // before reading: the message is about the paths, not the file
  return export_dat(DatReader(input_dat), output_dat, trained, mode);
}

NamedTensors with_tied_head(NamedTensors trained, bool tied_head, const DatReader& input) {
  if (!tied_head || !file_has_lm_head(input)) return trained;
  for (const auto& [key, t] : trained)
    if (key == "model.embed_tokens.weight") {
      const at::Tensor embedding = t;  // copy the handle first: emplace_back may reallocate `trained`
      trained.emplace_back("lm_head.weight", embedding);
      break;
    }
  return trained;
}

std::string weights_sample_hash(const DatReader& input) {
  constexpr uint64_t kSample = 4096;
  std::string text;
  std::vector<char> buf(kSample);
  for (const auto& e : input.entries()) {
    text += e.key;
    text += '|';
    const uint64_t head = std::min(kSample, e.nbytes);
    input.read_range(e, 0, buf.data(), head);
    text.append(buf.data(), head);
    const uint64_t tail = std::min(kSample, e.nbytes - head);
    input.read_range(e, e.nbytes - tail, buf.data(), tail);
    text.append(buf.data(), tail);
  }
  return stable_hash(text);
}

}  // namespace qwen3
