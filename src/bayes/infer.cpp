// Infer's core: the distribution its particles live in, fit (epochs, losses agreed over the
// ranks), predict, and the helpers its algorithms share. The training loop is
// epoch_engine.h's, data parallelism data_parallel_training.h's, checkpoints
// infer_checkpoint.cpp's.
#include <push/bayes/infer.h>

#include <push/bayes/fused.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "core/flat.h"
#include "core/seed.h"
#include "data_parallel_training.h"
#include "epoch_engine.h"
#include "learned_noise.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;

Infer::Infer(ModuleFactory model, InferOptions options)
    : model_(std::move(model)), options_(std::move(options)), objective_(options_) {
  PUSH_CHECK(options_.particles() >= 1, "push::bayes::Infer", "particles must be >= 1, got ", options_.particles());
  PUSH_CHECK(options_.batch_size() >= 1, "push::bayes::Infer", "batch_size must be >= 1, got ", options_.batch_size());
  PUSH_CHECK(options_.cosine_epochs() >= 0, "push::bayes::Infer", "cosine_epochs must be >= 0, got ",
             options_.cosine_epochs());
  if (options_.likelihood() == Likelihood::learned_noise) {
    model_ = [net = std::move(model_)] { return torch::nn::AnyModule(detail::LearnedNoise(net())); };
  }
}

Infer::~Infer() = default;

Push& Infer::distribution() {
  ensure_created();
  return *dist_;
}

bool Infer::fused() {
  ensure_created();
  return engine_ != nullptr && engine_->fused();  // null while the particles are being made
}

void Infer::close_distribution() { dist_.reset(); }

void Infer::ensure_created() {
  if (dist_) return;
  const auto& dp = options_.data_parallel();
  PUSH_CHECK(!dp || !options_.distribution().world(), "push::bayes::Infer",
             "distribution().world() spreads the particles over the ranks and data_parallel() copies them to every "
             "rank: choose one");
  if (dp) {
    const auto refusal = data_parallel_refusal(dp->mode());
    PUSH_CHECK(refusal.empty(), "push::bayes::Infer", name(), " cannot train data-parallel (", to_string(dp->mode()),
               "): ", refusal);
  }
  // First the distribution: particle_options() may use it (distribution(), fused()).
  dist_ = std::make_unique<Push>(model_, options_.distribution());
  try {
    create_particles();
  } catch (...) {
    // Nothing is left half made for a later call to run on.
    dist_.reset();
    engine_.reset();
    data_parallel_.reset();
    throw;
  }
}

void Infer::create_particles() {
  const auto& dp = options_.data_parallel();
  auto opts = particle_options();
  if (!opts.optimizer()) {
    double lr = options_.lr();
    opts.optimizer(options_.optimizer() ? options_.optimizer() : OptimizerFactory([lr](std::vector<torch::Tensor> ps) {
      return std::make_unique<torch::optim::Adam>(std::move(ps), torch::optim::AdamOptions(lr));
    }));
  }
  optimizer_ = opts.optimizer();
  // A scratch copy says whether the model and its optimizer fuse and gives the optimizer's
  // lr₀ per param group for a schedule (the particles' own come later, from the same factory).
  bool fuse = false;
  base_lrs_.clear();
  if (options_.fuse() || options_.cosine_epochs() > 0) {
    auto scratch = model_();
    auto optimizer = optimizer_(scratch.ptr()->parameters());
    fuse = options_.fuse() && fusion_blocker(*scratch.ptr(), optimizer.get()).empty();
    for (const auto& g : optimizer->param_groups()) base_lrs_.push_back(g.options().get_lr());
  }
  // Fused when asked and possible, but not when the algorithm has an "epoch" of its own (it
  // knows nothing of groups) or with data parallelism (a replica steps one particle at a time).
  fuse = fuse && !dp && opts.receive().count("epoch") == 0;
  engine_ = fuse ? std::unique_ptr<detail::EpochEngine>(std::make_unique<detail::FusedEpochs>(*this))
                 : std::make_unique<detail::UnfusedEpochs>(*this);
  opts.on("predict", [this](Particle& p, const Args& a) {
    torch::NoGradGuard no_grad;
    return c10::IValue(predict_particle(p, a[0].toTensor()));
  });
  if (opts.receive().count("epoch") == 0) engine_->add_handlers(opts);
  for (int i = 0; i < options_.particles(); ++i) {
    dist_->p_create(opts);
    if (options_.on_progress()) {
      Progress p;
      p.creating = true;
      p.particles_done = i + 1;
      p.particles = options_.particles();
      options_.on_progress()(p);
    }
  }
  // Each particle's own groups, made here, on one thread, in one order on every rank.
  if (dp) data_parallel_ = std::make_unique<detail::DataParallelTraining>(*dp, dist_->particle_ids());
}

void Infer::fit(const data::Dataset& train, int64_t epochs) {
  const char* origin = "push::bayes::Infer::fit";
  PUSH_CHECK(epochs >= 0, origin, "epochs must be >= 0, got ", epochs);
  PUSH_CHECK(train.size() > 0, origin, "the training set is empty");
  const bool classify = options_.likelihood() == Likelihood::categorical;
  PUSH_CHECK(classify == (train.task == Task::classification), origin, "a ", to_string(options_.likelihood()),
             " likelihood does not fit a ", data::to_string(train.task), " data set");
  ensure_created();
  dataset_size_ = train.size();
  // Handlers of this rank's particles may run for another rank (SVGD's leader drives every
  // particle) and read what fit sets: every rank has set it before any trains.
  if (options_.distribution().world()) dist_->barrier();
  auto x = train.x.contiguous();
  auto y = classify ? train.y.to(torch::kLong).contiguous() : train.y.to(torch::kFloat32).contiguous();
  if (!classify && y.dim() == 1) y = y.unsqueeze(1);
  fit_last_epoch_ = epochs_done_ + epochs;
  ++fit_calls_;
  for (int64_t e = 0; e < epochs; ++e) {
    // Every rank runs its own particles; the losses of all of them, in id order, make the
    // epoch's mean, the same on every rank and the same sum as in one process.
    std::map<Pid, c10::IValue> per_particle;
    std::exception_ptr error;
    try {
      auto losses = run_epoch(x, y, epochs_done_);
      if (data_parallel_) losses = data_parallel_->average(losses);
      for (const auto& [pid, l] : losses) per_particle[pid] = l;
    } catch (...) {
      error = std::current_exception();
    }
    per_particle = exchange(std::move(per_particle), error, origin);
    double mean = 0;
    ++epochs_done_;
    for (const auto& [pid, value] : per_particle) {
      const double l = value.toDouble();
      mean += l / static_cast<double>(per_particle.size());
      auto [it, first] = particle_losses_.try_emplace(pid, ParticleLosses{l, epochs_done_, l, epochs_done_});
      if (first) continue;
      auto& seen = it->second;
      if (l < seen.best) seen.best = l, seen.best_epoch = epochs_done_;
      seen.last = l;
      seen.last_epoch = epochs_done_;
    }
    losses_.push_back(mean);
  }
}

std::map<Pid, c10::IValue> Infer::exchange(std::map<Pid, c10::IValue> mine, const std::exception_ptr& error,
                                           const char* origin) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& [pid, v] : mine) list.push_back(c10::ivalue::Tuple::create({pid, v}));
  std::map<Pid, c10::IValue> out;
  for (const auto& rank : dist_->all_gather_or_throw(list, error, origin)) {
    for (const auto& item : rank.toListRef()) {
      const auto& t = item.toTupleRef().elements();
      out[t[0].toInt()] = t[1];
    }
  }
  return out;
}

std::map<Pid, double> Infer::run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  return engine_->run(*dist_, x, y, epoch);
}

void Infer::report(int64_t epoch, int64_t last_epoch, int64_t done, double running_loss) const {
  if (!options_.on_progress()) return;
  Progress p;
  p.epoch = epoch;
  p.last_epoch = last_epoch;
  p.particles_done = done;
  p.particles = options_.particles();
  p.loss = running_loss;
  options_.on_progress()(p);
}

Predictive Infer::predict(const torch::Tensor& x) {
  ensure_created();
  // Every rank predicts with its own particles; all predictions, in id order, go to
  // every rank.
  std::vector<PFuture> fs;
  const auto ids = dist_->local_particle_ids();
  for (Pid pid : ids) fs.push_back(dist_->p_launch(pid, "predict", x.contiguous()));
  std::map<Pid, c10::IValue> outs;
  std::exception_ptr error;
  try {
    auto values = dist_->p_wait(fs);
    for (size_t i = 0; i < ids.size(); ++i) outs[ids[i]] = values[i];
  } catch (...) {
    error = std::current_exception();
  }
  outs = exchange(std::move(outs), error, "push::bayes::Infer::predict");
  std::vector<torch::Tensor> ordered;
  for (const auto& [pid, t] : outs) ordered.push_back(t.toTensor());
  return make_predictive(torch::cat(ordered, 0), options_.likelihood(), options_.noise_std());
}

double Infer::train_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                          const StepHooks& hooks) {
  schedule_lr(p, epoch);
  return detail::UnfusedEpochs(*this).train(p, x, y, epoch, hooks);
}

void Infer::schedule_lr(Particle& p, int64_t epoch) const {
  const int64_t t = options_.cosine_epochs();
  if (t <= 0) return;
  // A function of the epoch, not the runtime's per-particle LRScheduler (stepped, its steps
  // replayed on load): the same rate on every rank and lane whatever ran where, nothing to
  // save, and LibTorch has no cosine scheduler.
  const double pi = std::numbers::pi;
  set_lr_fraction(p, epoch < t ? 0.5 * (1 + std::cos(pi * static_cast<double>(epoch) / static_cast<double>(t))) : 0.0);
}

void Infer::set_lr_fraction(Particle& p, double fraction) const {
  auto& groups = p.optimizer().param_groups();
  PUSH_CHECK(!base_lrs_.empty() && groups.size() == base_lrs_.size(), "push::bayes::Infer", "particle ", p.pid(),
             "'s optimizer has ", groups.size(), " param groups, its factory's scratch copy ", base_lrs_.size(),
             ": a learning-rate schedule needs the same groups for every particle");
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(base_lrs_[i] * fraction);
}

torch::Tensor Infer::predict_particle(Particle& p, const torch::Tensor& x) {
  // stack, not unsqueeze: a fresh tensor, not a view whose base shares its storage, so
  // that the runtime sees a result no particle can hold and sends it without checking
  // every particle of the lane (runtime/message_values.cpp).
  return torch::stack({forward_chunked(p, x)});
}

torch::Tensor Infer::forward_chunked(Particle& p, const torch::Tensor& x) {
  constexpr int64_t chunk = 8192;
  std::vector<torch::Tensor> outs;
  for (int64_t b = 0; b < x.size(0); b += chunk) {
    auto part = x.narrow(0, b, std::min(chunk, x.size(0) - b)).to(p.device());
    outs.push_back(p.any_module().forward(part).to(torch::kCPU));
  }
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 0);
}

torch::Tensor Infer::forward_each(Particle& p, const torch::Tensor& thetas, const torch::Tensor& x) {
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

void Infer::check_finite(const Particle& p, int64_t epoch, double loss) const {
  PUSH_CHECK(std::isfinite(loss), "push::bayes::Infer::fit", name(), ": the training loss of particle ", p.pid(),
             " is non-finite (", loss, ") in epoch ", epoch + 1,
             ": training diverged; lower the learning rate or check the data for huge values");
}

void Infer::check_parameters_finite(Particle& p, int64_t epoch) const {
  for (const auto& item : p.module().named_parameters()) {
    const bool finite = torch::isfinite(item.value()).all().item<bool>();
    PUSH_CHECK(finite, "push::bayes::Infer::fit", name(), ": parameter '", item.key(), "' of particle ", p.pid(),
               " is non-finite after epoch ", epoch + 1,
               ": training diverged; lower the learning rate or check the data for huge values");
  }
}

torch::Tensor Infer::epoch_order(Pid particle, int64_t epoch, int64_t n) const {
  auto gen = generator(static_cast<uint64_t>(particle), static_cast<uint64_t>(epoch), seed_purpose::kShuffle);
  return torch::randperm(n, gen, torch::kLong);
}

at::Generator Infer::generator(uint64_t a, uint64_t b, uint64_t c) const {
  return at::make_generator<at::CPUGeneratorImpl>(push::detail::mix_seed(options_.distribution().seed(), a, b, c));
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

std::vector<std::vector<Pid>> Infer::fused_groups(bool every_rank) {
  std::map<std::pair<int, int>, std::vector<Pid>> by_lane;
  for (Pid pid : every_rank ? dist_->particle_ids() : dist_->local_particle_ids()) {
    by_lane[{dist_->rank_of(pid), dist_->lane_of(pid)}].push_back(pid);
  }
  const size_t most = static_cast<size_t>(std::max(1, options_.distribution().cache_size()));
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

}  // namespace push::bayes
