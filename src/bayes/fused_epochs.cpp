// The training loop in fused groups (push/bayes/fused.h): the same minibatches and
// objective as one particle at a time, one batched step for each group.
#include <push/bayes/fused.h>
#include <push/core/errors.h>

#include <torch/torch.h>

#include "epoch_engine.h"
#include "training_state.h"

namespace push::bayes::detail {

void FusedEpochs::add_handlers(ParticleOptions& options) {
  UnfusedEpochs::add_handlers(options);  // a group whose members cannot stack trains them one by one
  options.on("fused_epoch", [this](Particle& p, const Args& a) {
    return c10::IValue(group_epoch(p, a[3].toIntVector(), a[0].toTensor(), a[1].toTensor(), a[2].toInt()));
  });
}

std::map<Pid, double> FusedEpochs::run(Push& dist, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  return launch(dist, training_.fused_groups(), "fused_epoch", x, y, epoch, /*with_group=*/true);
}

std::vector<double> FusedEpochs::group_epoch(Particle& p, const std::vector<Pid>& members, const torch::Tensor& x,
                                             const torch::Tensor& y, int64_t epoch) {
  std::vector<double> losses;
  p.borrow(members, [&](const std::vector<Particle*>& ps) {
    for (Particle* m : ps) {
      training_.schedule_lr(*m, epoch);
      algorithm_.prepare_epoch(*m, epoch);
    }
    // The model fuses (checked on a scratch copy), but these members may not: their
    // optimizers or step counts differ (loaded from elsewhere), or a subclass's rows do
    // not cover the data. They train one by one then, with the same results.
    auto one_by_one = [&] {
      for (Particle* m : ps) losses.push_back(prepared_epoch(*m, x, y, epoch));
    };
    std::unique_ptr<FusedStack> stack;
    std::vector<torch::Tensor> rows;
    try {
      for (Particle* m : ps) {
        rows.push_back(algorithm_.epoch_rows(*m, x.size(0)));  // host indices, whatever device the hook used
        if (rows.back().defined()) rows.back() = rows.back().to(torch::kCPU);
        PUSH_CHECK(!rows.back().defined() || rows.back().size(0) == x.size(0), "push::bayes::Infer",
                   "epoch_rows of particle ", m->pid(), " gives ", rows.back().size(0), " rows of ", x.size(0));
      }
      stack = training_.make_stack(ps);
    } catch (const Error&) {
      one_by_one();
      return;
    }
    const std::optional<StepHooks> group_hooks = algorithm_.fused_epoch_hooks(*stack, ps, epoch);
    if (!group_hooks && !algorithm_.epoch_hooks(*ps.front(), epoch).empty()) {
      // The algorithm adds to a particle's steps and has nothing for a stack: the members
      // train one by one (the stack is a working copy; dropped, it leaves them as they were).
      stack.reset();
      one_by_one();
      return;
    }
    const StepHooks hooks = group_hooks.value_or(StepHooks{});
    losses = train_group(*stack, ps, rows, x, y, epoch, hooks);
    stack->write_back();
    if (hooks.finish) hooks.finish();
    for (Particle* m : ps) algorithm_.finish_epoch(*m, epoch);
  });
  return losses;
}

std::vector<double> FusedEpochs::train_group(FusedStack& stack, const std::vector<Particle*>& members,
                                             const std::vector<torch::Tensor>& rows, const torch::Tensor& x,
                                             const torch::Tensor& y, int64_t epoch, const StepHooks& hooks) {
  const Objective& u = state_.objective;
  const int64_t n = x.size(0), bs = state_.options.batch_size(), count = stack.size();
  const torch::Device device = members.front()->device();
  // Each member's rows in its own order: what train_epoch draws for it alone.
  std::vector<torch::Tensor> orders;
  for (size_t i = 0; i < members.size(); ++i) {
    auto order = training_.epoch_order(members[i]->pid(), epoch, n);
    orders.push_back(rows[i].defined() ? rows[i].index_select(0, order) : order);
  }
  // Drawn on the host; the rows are picked where the data is (a message brings it to the lane's device).
  const auto order = torch::stack(orders).to(x.device());  // [N, n]
  auto shape_of = [&](const torch::Tensor& t, int64_t len) {
    std::vector<int64_t> s{count, len};
    for (int64_t d = 1; d < t.dim(); ++d) s.push_back(t.size(d));
    return s;
  };
  std::vector<double> total(members.size(), 0.0);
  int64_t batches = 0;
  for (int64_t b = 0; b < n; b += bs, ++batches) {
    const int64_t len = std::min(bs, n - b);
    auto idx = order.narrow(1, b, len).reshape({-1});
    auto xb = x.index_select(0, idx).view(shape_of(x, len)).to(device);
    auto yb = y.index_select(0, idx).view(shape_of(y, len)).to(device);
    stack.zero_grad();
    auto nll = u.mean_nll(stack.forward(xb), yb);  // [N]
    auto loss = nll;
    if (auto noise = u.noise_prior(stack); noise.defined())
      loss = loss + noise / static_cast<double>(state_.dataset_size);
    loss.sum().backward();
    u.add_weight_prior_gradient(stack, static_cast<double>(state_.dataset_size));
    if (hooks.step) {
      hooks.step();
    } else {
      stack.step();
    }
    auto host = nll.detach().to(torch::kCPU, torch::kFloat64);
    const double* v = host.data_ptr<double>();
    for (size_t i = 0; i < members.size(); ++i) {
      training_.check_finite(*members[i], epoch, v[i]);
      total[i] += v[i];
    }
    if (hooks.after_step) hooks.after_step();
  }
  training_.check_finite(stack, members, epoch);
  for (double& t : total) t /= static_cast<double>(batches);
  return total;
}

}  // namespace push::bayes::detail
