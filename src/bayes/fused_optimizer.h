#pragma once
// The optimizer of a FusedStack: one optimizer of the members' kind over the one buffer
// that holds every stacked parameter, its state laid out like the buffer (stack k's rows,
// member by member, from offsets[k]); write_back() hands each member its part. LibTorch's
// optimizers update each element from its own state alone, so the one step is the
// members' steps.
#include <push/runtime/types.h>

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace push::bayes {

/// Throws push::Error naming the reason when `optimizer`'s kind cannot be fused (not one
/// of LibTorch's element-wise optimizers, or more than one parameter group).
void check_fusable(const torch::optim::Optimizer& optimizer);

namespace detail {
/// Copies row i of `stack` [N, ...] into parts[i] (each of the row's shape), for every i:
/// one memcpy each when all are contiguous CPU tensors of one dtype (a write-back moves a
/// few hundred small tensors: the dispatcher's per-call cost would dominate), else copy_.
void unstack_into(const torch::Tensor& stack, const std::vector<torch::Tensor>& parts);
/// The reverse: parts[i] into row i of `stack`.
void stack_into(const std::vector<torch::Tensor>& parts, const torch::Tensor& stack);
}  // namespace detail

class FusedOptimizer {
 public:
  /// member_params[i][k]: member i's parameter k, whose stack [N, ...] is stacks[k], a view
  /// of `flat` from offsets[k]. The optimizer steps `flat` (its gradient must be set).
  FusedOptimizer(std::vector<torch::optim::Optimizer*> members, std::vector<std::vector<torch::Tensor>> member_params,
                 std::vector<torch::Tensor> stacks, std::vector<int64_t> offsets, torch::Tensor flat,
                 const OptimizerFactory& make_optimizer);
  torch::optim::Optimizer& fused() { return *fused_; }
  void write_back();

 private:
  std::vector<torch::optim::Optimizer*> members_;
  std::vector<std::vector<torch::Tensor>> member_params_;
  std::vector<torch::Tensor> stacks_;
  std::vector<int64_t> offsets_;
  torch::Tensor flat_;
  std::unique_ptr<torch::optim::Optimizer> fused_;
};

}  // namespace push::bayes
