// GradServer: "mean" is the mean over every pushed gradient (also when a flush forwards
// short batches), "sum" the sum; a full secondary holds its pushers back until the primary
// applies; bad input named.
#include <push/server/grad_server.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <future>
#include <thread>

#include "dist_test_util.h"
#include "memory_store.h"
#include "test_util.h"
#include "thread_count.h"

using namespace std::chrono_literals;
using push::server::GradServer;
using push::server::GradServerHost;
using push::server::GradServerOptions;
using push::server::ReduceMethod;

namespace {

torch::Tensor flat(const torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().reshape(-1));
  return torch::cat(parts);
}

// Gives every trainable parameter of `m` the gradient `value` (whole numbers: sums exact).
void set_grads(torch::nn::Module& m, double value) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::full_like(p, value);
}

// 3 ranks: worker0 is the primary, worker1 and worker2 the secondaries; every rank is a
// client. reduce_batch_size 2: each secondary forwards 2 gradients, the primary steps on 2
// forwarded sums, so 4 gradients make one step. PUSH_TEST_REMOTE_STORE: the model is
// published through an ordered server worker2 hosts (each publish a round trip).
PUSH_DIST_WORKER(grad_mean) {
  auto world = push::testing::test_world(120s);
  auto rpc = world.rpc_group("grads", world.names());
  const auto method = std::getenv("PUSH_TEST_SUM") ? ReduceMethod::sum : ReduceMethod::mean;
  auto options = GradServerOptions().reduce_method(method).reduce_batch_size(2).max_queue_size(4);
  std::unique_ptr<push::server::OrderedServerHost> store_host;
  std::shared_ptr<const push::server::OrderedServerBase> store;
  if (std::getenv("PUSH_TEST_REMOTE_STORE")) {
    if (world.rank() == 2) store_host = std::make_unique<push::server::OrderedServerHost>(rpc, "models");
    rpc.barrier();
    store = std::make_shared<push::server::OrderedServer>(rpc, "models");
    options.model_store(store);
  }
  torch::manual_seed(7);
  torch::nn::Linear served(3, 2);  // the same start on every rank
  const double lr = 0.5;
  torch::optim::SGD sgd(served->parameters(), torch::optim::SGDOptions(lr));
  std::unique_ptr<GradServerHost> host;
  if (world.rank() <= 2)
    host =
        std::make_unique<GradServerHost>(rpc, "ps", "worker0", std::vector<std::string>{"worker1", "worker2"}, options);
  if (world.rank() == 0) host->manage_model(*served, sgd);
  rpc.barrier();
  GradServer ps(rpc, "ps", std::nullopt, store);
  torch::nn::Linear mine(3, 2);
  EXPECT_EQ(ps.pull(*mine), 1);
  const auto start = flat(*mine);
  EXPECT_TRUE(torch::equal(start, flat(*served)));
  // Round 1: gradients 1, 2 to worker1 (from ranks 0, 1) and 3, 4 to worker2 (ranks 2, 0).
  const std::vector<std::pair<double, std::string>> plan[3] = {
      {{1, "worker1"}, {4, "worker2"}}, {{2, "worker1"}}, {{3, "worker2"}}};
  for (const auto& [value, to] : plan[world.rank()]) {
    set_grads(*mine, value);
    ps.push(*mine, to);
  }
  rpc.barrier();
  ps.flush();  // nothing held: a no-op
  rpc.barrier();
  const double g = method == ReduceMethod::mean ? (1 + 2 + 3 + 4) / 4.0 : (1 + 2 + 3 + 4);
  EXPECT_EQ(ps.pull(*mine), 2);
  EXPECT_TRUE(torch::equal(flat(*mine), start.add(torch::full_like(start, g), -lr))) << flat(*mine) << start;
  // Round 2, short batches flushed: 1, 2, 3 to worker1 and 10 to worker2. The mean over the
  // four is 4; machin's mean of batch means would give (2 + 10) / 2 = 6.
  const auto before = flat(*mine);
  const std::vector<std::pair<double, std::string>> plan2[3] = {
      {{1, "worker1"}, {10, "worker2"}}, {{2, "worker1"}}, {{3, "worker1"}}};
  for (const auto& [value, to] : plan2[world.rank()]) {
    set_grads(*mine, value);
    ps.push(*mine, to);
  }
  rpc.barrier();
  if (world.rank() == 1) ps.flush();
  rpc.barrier();
  EXPECT_EQ(ps.pull(*mine), 3);
  const double g2 = method == ReduceMethod::mean ? 4.0 : 16.0;
  EXPECT_TRUE(torch::equal(flat(*mine), before.add(torch::full_like(before, g2), -lr)));
  if (world.rank() == 0) EXPECT_EQ(host->steps(), 2);
  rpc.barrier();
  host.reset();
  rpc.barrier();
  store_host.reset();
  rpc.shutdown();
}

TEST(GradServer, MeanIsTheMeanOverEveryPushedGradient) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "grad_mean", 240s));
}

TEST(GradServer, SumIsTheSumOfEveryPushedGradient) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "grad_mean", 240s, {"PUSH_TEST_SUM=1"}));
}

// The primary publishes through another member's ordered server, a round trip per version,
// while the secondaries' sums keep arriving: publishing never holds the server's lock.
TEST(GradServer, PublishesThroughAnotherMembersOrderedServer) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "grad_mean", 240s, {"PUSH_TEST_REMOTE_STORE=1"}));
}

// One process is primary, secondary and client, with reduce_batch_size = max_queue_size =
// 1: every push is forwarded at once and the primary steps on it; its first step lasts until
// the second push is blocked (after_step waits for a gate). The second push finds the
// secondary full and returns only once the first one's step is done.
PUSH_DIST_WORKER(grad_backpressure) {
  auto world = push::testing::test_world(60s);
  auto rpc = world.rpc_group("pressure", world.names());
  torch::nn::Linear served(2, 1);
  torch::optim::SGD sgd(served->parameters(), torch::optim::SGDOptions(0.1));
  if (world.rank() == 0) {
    GradServerHost host(rpc, "ps", "worker0", {"worker0"}, GradServerOptions().reduce_batch_size(1).max_queue_size(1));
    std::atomic<int> stepped{0};
    std::promise<void> gate;
    std::shared_future<void> opened = gate.get_future().share();
    host.manage_model(*served, sgd, [&] {
      if (stepped.load() == 0) opened.wait();  // the thread blocks, as a long step would
      ++stepped;
    });
    GradServer ps(rpc, "ps");
    torch::nn::Linear mine(2, 1);
    set_grads(*mine, 1);
    // The gate opens once this thread lies blocked in the second push (bounded: a push that
    // never blocks has returned, and failed the check below, long before).
    const pid_t me = ::gettid();
    std::atomic<bool> second{false};
    std::thread opener([&] {
      push::testing::eventually([&] { return second.load(); });
      push::testing::ThreadSample last;
      push::testing::eventually([&] { return push::testing::asleep_in_one_wait(me, last); });
      gate.set_value();
    });
    ps.push(*mine);  // forwarded at once: the primary's step begins, and waits at the gate
    second = true;
    ps.push(*mine);  // full: returns only once that step is done (without the bound: at once)
    EXPECT_GE(stepped.load(), 1);
    opener.join();
    ps.flush();
    EXPECT_EQ(stepped.load(), 2);
    EXPECT_EQ(host.steps(), 2);
    // Bad input, named.
    torch::nn::Linear other(3, 1);
    set_grads(*other, 1);
    ps.push(*other);  // the secondary takes it; the primary refuses it when forwarded
    EXPECT_PUSH_ERROR(ps.flush(), "gradient 'weight' has shape [1, 3], the parameter [1, 2]");
    torch::nn::Linear no_grad(2, 1);
    EXPECT_PUSH_ERROR(ps.push(*no_grad), "parameter 'weight' has no gradient");
    EXPECT_PUSH_ERROR(ps.push(*mine, "worker1"), "'worker1' is not one of its secondary reducers");
    EXPECT_PUSH_ERROR(
        GradServerHost(rpc, "q", "worker0", {"worker0"}, GradServerOptions().reduce_batch_size(4).max_queue_size(2)),
        "max_queue_size (2) must be >= reduce_batch_size (4)");
    EXPECT_PUSH_ERROR(GradServerHost(rpc, "q", "worker0", {}), "needs at least one secondary");
    EXPECT_PUSH_ERROR(GradServerHost(rpc, "q", "worker9", {"worker0"}), "'worker9' is not a member");
    EXPECT_PUSH_ERROR(host.manage_model(*served, sgd), "manages a model already");
  } else {
    // Neither primary nor secondary; no such server.
    EXPECT_PUSH_ERROR(GradServerHost(rpc, "r", "worker0", {"worker0"}),
                      "is neither its primary reducer nor a secondary");
    EXPECT_PUSH_ERROR(GradServer(rpc, "nobody").pull(*served), "server 'nobody'");
  }
  rpc.barrier();
  rpc.shutdown();
}

// One process is primary, secondary and client; the model is published into a backend of
// the user's (an in-memory OrderedServerBase) instead of an ordered server the primary
// hosts, and clients pull it from there. The reducers add up on `device`.
void grad_through_store(const torch::Device& device) {
  auto world = push::testing::test_world(60s);
  auto rpc = world.rpc_group("store", world.names());
  auto store = std::make_shared<push::testing::MemoryStore>("memory");
  torch::manual_seed(3);
  torch::nn::Linear served(2, 1);
  const double lr = 0.25;
  torch::optim::SGD sgd(served->parameters(), torch::optim::SGDOptions(lr));
  GradServerHost host(rpc, "ps", "worker0", {"worker0"},
                      GradServerOptions().reduce_batch_size(1).model_store(store).reduce_device(device));
  host.manage_model(*served, sgd);  // version 1, into the store
  EXPECT_EQ(store->pushes.load(), 1);
  GradServer ps(rpc, "ps", std::nullopt, store);
  torch::nn::Linear mine(2, 1);
  EXPECT_EQ(ps.pull(*mine), 1);
  const auto start = flat(*mine);
  set_grads(*mine, 3);
  ps.push(*mine);
  set_grads(*mine, 5);
  ps.push(*mine);
  ps.flush();
  EXPECT_EQ(host.steps(), 2);  // a step per push: reduce_batch_size 1
  EXPECT_EQ(ps.pull(*mine), 3);
  EXPECT_TRUE(torch::equal(flat(*mine), start.add(torch::full_like(start, 8.0), -lr))) << flat(*mine) << start;
  // The store holds each published version under "<name>/model"; no ordered server of the
  // primary's own holds it.
  EXPECT_TRUE(store->pull("ps/model", 1).has_value());
  EXPECT_PUSH_ERROR(GradServer(rpc, "ps", 2s).pull(*mine), "ps/model");
  // A device this process does not have, named.
  EXPECT_PUSH_ERROR(
      GradServerHost(rpc, "q", "worker0", {"worker0"}, GradServerOptions().reduce_device(torch::Device("cuda:99"))),
      "reduce_device cuda:99 is not a device of this process");
  if (!torch::cuda::is_available()) {
    EXPECT_PUSH_ERROR(
        GradServerHost(rpc, "q", "worker0", {"worker0"}, GradServerOptions().reduce_device(torch::Device("cuda"))),
        "reduce_device cuda is not a device of this process (0 CUDA devices)");
  }
  rpc.barrier();
  rpc.shutdown();
}

PUSH_DIST_WORKER(grad_store) { grad_through_store(torch::kCPU); }

PUSH_DIST_WORKER(grad_store_cuda) { grad_through_store(torch::Device("cuda:0")); }

TEST(GradServer, PublishesThroughAnotherOrderedServerBackend) {
  push::testing::expect_all_ok(push::testing::run_workers(1, "grad_store", 120s));
}

TEST(GradServer, ReducesOnTheGpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  push::testing::expect_all_ok(push::testing::run_workers(1, "grad_store_cuda", 120s));
}

TEST(GradServer, AFullSecondaryHoldsPushersBackAndBadInputIsNamed) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "grad_backpressure", 120s));
}

}  // namespace
