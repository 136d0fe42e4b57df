#include "qwen3/model/layout.h"

namespace qwen3 {


std::vector<TensorSpec> qwen3_tensors(const ModelShape& m, bool with_lm_head) {
  std::vector<TensorSpec> out;
  out.push_back({"model.embed_tokens.weight", {m.vocab, m.hidden}, false});
  const int64_t q_out = m.heads * m.head_dim, kv_out = m.kv_heads * m.head_dim;
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "self_attn.q_proj.weight", {q_out, m.hidden}, true});
    out.push_back({p + "self_attn.k_proj.weight", {kv_out, m.hidden}, true});
    out.push_back({p + "self_attn.v_proj.weight", {kv_out, m.hidden}, true});
    out.push_back({p + "self_attn.o_proj.weight", {m.hidden, q_out}, true});
    out.push_back({p + "self_attn.q_norm.weight", {m.head_dim}, false});
    out.push_back({p + "self_attn.k_norm.weight", {m.head_dim}, false});
    if (m.moe_layer(i)) {  // Qwen3MoeSparseMoeBlock: the router, then each expert's SwiGLU
      out.push_back({p + "mlp.gate.weight", {m.experts, m.hidden}, false});
      for (int64_t e = 0; e < m.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        out.push_back({x + "gate_proj.weight", {m.expert_intermediate, m.hidden}, true});
        out.push_back({x + "up_proj.weight", {m.expert_intermediate, m.hidden}, true});
        out.push_back({x + "down_proj.weight", {m.hidden, m.expert_intermediate}, true});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {m.intermediate, m.hidden}, true});
      out.push_back({p + "mlp.up_proj.weight", {m.intermediate, m.hidden}, true});
      out.push_back({p + "mlp.down_proj.weight", {m.hidden, m.intermediate}, true});
    }
    out.push_back({p + "input_layernorm.weight", {m.hidden}, false});
    out.push_back({p + "post_attention_layernorm.weight", {m.hidden}, false});
  }
  out.push_back({"model.norm.weight", {m.hidden}, false});
  if (with_lm_head) out.push_back({"lm_head.weight", {m.vocab, m.hidden}, true});
  return out;
}

std::optional<int64_t> layer_of_key(std::string_view key) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (key.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view rest = key.substr(kPrefix.size());
  const std::string_view digits = rest.substr(0, rest.find('.'));
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  int64_t layer = 0;
  for (char c : digits) layer = layer * 10 + (c - '0');
  return layer;
}

std::vector<EntrySpec> qwen3_dat_entries(const ModelShape& m, bool nvfp4, ElemType dense_type, bool with_lm_head) {
  std::vector<EntrySpec> out;
  for (auto& t : qwen3_tensors(m, with_lm_head)) {
    if (nvfp4 && t.quantizable) {
      out.push_back({t.key + std::string(kQdataSuffix), ElemType::UInt8, {t.shape[0], t.shape[1] / 2}});
      out.push_back({t.key + std::string(kScaleSuffix), ElemType::Float8E4M3, {t.shape[0], t.shape[1] / 16}});
    } else {
      out.push_back({t.key, dense_type, t.shape});
    }
  }
  return out;
}

}  // namespace qwen3
