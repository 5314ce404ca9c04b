// Last-layer Laplace: the GGN of the last Linear layer, the prior precision by marginal
// likelihood, and the linearised and sampling predictives (push/bayes/laplace.h).
#include <push/bayes/laplace.h>
#include <push/bayes/randomized_prior.h>

#include <torch/torch.h>

#include <cmath>
#include <numbers>
#include "core/seed.h"

namespace push::bayes {
namespace {

constexpr const char* kOrigin = "push::bayes::Laplace";

/// The network's parts: every module but the last (the features), and the last Linear.
struct Parts {
  torch::nn::SequentialImpl* body = nullptr;
  std::shared_ptr<torch::nn::LinearImpl> last;
};

Parts parts_of(torch::nn::Module& network) {
  Parts p;
  PUSH_CHECK(dynamic_cast<RandomizedPriorImpl*>(&network) == nullptr, kOrigin,
             "the last-layer Laplace does not take a randomized prior: the network's output is a sum with the prior "
             "network's, not its last layer's");
  // A factory's Sequential arrives wrapped (push::SequentialNet, runtime/types.h).
  auto* wrapped = dynamic_cast<SequentialNetImpl*>(&network);
  p.body = wrapped ? wrapped->layers().get() : dynamic_cast<torch::nn::SequentialImpl*>(&network);
  PUSH_CHECK(p.body != nullptr && p.body->size() >= 1, kOrigin,
             "the last-layer Laplace needs a Sequential network ending in a Linear layer, got a ", network.name());
  p.last = std::dynamic_pointer_cast<torch::nn::LinearImpl>(p.body->ptr(p.body->size() - 1));
  PUSH_CHECK(p.last != nullptr, kOrigin, "the network's last module is a ", p.body->ptr(p.body->size() - 1)->name(),
             ", not a Linear layer: the last-layer Laplace has no last layer to approximate");
  return p;
}

/// push::Error unless a `structure` covariance of `P` last-layer parameters is kept.
void check_size(int64_t P, LaplaceStructure structure) {
  PUSH_CHECK(structure != LaplaceStructure::full || P <= kMaxFullParameters, kOrigin,
             "a full covariance of the last layer's ", P, " parameters is too large (at most ", kMaxFullParameters,
             "): use the diagonal structure");
}

/// [φ(x), 1] in float64, [M, h + 1], without a graph.
torch::Tensor features(const Parts& parts, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> chunks;
  for (int64_t b = 0; b < x.size(0); b += 1024) {
    auto h = x.narrow(0, b, std::min<int64_t>(1024, x.size(0) - b));
    auto it = parts.body->begin();
    for (size_t i = 0; i + 1 < parts.body->size(); ++i, ++it) h = it->forward(h);
    chunks.push_back(h.reshape({h.size(0), -1}).to(torch::kCPU, torch::kFloat64));
  }
  auto phi =
      chunks.empty() ? torch::zeros({0, parts.last->options.in_features()}, torch::kFloat64) : torch::cat(chunks);
  return torch::cat({phi, torch::ones({phi.size(0), 1}, phi.options())}, 1);
}

/// The last layer's outputs at features `phi` for θ [o, h + 1].
torch::Tensor outputs(const torch::Tensor& phi, const torch::Tensor& theta) { return phi.mm(theta.t()); }

/// The likelihood's Fisher in the outputs at each point: [N, o, o].
torch::Tensor output_fisher(const torch::Tensor& out, const Objective& u, double noise_std) {
  const int64_t n = out.size(0), o = out.size(1);
  switch (u.likelihood()) {
    case Likelihood::gaussian:
      return torch::eye(o, out.options()).expand({n, o, o}) / (noise_std * noise_std);
    case Likelihood::heteroscedastic: {
      const int64_t t = o / 2;
      auto v = out.narrow(1, t, t);
      auto s = heteroscedastic_variance(v);
      auto diag = torch::cat({1 / s, torch::sigmoid(v).pow(2) / (2 * s * s)}, 1);
      return torch::diag_embed(diag);
    }
    case Likelihood::categorical: {
      auto p = torch::softmax(out, 1);
      return torch::diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1);
    }
    case Likelihood::learned_noise:
      break;
  }
  throw Error(c10::str("[", kOrigin, "] the last-layer Laplace does not take the learned_noise likelihood"));
}

/// log p(D | δ) up to the data term: P/2 log δ - δ/2 |θ|² - 1/2 Σ log(gᵢ + δ), gᵢ the
/// GGN's eigenvalues; and its derivative in δ, which falls as δ grows.
double lml_slope(const torch::Tensor& g, double norm2, double delta) {
  return static_cast<double>(g.numel()) / (2 * delta) - norm2 / 2 - 0.5 * (1 / (g + delta)).sum().item<double>();
}
double lml_prior_part(const torch::Tensor& g, double norm2, double delta) {
  return static_cast<double>(g.numel()) / 2 * std::log(delta) - delta * norm2 / 2 -
         0.5 * torch::log(g + delta).sum().item<double>();
}

}  // namespace

int64_t last_layer_parameters(const ModuleFactory& model) {
  PUSH_CHECK(model != nullptr, kOrigin, "the model factory is empty");
  auto scratch = model();
  PUSH_CHECK(!scratch.is_empty(), kOrigin, "the model factory returned an empty module");
  const Parts parts = parts_of(*scratch.ptr());
  return parts.last->options.out_features() * (parts.last->options.in_features() + 1);
}

LaplaceBytes laplace_bytes(int64_t parameters, LaplaceStructure structure) {
  const double P = static_cast<double>(parameters), f64 = 8;
  if (structure == LaplaceStructure::diagonal) return {2 * P * f64, P * f64};
  // Kept: the mean and the covariance. Fitting: the GGN, eigvalsh's copy of it, the
  // precision and its Cholesky factor, live together before the inverse is taken.
  return {(P * P + P) * f64, 4 * P * P * f64};
}

const char* to_string(LaplaceStructure s) { return s == LaplaceStructure::full ? "full" : "diagonal"; }
const char* to_string(LaplacePredictive p) { return p == LaplacePredictive::linearized ? "linearized" : "sampling"; }

LastLayerPosterior last_layer_laplace(torch::nn::Module& network, const torch::Tensor& x, const torch::Tensor& y,
                                      const Objective& objective, const LaplaceOptions& options) {
  const Parts parts = parts_of(network);
  PUSH_CHECK(x.size(0) > 0 && x.size(0) == y.size(0), kOrigin, "needs training data: ", x.size(0), " inputs, ",
             y.size(0), " targets");
  const auto phi = features(parts, x);  // [N, h + 1]
  torch::Tensor theta;                  // [o, h + 1]
  {
    torch::NoGradGuard no_grad;
    theta = torch::cat({parts.last->weight, parts.last->bias.defined() ? parts.last->bias.unsqueeze(1)
                                                                       : torch::zeros({parts.last->weight.size(0), 1},
                                                                                      parts.last->weight.options())},
                       1)
                .to(torch::kCPU, torch::kFloat64);
  }
  const int64_t o = theta.size(0), h1 = theta.size(1), P = o * h1;
  const bool full = options.structure() == LaplaceStructure::full;
  check_size(P, options.structure());
  const auto out = outputs(phi, theta);
  const auto fisher = output_fisher(out, objective, objective.noise_std());  // [N, o, o]
  // G[(k,i),(l,j)] = Σₙ Λₙ[k,l] φ̃ₙ[i] φ̃ₙ[j]: one product per pair of outputs the Fisher couples.
  torch::Tensor ggn;
  if (full) {
    ggn = torch::zeros({o, h1, o, h1}, phi.options());
    for (int64_t k = 0; k < o; ++k) {
      for (int64_t l = 0; l < o; ++l) {
        auto w = fisher.select(1, k).select(1, l);  // [N]
        if (k != l && objective.likelihood() != Likelihood::categorical) continue;
        ggn.select(0, k).select(1, l).copy_((phi * w.unsqueeze(1)).t().mm(phi));
      }
    }
    ggn = ggn.reshape({P, P});
  } else {
    ggn = fisher.diagonal(0, 1, 2).t().mm(phi.pow(2)).reshape({P});  // [o, h+1] -> [P]
  }
  const auto mean = theta.reshape({P});
  const double norm2 = mean.pow(2).sum().item<double>();
  const auto g = full ? torch::linalg_eigvalsh(ggn).clamp_min(0) : ggn;
  double delta = 0;
  if (options.prior_precision()) {
    delta = *options.prior_precision();
    PUSH_CHECK(delta > 0 && std::isfinite(delta), kOrigin, "prior_precision must be positive and finite, got ", delta);
  } else {
    // Concave in δ: bisection on the sign of its slope, in log δ over [1e-8, 1e8].
    double lo = std::log(1e-8), hi = std::log(1e8);
    if (lml_slope(g, norm2, std::exp(hi)) > 0) {
      lo = hi;
    } else if (lml_slope(g, norm2, std::exp(lo)) < 0) {
      hi = lo;
    }
    for (int i = 0; i < 100 && hi - lo > 1e-10; ++i) {
      const double mid = (lo + hi) / 2;
      (lml_slope(g, norm2, std::exp(mid)) > 0 ? lo : hi) = mid;
    }
    delta = std::exp((lo + hi) / 2);
  }
  LastLayerPosterior post;
  post.mean = mean;
  post.prior_precision = delta;
  if (full) {
    auto precision = ggn + delta * torch::eye(P, ggn.options());
    post.covariance = torch::cholesky_inverse(torch::linalg_cholesky(precision));
  } else {
    post.covariance = 1 / (ggn + delta);
  }
  torch::Tensor nll_sum;
  {
    torch::NoGradGuard no_grad;
    nll_sum = objective.mean_nll(out, y.to(torch::kCPU).to(y.is_floating_point() ? torch::kFloat64 : torch::kLong)) *
              static_cast<double>(x.size(0));
  }
  post.log_marginal_likelihood = -nll_sum.item<double>() + lml_prior_part(g, norm2, delta);
  return post;
}

// -- the particles ---------------------------------------------------------------------------

namespace {

constexpr const char* kMean = "laplace_mean";  // [P] float64, host
constexpr const char* kCovariance = "laplace_covariance";
constexpr const char* kPrecision = "laplace_prior_precision";
constexpr const char* kEvidence = "laplace_log_marginal_likelihood";

}  // namespace

namespace {

/// `model` after a scratch network of it was checked to have a last layer the Laplace can
/// approximate under `options`: refused at construction, before any training.
ModuleFactory with_a_last_layer(ModuleFactory model, const LaplaceOptions& options) {
  check_size(last_layer_parameters(model), options.structure());
  return model;
}

}  // namespace

Laplace::Laplace(ModuleFactory model, InferOptions options, LaplaceOptions laplace, EnsembleOptions ensemble)
    : Ensemble(with_a_last_layer(std::move(model), laplace), std::move(options), ensemble), laplace_(laplace) {
  PUSH_CHECK(laplace_.samples() >= 1, kOrigin, "samples must be >= 1, got ", laplace_.samples());
  if (laplace_.prior_precision()) {
    PUSH_CHECK(*laplace_.prior_precision() > 0 && std::isfinite(*laplace_.prior_precision()), kOrigin,
               "prior_precision must be positive and finite, got ", *laplace_.prior_precision());
  }
  PUSH_CHECK(this->options().likelihood() != Likelihood::learned_noise, kOrigin,
             "the last-layer Laplace does not take the learned_noise likelihood");
}

ParticleOptions Laplace::particle_options() {
  return Ensemble::particle_options()
      .on("laplace_fit",
          [this](Particle& p, const Args& a) {
            const auto post = last_layer_laplace(p.module(), a.at(0).toTensor().to(p.device()),
                                                 a.at(1).toTensor().to(p.device()), objective(), laplace_);
            p.state()[kMean] = post.mean;
            p.state()[kCovariance] = post.covariance;
            p.state()[kPrecision] = post.prior_precision;
            p.state()[kEvidence] = post.log_marginal_likelihood;
            return c10::IValue();
          })
      .on("laplace_posterior", [](Particle& p, const Args&) {
        auto it = p.state().find(kMean);
        if (it == p.state().end()) return c10::IValue(c10::ivalue::Tuple::create({}));
        auto host = [&](const char* key) { return p.state().at(key).toTensor().to(torch::kCPU).clone(); };
        return c10::IValue(c10::ivalue::Tuple::create(
            {host(kMean), host(kCovariance), p.state().at(kPrecision), p.state().at(kEvidence)}));
      });
}

void Laplace::approximate(const data::Dataset& train) {
  const char* origin = "push::bayes::Laplace::approximate";
  PUSH_CHECK(train.size() > 0, origin, "the training set is empty");
  const bool classify = options().likelihood() == Likelihood::categorical;
  auto x = train.x.contiguous();
  auto y = classify ? train.y.to(torch::kLong).contiguous() : train.y.to(torch::kFloat32).contiguous();
  if (!classify && y.dim() == 1) y = y.unsqueeze(1);
  std::vector<PFuture> fs;
  for (Pid pid : distribution().local_particle_ids()) fs.push_back(distribution().p_launch(pid, "laplace_fit", x, y));
  std::exception_ptr error;
  try {
    distribution().p_wait(fs);
  } catch (...) {
    error = std::current_exception();
  }
  training().exchange({}, error, origin);  // every rank approximated its own, or all throw
}

LastLayerPosterior Laplace::posterior(Pid pid) {
  const auto reply = distribution().p_launch(pid, "laplace_posterior").wait();
  const auto& v = reply.toTupleRef().elements();
  LastLayerPosterior post;
  if (v.size() < 4) return post;
  post.mean = v[0].toTensor();
  post.covariance = v[1].toTensor();
  post.prior_precision = v[2].toDouble();
  post.log_marginal_likelihood = v[3].toDouble();
  return post;
}

torch::Tensor Laplace::predict_particle(Particle& p, const torch::Tensor& x) {
  auto it = p.state().find(kMean);
  if (it == p.state().end()) return Infer::predict_particle(p, x);  // not approximated: the MAP
  const Parts parts = parts_of(p.module());
  const auto phi = features(parts, x);
  const auto mean = it->second.toTensor().to(torch::kCPU, torch::kFloat64);
  const auto cov = p.state().at(kCovariance).toTensor().to(torch::kCPU, torch::kFloat64);
  const int64_t h1 = phi.size(1), o = mean.numel() / h1;
  const auto theta = mean.view({o, h1});
  const auto mu = outputs(phi, theta);  // [M, o]
  const auto dtype = parts.last->weight.scalar_type();
  if (laplace_.predictive() == LaplacePredictive::sampling) {
    auto gen = training().generator(static_cast<uint64_t>(p.pid()), push::detail::seed_purpose::kLaplace);
    auto z = torch::randn({laplace_.samples(), mean.numel()}, gen, mean.options());
    auto draws = cov.dim() == 2 ? mean + z.mm(torch::linalg_cholesky(cov).t()) : mean + z * cov.sqrt();
    std::vector<torch::Tensor> outs;
    for (int64_t s = 0; s < draws.size(0); ++s) outs.push_back(outputs(phi, draws[s].view({o, h1})));
    return torch::stack(outs).to(x.device(), dtype);
  }
  // Linearised: the variance of each output, φ̃ Σ_kk φ̃ᵀ.
  std::vector<torch::Tensor> variances;
  for (int64_t k = 0; k < o; ++k) {
    if (cov.dim() == 2) {
      auto block = cov.narrow(0, k * h1, h1).narrow(1, k * h1, h1);
      variances.push_back((phi.mm(block) * phi).sum(1));
    } else {
      variances.push_back(phi.pow(2).mv(cov.narrow(0, k * h1, h1)));
    }
  }
  const auto var = torch::stack(variances, 1).clamp_min(0);  // [M, o]
  if (options().likelihood() == Likelihood::categorical) {
    // The probit approximation of E[softmax(f)], f ~ N(μ, σ²) per logit.
    return (mu / torch::sqrt(1 + std::numbers::pi / 8 * var)).unsqueeze(0).to(x.device(), dtype);
  }
  // Regression: two members at μ ± σ on the mean outputs: their mixture has mean μ and
  // variance σ² (make_predictive's variance over members is the population's).
  const int64_t t = options().likelihood() == Likelihood::heteroscedastic ? o / 2 : o;
  auto sd = torch::zeros_like(mu);
  sd.narrow(1, 0, t).copy_(var.narrow(1, 0, t).sqrt());
  return torch::stack({mu + sd, mu - sd}).to(x.device(), dtype);
}

}  // namespace push::bayes
