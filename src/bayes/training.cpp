// The training loop's services to algorithms (push/bayes/algorithm.h, Training) and the
// helpers that predict with a particle's parameters or with samples in their place.
#include <push/bayes/algorithm.h>
#include <push/bayes/fused.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "core/flat.h"
#include "core/seed.h"
#include "training_state.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;

int64_t Training::dataset_size() const { return state_.dataset_size; }

int64_t Training::fit_last_epoch() const { return state_.fit_last_epoch; }

std::map<Pid, c10::IValue> Training::exchange(std::map<Pid, c10::IValue> mine, const std::exception_ptr& error,
                                              const char* origin) const {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& [pid, v] : mine) list.push_back(c10::ivalue::Tuple::create({pid, v}));
  std::map<Pid, c10::IValue> out;
  for (const auto& rank : state_.dist->all_gather_or_throw(list, error, origin)) {
    for (const auto& item : rank.toListRef()) {
      const auto& t = item.toTupleRef().elements();
      out[t[0].toInt()] = t[1];
    }
  }
  return out;
}

void Training::report(int64_t epoch, int64_t last_epoch, int64_t done, double running_loss) const {
  if (!state_.options.on_progress()) return;
  Progress p;
  p.epoch = epoch;
  p.last_epoch = last_epoch;
  p.particles_done = done;
  p.particles = state_.options.particles();
  p.loss = running_loss;
  state_.options.on_progress()(p);
}

double Training::train_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                             const StepHooks& hooks) const {
  schedule_lr(p, epoch);
  return detail::UnfusedEpochs(state_).train(p, x, y, epoch, hooks);
}

void Training::schedule_lr(Particle& p, int64_t epoch) const {
  const int64_t t = state_.options.cosine_epochs();
  if (t <= 0) return;
  // A function of the epoch, not the runtime's per-particle LRScheduler (stepped, its steps
  // replayed on load): the same rate on every rank and lane whatever ran where, nothing to
  // save, and LibTorch has no cosine scheduler.
  const double pi = std::numbers::pi;
  set_lr_fraction(p, epoch < t ? 0.5 * (1 + std::cos(pi * static_cast<double>(epoch) / static_cast<double>(t))) : 0.0);
}

void Training::set_lr_fraction(Particle& p, double fraction) const {
  auto& groups = p.optimizer().param_groups();
  PUSH_CHECK(!state_.base_lrs.empty() && groups.size() == state_.base_lrs.size(), "push::bayes::Infer", "particle ",
             p.pid(), "'s optimizer has ", groups.size(), " param groups, its factory's scratch copy ",
             state_.base_lrs.size(), ": a learning-rate schedule needs the same groups for every particle");
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(state_.base_lrs[i] * fraction);
}

torch::Tensor forward_chunked(Particle& p, const torch::Tensor& x) {
  constexpr int64_t chunk = 8192;
  std::vector<torch::Tensor> outs;
  for (int64_t b = 0; b < x.size(0); b += chunk) {
    auto part = x.narrow(0, b, std::min(chunk, x.size(0) - b)).to(p.device());
    outs.push_back(p.any_module().forward(part).to(torch::kCPU));
  }
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 0);
}

torch::Tensor forward_each(Particle& p, const torch::Tensor& thetas, const torch::Tensor& x) {
  const auto saved = torch::nn::utils::parameters_to_vector(p.module().parameters()).detach().clone();
  struct Restore {
    Particle& p;
    const torch::Tensor& saved;
    ~Restore() { push::detail::unpack(saved, p.module().parameters()); }
  } restore{p, saved};
  std::vector<torch::Tensor> outs;
  for (int64_t s = 0; s < thetas.size(0); ++s) {
    push::detail::unpack(thetas[s], p.module().parameters());  // copy_ casts and crosses devices
    outs.push_back(forward_chunked(p, x));
  }
  return torch::stack(outs);
}

void Training::check_finite(const Particle& p, int64_t epoch, double loss) const {
  PUSH_CHECK(std::isfinite(loss), "push::bayes::Infer::fit", state_.algorithm.name(),
             ": the training loss of particle ", p.pid(), " is non-finite (", loss, ") in epoch ", epoch + 1,
             ": training diverged; lower the learning rate or check the data for huge values");
}

void Training::check_finite(Particle& p, int64_t epoch) const {
  for (const auto& item : p.module().named_parameters()) {
    const bool finite = torch::isfinite(item.value()).all().item<bool>();
    PUSH_CHECK(finite, "push::bayes::Infer::fit", state_.algorithm.name(), ": parameter '", item.key(),
               "' of particle ", p.pid(), " is non-finite after epoch ", epoch + 1,
               ": training diverged; lower the learning rate or check the data for huge values");
  }
}

torch::Tensor Training::epoch_order(Pid particle, int64_t epoch, int64_t n) const {
  auto gen = generator(static_cast<uint64_t>(particle), static_cast<uint64_t>(epoch), seed_purpose::kShuffle);
  return torch::randperm(n, gen, torch::kLong);
}

at::Generator Training::generator(uint64_t a, uint64_t b, uint64_t c) const {
  return at::make_generator<at::CPUGeneratorImpl>(
      push::detail::mix_seed(state_.options.distribution().seed(), a, b, c));
}

void Training::check_finite(const FusedStack& stack, const std::vector<Particle*>& members, int64_t epoch) const {
  // One reduction over the whole buffer; the per-parameter search only when it fails.
  if (torch::isfinite(stack.flat_values()).all().item<bool>()) return;
  const auto& params = stack.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    auto finite = torch::isfinite(params[k].detach().reshape({stack.size(), -1})).all(1).to(torch::kCPU);
    const bool* ok = finite.data_ptr<bool>();
    for (size_t i = 0; i < members.size(); ++i) {
      PUSH_CHECK(ok[i], "push::bayes::Infer::fit", state_.algorithm.name(), ": parameter '", stack.parameter_names()[k],
                 "' of particle ", members[i]->pid(), " is non-finite after epoch ", epoch + 1,
                 ": training diverged; lower the learning rate or check the data for huge values");
    }
  }
}

std::vector<std::vector<Pid>> Training::fused_groups(bool every_rank) const {
  std::map<std::pair<int, int>, std::vector<Pid>> by_lane;
  for (Pid pid : every_rank ? state_.dist->particle_ids() : state_.dist->local_particle_ids()) {
    by_lane[{state_.dist->rank_of(pid), state_.dist->lane_of(pid)}].push_back(pid);
  }
  const size_t most = static_cast<size_t>(std::max(1, state_.options.distribution().cache_size()));
  std::vector<std::vector<Pid>> groups;
  for (const auto& [lane, pids] : by_lane) {
    for (size_t b = 0; b < pids.size(); b += most) {
      groups.emplace_back(pids.begin() + static_cast<std::ptrdiff_t>(b),
                          pids.begin() + static_cast<std::ptrdiff_t>(std::min(pids.size(), b + most)));
    }
  }
  return groups;
}

std::unique_ptr<FusedStack> Training::make_stack(const std::vector<Particle*>& members) const {
  std::vector<torch::nn::Module*> modules;
  std::vector<torch::optim::Optimizer*> optimizers;
  for (Particle* p : members) {
    modules.push_back(&p->module());
    optimizers.push_back(&p->optimizer());
  }
  return std::make_unique<FusedStack>(modules, optimizers, state_.optimizer);
}

}  // namespace push::bayes
