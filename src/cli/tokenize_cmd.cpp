// `tokenize`: text to token ids with a model's tokenizer.json, or ids back to text with --decode.
//   --text STR  one input (its newlines are part of it); with --decode, each line of it is one input
//   --file F    one input per line (a trailing \r is dropped, so CRLF files read as expected)
//   --chat F    a chat or alpaca file (JSON Lines or a JSON array): each record rendered with the chat template
// Prints one line per input: space-separated ids, or the decoded text; --json prints [[ids...], ...] or
// ["text", ...] instead; with --chat, [{"ids": [...], "loss_mask": [0|1, ...]}, ...] (a line of ids, and a
// line of the mask, per record, without --json).
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cli_common.h"
#include "qwen3/base/file_io.h"
#include "qwen3/base/error.h"
#include "qwen3/data/data.h"
#include "qwen3/tokenizer/tokenizer.h"
#include "runtime_options.h"

namespace qwen3::cli {
namespace {

struct Input {
  std::string text;
  std::string where;  // for messages: "--text" or "FILE:LINE"
};

std::vector<Input> split_lines(const std::string& all, const std::string& source, bool name_lines) {
  std::vector<Input> inputs;
  size_t start = 0, line = 1;
  while (start < all.size()) {
    size_t end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    std::string text = all.substr(start, end - start);
    if (!text.empty() && text.back() == '\r') text.pop_back();
    inputs.push_back({std::move(text), name_lines ? fmt::format("{}:{}", source, line) : source});
    start = end + 1;
    ++line;
  }
  return inputs;
}

std::string read_file(const std::string& path) {
  std::ifstream in = open_input_file(path, "tokenize: input", std::ios::binary);
  std::ostringstream all;
  all << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("tokenize: cannot read {}", path));
  return all.str();
}

// A line of ids as generate's --prompt-ids and eval's --token-ids-file read them (parse_token_ids: spaces or
// commas, brackets allowed). A bad id in --text is a bad flag value (exit 2); in a file, bad data (exit 1).
std::vector<TokenId> parse_ids(const Input& input, bool from_flag) {
  std::vector<int64_t> read;
  try {
    read = parse_token_ids(input.text, "tokenize --decode: " + input.where);
  } catch (const Error& e) {
    if (from_flag) throw UsageError(e.what());
    throw;
  }
  return std::vector<TokenId>(read.begin(), read.end());
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string tokenizer, text, file, chat, system;
    ChatTemplateFlags chat_template;
    bool json = false, decode = false;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("tokenize", "Turn text into token ids, or ids into text (--decode)");
  sub->add_option("--tokenizer", o->tokenizer, "the model's tokenizer.json")->required();
  auto* text = sub->add_option("--text", o->text, "one input (newlines are part of it; --decode: a line of ids each)");
  auto* file = sub->add_option("--file", o->file, "a file of inputs, one a line");
  auto* chat = sub->add_option("--chat", o->chat, "chat/alpaca records (JSONL or a JSON array): ids and loss mask each");
  text->excludes(file);
  chat->excludes(text)->excludes(file);
  sub->add_option("--system", o->system, "with --chat: system prompt of records without one");
  add_chat_template_flags(sub, o->chat_template);
  add_bool_flag(sub, "--json", o->json, "print [[ids...], ...] (with --decode: [\"text\", ...])");
  add_bool_flag(sub, "--decode", o->decode,
                "read lines of ids (spaces or commas; [brackets] allowed) and print their text");
  return {sub, [o, text, file, chat]() {
            if (chat->count() > 0) {
              if (o->decode) throw UsageError("tokenize: --chat renders records; it does not decode");
              const Tokenizer tokenizer = load_tokenizer(tokenizer_source(o->tokenizer, o->chat_template));
              std::optional<std::string> system;
              if (!o->system.empty()) system = o->system;
              nlohmann::json all = nlohmann::json::array();
              std::string out;
              for (const ChatTokens& c : render_chat_file(tokenizer, o->chat, system)) {
                if (o->json)
                  all.push_back({{"ids", c.ids}, {"loss_mask", c.loss_mask}});
                else
                  out += fmt::format("{}\n{}\n", fmt::join(c.ids, " "), fmt::join(c.loss_mask, " "));
              }
              if (o->json) out = all.dump() + "\n";
              std::fwrite(out.data(), 1, out.size(), stdout);
              return 0;
            }
            if (!o->system.empty()) throw UsageError("tokenize: --system applies to --chat");
            // Text is encoded as it is, ids decoded as they are: no template renders them (both were ignored).
            if (!o->chat_template.config.empty() || !o->chat_template.name.empty())
              throw UsageError("tokenize: --tokenizer-config and --chat-template apply to --chat");
            if (text->count() == 0 && file->count() == 0) throw UsageError("tokenize: give --text, --file or --chat");
            const bool from_flag = text->count() > 0;
            std::vector<Input> inputs;
            if (!from_flag)
              inputs = split_lines(read_file(o->file), o->file, true);
            else if (o->decode)
              inputs = split_lines(o->text, "--text", false);
            else
              inputs.push_back({o->text, "--text"});
            const Tokenizer tokenizer = load_tokenizer(tokenizer_source(o->tokenizer, o->chat_template));

            nlohmann::json all = nlohmann::json::array();
            std::string out;
            for (const Input& input : inputs) {
              if (o->decode) {
                const std::string decoded = tokenizer.decode(parse_ids(input, from_flag));
                if (o->json) all.push_back(decoded);
                else out += decoded + "\n";
                continue;
              }
              std::vector<TokenId> ids;
              try {
                ids = tokenizer.encode(input.text);
              } catch (const UsageError&) {
                throw;
              } catch (const Error& e) {
                throw Error(fmt::format("{}: {}", input.where, e.what()));
              }
              if (o->json) all.push_back(ids);
              else out += fmt::format("{}\n", fmt::join(ids, " "));
              if (out.size() > (1u << 20)) {  // stream large files instead of holding all of the output
                std::fwrite(out.data(), 1, out.size(), stdout);
                out.clear();
              }
            }
            // Invalid UTF-8 from --decode is already U+FFFD, so dump() cannot throw on it.
            if (o->json) out = all.dump() + "\n";
            std::fwrite(out.data(), 1, out.size(), stdout);
            return 0;
          }};
}

}  // namespace qwen3::cli
