// The Bayesian algorithms against closed forms: Bayesian linear regression (Gaussian
// prior, known noise) has posterior N(μ, Σ) with Σ = (XᵀX/σ² + I/σ_p²)⁻¹, μ = Σ Xᵀy/σ².
#include <push/bayes.h>
#include <push/metrics.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>
#include <regex>
#include <tuple>

#include "test_util.h"

namespace push::bayes {
namespace {

struct LinearProblem {
  data::Dataset data;
  torch::Tensor mean, cov;  // the exact posterior, float64
};

/// y = X w + σ ε with two strongly correlated features: a correlated 2-D posterior.
LinearProblem linear_problem(int64_t n, double noise, double prior_std, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x1 = torch::randn({n, 1}, gen, torch::kFloat64);
  auto x2 = 0.8 * x1 + 0.6 * torch::randn({n, 1}, gen, torch::kFloat64);
  auto x = torch::cat({x1, x2}, 1);
  auto w = torch::tensor({0.7, -0.4}, torch::kFloat64).view({2, 1});
  auto y = x.mm(w) + noise * torch::randn({n, 1}, gen, torch::kFloat64);
  LinearProblem p;
  p.data.x = x.to(torch::kFloat32);
  p.data.y = y.to(torch::kFloat32);
  auto precision = x.t().mm(x) / (noise * noise) + torch::eye(2, torch::kFloat64) / (prior_std * prior_std);
  p.cov = torch::inverse(precision);
  p.mean = p.cov.mm(x.t().mm(y)) / (noise * noise);
  return p;
}

ModuleFactory linear_model() {
  return [] { return torch::nn::AnyModule(torch::nn::Linear(torch::nn::LinearOptions(2, 1).bias(false))); };
}

OptimizerFactory sgd(double lr) {
  return [lr](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(lr));
  };
}

torch::Tensor particle_matrix(Push& dist) {
  std::vector<torch::Tensor> rows;
  for (Pid pid : dist.particle_ids()) rows.push_back(dist.p_parameters(pid)[0].view(-1));
  return torch::stack(rows).to(torch::kFloat64);
}

torch::Tensor covariance(const torch::Tensor& samples) {
  auto c = samples - samples.mean(0);
  return c.t().mm(c) / static_cast<double>(samples.size(0));
}

double rel_error(const torch::Tensor& a, const torch::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); }

// ---- SVGD -------------------------------------------------------------------------------

TEST(SVGD, DirectionRepelsParticlesWithoutGradient) {
  auto theta = torch::tensor({0.0, 0.0, 1.0, 0.0}, torch::kFloat64).view({2, 2});
  auto phi = svgd_direction(theta, torch::zeros_like(theta), 1.0);
  EXPECT_LT(phi[0][0].item<double>(), 0);  // particle 0 moves away from particle 1
  EXPECT_GT(phi[1][0].item<double>(), 0);
  // (1/n)(2/h)(θ_i - θ_j) k_ij with k = e^{-1}.
  EXPECT_NEAR(phi[1][0].item<double>(), 0.5 * 2 * std::exp(-1.0), 1e-12);
  EXPECT_TRUE(torch::equal(svgd_direction(theta, torch::zeros_like(theta), 1.0, false), torch::zeros_like(theta)));
}

/// Runs SVGD with svgd_direction alone on N(0, diag(variances)) from a spread-out start and
/// returns the particles' variance over the target's, per dimension.
torch::Tensor svgd_variance_ratio(const torch::Tensor& variances, int64_t n, BandwidthRule rule) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  auto theta = 0.5 + 1.5 * torch::randn({n, variances.numel()}, gen, torch::kFloat64);
  for (int step = 0; step < 3000; ++step) {
    theta = theta + 0.1 * svgd_direction(theta, -theta / variances, std::nullopt, true, rule);
  }
  return theta.var(0, /*unbiased=*/false) / variances;
}

// The bandwidth's effect on the spread, in closed form: on a Gaussian of 4 and 8 dimensions
// with 32 and 64 particles, h = med²/log(n+1) gives particles clearly narrower than the
// posterior; the default h = med² comes within about 10%.
TEST(SVGD, DefaultBandwidthMatchesGaussianVariance) {
  for (auto [dims, n] : {std::pair<int64_t, int64_t>{4, 32}, {8, 64}}) {
    auto variances = torch::logspace(-0.3, 0.6, dims, 10, torch::kFloat64);  // 0.5 .. 4
    auto by_default = svgd_variance_ratio(variances, n, SVGDOptions().bandwidth_rule());
    auto log_n = svgd_variance_ratio(variances, n, BandwidthRule::median_log_n);
    std::cout << dims << " dimensions, " << n << " particles: variance ratio " << by_default.mean().item<double>()
              << " (med²/log(n+1): " << log_n.mean().item<double>() << ")\n";
    EXPECT_GT(by_default.mean().item<double>(), 0.85) << by_default;
    EXPECT_GT(by_default.min().item<double>(), 0.75) << by_default;
    EXPECT_LT(by_default.max().item<double>(), 1.05) << by_default;
    EXPECT_LT(log_n.mean().item<double>(), 0.7) << log_n;
  }
}

SVGD make_svgd(const LinearProblem& p, int particles, bool repulsive, int devices = 1,
               std::optional<double> bandwidth = 1.0, double lr = 0.04) {
  // A fixed bandwidth of a few posterior variances, so that these tests check the update
  // itself; the bandwidth rules are measured in DefaultBandwidthMatchesGaussianVariance.
  return SVGD(linear_model(),
              InferOptions()
                  .particles(particles)
                  .distribution(PushOptions().devices(devices).cache_size(particles).seed(3))
                  .noise_std(1.0)
                  .prior_std(1.0)
                  .batch_size(p.data.size())
                  .optimizer(sgd(lr)),
              SVGDOptions().bandwidth(bandwidth).repulsive(repulsive));
}

TEST(SVGD, RecoversCorrelatedGaussianPosterior) {
  auto p = linear_problem(20, 1.0, 1.0, 11);
  ASSERT_LT((p.cov[0][1] / (p.cov[0][0] * p.cov[1][1]).sqrt()).item<double>(), -0.5);  // correlated
  // Under a sanitizer 20 particles for 250 steps (testing::scaled): TSan made 40 x 500 take 84 s.
  auto svgd = make_svgd(p, testing::scaled(40, 20, 2), true, 2);
  svgd.fit(p.data, testing::scaled(500, 250, 2));
  auto theta = particle_matrix(svgd.distribution());
  auto scale = p.cov.trace().sqrt();
  EXPECT_LT(((theta.mean(0) - p.mean.view(-1)).norm() / scale).item<double>(), 0.03)
      << theta.mean(0) << " vs " << p.mean.view(-1);
  // 20 particles (sanitizer builds) underestimate the covariance by ~7%, 40 by under 5%.
  EXPECT_LT(rel_error(covariance(theta), p.cov), testing::sanitized() ? 0.1 : 0.05)
      << covariance(theta) << " vs " << p.cov;
}

TEST(SVGD, CollapsesWithoutRepulsion) {
  auto p = linear_problem(20, 1.0, 1.0, 11);
  // The median heuristic scales the kernel with the spread, so the attraction keeps
  // its strength as the particles close in. Once they coincide (k = 1 everywhere) each
  // moves by the mean gradient, n times its own share: lr 0.04 times the posterior's
  // largest precision (65 here) is then past SGD's limit of 2, and where the collapse
  // lands depends on rounding (it diverged on one CPU's kernels, not another's). At 0.02
  // (x 65 = 1.3) the collapsed particles descend stably, and within the sanitizers' 300
  // steps.
  auto svgd = make_svgd(p, 10, false, 1, std::nullopt, 0.02);
  svgd.fit(p.data, testing::scaled(600, 300, 2));
  auto theta = particle_matrix(svgd.distribution());
  // Every particle climbs to the mode: the spread vanishes, the mean is the MAP.
  EXPECT_LT(covariance(theta).trace().item<double>(), 1e-3 * p.cov.trace().item<double>());
  EXPECT_LT((theta.mean(0) - p.mean.view(-1)).norm().item<double>(), 0.01 * p.cov.trace().sqrt().item<double>());
}

TEST(SVGD, PosteriorMeanOfLinearRegressionWithMinibatches) {
  auto p = linear_problem(256, 0.5, 1.0, 5);
  SVGD svgd(linear_model(),
            InferOptions()
                .particles(16)
                .distribution(PushOptions().devices(2).seed(1))
                .noise_std(0.5)
                .batch_size(64)
                .lr(1e-2),
            SVGDOptions());  // median heuristic, Adam, minibatches
  svgd.fit(p.data, 100);
  auto theta = particle_matrix(svgd.distribution());
  auto sd = p.cov.diagonal().sqrt();
  EXPECT_LT(((theta.mean(0) - p.mean.view(-1)).abs() / sd).max().item<double>(), 0.5)
      << theta.mean(0) << " vs " << p.mean.view(-1) << " (posterior sd " << sd << ")";
}

TEST(SVGD, SameSeedSameResultOnAnyNumberOfLanes) {
  auto p = linear_problem(40, 1.0, 1.0, 2);
  auto a = make_svgd(p, 6, true, 1), b = make_svgd(p, 6, true, 3);
  a.fit(p.data, 5);
  b.fit(p.data, 5);
  EXPECT_TRUE(torch::equal(particle_matrix(a.distribution()), particle_matrix(b.distribution())));
}

TEST(SVGD, SameResultWithParticlesSwappedOutOfTheCache) {
  auto p = linear_problem(40, 1.0, 1.0, 4);
  auto make = [&](int cache) {
    return SVGD(linear_model(), InferOptions()
                                    .particles(5)
                                    .distribution(PushOptions().devices(2).cache_size(cache).seed(2))
                                    .batch_size(10)
                                    .lr(1e-2));
  };
  auto all = make(5), swapped = make(1);  // one resident particle per lane: every message swaps
  all.fit(p.data, 3);
  swapped.fit(p.data, 3);
  EXPECT_TRUE(torch::equal(particle_matrix(all.distribution()), particle_matrix(swapped.distribution())));
  EXPECT_GT(swapped.distribution().cache_stats(0).restores, 0);
}

// Data whose noise is σ = 0.3, not the fixed likelihood's 1: learning the noise precision
// per particle (Liu & Wang's SVGD network) finds σ and gives a far better test NLL.
TEST(SVGD, LearnedNoiseBeatsFixedNoiseOnTestNll) {
  auto train = linear_problem(128, 0.3, 1.0, 21).data, test = linear_problem(256, 0.3, 1.0, 22).data;
  auto fit = [&](Likelihood likelihood) {
    SVGD svgd(linear_model(), InferOptions()
                                  .particles(8)
                                  .distribution(PushOptions().devices(2).seed(3))
                                  .likelihood(likelihood)
                                  .batch_size(64)
                                  .lr(0.05));
    svgd.fit(train, 150);
    return svgd.predict(test.x);
  };
  auto fixed = fit(Likelihood::gaussian), learned = fit(Likelihood::learned_noise);
  auto nll = [&](const Predictive& p) { return metrics::gaussian_nll(p.mean, p.variance, test.y); };
  const double exact = 0.5 * std::log(2 * std::numbers::pi * 0.09) + 0.5;  // the true model's NLL
  EXPECT_NEAR(learned.aleatoric.mean().item<double>(), 0.09, 0.03);        // σ² = 0.09 found
  EXPECT_LT(nll(learned), exact + 0.1);
  EXPECT_GT(nll(fixed), exact + 0.5) << "σ = 1 is 3x too wide";
  EXPECT_EQ(to_string(Likelihood::learned_noise), std::string("learned-noise"));
}

// ---- MultiSWAG --------------------------------------------------------------------------

TEST(MultiSWAG, PosteriorMeanOfLinearRegression) {
  auto p = linear_problem(512, 0.5, 1.0, 7);
  MultiSWAG swag(linear_model(),
                 InferOptions()
                     .particles(4)
                     .distribution(PushOptions().devices(2).seed(4))
                     .noise_std(0.5)
                     .batch_size(32)
                     .optimizer(sgd(0.02)),
                 SWAGOptions().pretrain_epochs(20).rank(5).collect_every_steps(4).samples(50));
  swag.fit(p.data, 60);
  auto sd = p.cov.diagonal().sqrt();
  torch::Tensor mean = torch::zeros({2}, torch::kFloat64);
  for (Pid pid : swag.distribution().particle_ids()) mean += swag.moments(pid).mean / 4.0;
  EXPECT_LT(((mean - p.mean.view(-1)).abs() / sd).max().item<double>(), 0.3)
      << mean << " vs " << p.mean.view(-1) << " (posterior sd " << sd << ")";
  // The predictive mean at x is the mean over sampled weights: close to x·μ.
  auto x = torch::tensor({1.0f, -1.0f, 0.5f, 2.0f}).view({2, 2});
  auto exact = x.to(torch::kFloat64).mm(p.mean);
  auto pred = swag.predict(x);
  EXPECT_EQ(pred.members.size(0), 4 * 50);
  EXPECT_LT((pred.mean - exact).abs().max().item<double>(), 0.05);
}

TEST(MultiSWAG, MomentsAreRunningAveragesOfTheTrajectory) {
  auto p = linear_problem(64, 0.5, 1.0, 9);
  const int64_t pretrain = 2, rank = 3;
  MultiSWAG swag(
      linear_model(),
      InferOptions().particles(2).distribution(PushOptions().devices(2)).noise_std(0.5).batch_size(16).lr(0.05),
      SWAGOptions().pretrain_epochs(pretrain).rank(rank));
  std::map<Pid, std::vector<torch::Tensor>> trajectory;
  for (int e = 0; e < 7; ++e) {
    swag.fit(p.data, 1);
    if (e >= pretrain) {
      for (Pid pid : swag.distribution().particle_ids()) {
        trajectory[pid].push_back(swag.distribution().p_parameters(pid)[0].view(-1).to(torch::kFloat64));
      }
    }
  }
  for (auto& [pid, thetas] : trajectory) {
    auto m = swag.moments(pid);
    const auto n = static_cast<int64_t>(thetas.size());
    EXPECT_EQ(m.count, n) << "each particle counts only its own collections";
    auto stacked = torch::stack(thetas);
    EXPECT_TRUE(torch::allclose(m.mean, stacked.mean(0), 1e-6, 1e-9));
    EXPECT_TRUE(torch::allclose(m.sq_mean, stacked.pow(2).mean(0), 1e-6, 1e-9));
    ASSERT_EQ(m.deviations.size(0), rank);
    for (int64_t k = 0; k < rank; ++k) {
      const int64_t i = n - rank + k;  // deviation of iterate i from the mean of 0..i
      auto expected = thetas[i] - stacked.narrow(0, 0, i + 1).mean(0);
      EXPECT_TRUE(torch::allclose(m.deviations[k], expected, 1e-6, 1e-9)) << "deviation " << k;
    }
  }
  EXPECT_FALSE(torch::equal(swag.moments(0).mean, swag.moments(1).mean));
}

TEST(MultiSWAG, SamplesFollowTheFormula) {
  SWAGMoments m;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  for (int i = 0; i < 30; ++i) MultiSWAG::collect(m, torch::randn({3}, gen, torch::kFloat64), 30);
  auto draw = at::make_generator<at::CPUGeneratorImpl>(2);
  auto s = MultiSWAG::sample(m, 20000, 1e-30, draw);
  // Cov = (diag(var) + D Dᵀ/(K-1)) / 2.
  auto var = m.sq_mean - m.mean.pow(2);
  auto expected = (torch::diag(var) + m.deviations.t().mm(m.deviations) / 29.0) / 2;
  EXPECT_LT(rel_error(s.mean(0), m.mean), 0.05);
  EXPECT_LT(rel_error(covariance(s), expected), 0.05);
}

TEST(MultiSWAG, DiagonalOnlySamplesHaveTheDiagonalVariance) {
  // rank 1 keeps one deviation: no low-rank part, so θ = θ̄ + Σ_diag^{1/2} z₁ (SWAG-diagonal,
  // Maddox et al. 2019), without the 1/√2 that only splits the variance between the two parts.
  SWAGMoments m;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int i = 0; i < 30; ++i) MultiSWAG::collect(m, torch::randn({4}, gen, torch::kFloat64) * 2, /*rank=*/1);
  ASSERT_EQ(m.deviations.size(0), 1);
  auto draw = at::make_generator<at::CPUGeneratorImpl>(4);
  auto s = MultiSWAG::sample(m, 20000, 1e-30, draw);
  auto var = m.sq_mean - m.mean.pow(2);
  EXPECT_LT(rel_error(s.var(0, /*unbiased=*/false), var), 0.05) << s.var(0) << " vs " << var;
  EXPECT_LT(rel_error(covariance(s), torch::diag(var)), 0.05);
}

// SWAG's Gaussian describes the iterates of SGD at a constant learning rate, so MultiSWAG
// collects with SGD and momentum 0.9 (as in the SWAG paper) whatever the pretraining
// optimizer: collecting from epoch 0 with the default Adam(lr) takes the same steps as a
// particle whose own optimizer is SGD(lr (1 - 0.9), momentum 0.9).
TEST(MultiSWAG, CollectsWithSGDAndMomentum) {
  auto p = linear_problem(64, 0.5, 1.0, 9);
  auto sgd_momentum = [](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(0.1 * (1 - 0.9)).momentum(0.9));
  };
  auto options =
      InferOptions().particles(2).distribution(PushOptions().devices(2)).noise_std(0.5).batch_size(16).lr(0.1);
  MultiSWAG by_default(linear_model(), options, SWAGOptions().pretrain_epochs(0).rank(2));
  MultiSWAG reference(linear_model(), InferOptions(options).optimizer(sgd_momentum),
                      SWAGOptions().pretrain_epochs(0).rank(2).collect_momentum(std::nullopt));
  by_default.fit(p.data, 3);
  reference.fit(p.data, 3);
  EXPECT_TRUE(torch::equal(particle_matrix(by_default.distribution()), particle_matrix(reference.distribution())));
  EXPECT_TRUE(torch::equal(by_default.moments(1).mean, reference.moments(1).mean));
  // The momentum is saved with the particle: a resumed collection continues it.
  auto dir = std::filesystem::temp_directory_path() / ("push_swag_momentum_" + std::to_string(::getpid()));
  by_default.save(dir);
  MultiSWAG resumed(linear_model(), options, SWAGOptions().pretrain_epochs(0).rank(2));
  resumed.load(dir);
  std::filesystem::remove_all(dir);
  by_default.fit(p.data, 1);
  resumed.fit(p.data, 1);
  EXPECT_TRUE(torch::equal(particle_matrix(by_default.distribution()), particle_matrix(resumed.distribution())));
}

// A run saved during collection and resumed on a GPU lane: the loaded moments come back on
// the device and must still mix with the host-side θ.
TEST(MultiSWAG, ResumesCollectingOnTheGpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto p = linear_problem(64, 0.5, 1.0, 9);
  auto make = [&] {
    return MultiSWAG(
        linear_model(),
        InferOptions().particles(2).distribution(PushOptions().seed(2)).noise_std(0.5).batch_size(16).lr(0.01),
        SWAGOptions().pretrain_epochs(1).rank(3).samples(4));
  };
  auto straight = make(), first = make();
  straight.fit(p.data, 5);
  first.fit(p.data, 3);
  auto dir = std::filesystem::temp_directory_path() / ("push_swag_cuda_" + std::to_string(::getpid()));
  first.save(dir);
  auto resumed = make();
  resumed.load(dir);
  resumed.fit(p.data, 2);
  std::filesystem::remove_all(dir);
  for (Pid pid : straight.distribution().particle_ids()) {
    auto a = straight.moments(pid), b = resumed.moments(pid);
    EXPECT_EQ(a.count, b.count);
    EXPECT_EQ(b.mean.device(), torch::Device(torch::kCPU));
    EXPECT_TRUE(torch::allclose(a.mean, b.mean, 1e-5, 1e-7));
    EXPECT_TRUE(torch::allclose(a.deviations, b.deviations, 1e-5, 1e-7));
  }
  auto x = torch::tensor({1.0f, -1.0f, 0.5f, 2.0f}).view({2, 2});
  EXPECT_TRUE(torch::allclose(straight.predict(x).mean, resumed.predict(x).mean, 1e-5, 1e-7));
}

// ---- ensemble, MC dropout, prediction ----------------------------------------------------

TEST(Ensemble, PredictiveMeanIsTheAverageOfMembers) {
  auto d = data::synthetic_gap(64, 1);
  auto model = make_model("mlp:8", {1}, 2);
  Ensemble ens(model,
               InferOptions()
                   .particles(3)
                   .distribution(PushOptions().devices(2))
                   .likelihood(Likelihood::heteroscedastic)
                   .lr(1e-2),
               EnsembleOptions().bootstrap(true));
  ens.fit(d, 3);
  ASSERT_EQ(ens.losses().size(), 3u);
  auto x = torch::linspace(-5, 5, 11).unsqueeze(1);
  auto pred = ens.predict(x);
  std::vector<torch::Tensor> means, vars;
  for (Pid pid : ens.distribution().particle_ids()) {
    auto net = model();
    auto params = ens.distribution().p_parameters(pid);
    auto mine = net.ptr()->parameters();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) mine[i].copy_(params[i]);
    auto out = net.forward(x).to(torch::kFloat64);
    means.push_back(out.narrow(1, 0, 1));
    vars.push_back(torch::softplus(out.narrow(1, 1, 1)) + 1e-6);
  }
  auto m = torch::stack(means), v = torch::stack(vars);
  EXPECT_TRUE(torch::allclose(pred.mean, m.mean(0), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(pred.aleatoric, v.mean(0), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(pred.variance, v.mean(0) + m.var(0, false), 1e-5, 1e-6));
}

TEST(Ensemble, ClassificationProbabilitiesAverageSoftmax) {
  auto outputs = torch::tensor({0.0, 0.0, 2.0, 0.0}, torch::kFloat64).view({2, 1, 2});
  auto p = make_predictive(outputs, Likelihood::categorical, 1.0);
  const double s = 1 / (1 + std::exp(-2.0));
  EXPECT_NEAR(p.probs[0][0].item<double>(), (0.5 + s) / 2, 1e-12);
  EXPECT_NEAR(p.probs.sum().item<double>(), 1.0, 1e-12);
}

TEST(Ensemble, ReproducibleAcrossLaneCountsAndSaveLoad) {
  auto d = data::synthetic_gap(64, 2);
  auto make = [&](int devices) {
    return Ensemble(make_model("mlp:8", {1}, 1),
                    InferOptions().particles(4).distribution(PushOptions().devices(devices).seed(9)),
                    EnsembleOptions().bootstrap(true));
  };
  auto a = make(1), b = make(2);
  a.fit(d, 2);
  b.fit(d, 2);
  auto x = torch::linspace(-2, 2, 5).unsqueeze(1);
  EXPECT_TRUE(torch::equal(a.predict(x).mean, b.predict(x).mean));
  auto dir = std::filesystem::temp_directory_path() / ("push_bayes_ckpt_" + std::to_string(::getpid()));
  a.save(dir);
  auto c = make(1);
  c.load(dir);
  EXPECT_EQ(c.epochs_done(), 2);
  EXPECT_TRUE(torch::equal(a.predict(x).mean, c.predict(x).mean));
  a.fit(d, 1);
  c.fit(d, 1);  // resumes with the same shuffles: the same third epoch
  EXPECT_TRUE(torch::equal(a.predict(x).mean, c.predict(x).mean));
  MCDropout other(make_model("mlp:8", {1}, 1, 0.1), InferOptions().particles(4));
  EXPECT_PUSH_ERROR(other.load(dir), "holds algorithm 'ensemble'");
  Ensemble fewer(make_model("mlp:8", {1}, 1), InferOptions().particles(2));
  EXPECT_PUSH_ERROR(fewer.load(dir), "holds 4 particles");
  // infer.meta is sealed: an edited epoch count (or loss) is named, not resumed.
  {
    std::ifstream in(dir / "infer.meta");
    std::string meta((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    meta.replace(meta.find("epochs 2"), 8, "epochs 1");
    std::ofstream(dir / "infer.meta", std::ios::trunc) << meta;
  }
  auto edited = make(1);
  EXPECT_PUSH_ERROR(edited.load(dir), "infer.meta fails its checksum");
  std::filesystem::remove_all(dir);
}

TEST(MCDropout, SamplesDifferButRunsRepeat) {
  auto d = data::synthetic_gap(64, 3);
  auto make = [&](int devices) {
    return MCDropout(make_model("mlp:16,16", {1}, 1, 0.2),
                     InferOptions().particles(2).distribution(PushOptions().devices(devices).seed(5)),
                     McDropoutOptions().samples(8));
  };
  auto a = make(1), b = make(2);
  a.fit(d, 2);
  b.fit(d, 2);
  auto x = torch::linspace(-2, 2, 7).unsqueeze(1);
  auto pa = a.predict(x), pb = b.predict(x);
  EXPECT_EQ(pa.members.size(0), 16);
  EXPECT_TRUE(torch::equal(pa.members, pb.members));
  EXPECT_GT(pa.variance.min().item<double>(), 1.0);  // noise_std 1 + dropout's spread
  EXPECT_GT(pa.members.var(0).mean().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(pa.members, a.predict(x).members));
}

// The dropout generator is a CPU one; on a GPU the masks are drawn on the host and moved,
// so they are the same as on the CPU, and MC dropout trains and predicts on GPU lanes.
TEST(MCDropout, MasksAndTrainingOnTheGpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Dropout dropout(0.5);
  auto ones = torch::ones({64, 16});
  dropout->reseed(7);
  auto host = dropout(ones);
  dropout->reseed(7);
  auto device = dropout(ones.to(torch::kCUDA));
  EXPECT_EQ(device.device().type(), torch::kCUDA);
  EXPECT_TRUE(torch::equal(host, device.cpu()));

  auto d = data::synthetic_gap(64, 3);
  MCDropout mc(make_model("mlp:16,16", {1}, 1, 0.2), InferOptions().particles(2).distribution(PushOptions().seed(5)),
               McDropoutOptions().samples(8));
  mc.fit(d, 2);
  auto x = torch::linspace(-2, 2, 7).unsqueeze(1);
  auto pred = mc.predict(x);
  EXPECT_EQ(pred.members.size(0), 16);
  EXPECT_TRUE(torch::isfinite(pred.variance).all().item<bool>());
  EXPECT_GT(pred.members.var(0).mean().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(pred.members, mc.predict(x).members));
}

}  // namespace
}  // namespace push::bayes
