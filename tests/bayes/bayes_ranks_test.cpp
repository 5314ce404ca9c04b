// The Bayesian layer over several processes (a World in InferOptions::distribution), driven directly rather
// than through `push train --nproc` (tests/cli/cli_ranks_test.cpp): what only shows when the
// ranks run out of step.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <atomic>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;

namespace push::bayes {
namespace {

// SVGD's leader (rank 0) drives every particle; the epoch's first batch reaches rank 1's
// particles while rank 1's own fit() may still be gathering the previous epoch's losses.
// Rank 1 must not drop what that batch built (it did: "group of particle 1 was not
// stacked", seen once in CI). Many short epochs of two batches make the window wide.
PUSH_DIST_WORKER(svgd_out_of_step) {
  auto world = push::testing::test_world(60s);
  auto train = data::synthetic_gap(16, 3);
  for (bool fuse : {true, false}) {
    SVGD svgd(make_model("mlp:4", {1}, 2),
              InferOptions()
                  .particles(4)
                  .distribution(PushOptions().devices(1).cache_size(2).seed(3).world(world))
                  .batch_size(8)
                  .lr(1e-2)
                  .fuse(fuse)
                  .likelihood(Likelihood::heteroscedastic));
    svgd.fit(train, 150);
    ASSERT_EQ(svgd.losses().size(), 150u);
    for (double l : svgd.losses()) ASSERT_TRUE(std::isfinite(l));
  }
}

TEST(BayesRanks, SvgdSurvivesRanksOutOfStepBetweenEpochs) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "svgd_out_of_step", 240s));
}

// Counts the optimizer steps of every particle.
class CountingEnsemble : public Ensemble {
 public:
  using Ensemble::Ensemble;
  std::atomic<int64_t> steps{0};

 protected:
  StepHooks epoch_hooks(Particle& p, int64_t epoch) override {
    StepHooks hooks;
    hooks.after_step = [this] { ++steps; };
    return hooks;
  }
};

// InferOptions::data_parallel: every rank trains every particle on half of the rows. With
// full batches and plain SGD, blocking and non-blocking both take the steps of one process
// on all the rows (the mean of the halves' gradients is the whole's; the mean of the ranks'
// SGD steps is the step on that mean). DASO (2 ranks as 2 nodes of 1) trains and ends
// every epoch with one set of parameters. Algorithms that cannot are refused by name.
PUSH_DIST_WORKER(data_parallel_infer) {
  auto world = push::testing::test_world(60s);
  auto train = data::synthetic_gap(64, 3), test = data::synthetic_gap(32, 4);
  auto model = make_model("mlp:16", {1}, 2);
  auto base = InferOptions()
                  .particles(3)
                  .distribution(PushOptions().devices(2).seed(3))
                  .batch_size(128)
                  .likelihood(Likelihood::heteroscedastic)
                  .optimizer([](std::vector<torch::Tensor> ps) {
                    return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(0.05));
                  });
  auto group = world.collective();
  auto same_everywhere = [&](const torch::Tensor& t) {
    std::vector<torch::Tensor> all;
    group.all_gather(all, t.contiguous());
    for (const auto& other : all) EXPECT_TRUE(torch::equal(other, t));
  };
  Ensemble single(model, base);  // on each rank alone, without communication
  single.fit(train, 5);
  single.fit(train, 2);  // a second call goes on where the first stopped
  const auto expected = single.predict(test.x);
  for (auto mode : {DataParallelMode::blocking, DataParallelMode::nonblocking}) {
    Ensemble dp(model, InferOptions(base).data_parallel(DataParallelSpec(world, mode)));
    dp.fit(train, 5);
    dp.fit(train, 2);
    ASSERT_EQ(dp.losses().size(), 7u);
    for (size_t e = 0; e < 7; ++e) EXPECT_NEAR(dp.losses()[e], single.losses()[e], 1e-5) << to_string(mode);
    const auto got = dp.predict(test.x);
    EXPECT_TRUE(torch::allclose(got.mean, expected.mean, 1e-5, 1e-5)) << to_string(mode);
    EXPECT_TRUE(torch::allclose(got.variance, expected.variance, 1e-5, 1e-5)) << to_string(mode);
    same_everywhere(got.members);
    EXPECT_FALSE(dp.fused());
  }
  {  // each rank takes half the steps: 32 of the 64 rows, in batches of 16, for each of 3 particles
    CountingEnsemble counted(
        model, InferOptions(base).batch_size(16).data_parallel(DataParallelSpec(world, DataParallelMode::blocking)));
    counted.fit(train, 1);
    EXPECT_EQ(counted.steps.load(), 3 * 2);
  }
  {
    Ensemble daso(model, InferOptions(base).batch_size(8).lr(1e-2).optimizer(nullptr).data_parallel(
                             DataParallelSpec(world, DataParallelMode::daso)
                                 .daso(push::data_parallel::DasoOptions(1).ranks_per_node(1))));
    daso.fit(train, 12);
    EXPECT_LT(daso.losses().back(), daso.losses().front());
    same_everywhere(daso.predict(test.x).members);
  }
  {  // one huge target: the loss overflows on the rank whose half holds it, and every rank
     // fails at the same point, naming it (not after a collective's timeout)
    auto bad = train;
    bad.y = bad.y.clone();
    bad.y[5][0] = 1e30;
    Ensemble diverging(model, InferOptions(base).data_parallel(DataParallelSpec(world, DataParallelMode::blocking)));
    EXPECT_PUSH_ERROR(diverging.fit(bad, 2), "non-finite in epoch 1 on 1 of 2 ranks");
  }
  EXPECT_PUSH_ERROR(
      SVGD(model, InferOptions(base).data_parallel(DataParallelSpec(world, DataParallelMode::blocking))).fit(train, 1),
      "svgd cannot train data-parallel");
  EXPECT_PUSH_ERROR(
      MultiSWAG(model, InferOptions(base).data_parallel(DataParallelSpec(world, DataParallelMode::daso))).fit(train, 1),
      "use blocking");
  EXPECT_PUSH_ERROR(Ensemble(model, InferOptions(base)
                                        .distribution(PushOptions(base.distribution()).world(world))
                                        .data_parallel(DataParallelSpec(world, DataParallelMode::blocking)))
                        .fit(train, 1),
                    "choose one");
}

TEST(BayesRanks, DataParallelParticlesTakeTheStepsOfOneProcessOnAllTheRows) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "data_parallel_infer", 240s));
}

}  // namespace
}  // namespace push::bayes
