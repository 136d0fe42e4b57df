// `eval`: next-token cross-entropy per sample and token-weighted overall. --data reads a training-format file
// with the trainer's own rules and scores it with the function training's eval_loss uses (qwen3/trainer/evaluate.h):
// the same file, weights and --seq-len give the same figure. --token-ids-file scores lines of ids, every token
// after a window's first. Both cut long sequences into windows of --seq-len + 1 tokens (docs/data.md).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "qwen3/base/file_io.h"
#include "qwen3/trainer/evaluate.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "runtime_options.h"

namespace qwen3::cli {
namespace {

struct EvalFlags {
  std::string weights, config, ids_file, data, tokenizer, data_format = "auto", system;
  DataOptions data_options;
  ChatTemplateFlags chat;
  RuntimeOptions runtime;
  bool json = false;
};

constexpr int64_t kDefaultEvalSeqLen = 2048;

// Lines of ids: windows of seq_len + 1 ids overlapping by one, each scored on its own (as the data's text rule).
Evaluation evaluate_id_lines(Qwen3Model& model, const EvalFlags& f) {
  std::ifstream in = open_input_file(f.ids_file, "--token-ids-file");
  const int64_t seq_len = f.data_options.seq_len;
  Evaluation out;
  double weighted = 0;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!is_data_line(line, f.data_options.comment_prefix)) continue;
    const std::string where = fmt::format("{}:{}", f.ids_file, n);
    const std::vector<int64_t> ids = parse_token_ids(line, where);
    if (ids.size() < 2) throw Error(where + ": a sequence needs at least 2 tokens");
    for (size_t start = 0; start + 1 < ids.size(); start += static_cast<size_t>(seq_len)) {
      const size_t end = std::min(ids.size(), start + static_cast<size_t>(seq_len) + 1);
      const SequenceLoss l = sequence_loss(model, std::vector<int64_t>(ids.begin() + start, ids.begin() + end));
      out.samples.push_back(SampleLoss{n, l.tokens, l.loss});
      weighted += l.loss * static_cast<double>(l.tokens);
      out.loss_tokens += l.tokens;
    }
  }
  if (out.samples.empty()) throw Error(f.ids_file + ": no sequences");
  out.mean_loss = weighted / static_cast<double>(out.loss_tokens);
  return out;
}

int run_eval(EvalFlags& f) {
  if (f.ids_file.empty() == f.data.empty()) throw UsageError("eval: give exactly one of --token-ids-file and --data");
  if (!f.data.empty() && f.tokenizer.empty()) throw UsageError("eval: --data needs --tokenizer");
  if (f.data.empty() && (!f.tokenizer.empty() || !f.system.empty() || f.data_format != "auto" ||
                         !f.chat.config.empty() || !f.chat.name.empty()))
    throw UsageError("eval: --tokenizer, --tokenizer-config, --chat-template, --system and --data-format apply to "
                     "--data only");
  const Qwen3Config config = load_config(f.config);
  DataOptions& d = f.data_options;
  if (config.max_position_embeddings > 0 && d.seq_len > config.max_position_embeddings)
    throw UsageError(fmt::format("eval: --seq-len {} is beyond the model's max_position_embeddings {} ({})", d.seq_len,
                                 config.max_position_embeddings, f.config));
  std::optional<TrainingData> data;
  if (!f.data.empty()) {
    const Tokenizer tok = load_tokenizer(tokenizer_source(f.tokenizer, f.chat));
    tok.check_fits_model(config.vocab_size, f.config);
    d.path = f.data;
    d.format = parse_data_format(f.data_format);
    if (!f.system.empty()) d.system = f.system;
    d.sample_mode = SampleMode::sequential;
    d.role = "data (--data)";
    data.emplace(tok, d);
  }
  const auto device = resolve_device(f.runtime.device);
  DatReader reader(f.weights);
  auto model = load_model(reader, config, resolve_dtype(f.runtime.dtype, device), device);
  const Evaluation e = data ? evaluate(*model, *data) : evaluate_id_lines(*model, f);
  if (e.samples.empty()) throw Error(f.data + ": no target carries loss");
  nlohmann::json rows = nlohmann::json::array();
  for (const SampleLoss& s : e.samples) {
    rows.push_back({{"line", s.line}, {"tokens", s.loss_tokens}, {"loss", s.loss}});
    if (!f.json) fmt::print("line {}: {} tokens, loss {:.6f}\n", s.line, s.loss_tokens, s.loss);
  }
  if (f.json)
    fmt::print("{}\n", nlohmann::json{{"sequences", rows}, {"mean_loss", e.mean_loss}}.dump());
  else
    fmt::print("mean loss {:.6f} over {} tokens in {} samples\n", e.mean_loss, e.loss_tokens, e.samples.size());
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  f->data_options.seq_len = kDefaultEvalSeqLen;
  auto* sub = app.add_subcommand("eval", "Next-token cross-entropy of held-out data under a .dat model");
  sub->add_option("--weights", f->weights, "model .dat (NVFP4 or dense)")->required();
  sub->add_option("--config", f->config, "config.json")->required();
  sub->add_option("--data", f->data, "training-format data: TSV pairs, text lines or JSON records (needs --tokenizer)");
  sub->add_option("--token-ids-file", f->ids_file, "one sequence of space-separated ids a line");
  sub->add_option("--tokenizer", f->tokenizer, "tokenizer.json for --data");
  sub->add_option("--data-format", f->data_format, "auto, tsv, text, chat, alpaca or text-jsonl (as train)")->capture_default_str();
  sub->add_option("--system", f->system, "system prompt of pairs and records without one (as train)");
  add_chat_template_flags(sub, f->chat);
  sub->add_option("--seq-len", f->data_options.seq_len,
                  "positions per window; longer samples are scored in windows (as train's eval_loss)")
      ->check(positive_number())->capture_default_str();
  sub->add_option("--batch-size", f->data_options.batch_size, "samples per forward (the figures do not depend on it)")
      ->check(positive_number())->capture_default_str();
  sub->add_option("--comment-prefix", f->data_options.comment_prefix, "lines starting with it are comments ('': none)")
      ->capture_default_str();
  add_bool_flag(sub, "--strict-data", f->data_options.strict, "a bad data line is fatal instead of skipped");
  add_bool_flag(sub, "--json", f->json, "print {\"sequences\": [{\"line\", \"tokens\", \"loss\"}], \"mean_loss\"}");
  add_runtime_options(sub, f->runtime);
  return {sub, [f]() { return run_eval(*f); }};
}

}  // namespace qwen3::cli
