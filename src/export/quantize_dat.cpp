#include "qwen3/export/quantize_dat.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <cmath>

#include "qwen3/dat/dat.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/nvfp4/nvfp4_pair_writer.h"

namespace qwen3 {
namespace {

constexpr uint64_t kChunkBytes = 16 << 20;
constexpr std::string_view kFamilies[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                          "up_proj", "down_proj", "lm_head"};

}  // namespace

std::string quantizable_family(std::string_view key) {
  if (key.find("embed_tokens") != std::string_view::npos || key.find("norm") != std::string_view::npos) return {};
  for (auto f : kFamilies)
    if (key.find(f) != std::string_view::npos) return std::string(f);
  return {};
}

bool is_quantizable_weight(std::string_view key, size_t ndim) {
  return ndim == 2 && ends_with(key, ".weight") && !quantizable_family(key).empty();
}

double FamilyError::relative() const { return sum_sq_input > 0 ? std::sqrt(sum_sq_error / sum_sq_input) : 0.0; }

void check_not_same_file(const std::string& in_path, const std::string& out_path) {
  struct stat a {}, b {};
  if (::stat(in_path.c_str(), &a) == 0 && ::stat(out_path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino)
    throw UsageError(out_path + " is the input file; write the output to a new file");
}

QuantizeReport quantize_dat_file(const std::string& in_path, const std::string& out_path, nvfp4::ScaleMode mode) {
  check_not_same_file(in_path, out_path);
  DatReader in(in_path);
  QuantizeReport rep;
  rep.entries_in = in.entries().size();
  for (const auto& e : in.entries()) {
    const bool q = is_quantizable_weight(e.key, e.shape.size());
    if (q && e.type != ElemType::Float16 && e.type != ElemType::BFloat16 && e.type != ElemType::Float32)
      throw Error(in_path + ": entry '" + e.key + "' is " + elem_type_name(e.type) +
                  "; only float16, bfloat16 and float32 weights can be quantized");
    rep.entries_out += q ? 2 : 1;
  }

  DatWriter out(out_path, rep.entries_out);
  std::vector<uint8_t> buf(kChunkBytes);
  for (const auto& e : in.entries()) {
    if (!is_quantizable_weight(e.key, e.shape.size())) {
      copy_dat_entry(in, e, out, buf);
      continue;
    }
    const int64_t rows = e.shape[0], cols = e.shape[1];
    const uint64_t row_bytes = static_cast<uint64_t>(cols) * elem_size(e.type);
    const int64_t chunk_rows = static_cast<int64_t>(std::max<uint64_t>(1, kChunkBytes / row_bytes));
    if (buf.size() < chunk_rows * row_bytes) buf.resize(chunk_rows * row_bytes);
    Nvfp4PairWriter pair(out, e.key, rows, cols, mode, ElemType::UInt8, /*measure_error=*/true);
    for (int64_t r = 0; r < rows; r += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r);
      in.read_range(e, r * row_bytes, buf.data(), n * row_bytes);
      const at::Tensor x =
          at::from_blob(buf.data(), {n, cols}, at::TensorOptions().dtype(scalar_type_of(e.type))).to(at::kFloat);
      pair.add_rows(x.contiguous().data_ptr<float>(), n);
    }
    pair.finish();
    ++rep.quantized;
    const std::string family = quantizable_family(e.key);
    auto it = std::find_if(rep.families.begin(), rep.families.end(), [&](auto& f) { return f.family == family; });
    if (it == rep.families.end()) it = rep.families.insert(rep.families.end(), FamilyError{family});
    it->tensors++;
    it->sum_sq_error += pair.sum_sq_error();
    it->sum_sq_input += pair.sum_sq_input();
  }
  out.commit();
  return rep;
}

}  // namespace qwen3
