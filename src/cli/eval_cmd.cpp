// `eval`: next-token cross-entropy of each sequence of a file, per sequence and token-weighted overall.
// Sequences are lines of ids (--token-ids-file) or lines of text / TSV pairs tokenized (--data): a TSV line
// is rendered in the chat format, a plain line is encoded as it is. Empty lines and lines starting with '#'
// are skipped, as in the original's data files.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "qwen3/chat_format.h"
#include "qwen3/generate.h"
#include "qwen3/model_loader.h"
#include "runtime_options.h"

namespace qwen3::cli {
namespace {

struct EvalFlags {
  std::string weights, config, ids_file, data, tokenizer;
  RuntimeOptions runtime;
  bool json = false;
};

struct Sequence {
  int line = 0;
  std::vector<int64_t> ids;
};

std::vector<Sequence> read_sequences(const EvalFlags& f) {
  const std::string& path = f.ids_file.empty() ? f.data : f.ids_file;
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  std::optional<Tokenizer> tok;
  if (!f.data.empty()) tok.emplace(Tokenizer::from_file(f.tokenizer));
  std::vector<Sequence> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const std::string where = path + ":" + std::to_string(n);
    Sequence s{n, {}};
    if (tok) {
      const size_t tab = line.find('\t');
      std::vector<TokenId> ids;
      if (tab == std::string::npos)
        ids = tok->encode(line);
      else
        ids = render_chat(*tok, ChatTurn{std::nullopt, line.substr(0, tab), line.substr(tab + 1)}).ids;
      s.ids.assign(ids.begin(), ids.end());
    } else {
      s.ids = parse_token_ids(line, where);
    }
    if (s.ids.size() < 2) throw Error(where + ": a sequence needs at least 2 tokens");
    out.push_back(std::move(s));
  }
  if (out.empty()) throw Error(path + ": no sequences");
  return out;
}

int run_eval(const EvalFlags& f) {
  if (f.ids_file.empty() == f.data.empty()) throw UsageError("eval: give exactly one of --token-ids-file and --data");
  if (!f.data.empty() && f.tokenizer.empty()) throw UsageError("eval: --data needs --tokenizer");
  const auto sequences = read_sequences(f);
  const Qwen3Config config = load_config(f.config);
  const auto device = resolve_device(f.runtime.device);
  DatReader reader(f.weights);
  auto model = load_model(reader, config, resolve_dtype(f.runtime.dtype, device), device);
  nlohmann::json rows = nlohmann::json::array();
  double weighted = 0;
  int64_t tokens = 0;
  for (const auto& s : sequences) {
    const SequenceLoss l = sequence_loss(*model, s.ids);
    weighted += l.loss * l.tokens;
    tokens += l.tokens;
    rows.push_back({{"tokens", l.tokens}, {"loss", l.loss}});
    if (!f.json) fmt::print("line {}: {} tokens, loss {:.6f}\n", s.line, l.tokens, l.loss);
  }
  const double mean = weighted / tokens;
  if (f.json)
    fmt::print("{}\n", nlohmann::json{{"sequences", rows}, {"mean_loss", mean}}.dump());
  else
    fmt::print("mean loss {:.6f} over {} tokens in {} sequences\n", mean, tokens, sequences.size());
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  auto* sub = app.add_subcommand("eval", "Next-token cross-entropy of sequences under a .dat model");
  sub->add_option("--weights", f->weights, "model .dat (NVFP4 or dense)")->required();
  sub->add_option("--config", f->config, "config.json")->required();
  sub->add_option("--token-ids-file", f->ids_file, "one sequence of space-separated ids a line");
  sub->add_option("--data", f->data, "one text line or prompt<TAB>target pair a line (needs --tokenizer)");
  sub->add_option("--tokenizer", f->tokenizer, "tokenizer.json for --data");
  add_bool_flag(sub, "--json", f->json, "print {\"sequences\": [{\"tokens\", \"loss\"}], \"mean_loss\"}");
  add_runtime_options(sub, f->runtime);
  return {sub, [f]() { return run_eval(*f); }};
}

}  // namespace qwen3::cli
