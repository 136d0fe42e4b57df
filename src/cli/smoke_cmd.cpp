// `smoke`: the whole product in seconds, with no input files: a `synth --preset tiny` model, ~20 training steps
// on a built-in TSV, export, reload of the exported .dat, and a greedy reply that must reproduce a trained
// target. Non-zero exit if any stage fails.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <vector>

#include "qwen3/base/error.h"
#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/trainer.h"
#include "runtime_options.h"

namespace qwen3::cli {

extern const char* const kBuiltinTinyTokenizerJson;

namespace {

namespace fs = std::filesystem;

// Short pairs whose targets a freshly trained tiny model reproduces after a few steps.
constexpr std::pair<const char*, const char*> kPairs[] = {
    {"Who are you?", "I am Qwen."}, {"2+2?", "4"}, {"Say hi.", "hi"}, {"Capital of France?", "Paris"}};

struct SmokeFlags {
  std::string out_dir = "smoke-out", tokenizer, device = "cpu";
  int64_t steps = 0;  // 0: 40 with the real Qwen3 tokenizer, 60 with a byte-level tiny one
  double lr = 2e-2;
  uint64_t seed = 0;
  bool moe = false;  // the tiny mixture-of-experts model (qwen3-moe-tiny) instead of the dense one
};

std::string find_tokenizer(const std::string& given) {
  if (!given.empty()) return given;
  // The file scripts/fetch-tokenizer.sh fetches, looked up from the working directory and from the binary.
  std::vector<fs::path> candidates = {".deps/tokenizer-qwen3/models/tokenizer.json"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / ".deps/tokenizer-qwen3/models/tokenizer.json");
  for (const auto& c : candidates)
    if (fs::exists(c, ec)) return c.string();
  return {};
}

// smoke owns its folder: it writes these names, and a re-run replaces them. A folder holding anything else is
// someone's (a mistyped --out-dir), and smoke refuses it before writing anything, rather than replace a model.dat
// or a trained.dat of theirs.
void check_smoke_folder(const std::string& out_dir) {
  static const char* const kOwn[] = {"tiny_tokenizer.json", "pairs.tsv", "trained.dat", "model", "model/model.dat",
                                     "model/config.json"};
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return;
  if (!fs::is_directory(out_dir, ec)) throw UsageError("smoke: --out-dir " + out_dir + " is a file; give a folder");
  std::vector<std::string> foreign;
  for (auto it = fs::recursive_directory_iterator(out_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = it->path().lexically_relative(out_dir).generic_string();
    if (std::find(std::begin(kOwn), std::end(kOwn), rel) != std::end(kOwn)) continue;
    foreign.push_back(rel);
    it.disable_recursion_pending();  // a foreign folder is named once, not file by file
  }
  if (ec) throw Error("smoke: --out-dir " + out_dir + ": cannot list it: " + ec.message());
  if (foreign.empty()) return;
  std::sort(foreign.begin(), foreign.end());
  const size_t shown = std::min<size_t>(foreign.size(), 3);
  const auto first = foreign.begin(), last = foreign.begin() + static_cast<std::ptrdiff_t>(shown);
  throw UsageError(fmt::format("smoke: --out-dir {} holds files smoke does not write ({}{}): give a new or empty "
                               "folder (smoke replaces only its own files there)",
                               out_dir, fmt::join(first, last, ", "),
                               foreign.size() > shown ? fmt::format(" and {} more", foreign.size() - shown) : ""));
}

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

int run_smoke(const SmokeFlags& f) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  resolve_device(f.device);  // before anything is written: on a machine without CUDA libtorch's own words came later
  check_smoke_folder(f.out_dir);
  fs::create_directories(f.out_dir);
  const std::string tok_path = find_tokenizer(f.tokenizer);
  const std::string tok_used = tok_path.empty() ? (fs::path(f.out_dir) / "tiny_tokenizer.json").string() : tok_path;
  if (tok_path.empty()) std::ofstream(tok_used) << kBuiltinTinyTokenizerJson;
  const Tokenizer tok = Tokenizer::from_file(tok_used);
  fmt::print("smoke: tokenizer {}\n", tok_path.empty() ? "built-in tiny (run scripts/fetch-tokenizer.sh for the real one)" : tok_path);

  SynthOptions synth;
  synth.config = preset_config(f.moe ? "qwen3-moe-tiny" : "tiny");
  // The mixture of experts trains with its load-balancing loss (what output_router_logits asks transformers for):
  // the smoke then runs that path too.
  synth.config.output_router_logits = f.moe;
  synth.seed = f.seed;
  synth.out_dir = (fs::path(f.out_dir) / "model").string();
  const SynthResult model_files = write_synthetic_model(synth);
  fmt::print("smoke: synth      {} ({:.1f} MB)\n", model_files.dat_path, model_files.file_bytes / 1e6);

  const std::string data_path = (fs::path(f.out_dir) / "pairs.tsv").string();
  {
    std::ofstream data(data_path);
    for (auto [prompt, target] : kPairs) data << prompt << '\t' << target << '\n';
  }
  TrainOptions o;
  o.weights = model_files.dat_path;
  o.config = model_files.config_path;
  o.tokenizer = tok_used;
  o.data.path = data_path;
  o.data.seq_len = 64;
  o.data.batch_size = 4;
  o.data.seed = f.seed;
  // A tiny vocabulary (the built-in tokenizer, used offline) spells the replies in many more tokens: 20 steps
  // leave "I am Qwen." half learned (measured: loss 0.53, reply "hi"); 40 reproduce it, 60 leave a margin.
  // The real tokenizer's hybrid Qwen3 template puts an empty think block (4 tokens, the same in every pair)
  // between each prompt and its reply: 20 steps left the reply unlearned (loss 0.46, reply "4"), 30 barely
  // (0.32), 40 reach 0.003.
  o.steps = f.steps > 0 ? f.steps : (tok.vocab_size() < 1000 ? 60 : 40);
  o.schedule.lr = f.lr;
  // Warm-up then cosine decay: at a constant 0.02 the last steps spike (grad norm up to 14), so whether the
  // reply comes out depended on where the last step landed: numerics as small as another libtorch's (2.6 against
  // 1.13: 8e-6 apart at step 2) ended at loss 0.0027 on one and 0.52 on the other (reply garbled). Decayed, the
  // run settles on both (0.0053 / 0.0063).
  o.schedule.kind = LrScheduleKind::cosine;
  o.schedule.warmup_steps = 4;
  o.log_every = 5;
  o.device = f.device;
  o.output_dat = (fs::path(f.out_dir) / "trained.dat").string();
  const TrainSummary s = run_training(o);
  fmt::print("smoke: train      {} steps, loss {:.4f} -> {:.4f}, {:.0f} ms/step\n", s.steps_done, s.first_loss,
             s.last_loss, s.mean_step_ms);
  for (const SlowPath& p : s.slow_paths) fmt::print("smoke: slower     {}\n", slow_path_text(p));
  fmt::print("smoke: export     {}\n", s.exported);

  const Qwen3Config config = load_config(model_files.config_path);
  DatReader reader(s.exported);
  auto model = load_model(reader, config, resolve_dtype("auto", resolve_device(f.device)), resolve_device(f.device));
  GenerateOptions g;
  g.max_new_tokens = 16;
  const auto [prompt, target] = kPairs[0];
  const std::string reply = chat_reply(*model, tok, std::nullopt, prompt, g);
  const bool ok = reply == target;
  fmt::print("smoke: generate   {:?} -> {:?} (expected {:?}) {}\n", prompt, reply, target, ok ? "ok" : "MISMATCH");
  fmt::print("smoke: {} in {:.1f} s, peak RSS {:.0f} MiB, files in {}\n", ok ? "passed" : "FAILED",
             std::chrono::duration<double>(Clock::now() - t0).count(), peak_rss_mib(), f.out_dir);
  return ok ? 0 : 1;
}

}  // namespace

Command add_smoke_command(CLI::App& app) {
  auto f = std::make_shared<SmokeFlags>();
  auto* sub = app.add_subcommand("smoke", "Synthetic model -> train -> export -> reload -> generate, in seconds");
  sub->add_option("--out-dir", f->out_dir, "where the files go")->capture_default_str();
  sub->add_option("--tokenizer", f->tokenizer, "tokenizer.json (default: the fetched Qwen3 one, else a built-in tiny one)");
  sub->add_option("--device", f->device, "cpu or cuda")->capture_default_str();
  sub->add_option("--steps", f->steps, "training steps (default: 40, or 60 with the built-in tiny tokenizer)")
      ->check(integer_in(1, flag_limit::steps));
  sub->add_option("--lr", f->lr, "peak learning rate (4 warm-up steps, then cosine decay to 0)")
      ->check(finite_number())->check(positive_number())->capture_default_str();
  sub->add_option("--seed", f->seed, "synth and data seed")->check(seed_integer())->capture_default_str();
  add_bool_flag(sub, "--moe", f->moe, "the same run on the tiny mixture-of-experts model (8 experts, 2 a token), with its load-balancing loss");
  return {sub, [f]() { return run_smoke(*f); }};
}

}  // namespace qwen3::cli
