// The exporter and `qwen3-train export`: byte-for-byte reproduction of canonical inputs, trained weights that
// evaluate as the training forward did, frozen entries untouched, the tied head, old element ids, refusals,
// atomicity under a write failure, and the command's flags.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <csignal>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include "cli_test_util.h"
#include "qwen3/model/layout.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/export/checkpoint_export.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/export/quantize_dat.h"
#include "trainer/train_setup.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/trainer.h"

#include "tiny_model_util.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

Qwen3Config tiny_config(bool tied) { return test::trainable_tiny_config(tied); }

struct Model {
  std::string dat, config;
};

// An input "written by the canonical quantizer": a dense synth file (lm_head drawn as the embedding) through
// `quantize`. Without lm_head, the pair is left out, as in a tied checkpoint that never stored its head.
Model canonical_model(const test::TempDir& dir, const std::string& name, bool tied, nvfp4::ScaleMode mode,
                      bool with_lm_head = true, uint64_t seed = 0) {
  SynthOptions s;
  s.config = tiny_config(tied);
  s.out_dir = dir.file(name);
  s.dense = true;
  s.seed = seed;
  const SynthResult dense = write_synthetic_model(s);
  const std::string q = dir.file(name + "/model-nvfp4.dat");
  quantize_dat_file(dense.dat_path, q, mode);
  if (with_lm_head) return {q, dense.config_path};
  const DatReader in(q);
  const std::string out = dir.file(name + "/model-no-head.dat");
  DatWriter w(out, in.entries().size() - 2);
  for (const auto& e : in.entries())
    if (e.key.rfind("lm_head", 0) != 0) write_tensor(w, e.key, read_tensor(in, e), e.type);
  w.commit();
  return {out, dense.config_path};
}

NamedTensors all_weights(const Model& m, bool tie_head) {
  const DatReader r(m.dat);
  auto model = load_model(r, load_config(m.config), at::kFloat, at::kCPU, tie_head);
  return with_tied_head(model->named_weights(), tie_head, r);
}

// Payload bytes of a model key: the dense entry, or qdata followed by scale.
std::vector<uint8_t> stored_bytes(const DatReader& r, const std::string& key) {
  std::vector<uint8_t> out;
  for (const std::string& k : {key, key + ".qdata", key + ".scale"})
    if (const DatEntry* e = r.find(k)) {
      const size_t at = out.size();
      out.resize(at + e->nbytes);
      r.read(*e, out.data() + at, e->nbytes);
    }
  return out;
}

at::Tensor e4m3_values(const at::Tensor& codes) {
  at::Tensor table = at::empty({256}, at::kFloat);
  for (int c = 0; c < 256; ++c) table[c] = nvfp4::e4m3_to_float(static_cast<uint8_t>(c));
  return table.index({codes.to(at::kLong)});
}

TEST(Export, UntrainedModelReproducesACanonicalRneInputByteForByte) {
  test::TempDir dir;
  for (bool tied : {true, false}) {
    const Model m = canonical_model(dir, tied ? "tied" : "untied", tied, nvfp4::ScaleMode::rne);
    const auto input = test::read_file(m.dat);
    const ExportReport rewritten = export_dat(m.dat, dir.file("all.dat"), all_weights(m, tied), nvfp4::ScaleMode::rne);
    EXPECT_EQ(rewritten.copied, 0u) << "every entry went through the trained path, the tied lm_head included";
    EXPECT_TRUE(test::read_file(dir.file("all.dat")) == input) << "tied " << tied;
    const ExportReport copied = export_dat(m.dat, dir.file("copy.dat"), {}, nvfp4::ScaleMode::rne);
    EXPECT_EQ(copied.copied, copied.entries);
    EXPECT_TRUE(test::read_file(dir.file("copy.dat")) == input);
  }
}

// Search mode is not idempotent (docs/export.md): a block whose search picked a scale s above its amax/6 has
// no ±6 code, so the dequantized block's amax/6 centres the next search below s; either s is outside the new
// window or a smaller scale fits the values exactly, and the block comes back with a smaller scale. A block
// with a ±6 code has amax/6 == s exactly, s fits with zero error and any smaller scale clips: it is reproduced.
TEST(Export, SearchModeReExportChangesOnlyBlocksWithoutASixCode) {
  test::TempDir dir;
  const Model m = canonical_model(dir, "s", true, nvfp4::ScaleMode::search);
  export_dat(m.dat, dir.file("all.dat"), all_weights(m, true), nvfp4::ScaleMode::search);
  const DatReader in(m.dat), out(dir.file("all.dat"));
  int64_t blocks = 0, changed = 0, with_six_changed = 0, smaller_scale = 0;
  for (const auto& spec : qwen3_tensors(load_config(m.config).shape())) {
    if (!spec.quantizable) continue;
    const at::Tensor a = read_weight(in, spec.key, at::kFloat, at::kCPU).reshape({-1, 16});
    const at::Tensor b = read_weight(out, spec.key, at::kFloat, at::kCPU).reshape({-1, 16});
    const at::Tensor in_scale = e4m3_values(read_tensor(in, in.at(spec.key + ".scale"))).reshape({-1});
    const at::Tensor out_scale = e4m3_values(read_tensor(out, out.at(spec.key + ".scale"))).reshape({-1});
    const at::Tensor differs = (in_scale != out_scale) | (a != b).any(1);
    const at::Tensor has_six = (a.abs() == in_scale.unsqueeze(1) * 6).any(1);
    blocks += a.size(0);
    changed += differs.sum().item<int64_t>();
    with_six_changed += (differs & has_six).sum().item<int64_t>();
    smaller_scale += (differs & out_scale.lt(in_scale)).sum().item<int64_t>();
  }
  std::printf("search re-export: %lld of %lld blocks changed\n", static_cast<long long>(changed),
              static_cast<long long>(blocks));
  EXPECT_GT(changed, 0) << "if this passes, search mode became idempotent: update docs/export.md";
  EXPECT_LT(changed * 50, blocks);
  EXPECT_EQ(with_six_changed, 0);
  EXPECT_EQ(smaller_scale, changed);
}

TEST(Export, OldElementIdsAreKept) {
  test::TempDir dir;
  const Model m = canonical_model(dir, "m", false, nvfp4::ScaleMode::rne);
  // The same model as an older export would store it: qdata as id 100, scales as float16 values.
  const DatReader in(m.dat);
  const std::string old_file = dir.file("old.dat");
  {
    DatWriter w(old_file, in.entries().size());
    for (const auto& e : in.entries()) {
      const at::Tensor t = read_tensor(in, e);
      if (ends_with(e.key, ".qdata")) write_tensor(w, e.key, t, ElemType::Float4E2M1x2);
      else if (ends_with(e.key, ".scale")) write_tensor(w, e.key, e4m3_values(t).to(at::kHalf));
      else write_tensor(w, e.key, t, e.type);
    }
    w.commit();
  }
  const Model old{old_file, m.config};
  export_dat(old.dat, dir.file("out.dat"), all_weights(old, false), nvfp4::ScaleMode::rne);
  EXPECT_TRUE(test::read_file(dir.file("out.dat")) == test::read_file(old_file));
  const DatReader out(dir.file("out.dat"));
  EXPECT_EQ(out.at("lm_head.weight.qdata").type, ElemType::Float4E2M1x2);
  EXPECT_EQ(out.at("lm_head.weight.scale").type, ElemType::Float16);
}

TEST(Export, RefusesMismatchedTensorsNonFiniteValuesAndTheInput) {
  test::TempDir dir;
  const Model m = canonical_model(dir, "m", true, nvfp4::ScaleMode::rne);
  const std::string out = dir.file("out.dat");
  auto expect_error = [&](const NamedTensors& t, const std::string& needle) {
    try {
      export_dat(m.dat, out, t, nvfp4::ScaleMode::rne);
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(out));
  };
  expect_error({{"model.layers.9.mlp.up_proj.weight", at::zeros({128, 64})}}, "'model.layers.9.mlp.up_proj.weight' has no entry");
  expect_error({{"model.norm.weight", at::zeros({63})}}, "is [63] trained, [64] in the file");
  expect_error({{"model.norm.weight", at::full({64}, 1e6)}}, "not finite as float16");
  at::Tensor nan_proj = at::zeros({128, 64});
  nan_proj[100][3] = NAN;
  expect_error({{"model.layers.1.mlp.up_proj.weight", nan_proj}}, "'model.layers.1.mlp.up_proj.weight'");
  EXPECT_THROW(export_dat(m.dat, m.dat, {}, nvfp4::ScaleMode::rne), UsageError);
  std::filesystem::create_symlink(m.dat, dir.file("link.dat"));
  EXPECT_THROW(export_dat(m.dat, dir.file("link.dat"), {}, nvfp4::ScaleMode::rne), UsageError);
}

// A write failure part-way (the file size limit makes write(2) fail as a full disk would) through the whole
// checkpoint export: the error says so, and neither the target nor a temporary file is left.
TEST(Export, WriteFailureLeavesNoFileAndSaysSo) {
  test::TempDir dir, out_dir;
  const Model m = canonical_model(dir, "m", true, nvfp4::ScaleMode::rne);
  const std::string target = out_dir.file("out.dat");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // GNU OpenMP's thread pool does not survive fork(): a parallel region in the child waits for the parent's
    // workers forever (PyTorch 2.x's export quantizes rows in parallel). The child works on one thread.
    at::set_num_threads(1);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {16 << 10, 16 << 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int code = 3;
    try {
      export_dat(m.dat, target, all_weights(m, true), nvfp4::ScaleMode::rne);
      code = 4;
    } catch (const Error& e) {
      code = std::strstr(e.what(), "write failed") && std::strstr(e.what(), "nothing was written") ? 0 : 5;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(std::filesystem::is_empty(out_dir.path())) << "a partial or temporary file survived";
}

const char* kPairs = "hi\tworld\nname?\tqwen\nabc\txyz\ncolor\tblue\n";

struct Trained {
  std::string checkpoint, exported;  // the checkpoint root and train --output-dat's file
  NamedTensors masters;
};

Trained train_tiny(const test::TempDir& dir, const Model& m, const std::string& name, int64_t last_layers,
                   nvfp4::ScaleMode mode = nvfp4::ScaleMode::rne) {
  std::ofstream(dir.file("pairs.tsv")) << kPairs;
  TrainOptions o;
  o.weights = m.dat;
  o.config = m.config;
  o.tokenizer = test::tiny_tokenizer_path();
  o.data.path = dir.file("pairs.tsv");
  o.data.seq_len = 32;
  o.data.batch_size = 4;
  o.schedule.lr = 3e-3;
  o.log_every = 0;
  o.steps = 4;
  o.train_last_layers = last_layers;
  o.scale_mode = mode;
  o.checkpoint_dir = dir.file(name + "-ckpt");
  o.output_dat = dir.file(name + "-train.dat");
  run_training(o);
  Trained t{o.checkpoint_dir, o.output_dat, {}};
  for (auto& [key, tensor] : load_checkpoint(*latest_checkpoint(o.checkpoint_dir)).tensors)
    if (key.rfind("master/", 0) == 0) t.masters.emplace_back(key.substr(7), tensor);
  return t;
}

// The trained model as the training forward computes it, with the weights quantized as the file stores them:
// the input's weights with the master weights copied in, every projection through the STE linear, dense
// tensors rounded to their entry's type (float16 here), and a head the file stores as an NVFP4 pair taken as
// that pair's values (for a tied model the quantized trained embedding, the runner's head).
double ste_forward_loss(const Model& m, const Trained& t, bool head_in_file, const std::vector<int64_t>& ids) {
  const DatReader r(m.dat);
  const Qwen3Config cfg = load_config(m.config);
  auto model = load_model(r, cfg, at::kFloat, at::kCPU, /*tie_head=*/cfg.tie_word_embeddings && !head_in_file);
  train_detail::use_nvfp4_projections(*model, nvfp4::ScaleMode::rne, /*frozen_as_codes=*/false);
  torch::NoGradGuard no_grad;
  for (auto& [key, param] : model->named_weights())
    for (const auto& [mk, mt] : t.masters)
      if (mk == key || (key == "lm_head.weight" && mk == "model.embed_tokens.weight" && cfg.tie_word_embeddings)) {
        if (key == "lm_head.weight") {
          const auto q = nvfp4::quantize(mt.to(at::kFloat));
          param.copy_(nvfp4::dequantize(q.codes, q.scales, at::kFloat));
        } else if (const DatEntry* dense = r.find(key)) {  // stored rounded to the entry's type
          param.copy_(mt.to(scalar_type_of(dense->type)).to(at::kFloat));
        } else {
          param.copy_(mt);
        }
      }
  return sequence_loss(*model, ids).loss;
}

const std::vector<int64_t> kIds = {272, 10, 55, 200, 31, 99, 7, 250, 3, 120, 64, 17};

void expect_trained_changed_and_frozen_identical(const Model& m, const std::string& exported, const Trained& t,
                                                 bool tied) {
  const DatReader in(m.dat), out(exported);
  ASSERT_EQ(in.entries().size(), out.entries().size());
  for (size_t i = 0; i < in.entries().size(); ++i) {
    EXPECT_EQ(in.entries()[i].key, out.entries()[i].key);
    EXPECT_EQ(in.entries()[i].type, out.entries()[i].type);
    EXPECT_EQ(in.entries()[i].shape, out.entries()[i].shape);
  }
  std::set<std::string> trained;
  for (const auto& [k, v] : t.masters) trained.insert(k);
  if (tied && trained.count("model.embed_tokens.weight") && file_has_lm_head(in)) trained.insert("lm_head.weight");
  for (const auto& spec : qwen3_tensors(load_config(m.config).shape(), file_has_lm_head(in))) {
    const bool same = stored_bytes(in, spec.key) == stored_bytes(out, spec.key);
    EXPECT_EQ(same, !trained.count(spec.key)) << spec.key << (same ? " unchanged" : " changed");
  }
}

TEST(Export, TrainedModelEvaluatesAsTheTrainingForwardAndFrozenEntriesStayIdentical) {
  test::TempDir dir;
  struct Case {
    const char* name;
    bool tied, lm_head;
    int64_t last_layers;
  };
  for (const Case c : {Case{"tied-head-in-file", true, true, 0}, Case{"tied-no-head", true, false, 0},
                       Case{"untied-last-layer", false, true, 1}}) {
    SCOPED_TRACE(c.name);
    const Model m = canonical_model(dir, c.name, c.tied, nvfp4::ScaleMode::rne, c.lm_head);
    const Trained t = train_tiny(dir, m, c.name, c.last_layers);
    CheckpointExportOptions eo;
    eo.checkpoint = t.checkpoint;
    eo.weights = m.dat;
    eo.out = dir.file(std::string(c.name) + "-export.dat");
    const CheckpointExportResult r = export_checkpoint(eo);
    EXPECT_EQ(r.trained_tensors, t.masters.size());
    EXPECT_TRUE(test::read_file(eo.out) == test::read_file(t.exported)) << "export and train --output-dat differ";
    expect_trained_changed_and_frozen_identical(m, eo.out, t, c.tied);

    const DatReader exported(eo.out);
    auto model = load_model(exported, load_config(m.config), at::kFloat, at::kCPU);
    EXPECT_NEAR(sequence_loss(*model, kIds).loss, ste_forward_loss(m, t, c.lm_head, kIds), 1e-5);
    const auto inspect = test::run_cli("inspect " + eo.out);
    EXPECT_EQ(inspect.code, 0) << inspect.err;
  }
}

TEST(Export, ACheckpointOfAnotherFileIsRefused) {
  test::TempDir dir;
  const Model m = canonical_model(dir, "m", true, nvfp4::ScaleMode::rne);
  const Trained t = train_tiny(dir, m, "m", 1);
  auto expect_error = [&](const std::string& checkpoint, const std::string& weights, const std::string& needle) {
    CheckpointExportOptions eo{checkpoint, weights, dir.file("out.dat"), std::nullopt};
    try {
      export_checkpoint(eo);
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.dat")));
  };
  const Model other_seed = canonical_model(dir, "seed", true, nvfp4::ScaleMode::rne, true, 7);
  expect_error(t.checkpoint, other_seed.dat, "same layout, but the stored values differ");
  const Model no_head = canonical_model(dir, "nohead", true, nvfp4::ScaleMode::rne, false);
  expect_error(t.checkpoint, no_head.dat, "keys, element types or shapes differ");
  expect_error(dir.file("nowhere"), m.dat, "no such checkpoint directory");
  std::filesystem::create_directories(dir.file("empty"));
  expect_error(dir.file("empty"), m.dat, "neither a checkpoint");
  // A step directory given directly works; one whose checkpoint.json lacks the export information does not.
  const std::string step = *latest_checkpoint(t.checkpoint);
  EXPECT_NO_THROW(export_checkpoint({step, m.dat, dir.file("ok.dat"), std::nullopt}));
  nlohmann::json meta = nlohmann::json::parse(test::slurp(step + "/checkpoint.json"));
  meta["extra"].erase("weights_hash");
  std::ofstream(step + "/checkpoint.json") << meta.dump();
  expect_error(step, m.dat, "has no export information");
}

TEST(ExportCli, FlagsDefaultScaleModeAndWriteFailure) {
  test::TempDir dir;
  const Model m = canonical_model(dir, "m", true, nvfp4::ScaleMode::search);
  const Trained t = train_tiny(dir, m, "m", 0, nvfp4::ScaleMode::search);
  const std::string base = "export --checkpoint " + t.checkpoint + " --weights " + m.dat;
  auto r = test::run_cli(base + " --out " + dir.file("a.dat"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("scale mode search"), std::string::npos) << r.out;
  EXPECT_TRUE(test::read_file(dir.file("a.dat")) == test::read_file(t.exported)) << "default: the checkpoint's mode";
  r = test::run_cli(base + " --out " + dir.file("b.dat") + " --scale-mode rne");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(test::read_file(dir.file("b.dat")) == test::read_file(t.exported));
  EXPECT_EQ(test::run_cli(base).code, 2);                                           // --out missing
  // A flag of the Hugging Face formats beside --format dat is refused (--max-shard-size was ignored, silently).
  r = test::run_cli(base + " --out " + dir.file("d.dat") + " --max-shard-size 1GB");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--max-shard-size apply to --format hf | nvfp4-hf"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_cli(base + " --out " + dir.file("c.dat") + " --scale-mode x").code, 2);
  r = test::run_cli(base + " --out " + m.dat);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  // An existing target is refused (and left as it was) unless --overwrite; a file of the checkpoint never.
  std::ofstream(dir.file("keep.dat")) << "precious";
  r = test::run_cli(base + " --out " + dir.file("keep.dat"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("exists; pass --overwrite"), std::string::npos) << r.err;
  EXPECT_EQ(test::slurp(dir.file("keep.dat")), "precious");
  r = test::run_cli(base + " --out " + dir.file("keep.dat") + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test::read_file(dir.file("keep.dat")) == test::read_file(t.exported));
  const std::string step = *latest_checkpoint(t.checkpoint);
  const std::string inside = step + "/tensors.dat";
  const auto before = test::read_file(inside);
  r = test::run_cli(base + " --out " + inside + " --overwrite");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("which this command reads"), std::string::npos) << r.err;
  EXPECT_TRUE(test::read_file(inside) == before);
  r = test::run_cli("export --checkpoint " + dir.file("none") + " --weights " + m.dat + " --out " + dir.file("c.dat"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("none: no such checkpoint directory"), std::string::npos) << r.err;
  // A write failure through the command: one error line, exit 1, nothing at the target. run_cli puts the
  // binary first, so a harmless --version comes before the shell part; ulimit -f counts 512-byte blocks in
  // dash, and SIGXFSZ is ignored so that write(2) fails with EFBIG as it would with ENOSPC on a full disk.
  test::TempDir out_dir;
  r = test::run_cli("--version >/dev/null; trap '' XFSZ; ulimit -f 16; exec " + test::binary_command() + " " +
                    base + " --out " + out_dir.file("d.dat"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("write failed"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(out_dir.path()));
}

}  // namespace
namespace {

// The export information a checkpoint carries is typed both ways: written by name, read back equal; an older
// checkpoint without it is "none", and a field of the wrong type is named.
TEST(ExportInfo, RoundTripsAndNamesBadFields) {
  ExportInfo info;
  info.weights_hash = "abc";
  info.weights_sample_hash = "def";
  info.tied_head = true;
  info.scale_mode = nvfp4::ScaleMode::search;
  const nlohmann::json j = info.to_json();
  EXPECT_EQ(j["scale_mode"], "search");
  const auto back = ExportInfo::from_json(j, "c.json");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->weights_hash, "abc");
  EXPECT_EQ(back->weights_sample_hash, std::optional<std::string>("def"));
  EXPECT_TRUE(back->tied_head);
  EXPECT_EQ(back->scale_mode, nvfp4::ScaleMode::search);
  EXPECT_FALSE(ExportInfo::from_json(nlohmann::json::object(), "c.json").has_value());
  nlohmann::json bad = j;
  bad["tied_head"] = "yes";
  try {
    ExportInfo::from_json(bad, "c.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.json: field \"tied_head\" must be true or false"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qwen3
