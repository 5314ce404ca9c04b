// MultiSWAG as particle programs: "epoch" trains and collects moments into the
// particle's own state; "predict" samples weights from them.
#include <push/bayes/fused.h>
#include <push/bayes/swag.h>

#include <torch/torch.h>

#include <cmath>
#include "core/flat.h"
#include "core/seed.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;
namespace {

// Moments live on the host in float64 (see collect). A checkpoint loads a particle's state
// onto its lane's device, so bring them back here: mixed with host θ they must be on the host.
SWAGMoments read_state(const State& s) {
  SWAGMoments m;
  auto it = s.find("swag_count");
  if (it == s.end()) return m;
  auto host = [&](const char* key) { return s.at(key).toTensor().to(torch::kCPU, torch::kFloat64); };
  m.count = it->second.toInt();
  m.mean = host("swag_mean");
  m.sq_mean = host("swag_sq_mean");
  m.deviations = host("swag_deviations");
  return m;
}

void write_state(State& s, const SWAGMoments& m) {
  s["swag_count"] = m.count;
  s["swag_mean"] = m.mean;
  s["swag_sq_mean"] = m.sq_mean;
  s["swag_deviations"] = m.deviations;
}

/// One step of SGD with momentum, as torch::optim::SGD takes it (buffer = momentum · buffer +
/// grad, θ -= lr · buffer; the first step's buffer is the gradient), over `params` with one
/// flat buffer row per member: `buffer` is [rows, D], rows = 1 for one particle, N for the
/// [N, ...] parameters of a fused stack.
void momentum_update(const std::vector<torch::Tensor>& params, const torch::Tensor& buffer, bool first, double lr,
                     double momentum) {
  int64_t offset = 0;
  for (const auto& param : params) {
    const int64_t numel = param.numel() / buffer.size(0);
    auto b = buffer.narrow(1, offset, numel).view(param.sizes());
    offset += numel;
    if (!param.grad().defined()) continue;
    if (first) {
      b.copy_(param.grad());
    } else {
      b.mul_(momentum).add_(param.grad());
    }
    param.add_(b, -lr);
  }
}

/// momentum_update for one particle, whatever optimizer pretrained it. The buffer is one
/// flat tensor in the particle's state, so it is saved with the particle.
void momentum_step(Particle& p, double lr, double momentum) {
  torch::NoGradGuard no_grad;
  auto params = p.module().parameters();
  auto& slot = p.state()["swag_momentum"];
  torch::Tensor buffer;
  if (slot.isTensor()) buffer = slot.toTensor();
  const bool first = !buffer.defined();
  if (first) {
    int64_t size = 0;
    for (const auto& param : params) size += param.numel();
    buffer = torch::zeros({size}, params.front().options());
  } else if (buffer.device() != params.front().device()) {
    buffer = buffer.to(params.front().device());  // a checkpoint loads state onto the lane's device
  }
  momentum_update(params, buffer.view({1, -1}), first, lr, momentum);
  slot = buffer;
}

}  // namespace

MultiSWAG::MultiSWAG(ModuleFactory model, InferOptions options, SWAGOptions swag)
    : Infer(std::move(model), std::move(options)), swag_(swag) {
  const char* origin = "push::bayes::MultiSWAG";
  PUSH_CHECK(swag_.rank() >= 1, origin, "rank must be >= 1, got ", swag_.rank());
  PUSH_CHECK(swag_.samples() >= 1, origin, "samples must be >= 1, got ", swag_.samples());
  PUSH_CHECK(swag_.pretrain_epochs() >= 0 && swag_.collect_every_steps() >= 0, origin,
             "pretrain_epochs and collect_every_steps must be >= 0");
  if (swag_.collect_momentum()) {
    PUSH_CHECK(*swag_.collect_momentum() >= 0 && *swag_.collect_momentum() < 1, origin,
               "collect_momentum must be in [0, 1), got ", *swag_.collect_momentum());
  }
}

void MultiSWAG::collect(SWAGMoments& m, const torch::Tensor& theta, int64_t rank) {
  // Moments live on the host in double precision: long averages lose nothing.
  auto t = theta.detach().to(torch::kCPU, torch::kFloat64).reshape(-1);
  const double n = static_cast<double>(m.count);
  if (m.count == 0) {
    m.mean = t.clone();
    m.sq_mean = t * t;
    m.deviations = torch::zeros({0, t.numel()}, t.options());
  } else {
    m.mean = (m.mean * n + t) / (n + 1);
    m.sq_mean = (m.sq_mean * n + t * t) / (n + 1);
  }
  // The deviation from the running mean that includes this iterate (SWAG, Maddox et al.).
  m.deviations = torch::cat({m.deviations, (t - m.mean).unsqueeze(0)});
  if (m.deviations.size(0) > rank) m.deviations = m.deviations.narrow(0, m.deviations.size(0) - rank, rank).clone();
  ++m.count;
}

torch::Tensor MultiSWAG::sample(const SWAGMoments& m, int64_t samples, double min_variance, at::Generator& gen) {
  PUSH_CHECK(m.count >= 1, "push::bayes::MultiSWAG::sample", "no moments collected yet");
  auto var = torch::clamp_min(m.sq_mean - m.mean * m.mean, min_variance);
  auto z1 = torch::randn({samples, m.mean.numel()}, gen, m.mean.options());
  auto theta = var.sqrt() * z1;
  const int64_t k = m.deviations.size(0);
  // SWAG (Maddox et al. 2019): θ̄ + Σ_diag^{1/2} z₁/√2 + D z₂/√(2(K−1)); the 1/√2 splits the
  // variance between the diagonal and the low-rank part. Without a low-rank part
  // (K < 2) it is SWAG-diagonal, θ̄ + Σ_diag^{1/2} z₁, with the whole diagonal variance.
  if (k < 2) return m.mean + theta;
  auto z2 = torch::randn({samples, k}, gen, m.mean.options());
  theta = theta + z2.mm(m.deviations) / std::sqrt(static_cast<double>(k - 1));
  return m.mean + theta / std::sqrt(2.0);
}

void MultiSWAG::prepare_epoch(Particle& p, int64_t epoch) {
  if (!collecting(epoch)) return;
  // Collection runs at its own rate: swag_lr, else the optimizer's lr₀ (a cosine schedule
  // of the pretraining, InferOptions::cosine_epochs, has set a decayed one).
  if (swag_.swag_lr()) {
    for (auto& g : p.optimizer().param_groups()) g.options().set_lr(*swag_.swag_lr());
  } else if (options().cosine_epochs() > 0) {
    training().set_lr_fraction(p, 1.0);
  }
}

double MultiSWAG::momentum_lr(Particle& p) const {
  // Unset swag_lr: lr (1 - momentum), the effective step of plain SGD at lr. The learning
  // rate tuned for the pretraining optimizer with momentum on top made heteroscedastic
  // regressions diverge (sine-gap at lr 1e-2).
  return swag_.swag_lr() ? *swag_.swag_lr()
                         : p.optimizer().param_groups()[0].options().get_lr() * (1 - *swag_.collect_momentum());
}

void MultiSWAG::count_step(Particle& p, const std::function<torch::Tensor()>& theta) const {
  auto& steps = p.state()["swag_steps"];
  const int64_t s = (steps.isInt() ? steps.toInt() : 0) + 1;
  steps = s;
  if (s % swag_.collect_every_steps() == 0) collect_into(p, theta());
}

void MultiSWAG::collect_into(Particle& p, const torch::Tensor& theta) const {
  auto m = read_state(p.state());
  collect(m, theta, swag_.rank());
  write_state(p.state(), m);
}

StepHooks MultiSWAG::epoch_hooks(Particle& p, int64_t epoch) {
  StepHooks hooks;
  if (!collecting(epoch)) return hooks;
  if (swag_.collect_every_steps() > 0) {
    hooks.after_step = [this, &p] {
      count_step(p, [&p] {
        torch::NoGradGuard no_grad;  // a copy of the values, not a graph
        return torch::nn::utils::parameters_to_vector(p.module().parameters());
      });
    };
  }
  if (swag_.collect_momentum()) {
    hooks.step = [&p, lr = momentum_lr(p), momentum = *swag_.collect_momentum()] { momentum_step(p, lr, momentum); };
  }
  return hooks;
}

std::optional<StepHooks> MultiSWAG::fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members,
                                                      int64_t epoch) {
  StepHooks hooks;
  if (!collecting(epoch)) return hooks;
  if (swag_.collect_every_steps() > 0) {
    hooks.after_step = [this, &stack, members] {
      torch::Tensor flat;  // taken once per step, when a member collects
      for (size_t i = 0; i < members.size(); ++i) {
        count_step(*members[i], [&] {
          if (!flat.defined()) flat = stack.flat_parameters();
          return flat[static_cast<int64_t>(i)];
        });
      }
    };
  }
  if (!swag_.collect_momentum()) return hooks;
  // momentum_step on the stacks: one buffer [N, D], the members' flat buffers stacked.
  auto buffer = std::make_shared<torch::Tensor>();
  std::vector<torch::Tensor> held;
  for (Particle* p : members) {
    auto it = p->state().find("swag_momentum");
    if (it != p->state().end() && it->second.isTensor()) held.push_back(it->second.toTensor());
  }
  const auto& params = stack.parameters();
  const torch::Device device = params.front().device();
  if (held.size() == members.size()) {
    for (auto& h : held) h = h.to(device);
    *buffer = torch::stack(held);
  }
  hooks.step = [buffer, &stack, lr = momentum_lr(*members.front()), momentum = *swag_.collect_momentum()] {
    torch::NoGradGuard no_grad;
    const auto& ps = stack.parameters();
    const bool first = !buffer->defined();
    if (first) {
      int64_t size = 0;
      for (const auto& t : ps) size += t[0].numel();
      *buffer = torch::zeros({stack.size(), size}, ps.front().options());
    }
    momentum_update(ps, *buffer, first, lr, momentum);
  };
  hooks.finish = [buffer, members] {
    if (!buffer->defined()) return;
    for (size_t i = 0; i < members.size(); ++i) {
      members[i]->state()["swag_momentum"] = (*buffer)[static_cast<int64_t>(i)].clone();
    }
  };
  return hooks;
}

void MultiSWAG::finish_epoch(Particle& p, int64_t epoch) {
  if (collecting(epoch) && swag_.collect_every_steps() == 0)
    collect_into(p, torch::nn::utils::parameters_to_vector(p.module().parameters()).detach());
}

ParticleOptions MultiSWAG::particle_options() {
  return ParticleOptions().on("swag_moments", [](Particle& p, const Args&) {
    auto m = read_state(p.state());
    if (m.count == 0) return c10::IValue(std::vector<torch::Tensor>{torch::zeros({0})});
    return c10::IValue(
        std::vector<torch::Tensor>{torch::tensor(m.count), m.mean.clone(), m.sq_mean.clone(), m.deviations.clone()});
  });
}

SWAGMoments MultiSWAG::moments(Pid pid) {
  auto v = distribution().p_launch(pid, "swag_moments").wait().toTensorVector();
  SWAGMoments m;
  if (v.size() < 4) return m;
  m.count = v[0].item<int64_t>();
  m.mean = v[1];
  m.sq_mean = v[2];
  m.deviations = v[3];
  return m;
}

torch::Tensor MultiSWAG::predict_particle(Particle& p, const torch::Tensor& x) {
  auto m = read_state(p.state());
  // Before any moments are collected the particle is a point estimate.
  if (m.count == 0) return torch::stack({forward_chunked(p, x)});  // fresh, as Infer's
  auto gen = training().generator(static_cast<uint64_t>(p.pid()), seed_purpose::kSample);
  auto thetas = sample(m, swag_.samples(), swag_.min_variance(), gen);
  return forward_each(p, thetas, x);
}

std::string MultiSWAG::data_parallel_refusal(DataParallelMode mode) const {
  if (mode == DataParallelMode::blocking) return {};
  return "it collects the moments of every step's parameters, which differ between the ranks between their "
         "syncs in this mode; use blocking";
}

}  // namespace push::bayes
