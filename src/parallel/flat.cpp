#include "flat.h"

#include <torch/torch.h>

namespace push::parallel::detail {

dist::CollectiveGroup group_of_everyone(const dist::World& world) {
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  return world.new_group(all);
}

void wait_quietly(const dist::Work& work) {
  try {
    work.wait();
  } catch (const std::exception&) {
  }
}

torch::Tensor share_of(const torch::Tensor& rows, int rank, int size) {
  const int64_t m = rows.size(0), per = (m + size - 1) / size;
  auto padded = rows.index_select(0, torch::arange(per * size, torch::kLong).remainder(m));
  return padded.index_select(0, torch::arange(rank, per * size, size, torch::kLong));
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

void average_gradients(const std::vector<torch::Tensor>& params, torch::Tensor& scratch,
                       const dist::CollectiveGroup& group) {
  if (params.empty()) return;
  torch::NoGradGuard no_grad;
  const int64_t n = total_numel(params);
  if (!scratch.defined() || scratch.numel() != n) {
    scratch = torch::empty({n}, params.front().options().requires_grad(false));
  }
  int64_t offset = 0;
  for (const auto& p : params) {
    auto slice = scratch.narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      slice.copy_(p.grad().reshape(-1));
    } else {
      slice.zero_();
    }
    offset += p.numel();
  }
  group.all_reduce(scratch, dist::ReduceOp::average);
  offset = 0;
  for (const auto& p : params) {
    auto avg = scratch.narrow(0, offset, p.numel()).view(p.sizes());
    auto& grad = const_cast<torch::Tensor&>(p).mutable_grad();
    if (grad.defined()) {
      grad.copy_(avg);
    } else {
      grad = avg.clone();
    }
    offset += p.numel();
  }
}

}  // namespace push::parallel::detail
