#include "block_runner.h"

#include <torch/autograd.h>
#include <torch/utils.h>

namespace qwen3::train_detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The model and the runner outlive every backward of their own forward; autograd's saved data holds only
// IValues, so they travel as addresses.
template <typename T>
T* from_address(const c10::IValue& v) {
  return reinterpret_cast<T*>(v.toInt());
}

class BlockSegment : public torch::autograd::Function<BlockSegment> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            at::TensorList params, int64_t model_address, int64_t runner_address, int64_t layer,
                            int64_t allowed_address) {
    // The packed rows' mask, by address: an undefined tensor cannot be an autograd input.
    const at::Tensor& allowed = *reinterpret_cast<const at::Tensor*>(allowed_address);
    auto* model = reinterpret_cast<Qwen3Model*>(model_address);
    const auto* runner = reinterpret_cast<const TrainingBlockRunner*>(runner_address);
    ctx->saved_data["model"] = model_address;
    ctx->saved_data["runner"] = runner_address;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    if (allowed.defined()) ctx->saved_data["allowed"] = allowed;  // a mask, never differentiated
    if (runner->recompute(layer)) {
      ctx->save_for_backward({x, cos, sin});
      torch::NoGradGuard no_grad;
      return model->run_block(layer, x, cos, sin, allowed);
    }
    // Keep the block's own graph, rooted at a detached copy of the input, for backward to differentiate.
    const at::Tensor input = x.detach().requires_grad_(x.requires_grad());
    at::Tensor y;
    {
      torch::AutoGradMode grad(true);
      y = model->run_block(layer, input, cos, sin, allowed);
    }
    ctx->saved_data["input"] = input;
    ctx->saved_data["output"] = y;
    // A second handle on y's bytes (detach shares them, and their version counter, without a copy): the returned
    // one gets this node as its grad_fn, `y` keeps the inner graph. A clone here moved a·H bytes a token each way
    // and held them until backward, a block's output twice.
    return y.detach();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* model = from_address<Qwen3Model>(ctx->saved_data["model"]);
    auto* runner = from_address<TrainingBlockRunner>(ctx->saved_data["runner"]);
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
      const at::Tensor allowed = ctx->saved_data.count("allowed") ? ctx->saved_data["allowed"].toTensor() : at::Tensor();
      torch::AutoGradMode grad(true);
      y = runner->run_again(*model, layer, x, saved[1], saved[2], allowed);
    }
    // Differentiate with respect to x and the block's trainable tensors (the same leaves forward saw).
    const Qwen3Block& b = model->blocks[static_cast<size_t>(layer)];
    std::vector<at::Tensor> inputs;
    std::vector<int> slot;  // which returned gradient each input's goes to: 0 = x, 3 + k = params[k]
    if (x.requires_grad()) inputs.push_back(x), slot.push_back(0);
    int k = 0;
    for (const at::Tensor* t : b.tensors())
      if (t->defined() && t->requires_grad()) inputs.push_back(*t), slot.push_back(3 + k++);
    variable_list out(3 + n_params + 4);  // x, cos, sin, params..., and the four non-tensors
    if (inputs.empty()) return out;
    auto grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    y = at::Tensor();
    if (const BlockGradientSink* sink = runner->sink()) {
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

// The embedding lookup with its gradient added into the table's .grad() by backward.
class EmbeddingIntoGrad : public torch::autograd::Function<EmbeddingIntoGrad> {
 public:
  // `table` is an input so that autograd records this node; its gradient is never returned.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& table, const at::Tensor& ids) {
    ctx->saved_data["table"] = table;
    ctx->saved_data["ids"] = ids;
    return at::embedding(table.detach(), ids);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    at::Tensor table = ctx->saved_data["table"].toTensor();
    const at::Tensor ids = ctx->saved_data["ids"].toTensor();
    at::Tensor& g = table.mutable_grad();
    if (!g.defined()) g = at::zeros_like(table, at::MemoryFormat::Contiguous);
    const at::Tensor rows = grad_outputs[0].reshape({-1, table.size(1)}).to(g.scalar_type());
    if (g.is_cuda()) {
      // index_add_ on CUDA adds a repeated token's rows by atomics, in no fixed order: fp32 sums whose bits change
      // from run to run. index_put_ with accumulate sorts the ids (stably) and adds each token's rows in order.
      g.index_put_({ids.reshape({-1})}, rows, /*accumulate=*/true);
    } else {
      g.index_add_(0, ids.reshape({-1}), rows);  // sequential: the rows in their order
    }
    return {at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor TrainingBlockRunner::run(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& allowed) {
  if (!recompute(layer) && !sink_) return model.run_block(layer, x, cos, sin, allowed);
  // The block's trainable tensors are the segment's inputs so that autograd routes their gradients here.
  std::vector<at::Tensor> trainable;
  for (const at::Tensor* t : model.blocks[static_cast<size_t>(layer)].tensors())
    if (t->defined() && t->requires_grad()) trainable.push_back(*t);
  return BlockSegment::apply(x, cos, sin, at::TensorList(trainable), reinterpret_cast<int64_t>(&model),
                             reinterpret_cast<int64_t>(this), layer, reinterpret_cast<int64_t>(&allowed));
}

at::Tensor embedding_into_grad(const at::Tensor& table, const at::Tensor& ids) {
  return EmbeddingIntoGrad::apply(table, ids);
}

}  // namespace qwen3::train_detail
