// The Bayesian layer over several processes (InferOptions::world), driven directly rather
// than through `push train --nproc` (tests/cli/cli_ranks_test.cpp): what only shows when the
// ranks run out of step.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist_test_util.h"

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
              InferOptions().particles(4).devices(1).cache_size(2).batch_size(8).lr(1e-2).seed(3).fuse(fuse)
                  .likelihood(Likelihood::heteroscedastic).world(world));
    svgd.fit(train, 150);
    ASSERT_EQ(svgd.losses().size(), 150u);
    for (double l : svgd.losses()) ASSERT_TRUE(std::isfinite(l));
  }
}

TEST(BayesRanks, SvgdSurvivesRanksOutOfStepBetweenEpochs) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "svgd_out_of_step", 240s));
}

}  // namespace
}  // namespace push::bayes
