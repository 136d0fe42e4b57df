#include "qwen3/model/model_loader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include <algorithm>
#include <set>
#include <string_view>

#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/layout.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3/base/message_text.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3 {
namespace {


bool is_float_type(ElemType t) {
  return t == ElemType::Float16 || t == ElemType::BFloat16 || t == ElemType::Float32 || t == ElemType::Float64;
}

// The dense shape a weight has in the file, or an empty vector if it is absent.
std::vector<int64_t> stored_shape(const DatReader& r, const std::string& key) {
  if (const DatEntry* e = r.find(key)) return e->shape;
  if (const DatEntry* q = r.find(key + std::string(kQdataSuffix))) return {q->shape[0], q->shape[1] * 2};
  return {};
}

}  // namespace

bool file_has_lm_head(const DatReader& reader) { return !stored_shape(reader, "lm_head.weight").empty(); }

at::Tensor read_weight(const DatReader& reader, const std::string& key, at::ScalarType dtype, at::Device device) {
  if (const DatEntry* e = reader.find(key)) {
    if (!is_float_type(e->type))
      throw DatError(reader.path() + ": entry '" + key + "' is " + elem_type_name(e->type) + ", not a float tensor");
    return read_tensor(reader, *e).to(device, dtype);
  }
  const DatEntry* q = reader.find(key + std::string(kQdataSuffix));
  if (!q) throw DatError(reader.path() + ": no entry '" + key + "' (dense or NVFP4 pair)");
  const DatEntry& s = reader.at(key + std::string(kScaleSuffix));
  const at::Tensor codes = read_tensor(reader, *q).to(device);
  at::Tensor scales = read_tensor(reader, s);
  // E4M3 codes 0x7F and 0xFF are NaN: such a block would decode to NaN and every output after it. Checked on
  // the host before the tensor moves, naming the first bad block.
  if (scales.scalar_type() == at::kByte) {
    const at::Tensor bytes = scales.contiguous();
    nvfp4::NanScaleCodes bad_scales;
    bad_scales.add(bytes.data_ptr<uint8_t>(), static_cast<uint64_t>(bytes.numel()), 0);
    if (bad_scales.count > 0)
      throw DatError(reader.path() + ": entry '" + key + std::string(kScaleSuffix) + "' holds " +
                     bad_scales.describe(static_cast<uint64_t>(scales.dim() >= 2 ? scales.size(-1) : scales.numel())));
  }
  return nvfp4::dequantize(codes, scales.to(device), dtype);
}

std::shared_ptr<Qwen3Model> load_model(const DatReader& reader, const Qwen3Config& config, at::ScalarType dtype,
                                       at::Device device, bool tie_head) {
  if (tie_head && !config.tie_word_embeddings)
    throw Error("cannot tie lm_head to the embedding: the config has tie_word_embeddings false");
  const bool separate_head = file_has_lm_head(reader) && !tie_head;
  if (!separate_head && !config.tie_word_embeddings)
    throw Error(reader.path() + ": no lm_head in the file and the config does not tie it to the embedding");
  // Check every key and shape before allocating the model, and report all problems at once.
  std::vector<std::string> problems;
  std::set<std::string> used;
  for (const auto& spec : qwen3_tensors(config.shape(), separate_head)) {
    const auto shape = stored_shape(reader, spec.key);
    if (shape.empty())
      problems.push_back("missing '" + spec.key + "'");
    else if (shape != spec.shape)
      problems.push_back(fmt::format("'{}' is {} in the file, the config needs {}", spec.key, shape_text(shape),
                                     shape_text(spec.shape)));
    used.insert({spec.key, spec.key + std::string(kQdataSuffix), spec.key + std::string(kScaleSuffix)});
  }
  // Blocks past the config's count would be silently left out of the model (and out of any export).
  int64_t file_layers = 0;
  for (const auto& e : reader.entries())
    if (const auto layer = layer_of_key(e.key)) file_layers = std::max(file_layers, *layer + 1);
  if (file_layers > config.num_hidden_layers)
    problems.push_back(fmt::format("the file has {} layers, the config's num_hidden_layers is {}", file_layers,
                                   config.num_hidden_layers));
  if (!problems.empty()) throw Error(problems_text(reader.path() + ": does not match the config", problems));
  for (const auto& e : reader.entries())
    if (!used.count(e.key)) spdlog::debug("load: ignoring entry '{}' the model does not use", e.key);

  auto model = std::make_shared<Qwen3Model>(config, dtype, device, separate_head);
  torch::NoGradGuard no_grad;
  for (auto& [key, param] : model->named_weights()) param.copy_(read_weight(reader, key, dtype, device));
  return model;
}

}  // namespace qwen3
