// SVGD as particle programs: the leader (the first particle) drives each step with
// "svgd_grad" messages; see svgd.h.
#include <push/bayes/svgd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include "core/seed.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;

torch::Tensor svgd_direction(const torch::Tensor& theta, const torch::Tensor& grad_log_p,
                             std::optional<double> bandwidth, bool repulsive, BandwidthRule rule) {
  const char* origin = "push::bayes::svgd_direction";
  PUSH_CHECK(theta.dim() == 2 && theta.sizes() == grad_log_p.sizes(), origin,
             "expected theta and grad_log_p of one shape [n, D], got ", theta.sizes(), " and ", grad_log_p.sizes());
  const int64_t n = theta.size(0);
  // Centred first, the diagonal exactly 0: the kernel and the repulsion see only
  // differences between particles, which |θ_i|² + |θ_j|² - 2 θ_i·θ_j and θ_i Σk - Σ k θ_j
  // lose to rounding when many parameters sit close together far from the origin (a
  // trained network, a small bandwidth). Centred, the matrix product keeps them (as exact
  // as direct differences here, and 3x faster).
  auto centred = theta - theta.mean(0, /*keepdim=*/true);
  auto sq_norms = centred.pow(2).sum(1, /*keepdim=*/true);
  auto sq_dist = torch::clamp_min(sq_norms + sq_norms.t() - 2 * centred.mm(centred.t()), 0);
  sq_dist.fill_diagonal_(0);
  double h = 1.0;
  if (bandwidth) {
    PUSH_CHECK(*bandwidth > 0, origin, "bandwidth must be positive, got ", *bandwidth);
    h = *bandwidth;
  } else if (n > 1) {
    auto upper = torch::triu_indices(n, n, 1, torch::TensorOptions(torch::kLong).device(theta.device()));
    auto pairs = sq_dist.index({upper[0], upper[1]});
    // med² / log(n + 1) makes k ≈ 1/(n + 1) between typical particles: each is pushed by
    // few neighbours, and on low-dimensional posteriors the spread comes out too small.
    const double med = pairs.median().item<double>();
    const double scale = rule == BandwidthRule::median ? 1.0 : 1.0 / std::log(static_cast<double>(n) + 1);
    h = med > 0 ? med * scale : 1.0;
  }
  auto k = torch::exp(-sq_dist / h);
  auto phi = k.mm(grad_log_p);
  if (repulsive) {
    // Σ_j ∇_{θ_j} k(θ_j, θ_i) = (2/h) Σ_j (θ_i - θ_j) k_ij: away from the neighbours.
    phi = phi + (2.0 / h) * (centred * k.sum(1, /*keepdim=*/true) - k.mm(centred));
  }
  return phi / static_cast<double>(n);
}

namespace {

/// θ += step along φ through the particle's optimizer (gradient -φ).
void apply_direction(Particle& p, const torch::Tensor& phi) {
  int64_t offset = 0;
  for (auto& param : p.module().parameters()) {
    param.mutable_grad() = -phi.narrow(0, offset, param.numel()).view_as(param).to(param.device(), param.dtype());
    offset += param.numel();
  }
  p.optimizer().step();
}

/// The same for a fused group: phi [g, D].
void apply_direction(FusedStack& stack, const torch::Tensor& phi) {
  int64_t offset = 0;
  for (const auto& param : stack.parameters()) {
    const int64_t numel = param[0].numel();
    param.mutable_grad() = -phi.narrow(1, offset, numel).reshape(param.sizes()).to(param.device(), param.dtype());
    offset += numel;
  }
  stack.step();
}

/// A batch for every member of a group: [g, B, ...] without copying.
torch::Tensor for_each(const torch::Tensor& t, int64_t g) {
  std::vector<int64_t> sizes{g};
  for (int64_t d : t.sizes()) sizes.push_back(d);
  return t.unsqueeze(0).expand(sizes);
}

}  // namespace

// The handlers use stacks_: they stop before it goes.
SVGD::~SVGD() { close_distribution(); }

SVGD::SVGD(ModuleFactory model, InferOptions options, SVGDOptions svgd)
    : Infer(std::move(model), std::move(options)), svgd_(svgd) {
  if (svgd_.bandwidth()) {
    PUSH_CHECK(*svgd_.bandwidth() > 0, "push::bayes::SVGD", "bandwidth must be positive, got ", *svgd_.bandwidth());
  }
  if (svgd_.likelihood_weight()) {
    const double w = *svgd_.likelihood_weight();
    PUSH_CHECK(w > 0 && std::isfinite(w), "push::bayes::SVGD", "likelihood_weight must be positive and finite, got ",
               w);
  }
}

double SVGD::likelihood_weight() {
  return svgd_.likelihood_weight().value_or(static_cast<double>(training().dataset_size()));
}

ParticleOptions SVGD::particle_options() {
  return ParticleOptions()
      .on("svgd_grad",
          [this](Particle& p, const Args& a) {
            return group_grad(p, a[0].toIntVector(), a[1].toTensor(), a[2].toTensor(), a[3].toTensor(), a[4].toInt());
          })
      .on("svgd_apply",
          [this](Particle& p, const Args& a) {
            group_apply(p, a[0].toIntVector(), a[1].toTensor(), a[2].toInt());
            return c10::IValue();
          })
      .on("svgd_epoch", [this](Particle& p, const Args& a) {
        std::vector<std::vector<Pid>> groups;
        for (const auto& g : a[3].toListRef()) groups.push_back(g.toIntVector());
        return drive_epoch(p, a[0].toTensor(), a[1].toTensor(), a[2].toInt(), groups);
      });
}

c10::IValue SVGD::group_grad(Particle& p, const std::vector<Pid>& members, const torch::Tensor& phi,
                             const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  if (!fused()) {
    // A group of one unfused particle: p.
    if (phi.numel() == 0) training().schedule_lr(p, epoch);  // the epoch's first batch: its steps follow
    if (phi.numel() > 0) apply_direction(p, phi[0]);
    auto& module = p.module();
    p.optimizer().zero_grad();
    auto nll = objective().mean_nll(p.any_module().forward(x.to(p.device())), y.to(p.device()));
    auto u = nll * likelihood_weight() + objective().neg_log_prior(module);
    const double loss = nll.item<double>();
    training().check_finite(p, epoch, loss);
    u.backward();
    torch::NoGradGuard no_grad;  // copies of the values, not a graph
    std::vector<torch::Tensor> grads;
    for (const auto& param : module.parameters()) grads.push_back(param.grad());
    return c10::ivalue::Tuple::create({torch::nn::utils::parameters_to_vector(module.parameters()).unsqueeze(0),
                                       -torch::nn::utils::parameters_to_vector(grads).unsqueeze(0),
                                       c10::IValue(std::vector<double>{loss})});
  }
  c10::IValue out;
  p.borrow(members, [&](const std::vector<Particle*>& ps) {
    std::unique_lock lock(stacks_mutex_);
    auto& stack = stacks_[p.pid()];
    lock.unlock();
    if (phi.numel() == 0) {
      for (Particle* m : ps) training().schedule_lr(*m, epoch);
      stack = training().make_stack(ps);  // the epoch's first batch
    } else {
      PUSH_CHECK(stack != nullptr, "push::bayes::SVGD", "group of particle ", p.pid(), " was not stacked");
      apply_direction(*stack, phi);
    }
    const int64_t g = stack->size();
    stack->zero_grad();
    auto nll = objective().mean_nll(stack->forward(for_each(x.to(p.device()), g)), for_each(y.to(p.device()), g));
    auto u = nll * likelihood_weight();
    if (auto noise = objective().noise_prior(*stack); noise.defined()) u = u + noise;
    u = u.sum();
    auto losses = nll.detach().to(torch::kCPU, torch::kFloat64);
    std::vector<double> each(losses.data_ptr<double>(), losses.data_ptr<double>() + g);
    for (int64_t i = 0; i < g; ++i) training().check_finite(*ps[i], epoch, each[i]);
    u.backward();
    objective().add_weight_prior_gradient(*stack, 1.0);
    std::vector<torch::Tensor> grads;
    for (const auto& param : stack->parameters()) grads.push_back(-param.grad().reshape({g, -1}));
    out = c10::ivalue::Tuple::create({stack->flat_parameters(), torch::cat(grads, 1), c10::IValue(each)});
  });
  return out;
}

void SVGD::group_apply(Particle& p, const std::vector<Pid>& members, const torch::Tensor& phi, int64_t epoch) {
  if (!fused()) {
    apply_direction(p, phi[0]);
    training().check_finite(p, epoch);
    return;
  }
  std::unique_ptr<FusedStack> stack;
  {
    std::lock_guard lock(stacks_mutex_);
    stack = std::move(stacks_[p.pid()]);
    stacks_.erase(p.pid());
  }
  PUSH_CHECK(stack != nullptr, "push::bayes::SVGD", "group of particle ", p.pid(), " was not stacked");
  p.borrow(members, [&](const std::vector<Particle*>& ps) {
    apply_direction(*stack, phi);
    training().check_finite(*stack, ps, epoch);
    stack->write_back();
  });
}

c10::IValue SVGD::drive_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                              const std::vector<std::vector<Pid>>& groups) {
  const int64_t n = x.size(0), bs = options().batch_size();
  // Every particle sees the same minibatches: the leader's order, as unfused.
  auto order = training().epoch_order(static_cast<Pid>(seed_purpose::kLeader), epoch, n).to(x.device());
  std::vector<torch::Tensor> phi(groups.size(), torch::zeros({0}));
  std::map<Pid, double> loss;
  // Rows come in group order; to_id_order[r] is the row of the r-th smallest id.
  std::vector<Pid> rows;
  for (const auto& g : groups) rows.insert(rows.end(), g.begin(), g.end());
  std::vector<int64_t> sorted(rows.size());
  std::iota(sorted.begin(), sorted.end(), 0);
  std::sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) { return rows[a] < rows[b]; });
  const auto to_id_order = torch::tensor(sorted, torch::kLong);
  const auto from_id_order = torch::argsort(to_id_order);
  int64_t batches = 0;
  for (int64_t b = 0; b < n; b += bs, ++batches) {
    auto idx = order.narrow(0, b, std::min(bs, n - b));
    auto xb = x.index_select(0, idx), yb = y.index_select(0, idx);
    std::vector<PFuture> replies(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].front() != p.pid()) {
        replies[g] = p.send(groups[g].front(), "svgd_grad", groups[g], phi[g], xb, yb, epoch);
      }
    }
    std::vector<torch::Tensor> thetas, grads;
    std::exception_ptr error;  // rethrown once every group has answered: nothing left running
    std::vector<c10::IValue> answers(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      try {
        answers[g] = groups[g].front() == p.pid() ? group_grad(p, groups[g], phi[g], xb, yb, epoch) : replies[g].wait();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (size_t g = 0; g < groups.size(); ++g) {
      auto reply = answers[g].toTuple();
      thetas.push_back(reply->elements()[0].toTensor().to(p.device()));
      grads.push_back(reply->elements()[1].toTensor().to(p.device()));
      const auto each = reply->elements()[2].toDoubleVector();
      for (size_t i = 0; i < groups[g].size(); ++i) loss[groups[g][i]] += each.at(i);
    }
    // In id order, as unfused: the kernel's sums then add in the same order whatever the
    // groups (lanes, ranks, cache size) are.
    auto by_id = torch::cat(thetas).index_select(0, to_id_order.to(p.device()));
    auto phi_by_id = svgd_direction(by_id, torch::cat(grads).index_select(0, to_id_order.to(p.device())),
                                    svgd_.bandwidth(), svgd_.repulsive(), svgd_.bandwidth_rule());
    auto all_phi = phi_by_id.index_select(0, from_id_order.to(p.device()));
    int64_t row = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto size = static_cast<int64_t>(groups[g].size());
      phi[g] = all_phi.narrow(0, row, size);
      row += size;
    }
  }
  std::vector<PFuture> applied;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].front() == p.pid()) {
      group_apply(p, groups[g], phi[g], epoch);
    } else {
      applied.push_back(p.send(groups[g].front(), "svgd_apply", groups[g], phi[g], epoch));
    }
  }
  p.wait(applied);
  std::vector<double> out;  // in id order
  for (auto& [pid, l] : loss) out.push_back(l / static_cast<double>(batches));
  return out;
}

std::map<Pid, double> SVGD::run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  auto& d = distribution();
  // The leader drives every particle; the rank it lives on launches it.
  const auto ids = d.particle_ids();
  // Another rank's handlers may already run this epoch while this rank's fit() gathers the
  // last one's losses: only the leader's rank knows that none runs now, and drops what a
  // failed epoch left. Elsewhere a group's first batch replaces its stale stack.
  if (d.rank_of(ids.front()) != d.rank()) return {};
  {
    std::lock_guard lock(stacks_mutex_);
    stacks_.clear();
  }
  // Fused groups, or every particle a group of its own.
  c10::impl::GenericList groups(c10::ListType::ofInts());
  if (fused()) {
    for (const auto& g : training().fused_groups(/*every_rank=*/true)) groups.push_back(c10::IValue(g));
  } else {
    for (Pid pid : ids) groups.push_back(c10::IValue(std::vector<int64_t>{pid}));
  }
  auto losses = d.p_launch(ids.front(), "svgd_epoch", x, y, epoch, groups).wait().toDoubleVector();
  double mean = 0;
  for (double l : losses) mean += l / static_cast<double>(losses.size());
  training().report(epoch + 1, training().fit_last_epoch(), static_cast<int64_t>(losses.size()), mean);
  std::map<Pid, double> out;
  for (size_t i = 0; i < ids.size(); ++i) out[ids[i]] = losses.at(i);
  return out;
}

}  // namespace push::bayes
