// Randomized prior functions (push/bayes/randomized_prior.h): the prior is added, frozen,
// its own per particle, and travels with the particle through training and checkpoints.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>

#include "test_util.h"

namespace push::bayes {
namespace {

TEST(RandomizedPrior, ThePriorIsAddedAndNeverTrained) {
  torch::manual_seed(1);
  auto any = with_randomized_prior(make_model("mlp:8", {1}, 1), 2.5)();
  auto& m = *any.get<RandomizedPrior>();
  // Only the trained network's tensors are parameters; the prior's are buffers.
  EXPECT_EQ(m.parameters().size(), 4u);
  EXPECT_EQ(m.buffers().size(), 4u);
  for (const auto& b : m.buffers()) EXPECT_FALSE(b.requires_grad());
  auto x = torch::linspace(-2, 2, 9).unsqueeze(1);
  auto prior = m.prior_forward(x);
  EXPECT_GT(prior.abs().max().item<double>(), 0.0);
  auto net = any.forward(x) - 2.5 * prior;
  // Steps on the output change the trained network only.
  std::vector<torch::Tensor> before;
  for (const auto& b : m.buffers()) before.push_back(b.clone());
  torch::optim::SGD opt(m.parameters(), 0.1);
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    any.forward(x).pow(2).sum().backward();
    opt.step();
  }
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], m.buffers()[i]));
  EXPECT_TRUE(torch::allclose(m.prior_forward(x), prior));
  EXPECT_FALSE(torch::allclose(any.forward(x) - 2.5 * prior, net));
  EXPECT_PUSH_ERROR(with_randomized_prior(make_model("mlp:8", {1}, 1), -1), "scale must be >= 0 and finite, got -1");
  EXPECT_PUSH_ERROR(with_randomized_prior(make_model("mlp:8", {1}, 1), std::nan("")), "scale must be >= 0");
}

TEST(RandomizedPrior, EachSeedDrawsItsOwnPrior) {
  auto factory = with_randomized_prior(make_model("mlp:8", {1}, 1), 1.0);
  auto x = torch::linspace(-3, 3, 7).unsqueeze(1);
  torch::manual_seed(1);
  auto a = factory();
  torch::manual_seed(2);
  auto b = factory();
  torch::manual_seed(1);
  auto c = factory();
  EXPECT_FALSE(torch::allclose(a.get<RandomizedPrior>()->prior_forward(x), b.get<RandomizedPrior>()->prior_forward(x)));
  EXPECT_TRUE(torch::equal(a.get<RandomizedPrior>()->prior_forward(x), c.get<RandomizedPrior>()->prior_forward(x)));
  // The prior is not the trained network's twin: drawn after it, from the same stream.
  EXPECT_FALSE(torch::allclose(a.forward(x) - a.get<RandomizedPrior>()->prior_forward(x),
                               a.get<RandomizedPrior>()->prior_forward(x)));
}

TEST(RandomizedPrior, ThePriorTravelsWithItsParticleThroughACheckpoint) {
  auto d = data::synthetic_gap(64, 6);
  auto model = with_randomized_prior(make_model("mlp:8", {1}, 1), 1.0);
  auto make = [&](uint64_t seed) {
    return Ensemble(model, InferOptions().particles(2).lr(1e-2).distribution(PushOptions().seed(seed)));
  };
  auto a = make(1);
  a.fit(d, 2);
  EXPECT_FALSE(a.fused());  // a plain stack of layers fuses; this module trains unfused
  auto x = torch::linspace(-6, 6, 13).unsqueeze(1);
  const auto members = a.predict(x).members;
  EXPECT_FALSE(torch::allclose(members[0], members[1]));
  // Another seed draws other networks and other priors; loading brings back both.
  auto b = make(2);
  EXPECT_FALSE(torch::allclose(b.predict(x).members, members));
  auto dir = std::filesystem::temp_directory_path() / ("push_prior_ckpt_" + std::to_string(::getpid()));
  a.save(dir);
  b.load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(torch::equal(b.predict(x).members, members));
}

TEST(RandomizedPrior, SwappedParticlesKeepTheirPriors) {
  // One resident particle of three: the cache swaps each out and back between its epochs.
  auto d = data::synthetic_gap(64, 7);
  auto model = with_randomized_prior(make_model("mlp:8", {1}, 1), 1.0);
  auto run = [&](int cache) {
    Ensemble e(model, InferOptions().particles(3).lr(1e-2).distribution(PushOptions().cache_size(cache).seed(4)));
    e.fit(d, 2);
    return e.predict(torch::linspace(-6, 6, 13).unsqueeze(1)).members;
  };
  EXPECT_TRUE(torch::equal(run(1), run(3)));
}

}  // namespace
}  // namespace push::bayes
