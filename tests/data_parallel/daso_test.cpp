// DASO on 4 ranks simulating 2 nodes of 2: it trains the sine-gap regression about as well as
// blocking DataParallel over all 4 ranks, skips global syncs after its warm-up, and every
// epoch ends with one set of parameters on every rank; both ways of averaging on a node.
// Bad node layouts are named.
#include <push/data/dataset.h>
#include <push/data_parallel/daso.h>
#include <push/data_parallel/data_parallel.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::data_parallel::Daso;
using push::data_parallel::DasoOptions;

namespace {

torch::nn::Sequential sine_net() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(1, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                               torch::nn::Tanh(), torch::nn::Linear(32, 1));
}

torch::Tensor flat_of(torch::nn::Module& net) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : net.parameters()) flat.push_back(p.detach().reshape(-1));
  return torch::cat(flat);
}

constexpr int64_t kEpochs = 16, kBatch = 16;

// Trains with DASO (or, when `daso_options` is unset, blocking DataParallel over every rank)
// and returns the training MSE of the result.
double train_daso(push::dist::World& world, const push::data::Dataset& data, std::optional<DasoOptions> daso_options) {
  auto net = sine_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  auto group = world.collective();
  std::unique_ptr<Daso> daso;
  std::unique_ptr<push::data_parallel::DataParallel> dp;
  if (daso_options) {
    daso = std::make_unique<Daso>(*net, adam, world, *daso_options);
  } else {
    dp = std::make_unique<push::data_parallel::DataParallel>(*net, group);
  }
  int64_t skipping_epochs = 0;
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    auto rows = push::data_parallel::shard(data.size(), group, epoch);
    const int64_t batches = rows.size(0) / kBatch;
    if (daso) daso->set_batches_per_epoch(batches);
    if (daso && daso->schedule().global_skip() > 0) ++skipping_epochs;
    double loss_sum = 0;
    for (int64_t b = 0; b < batches; ++b) {
      auto idx = rows.narrow(0, b * kBatch, kBatch);
      adam.zero_grad();
      auto loss = torch::mse_loss(net->forward(data.x.index_select(0, idx)), data.y.index_select(0, idx));
      loss.backward();
      loss_sum += loss.item<double>();
      if (daso) {
        daso->step();
      } else {
        adam.step();
      }
    }
    if (daso) daso->end_epoch(loss_sum / static_cast<double>(batches));
    // Every epoch ends with one set of parameters everywhere.
    auto mine = flat_of(*net);
    std::vector<torch::Tensor> all;
    group.all_gather(all, mine);
    for (size_t r = 0; r < all.size(); ++r) {
      EXPECT_TRUE(torch::equal(all[r], mine)) << "rank " << r << " differs after epoch " << epoch;
    }
  }
  if (daso) {
    // Warm-up 3 and cool-down 3 of 16 epochs: the 10 between skip global syncs.
    EXPECT_EQ(skipping_epochs, kEpochs - 6);
    EXPECT_EQ(daso->nodes(), 2);
    EXPECT_LT(daso->syncs_sent(), kEpochs * 8);  // fewer than one per batch
    EXPECT_EQ(daso->syncs_sent(), daso->syncs_received());
  }
  torch::NoGradGuard no_grad;
  return torch::mse_loss(net->forward(data.x), data.y).item<double>();
}

PUSH_DIST_WORKER(daso) {
  auto world = push::testing::test_world(60s);
  // Bad layouts fail at once, on each rank alike, before any group is made.
  {
    auto net = sine_net();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    EXPECT_PUSH_ERROR(Daso(*net, sgd, world, DasoOptions(4).ranks_per_node(4)), "at least 2 nodes");
    EXPECT_PUSH_ERROR(Daso(*net, sgd, world, DasoOptions(4).ranks_per_node(3)), "whole number of nodes");
  }
  const auto raw = push::data::synthetic_gap(512, 1);
  const auto data = push::data::Standardizer::fit(raw).apply(raw);  // 128 rows, 8 batches per rank
  const auto options = DasoOptions(kEpochs).ranks_per_node(2).warmup_epochs(3).cooldown_epochs(3).max_global_skips(4);
  const double blocking = train_daso(world, data, std::nullopt);
  const double hooks = train_daso(world, data, options);
  const double in_step = train_daso(world, data, DasoOptions(options).average_in_step(true));
  EXPECT_LT(blocking, 0.2);
  EXPECT_LT(hooks, 1.5 * blocking + 0.02) << "blocking " << blocking;
  EXPECT_LT(in_step, 1.5 * blocking + 0.02) << "blocking " << blocking;
  if (world.rank() == 0) {
    std::printf("training mse: blocking %.4f, DASO %.4f (averaging in step: %.4f)\n", blocking, hooks, in_step);
  }
}

TEST(Daso, TwoNodesOfTwoRanksTrainAsBlockingDataParallelDoes) {
  push::testing::expect_all_ok(push::testing::run_workers(4, "daso", 180s));
}

}  // namespace
