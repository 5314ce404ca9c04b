// DataParallel (blocking) on 2 and 4 ranks takes the steps one process takes on the
// concatenated batches (SGD, to 1e-6), with small buckets and an unused parameter; shard()
// splits the rows of every epoch among the ranks.
#include <push/parallel/data_parallel.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::parallel::DataParallel;
using push::parallel::DataParallelOptions;

namespace {

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 1));
}

PUSH_DIST_WORKER(data_parallel) {
  auto world = push::testing::test_world(60s);
  auto group = world.collective();
  const int size = world.size(), rank = world.rank();
  torch::manual_seed(100 + rank);  // different starts: the broadcast makes them rank 0's
  auto net = mlp();
  net->register_parameter("unused", torch::zeros({3}));  // in no forward
  DataParallel dp(*net, group, DataParallelOptions().bucket_bytes(300));
  EXPECT_GT(dp.buckets().size(), 3u);
  // The reference: rank 0's start, trained in one process on every rank's rows at once.
  auto ref = mlp();
  {
    torch::NoGradGuard no_grad;
    auto mine = net->named_parameters();
    for (auto& item : ref->named_parameters()) item.value().copy_(mine[item.key()]);
  }
  std::vector<torch::Tensor> trained;  // all but the unused one, as the reference
  for (const auto& item : net->named_parameters()) {
    if (item.key() != "unused") trained.push_back(item.value());
  }
  torch::optim::SGD sgd(trained, torch::optim::SGDOptions(0.1));
  torch::optim::SGD sgd_ref(ref->parameters(), torch::optim::SGDOptions(0.1));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t per = 8, steps = 6;
  for (int64_t step = 0; step < steps; ++step) {
    auto x = torch::randn({per * size, 4}, gen), y = torch::randn({per * size, 1}, gen);
    sgd.zero_grad();
    torch::mse_loss(net->forward(x.narrow(0, rank * per, per)), y.narrow(0, rank * per, per)).backward();
    sgd.step();
    sgd_ref.zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    sgd_ref.step();
  }
  EXPECT_EQ(dp.reductions(), steps);
  auto mine = net->named_parameters();
  for (const auto& item : ref->named_parameters()) {
    const auto diff = (mine[item.key()] - item.value()).abs().max().item<double>();
    EXPECT_LT(diff, 1e-6) << item.key() << " on rank " << rank;
  }
  // The unused parameter: a zero gradient, reduced everywhere all the same.
  ASSERT_TRUE(mine["unused"].grad().defined());
  EXPECT_EQ(mine["unused"].grad().abs().sum().item<double>(), 0.0);
  // Gradients accumulate over two backward calls, each averaged.
  sgd.zero_grad();
  auto x = torch::ones({2, 4}) * (rank + 1);
  net->forward(x).sum().backward();
  auto once = net->named_parameters()["0.bias"].grad().clone();
  net->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(net->named_parameters()["0.bias"].grad(), 2 * once, 1e-6, 1e-6));
  // shard: every row once per epoch (10 rows padded to a multiple of the ranks).
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    auto rows = push::parallel::shard(10, group, epoch);
    EXPECT_EQ(rows.size(0), (10 + size - 1) / size);
    std::vector<torch::Tensor> all;
    group.all_gather(all, rows);
    std::set<int64_t> seen;
    for (const auto& t : all) {
      for (int64_t i = 0; i < t.size(0); ++i) seen.insert(t[i].item<int64_t>());
    }
    EXPECT_EQ(seen.size(), 10u);
  }
  EXPECT_FALSE(torch::equal(push::parallel::shard(10, group, 0), push::parallel::shard(10, group, 1)));
}

TEST(DataParallel, TwoRanksTakeTheStepsOfOneProcessOnTheWholeBatch) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "data_parallel", 120s));
}

TEST(DataParallel, FourRanksTakeTheStepsOfOneProcessOnTheWholeBatch) {
  push::testing::expect_all_ok(push::testing::run_workers(4, "data_parallel", 120s));
}

}  // namespace
