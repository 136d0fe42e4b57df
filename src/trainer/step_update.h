// A training step after its batch: forward, backward and the AdamW update, in the plain order or inside backward
// (--fused-optimizer: the FusedUpdater the model's gradient sink calls with each block's gradients), behind one
// interface. Private to the trainer (trainer.cpp includes it once). docs/trainer.md.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/optim/optim.h"
#include "qwen3/data/data.h"
#include "block_runner.h"
#include "product_sm_carveout.h"
#include "router_balance.h"
#include "qwen3/dist/data_parallel.h"
#include "train_setup.h"

#if defined(QWEN3_TORCH_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace qwen3::train_detail {

// Gradient clipping and non-finite checks when the optimizer runs inside backward (--fused-optimizer): the
// global norm is known only after the last update, so each group (a block, or a tensor outside the blocks) is
// clipped to its share of --grad-clip, max_norm * sqrt(group elements / trainable elements); the clipped global
// norm then never exceeds max_norm, as with global clipping. A group with a non-finite gradient is not applied.
//
// Nothing here waits for the device: each group's factor is computed on the device (group_clip_factors: on CUDA
// one kernel a group, kernels/grad_clip.cu, where the ATen form launched about 50 small kernels; fp64, the
// operations of clip_factor) and handed to the update kernels, which read it and skip the group where it is NaN.
// The squared norm accumulates on the device too and is read once, with the step's other results (the first GPU
// round found the step's 36 per-block reads leaving the device idle).
class FusedUpdater {
 public:
  FusedUpdater(AdamW& opt, double max_norm, int64_t trainable_elements, double lr)
      : opt_(opt), max_norm_(max_norm), trainable_(trainable_elements), lr_(lr) {}
  // However the step ends (an error in backward included), nothing the current stream does next (a checkpoint's
  // read of the parameters) runs before the updates already queued on their own stream.
  ~FusedUpdater() {
    try {
      join();
    } catch (...) {  // a failed CUDA call here: the device is gone, and the error that ended the step says so
    }
  }
  FusedUpdater(const FusedUpdater&) = delete;
  FusedUpdater& operator=(const FusedUpdater&) = delete;

  // --overlap-update: every group's clipping and update from now on runs on a CUDA stream of its own, after the
  // work the current stream has queued by then (its gradients), so that it runs beside the rest of backward; the
  // gradients are marked in use by that stream, so the allocator reuses none of them before the update has read
  // it. The same kernels in the same order: the same bytes. join() makes the current stream wait for it. A CPU
  // device (or a build without CUDA) keeps the updates on the current stream.
  void overlap_on_own_stream(const c10::Device& device) {
#if defined(QWEN3_TORCH_HAS_CUDA)
    if (device.is_cuda()) own_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
#else
    (void)device;
#endif
  }
  void join() const {
#if defined(QWEN3_TORCH_HAS_CUDA)
    if (!own_stream_) return;
    at::cuda::CUDAEvent done;
    done.record(*own_stream_);
    done.block(c10::cuda::getCurrentCUDAStream(own_stream_->device_index()));
#endif
  }

  // `ranks_with_gradient` (data parallel): per parameter of the group, fp32 on the device, how many ranks had a
  // gradient for it; a parameter none had (zeros from every rank) is neither counted nor updated, as in one
  // process. Undefined: every defined gradient counts.
  void apply(const std::vector<std::pair<at::Tensor, at::Tensor>>& group, const at::Tensor& ranks_with_gradient = {}) {
#if defined(QWEN3_TORCH_HAS_CUDA)
    if (own_stream_) {
      // One event, recorded again for each group: the wait is enqueued at once, on what the event holds then.
      gradients_ready_.record(c10::cuda::getCurrentCUDAStream(own_stream_->device_index()));
      gradients_ready_.block(*own_stream_);
      for (const auto& [param, grad] : group)
        if (grad.defined() && grad.is_cuda())
          c10::cuda::CUDACachingAllocator::recordStream(grad.storage().data_ptr(), *own_stream_);
      // (No ranks_with_gradient here: the trainer refuses --overlap-update with data parallel.)
      const c10::cuda::CUDAStreamGuard on_own_stream(*own_stream_);
      apply_here(group, ranks_with_gradient);
      return;
    }
#endif
    apply_here(group, ranks_with_gradient);
  }
  // The squared global norm (fp64, on the device; undefined before the first group), non-finite when any
  // group's gradient was. With the updates on their own stream: read it after join().
  const at::Tensor& square_sum() const { return sum_of_squares_; }
#if defined(QWEN3_TORCH_HAS_CUDA)
  const std::optional<c10::cuda::CUDAStream>& own_stream() const { return own_stream_; }
#endif

 private:
  void apply_here(const std::vector<std::pair<at::Tensor, at::Tensor>>& group, const at::Tensor& ranks_with_gradient) {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    std::vector<int64_t> defined;  // the group's parameters that have a gradient
    for (size_t i = 0; i < group.size(); ++i)
      if (group[i].second.defined()) grads.push_back(group[i].second), defined.push_back(static_cast<int64_t>(i));
    if (grads.empty()) return;
    at::Tensor ranks = ranks_with_gradient;
    if (ranks.defined() && grads.size() != group.size())
      ranks = ranks.index_select(0, at::tensor(defined, at::TensorOptions().dtype(at::kLong)).to(ranks.device()));
    // One kernel on CUDA for the group's norm, its share of the limit and the factors (optim.h).
    const at::Tensor factors = group_clip_factors(grads, ranks, max_norm_, trainable_, sum_of_squares_);
    // With a shared-out state (--shard-optimizer-state) this rank updates the parameters it holds the state of.
    for (size_t k = 0; k < grads.size(); ++k) {
      const at::Tensor& param = group[static_cast<size_t>(defined[k])].first;
      const auto index = opt_.find(param);
      if (!index) continue;
      const at::Tensor factor = factors[static_cast<int64_t>(k)];
      opt_.update(*index, grads[k], lr_, factor.device() == param.device() ? factor : factor.to(param.device()));
    }
  }

  AdamW& opt_;
  double max_norm_;
  int64_t trainable_;
  double lr_;
  at::Tensor sum_of_squares_;
#if defined(QWEN3_TORCH_HAS_CUDA)
  std::optional<c10::cuda::CUDAStream> own_stream_;
  at::cuda::CUDAEvent gradients_ready_;
#endif
};

// Clears the runner's gradient sink however the step ends.
struct SinkGuard {
  TrainingBlockRunner& runner;
  ~SinkGuard() { runner.set_gradient_sink(nullptr); }
};

// A step after its batch: forward, backward and the AdamW update. Two orders behind one interface, so the loop
// is the same for both: the plain one (backward, one synchronization for loss, norm and the codec's non-finite
// flag, then the update with the clipping factor) and the in-backward one (--fused-optimizer: each block is
// updated, clipped by its share of the limit, as soon as its gradients are complete, and they are freed).
struct StepOutcome {
  double loss = 0, norm = 0;
  bool bad = false;  // non-finite loss or gradients: the plain update was skipped (fused: the bad groups were)
  // With the load-balancing loss: its value (transformers' aux_loss, before the coefficient), the mean over the
  // step's micro-batches weighted by their shares. Trained through its gradient, not part of `loss`.
  std::optional<double> router_aux_loss;
};
using PhaseMark = std::function<void(const char*)>;

// A step left before its update because a stop was requested (trainer.h, StopRequest): nothing of it is applied,
// and resuming runs it again from its first micro-batch.
struct StepAbandoned {
  int64_t micro_batches_done = 0, micro_batches = 0;
};

class StepUpdate {
 public:
  StepUpdate(const TrainOptions& o, TrainableSet& set, AdamW& opt, const c10::Device& device,
             TrainingBlockRunner& runner, DataParallel& dp, const std::vector<int>& owners)
      : o_(o), set_(set), opt_(opt), device_(device), runner_(runner), dp_(dp), owners_(owners) {}
  virtual ~StepUpdate() = default;
  // `batches`: this rank's micro-batches of the step (one without gradient accumulation); `loss_tokens`: the
  // step's loss tokens over all ranks. A batch whose loss_tokens is 0 is a stand-in for a rank with nothing left
  // in the epoch: it runs, weighted 0, so that every rank takes part in every collective.
  virtual StepOutcome forward_backward_update(Qwen3Model& model, const std::vector<Batch>& batches,
                                              int64_t loss_tokens, double lr, const PhaseMark& mark) = 0;
  // Polled before each micro-batch after the first; true throws StepAbandoned (one process only: ranks must
  // leave a step together, so the trainer gives a data-parallel run a check that stays false).
  void set_stop_check(std::function<bool()> stop) { stop_requested_ = std::move(stop); }
  // The load-balancing loss to train with every micro-batch (router_balance.h), or none.
  void set_router_balance(RouterBalanceLoss* balance) { balance_ = balance; }

 protected:
  const TrainOptions& o_;
  TrainableSet& set_;
  AdamW& opt_;
  c10::Device device_;
  TrainingBlockRunner& runner_;
  DataParallel& dp_;
  const std::vector<int>& owners_;  // --shard-optimizer-state: which rank updates each parameter; else empty
  std::function<bool()> stop_requested_;
  RouterBalanceLoss* balance_ = nullptr;

  // Data parallel: a parameter with a gradient on no rank (an expert no rank routed a token to) gets no update,
  // as in one process, where it has no gradient at all (and as DDP leaves such a parameter's .grad None), while
  // the ranks sum zeros for it. Each rank adds to a block's sum a 1 for every parameter it had a gradient for.
  // The plain update reads the summed flags with the step's one read and drops the gradients no rank had, so
  // AdamW skips them as it skips any parameter without one; the in-backward update hands them to FusedUpdater.
  std::unordered_set<const c10::TensorImpl*> had_gradient_;  // this rank, this step's micro-batches so far
  void note_gradient(const at::Tensor& param, const at::Tensor& grad) {
    if (grad.defined()) had_gradient_.insert(param.unsafeGetTensorImpl());
  }
  // The flags of `params` (fp32, on their device), to be summed with their gradients.
  at::Tensor gradient_flags(const std::vector<at::Tensor>& params) const {
    std::vector<float> flags;
    for (const at::Tensor& p : params) flags.push_back(had_gradient_.count(p.unsafeGetTensorImpl()) ? 1.0f : 0.0f);
    return at::tensor(flags, at::kFloat).to(params.front().device());
  }

  at::Tensor router_aux_;     // Σ share × the micro-batches' load-balancing loss, on the device
  double router_aux_shares_ = 0;

  // Around one micro-batch's forward and backward: the model shows the observer its router logits. The guard
  // clears it however the step ends.
  struct ObserverGuard {
    Qwen3Model& model;
    ~ObserverGuard() { model.set_router_observer(nullptr); }
  };
  void begin_balance(Qwen3Model& model, const Batch& batch, double share) {
    if (balance_ == nullptr) return;
    balance_->begin(batch.token_mask, share);
    model.set_router_observer(balance_);
  }
  void end_balance(Qwen3Model& model, double share) {
    if (balance_ == nullptr) return;
    model.set_router_observer(nullptr);
    const at::Tensor value = balance_->finish();
    if (!value.defined()) return;
    const at::Tensor weighted = value.to(at::kDouble).reshape({1}) * share;
    router_aux_ = router_aux_.defined() ? router_aux_ + weighted : weighted;
    router_aux_shares_ += share;
  }
  // The step's value, appended to the tensors of its one read to the host, taken back from it by read_router_aux.
  void append_router_aux(std::vector<at::Tensor>& results) const {
    if (router_aux_.defined()) results.push_back(router_aux_.to(results.empty() ? router_aux_.device() : results.front().device()));
  }
  void read_router_aux(const at::Tensor& host, StepOutcome& out) {
    if (router_aux_.defined() && router_aux_shares_ > 0)
      out.router_aux_loss = host[host.size(0) - 1].item<double>() / router_aux_shares_;
    router_aux_ = at::Tensor();
    router_aux_shares_ = 0;
  }

  // After a shared-out update of `params` (all of them when empty): each from the rank that updated it (its
  // position in the trainable set names the owner), to every rank.
  void send_updated_parameters(const std::vector<std::pair<at::Tensor, at::Tensor>>& params = {}) {
    if (owners_.empty()) return;
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < set_.params.size(); ++i) {
      const at::Tensor& param = set_.params[i].param;
      const bool sent = params.empty() || std::any_of(params.begin(), params.end(), [&](const auto& pg) {
                          return pg.first.unsafeGetTensorImpl() == param.unsafeGetTensorImpl();
                        });
      if (!sent) continue;
      at::Tensor p = param.detach();
      dp_.broadcast(p, owners_[i], "updated parameters");
    }
  }

  // Each micro-batch's mean loss is weighted by its share of the step's loss tokens over all ranks, so that
  // the gradients, summed over micro-batches and ranks, are those of the mean over all of them: one big
  // batch's, whatever each holds (gradient accumulation, data parallel).
  std::vector<double> shares(const std::vector<Batch>& batches, int64_t global) const {
    std::vector<double> out;
    for (const Batch& b : batches)
      out.push_back(batches.size() == 1 && dp_.world_size() == 1
                        ? 1.0
                        : global == 0 ? 0.0 : static_cast<double>(b.loss_tokens) / static_cast<double>(global));
    return out;
  }
};

class PlainUpdate final : public StepUpdate {
 public:
  using StepUpdate::StepUpdate;
  StepOutcome forward_backward_update(Qwen3Model& model, const std::vector<Batch>& batches, int64_t loss_tokens,
                                      double lr, const PhaseMark& mark) override {
    const std::vector<double> share = shares(batches, loss_tokens);
    // Data parallel: each block's gradients go to .grad() through the block sink and, in the last micro-batch,
    // their sum over the ranks is launched at once, running while the blocks before it are differentiated.
    std::vector<std::unique_ptr<DataParallel::Pending>> pending;
    std::unordered_set<const c10::TensorImpl*> reduced;  // parameters whose sum is under way
    bool last_micro_batch = false;
    // With the state shared out (--shard-optimizer-state) each block's gradients are summed onto their owners
    // only (a reduce a rank), and once a block's sums are in, a rank drops the gradients it does not own: it holds
    // its share of the gradients plus the two blocks whose sums are under way, instead of all of them.
    std::vector<OwnerSums> previous_block;
    SinkGuard guard{runner_};
    if (dp_.world_size() > 1)
      runner_.set_gradient_sink([&](int64_t, const std::vector<std::pair<at::Tensor, at::Tensor>>& grads) {
        torch::NoGradGuard no_grad;
        std::vector<at::Tensor> block;
        std::vector<at::Tensor> params;
        for (const auto& [param, grad] : grads) {
          note_gradient(param, grad);
          at::Tensor& g = at::Tensor(param).mutable_grad();
          if (!grad.defined()) {
            if (!g.defined()) g = at::zeros_like(param);
          } else {
            g = g.defined() ? g + grad : grad;
          }
          block.push_back(g);
          params.push_back(param);
          if (last_micro_batch) reduced.insert(param.unsafeGetTensorImpl());
        }
        if (!last_micro_batch) return;
        if (owners_.empty()) {
          block.push_back(gradient_flags(params));
          flagged_.push_back({params, block.back()});
          pending.push_back(dp_.all_reduce_sum_async(std::move(block), "block gradients"));
          return;
        }
        std::vector<OwnerSums> current = sum_onto_owners(params, "block gradients", /*with_flags=*/true);
        finish(previous_block);
        previous_block = std::move(current);
      });
    at::Tensor loss;
    had_gradient_.clear();
    flagged_.clear();
    ObserverGuard observer{model};
    router_aux_ = at::Tensor();
    router_aux_shares_ = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      if (i > 0 && stop_requested_ && stop_requested_())
        throw StepAbandoned{static_cast<int64_t>(i), static_cast<int64_t>(batches.size())};
      last_micro_batch = i + 1 == batches.size();
      begin_balance(model, batches[i], share[i]);
      at::Tensor micro = compute_loss(model, batches[i], o_.loss);
      if (share[i] != 1.0) micro = micro * share[i];
      mark("forward_done");
      micro.backward();
      end_balance(model, share[i]);
      loss = loss.defined() ? loss + micro.detach() : micro.detach();
    }
    if (!owners_.empty()) return sharded_outcome(loss, lr, mark, previous_block, reduced);
    if (dp_.world_size() > 1) {  // the blocks' sums, then one of everything outside the blocks and the loss
      torch::NoGradGuard no_grad;
      for (auto& p : pending) p->wait();
      std::vector<at::Tensor> sums = {loss.to(at::kFloat).reshape({1})};
      for (auto& p : set_.params) {
        if (!p.param.requires_grad()) continue;
        at::Tensor& g = p.param.mutable_grad();
        if (!g.defined()) g = at::zeros_like(p.param);
        if (!reduced.count(p.param.unsafeGetTensorImpl())) sums.push_back(g);
      }
      dp_.all_reduce_sum(sums, "gradients");
      loss = sums[0].reshape({});
    }
    const at::Tensor square = grad_square_sum(set_.params);
    const at::Tensor loss_value = loss.detach().reshape({1}).to(at::kDouble);
    loss = at::Tensor();
    return update(loss_value, square.defined() ? square.reshape({1}).to(at::kDouble) : at::zeros_like(loss_value), lr,
                  mark);
  }

 private:
  // One reduce under way: the sum of some parameters' gradients onto their owner.
  struct OwnerSums {
    std::unique_ptr<DataParallel::Pending> sum;
    std::vector<at::Tensor> dropped;  // parameters whose gradients this rank lets go once the sum is in
  };

  int owner_of(const at::Tensor& param) {
    if (owner_index_.empty())
      for (size_t i = 0; i < set_.params.size(); ++i) owner_index_[set_.params[i].param.unsafeGetTensorImpl()] = owners_[i];
    return owner_index_.at(param.unsafeGetTensorImpl());
  }

  // Launches the sums of `params`' gradients (all defined), one reduce per owning rank, in rank order; with their
  // gradient flags (a block's parameters, some of which may have had no gradient anywhere).
  std::vector<OwnerSums> sum_onto_owners(const std::vector<at::Tensor>& params, const char* what, bool with_flags = false) {
    std::vector<OwnerSums> out;
    for (int r = 0; r < dp_.world_size(); ++r) {
      std::vector<at::Tensor> grads, dropped, owned;
      for (const at::Tensor& p : params)
        if (owner_of(p) == r) {
          grads.push_back(p.grad());
          owned.push_back(p);
          if (r != dp_.rank()) dropped.push_back(p);
        }
      if (grads.empty()) continue;
      if (with_flags) {
        grads.push_back(gradient_flags(owned));
        if (r == dp_.rank()) flagged_.push_back({owned, grads.back()});  // the sum lands on the owner only
      }
      out.push_back({dp_.reduce_sum_async(std::move(grads), r, what), std::move(dropped)});
    }
    return out;
  }

  static void finish(std::vector<OwnerSums>& sums) {
    for (OwnerSums& s : sums) {
      s.sum->wait();
      for (at::Tensor& p : s.dropped) p.mutable_grad() = at::Tensor();
    }
    sums.clear();
  }

  // The end of a shared-out step: the last block's sums and those of the tensors outside the blocks onto their
  // owners; the loss and each parameter's squared gradient sum (from its owner) to every rank in one all-reduce
  // (each square is one owner's value plus zeros: exact), so the norm, the clipping and the skip decision are
  // the unshared run's to the bit. Then each rank updates its share and sends it.
  StepOutcome sharded_outcome(at::Tensor& loss, double lr, const PhaseMark& mark, std::vector<OwnerSums>& last,
                              const std::unordered_set<const c10::TensorImpl*>& reduced) {
    torch::NoGradGuard no_grad;
    finish(last);
    std::vector<at::Tensor> outside;
    for (auto& p : set_.params) {
      if (!p.param.requires_grad() || reduced.count(p.param.unsafeGetTensorImpl())) continue;
      at::Tensor& g = p.param.mutable_grad();
      if (!g.defined()) g = at::zeros_like(p.param);
      outside.push_back(p.param);
    }
    std::vector<OwnerSums> sums = sum_onto_owners(outside, "gradients");
    finish(sums);
    // Each trained parameter's square from its owner (the others' entries zero), formed as the one-process
    // norm forms them (square_sums_fp32: on CUDA one launch for all this rank owns).
    std::vector<at::Tensor> owned_grads;
    std::vector<int64_t> owned_at;
    int64_t trained = 0;
    for (size_t i = 0; i < set_.params.size(); ++i) {
      const at::Tensor& param = set_.params[i].param;
      if (!param.requires_grad()) continue;
      if (owners_[i] == dp_.rank()) owned_grads.push_back(param.grad()), owned_at.push_back(trained);
      ++trained;
    }
    at::Tensor squares = at::zeros({trained}, loss.options().dtype(at::kFloat));
    if (!owned_grads.empty())
      squares.index_copy_(0, at::tensor(owned_at, at::TensorOptions().dtype(at::kLong)).to(squares.device()),
                          square_sums_fp32(owned_grads).to(squares.device()));
    std::vector<at::Tensor> together = {loss.detach().to(at::kFloat).reshape({1}), squares};
    dp_.all_reduce_sum(together, "loss and gradient norms");
    loss = at::Tensor();
    return update(together[0].to(at::kDouble), together[1].sum().reshape({1}).to(at::kDouble), lr, mark);
  }

  // The step's end, whichever way the gradients were summed: one synchronization brings the loss, the squared
  // gradient norm and the codec's non-finite flag to the host together; clipping is a factor the update applies
  // as it reads each gradient; this rank's share is updated and sent when the state is shared out.
  StepOutcome update(const at::Tensor& loss_value, const at::Tensor& square, double lr, const PhaseMark& mark) {
    std::vector<at::Tensor> results = {loss_value, square};
    const at::Tensor flag = nvfp4::take_nonfinite_flag_async(device_);
    if (flag.defined()) results.push_back(flag.to(at::kDouble));
    const int64_t flags_at = static_cast<int64_t>(results.size());
    for (const auto& block : flagged_) results.push_back(block.second.to(results.front().device(), at::kDouble));
    append_router_aux(results);
    const at::Tensor host = at::cat(results).to(at::kCPU);
    StepOutcome out;
    read_router_aux(host, out);
    out.loss = host[0].item<double>();
    out.norm = std::sqrt(host[1].item<double>());
    mark("backward_done");
    out.bad = !std::isfinite(out.loss) || !std::isfinite(out.norm) || (flag.defined() && host[2].item<double>() != 0);
    // A gradient no rank had (zeros summed) is dropped: AdamW leaves its parameter alone, as in one process.
    const auto summed = host.accessor<double, 1>();
    int64_t at_flag = flags_at;
    for (const auto& [params, flags] : flagged_)
      for (const at::Tensor& param : params)
        if (summed[at_flag++] == 0) at::Tensor(param).mutable_grad() = at::Tensor();
    flagged_.clear();
    had_gradient_.clear();
    if (!out.bad) {
      opt_.step(lr, clip_factor(out.norm, o_.grad_clip));
      send_updated_parameters();
    }
    for (auto& p : set_.params) p.param.mutable_grad() = at::Tensor();  // free the gradients between steps
    return out;
  }

  std::unordered_map<const c10::TensorImpl*, int> owner_index_;
  // The blocks' parameters and their gradient flags as launched into the sums (this rank's share when shared out).
  std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> flagged_;
};

class FusedUpdate final : public StepUpdate {
 public:
  using StepUpdate::StepUpdate;
  StepOutcome forward_backward_update(Qwen3Model& model, const std::vector<Batch>& batches, int64_t loss_tokens,
                                      double lr, const PhaseMark& mark) override {
    if (batches.size() != 1) throw Error("the in-backward update takes one batch a step (no gradient accumulation)");
    const Batch& batch = batches.front();
    const double share = shares(batches, loss_tokens).front();
    // The sink must be in place before forward, which decides how each block's backward will run.
    FusedUpdater updater(opt_, o_.grad_clip, set_.trainable_parameters, lr);
    if (o_.overlap_update) updater.overlap_on_own_stream(device_);
    SinkGuard guard{runner_};  // cleared at the end of the step, whichever way it ends
    // Data parallel: each block's gradients are summed over the ranks before the block is applied, so every
    // replica applies the same update (clipping included: the group norms are then the global ones). The sum
    // of a block is launched when its gradients arrive and the block is applied when the next one's arrive, so
    // the reduction runs during the next block's backward (two blocks' gradients alive instead of one).
    struct InFlight {
      std::vector<std::pair<at::Tensor, at::Tensor>> grads;
      at::Tensor flags;  // how many ranks had each gradient (summed with them)
      std::unique_ptr<DataParallel::Pending> sum;
    };
    std::optional<InFlight> in_flight;
    const auto finish = [&](InFlight& f) {
      f.sum->wait();
      updater.apply(f.grads, f.flags);
      send_updated_parameters(f.grads);
    };
    had_gradient_.clear();
    runner_.set_gradient_sink([&](int64_t, const std::vector<std::pair<at::Tensor, at::Tensor>>& grads) {
      if (dp_.world_size() == 1) return updater.apply(grads);
      std::vector<at::Tensor> params;
      for (const auto& [param, grad] : grads) {
        note_gradient(param, grad);
        params.push_back(param);
      }
      InFlight next{launched(grads), gradient_flags(params), nullptr};
      std::vector<at::Tensor> tensors;
      for (const auto& pg : next.grads) tensors.push_back(pg.second);
      tensors.push_back(next.flags);
      next.sum = dp_.all_reduce_sum_async(std::move(tensors), "block gradients");
      if (in_flight) finish(*in_flight);
      in_flight = std::move(next);
    });
    ObserverGuard observer{model};
    router_aux_ = at::Tensor();
    router_aux_shares_ = 0;
    begin_balance(model, batch, share);
    at::Tensor loss = compute_loss(model, batch, o_.loss);
    if (share != 1.0) loss = loss * share;
    mark("forward_done");
    StepOutcome out;
    out.loss = dp_.all_reduce_sum(loss.item<double>(), "loss");  // NaN anywhere is NaN everywhere: all skip
    out.norm = std::numeric_limits<double>::quiet_NaN();
    out.bad = !std::isfinite(out.loss);
    if (out.bad) {  // a non-finite loss skips the step before anything is applied
      loss = at::Tensor();
      mark("backward_done");
      return out;
    }
    opt_.begin_step();
    {
      // --overlap-update-sms: backward's products leave SMs to the updates (forward's keep every SM).
      const ProductSmCarveout carveout(o_.overlap_update ? o_.overlap_update_sms : 0);
      loss.backward();
    }
    end_balance(model, share);
    loss = at::Tensor();
    if (in_flight) finish(*in_flight);  // the last block's sum
    in_flight.reset();
    mark("backward_done");
    std::vector<std::pair<at::Tensor, at::Tensor>> outside;  // the tensors outside the blocks (embedding, norm, head)
    for (auto& p : set_.params)
      if (p.param.grad().defined()) outside.emplace_back(p.param, p.param.grad());
    outside = reduced(outside);
    for (const auto& pg : outside) updater.apply({pg});
    send_updated_parameters(outside);
    for (auto& p : set_.params) p.param.mutable_grad() = at::Tensor();
    updater.join();  // --overlap-update: what follows reads the norm, and the next step the parameters
    // The step's one read after backward: the squared norm and the codec's non-finite flag together.
    std::vector<at::Tensor> results;
    if (updater.square_sum().defined()) results.push_back(updater.square_sum().reshape({1}));
    const at::Tensor flag = nvfp4::take_nonfinite_flag_async(device_);
    if (flag.defined()) results.push_back(flag.to(at::kDouble).reshape({1}).to(results.empty() ? flag.device() : results.front().device()));
    append_router_aux(results);
    const at::Tensor host = results.empty() ? at::Tensor() : at::cat(results).to(at::kCPU);
    if (host.defined()) read_router_aux(host, out);
    const bool have_norm = updater.square_sum().defined();
    out.norm = have_norm ? std::sqrt(host[0].item<double>()) : 0.0;
    out.bad = !std::isfinite(out.norm) || (flag.defined() && host[have_norm ? 1 : 0].item<double>() != 0);
    return out;
  }

 private:
  // A block's gradients ready to be summed: an undefined one (a parameter autograd did not reach) as zeros.
  static std::vector<std::pair<at::Tensor, at::Tensor>> launched(std::vector<std::pair<at::Tensor, at::Tensor>> grads) {
    for (auto& [param, grad] : grads)
      if (!grad.defined()) grad = at::zeros_like(param);
    return grads;
  }

  // The gradients summed over the ranks (a gradient autograd left undefined counts as zeros there).
  std::vector<std::pair<at::Tensor, at::Tensor>> reduced(std::vector<std::pair<at::Tensor, at::Tensor>> grads) {
    if (dp_.world_size() == 1) return grads;
    torch::NoGradGuard no_grad;
    grads = launched(std::move(grads));
    std::vector<at::Tensor> sums;
    for (const auto& pg : grads) sums.push_back(pg.second);
    dp_.all_reduce_sum(sums, "gradients outside the blocks");
    return grads;
  }
};

}  // namespace qwen3::train_detail
