#include "qwen3/model/model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x

#include "model/activation_ops.h"
#include "qwen3/base/error.h"
#include "qwen3/model/layout.h"

#include <algorithm>
#include <vector>
#include <string>
#include <string_view>
#include <typeinfo>

namespace qwen3 {

at::Tensor Projection::operator()(const at::Tensor& x) const {
  if (kernel) return kernel->apply(x, weight);
  return at::linear(x, weight.to(x.scalar_type()));  // the cast is a no-op when the dtypes agree
}

at::Tensor Projection::unread(const at::Tensor& x) const {
  return kernel ? kernel->apply_unread(x, weight) : (*this)(x);
}

std::vector<at::Tensor> ProjectionKernel::apply_shared_input(const std::vector<const Projection*>&,
                                                             const at::Tensor&) const {
  throw Error("a projection kernel that offers no shared-input product was asked for one");
}

std::vector<at::Tensor> project_shared_input(const std::vector<const Projection*>& group, const at::Tensor& x) {
  const ProjectionKernel* first = group.front()->kernel.get();
  bool shared = first != nullptr && first->offers_shared_input(x);
  for (const Projection* p : group) shared = shared && p->kernel != nullptr && typeid(*p->kernel) == typeid(*first);
  if (shared) return first->apply_shared_input(group, x);
  std::vector<at::Tensor> out;
  for (const Projection* p : group) out.push_back((*p)(x));
  return out;
}

std::vector<const at::Tensor*> Qwen3Block::tensors() const {
  std::vector<const at::Tensor*> out = {&q_proj.weight, &k_proj.weight, &v_proj.weight, &o_proj.weight, &q_norm, &k_norm};
  if (sparse()) {
    out.push_back(&router);
    for (const ExpertMlp& e : experts)
      for (const Projection* p : {&e.gate_proj, &e.up_proj, &e.down_proj}) out.push_back(&p->weight);
  } else {
    for (const Projection* p : {&gate_proj, &up_proj, &down_proj}) out.push_back(&p->weight);
  }
  out.push_back(&input_layernorm);
  out.push_back(&post_attention_layernorm);
  return out;
}

std::vector<Projection*> Qwen3Block::projections() {
  std::vector<Projection*> out = {&q_proj, &k_proj, &v_proj, &o_proj};
  if (sparse()) {
    for (ExpertMlp& e : experts)
      for (Projection* p : {&e.gate_proj, &e.up_proj, &e.down_proj}) out.push_back(p);
  } else {
    for (Projection* p : {&gate_proj, &up_proj, &down_proj}) out.push_back(p);
  }
  return out;
}

namespace {

// A sparse block's key past "model.layers.N.": mlp.gate.weight, or mlp.experts.E.{gate,up,down}_proj.weight.
at::Tensor* sparse_field(Qwen3Block& b, std::string_view rest) {
  if (rest == "mlp.gate.weight") return &b.router;
  constexpr std::string_view kExperts = "mlp.experts.";
  if (rest.substr(0, kExperts.size()) != kExperts) return nullptr;
  rest.remove_prefix(kExperts.size());
  const size_t dot = rest.find('.');
  const std::string_view digits = rest.substr(0, dot);
  if (dot == std::string_view::npos || digits.empty() || digits.size() > 6 ||
      digits.find_first_not_of("0123456789") != std::string_view::npos)
    return nullptr;
  const size_t e = static_cast<size_t>(std::stoul(std::string(digits)));
  if (e >= b.experts.size()) return nullptr;
  const std::string_view name = rest.substr(dot + 1);
  ExpertMlp& x = b.experts[e];
  if (name == "gate_proj.weight") return &x.gate_proj.weight;
  if (name == "up_proj.weight") return &x.up_proj.weight;
  if (name == "down_proj.weight") return &x.down_proj.weight;
  return nullptr;
}

}  // namespace

// Which field holds the tensor of a file key. The keys, their shapes and their order are the layout's
// (qwen3_tensors, include/qwen3/model/layout.h) alone; this only names the field of each.
at::Tensor* Qwen3Model::field_of(const std::string& key) {
  if (key == "model.embed_tokens.weight") return &embed_tokens;
  if (key == "model.norm.weight") return &final_norm;
  if (key == "lm_head.weight") return &lm_head_;
  static const std::pair<std::string_view, at::Tensor* (*)(Qwen3Block&)> kBlockFields[] = {
      {"self_attn.q_proj.weight", [](Qwen3Block& b) { return &b.q_proj.weight; }},
      {"self_attn.k_proj.weight", [](Qwen3Block& b) { return &b.k_proj.weight; }},
      {"self_attn.v_proj.weight", [](Qwen3Block& b) { return &b.v_proj.weight; }},
      {"self_attn.o_proj.weight", [](Qwen3Block& b) { return &b.o_proj.weight; }},
      {"self_attn.q_norm.weight", [](Qwen3Block& b) { return &b.q_norm; }},
      {"self_attn.k_norm.weight", [](Qwen3Block& b) { return &b.k_norm; }},
      {"mlp.gate_proj.weight", [](Qwen3Block& b) { return &b.gate_proj.weight; }},
      {"mlp.up_proj.weight", [](Qwen3Block& b) { return &b.up_proj.weight; }},
      {"mlp.down_proj.weight", [](Qwen3Block& b) { return &b.down_proj.weight; }},
      {"input_layernorm.weight", [](Qwen3Block& b) { return &b.input_layernorm; }},
      {"post_attention_layernorm.weight", [](Qwen3Block& b) { return &b.post_attention_layernorm; }}};
  if (const auto layer = layer_of_key(key); layer && *layer < static_cast<int64_t>(blocks.size())) {
    const std::string_view rest = std::string_view(key).substr(key.find('.', std::string("model.layers.").size()) + 1);
    Qwen3Block& b = blocks[static_cast<size_t>(*layer)];
    if (b.sparse())
      if (at::Tensor* field = sparse_field(b, rest)) return field;
    for (const auto& [name, field] : kBlockFields)
      if (rest == name) return field(b);
  }
  throw Error("model: no field for the layout's key '" + key + "'");
}

Qwen3Model::Qwen3Model(const Qwen3Config& config, at::ScalarType dtype, at::Device device, bool separate_lm_head)
    : config_(config), dtype_(dtype), compute_dtype_(dtype), device_(device) {
  config_.validate("model config");
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  blocks.resize(static_cast<size_t>(config.num_hidden_layers));
  const ModelShape shape = config.shape();
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    if (shape.moe_layer(i)) blocks[static_cast<size_t>(i)].experts.resize(static_cast<size_t>(config.num_experts));
  for (const TensorSpec& spec : qwen3_tensors(config.shape(), separate_lm_head)) {
    at::Tensor* field = field_of(spec.key);
    *field = at::empty(spec.shape, opts);
    fields_.emplace_back(spec.key, field);
  }
}

std::vector<std::pair<std::string, at::Tensor>> Qwen3Model::named_weights() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(fields_.size());
  for (const auto& [key, field] : fields_) out.emplace_back(key, *field);
  return out;
}

std::vector<Projection*> Qwen3Model::projections() {
  std::vector<Projection*> out;
  for (Qwen3Block& b : blocks)
    for (Projection* p : b.projections()) out.push_back(p);
  return out;
}

void Qwen3Model::set_compute_dtype(at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    throw Error(std::string("model: compute dtype must be float32, bfloat16 or float16, got ") + c10::toString(dtype));
  compute_dtype_ = dtype;
}

at::Tensor Qwen3Model::rmsnorm(const at::Tensor& x, const at::Tensor& weight) const {
  return rms_norm(x, weight, config_.rms_norm_eps);
}

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t head_dim, double theta, int64_t offset, int64_t length,
                                              at::Device device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  // inv_freq[i] = 1 / theta^(2i/d), every step in fp32 exactly as the HF reference computes it, so the
  // angles agree bit for bit.
  const at::Tensor exponent = at::arange(0, head_dim, 2, f32.dtype(at::kLong)).to(at::kFloat) / static_cast<float>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, exponent).reciprocal();
  const at::Tensor pos = at::arange(offset, offset + length, f32);
  const at::Tensor angles = at::outer(pos, inv_freq);
  const at::Tensor emb = at::cat({angles, angles}, -1);
  return {emb.cos(), emb.sin()};
}

std::pair<at::Tensor, at::Tensor> rope_tables_at(int64_t head_dim, double theta, const at::Tensor& positions) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(positions.device());
  const at::Tensor exponent = at::arange(0, head_dim, 2, f32.dtype(at::kLong)).to(at::kFloat) / static_cast<float>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, exponent).reciprocal();
  // The same products as rope_tables' outer product, so a row's tables equal it position for position.
  const at::Tensor angles = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;
  const at::Tensor emb = at::cat({angles, angles}, -1);
  return {emb.cos(), emb.sin()};
}

namespace {

// A dense block's SwiGLU of its normed input, what down_proj multiplies.
at::Tensor dense_mlp_activation(const Qwen3Block& b, const at::Tensor& h) {
  const std::vector<at::Tensor> gate_up = project_shared_input({&b.gate_proj, &b.up_proj}, h);
  return swiglu(gate_up[0], gate_up[1]);
}

}  // namespace

at::Tensor Qwen3Model::block_forward(const Qwen3Block& b, at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                                     KVCache* cache, int64_t layer, int64_t offset, const at::Tensor& allowed,
                                     BlockOutput output) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads, hd = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  // The residual stream goes on from the norms' second outputs (x itself): on CUDA each norm's backward adds the
  // stream's gradient into its own (rms_norm_and_input).
  const auto [h, x_in] = rms_norm_and_input(x, b.input_layernorm, eps);
  // RoPE on [B, T, heads, d] (one pass over q and k each), then heads first for attention.
  const std::vector<at::Tensor> qkv = project_shared_input({&b.q_proj, &b.k_proj, &b.v_proj}, h);
  const at::Tensor q = head_norm_rotary(qkv[0].view({B, T, nh, hd}), b.q_norm, eps, cos, sin).transpose(1, 2);
  at::Tensor k = head_norm_rotary(qkv[1].view({B, T, nkv, hd}), b.k_norm, eps, cos, sin).transpose(1, 2);
  at::Tensor v = qkv[2].view({B, T, nkv, hd}).transpose(1, 2);
  if (cache) {
    cache->keys[layer].narrow(2, offset, T).copy_(k);
    cache->values[layer].narrow(2, offset, T).copy_(v);
    k = cache->keys[layer].narrow(2, 0, offset + T);
    v = cache->values[layer].narrow(2, 0, offset + T);
  }
  const at::Tensor attn = causal_attention(q, k, v, allowed).transpose(1, 2).reshape({B, T, nh * hd});
  const auto [h2, x1] = rms_norm_and_input(x_in + b.o_proj(attn), b.post_attention_layernorm, eps);
  // Only differentiated: down_proj's product and the residual add after it write a value nothing reads (their
  // backward needs their inputs, not their outputs). A sparse block's output is read by its routing weights'
  // gradient (each expert's output times its weight), so it runs whole.
  if (output == BlockOutput::differentiated && !b.sparse()) {
    return unread_sum(x1, b.down_proj.unread(dense_mlp_activation(b, h2)));
  }
  return x1 + mlp(b, h2);
}

at::Tensor Qwen3Model::mlp(const Qwen3Block& b, const at::Tensor& h) const {
  if (b.sparse()) return moe_mlp(b, h);
  return b.down_proj(dense_mlp_activation(b, h));
}

at::Tensor ProjectionKernel::apply_grouped(const std::vector<const Projection*>&, const at::Tensor&,
                                           const RowGroups&) const {
  throw Error("a projection kernel that offers no grouped product was asked for one");
}

namespace {

// A sparse block's experts run as three grouped products (gate, up, down) where every expert projection of a
// kind has a kernel, all of one type, that offers them for these rows; else one expert after another.
bool experts_run_grouped(const Qwen3Block& b, const at::Tensor& x) {
  for (Projection ExpertMlp::*member : {&ExpertMlp::gate_proj, &ExpertMlp::up_proj, &ExpertMlp::down_proj}) {
    const ProjectionKernel* first = (b.experts.front().*member).kernel.get();
    if (first == nullptr || !first->offers_grouped(x)) return false;
    for (const ExpertMlp& e : b.experts) {
      const ProjectionKernel* kernel = (e.*member).kernel.get();
      if (kernel == nullptr || typeid(*kernel) != typeid(*first)) return false;
    }
  }
  return true;
}

// The N·k (token, expert) choices sorted by expert once (stable: within an expert, tokens in order): slot
// order[p] = n·k + i is row p; its routing weight; how many rows each expert has, on the device and (one read a
// block: which experts are empty, where each one's rows start) on the host.
struct ByExpert {
  at::Tensor order, weight_of, counts;
  std::vector<int64_t> host_counts;
};

ByExpert sort_by_expert(const at::Tensor& chosen, const at::Tensor& weights, int64_t experts) {
  const at::Tensor choices = chosen.reshape({-1});
  ByExpert r;
  r.order = std::get<1>(at::sort(choices, /*stable=*/true, 0, false));
  r.weight_of = weights.reshape({-1}).index_select(0, r.order);
  r.counts = at::bincount(choices, {}, experts);
  const at::Tensor host = r.counts.cpu();
  r.host_counts.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + experts);
  return r;
}

// Each expert's tokens gathered into one product, its weighted output added back to their rows (index_add,
// experts in order).
at::Tensor experts_one_by_one(const Qwen3Block& b, const at::Tensor& x, int64_t k, const ByExpert& s) {
  const at::Tensor token_of = at::floor_divide(s.order, k);
  at::Tensor out = at::zeros_like(x);
  int64_t start = 0;
  for (size_t e = 0; e < b.experts.size(); start += s.host_counts[e], ++e) {
    const int64_t count = s.host_counts[e];
    if (count == 0) continue;
    const ExpertMlp& expert = b.experts[e];
    const at::Tensor tokens = token_of.narrow(0, start, count);
    const at::Tensor rows = x.index_select(0, tokens);
    const at::Tensor y = expert.down_proj(swiglu(expert.gate_proj(rows), expert.up_proj(rows)));
    out = out.index_add(0, tokens, y * s.weight_of.narrow(0, start, count).unsqueeze(1));
  }
  return out;
}

// The same sums from three grouped products over all N·k rows sorted by expert: one launch a projection kind
// instead of one an expert (one expert at a time a forward launches about ten kernels an expert: docs/model.md).
// The gathers are by permutations only (each token's row repeated k times, then ordered), so no backward adds
// two rows into one (index_add on CUDA would do it with atomics, in no fixed order): the k copies' gradients meet
// in expand's sum. Each token's k weighted outputs are then added to zero in the order of their experts, as
// above.
at::Tensor experts_grouped(const Qwen3Block& b, const at::Tensor& x, const at::Tensor& chosen, const ByExpert& s) {
  const int64_t N = x.size(0), H = x.size(1), k = chosen.size(1);
  const RowGroups groups{s.counts.cumsum(0).to(at::kInt), s.host_counts};
  const at::Tensor rows = x.unsqueeze(1).expand({N, k, H}).reshape({N * k, H}).index_select(0, s.order);
  const auto product = [&](Projection ExpertMlp::*member, const at::Tensor& in) {
    std::vector<const Projection*> group;
    for (const ExpertMlp& e : b.experts) group.push_back(&(e.*member));
    return group.front()->kernel->apply_grouped(group, in, groups);
  };
  const at::Tensor act = swiglu(product(&ExpertMlp::gate_proj, rows), product(&ExpertMlp::up_proj, rows));
  const at::Tensor y = product(&ExpertMlp::down_proj, act) * s.weight_of.unsqueeze(1);
  // Row p of y is the slot order[p] = n·k + i; position[slot] = p. A token's slots ranked by their experts.
  const at::Tensor position = at::empty_like(s.order).index_put_({s.order}, at::arange(N * k, s.order.options()));
  const at::Tensor by_expert = std::get<1>(at::sort(chosen, /*stable=*/true, 1, false));
  const at::Tensor ranked = y.index_select(0, position.view({N, k}).gather(1, by_expert).reshape({-1})).view({N, k, H});
  at::Tensor out = at::zeros_like(x);
  for (int64_t j = 0; j < k; ++j) out = out + ranked.select(1, j);
  return out;
}

}  // namespace

// transformers' Qwen3MoeSparseMoeBlock: router logits in the activations' dtype, softmax in fp32, the top k
// (renormalized to sum 1 with norm_topk_prob), back in the activations' dtype; every token through each of its
// k experts, weighted, summed in the order of the experts (as transformers adds them). Computed by expert, not
// by token. Every routed token is computed: no capacity limit, nothing dropped.
at::Tensor Qwen3Model::moe_mlp(const Qwen3Block& b, const at::Tensor& h) const {
  const int64_t H = h.size(-1), k = config_.num_experts_per_tok;
  const at::Tensor x = h.reshape({-1, H});
  at::Tensor router_logits = at::linear(x, b.router.to(x.scalar_type()));
  if (record_router_logits_) router_logits_.push_back(router_logits);
  if (router_observer_ != nullptr) {
    const auto layer = static_cast<int64_t>(&b - blocks.data());
    if (layer < 0 || layer >= static_cast<int64_t>(blocks.size())) throw Error("moe_mlp: a block of another model");
    router_logits = router_observer_->observe(layer, router_logits);
  }
  auto [weights, chosen] = at::topk(at::softmax(router_logits, -1, at::kFloat), k, -1);
  if (config_.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  const ByExpert sorted = sort_by_expert(chosen, weights.to(x.scalar_type()), static_cast<int64_t>(b.experts.size()));
  const at::Tensor out = experts_run_grouped(b, x) ? experts_grouped(b, x, chosen, sorted)
                                                   : experts_one_by_one(b, x, k, sorted);
  return out.view(h.sizes());
}

at::Tensor Qwen3Model::embed(const at::Tensor& ids) const {
  return at::embedding(embed_tokens, ids.to(device_)).to(compute_dtype_);  // the residual stream's dtype
}

at::Tensor Qwen3Model::hidden_states(const at::Tensor& ids, KVCache* cache) {
  return hidden_states_from_embeddings(embed(ids), cache);
}

at::Tensor Qwen3Model::hidden_states_from_embeddings(at::Tensor x, KVCache* cache, const PackedRows* packed) {
  const int64_t T = x.size(1);
  const int64_t offset = cache ? cache->length : 0;
  if (cache && offset + T > cache->capacity())
    throw Error("KV cache holds " + std::to_string(cache->capacity()) + " positions; " +
                std::to_string(offset + T) + " needed");
  if (packed && cache) throw Error("model: packed rows are for training, not for a KV cache");
  const auto [cos, sin] = packed ? rope_tables_at(config_.head_dim, config_.rope_theta, packed->positions.to(device_))
                                 : rope_tables(config_.head_dim, config_.rope_theta, offset, T, device_);
  const at::Tensor allowed =
      packed ? packed_attention_layout(packed->documents, device_, compute_dtype_, config_.head_dim) : at::Tensor();
  x = x.to(compute_dtype_);
  const bool runner = block_runner_ && !cache && at::GradMode::is_enabled();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto layer = static_cast<int64_t>(i);
    x = runner ? block_runner_->run(*this, layer, x, cos, sin, allowed)
               : block_forward(blocks[i], x, cos, sin, cache, layer, offset, allowed);
  }
  if (cache) cache->length += T;
  return rmsnorm(x, final_norm);
}

at::Tensor Qwen3Model::logits(const at::Tensor& hidden) {
  return at::linear(hidden, head_weight().to(hidden.scalar_type())).to(at::kFloat);
}

KVCache Qwen3Model::make_cache(int64_t batch, int64_t capacity) const {
  KVCache c;
  const auto opts = at::TensorOptions().dtype(compute_dtype_).device(device_);
  for (size_t i = 0; i < blocks.size(); ++i) {
    c.keys.push_back(at::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, opts));
    c.values.push_back(at::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, opts));
  }
  return c;
}

}  // namespace qwen3
