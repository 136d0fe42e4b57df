#include "qwen3/exporter.h"

#include <ATen/ATen.h>

#include <map>

#include "qwen3/dat.h"
#include "qwen3/dat_tensor.h"
#include "qwen3/quantize_dat.h"

namespace qwen3 {
namespace {

constexpr uint64_t kCopyChunk = 16 << 20;
constexpr int64_t kQuantChunkElements = 4 << 20;

std::string base_key(const std::string& key, std::string_view suffix) { return key.substr(0, key.size() - suffix.size()); }

void copy_entry(const DatReader& in, const DatEntry& e, DatWriter& out, std::vector<uint8_t>& buf) {
  out.begin_entry(e.key, e.type, e.shape);
  for (uint64_t off = 0; off < e.nbytes; off += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), e.nbytes - off);
    in.read_range(e, off, buf.data(), n);
    out.write_payload(buf.data(), n);
  }
}

// Writes the codes of `w` as the qdata entry `e` (its element id kept) and returns the E4M3 scale bytes, which
// go out when the scale entry's turn comes (pairs need not be adjacent).
std::vector<uint8_t> write_codes(const at::Tensor& w, const DatEntry& e, DatWriter& out, nvfp4::ScaleMode mode) {
  const int64_t rows = w.size(0), cols = w.size(1);
  std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / nvfp4::kBlock)), codes;
  out.begin_entry(e.key, e.type, e.shape);
  const int64_t chunk = std::max<int64_t>(1, kQuantChunkElements / cols);
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r);
    const at::Tensor x = w.narrow(0, r, n).to(at::kCPU, at::kFloat).contiguous();
    codes.resize(static_cast<size_t>(n * cols / 2));
    nvfp4::quantize_rows_cpu(x.data_ptr<float>(), n, cols, codes.data(), scales.data() + r * (cols / nvfp4::kBlock), mode);
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

}  // namespace

ExportReport export_dat(const std::string& input_dat, const std::string& output_dat,
                        const std::vector<std::pair<std::string, at::Tensor>>& trained, nvfp4::ScaleMode mode) {
  check_not_same_file(input_dat, output_dat);
  DatReader in(input_dat);
  std::map<std::string, at::Tensor> by_key(trained.begin(), trained.end());
  for (const auto& [key, t] : by_key) {
    const DatEntry* dense = in.find(key);
    const DatEntry* q = in.find(key + std::string(kQdataSuffix));
    std::vector<int64_t> stored;
    if (dense) stored = dense->shape;
    else if (q) stored = {q->shape[0], q->shape[1] * 2};
    else throw Error(input_dat + ": trained tensor '" + key + "' has no entry in the input file");
    if (std::vector<int64_t>(t.sizes().begin(), t.sizes().end()) != stored)
      throw Error(input_dat + ": trained tensor '" + key + "' has another shape than its entry");
  }

  ExportReport rep;
  rep.entries = in.entries().size();
  DatWriter out(output_dat, rep.entries);
  std::vector<uint8_t> buf(kCopyChunk);
  std::map<std::string, std::vector<uint8_t>> pending_scales;
  for (const auto& e : in.entries()) {
    if (auto it = by_key.find(e.key); it != by_key.end()) {
      const at::Tensor t = it->second.detach().to(at::kCPU, scalar_type_of(e.type)).contiguous();
      out.write_entry(e.key, e.type, e.shape, t.data_ptr(), e.nbytes);
      ++rep.rewritten;
    } else if (ends_with(e.key, kQdataSuffix) && by_key.count(base_key(e.key, kQdataSuffix))) {
      const std::string base = base_key(e.key, kQdataSuffix);
      pending_scales[base] = write_codes(by_key.at(base).detach(), e, out, mode);
      ++rep.rewritten;
    } else if (ends_with(e.key, kScaleSuffix) && by_key.count(base_key(e.key, kScaleSuffix))) {
      const std::string base = base_key(e.key, kScaleSuffix);
      auto it = pending_scales.find(base);
      if (it == pending_scales.end())  // no real file does this; supporting it would mean holding the codes
        throw Error(input_dat + ": entry '" + e.key + "' precedes its codes; such files are not supported for export");
      write_scales(it->second, e, out);
      pending_scales.erase(it);
      ++rep.rewritten;
    } else {
      copy_entry(in, e, out, buf);
      ++rep.copied;
    }
  }
  out.commit();
  return rep;
}

}  // namespace qwen3
