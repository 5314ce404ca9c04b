// The common machinery of the Bayesian algorithms (objective, epochs, prediction,
// save/load), the deep ensemble and the model factories.
#include <push/bayes/ensemble.h>
#include <push/bayes/fused.h>
#include <push/bayes/infer.h>
#include <push/bayes/mc_dropout.h>
#include <push/bayes/models.h>

#include "../parallel/flat.h"
#include "learned_noise.h"
#include "replica.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <numbers>
#include <sstream>
#include "core/seed.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;

namespace {

torch::Tensor variance_of(const torch::Tensor& raw) { return torch::softplus(raw) + 1e-6; }

}  // namespace

const char* to_string(Likelihood likelihood) {
  switch (likelihood) {
    case Likelihood::gaussian: return "gaussian";
    case Likelihood::heteroscedastic: return "heteroscedastic";
    case Likelihood::categorical: return "categorical";
    case Likelihood::learned_noise: return "learned-noise";
  }
  return "?";
}

int64_t output_units(Likelihood likelihood, int64_t n) {
  return likelihood == Likelihood::heteroscedastic ? 2 * n : n;
}

Predictive make_predictive(const torch::Tensor& outputs, Likelihood likelihood, double noise_std) {
  PUSH_CHECK(outputs.dim() == 3, "push::bayes::make_predictive", "expected outputs [S, M, out], got ",
             outputs.sizes());
  Predictive p;
  auto out = outputs.to(torch::kFloat64);
  if (likelihood == Likelihood::categorical) {
    p.task = Task::classification;
    p.members = torch::softmax(out, -1);
    p.probs = p.members.mean(0);
    return p;
  }
  torch::Tensor means = out, noise;
  if (likelihood == Likelihood::heteroscedastic || likelihood == Likelihood::learned_noise) {
    const int64_t t = out.size(2) / 2;
    PUSH_CHECK(out.size(2) == 2 * t, "push::bayes::make_predictive", "a ", to_string(likelihood),
               " model needs an even number of outputs (means, noise), got ", out.size(2));
    means = out.narrow(2, 0, t);
    noise = likelihood == Likelihood::heteroscedastic ? variance_of(out.narrow(2, t, t))
                                                      : torch::exp(-out.narrow(2, t, t));
  } else {
    noise = torch::full_like(out, noise_std * noise_std);
  }
  p.members = means;
  p.mean = means.mean(0);
  p.aleatoric = noise.mean(0);
  p.variance = p.aleatoric + means.var(0, /*unbiased=*/false);
  return p;
}

// ---- Infer ------------------------------------------------------------------------------

Infer::Infer(ModuleFactory model, InferOptions options) : model_(std::move(model)), options_(std::move(options)) {
  PUSH_CHECK(options_.particles() >= 1, "push::bayes::Infer", "particles must be >= 1, got ", options_.particles());
  PUSH_CHECK(options_.batch_size() >= 1, "push::bayes::Infer", "batch_size must be >= 1, got ",
             options_.batch_size());
  PUSH_CHECK(options_.noise_std() > 0 && options_.prior_std() > 0, "push::bayes::Infer",
             "noise_std and prior_std must be positive");
  PUSH_CHECK(options_.noise_prior_shape() > 0 && options_.noise_prior_rate() > 0, "push::bayes::Infer",
             "noise_prior_shape and noise_prior_rate must be positive");
  if (options_.likelihood() == Likelihood::learned_noise) {
    model_ = [net = std::move(model_)] { return torch::nn::AnyModule(detail::LearnedNoise(net())); };
  }
}

Infer::~Infer() = default;

Push& Infer::dist() {
  ensure_created();
  return *dist_;
}

void Infer::ensure_created() {
  if (dist_) return;
  auto po = PushOptions().devices(options_.devices()).cache_size(options_.cache_size()).seed(options_.seed());
  const auto& dp = options_.data_parallel();
  PUSH_CHECK(!dp || !options_.world(), "push::bayes::Infer",
             "world() spreads the particles over the ranks and data_parallel() copies them to every rank: "
             "choose one");
  if (dp) {
    const auto refusal = data_parallel_refusal(dp->mode());
    PUSH_CHECK(refusal.empty(), "push::bayes::Infer", name(), " cannot train data-parallel (",
               to_string(dp->mode()), "): ", refusal);
  }
  po.world(options_.world());
  if (options_.intra_op_threads()) po.intra_op_threads(*options_.intra_op_threads());
  dist_ = std::make_unique<Push>(model_, po);
  auto opts = particle_options();
  if (!opts.optimizer()) {
    double lr = options_.lr();
    opts.optimizer(options_.optimizer() ? options_.optimizer()
                                        : OptimizerFactory([lr](std::vector<torch::Tensor> ps) {
                                            return std::make_unique<torch::optim::Adam>(
                                                std::move(ps), torch::optim::AdamOptions(lr));
                                          }));
  }
  optimizer_ = opts.optimizer();
  // A scratch copy says whether the model and its optimizer fuse (the particles' own come
  // later).
  if (options_.fuse()) {
    auto scratch = model_();
    auto optimizer = optimizer_(scratch.ptr()->parameters());
    fused_ = fusion_blocker(*scratch.ptr(), optimizer.get()).empty();
  }
  opts.on("predict", [this](Particle& p, const Args& a) {
    torch::NoGradGuard no_grad;
    return c10::IValue(predict_particle(p, a[0].toTensor()));
  });
  if (opts.receive().count("epoch") != 0) {
    fused_ = false;  // a subclass's own epoch: it knows nothing of groups
  } else {
    opts.on("epoch", [this](Particle& p, const Args& a) {
      return epoch_of(p, a[0].toTensor(), a[1].toTensor(), a[2].toInt());
    });
  }
  opts.on("fused_epoch", [this](Particle& p, const Args& a) {
    return fused_epoch_of(p, a[3].toIntVector(), a[0].toTensor(), a[1].toTensor(), a[2].toInt());
  });
  for (int i = 0; i < options_.particles(); ++i) dist_->p_create(opts);
  if (dp) {
    fused_ = false;  // a replica steps one particle at a time
    // Each particle's own groups, so that particles on different lanes never interleave
    // their collectives; made here, on one thread, in one order on every rank. When that
    // fails (a bad node layout), nothing is left half made for a later call to run on.
    try {
      for (Pid pid : dist_->particle_ids()) replicas_[pid] = std::make_unique<detail::Replica>(*dp);
      replica_group_ = parallel::detail::group_of_everyone(dp->world());
    } catch (...) {
      dist_.reset();
      replicas_.clear();
      replica_group_.reset();
      throw;
    }
  }
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
  if (options_.world()) dist_->barrier();
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
      if (replica_group_) losses = average_over_replicas(losses);
      for (const auto& [pid, l] : losses) per_particle[pid] = l;
    } catch (...) {
      error = std::current_exception();
    }
    per_particle = exchange(std::move(per_particle), error, origin);
    double mean = 0;
    for (const auto& [pid, l] : per_particle) mean += l.toDouble() / static_cast<double>(per_particle.size());
    ++epochs_done_;
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
  // One "epoch" per particle, or one "fused_epoch" per group, launched on its first member.
  std::vector<std::vector<Pid>> groups;
  if (fused_) {
    groups = fused_groups();
  } else {
    for (Pid pid : dist_->local_particle_ids()) groups.push_back({pid});
  }
  std::vector<PFuture> fs;
  for (const auto& g : groups) {
    fs.push_back(fused_ ? dist_->p_launch(g.front(), "fused_epoch", x, y, epoch, g)
                        : dist_->p_launch(g.front(), "epoch", x, y, epoch));
  }
  std::map<Pid, double> losses;
  double running = 0;
  std::exception_ptr error;  // rethrown once every particle is done: nothing left running
  for (size_t i = 0; i < fs.size(); ++i) {
    try {
      auto value = fs[i].wait();
      const auto each = fused_ ? value.toDoubleVector() : std::vector<double>{value.toDouble()};
      for (size_t m = 0; m < each.size(); ++m) {
        losses[groups[i][m]] = each[m];
        running += each[m];
      }
      report(epoch + 1, fit_last_epoch_, static_cast<int64_t>(losses.size()), running / losses.size());
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return losses;
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

torch::Tensor Infer::predict_particle(Particle& p, const torch::Tensor& x) {
  return forward_chunked(p, x).unsqueeze(0);
}

torch::Tensor Infer::forward_chunked(Particle& p, const torch::Tensor& x) {
  constexpr int64_t chunk = 8192;
  std::vector<torch::Tensor> outs;
  for (int64_t b = 0; b < x.size(0); b += chunk) {
    auto part = x.narrow(0, b, std::min(chunk, x.size(0) - b)).to(p.device());
    outs.push_back(p.any_module().forward(part).to(torch::kCPU));
  }
  return torch::cat(outs, 0);
}

torch::Tensor Infer::mean_nll(const torch::Tensor& out, const torch::Tensor& y) const {
  // Over the last two dimensions (points, outputs): [B, o] gives a scalar, [N, B, o] one
  // value per member of a fused stack.
  static const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  switch (options_.likelihood()) {
    case Likelihood::categorical: {
      if (out.dim() == 2) return torch::nn::functional::cross_entropy(out, y);
      namespace F = torch::nn::functional;
      auto each = F::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}),
                                   F::CrossEntropyFuncOptions().reduction(torch::kNone));
      return each.view(y.sizes()).mean(-1);
    }
    case Likelihood::heteroscedastic: {
      const int64_t t = out.size(-1) / 2;
      PUSH_CHECK(t == y.size(-1) && out.size(-1) == 2 * t, "push::bayes::Infer",
                 "a heteroscedastic model needs 2 outputs per target (", y.size(-1), " targets), it has ",
                 out.size(-1));
      auto mu = out.narrow(-1, 0, t), var = variance_of(out.narrow(-1, t, t));
      return (0.5 * (torch::log(var) + (y - mu).pow(2) / var) + half_log_2pi).sum(-1).mean(-1);
    }
    case Likelihood::learned_noise: {
      const int64_t t = y.size(-1);
      PUSH_CHECK(out.dim() == y.dim() && out.size(-1) == 2 * t, "push::bayes::Infer", "model outputs ", out.sizes(),
                 " do not match targets ", y.sizes());
      auto mu = out.narrow(-1, 0, t), log_gamma = out.narrow(-1, t, t);
      return (0.5 * (torch::exp(log_gamma) * (y - mu).pow(2) - log_gamma) + half_log_2pi).sum(-1).mean(-1);
    }
    case Likelihood::gaussian: {
      PUSH_CHECK(out.sizes() == y.sizes(), "push::bayes::Infer", "model outputs ", out.sizes(),
                 " do not match targets ", y.sizes());
      const double s = options_.noise_std();
      return ((y - out).pow(2) * (0.5 / (s * s))).sum(-1).mean(-1) + y.size(-1) * (std::log(s) + half_log_2pi);
    }
  }
  return {};
}

torch::Tensor Infer::neg_log_prior(torch::nn::Module& module) const {
  torch::Tensor sum, noise;
  for (const auto& item : module.named_parameters()) {
    if (options_.likelihood() == Likelihood::learned_noise && item.key() == detail::kLogNoisePrecision) {
      // -log Gamma(γ; a0, b0) - log |dγ/dlog γ| = -a0 log γ + b0 γ + const.
      const auto& log_gamma = item.value();
      noise = (options_.noise_prior_rate() * torch::exp(log_gamma) - options_.noise_prior_shape() * log_gamma).sum();
      continue;
    }
    auto s = item.value().pow(2).sum();
    sum = sum.defined() ? sum + s : s;
  }
  const double v = options_.prior_std() * options_.prior_std();
  auto weights = sum.defined() ? sum / (2 * v) : torch::zeros({});
  return noise.defined() ? weights + noise : weights;
}

double Infer::sgd_step(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t n,
                       const std::function<void()>& step) const {
  auto& opt = p.optimizer();
  auto* r = replica(p.pid());
  if (r) r->before_forward();
  opt.zero_grad();
  auto nll = mean_nll(p.any_module().forward(x), y);
  auto loss = nll + neg_log_prior(p.module()) / static_cast<double>(n);
  loss.backward();
  std::function<void()> plain;  // the optimizer's own step, when `step` does not replace it
  if (!step) plain = [&opt] { opt.step(); };
  const std::function<void()>& apply = step ? step : plain;
  if (r) {
    r->step(p, apply);
  } else {
    apply();
  }
  return nll.item<double>();
}

double Infer::train_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                          const std::function<void()>& after_step, const std::function<void()>& step) const {
  const int64_t n = x.size(0), bs = options_.batch_size();
  auto order = epoch_order(p.pid(), epoch, n);
  double total = 0;
  int64_t batches = 0;
  for (int64_t b = 0; b < n; b += bs, ++batches) {
    auto idx = order.narrow(0, b, std::min(bs, n - b));
    // Data stays on the host; each batch goes to the particle's device (a no-op on CPU lanes).
    const double loss = sgd_step(p, x.index_select(0, idx).to(p.device()), y.index_select(0, idx).to(p.device()),
                                 dataset_size_, step);
    if (auto* r = replica(p.pid())) {
      r->note_loss(loss);  // every rank learns of it at the epoch's end (a rank alone would leave the others waiting)
    } else {
      check_finite(p, epoch, loss);
    }
    total += loss;
    if (after_step) after_step();
  }
  // Data-parallel: checked after the epoch's end has made every rank's parameters equal.
  if (replica(p.pid()) == nullptr) check_parameters_finite(p, epoch);
  return total / static_cast<double>(batches);
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
  return at::make_generator<at::CPUGeneratorImpl>(push::detail::mix_seed(options_.seed(), a, b, c));
}

void Infer::save(const std::filesystem::path& dir) {
  ensure_created();
  // With a world every step ends with every rank knowing whether all got through it.
  std::exception_ptr error;
  try {
    std::filesystem::create_directories(dir);
  } catch (...) {
    error = std::current_exception();
  }
  exchange({}, error, "push::bayes::Infer::save (folder)");
  dist_->save(dir / "particles");  // collective with a world
  // One rank writes the algorithm's own state (the same on every rank).
  if (dist_->rank() == 0) {
    try {
      write_meta(dir);
    } catch (...) {
      error = std::current_exception();
    }
  }
  exchange({}, error, "push::bayes::Infer::save");
}

void Infer::write_meta(const std::filesystem::path& dir) const {
  auto meta = dir / "infer.meta";
  auto tmp = dir / "infer.meta.tmp";
  {
    std::ofstream out(tmp);
    PUSH_CHECK(out, "push::bayes::Infer::save", "cannot write ", tmp);
    out << std::setprecision(17) << "algorithm " << name() << "\nparticles " << options_.particles()
        << "\nepochs " << epochs_done_ << "\nlosses";
    for (double l : losses_) out << ' ' << l;
    out << "\n";
    // close() flushes: a full disk shows up there, not in good() before it.
    out.close();
    PUSH_CHECK(!out.fail(), "push::bayes::Infer::save", "cannot write ", tmp, ": ", std::strerror(errno));
  }
  std::filesystem::rename(tmp, meta);
}

void Infer::load(const std::filesystem::path& dir) {
  const char* origin = "push::bayes::Infer::load";
  ensure_created();
  int64_t epochs = -1;
  std::vector<double> losses;
  std::exception_ptr error;
  try {
    read_meta(dir, epochs, losses);
  } catch (...) {
    error = std::current_exception();
  }
  exchange({}, error, origin);  // every rank read the same checkpoint, or all throw
  dist_->load(dir / "particles");
  epochs_done_ = epochs;
  losses_ = std::move(losses);
}

void Infer::read_meta(const std::filesystem::path& dir, int64_t& epochs, std::vector<double>& losses) const {
  const char* origin = "push::bayes::Infer::load";
  std::ifstream in(dir / "infer.meta");
  PUSH_CHECK(in, origin, "no checkpoint at ", dir, " (missing infer.meta)");
  std::string key, algorithm;
  int64_t particles = -1;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ls >> key;
    if (key == "algorithm") ls >> algorithm;
    if (key == "particles") ls >> particles;
    if (key == "epochs") ls >> epochs;
    if (key == "losses") {
      double l;
      while (ls >> l) losses.push_back(l);
    }
  }
  PUSH_CHECK(algorithm == name(), origin, "checkpoint ", dir, " holds algorithm '", algorithm, "', not '", name(),
             "'");
  PUSH_CHECK(particles == options_.particles(), origin, "checkpoint ", dir, " holds ", particles,
             " particles, not ", options_.particles());
  PUSH_CHECK(epochs >= 0 && static_cast<int64_t>(losses.size()) == epochs, origin, "checkpoint ", dir,
             " has a damaged infer.meta");
}

// ---- Ensemble ---------------------------------------------------------------------------

Ensemble::Ensemble(ModuleFactory model, InferOptions options, EnsembleOptions ensemble)
    : Infer(std::move(model), std::move(options)), ensemble_(ensemble) {}

ParticleOptions Ensemble::particle_options() { return ParticleOptions(); }

torch::Tensor Ensemble::epoch_rows(Particle& p, int64_t n) const {
  if (!ensemble_.bootstrap()) return {};
  // The same resample every epoch: the particle's own view of the data.
  return torch::randint(n, {n}, generator(p.pid(), seed_purpose::kBootstrap), torch::kLong);
}

}  // namespace push::bayes
