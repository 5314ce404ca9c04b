// Split-R̂ over chains' predictions (push/bayes/mixing.h): its value on a case worked by
// hand, near 1 for chains that sample one distribution, large for chains apart or still
// drifting, and on SG-MCMC chains that have and have not burnt in.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sgmcmc_posterior.h"
#include "test_util.h"

namespace push::bayes {
namespace {

Predictive of_members(torch::Tensor members) {
  Predictive p;
  p.members = std::move(members);
  return p;
}

TEST(ChainMixing, MatchesACaseWorkedByHand) {
  // Chains [0 1 0 1] and [2 3 2 3]: half-chains [0 1] [0 1] [2 3] [2 3], W = 0.5, their
  // means' variance 4/3, n = 2: R̂ = sqrt((0.5 · 0.5 + 4/3) / 0.5).
  auto members = torch::tensor({0., 1., 0., 1., 2., 3., 2., 3.}).reshape({8, 1, 1});
  const auto m = chain_mixing(of_members(members), 2);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->rhat_median, std::sqrt((0.25 + 4.0 / 3) / 0.5), 1e-12);
  EXPECT_EQ(m->rhat_max, m->rhat_median);
  EXPECT_EQ(m->above, 1);
  EXPECT_EQ(m->values, 1);
  EXPECT_EQ(m->samples_per_chain, 4);
  // Each chain's halves alike: no drift, sqrt((n - 1) / n) with no spread between them.
  EXPECT_NEAR(m->drift_median, std::sqrt(0.5), 1e-12);
  // An odd count drops each chain's oldest sample: prepending 9s changes nothing.
  auto odd = torch::tensor({9., 0., 1., 0., 1., 9., 2., 3., 2., 3.}).reshape({10, 1, 1});
  EXPECT_EQ(chain_mixing(of_members(odd), 2)->rhat_median, m->rhat_median);
}

TEST(ChainMixing, IsNearOneForChainsOfOneDistributionAndLargeForChainsApartOrDrifting) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t chains = 8, k = 200, points = 50;
  auto draws = torch::randn({chains, k, points, 1}, gen, torch::kFloat64);
  const auto mixed = chain_mixing(of_members(draws.reshape({chains * k, points, 1})), chains);
  ASSERT_TRUE(mixed.has_value());
  EXPECT_LT(std::abs(mixed->rhat_median - 1), 0.02);
  EXPECT_LT(mixed->rhat_max, 1.1);
  EXPECT_EQ(mixed->above, 0);
  EXPECT_EQ(mixed->values, points);
  // Each chain about its own centre, one sd apart.
  auto offsets = torch::arange(chains, torch::kFloat64).reshape({chains, 1, 1, 1});
  const auto apart = chain_mixing(of_members((draws + offsets).reshape({chains * k, points, 1})), chains);
  EXPECT_GT(apart->rhat_median, 2);
  EXPECT_LT(std::abs(apart->drift_median - 1), 0.02);  // each stationary where it sits
  EXPECT_LT(std::abs(mixed->drift_median - 1), 0.02);
  // Every chain alike, but drifting by 2 sd over its run: the split sees the halves differ.
  auto drift = torch::linspace(0, 2, k, torch::kFloat64).reshape({1, k, 1, 1});
  const auto drifting = chain_mixing(of_members((draws + drift).reshape({chains * k, points, 1})), chains);
  EXPECT_GT(drifting->rhat_median, 1.1);
  EXPECT_GT(drifting->above, 0.9);
  EXPECT_GT(drifting->drift_median, 1.1);
}

TEST(ChainMixing, NeedsTwoChainsOfFourSamplesAndEqualChains) {
  auto members = torch::zeros({12, 3, 1});
  EXPECT_FALSE(chain_mixing(of_members(members), 1).has_value());
  EXPECT_FALSE(chain_mixing(of_members(members), 4).has_value());  // 3 samples each
  EXPECT_FALSE(chain_mixing(Predictive{}, 2).has_value());
  EXPECT_PUSH_ERROR(chain_mixing(of_members(members), 5), "12 members do not split into 5 equal chains");
  // Every sample alike: nothing to tell apart, R̂ 1; alike within chains only: infinite.
  EXPECT_EQ(chain_mixing(of_members(members), 3)->rhat_max, 1);
  auto constant_chains = torch::arange(3, torch::kFloat32).repeat_interleave(4).reshape({12, 1, 1});
  EXPECT_TRUE(std::isinf(chain_mixing(of_members(constant_chains), 3)->rhat_median));
  // A value some sample predicts as NaN (a diverged chain) is not mixed.
  auto diverged = torch::randn({12, 3, 1});
  diverged[5][1][0] = std::nan("");
  const auto d = chain_mixing(of_members(diverged), 3);
  EXPECT_TRUE(std::isinf(d->rhat_max) && std::isinf(d->drift_max));
  EXPECT_FALSE(std::isinf(d->rhat_median));
}

// pSGLD chains that have burnt in sample one posterior: R̂ near 1. With a burn-in far too
// short for RMSprop's ε-sized steps (docs/bayes.md, *pSGLD*) they are still descending when
// samples are kept, and R̂ says so.
TEST(ChainMixing, TellsBurntInChainsFromChainsStillDescending) {
  const auto exact = exact::linear_posterior(500, 0.5, 1.0);
  auto rhat = [&](int64_t burn_in) {
    SGMCMC chains(
        exact::chain_model(),
        InferOptions().particles(4).batch_size(500).noise_std(0.5).prior_std(1.0).distribution(PushOptions().seed(5)),
        SGMCMCOptions().preconditioned(true).step_size(0.002).burn_in_epochs(burn_in).thin(4).samples(200));
    chains.fit(exact.data, burn_in + 800);
    return chain_mixing(chains.predict(torch::linspace(-2, 2, 5).unsqueeze(1)), 4).value();
  };
  const auto burnt_in = rhat(1500), descending = rhat(100);
  EXPECT_LT(burnt_in.rhat_median, 1.1);
  EXPECT_LT(burnt_in.rhat_max, 1.2);
  EXPECT_GT(descending.rhat_median, 1.1);
  EXPECT_LT(burnt_in.drift_median, 1.1);
  EXPECT_GT(descending.drift_median, 1.1);
  std::printf(
      "pSGLD split-R-hat, median / max, and drift median: burn-in 1,500 %.3f / %.3f, %.3f; burn-in 100 %.3f "
      "/ %.3f, %.3f\n",
      burnt_in.rhat_median, burnt_in.rhat_max, burnt_in.drift_median, descending.rhat_median, descending.rhat_max,
      descending.drift_median);
}

}  // namespace
}  // namespace push::bayes
