#include <push/data_parallel/replicas.h>

#include <torch/torch.h>

#include "core/flat.h"
#include "data_parallel/quiet_wait.h"

namespace push::data_parallel {

dist::CollectiveGroup group_of_everyone(const dist::World& world) {
  std::vector<int> all(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) all[static_cast<size_t>(r)] = r;
  return world.new_group(all);
}

void broadcast_from_first(const std::vector<torch::Tensor>& tensors, const dist::CollectiveGroup& group) {
  torch::NoGradGuard no_grad;
  const int root = group.ranks().front();
  for (const auto& t : tensors) {
    auto copy = t.detach().clone();
    group.broadcast(copy, root);
    t.detach().copy_(copy);
  }
}

torch::Tensor share_of(const torch::Tensor& rows, int rank, int size) {
  const int64_t m = rows.size(0), per = (m + size - 1) / size;
  auto padded = rows.index_select(0, torch::arange(per * size, torch::kLong).remainder(m));
  return padded.index_select(0, torch::arange(rank, per * size, size, torch::kLong));
}

void GradientAverager::average(const std::vector<torch::Tensor>& params) {
  if (params.empty()) return;
  torch::NoGradGuard no_grad;
  const int64_t n = push::detail::total_numel(params);
  if (!flat_.defined() || flat_.numel() != n) flat_ = torch::empty({n}, params.front().options().requires_grad(false));
  int64_t offset = 0;
  for (const auto& p : params) {
    auto slice = flat_.narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      slice.copy_(p.grad().reshape(-1));
    } else {
      slice.zero_();
    }
    offset += p.numel();
  }
  group_.all_reduce(flat_, dist::ReduceOp::average);
  offset = 0;
  for (const auto& p : params) {
    auto avg = flat_.narrow(0, offset, p.numel()).view(p.sizes());
    auto& grad = const_cast<torch::Tensor&>(p).mutable_grad();
    if (grad.defined()) {
      grad.copy_(avg);
    } else {
      grad = avg.clone();
    }
    offset += p.numel();
  }
}

ParameterAverager::~ParameterAverager() { drop(); }

void ParameterAverager::start(const std::vector<torch::Tensor>& params) {
  apply();  // a previous average not applied yet goes first, in order
  if (params.empty()) return;
  torch::NoGradGuard no_grad;
  const int64_t n = push::detail::total_numel(params);
  if (!flat_.defined() || flat_.numel() != n) flat_ = torch::empty({n}, params.front().options().requires_grad(false));
  push::detail::pack(params, flat_);
  params_ = params;
  work_ = group_.all_reduce_async(flat_, dist::ReduceOp::average);
  outstanding_ = true;
}

void ParameterAverager::apply() {
  if (!outstanding_) return;
  work_.wait();
  outstanding_ = false;
  push::detail::unpack(flat_, params_);
}

void ParameterAverager::drop() {
  if (!outstanding_) return;
  outstanding_ = false;
  detail::wait_quietly(work_);
}

}  // namespace push::data_parallel
