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
#include <fstream>

#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/base/json_limits.h"
#include "qwen3/dat/dat.h"
#include "qwen3/dat/durable_file.h"
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

SynthResult synthetic_training_model(const Qwen3Config& config, uint64_t seed, const std::string& folder,
                                     bool replace_other) {
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
  // What the weights were drawn from: the config as written and the seed.
  const nlohmann::json wanted = {{"seed", seed}, {"config", config.to_json()}};
  const std::string record = s.out_dir + "/synthetic.json";
  std::error_code ec;
  if (std::filesystem::exists(s.out_dir + "/model.dat", ec)) {
    std::string differs = "no synthetic.json says what they were drawn from";
    if (std::filesystem::exists(record, ec)) {
      nlohmann::json found;
      try {
        std::ifstream in = open_input_file(record, "--synthetic's record");
        found = nlohmann::json::parse(in, depth_limited(record), /*allow_exceptions=*/false);
      } catch (const Error&) {  // unreadable or too deep: not a record of these weights
      }
      if (!found.is_object()) found = nlohmann::json::object();
      if (found == wanted) {
        SynthResult existing;
        existing.dat_path = s.out_dir + "/model.dat";
        existing.config_path = s.out_dir + "/config.json";
        return existing;
      }
      differs = found.value("seed", nlohmann::json()) != wanted["seed"]
                    ? "seed " + found.value("seed", nlohmann::json()).dump() + ", not " + std::to_string(seed)
                    : "another config than --config";
    }
    if (!replace_other)
      throw UsageError("--synthetic: " + s.out_dir + " holds the random weights of another run (" + differs +
                       "): resume that run with its own --config and --seed, replace it with --overwrite, or give "
                       "another --checkpoint-dir");
    spdlog::warn("--synthetic: {} held another run's random weights ({}): drawn anew", s.out_dir, differs);
  }
  SynthResult written = write_synthetic_model(s);
  write_file_durably(record, wanted.dump(2) + "\n");  // last: a model without it is never taken for this one's
  return written;
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
