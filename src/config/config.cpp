#include "qwen3/base/file_io.h"
#include "qwen3/config/config.h"
#include "qwen3/base/json_limits.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "qwen3/base/error.h"
#include "qwen3/dat/durable_file.h"

namespace qwen3 {
namespace {

using json = nlohmann::json;

int64_t get_int(const json& j, const char* key, const std::string& origin, bool required, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) throw Error(origin + ": missing field \"" + key + "\"");
    return fallback;
  }
  if (!it->is_number_integer()) throw Error(origin + ": field \"" + key + "\" must be an integer, got " + json_excerpt(*it));
  return it->get<int64_t>();
}

double get_number(const json& j, const char* key, const std::string& origin, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw Error(origin + ": field \"" + key + "\" must be a number, got " + json_excerpt(*it));
  return it->get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& origin, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw Error(origin + ": field \"" + key + "\" must be true or false, got " + json_excerpt(*it));
  return it->get<bool>();
}

// The Qwen3 MoE fields (transformers' Qwen3MoeConfig names and defaults), read when the file is a qwen3_moe
// config or names experts; what this tool does not compute is refused by name rather than ignored.
void read_moe_fields(const json& j, const std::string& origin, Qwen3Config& c) {
  const bool declared = j.value("model_type", json()) == "qwen3_moe" ||
                        (j.contains("architectures") && j["architectures"].is_array() &&
                         std::find(j["architectures"].begin(), j["architectures"].end(), "Qwen3MoeForCausalLM") !=
                             j["architectures"].end());
  if (!declared && !j.contains("num_experts")) return;
  c.num_experts = get_int(j, "num_experts", origin, false, 128);
  if (c.num_experts <= 0) throw Error(origin + ": num_experts must be positive in a qwen3_moe config, got " +
                                      std::to_string(c.num_experts));
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", origin, false, 8);
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", origin, false, 768);
  c.decoder_sparse_step = get_int(j, "decoder_sparse_step", origin, false, 1);
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", origin, false);
  c.router_aux_loss_coef = get_number(j, "router_aux_loss_coef", origin, 0.001);
  c.output_router_logits = get_bool(j, "output_router_logits", origin, false);
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_number_integer(); }))
      throw Error(origin + ": field \"mlp_only_layers\" must be a list of layer indices, got " + json_excerpt(*it));
    c.mlp_only_layers = it->get<std::vector<int64_t>>();
  }
  // Qwen2-MoE's shared expert is another architecture.
  if (get_int(j, "shared_expert_intermediate_size", origin, false, 0) > 0)
    throw Error(origin + ": shared_expert_intermediate_size (a shared expert, Qwen2-MoE) is not supported");
}

}  // namespace

ModelShape qwen3_4b_shape() {
  ModelShape s;
  s.hidden = 2560;
  s.layers = 36;
  s.heads = 32;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.intermediate = 9728;
  s.vocab = 151936;
  return s;
}

bool ModelShape::moe_layer(int64_t layer) const {
  // transformers' Qwen3MoeDecoderLayer: sparse unless listed in mlp_only_layers, on every sparse_step-th block.
  return experts > 0 && sparse_step > 0 && (layer + 1) % sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

ModelShape Qwen3Config::shape() const {
  ModelShape s;
  s.experts = num_experts;
  s.expert_intermediate = moe_intermediate_size;
  s.sparse_step = decoder_sparse_step;
  s.mlp_only_layers = mlp_only_layers;
  s.hidden = hidden_size;
  s.layers = num_hidden_layers;
  s.heads = num_attention_heads;
  s.kv_heads = num_key_value_heads;
  s.head_dim = head_dim;
  s.intermediate = intermediate_size;
  s.vocab = vocab_size;
  return s;
}

void Qwen3Config::validate(const std::string& origin) const {
  auto fail = [&](const std::string& what) { return Error(origin + ": " + what); };
  const std::pair<const char*, int64_t> positive[] = {
      {"hidden_size", hidden_size},          {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads}, {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},                {"intermediate_size", intermediate_size},
      {"vocab_size", vocab_size}};
  for (auto [name, v] : positive)
    if (v <= 0) throw fail(std::string(name) + " must be positive, got " + std::to_string(v));
  // 0: not known (a config made in code); a file's is positive (config_from_json).
  if (max_position_embeddings < 0)
    throw fail("max_position_embeddings must be positive, got " + std::to_string(max_position_embeddings));
  // Sane upper bounds, so that no product of sizes below can overflow (a head count of 2^60 made synth divide
  // by zero): 2^24 for widths, the vocabulary (Qwen3 uses 151,936) and positions (262,144), 2^16 for counts and
  // head_dim.
  const std::pair<const char*, int64_t> bounded[] = {{"hidden_size", hidden_size},
                                                     {"intermediate_size", intermediate_size},
                                                     {"vocab_size", vocab_size},
                                                     {"max_position_embeddings", max_position_embeddings}};
  for (auto [name, v] : bounded)
    if (v > (int64_t{1} << 24)) throw fail(std::string(name) + " " + std::to_string(v) + " is beyond 2^24");
  const std::pair<const char*, int64_t> counts[] = {{"num_hidden_layers", num_hidden_layers},
                                                    {"num_attention_heads", num_attention_heads},
                                                    {"num_key_value_heads", num_key_value_heads},
                                                    {"head_dim", head_dim}};
  for (auto [name, v] : counts)
    if (v > (int64_t{1} << 16)) throw fail(std::string(name) + " " + std::to_string(v) + " is beyond 2^16");
  if (num_attention_heads * head_dim > (int64_t{1} << 24))
    throw fail("num_attention_heads * head_dim (" + std::to_string(num_attention_heads * head_dim) + ") is beyond 2^24");
  if (num_attention_heads % num_key_value_heads != 0)
    throw fail("num_attention_heads (" + std::to_string(num_attention_heads) +
               ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  if (head_dim % 2 != 0) throw fail("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
  // NVFP4 blocks run along each projection's input dimension: hidden, heads*head_dim and intermediate.
  const std::pair<const char*, int64_t> blocked[] = {{"hidden_size", hidden_size},
                                                     {"num_attention_heads * head_dim", num_attention_heads * head_dim},
                                                     {"intermediate_size", intermediate_size}};
  for (auto [name, v] : blocked)
    if (v % 16 != 0) throw fail(std::string(name) + " (" + std::to_string(v) + ") must be a multiple of 16 for NVFP4");
  if (!(rms_norm_eps > 0)) throw fail("rms_norm_eps must be positive");
  if (!(rope_theta > 0)) throw fail("rope_theta must be positive");
  for (int64_t id : eos_token_ids)
    if (id < 0 || id >= vocab_size) throw fail("eos_token_id " + std::to_string(id) + " is outside the vocabulary");
  if (bos_token_id >= vocab_size) throw fail("bos_token_id is outside the vocabulary");
  if (!is_moe()) return;
  // Mixture of experts: sizes as above, and routing that picks at least one and at most every expert.
  if (num_experts > (int64_t{1} << 16)) throw fail("num_experts " + std::to_string(num_experts) + " is beyond 2^16");
  if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
    throw fail("num_experts_per_tok must be from 1 to num_experts (" + std::to_string(num_experts) + "), got " +
               std::to_string(num_experts_per_tok));
  if (moe_intermediate_size <= 0 || moe_intermediate_size > (int64_t{1} << 24) || moe_intermediate_size % 16 != 0)
    throw fail("moe_intermediate_size must be a positive multiple of 16 (NVFP4 blocks) up to 2^24, got " +
               std::to_string(moe_intermediate_size));
  if (decoder_sparse_step < 1 || decoder_sparse_step > num_hidden_layers)
    throw fail("decoder_sparse_step must be from 1 to num_hidden_layers, got " + std::to_string(decoder_sparse_step));
  for (int64_t layer : mlp_only_layers)
    if (layer < 0 || layer >= num_hidden_layers)
      throw fail("mlp_only_layers names layer " + std::to_string(layer) + ", outside 0.." +
                 std::to_string(num_hidden_layers - 1));
  if (!(router_aux_loss_coef >= 0) || !std::isfinite(router_aux_loss_coef))
    throw fail("router_aux_loss_coef must be a finite number >= 0");
}

json Qwen3Config::to_json() const {
  json j = {{"architectures", {"Qwen3ForCausalLM"}},
            {"model_type", "qwen3"},
            {"hidden_size", hidden_size},
            {"num_hidden_layers", num_hidden_layers},
            {"num_attention_heads", num_attention_heads},
            {"num_key_value_heads", num_key_value_heads},
            {"head_dim", head_dim},
            {"intermediate_size", intermediate_size},
            {"vocab_size", vocab_size},
            {"rms_norm_eps", rms_norm_eps},
            {"rope_theta", rope_theta},
            {"rope_scaling", nullptr},
            {"tie_word_embeddings", tie_word_embeddings},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"max_position_embeddings", max_position_embeddings},
            {"torch_dtype", torch_dtype}};
  if (is_moe()) {
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["model_type"] = "qwen3_moe";
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["norm_topk_prob"] = norm_topk_prob;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = output_router_logits;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1)
    j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty())
    j["eos_token_id"] = eos_token_ids;
  return j;
}

Qwen3Config config_from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) throw Error(origin + ": a config must be a JSON object");
  Qwen3Config c;
  c.hidden_size = get_int(j, "hidden_size", origin, true, 0);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", origin, true, 0);
  c.num_attention_heads = get_int(j, "num_attention_heads", origin, true, 0);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", origin, false, c.num_attention_heads);
  c.head_dim = get_int(j, "head_dim", origin, false,
                       c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  c.intermediate_size = get_int(j, "intermediate_size", origin, true, 0);
  c.vocab_size = get_int(j, "vocab_size", origin, true, 0);
  c.rms_norm_eps = get_number(j, "rms_norm_eps", origin, 1e-6);
  c.rope_theta = get_number(j, "rope_theta", origin, 1e6);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", origin, false);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", origin, false, 32768);
  if (c.max_position_embeddings <= 0)
    throw Error(origin + ": max_position_embeddings must be positive, got " + std::to_string(c.max_position_embeddings));
  c.bos_token_id = get_int(j, "bos_token_id", origin, false, -1);
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer())
      c.eos_token_ids = {it->get<int64_t>()};
    else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_number_integer(); }))
      c.eos_token_ids = it->get<std::vector<int64_t>>();
    else
      throw Error(origin + ": field \"eos_token_id\" must be an integer or a list of integers");
  }
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) c.torch_dtype = it->get<std::string>();
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null())
    throw Error(origin + ": rope_scaling " + json_excerpt(*it) + " is not supported (only null)");
  if (auto it = j.find("hidden_act"); it != j.end() && *it != "silu")
    throw Error(origin + ": hidden_act " + json_excerpt(*it) + " is not supported (only \"silu\")");
  if (get_bool(j, "attention_bias", origin, false)) throw Error(origin + ": attention_bias true is not supported");
  read_moe_fields(j, origin, c);
  c.validate(origin);
  return c;
}

Qwen3Config load_config(const std::string& path) {
  std::ifstream f = open_input_file(path, "config");
  json j;
  try {
    j = json::parse(f, depth_limited(path));
  } catch (const json::exception& e) {  // a syntax error, or a number past double's range (1e400)
    throw Error(path + ": invalid JSON: " + json_error_text(e));
  }
  return config_from_json(j, path);
}

void save_config(const Qwen3Config& config, const std::string& path) {
  write_file_durably(path, config.to_json().dump(2) + "\n");  // complete under its name or not there
}

Qwen3Config preset_config(const std::string& name) {
  Qwen3Config c;
  c.vocab_size = 151936;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 5000000;
  c.tie_word_embeddings = true;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  c.torch_dtype = "bfloat16";
  if (name == "qwen3-4b") {
    const ModelShape s = qwen3_4b_shape();
    c.hidden_size = s.hidden;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.intermediate_size = s.intermediate;
    c.vocab_size = s.vocab;
    c.max_position_embeddings = 262144;
  } else if (name == "tiny") {
    c.hidden_size = 96;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;  // != 96 / 4, as in the real model (2560 / 32 = 80 != 128)
    c.intermediate_size = 256;
    c.max_position_embeddings = 4096;
  } else if (name == "qwen3-moe-tiny") {
    // The tiny body with 8 experts of width 64, 2 a token, renormalized; block 1 keeps the dense MLP
    // (mlp_only_layers), so both kinds of block are exercised.
    c = preset_config("tiny");
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 64;
    c.norm_topk_prob = true;
    c.mlp_only_layers = {1};
  } else if (name == "qwen3-30b-a3b") {
    // The shapes of Qwen/Qwen3-30B-A3B's config.json (48 blocks, all sparse: 128 experts, 8 a token).
    c.hidden_size = 2048;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.intermediate_size = 6144;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.norm_topk_prob = true;
    c.rope_theta = 1000000;
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 40960;
  } else {
    throw UsageError("unknown preset '" + name + "' (tiny, qwen3-4b, qwen3-moe-tiny, qwen3-30b-a3b)");
  }
  c.validate("preset " + name);
  return c;
}

}  // namespace qwen3
