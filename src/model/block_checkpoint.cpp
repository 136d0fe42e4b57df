#include "block_checkpoint.h"

#include <torch/autograd.h>

#include "qwen3/model.h"

namespace qwen3 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            at::TensorList params, int64_t model_address, int64_t layer) {
    ctx->save_for_backward({x, cos, sin});
    // The model outlives every backward of its own forward; autograd's saved data holds only IValues.
    ctx->saved_data["model"] = model_address;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    torch::NoGradGuard no_grad;
    return reinterpret_cast<Qwen3Model*>(model_address)->run_block(layer, x, cos, sin);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto* model = reinterpret_cast<Qwen3Model*>(ctx->saved_data["model"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int64_t n_params = ctx->saved_data["params"].toInt();
    const at::Tensor x = saved[0].detach().requires_grad_(saved[0].requires_grad());
    at::Tensor y;
    {
      torch::AutoGradMode grad(true);
      y = model->run_block(layer, x, saved[1], saved[2]);
    }
    // Differentiate with respect to x and the block's trainable tensors (the same leaves forward saw).
    const Qwen3Block& b = model->blocks[layer];
    std::vector<at::Tensor> inputs;
    std::vector<int> slot;  // which returned gradient each input's goes to: 0 = x, 3 + k = params[k]
    if (x.requires_grad()) inputs.push_back(x), slot.push_back(0);
    int k = 0;
    for (const at::Tensor* t : b.tensors())
      if (t->requires_grad()) inputs.push_back(*t), slot.push_back(3 + k++);
    variable_list out(3 + n_params + 2);
    if (inputs.empty()) return out;
    const auto grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) out[slot[i]] = grads[i];
    return out;
  }
};

}  // namespace

at::Tensor checkpointed_block(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                              const at::Tensor& sin, const std::vector<at::Tensor>& params) {
  return CheckpointedBlock::apply(x, cos, sin, at::TensorList(params), reinterpret_cast<int64_t>(&model), layer);
}

}  // namespace qwen3
