// Reading tokenizer.json: every part the encoding depends on is checked, and anything this implementation
// would compute differently from the reference is refused with a message rather than silently ignored.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "qwen3/base/error.h"
#include "qwen3/base/json_limits.h"
#include "tokenizer_impl.h"
#include "unicode_text.h"

namespace qwen3 {
namespace {

using nlohmann::json;

class Loader {
 public:
  explicit Loader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& what) const { throw Error("tokenizer " + source_ + ": " + what); }

  const json& member(const json& object, const char* key, const std::string& where) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(where + " has no \"" + key + "\"");
    return *it;
  }
  bool flag(const json& object, const char* key, bool fallback, const std::string& where) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(where + "." + key + " must be true or false");
    return it->get<bool>();
  }
  std::string type_of(const json& object, const std::string& where) const {
    if (!object.is_object()) fail(where + " must be an object");
    const json& type = member(object, "type", where);
    if (!type.is_string()) fail(where + ".type must be a string");
    return type.get<std::string>();
  }
  TokenId id_value(const json& v, const std::string& where) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= INT32_MAX)
      fail(where + " must be a token id (an integer from 0 to 2^31 - 2)");
    return static_cast<TokenId>(v.get<int64_t>());
  }

  void model(const json& m, Tokenizer::Impl& t, std::vector<const std::string*>& spelled_by_id) const {
    if (!m.is_object()) fail("\"model\" must be an object");
    if (m.contains("type") && type_of(m, "model") != "BPE")
      fail("model.type is \"" + m["type"].get<std::string>() + "\"; only BPE is supported");
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0)
      fail("model.dropout is set; BPE dropout is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && m[key] != "")
        fail(std::string("model.") + key + " is set; only byte-level BPE without affixes is supported");
    if (flag(m, "byte_fallback", false, "model"))
      fail("model.byte_fallback is true (SentencePiece-style <0x..> tokens); only byte-level BPE is supported");
    t.ignore_merges = flag(m, "ignore_merges", false, "model");

    const json& vocab = member(m, "vocab", "model");
    if (!vocab.is_object() || vocab.empty()) fail("model.vocab must be a non-empty object of token: id");
    t.spelled_to_id.reserve(vocab.size() * 2);
    for (const auto& [spelled, id_json] : vocab.items()) {
      const TokenId id = id_value(id_json, "model.vocab[\"" + spelled + "\"]");
      if (size_t(id) >= spelled_by_id.size()) spelled_by_id.resize(size_t(id) + 1, nullptr);
      if (spelled_by_id[id]) fail("model.vocab gives id " + std::to_string(id) + " to two tokens");
      spelled_by_id[id] = &t.spelled_to_id.emplace(spelled, id).first->first;
    }
    for (int b = 0; b < 256; ++b) {
      const std::string spelled = tok::bytes_to_byte_level(std::string(1, char(b)));
      const auto it = t.spelled_to_id.find(spelled);
      if (it == t.spelled_to_id.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        fail(std::string("model.vocab has no token for byte ") + hex + " (\"" + spelled +
             "\"); a byte-level vocabulary needs all 256");
      }
      t.byte_ids[b] = it->second;
    }

    const json& merges = member(m, "merges", "model");
    if (!merges.is_array()) fail("model.merges must be an array");
    t.merges.reserve(merges.size());
    std::string left, right;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& merge = merges[rank];
      const std::string where = "model.merges[" + std::to_string(rank) + "]";
      if (merge.is_string()) {  // the older "a b" form
        const std::string& s = merge.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          fail(where + " (\"" + s + "\") must be two tokens separated by one space");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        fail(where + " must be \"a b\" or [\"a\", \"b\"]");
      }
      const auto l = t.spelled_to_id.find(left), r = t.spelled_to_id.find(right);
      const auto merged = t.spelled_to_id.find(left + right);
      if (l == t.spelled_to_id.end() || r == t.spelled_to_id.end())
        fail(where + ": \"" + (l == t.spelled_to_id.end() ? left : right) + "\" is not in model.vocab");
      if (merged == t.spelled_to_id.end())
        fail(where + ": the merged token \"" + left + right + "\" is not in model.vocab");
      t.merges.insert(l->second, r->second, static_cast<uint32_t>(rank), merged->second);
    }
    t.merge_count = merges.size();
  }

  void added_tokens(const json& list, Tokenizer::Impl& t) const {
    if (list.is_null()) return;
    if (!list.is_array()) fail("\"added_tokens\" must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json& a = list[i];
      if (!a.is_object()) fail(where + " must be an object");
      AddedToken token;
      token.id = id_value(member(a, "id", where), where + ".id");
      const json& content = member(a, "content", where);
      if (!content.is_string() || content.get_ref<const std::string&>().empty())
        fail(where + ".content must be a non-empty string");
      token.content = content.get<std::string>();
      if (unicode::first_invalid_utf8(token.content) != std::string::npos) fail(where + ".content is not UTF-8");
      token.special = flag(a, "special", false, where);
      token.normalized = flag(a, "normalized", !token.special, where);  // the references' default
      token.lstrip = flag(a, "lstrip", false, where);
      token.rstrip = flag(a, "rstrip", false, where);
      token.single_word = flag(a, "single_word", false, where);
      t.added.push_back(std::move(token));
    }
  }

  void normalizer(const json& n, Tokenizer::Impl& t) const {
    if (n.is_null()) return;
    const std::string type = type_of(n, "normalizer");
    if (type == "NFC") {
      t.nfc = true;
    } else if (type == "Sequence" && member(n, "normalizers", "normalizer").is_array()) {
      for (const json& part : n["normalizers"]) {
        if (type_of(part, "normalizer.normalizers[]") != "NFC")
          fail("normalizer " + part["type"].get<std::string>() + " is not supported (only NFC)");
        t.nfc = true;
      }
    } else {
      fail("normalizer " + type + " is not supported (only NFC)");
    }
  }

  void pre_tokenizer(const json& p, Tokenizer::Impl& t) const {
    if (p.is_null()) fail("pre_tokenizer is null; byte-level BPE needs a ByteLevel pre-tokenizer");
    std::vector<const json*> steps;
    if (type_of(p, "pre_tokenizer") == "Sequence") {
      const json& list = member(p, "pretokenizers", "pre_tokenizer");
      if (!list.is_array()) fail("pre_tokenizer.pretokenizers must be an array");
      for (const json& s : list) steps.push_back(&s);
    } else {
      steps.push_back(&p);
    }
    std::string pattern;
    bool byte_level = false;
    for (const json* s : steps) {
      const std::string type = type_of(*s, "pre_tokenizer step");
      if (type == "Split" && pattern.empty() && !byte_level) {
        const json& pat = member(*s, "pattern", "pre_tokenizer Split");
        if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
          fail("pre_tokenizer Split: only {\"Regex\": ...} patterns are supported");
        pattern = pat["Regex"].get<std::string>();
        if (pattern.empty()) fail("pre_tokenizer Split: the pattern is empty");
        const json behavior = s->value("behavior", json("Isolated"));
        if (behavior != "Isolated" || flag(*s, "invert", false, "pre_tokenizer Split"))
          fail("pre_tokenizer Split: only behavior Isolated without invert is supported");
      } else if (type == "ByteLevel" && !byte_level) {
        if (flag(*s, "add_prefix_space", false, "pre_tokenizer ByteLevel"))
          fail("pre_tokenizer ByteLevel: add_prefix_space = true is not supported");
        if (flag(*s, "use_regex", true, "pre_tokenizer ByteLevel")) {
          if (!pattern.empty()) fail("pre_tokenizer: a Split followed by ByteLevel with use_regex is not supported");
          pattern = tok::kGpt2Pattern;
        }
        byte_level = true;
      } else {
        fail("pre_tokenizer: " + type + " here is not supported (expected [Split,] ByteLevel)");
      }
    }
    if (!byte_level) fail("pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");
    if (pattern.empty()) {
      t.pre_tokenizer = tok::PreTokenizerKind::kWhole;
    } else if (pattern == tok::kQwen2Pattern) {
      t.pre_tokenizer = tok::PreTokenizerKind::kQwen2Scanner;
    } else {
      try {
        t.regex = std::make_unique<tok::RegexSplitter>(pattern);
      } catch (const std::exception& e) {
        fail("pre_tokenizer pattern: " + std::string(e.what()));
      }
      t.pre_tokenizer = tok::PreTokenizerKind::kRegex;
    }
  }

  // The decoder and post-processor must be byte-level ones that add nothing (a template adding BOS/EOS would
  // change the ids).
  void byte_level_only(const json& j, const char* name) const {
    if (j.is_null()) return;
    const std::string type = type_of(j, name);
    if (type != "ByteLevel") fail(std::string(name) + " " + type + " is not supported (only ByteLevel or null)");
  }

 private:
  const std::string& source_;
};

// Ids to bytes: the vocabulary's spellings undone, added tokens as written.
void build_id_table(Tokenizer::Impl& t, std::vector<const std::string*>& spelled_by_id) {
  size_t size = spelled_by_id.size();
  for (const AddedToken& a : t.added) size = std::max(size, size_t(a.id) + 1);
  std::vector<const AddedToken*> added_by_id(size, nullptr);
  for (const AddedToken& a : t.added) added_by_id[a.id] = &a;
  t.token_offset.assign(size + 1, 0);
  t.token_kind.assign(size, 0);
  std::string bytes;
  for (size_t id = 0; id < size; ++id) {
    t.token_offset[id] = static_cast<uint32_t>(t.token_bytes.size());
    if (const AddedToken* a = added_by_id[id]) {
      t.token_bytes += a->content;
      t.token_kind[id] = a->special ? 3 : 2;
    } else if (id < spelled_by_id.size() && spelled_by_id[id]) {
      // A spelling outside the byte alphabet cannot come out of encode; it decodes as written, like the
      // Rust reference's ByteLevel decoder.
      if (tok::byte_level_to_bytes(*spelled_by_id[id], bytes)) {
        t.token_bytes += bytes;
        if (t.ignore_merges) t.bytes_to_id.emplace(bytes, TokenId(id));
      } else {
        t.token_bytes += *spelled_by_id[id];
      }
      t.token_kind[id] = 1;
    }
  }
  t.token_offset[size] = static_cast<uint32_t>(t.token_bytes.size());
}

}  // namespace

std::shared_ptr<Tokenizer::Impl> load_tokenizer_json(std::string_view json_text, const std::string& source) {
  Loader load(source);
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end(), depth_limited(source));
  } catch (const json::exception& e) {
    load.fail("not valid JSON (" + json_error_text(e) + ")");
  }
  if (!root.is_object()) load.fail("the top level must be an object");
  auto t = std::make_shared<Tokenizer::Impl>();
  t->source = source;
  try {
    std::vector<const std::string*> spelled_by_id;
    load.model(load.member(root, "model", "the file"), *t, spelled_by_id);
    load.added_tokens(root.value("added_tokens", json()), *t);
    load.normalizer(root.value("normalizer", json()), *t);
    load.pre_tokenizer(root.value("pre_tokenizer", json()), *t);
    load.byte_level_only(root.value("decoder", json()), "decoder");
    load.byte_level_only(root.value("post_processor", json()), "post_processor");
    build_id_table(*t, spelled_by_id);
  } catch (const json::exception& e) {  // a value of the wrong type somewhere not checked above
    load.fail("unexpected JSON (" + json_error_text(e) + ")");
  }
  std::vector<std::pair<std::string, const AddedToken*>> raw, normalized;
  for (const AddedToken& a : t->added) {
    // Without a normalizer the JS reference matches normalized tokens in the first pass too.
    if (a.normalized && t->nfc) {
      std::string form;
      normalized.emplace_back(unicode::nfc_if_changed(a.content, form) ? form : a.content, &a);
    } else {
      raw.emplace_back(a.content, &a);
    }
  }
  t->raw_matcher.build(std::move(raw));
  t->normalized_matcher.build(std::move(normalized));
  return t;
}

}  // namespace qwen3
