// DataParallel (blocking) on 2 and 4 ranks takes the steps one process takes on the
// concatenated batches (SGD, to 1e-6), with small buckets and an unused parameter; shard()
// splits the rows of every epoch among the ranks.
#include <push/data/dataset.h>
#include <push/data_parallel/data_parallel.h>
#include <push/data_parallel/non_blocking_data_parallel.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::data_parallel::DataParallel;
using push::data_parallel::DataParallelOptions;

namespace {

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 1));
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
  // Gradients accumulate over two backward calls, each averaged: each rank's input differs,
  // the gradients are the same on every rank, and twice the first after the second.
  sgd.zero_grad();
  auto x = torch::ones({2, 4}) * (rank + 1);
  net->forward(x).sum().backward();
  auto once = net->named_parameters()["0.bias"].grad().clone();
  std::vector<torch::Tensor> everyone;
  group.all_gather(everyone, once);
  for (const auto& other : everyone) EXPECT_TRUE(torch::equal(other, once));
  net->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(net->named_parameters()["0.bias"].grad(), 2 * once, 1e-6, 1e-6));
  // A backward that fails half-way leaves nothing behind: the next one is averaged again.
  // (Every rank fails at the same point, so no rank waits for another.)
  sgd.zero_grad();
  auto bad = net->forward(x).sum();
  auto hook = net->named_parameters()["2.weight"].register_hook(
      [](const torch::Tensor&) -> torch::Tensor { throw std::runtime_error("a failing backward"); });
  EXPECT_THROW(bad.backward(), std::exception);
  net->named_parameters()["2.weight"].remove_hook(hook);
  sgd.zero_grad();
  net->forward(x).sum().backward();
  auto again = net->named_parameters()["0.bias"].grad().clone();
  EXPECT_TRUE(torch::allclose(again, once, 1e-6, 1e-6));
  EXPECT_EQ(dp.reductions(), steps + 3);
  // create_graph (double backward) is refused, on every rank alike, and leaves nothing behind.
  sgd.zero_grad();
  EXPECT_PUSH_ERROR(net->forward(x).sum().backward({}, /*retain_graph=*/true, /*create_graph=*/true), "create_graph");
  sgd.zero_grad();
  net->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(net->named_parameters()["0.bias"].grad(), once, 1e-6, 1e-6));
  // shard: every row once per epoch (10 rows padded to a multiple of the ranks).
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    auto rows = push::data_parallel::shard(10, group, epoch);
    EXPECT_EQ(rows.size(0), (10 + size - 1) / size);
    std::vector<torch::Tensor> all;
    group.all_gather(all, rows);
    std::set<int64_t> seen;
    for (const auto& t : all) {
      for (int64_t i = 0; i < t.size(0); ++i) seen.insert(t[i].item<int64_t>());
    }
    EXPECT_EQ(seen.size(), 10u);
  }
  EXPECT_FALSE(torch::equal(push::data_parallel::shard(10, group, 0), push::data_parallel::shard(10, group, 1)));
}

TEST(DataParallel, TwoRanksTakeTheStepsOfOneProcessOnTheWholeBatch) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "data_parallel", 120s));
}

TEST(DataParallel, FourRanksTakeTheStepsOfOneProcessOnTheWholeBatch) {
  push::testing::expect_all_ok(push::testing::run_workers(4, "data_parallel", 120s));
}

}  // namespace

namespace {

// heat's non-blocking mode against blocking on the sine-gap regression (standardised), 2
// ranks, Adam, 30 epochs of batches of 32 per rank: it must get within 1.5x (+ 0.02) of
// blocking's training MSE, far below the untrained 1; after synchronize() (or eval()) the
// ranks hold one set of parameters. The same network as a module of its own (not a
// Sequential: its averages are applied before it runs, not layer by layer) takes the same
// steps to the bit.
struct GapNet : torch::nn::Module {
  GapNet()
      : a(register_module("a", torch::nn::Linear(1, 32))),
        b(register_module("b", torch::nn::Linear(32, 32))),
        c(register_module("c", torch::nn::Linear(32, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return c(torch::tanh(b(torch::tanh(a(x))))); }
  torch::nn::Linear a, b, c;
};

enum class Mode { blocking, sequential, any_module };

double train_mode(Mode mode, push::dist::CollectiveGroup& group, const push::data::Dataset& data) {
  torch::manual_seed(3);
  auto custom = std::make_shared<GapNet>();
  torch::nn::Sequential net;
  if (mode != Mode::any_module) {
    // The Sequential starts from the module's weights (the order in which a call's
    // arguments are built is the compiler's: its layers could draw theirs in any order).
    net = torch::nn::Sequential(torch::nn::Linear(1, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                                torch::nn::Tanh(), torch::nn::Linear(32, 1));
    torch::NoGradGuard no_grad;
    auto from = custom->parameters(), to = net->parameters();
    for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
    custom.reset();
  }
  torch::nn::Module& module = custom ? static_cast<torch::nn::Module&>(*custom) : *net;
  // Adam: with plain SGD the two modes take the same steps (the mean of the ranks' steps is
  // the step on the mean gradient); Adam's state is each rank's own in non-blocking mode.
  torch::optim::Adam sgd(module.parameters(), torch::optim::AdamOptions(0.01));
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<push::data_parallel::NonBlockingDataParallel> nb;
  if (mode == Mode::blocking) {
    dp = std::make_unique<DataParallel>(*net, group);
  } else if (mode == Mode::sequential) {
    nb = std::make_unique<push::data_parallel::NonBlockingDataParallel>(net, group);
  } else {
    nb = std::make_unique<push::data_parallel::NonBlockingDataParallel>(torch::nn::AnyModule(custom), group);
  }
  for (int64_t epoch = 0; epoch < 30; ++epoch) {
    auto rows = push::data_parallel::shard(data.size(), group, epoch);
    for (int64_t b = 0; b + 32 <= rows.size(0); b += 32) {
      auto idx = rows.narrow(0, b, 32);
      auto x = data.x.index_select(0, idx), y = data.y.index_select(0, idx);
      sgd.zero_grad();
      torch::mse_loss(nb ? nb->forward(x) : net->forward(x), y).backward();
      sgd.step();
      if (nb) nb->start_averaging();
    }
  }
  // Leaving training finishes the averages (heat's eval() detection); or synchronize().
  if (mode == Mode::sequential) nb->synchronize();
  if (mode == Mode::any_module) nb->eval();
  // One set of parameters on every rank.
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().reshape(-1));
  auto mine = torch::cat(flat);
  std::vector<torch::Tensor> all;
  group.all_gather(all, mine);
  for (const auto& other : all) EXPECT_TRUE(torch::equal(other, mine));
  torch::NoGradGuard no_grad;
  return torch::mse_loss(custom ? custom->forward(data.x) : net->forward(data.x), data.y).item<double>();
}

PUSH_DIST_WORKER(nonblocking) {
  auto world = push::testing::test_world(60s);
  auto group = world.collective();
  const auto raw = push::data::synthetic_gap(512, 1);
  const auto data = push::data::Standardizer::fit(raw).apply(raw);
  const double blocking = train_mode(Mode::blocking, group, data);
  const double nonblocking = train_mode(Mode::sequential, group, data);
  const double any_module = train_mode(Mode::any_module, group, data);
  EXPECT_LT(blocking, 0.2);
  EXPECT_LT(nonblocking, 1.5 * blocking + 0.02) << "blocking " << blocking;
  EXPECT_EQ(any_module, nonblocking);
  if (world.rank() == 0) std::printf("training mse: blocking %.4f, non-blocking %.4f\n", blocking, nonblocking);
}

TEST(DataParallel, NonBlockingConvergesAsBlockingDoesForAnyModule) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "nonblocking", 120s));
}

}  // namespace
