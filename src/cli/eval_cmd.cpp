// `eval`: next-token cross-entropy per sample and token-weighted overall. --data reads a training-format file
// with the trainer's own rules and scores it with the function training's eval_loss uses (qwen3/trainer/evaluate.h):
// the same file, weights and --seq-len give the same figure. --token-ids-file scores lines of ids, every token
// after a window's first. Both cut long sequences into windows of --seq-len + 1 tokens (docs/data.md).
// --logits-out writes the fp32 logits of every --token-ids-file window to a safetensors file: what an independent
// implementation (bench/hf_peer.py, Hugging Face transformers) is compared with.
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include "qwen3/base/file_io.h"
#include "qwen3/convert/safetensors_writer.h"
#include "qwen3/export/output_target.h"
#include "qwen3/trainer/evaluate.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "runtime_options.h"

namespace qwen3::cli {
namespace {

struct EvalFlags {
  std::string weights, config, ids_file, data, tokenizer, data_format = "auto", system, logits_out;
  DataOptions data_options;
  ChatTemplateFlags chat;
  RuntimeOptions runtime;
  bool json = false, overwrite = false;
  bool batch_size_given = false;  // --batch-size on the command line (--data's samples per forward)
};

constexpr int64_t kDefaultEvalSeqLen = 2048;

struct IdWindow {
  int64_t line = 0, start = 0;  // the file line and the window's first id's place in it
  std::vector<int64_t> ids;
};

// Lines of ids as windows of seq_len + 1 ids overlapping by one, each scored on its own (as the data's text rule).
// Read whole before anything runs, so a bad line fails before the model is loaded and the logits file's layout
// is known up front.
std::vector<IdWindow> read_id_windows(const EvalFlags& f) {
  std::ifstream in = open_input_file(f.ids_file, "--token-ids-file");
  const auto seq_len = static_cast<size_t>(f.data_options.seq_len);
  std::vector<IdWindow> windows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!is_data_line(line, f.data_options.comment_prefix)) continue;
    const std::string where = fmt::format("{}:{}", f.ids_file, n);
    const std::vector<int64_t> ids = parse_token_ids(line, where);
    if (ids.size() < 2) throw Error(where + ": a sequence needs at least 2 tokens");
    for (size_t start = 0; start + 1 < ids.size(); start += seq_len) {
      const size_t end = std::min(ids.size(), start + seq_len + 1);
      windows.push_back({n, static_cast<int64_t>(start), std::vector<int64_t>(ids.begin() + start, ids.begin() + end)});
    }
  }
  if (windows.empty()) throw Error(f.ids_file + ": no sequences");
  return windows;
}

// `logits.K` [ids - 1, vocab] F32: the logits at every position of window K but the last (the ones its loss
// scores), and `ids.K` [ids] I64; the metadata's "windows" lists each K's file line and start. A mixture-of-
// experts model adds `experts.K` [sparse blocks, ids - 1, k] I64: each sparse block's chosen experts at each of
// those positions, most probable first (what an independent implementation's routing is compared with).
class LogitsFile {
 public:
  LogitsFile(const std::string& path, const std::vector<IdWindow>& windows, const Qwen3Config& config)
      : sparse_blocks_(sparse_blocks(config.shape())), top_k_(config.num_experts_per_tok) {
    std::vector<SafetensorsSpec> specs;
    nlohmann::json where = nlohmann::json::array();
    for (size_t k = 0; k < windows.size(); ++k) {
      const auto n = static_cast<int64_t>(windows[k].ids.size());
      specs.push_back({fmt::format("ids.{}", k), "I64", {n}});
      specs.push_back({fmt::format("logits.{}", k), "F32", {n - 1, config.vocab_size}});
      if (sparse_blocks_ > 0) specs.push_back({fmt::format("experts.{}", k), "I64", {sparse_blocks_, n - 1, top_k_}});
      where.push_back({{"line", windows[k].line}, {"start", windows[k].start}});
    }
    writer_.emplace(path, std::move(specs), nlohmann::json{{"format", "pt"}, {"windows", where.dump()}});
  }
  bool wants_routing() const { return sparse_blocks_ > 0; }
  // `router_logits`: the sparse blocks' [positions, experts] of this window's forward, in block order.
  void add(const IdWindow& w, const at::Tensor& logits, const std::vector<at::Tensor>& router_logits) {
    writer_->write(w.ids.data(), w.ids.size() * sizeof(int64_t));
    const at::Tensor host = logits.to(at::kCPU, at::kFloat).contiguous();
    writer_->write(host.data_ptr<float>(), static_cast<uint64_t>(host.numel()) * sizeof(float));
    if (sparse_blocks_ == 0) return;
    if (static_cast<int64_t>(router_logits.size()) != sparse_blocks_)
      throw Error(fmt::format("eval: {} sparse blocks routed, {} expected", router_logits.size(), sparse_blocks_));
    std::vector<at::Tensor> chosen;
    for (const at::Tensor& r : router_logits)  // the block's own rule: fp32 softmax, its top k
      chosen.push_back(std::get<1>(at::topk(at::softmax(r, -1, at::kFloat), top_k_, -1)).cpu());
    const at::Tensor experts = at::stack(chosen).to(at::kLong).contiguous();
    writer_->write(experts.data_ptr<int64_t>(), static_cast<uint64_t>(experts.numel()) * sizeof(int64_t));
  }
  void commit() { writer_->commit(); }

 private:
  static int64_t sparse_blocks(const ModelShape& s) {
    int64_t n = 0;
    for (int64_t l = 0; l < s.layers; ++l) n += s.moe_layer(l) ? 1 : 0;
    return n;
  }
  int64_t sparse_blocks_, top_k_;
  std::optional<SafetensorsWriter> writer_;
};

Evaluation evaluate_id_windows(Qwen3Model& model, const std::vector<IdWindow>& windows, LogitsFile* logits) {
  Evaluation out;
  double weighted = 0;
  for (const IdWindow& w : windows) {
    const SequenceLoss l = sequence_loss(model, w.ids);
    if (logits) {
      at::NoGradGuard no_grad;
      const auto inputs = static_cast<int64_t>(w.ids.size()) - 1;
      model.set_router_logits_recording(logits->wants_routing());
      const at::Tensor window_logits = model.forward(at::tensor(w.ids, at::kLong).narrow(0, 0, inputs).unsqueeze(0))[0];
      model.set_router_logits_recording(false);
      logits->add(w, window_logits, model.take_router_logits());
    }
    out.samples.push_back(SampleLoss{w.line, l.tokens, l.loss});
    weighted += l.loss * static_cast<double>(l.tokens);
    out.loss_tokens += l.tokens;
  }
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
  if (!f.logits_out.empty() && f.ids_file.empty()) throw UsageError("eval: --logits-out needs --token-ids-file");
  // A line of ids that does not parse is always an error: there is nothing for --strict-data to make fatal.
  if (f.data_options.strict && !f.ids_file.empty())
    throw UsageError("eval: --strict-data applies to --data only (a bad --token-ids-file line is always an error)");
  if (f.batch_size_given && !f.ids_file.empty())
    throw UsageError("eval: --batch-size applies to --data only (--token-ids-file scores one window a forward)");
  if (f.overwrite && f.logits_out.empty()) throw UsageError("eval: --overwrite applies to --logits-out only");
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
  std::vector<IdWindow> windows;
  if (!data) windows = read_id_windows(f);
  if (!f.logits_out.empty())
    prepare_output_target("--logits-out", f.logits_out, f.overwrite, {f.weights, f.config, f.ids_file});
  const auto device = resolve_device(f.runtime.device);
  DatReader reader(f.weights);
  auto model = load_model(reader, config, resolve_dtype(f.runtime.dtype, device), device);
  std::optional<LogitsFile> logits;
  if (!f.logits_out.empty()) logits.emplace(f.logits_out, windows, config);
  const Evaluation e = data ? evaluate(*model, *data) : evaluate_id_windows(*model, windows, logits ? &*logits : nullptr);
  if (logits) logits->commit();
  warn_of_slow_paths("eval");
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
  sub->add_option("--token-ids-file", f->ids_file, "one sequence of ids a line (spaces or commas between them)");
  sub->add_option("--tokenizer", f->tokenizer, "tokenizer.json for --data");
  sub->add_option("--data-format", f->data_format, "auto, tsv, text, chat, alpaca or text-jsonl (as train)")->capture_default_str();
  sub->add_option("--system", f->system, "system prompt of pairs and records without one (as train)");
  add_chat_template_flags(sub, f->chat);
  sub->add_option("--seq-len", f->data_options.seq_len,
                  "positions per window; longer samples are scored in windows (as train's eval_loss)")
      ->check(integer_in(1, flag_limit::seq_len))->capture_default_str();
  auto* batch = sub->add_option("--batch-size", f->data_options.batch_size,
                                "with --data: samples per forward (the figures do not depend on it)")
                    ->check(integer_in(1, flag_limit::batch_rows))->capture_default_str();
  sub->add_option("--comment-prefix", f->data_options.comment_prefix, "lines starting with it are comments ('': none)")
      ->capture_default_str();
  add_bool_flag(sub, "--strict-data", f->data_options.strict, "a bad data line is fatal instead of skipped");
  sub->add_option("--logits-out", f->logits_out,
                  "with --token-ids-file: write each window's fp32 logits to this safetensors file "
                  "(logits.K [ids - 1, vocab], ids.K; 4 bytes x vocab per token)");
  add_bool_flag(sub, "--overwrite", f->overwrite, "replace an existing --logits-out (never an input)");
  add_bool_flag(sub, "--json", f->json, "print {\"sequences\": [{\"line\", \"tokens\", \"loss\"}], \"mean_loss\"}");
  add_runtime_options(sub, f->runtime);
  return {sub, [f, batch]() {
            f->batch_size_given = batch->count() > 0;
            return run_eval(*f);
          }};
}

}  // namespace qwen3::cli
