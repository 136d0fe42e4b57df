#include "block_segment.h"

#include <torch/autograd.h>

namespace qwen3 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The model and the sink outlive every backward of their own forward; autograd's saved data holds only
// IValues, so they travel as addresses.
template <typename T>
T* from_address(const c10::IValue& v) {
  return reinterpret_cast<T*>(v.toInt());
}

class BlockSegment : public torch::autograd::Function<BlockSegment> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            at::TensorList params, int64_t model_address, int64_t layer, bool recompute,
                            int64_t sink_address) {
    auto* model = reinterpret_cast<Qwen3Model*>(model_address);
    ctx->saved_data["model"] = model_address;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    ctx->saved_data["sink"] = sink_address;
    if (recompute) {
      ctx->save_for_backward({x, cos, sin});
      torch::NoGradGuard no_grad;
      return model->run_block(layer, x, cos, sin);
    }
    // Keep the block's own graph, rooted at a detached copy of the input, for backward to differentiate.
    const at::Tensor input = x.detach().requires_grad_(x.requires_grad());
    at::Tensor y;
    {
      torch::AutoGradMode grad(true);
      y = model->run_block(layer, input, cos, sin);
    }
    ctx->saved_data["input"] = input;
    ctx->saved_data["output"] = y;
    // A fresh tensor: the returned one gets this node as its grad_fn, `y` keeps the inner graph.
    return y.detach().clone();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* model = from_address<Qwen3Model>(ctx->saved_data["model"]);
    auto* sink = from_address<const BlockGradientSink>(ctx->saved_data["sink"]);
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int64_t n_params = ctx->saved_data["params"].toInt();
    at::Tensor x, y;
    if (ctx->saved_data.count("output")) {
      x = ctx->saved_data["input"].toTensor();
      y = ctx->saved_data["output"].toTensor();
      ctx->saved_data.erase("input");  // the inner graph goes as soon as it has been differentiated
      ctx->saved_data.erase("output");
    } else {
      const auto saved = ctx->get_saved_variables();
      x = saved[0].detach().requires_grad_(saved[0].requires_grad());
      torch::AutoGradMode grad(true);
      y = model->recompute_block(layer, x, saved[1], saved[2]);
    }
    // Differentiate with respect to x and the block's trainable tensors (the same leaves forward saw).
    const Qwen3Block& b = model->blocks[layer];
    std::vector<at::Tensor> inputs;
    std::vector<int> slot;  // which returned gradient each input's goes to: 0 = x, 3 + k = params[k]
    if (x.requires_grad()) inputs.push_back(x), slot.push_back(0);
    int k = 0;
    for (const at::Tensor* t : b.tensors())
      if (t->requires_grad()) inputs.push_back(*t), slot.push_back(3 + k++);
    variable_list out(3 + n_params + 4);
    if (inputs.empty()) return out;
    auto grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    y = at::Tensor();
    if (sink) {
      std::vector<std::pair<at::Tensor, at::Tensor>> param_grads;
      for (size_t i = 0; i < grads.size(); ++i)
        if (slot[i] != 0) param_grads.emplace_back(inputs[i], std::move(grads[i]));
      (*sink)(layer, param_grads);  // the parameters get no .grad(): their gradients end here
      if (slot[0] == 0) out[0] = grads[0];
      return out;
    }
    for (size_t i = 0; i < grads.size(); ++i) out[slot[i]] = grads[i];
    return out;
  }
};

}  // namespace

at::Tensor block_segment(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& params, bool recompute,
                         const BlockGradientSink* sink) {
  return BlockSegment::apply(x, cos, sin, at::TensorList(params), reinterpret_cast<int64_t>(&model), layer, recompute,
                             reinterpret_cast<int64_t>(sink));
}

}  // namespace qwen3
