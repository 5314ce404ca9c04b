// Synchronized batch norm: per-channel sums of x and x² (and the count) summed over the
// replicas and ranks by a differentiable sum whose backward sums the gradients alike.
#include <push/data_parallel/sync_batch_norm.h>

#include <torch/autograd.h>
#include <torch/torch.h>

#include "core/event_loop.h"

namespace push::data_parallel {
namespace {

constexpr const char* kSyncBatchNorm = "push::data_parallel::SyncBatchNorm";

// Keeps the sync alive in the autograd graph (an IValue capsule), for a backward that runs
// after its module is gone.
struct SyncHolder : torch::CustomClassHolder {
  explicit SyncHolder(std::shared_ptr<BatchNormSync> s) : sync(std::move(s)) {}
  std::shared_ptr<BatchNormSync> sync;
};

// sum(t) over replicas and ranks; backward: the same sum of the gradients.
struct AllSum : torch::autograd::Function<AllSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& t,
                               const std::shared_ptr<BatchNormSync>& sync, int64_t replica) {
    ctx->saved_data["sync"] = c10::IValue::make_capsule(c10::make_intrusive<SyncHolder>(sync));
    ctx->saved_data["replica"] = replica;
    return sync->sum(static_cast<int>(replica), t);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<SyncHolder>(ctx->saved_data["sync"].toCapsule());
    const auto replica = static_cast<int>(ctx->saved_data["replica"].toInt());
    return {holder->sync->sum(replica, grads.at(0).contiguous()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

BatchNormSync::BatchNormSync(int replicas, std::optional<dist::CollectiveGroup> group,
                             std::chrono::milliseconds timeout)
    : group_(std::move(group)),
      master_(
          replicas,
          [this](std::vector<torch::Tensor> parts) {
            auto total = parts.front().clone();
            for (size_t i = 1; i < parts.size(); ++i) total.add_(parts[i]);
            if (group_) group_->all_reduce(total);
            // A copy each: the replicas' autograd graphs must not share an output.
            std::vector<torch::Tensor> out;
            for (size_t i = 0; i < parts.size(); ++i) out.push_back(i == 0 ? total : total.clone());
            return out;
          },
          timeout) {}

torch::Tensor BatchNormSync::sum(int replica, const torch::Tensor& t) {
  torch::NoGradGuard no_grad;  // the autograd function records the sum; its parts are plain
  return master_.exchange(replica, t.detach());
}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, std::shared_ptr<BatchNormSync> sync, int replica)
    : options(options_), sync_(std::move(sync)), replica_(replica) {
  PUSH_CHECK(sync_ != nullptr, kSyncBatchNorm, "no BatchNormSync given");
  PUSH_CHECK(replica_ >= 0 && replica_ < sync_->replicas(), kSyncBatchNorm, "replica ", replica_, " of ",
             sync_->replicas());
  PUSH_CHECK(options.num_features() > 0, kSyncBatchNorm, "num_features must be positive, got ", options.num_features());
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  PUSH_CHECK(input.dim() >= 2 && input.dim() <= 4 && input.size(1) == options.num_features(), kSyncBatchNorm,
             "expected input [B, ", options.num_features(), "(, L)(, H, W)], got ", input.sizes());
  const int64_t c = options.num_features();
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = c;
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  torch::Tensor mean, var;
  if (is_training() || !options.track_running_stats()) {
    auto x = input.to(torch::kFloat64);
    const double count = static_cast<double>(input.numel() / c);
    auto local = torch::cat({x.sum(dims), (x * x).sum(dims), torch::full({1}, count, x.options())});
    PUSH_CHECK(push::detail::EventLoop::current() == nullptr, kSyncBatchNorm, "replica ", replica_,
               " runs on an event loop (a particle or RPC handler): its backward would wait",
               " inside the autograd engine, which fibers do not keep apart; use one thread per replica");
    auto total = AllSum::apply(local, sync_, static_cast<int64_t>(replica_));
    auto n = total[2 * c].detach();
    mean = total.narrow(0, 0, c) / n;
    var = (total.narrow(0, c, c) / n - mean * mean).clamp_min(0);  // rounding may go below 0
    const double all = n.item<double>();
    PUSH_CHECK(all > 1, kSyncBatchNorm, "batch norm needs more than one value per channel over all replicas, got ",
               all);
    if (is_training() && options.track_running_stats()) {
      torch::NoGradGuard no_grad;
      const double m = options.momentum();
      running_mean.mul_(1 - m).add_(mean.detach().to(running_mean.dtype()), m);
      running_var.mul_(1 - m).add_((var.detach() * (all / (all - 1))).to(running_var.dtype()), m);
      num_batches_tracked.add_(1);
    }
    mean = mean.to(input.dtype());
    var = var.to(input.dtype());
  } else {
    mean = running_mean;
    var = running_var;
  }
  auto y = (input - mean.view(shape)) * torch::rsqrt(var.view(shape) + options.eps());
  if (options.affine()) y = y * weight.view(shape) + bias.view(shape);
  return y;
}

}  // namespace push::data_parallel
