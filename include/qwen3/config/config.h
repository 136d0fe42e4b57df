// A Qwen3 `config.json` as the math needs it (docs/model.md). Every field that changes the
// computation is read, never assumed; unsupported values (rope_scaling, attention_bias, another activation)
// are errors rather than silently different models.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace qwen3 {

// The handful of sizes that determine every tensor of a Qwen3 model (the key layout: qwen3/model/layout.h).
struct ModelShape {
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  // Mixture of experts (Qwen3MoeForCausalLM; experts == 0: dense). A block whose moe_layer() holds has a router
  // [experts, hidden] and `experts` SwiGLU experts of width expert_intermediate instead of the dense MLP.
  int64_t experts = 0;
  int64_t expert_intermediate = 0;
  int64_t sparse_step = 1;               // decoder_sparse_step: every sparse_step-th block is sparse
  std::vector<int64_t> mlp_only_layers;  // blocks that keep the dense MLP
  bool moe_layer(int64_t layer) const;
};

ModelShape qwen3_4b_shape();

struct Qwen3Config {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "bfloat16";
  // Qwen3MoeForCausalLM (model_type "qwen3_moe"; num_experts == 0: the dense Qwen3ForCausalLM). Missing fields
  // take transformers' Qwen3MoeConfig defaults.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = false;          // renormalize the top-k routing weights to sum to 1
  double router_aux_loss_coef = 0.001;  // the load-balancing loss's weight (added when output_router_logits)
  bool output_router_logits = false;

  bool is_moe() const { return num_experts > 0; }
  ModelShape shape() const;
  // Checks every rule (positive sizes, heads divide, dims multiple of 16, ...); throws Error naming the field
  // and `origin` (a file name or preset).
  void validate(const std::string& origin) const;
  nlohmann::json to_json() const;
};

Qwen3Config config_from_json(const nlohmann::json& j, const std::string& origin);
Qwen3Config load_config(const std::string& path);  // reads, parses, validates
void save_config(const Qwen3Config& config, const std::string& path);  // durably: complete or absent

// Presets for `synth`: "qwen3-4b" (the real Qwen3-4B-Instruct-2507 values) and "tiny" (real vocabulary, so
// the real tokenizer works, with a small body: GQA and head_dim != hidden / heads, like the real model).
Qwen3Config preset_config(const std::string& name);

}  // namespace qwen3
