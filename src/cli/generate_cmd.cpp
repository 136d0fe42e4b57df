// `generate`: load a model, wrap the prompt in the chat format (unless --no-chat or --prompt-ids), stream the
// reply as it decodes, and optionally check it against --expect (the original's after-export self-test).
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <regex>

#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "runtime_options.h"

namespace qwen3::cli {
namespace {

struct GenerateFlags {
  std::string weights, config, tokenizer, prompt, prompt_ids, system, expect;
  RuntimeOptions runtime;
  ChatTemplateFlags chat;
  GenerateOptions gen;
  bool no_chat = false, ignore_eos = false, print_ids = false;
  bool seed_given = false;  // --seed on the command line (its default, 0, is a seed too)
};

// Prints the text of the ids generated so far, holding back a trailing incomplete UTF-8 character.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(const Tokenizer* tok) : tok_(tok) {}
  void add(int64_t id) {
    if (!tok_) return;
    // The model's vocabulary is padded past the tokenizer's (151936 vs 151669 for Qwen3): an id that names no
    // token has no text, as in the HF decoder. It still shows in --print-ids.
    if (id < 0 || static_cast<size_t>(id) >= tok_->vocab_size()) return;
    ids_.push_back(static_cast<TokenId>(id));
    const std::string text = tok_->decode(ids_, /*skip_special=*/true);
    size_t stable = text.size();
    if (ends_with(text, "\xEF\xBF\xBD")) stable -= 3;  // U+FFFD: maybe half a character so far
    if (stable > printed_) {
      fmt::print("{}", text.substr(printed_, stable - printed_));
      std::fflush(stdout);
      printed_ = stable;
    }
  }
  std::string finish() {
    if (!tok_) return {};
    const std::string text = tok_->decode(ids_, true);
    if (text.size() > printed_) fmt::print("{}", text.substr(printed_));
    fmt::print("\n");
    std::fflush(stdout);  // the reply's line is out before any log line (stderr) that follows it
    return text;
  }

 private:
  const Tokenizer* tok_;
  std::vector<TokenId> ids_;
  size_t printed_ = 0;
};

int run_generate(const GenerateFlags& f) {
  if (f.prompt.empty() == f.prompt_ids.empty()) throw UsageError("generate: give exactly one of --prompt and --prompt-ids");
  // What renders a chat prompt applies to one: --prompt-ids are fed as they are, --no-chat encodes the text alone
  // (each of these was ignored there, silently).
  if (!f.prompt_ids.empty() && f.no_chat) throw UsageError("generate: --no-chat applies to --prompt");
  const bool chat_prompt = !f.prompt.empty() && !f.no_chat;
  if (!chat_prompt && !f.system.empty())
    throw UsageError("generate: --system applies to a chat prompt (--prompt without --no-chat)");
  if (!chat_prompt && (!f.chat.config.empty() || !f.chat.name.empty()))
    throw UsageError("generate: --tokenizer-config and --chat-template apply to a chat prompt (--prompt without "
                     "--no-chat)");
  // The sampling flags shape a sampled draw; greedy decoding (--temperature 0, the default) takes the most likely
  // token, and ignored them silently (transformers warns of the same: top_k set while do_sample is False).
  if (f.gen.sampling.temperature == 0) {
    std::vector<std::string> unused;
    if (f.gen.sampling.top_k != 0) unused.push_back("--top-k");
    if (f.gen.sampling.top_p != 1) unused.push_back("--top-p");
    if (f.seed_given) unused.push_back("--seed");
    if (!unused.empty())
      throw UsageError(fmt::format("generate: {} shape(s) sampling, which --temperature above 0 turns on; with "
                                   "--temperature 0 (the default) each token is the most likely one",
                                   fmt::join(unused, ", ")));
  }
  const bool need_tokenizer = !f.prompt.empty() || !f.print_ids || !f.expect.empty();
  if (need_tokenizer && f.tokenizer.empty())
    throw UsageError("generate: --tokenizer is needed unless both --prompt-ids and --print-ids are given");
  std::optional<std::regex> expect;
  if (!f.expect.empty()) {
    try {
      expect.emplace(f.expect);
    } catch (const std::regex_error& e) {
      throw UsageError("--expect: invalid regular expression: " + std::string(e.what()));
    }
  }
  std::optional<Tokenizer> tok;
  if (!f.tokenizer.empty()) tok.emplace(load_tokenizer(tokenizer_source(f.tokenizer, f.chat)));
  const Qwen3Config config = load_config(f.config);
  if (tok) tok->check_fits_model(config.vocab_size, f.config);
  const auto device = resolve_device(f.runtime.device);
  const auto dtype = resolve_dtype(f.runtime.dtype, device);

  std::vector<int64_t> prompt;
  if (!f.prompt_ids.empty()) {
    try {
      prompt = parse_token_ids(f.prompt_ids, "--prompt-ids");
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {  // the text of a flag: a usage error
      throw UsageError(e.what());
    }
  } else {
    std::optional<std::string> system;
    if (!f.system.empty()) system = f.system;
    const auto ids = f.no_chat ? tok->encode(f.prompt) : chat_generation_prompt(*tok, system, f.prompt);
    prompt.assign(ids.begin(), ids.end());
  }
  GenerateOptions gen = f.gen;
  if (!f.ignore_eos) {
    gen.stop_ids = tok ? chat_stop_ids(config, *tok) : config.eos_token_ids;
  }

  const auto t0 = std::chrono::steady_clock::now();
  DatReader reader(f.weights);
  auto model = load_model(reader, config, dtype, device);
  const auto t1 = std::chrono::steady_clock::now();
  ReplyPrinter printer(tok ? &*tok : nullptr);
  const auto out = generate(*model, prompt, gen, [&](int64_t id) { printer.add(id); });
  const std::string reply = printer.finish();
  const auto t2 = std::chrono::steady_clock::now();
  warn_of_slow_paths("generate");
  if (f.print_ids) {
    fmt::print("{}\n", fmt::join(out, " "));
    std::fflush(stdout);
  }
  const double gen_s = std::chrono::duration<double>(t2 - t1).count();
  spdlog::info("generate: load {:.2f} s, {} prompt + {} new tokens in {:.2f} s ({:.1f} tok/s)",
               std::chrono::duration<double>(t1 - t0).count(), prompt.size(), out.size(), gen_s, out.size() / gen_s);
  if (expect && !std::regex_search(reply, *expect)) {
    fmt::print(stderr, "error: the reply does not match --expect '{}'\n", f.expect);
    return 1;
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  auto* sub = app.add_subcommand("generate", "Generate a reply from a .dat model (KV cache, greedy or sampled)");
  sub->add_option("--weights", f->weights, "model .dat (NVFP4 or dense)")->required();
  sub->add_option("--config", f->config, "config.json")->required();
  sub->add_option("--tokenizer", f->tokenizer, "tokenizer.json (optional with --prompt-ids --print-ids)");
  sub->add_option("--prompt", f->prompt, "the user message (wrapped in the chat format unless --no-chat)");
  sub->add_option("--prompt-ids", f->prompt_ids,
                  "raw prompt token ids (spaces or commas; [brackets] allowed), fed as they are");
  sub->add_option("--system", f->system, "system prompt for the chat format");
  add_chat_template_flags(sub, f->chat);
  sub->add_option("--max-new-tokens", f->gen.max_new_tokens, "most tokens to generate")
      ->check(integer_in(1, flag_limit::tokens))->capture_default_str();
  sub->add_option("--temperature", f->gen.sampling.temperature, "0 = greedy")
      ->check(finite_number())
      ->check(non_negative_number())
      ->check(at_most(100, "logits divided by more are uniform noise"))
      ->capture_default_str();
  sub->add_option("--top-k", f->gen.sampling.top_k, "keep the k most likely tokens (0 = all)")
      ->check(integer_in(0, flag_limit::top_k))->capture_default_str();
  sub->add_option("--top-p", f->gen.sampling.top_p, "nucleus: smallest set with this much probability")
      ->check(finite_number())
      ->check(CLI::Validator(
          [](std::string& text) {
            const double v = std::strtod(text.c_str(), nullptr);
            return v > 0 && v <= 1 ? std::string() : "a probability in (0, 1]: more than 0, at most 1; got " + text;
          },
          "(0, 1]"))
      ->capture_default_str();
  auto* seed =
      sub->add_option("--seed", f->gen.sampling.seed, "sampling seed")->check(seed_integer())->capture_default_str();
  sub->add_option("--prefill-chunk", f->gen.prefill_chunk, "prompt tokens per forward pass")
      ->check(integer_in(1, flag_limit::tokens))->capture_default_str();
  add_bool_flag(sub, "--no-chat", f->no_chat, "encode --prompt as it is, without the chat format");
  add_bool_flag(sub, "--ignore-eos", f->ignore_eos, "do not stop at EOS / <|im_end|>");
  add_bool_flag(sub, "--print-ids", f->print_ids, "also print the generated ids as one line");
  sub->add_option("--expect", f->expect, "exit 1 unless the reply matches this regular expression (ECMAScript)");
  add_runtime_options(sub, f->runtime);
  return {sub, [f, seed]() {
            f->seed_given = seed->count() > 0;
            return run_generate(*f);
          }};
}

}  // namespace qwen3::cli
