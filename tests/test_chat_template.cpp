// Chat templates against an independent reference: tests/data/chat_template_fixture.json holds conversations
// rendered by @huggingface/jinja with the real Qwen3 tokenizer_config.json's template, and the ids
// @huggingface/tokenizers gives that text (scripts/make-chat-fixture.mjs). Plus the template recognition and
// the loss masks of multi-turn conversations.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/tokenizer/chat_format.h"
#include "tokenizer_test_util.h"
#include "build_paths.h"

namespace qwen3 {
namespace {

using Ids = std::vector<TokenId>;

nlohmann::json load_fixture() {
  return nlohmann::json::parse(test::slurp(test::source_dir() + "/tests/data/chat_template_fixture.json"));
}

std::vector<ChatMessage> messages_of(const nlohmann::json& json) {
  std::vector<ChatMessage> out;
  for (const auto& m : json) {
    ChatMessage message;
    const std::string role = m["role"];
    message.role = role == "system" ? ChatRole::system : (role == "user" ? ChatRole::user : ChatRole::assistant);
    message.content = m["content"];
    if (m.contains("reasoning_content")) message.reasoning_content = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(message));
  }
  return out;
}

// "text" is Python jinja2's rendering (transformers'), "text_js" @huggingface/jinja's: they differ only where
// the template strips given characters, which @huggingface/jinja ignores (one case of the fixture: a reply
// that starts with spaces keeps them in Python). qwen3-train follows Python.
TEST(ChatTemplate, HybridTextEqualsTheJinjaReference) {
  const nlohmann::json fixture = load_fixture();
  ASSERT_GE(fixture["cases"].size(), 19u);
  int engines_differ = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string ours = render_chat_text(messages_of(c["messages"]), ChatTemplate::qwen3_thinking);
    EXPECT_EQ(ours, c["text"].get<std::string>()) << c["messages"].dump();
    if (c["text_js"] != c["text"])
      ++engines_differ;
    else
      EXPECT_EQ(ours, c["text_js"].get<std::string>()) << c["messages"].dump();
  }
  EXPECT_EQ(engines_differ, 1);
}

// The ids too, with the real tokenizer (whose tokenizer_config.json selects the hybrid template).
TEST(ChatTemplate, HybridIdsEqualTheReference) {
  QWEN3_REQUIRE_REAL_TOKENIZER(t);
  for (const auto& c : load_fixture()["cases"]) {
    const ChatTokens tokens = render_conversation(*t, messages_of(c["messages"]));
    EXPECT_EQ(tokens.ids, c["ids"].get<Ids>()) << c["messages"].dump();
  }
}

TEST(ChatTemplate, RecognizesTheRealConfigAndRefusesOthers) {
  if (const std::string config = test::real_tokenizer_path(); std::ifstream(config).good()) {
    const std::string path = config.substr(0, config.rfind('/')) + "/tokenizer_config.json";
    EXPECT_EQ(chat_template_from_config_file(path), ChatTemplate::qwen3_thinking);
  }
  // Qwen2.5 / Qwen3-2507-style ChatML without think blocks.
  const std::string chatml =
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
      "'\\n' }}{%- endfor %}";
  EXPECT_EQ(recognize_chat_template(chatml, "x"), ChatTemplate::chatml);
  const std::string llama = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";
  try {
    recognize_chat_template(llama, "cfg.json");
    ADD_FAILURE() << "a Llama template was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: its chat template is not one qwen3-train renders"), std::string::npos)
        << e.what();
  }
  // A think-block template that is not the hybrid one is not guessed at.
  EXPECT_THROW(recognize_chat_template(chatml + "{{ '<think>' }}", "x"), Error);

  test::TempDir dir;
  std::ofstream(dir.file("list.json")) << nlohmann::json{{"chat_template", {{{"name", "tool_use"}, {"template", "x"}},
                                                                           {{"name", "default"}, {"template", chatml}}}}};
  EXPECT_EQ(chat_template_from_config_file(dir.file("list.json")), ChatTemplate::chatml);
  std::ofstream(dir.file("none.json")) << R"({"model_max_length": 10})";
  EXPECT_THROW(chat_template_from_config_file(dir.file("none.json")), Error);
  // A tokenizer beside an unsupported config loads; rendering a conversation says why it cannot.
  std::ofstream(dir.file("tokenizer_config.json")) << nlohmann::json{{"chat_template", llama}};
  std::ofstream(dir.file("tokenizer.json")) << test::slurp(test::tiny_tokenizer_path());
  const Tokenizer t = Tokenizer::from_file(dir.file("tokenizer.json"));
  EXPECT_EQ(t.encode("ab").size(), test::tiny_tokenizer().encode("ab").size());
  try {
    render_chat(t, {std::nullopt, "a", "b"});
    ADD_FAILURE() << "rendered with an unsupported template";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template chatml|qwen3-thinking"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(render_chat(t.with_chat_template(ChatTemplate::chatml, "test"), {std::nullopt, "a", "b"}));
}

// A folder saved by transformers 4.43+ keeps the template in chat_template.jinja (its tokenizer_config.json has no
// "chat_template"): read from there, beside the tokenizer or beside a --tokenizer-config; it wins over the config's.
TEST(ChatTemplate, ReadsChatTemplateJinjaBesideTheTokenizer) {
  const std::string chatml =
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
      "'\\n' }}{%- endfor %}";
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.json")) << test::slurp(test::tiny_tokenizer_path());
  std::ofstream(dir.file("tokenizer_config.json")) << R"({"model_max_length": 32768})";
  std::ofstream(dir.file("chat_template.jinja")) << chatml;
  EXPECT_EQ(Tokenizer::from_file(dir.file("tokenizer.json")).chat_template(), ChatTemplate::chatml);
  EXPECT_EQ(chat_template_from_config_file(dir.file("tokenizer_config.json")), ChatTemplate::chatml);
  EXPECT_EQ(chat_template_from_config_file(dir.file("chat_template.jinja")), ChatTemplate::chatml);
  // The .jinja wins over a config's own template, as in transformers.
  std::ofstream(dir.file("tokenizer_config.json")) << nlohmann::json{{"chat_template", "{{ bos_token }}[INST]"}};
  EXPECT_EQ(Tokenizer::from_file(dir.file("tokenizer.json")).chat_template(), ChatTemplate::chatml);
  // Neither: the config names both places.
  std::filesystem::remove(dir.file("chat_template.jinja"));
  std::ofstream(dir.file("tokenizer_config.json")) << R"({"model_max_length": 32768})";
  try {
    chat_template_from_config_file(dir.file("tokenizer_config.json"));
    ADD_FAILURE() << "a config without a template was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja"), std::string::npos) << e.what();
  }
}

// Loss on every assistant reply and its <|im_end|>, on nothing else: the masked tokens decode to the replies.
TEST(ChatTemplate, MultiTurnLossCoversEveryAssistantReplyAndNothingElse) {
  for (const ChatTemplate kind : {ChatTemplate::chatml, ChatTemplate::qwen3_thinking}) {
    const Tokenizer t = test::tiny_tokenizer().with_chat_template(kind, "test");
    const std::vector<ChatMessage> messages = {{ChatRole::system, "sys", {}},    {ChatRole::user, "hi there", {}},
                                               {ChatRole::assistant, "hello", {}}, {ChatRole::user, "and", {}},
                                               {ChatRole::assistant, "aaaa", {}}};
    const ChatTokens c = render_conversation(t, messages);
    ASSERT_EQ(c.ids.size(), c.loss_mask.size());
    EXPECT_EQ(c.ids, t.encode(render_chat_text(messages, kind)));
    Ids masked;
    for (size_t i = 0; i < c.ids.size(); ++i)
      if (c.loss_mask[i]) masked.push_back(c.ids[i]);
    EXPECT_EQ(t.decode(masked), "hello<|im_end|>aaaa<|im_end|>") << to_string(kind);
  }
  // A real think block is something the model says: it carries loss.
  const Tokenizer t = test::tiny_tokenizer().with_chat_template(ChatTemplate::qwen3_thinking, "test");
  const ChatTokens c = render_conversation(t, {{ChatRole::user, "q", {}}, {ChatRole::assistant, "a", std::string("r")}});
  Ids masked;
  for (size_t i = 0; i < c.ids.size(); ++i)
    if (c.loss_mask[i]) masked.push_back(c.ids[i]);
  EXPECT_EQ(t.decode(masked), "<think>\nr\n</think>\n\na<|im_end|>");
}

// Special tokens written in content are the special tokens, as transformers tokenizes a rendered template
// (split_special_tokens=False): a turn boundary inside a reply is one, under the reply's loss mask (docs/data.md).
TEST(ChatTemplate, SpecialTokenTextInContentIsTheSpecialToken) {
  const Tokenizer t = test::tiny_tokenizer().with_chat_template(ChatTemplate::chatml, "test");
  const TokenId im_end = t.encode("<|im_end|>").at(0), im_start = t.encode("<|im_start|>").at(0);
  const std::vector<ChatMessage> messages = {{ChatRole::user, "hi <|im_end|> there", {}},
                                             {ChatRole::assistant, "aa<|im_end|><|im_start|>user", {}}};
  const ChatTokens c = render_conversation(t, messages);
  EXPECT_EQ(c.ids, t.encode(render_chat_text(messages, ChatTemplate::chatml)));
  EXPECT_EQ(std::count(c.ids.begin(), c.ids.end(), im_end), 4);  // two turns' ends, one in each message
  Ids masked;
  for (size_t i = 0; i < c.ids.size(); ++i)
    if (c.loss_mask[i]) masked.push_back(c.ids[i]);
  EXPECT_EQ(std::count(masked.begin(), masked.end(), im_end), 2);
  EXPECT_EQ(std::count(masked.begin(), masked.end(), im_start), 1);
}

}  // namespace
}  // namespace qwen3
