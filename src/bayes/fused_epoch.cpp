// Infer's epochs of minibatch training, one particle at a time or as fused groups
// (push/bayes/fused.h): the same minibatches, the same objective, one batched step.
#include <push/bayes/fused.h>
#include <push/bayes/infer.h>

#include <torch/torch.h>

#include <cmath>

#include "learned_noise.h"
#include "replica.h"
#include "core/seed.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;

bool Infer::fused() {
  ensure_created();
  return fused_;
}

std::vector<std::vector<Pid>> Infer::fused_groups(bool every_rank) {
  std::map<std::pair<int, int>, std::vector<Pid>> by_lane;
  for (Pid pid : every_rank ? dist_->particle_ids() : dist_->local_particle_ids()) {
    by_lane[{dist_->rank_of(pid), dist_->lane_of(pid)}].push_back(pid);
  }
  const size_t most = static_cast<size_t>(std::max(1, options_.cache_size()));
  std::vector<std::vector<Pid>> groups;
  for (const auto& [lane, pids] : by_lane) {
    for (size_t b = 0; b < pids.size(); b += most) {
      groups.emplace_back(pids.begin() + static_cast<std::ptrdiff_t>(b),
                          pids.begin() + static_cast<std::ptrdiff_t>(std::min(pids.size(), b + most)));
    }
  }
  return groups;
}

std::unique_ptr<FusedStack> Infer::make_stack(const std::vector<Particle*>& members) const {
  std::vector<torch::nn::Module*> modules;
  std::vector<torch::optim::Optimizer*> optimizers;
  for (Particle* p : members) {
    modules.push_back(&p->module());
    optimizers.push_back(&p->optimizer());
  }
  return std::make_unique<FusedStack>(modules, optimizers, optimizer_);
}

c10::IValue Infer::epoch_of(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  prepare_epoch(p, epoch);
  return epoch_body(p, x, y, epoch);
}

double Infer::epoch_body(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  auto rows = epoch_rows(p, x.size(0));
  auto* r = replica(p.pid());
  if (r) {  // this rank's share of the rows, drawn anew each epoch (the same draw on every rank)
    auto all = rows.defined() ? rows : torch::arange(x.size(0), torch::kLong);
    all = all.index_select(0, torch::randperm(all.size(0), generator(static_cast<uint64_t>(p.pid()),
                                                                     static_cast<uint64_t>(epoch), seed_purpose::kShard),
                                              torch::kLong));
    rows = r->shard(all);
    const int64_t batches = (rows.size(0) + options_.batch_size() - 1) / options_.batch_size();
    r->begin_epoch(p, fit_last_epoch_ - epoch, batches, fit_calls_);
  }
  std::function<void()> after_step, step;
  epoch_hooks(p, epoch, after_step, step);
  const double loss = rows.defined() ? train_epoch(p, x.index_select(0, rows), y.index_select(0, rows), epoch,
                                                   after_step, step)
                                     : train_epoch(p, x, y, epoch, after_step, step);
  if (r) {
    const int diverged = r->end_epoch(loss);
    PUSH_CHECK(diverged == 0, "push::bayes::Infer::fit", name(), ": the training loss of particle ", p.pid(),
               " is non-finite in epoch ", epoch + 1, " on ", diverged, " of ", r->ranks(),
               " ranks: training diverged; lower the learning rate or check the data for huge values");
    check_parameters_finite(p, epoch);
  }
  finish_epoch(p, epoch);
  return loss;
}

c10::IValue Infer::fused_epoch_of(Particle& p, const std::vector<Pid>& members, const torch::Tensor& x,
                                  const torch::Tensor& y, int64_t epoch) {
  std::vector<double> losses;
  p.borrow(members, [&](const std::vector<Particle*>& ps) {
    for (Particle* m : ps) prepare_epoch(*m, epoch);
    // The model fuses (checked on a scratch copy), but these members may not: their
    // optimizers or step counts differ (loaded from elsewhere), or a subclass's rows do
    // not cover the data. They train one by one then, with the same results.
    std::unique_ptr<FusedStack> stack;
    std::vector<torch::Tensor> rows;
    try {
      for (Particle* m : ps) {
        rows.push_back(epoch_rows(*m, x.size(0)));
        PUSH_CHECK(!rows.back().defined() || rows.back().size(0) == x.size(0), "push::bayes::Infer",
                   "epoch_rows of particle ", m->pid(), " gives ", rows.back().size(0), " rows of ", x.size(0));
      }
      stack = make_stack(ps);
    } catch (const Error&) {
      for (Particle* m : ps) losses.push_back(epoch_body(*m, x, y, epoch));
      return;
    }
    std::function<void()> after_step, step, finish;
    fused_epoch_hooks(*stack, ps, epoch, after_step, step, finish);
    losses = train_epoch_fused(*stack, ps, rows, x, y, epoch, after_step, step);
    stack->write_back();
    if (finish) finish();
    for (Particle* m : ps) finish_epoch(*m, epoch);
  });
  return losses;
}

std::vector<double> Infer::train_epoch_fused(FusedStack& stack, const std::vector<Particle*>& members,
                                             const std::vector<torch::Tensor>& rows, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                                             const std::function<void()>& after_step,
                                             const std::function<void()>& step) const {
  const int64_t n = x.size(0), bs = options_.batch_size(), count = stack.size();
  const torch::Device device = members.front()->device();
  // Each member's rows in its own order: what train_epoch draws for it alone.
  std::vector<torch::Tensor> orders;
  for (size_t i = 0; i < members.size(); ++i) {
    auto order = epoch_order(members[i]->pid(), epoch, n);
    orders.push_back(rows[i].defined() ? rows[i].index_select(0, order) : order);
  }
  const auto order = torch::stack(orders);  // [N, n]
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
    auto nll = mean_nll(stack.forward(xb), yb);  // [N]
    auto loss = nll;
    if (auto noise = noise_prior(stack); noise.defined()) loss = loss + noise / static_cast<double>(dataset_size_);
    loss.sum().backward();
    add_weight_prior_gradient(stack, static_cast<double>(dataset_size_));
    if (step) {
      step();
    } else {
      stack.step();
    }
    auto host = nll.detach().to(torch::kCPU, torch::kFloat64);
    const double* v = host.data_ptr<double>();
    for (size_t i = 0; i < members.size(); ++i) {
      check_finite(*members[i], epoch, v[i]);
      total[i] += v[i];
    }
    if (after_step) after_step();
  }
  check_parameters_finite(stack, members, epoch);
  for (double& t : total) t /= static_cast<double>(batches);
  return total;
}

void Infer::check_parameters_finite(const FusedStack& stack, const std::vector<Particle*>& members,
                                    int64_t epoch) const {
  // One reduction over the whole buffer; the per-parameter search only when it fails.
  if (torch::isfinite(stack.flat_values()).all().item<bool>()) return;
  const auto& params = stack.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto finite = torch::isfinite(params[k].detach().reshape({stack.size(), -1})).all(1).to(torch::kCPU);
    const bool* ok = finite.data_ptr<bool>();
    for (size_t i = 0; i < members.size(); ++i) {
      PUSH_CHECK(ok[i], "push::bayes::Infer::fit", name(), ": parameter '", stack.parameter_names()[k],
                 "' of particle ", members[i]->pid(), " is non-finite after epoch ", epoch + 1,
                 ": training diverged; lower the learning rate or check the data for huge values");
    }
  }
}

torch::Tensor Infer::noise_prior(const FusedStack& stack) const {
  if (options_.likelihood() != Likelihood::learned_noise) return {};
  const auto& params = stack.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    if (stack.parameter_names()[k] != detail::kLogNoisePrecision) continue;
    auto flat = params[k].reshape({stack.size(), -1});
    return (options_.noise_prior_rate() * torch::exp(flat) - options_.noise_prior_shape() * flat).sum(1);
  }
  return {};
}

void Infer::add_weight_prior_gradient(FusedStack& stack, double divisor) const {
  // Unfused, autograd differentiates (Σ_k sum(p_k²) / (2 v)) / divisor: the division nodes
  // hand c = (1 / divisor) / (2 v), in float32, to every pow node, which returns c · (2 p).
  // Here the same products, over the stacks' one buffer at once (but the learned noise).
  torch::NoGradGuard no_grad;
  const double v = options_.prior_std() * options_.prior_std();
  const auto& values = stack.flat_values();
  const auto& grads = stack.flat_gradients();
  auto c = torch::ones({}, values.options()) / divisor / (2 * v);
  auto add = [&](int64_t from, int64_t to) {
    if (to > from) grads.narrow(0, from, to - from).add_((values.narrow(0, from, to - from) * 2.0) * c);
  };
  int64_t from = 0;
  const auto& names = stack.parameter_names();
  for (size_t k = 0; k < names.size(); ++k) {
    if (options_.likelihood() == Likelihood::learned_noise && names[k] == detail::kLogNoisePrecision) {
      const auto [offset, length] = stack.flat_range(k);
      add(from, offset);
      from = offset + length;
    }
  }
  add(from, values.numel());
}

}  // namespace push::bayes
