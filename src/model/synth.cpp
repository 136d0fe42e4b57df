// Random weights of realistic scale: projections ~ N(0, 1/in) (unit-variance activations stay unit
// variance), embedding ~ N(0, 0.02^2) as in the HF initializer, norms ~ 1 + N(0, 0.05^2). lm_head reuses the
// embedding's random stream, so a tied config and the file's separate lm_head pair agree, as in the real file.
#include "qwen3/model/synth.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "qwen3/dat/dat.h"
#include "qwen3/model/layout.h"
#include "qwen3/nvfp4/nvfp4_pair_writer.h"

namespace qwen3 {
namespace {

constexpr int64_t kChunkElements = 4 << 20;  // 16 MB of fp32 per generated chunk

enum class Family { embedding, projection, norm };

Family family_of(const TensorSpec& t) {
  if (t.shape.size() == 1) return Family::norm;
  if (t.key == "model.embed_tokens.weight" || t.key == "lm_head.weight") return Family::embedding;
  return Family::projection;
}

// Fills `out` with the next chunk of a tensor's values from its generator.
at::Tensor next_chunk(at::Generator& gen, Family family, int64_t rows, int64_t cols) {
  at::Tensor x = at::randn({rows, cols}, gen, at::TensorOptions().dtype(at::kFloat));
  switch (family) {
    case Family::embedding: return x.mul_(0.02f);
    case Family::projection: return x.mul_(1.0f / std::sqrt(static_cast<float>(cols)));
    case Family::norm: return x.mul_(0.05f).add_(1.0f);
  }
  return x;
}

uint64_t stream_seed(uint64_t seed, const std::string& key) {
  // lm_head shares the embedding's stream (see the file comment).
  const std::string name = key == "lm_head.weight" ? "model.embed_tokens.weight" : key;
  return seed * 0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(name);
}

}  // namespace

SynthResult synthetic_training_model(const Qwen3Config& config, uint64_t seed, const std::string& folder) {
  SynthOptions s;
  s.config = config;
  s.seed = seed;
  s.out_dir = folder;
  if (s.out_dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "qwen3-synthetic-XXXXXX").string();
    if (!::mkdtemp(pattern.data()))
      throw Error(std::string("cannot create a temporary folder for --synthetic: ") + std::strerror(errno));
    s.out_dir = pattern;
  }
  if (!std::filesystem::exists(s.out_dir + "/model.dat")) return write_synthetic_model(s);
  SynthResult existing;
  existing.dat_path = s.out_dir + "/model.dat";
  existing.config_path = s.out_dir + "/config.json";
  return existing;
}

SynthResult write_synthetic_model(const SynthOptions& opt) {
  const Qwen3Config& cfg = opt.config;
  cfg.validate("synth config");
  std::error_code ec;
  std::filesystem::create_directories(opt.out_dir, ec);
  if (ec) throw Error(opt.out_dir + ": cannot create directory: " + ec.message());

  SynthResult res;
  res.dat_path = (std::filesystem::path(opt.out_dir) / "model.dat").string();
  res.config_path = (std::filesystem::path(opt.out_dir) / "config.json").string();
  const ModelShape shape = cfg.shape();
  const auto tensors = qwen3_tensors(shape, /*with_lm_head=*/true);
  res.entries = qwen3_dat_entries(shape, !opt.dense, ElemType::Float16).size();

  DatWriter writer(res.dat_path, res.entries);
  for (const auto& t : tensors) {
    const Family family = family_of(t);
    const int64_t rows = t.shape.size() == 1 ? 1 : t.shape[0];
    const int64_t cols = t.shape.size() == 1 ? t.shape[0] : t.shape[1];
    const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / cols);
    at::Generator gen = at::detail::createCPUGenerator(stream_seed(opt.seed, t.key));
    res.parameters += static_cast<uint64_t>(rows * cols);
    spdlog::debug("synth: {} {}x{}", t.key, rows, cols);
    if (t.quantizable && !opt.dense) {
      Nvfp4PairWriter pair(writer, t.key, rows, cols, opt.scale_mode);
      for (int64_t r = 0; r < rows; r += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - r);
        const at::Tensor x = next_chunk(gen, family, n, cols);
        pair.add_rows(x.data_ptr<float>(), n);
      }
      pair.finish();
    } else {
      writer.begin_entry(t.key, ElemType::Float16, t.shape);
      for (int64_t r = 0; r < rows; r += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - r);
        const at::Tensor x = next_chunk(gen, family, n, cols).to(at::kHalf);
        writer.write_payload(x.data_ptr(), static_cast<uint64_t>(x.numel()) * 2);
      }
    }
  }
  writer.commit();
  save_config(cfg, res.config_path);
  struct stat st {};
  if (::stat(res.dat_path.c_str(), &st) == 0) res.file_bytes = static_cast<uint64_t>(st.st_size);
  return res;
}

}  // namespace qwen3
