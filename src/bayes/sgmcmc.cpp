// SG-MCMC as particle programs: the step hooks that replace the optimizer's step with a
// Langevin or Hamiltonian one, and the samples each chain keeps; see sgmcmc.h.
#include <push/bayes/fused.h>
#include <push/bayes/sgmcmc.h>

#include <torch/torch.h>

#include <cmath>
#include <numbers>
#include "core/flat.h"
#include "core/seed.h"

namespace push::bayes {
namespace {

constexpr const char* kOrigin = "push::bayes::SGMCMC";
constexpr const char* kMomentum = "sgmcmc_momentum";  // SGHMC's v, flat [D]
constexpr const char* kSecond = "sgmcmc_second";      // pSGLD's V, flat [D]
constexpr const char* kSamples = "sgmcmc_samples";    // [k, D] float32, host: a ring once full
constexpr const char* kNext = "sgmcmc_next";          // the ring's oldest row, where the next sample goes
constexpr const char* kSteps = "sgmcmc_steps";        // sampling steps taken
constexpr double kWake = 100;                         // a held V adapts where g² exceeds this many times it

/// p's samples, oldest first; undefined before the first.
torch::Tensor held_samples(Particle& p) {
  auto it = p.state().find(kSamples);
  if (it == p.state().end() || !it->second.isTensor()) return {};
  auto ring = it->second.toTensor().to(torch::kCPU, torch::kFloat32);
  auto next = p.state().find(kNext);
  const int64_t oldest = next == p.state().end() ? 0 : next->second.toInt();
  return oldest == 0 ? ring : torch::roll(ring, -oldest, 0);
}

/// One step of every chain in `params` (each [rows, ...]: rows = 1 for one particle, N for
/// a fused stack), with `buffer` [rows, D] (v or V; undefined for plain SGLD) and row r's
/// noise drawn from gens[r] on the host: the same numbers fused or not, on any device.
/// pSGLD's V moves only when `adapt` (or is new).
void chain_step(const std::vector<torch::Tensor>& params, int64_t rows, const torch::Tensor& buffer, bool first,
                std::vector<at::Generator>& gens, const SGMCMCOptions& o, const SGMCMC::EpochPlan& e, double n) {
  const double eps = e.step_size;
  const bool noisy = e.noisy, adapt = !e.keeps || !o.hold_preconditioner();
  torch::NoGradGuard no_grad;
  const double t = o.temperature();
  int64_t offset = 0;
  for (const auto& param : params) {
    const int64_t m = param.numel() / rows;
    auto theta = param.view({rows, m});
    const auto slice = buffer.defined() ? buffer.narrow(1, offset, m) : torch::Tensor();
    offset += m;
    if (!param.grad().defined()) continue;
    const auto g = param.grad().view({rows, m});
    torch::Tensor z;
    if (noisy) {
      // One draw per row from its own generator; one chain's needs no stacking copy.
      if (rows == 1) {
        z = torch::randn({1, m}, gens[0], torch::kFloat32);
      } else {
        std::vector<torch::Tensor> draws;
        for (int64_t r = 0; r < rows; ++r) draws.push_back(torch::randn({m}, gens[r], torch::kFloat32));
        z = torch::stack(draws);
      }
      z = z.to(param.device(), param.scalar_type());
    }
    if (o.method() == SGMCMCMethod::sghmc) {
      slice.mul_(1 - o.friction()).add_(g, -eps);
      if (noisy) slice.add_(z, std::sqrt(2 * o.friction() * eps * t / n));
      theta.add_(slice);
    } else if (o.preconditioned()) {
      if (first) {
        slice.copy_(g * g);  // V starts at the first gradient's square, not at 0
      } else if (adapt) {
        slice.mul_(o.precondition_decay()).addcmul_(g, g, 1 - o.precondition_decay());
      } else {
        // Held, but where a gradient's square exceeds kWake V (a network unit inactive
        // through burn-in, V ≈ 0, that wakes) V adapts there: a step G g with G ≈ 1/λ would
        // diverge. For a coordinate sampling its posterior, g² > 100 E[g²] is a 10-sd event.
        const auto g2 = g * g;
        const auto moved = slice * o.precondition_decay() + g2 * (1 - o.precondition_decay());
        slice.copy_(torch::where(g2 > slice * kWake, moved, slice));
      }
      const auto precondition = 1 / (o.precondition_eps() + slice.sqrt());
      theta.addcmul_(precondition, g, -eps);
      if (noisy) theta.add_((precondition * (2 * eps * t / n)).sqrt() * z);
    } else {
      theta.add_(g, -eps);
      if (noisy) theta.add_(z, std::sqrt(2 * eps * t / n));
    }
  }
}

/// The key of the buffer `o` needs, or null.
const char* buffer_key(const SGMCMCOptions& o) {
  if (o.method() == SGMCMCMethod::sghmc) return kMomentum;
  return o.preconditioned() ? kSecond : nullptr;
}

/// p's buffer on its parameters' device, and whether it is new (zeros).
std::pair<torch::Tensor, bool> held_buffer(Particle& p, const char* key, const torch::Tensor& like, int64_t size) {
  auto it = p.state().find(key);
  if (it != p.state().end() && it->second.isTensor()) {
    return {it->second.toTensor().to(like.device(), like.scalar_type()).reshape({size}), false};
  }
  return {torch::zeros({size}, like.options()), true};
}

int64_t flat_size(const std::vector<torch::Tensor>& params, int64_t rows) {
  int64_t size = 0;
  for (const auto& t : params) size += t.numel() / rows;
  return size;
}

}  // namespace

const char* to_string(SGMCMCMethod method) { return method == SGMCMCMethod::sghmc ? "sghmc" : "sgld"; }

SGMCMC::SGMCMC(ModuleFactory model, InferOptions options, SGMCMCOptions chains)
    : Infer(std::move(model), std::move(options)), chains_(chains) {
  const auto& o = chains_;
  auto positive = [](double v) { return v > 0 && std::isfinite(v); };
  PUSH_CHECK(positive(o.step_size()), kOrigin, "step_size must be positive and finite, got ", o.step_size());
  PUSH_CHECK(positive(o.friction()) && o.friction() <= 1, kOrigin, "friction must be in (0, 1], got ", o.friction());
  PUSH_CHECK(!o.preconditioned() || o.method() == SGMCMCMethod::sgld, kOrigin,
             "preconditioned is pSGLD: sgld only, not ", to_string(o.method()));
  PUSH_CHECK(o.precondition_decay() >= 0 && o.precondition_decay() < 1, kOrigin,
             "precondition_decay must be in [0, 1), got ", o.precondition_decay());
  PUSH_CHECK(positive(o.precondition_eps()), kOrigin, "precondition_eps must be positive and finite, got ",
             o.precondition_eps());
  PUSH_CHECK(!o.hold_preconditioner() || o.preconditioned(), kOrigin,
             "hold_preconditioner holds pSGLD's preconditioner: it needs preconditioned");
  PUSH_CHECK(!o.hold_preconditioner() || o.burn_in_epochs() > 0 || (o.cycle_epochs() > 0 && o.exploration() > 0),
             kOrigin,
             "hold_preconditioner needs burn_in_epochs, or cycle_epochs with exploration: V would be held at the first "
             "gradient's square");
  PUSH_CHECK(positive(o.temperature()), kOrigin, "temperature must be positive and finite, got ", o.temperature());
  PUSH_CHECK(o.cycle_epochs() >= 0, kOrigin, "cycle_epochs must be >= 0, got ", o.cycle_epochs());
  PUSH_CHECK(o.exploration() >= 0 && o.exploration() < 1, kOrigin, "exploration must be in [0, 1), got ",
             o.exploration());
  PUSH_CHECK(o.burn_in_epochs() >= 0, kOrigin, "burn_in_epochs must be >= 0, got ", o.burn_in_epochs());
  PUSH_CHECK(o.thin() >= 1, kOrigin, "thin must be >= 1, got ", o.thin());
  PUSH_CHECK(o.samples() >= 1, kOrigin, "samples must be >= 1, got ", o.samples());
  PUSH_CHECK(this->options().cosine_epochs() == 0, kOrigin,
             "the chains take step_size, constant or cyclical (cycle_epochs), not InferOptions' cosine schedule");
  PUSH_CHECK(!this->options().optimizer(), kOrigin,
             "the chains take their own steps (step_size), not InferOptions' optimizer: it would be ignored");
}

SGMCMC::EpochPlan SGMCMC::plan(const SGMCMCOptions& chains, int64_t epoch) {
  EpochPlan e;
  e.step_size = chains.step_size();
  if (chains.cycle_epochs() > 0) {
    const double r = static_cast<double>(epoch % chains.cycle_epochs()) / static_cast<double>(chains.cycle_epochs());
    e.step_size *= (std::cos(std::numbers::pi * r) + 1) / 2;
    e.noisy = r >= chains.exploration();
  }
  e.keeps = e.noisy && epoch >= chains.burn_in_epochs();
  return e;
}

void SGMCMC::count_step(Particle& p, const std::function<torch::Tensor()>& theta) const {
  auto& steps = p.state()[kSteps];
  const int64_t s = (steps.isInt() ? steps.toInt() : 0) + 1;
  steps = s;
  if (s % chains_.thin() != 0) return;
  // On the host, whatever the lane: samples do not take device memory. Once `samples` are
  // held, each new one overwrites the oldest in place (a checkpoint loads state onto the
  // lane's device: it comes back to the host on the next sample).
  auto sample = theta().detach().to(torch::kCPU, torch::kFloat32).reshape({1, -1});
  auto& held = p.state()[kSamples];
  if (!held.isTensor()) {
    held = sample;
    p.state()[kNext] = int64_t{0};
    return;
  }
  auto ring = held.toTensor().to(torch::kCPU, torch::kFloat32);
  auto& oldest = p.state()[kNext];
  if (ring.size(0) > chains_.samples() || (ring.size(0) < chains_.samples() && oldest.toInt() != 0)) {
    // Loaded with another `samples`: oldest first again, the latest `samples` kept.
    ring = held_samples(p);
    if (ring.size(0) > chains_.samples()) ring = ring.narrow(0, ring.size(0) - chains_.samples(), chains_.samples());
    ring = ring.clone();
    oldest = int64_t{0};
  }
  if (ring.size(0) < chains_.samples()) {
    held = torch::cat({ring, sample});
    return;
  }
  auto& next = p.state()[kNext];
  ring[next.toInt()].copy_(sample[0]);
  held = ring;
  next = (next.toInt() + 1) % ring.size(0);
}

StepHooks SGMCMC::epoch_hooks(Particle& p, int64_t epoch) {
  const EpochPlan e = plan(epoch);
  const double n = static_cast<double>(training().dataset_size());
  auto gens = std::make_shared<std::vector<at::Generator>>(
      1, training().generator(static_cast<uint64_t>(p.pid()), static_cast<uint64_t>(epoch),
                              push::detail::seed_purpose::kLangevin));
  StepHooks hooks;
  hooks.step = [this, &p, e, n, gens] {
    const auto params = p.module().parameters();
    torch::Tensor buffer;
    bool first = false;
    const char* key = buffer_key(chains_);
    if (key) {
      std::tie(buffer, first) = held_buffer(p, key, params.front(), flat_size(params, 1));
      p.state()[key] = buffer;  // updated in place from here on
    }
    chain_step(params, 1, buffer.defined() ? buffer.view({1, -1}) : buffer, first, *gens, chains_, e, n);
  };
  if (e.keeps) {
    hooks.after_step = [this, &p] {
      count_step(p, [&p] {
        torch::NoGradGuard no_grad;
        return torch::nn::utils::parameters_to_vector(p.module().parameters());
      });
    };
  }
  return hooks;
}

std::optional<StepHooks> SGMCMC::fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members,
                                                   int64_t epoch) {
  const EpochPlan e = plan(epoch);
  const double n = static_cast<double>(training().dataset_size());
  auto gens = std::make_shared<std::vector<at::Generator>>();
  for (Particle* p : members) {
    gens->push_back(training().generator(static_cast<uint64_t>(p->pid()), static_cast<uint64_t>(epoch),
                                         push::detail::seed_purpose::kLangevin));
  }
  // The members' buffers stacked [N, D]; new ones start at zero (each member's own "first").
  const char* key = buffer_key(chains_);
  auto buffer = std::make_shared<torch::Tensor>();
  auto first = std::make_shared<bool>(false);
  if (key) {
    const auto& params = stack.parameters();
    const int64_t size = flat_size(params, stack.size());
    std::vector<torch::Tensor> rows;
    bool any_new = false;
    for (Particle* p : members) {
      auto [b, fresh] = held_buffer(*p, key, params.front(), size);
      any_new = any_new || fresh;
      rows.push_back(b);
    }
    *buffer = torch::stack(rows);
    *first = any_new;  // the members of a group have taken the same steps: all new or none
  }
  StepHooks hooks;
  hooks.step = [this, &stack, buffer, first, gens, e, n] {
    chain_step(stack.parameters(), stack.size(), *buffer, *first, *gens, chains_, e, n);
    *first = false;
  };
  hooks.finish = [buffer, members, key] {
    if (!key) return;
    for (size_t i = 0; i < members.size(); ++i) members[i]->state()[key] = (*buffer)[static_cast<int64_t>(i)].clone();
  };
  if (e.keeps) {
    hooks.after_step = [this, &stack, members] {
      torch::Tensor flat;  // taken once per step, when a member keeps a sample
      for (size_t i = 0; i < members.size(); ++i) {
        count_step(*members[i], [&] {
          if (!flat.defined()) flat = stack.flat_parameters();
          return flat[static_cast<int64_t>(i)];
        });
      }
    };
  }
  return hooks;
}

ParticleOptions SGMCMC::particle_options() {
  return ParticleOptions().on("sgmcmc_samples", [](Particle& p, const Args&) {
    auto held = held_samples(p);
    return c10::IValue(held.defined() ? held.clone() : torch::zeros({0, 0}));
  });
}

torch::Tensor SGMCMC::samples(Pid pid) { return distribution().p_launch(pid, "sgmcmc_samples").wait().toTensor(); }

torch::Tensor SGMCMC::predict_particle(Particle& p, const torch::Tensor& x) {
  // Before any sample is kept the chain's current parameters predict.
  const auto thetas = held_samples(p);
  if (!thetas.defined()) return torch::stack({forward_chunked(p, x)});
  return forward_each(p, thetas, x);
}

std::string SGMCMC::data_parallel_refusal(DataParallelMode) const {
  return "its chains are particles, each with its own noise and samples: spread them over the ranks instead";
}

}  // namespace push::bayes
