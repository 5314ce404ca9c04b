// Infer's core: the distribution its particles live in, fit (epochs, losses agreed over the
// ranks), predict. The training loop is epoch_engine.h's, its services to algorithms
// training.cpp's, data parallelism data_parallel_training.h's, checkpoints
// infer_checkpoint.cpp's.
#include <push/bayes/infer.h>

#include <push/bayes/fused.h>

#include <torch/torch.h>

#include "core/seeded.h"
#include "data_parallel_training.h"
#include "epoch_engine.h"
#include "learned_noise.h"
#include "training_state.h"

namespace push::bayes {
Infer::Infer(ModuleFactory model, InferOptions options)
    : model_(std::move(model)),
      state_(std::make_unique<detail::TrainingState>(static_cast<Algorithm&>(*this), std::move(options))),
      training_(*state_) {
  const InferOptions& o = state_->options;
  PUSH_CHECK(o.particles() >= 1, "push::bayes::Infer", "particles must be >= 1, got ", o.particles());
  PUSH_CHECK(o.batch_size() >= 1, "push::bayes::Infer", "batch_size must be >= 1, got ", o.batch_size());
  PUSH_CHECK(o.cosine_epochs() >= 0, "push::bayes::Infer", "cosine_epochs must be >= 0, got ", o.cosine_epochs());
  if (o.likelihood() == Likelihood::learned_noise) {
    model_ = [net = std::move(model_)] { return torch::nn::AnyModule(detail::LearnedNoise(net())); };
  }
}

Infer::~Infer() = default;

const InferOptions& Infer::options() const { return state_->options; }

const Objective& Infer::objective() const { return state_->objective; }

Push& Infer::distribution() {
  ensure_created();
  return *dist_;
}

bool Infer::fused() {
  ensure_created();
  return state_->engine != nullptr && state_->engine->fused();  // null while the particles are being made
}

void Infer::close_distribution() {
  dist_.reset();
  state_->dist = nullptr;
}

void Infer::ensure_created() {
  if (dist_) return;
  const InferOptions& o = state_->options;
  const auto& dp = o.data_parallel();
  PUSH_CHECK(!dp || !o.distribution().world(), "push::bayes::Infer",
             "distribution().world() spreads the particles over the ranks and data_parallel() copies them to every "
             "rank: choose one");
  if (dp) {
    const auto refusal = data_parallel_refusal(dp->mode());
    PUSH_CHECK(refusal.empty(), "push::bayes::Infer", name(), " cannot train data-parallel (", to_string(dp->mode()),
               "): ", refusal);
  }
  // First the distribution: particle_options() may use it (distribution(), fused()).
  dist_ = std::make_unique<Push>(model_, o.distribution());
  state_->dist = dist_.get();
  try {
    create_particles();
  } catch (...) {
    // Nothing is left half made for a later call to run on.
    dist_.reset();
    state_->dist = nullptr;
    state_->engine.reset();
    state_->data_parallel.reset();
    throw;
  }
}

void Infer::create_particles() {
  const InferOptions& o = state_->options;
  const auto& dp = o.data_parallel();
  auto opts = particle_options();
  if (!opts.optimizer()) {
    double lr = o.lr();
    opts.optimizer(o.optimizer() ? o.optimizer() : OptimizerFactory([lr](std::vector<torch::Tensor> ps) {
      return std::make_unique<torch::optim::Adam>(std::move(ps), torch::optim::AdamOptions(lr));
    }));
  }
  state_->optimizer = opts.optimizer();
  // A scratch copy says whether the model and its optimizer fuse and gives the optimizer's
  // lr₀ per param group for a schedule (the particles' own come later, from the same factory).
  bool fuse = false;
  state_->base_lrs.clear();
  if (o.fuse() || o.cosine_epochs() > 0) {
    // Under a seed of its own: its initializers would otherwise draw from the caller's
    // random stream (the particles' draw under theirs, the same way).
    auto scratch = push::detail::under_seed(o.distribution().seed(), model_);
    auto optimizer = state_->optimizer(scratch.ptr()->parameters());
    fuse = o.fuse() && fusion_blocker(*scratch.ptr(), optimizer.get()).empty();
    for (const auto& g : optimizer->param_groups()) state_->base_lrs.push_back(g.options().get_lr());
  }
  // Fused when asked and possible, but not when the algorithm has an "epoch" of its own (it
  // knows nothing of groups) or with data parallelism (a replica steps one particle at a time).
  fuse = fuse && !dp && opts.receive().count("epoch") == 0;
  auto& engine = state_->engine;
  engine = fuse ? std::unique_ptr<detail::EpochEngine>(std::make_unique<detail::FusedEpochs>(*state_))
                : std::make_unique<detail::UnfusedEpochs>(*state_);
  opts.on("predict", [this](Particle& p, const Args& a) {
    torch::NoGradGuard no_grad;
    return c10::IValue(predict_particle(p, a[0].toTensor()));
  });
  if (opts.receive().count("epoch") == 0) engine->add_handlers(opts);
  for (int i = 0; i < o.particles(); ++i) {
    dist_->p_create(opts);
    if (o.on_progress()) {
      Progress p;
      p.creating = true;
      p.particles_done = i + 1;
      p.particles = o.particles();
      o.on_progress()(p);
    }
  }
  // Each particle's own groups, made here, on one thread, in one order on every rank.
  if (dp) state_->data_parallel = std::make_unique<detail::DataParallelTraining>(*dp, dist_->particle_ids());
}

void Infer::fit(const data::Dataset& train, int64_t epochs) {
  const char* origin = "push::bayes::Infer::fit";
  const InferOptions& o = state_->options;
  PUSH_CHECK(epochs >= 0, origin, "epochs must be >= 0, got ", epochs);
  PUSH_CHECK(train.size() > 0, origin, "the training set is empty");
  const bool classify = o.likelihood() == Likelihood::categorical;
  PUSH_CHECK(classify == (train.task == Task::classification), origin, "a ", to_string(o.likelihood()),
             " likelihood does not fit a ", data::to_string(train.task), " data set");
  ensure_created();
  state_->dataset_size = train.size();
  // Handlers of this rank's particles may run for another rank (SVGD's leader drives every
  // particle) and read what fit sets: every rank has set it before any trains.
  if (o.distribution().world()) dist_->barrier();
  auto x = train.x.contiguous();
  auto y = classify ? train.y.to(torch::kLong).contiguous() : train.y.to(torch::kFloat32).contiguous();
  if (!classify && y.dim() == 1) y = y.unsqueeze(1);
  state_->fit_last_epoch = epochs_done_ + epochs;
  ++state_->fit_calls;
  for (int64_t e = 0; e < epochs; ++e) {
    // Every rank runs its own particles; the losses of all of them, in id order, make the
    // epoch's mean, the same on every rank and the same sum as in one process.
    std::map<Pid, c10::IValue> per_particle;
    std::exception_ptr error;
    try {
      auto losses = run_epoch(x, y, epochs_done_);
      if (state_->data_parallel) losses = state_->data_parallel->average(losses);
      for (const auto& [pid, l] : losses) per_particle[pid] = l;
    } catch (...) {
      error = std::current_exception();
    }
    per_particle = training_.exchange(std::move(per_particle), error, origin);
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

std::map<Pid, double> Infer::run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  return state_->engine->run(*dist_, x, y, epoch);
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
  outs = training_.exchange(std::move(outs), error, "push::bayes::Infer::predict");
  std::vector<torch::Tensor> ordered;
  for (const auto& [pid, t] : outs) ordered.push_back(t.toTensor());
  return make_predictive(torch::cat(ordered, 0), options().likelihood(), options().noise_std());
}

torch::Tensor Infer::predict_particle(Particle& p, const torch::Tensor& x) {
  // stack, not unsqueeze: a fresh tensor, not a view whose base shares its storage, so
  // that the runtime sees a result no particle can hold and sends it without checking
  // every particle of the lane (runtime/message_values.cpp).
  return torch::stack({forward_chunked(p, x)});
}

}  // namespace push::bayes
