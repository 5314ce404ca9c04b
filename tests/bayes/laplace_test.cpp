// The last-layer Laplace approximation (push/bayes/laplace.h): exact where the last layer
// is linear-Gaussian, a better calibrated classifier than its MAP, and bad input named.
#include <push/bayes.h>
#include <push/metrics.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>

#include "test_util.h"

namespace push::bayes {
namespace {

torch::nn::Sequential small_net() {
  return torch::nn::Sequential(torch::nn::Linear(1, 4), torch::nn::Tanh(), torch::nn::Linear(4, 1));
}

data::Dataset wave(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  data::Dataset d;
  d.x = torch::rand({n, 1}, gen) * 6 - 3;
  d.y = torch::sin(d.x) + 0.3 * torch::randn({n, 1}, gen);
  return d;
}

TEST(Laplace, WithAGaussianLikelihoodItIsTheExactPosteriorOfTheLastLayer) {
  torch::manual_seed(3);
  auto net = small_net();
  const auto d = wave(200, 1);
  const double sigma = 0.3, delta = 2.0;
  // The exact posterior of the last layer given the features: Bayesian linear regression.
  torch::Tensor phi;
  {
    torch::NoGradGuard no_grad;
    phi = torch::tanh(net[0]->as<torch::nn::Linear>()->forward(d.x)).to(torch::kFloat64);
  }
  phi = torch::cat({phi, torch::ones({phi.size(0), 1}, phi.options())}, 1);
  const auto cov = torch::linalg_inv(phi.t().mm(phi) / (sigma * sigma) + delta * torch::eye(5, phi.options()));
  const auto mean = cov.mm(phi.t().mm(d.y.to(torch::kFloat64)) / (sigma * sigma)).reshape({5});
  {
    torch::NoGradGuard no_grad;  // the MAP of this objective is the posterior mean
    auto last = net[2]->as<torch::nn::Linear>();
    last->weight.copy_(mean.narrow(0, 0, 4).view({1, 4}));
    last->bias.copy_(mean.narrow(0, 4, 1));
  }
  const Objective u(InferOptions().noise_std(sigma));
  const auto post = last_layer_laplace(*net, d.x, d.y, u, LaplaceOptions().prior_precision(delta));
  EXPECT_TRUE(torch::allclose(post.mean, mean, 0, 1e-6));
  EXPECT_TRUE(torch::allclose(post.covariance, cov, 1e-4, 1e-10)) << post.covariance << cov;
  const auto diag = last_layer_laplace(*net, d.x, d.y, u,
                                       LaplaceOptions().prior_precision(delta).structure(LaplaceStructure::diagonal));
  EXPECT_TRUE(torch::allclose(diag.covariance, 1 / (phi.pow(2).sum(0) / (sigma * sigma) + delta), 1e-4, 0));
  // Without a given precision the marginal likelihood's maximiser is chosen.
  const auto best = last_layer_laplace(*net, d.x, d.y, u, LaplaceOptions());
  for (double f : {0.5, 2.0}) {
    const auto other =
        last_layer_laplace(*net, d.x, d.y, u, LaplaceOptions().prior_precision(best.prior_precision * f));
    EXPECT_GT(best.log_marginal_likelihood, other.log_marginal_likelihood) << f;
  }
}

TEST(Laplace, TheLinearizedPredictiveHasTheLastLayersVariance) {
  const auto d = wave(128, 2);
  Laplace la(
      [] { return to_any_module(small_net()); },
      InferOptions().particles(2).noise_std(0.3).lr(1e-2).distribution(PushOptions().seed(5).intra_op_threads(1)));
  la.fit(d, 20);
  const auto x = torch::linspace(-5, 5, 11).unsqueeze(1);
  const auto map = la.predict(x);
  la.approximate(d);
  const auto p = la.predict(x);
  EXPECT_TRUE(torch::allclose(p.mean, map.mean, 1e-5, 1e-6));  // the linearised mean is the MAP's
  EXPECT_TRUE(torch::all(p.variance > map.variance).item<bool>());
  // Per particle, σ² = φ̃ Σ φ̃ᵀ; the mixture of two particles adds their disagreement.
  const auto members = p.members;  // [2 particles x 2, M, 1]
  for (int pid = 0; pid < 2; ++pid) {
    const auto post = la.posterior(pid);
    ASSERT_EQ(post.covariance.dim(), 2);
    EXPECT_GT(post.prior_precision, 0);
    const auto spread = (members[2 * pid] - members[2 * pid + 1]).to(torch::kFloat64) / 2;  // σ per point
    EXPECT_TRUE(torch::all(spread > 0).item<bool>());
  }
  // The posterior is kept with the particles.
  auto dir = std::filesystem::temp_directory_path() / ("push_laplace_ckpt_" + std::to_string(::getpid()));
  la.save(dir);
  Laplace again([] { return to_any_module(small_net()); }, InferOptions().particles(2).noise_std(0.3));
  again.load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(torch::equal(again.predict(x).variance, p.variance));
}

// The distributions here use one intra-op thread: OpenMP's teams sync where
// ThreadSanitizer cannot see.
TEST(Laplace, ImprovesTheCalibrationOfAnOverconfidentClassifier) {
  // Three overlapping classes in 2-D, few points, trained long: the MAP is overconfident.
  auto make = [](int64_t n, uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    data::Dataset d;
    d.task = data::Task::classification;
    d.num_classes = 3;
    d.y = torch::randint(3, {n}, gen, torch::kLong);
    const auto centres = torch::tensor({{0.0f, 1.0f}, {0.9f, -0.5f}, {-0.9f, -0.5f}});
    d.x = centres.index_select(0, d.y) + 0.8 * torch::randn({n, 2}, gen);
    return d;
  };
  const auto train = make(60, 1), test = make(2000, 2);
  Laplace la(make_model("mlp:64,64", {2}, 3), InferOptions()
                                                  .particles(1)
                                                  .likelihood(Likelihood::categorical)
                                                  .prior_std(10)
                                                  .lr(1e-2)
                                                  .batch_size(32)
                                                  .distribution(PushOptions().seed(1).intra_op_threads(1)));
  la.fit(train, ::push::testing::scaled(2000, 500, 4));
  const auto map = metrics::classification(la.predict(test.x).probs, test.y);
  la.approximate(train);
  const auto lap = metrics::classification(la.predict(test.x).probs, test.y);
  std::printf("MAP nll %.4f ece %.4f; Laplace nll %.4f ece %.4f\n", map.nll, map.ece, lap.nll, lap.ece);
  EXPECT_LT(lap.nll, map.nll);
  EXPECT_LT(lap.ece, map.ece);
  EXPECT_NEAR(lap.accuracy, map.accuracy, 0.02);  // the probit scaling rarely changes the argmax
}

TEST(Laplace, BadModelsAndOptionsAreNamed) {
  const auto d = wave(32, 3);
  const Objective u{InferOptions()};
  auto relu_last = torch::nn::Sequential(torch::nn::Linear(1, 2), torch::nn::ReLU());
  EXPECT_PUSH_ERROR(last_layer_laplace(*relu_last, d.x, d.y, u, LaplaceOptions()), "not a Linear layer");
  torch::nn::Linear bare(1, 1);
  EXPECT_PUSH_ERROR(last_layer_laplace(*bare, d.x, d.y, u, LaplaceOptions()), "needs a Sequential network");
  EXPECT_PUSH_ERROR(last_layer_laplace(*small_net(), d.x, d.y, u, LaplaceOptions().prior_precision(-1)),
                    "prior_precision must be positive");
  auto wide = torch::nn::Sequential(torch::nn::Linear(1, 3000), torch::nn::Linear(3000, 3));
  EXPECT_PUSH_ERROR(last_layer_laplace(*wide, d.x, torch::zeros({32, 3}), u, LaplaceOptions()),
                    "use the diagonal structure");
  EXPECT_PUSH_ERROR(Laplace(make_model("mlp:4", {1}, 1), InferOptions().likelihood(Likelihood::learned_noise)),
                    "does not take the learned_noise likelihood");
  EXPECT_PUSH_ERROR(Laplace(make_model("mlp:4", {1}, 1), InferOptions(), LaplaceOptions().samples(0)),
                    "samples must be >= 1");
  // At construction, before any training: a model without a last Linear layer, one summed
  // with a randomized prior, a last layer too large for a full covariance.
  const ModuleFactory relu_factory = [] {
    return torch::nn::AnyModule(SequentialNet(torch::nn::Sequential(torch::nn::Linear(1, 2), torch::nn::ReLU())));
  };
  EXPECT_PUSH_ERROR(Laplace(relu_factory, InferOptions()), "not a Linear layer");
  EXPECT_PUSH_ERROR(Laplace(with_randomized_prior(make_model("mlp:4", {1}, 1), 1.0)),
                    "does not take a randomized prior");
  EXPECT_PUSH_ERROR(Laplace(make_model("mlp:4095", {1}, 3)), "full covariance of the last layer's 12288 parameters");
  EXPECT_NO_THROW(
      Laplace(make_model("mlp:4095", {1}, 3), InferOptions(), LaplaceOptions().structure(LaplaceStructure::diagonal)));
  EXPECT_EQ(last_layer_parameters(make_model("mlp:4095", {1}, 3)), 12288);
  EXPECT_DOUBLE_EQ(laplace_bytes(4, LaplaceStructure::full).kept, (16 + 4) * 8);
  EXPECT_DOUBLE_EQ(laplace_bytes(4, LaplaceStructure::diagonal).kept, 2 * 4 * 8);
}

}  // namespace
}  // namespace push::bayes
