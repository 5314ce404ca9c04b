// ModelServer: members racing to publish a model each publish on top of the newest
// version; losers load the winner's parameters; mismatched models named.
#include <push/server/model_server.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "dist_test_util.h"
#include "memory_store.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::server::ModelServer;
using push::server::OrderedServer;
using push::server::OrderedServerHost;

namespace {

// 3 ranks, rank 0 hosts. Every rank adds 1 to its copy and pushes, `n` times; a lost push
// loads the winner's copy and tries again. Each published version is the one before plus
// 1, so the last holds the start plus the number of versions after the first.
PUSH_DIST_WORKER(model_race) {
  auto world = push::testing::test_world(120s);
  auto rpc = world.rpc_group("models", world.names());
  std::unique_ptr<OrderedServerHost> host;
  if (world.rank() == 0) host = std::make_unique<OrderedServerHost>(rpc, "models");
  rpc.barrier();
  ModelServer models(OrderedServer(rpc, "models"), "net");
  torch::manual_seed(world.rank());  // different starting points: the first push wins
  torch::nn::Linear net(3, 2);
  {
    // Whole numbers: adding 1 at a time stays exact, so the end value is known to the bit.
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.copy_(torch::randint(-50, 50, p.sizes()));
  }
  EXPECT_FALSE(models.pull(*net));  // nothing yet
  rpc.barrier();
  const bool first = models.push(*net);
  rpc.barrier();
  // One creation won; the others loaded it.
  auto start = torch::cat({net->weight.detach().reshape(-1), net->bias.detach()});
  auto collective = world.collective();
  std::vector<torch::Tensor> all;
  collective.all_gather(all, start);
  for (const auto& other : all) EXPECT_TRUE(torch::equal(other, start));
  auto winners = torch::tensor({first ? int64_t{1} : int64_t{0}});
  collective.all_reduce(winners);
  EXPECT_EQ(winners.item<int64_t>(), 1);
  const int64_t n = push::testing::scaled(100, 10);
  int64_t mine = 0;
  while (mine < n) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.add_(1.0);
    }
    if (models.push(*net)) ++mine;  // on a loss, net now holds the newest version
  }
  rpc.barrier();
  EXPECT_TRUE(models.pull(*net));
  const int64_t total = n * world.size();
  EXPECT_EQ(models.version(), 1 + total);
  EXPECT_TRUE(torch::equal(torch::cat({net->weight.detach().reshape(-1), net->bias.detach()}),
                           start + static_cast<double>(total)));
  // A model of another shape, or with other names, is refused by name.
  torch::nn::Linear wide(4, 2);
  EXPECT_PUSH_ERROR(models.pull(*wide), "'weight' has shape [2, 3] on the server, [2, 4] in the module");
  torch::nn::Sequential seq(torch::nn::Linear(3, 2));
  EXPECT_PUSH_ERROR(models.pull(*seq), "'0.weight' of the module is not in the server's model");
  rpc.barrier();
  host.reset();
  rpc.shutdown();
}

TEST(ModelServer, RacingPushesEachBuildOnTheNewestVersion) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "model_race", 240s));
}

// The same race on another ordered-server backend (machin's o_server): four threads, each
// with its own copy and handle, push through a store kept in memory. Every version builds
// on the one before, so the last holds the start plus the versions after the first.
TEST(ModelServer, KeepsItsModelInAnyOrderedServerBackend) {
  auto store = std::make_shared<push::testing::MemoryStore>("memory");
  const int threads = 4;
  const int64_t n = push::testing::scaled(50, 10);
  torch::nn::Linear origin(3, 2);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : origin->parameters()) p.copy_(torch::randint(-50, 50, p.sizes()));
  }
  ModelServer(store, "net").push(*origin);  // version 1
  std::vector<std::thread> racers;
  for (int t = 0; t < threads; ++t) {
    racers.emplace_back([&] {
      ModelServer models(store, "net");
      torch::nn::Linear net(3, 2);
      EXPECT_TRUE(models.pull(*net));
      int64_t mine = 0;
      while (mine < n) {
        {
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(1.0);
        }
        if (models.push(*net)) ++mine;  // a loss loaded the newest version into net
      }
    });
  }
  for (auto& r : racers) r.join();
  ModelServer reader(store, "net");
  torch::nn::Linear net(3, 2);
  ASSERT_TRUE(reader.pull(*net));
  EXPECT_EQ(reader.version(), 1 + threads * n);
  EXPECT_TRUE(torch::equal(
      torch::cat({net->weight.detach().reshape(-1), net->bias.detach()}),
      torch::cat({origin->weight.detach().reshape(-1), origin->bias.detach()}) + static_cast<double>(threads * n)));
  EXPECT_GE(store->pushes.load(), 1 + threads * n);  // every version went through the backend
  EXPECT_PUSH_ERROR(ModelServer(std::shared_ptr<const push::server::OrderedServerBase>(), "net"),
                    "no ordered server given");
  // What the backend holds under the key is checked as from push's own server.
  store->push("not a model", c10::IValue(int64_t{3}), 1, std::nullopt);
  EXPECT_PUSH_ERROR(ModelServer(store, "not a model").pull(*net),
                    "key 'not a model' of server 'memory' holds no model");
}

}  // namespace
