// The ordered server: compare-and-set pushes from several ranks at once form one unbroken
// version chain; versions kept to the depth asked; bad input named.
#include <push/server/ordered_server.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::server::OrderedServer;
using push::server::OrderedServerHost;
using push::server::OrderedServerOptions;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

// Every rank pushes `n` versions of one key, each time reading the newest version and
// trying to push the next, retrying when another rank got there first. The host (rank 0)
// keeps every version, so the whole chain can be checked afterwards.
PUSH_DIST_WORKER(ordered_cas) {
  auto world = push::testing::test_world(120s);
  auto rpc = world.rpc_group("ordered", world.names());
  const int64_t n = push::testing::scaled(1000, 50);
  const int64_t total = n * world.size();
  std::unique_ptr<OrderedServerHost> host;
  if (world.rank() == 0)
    host = std::make_unique<OrderedServerHost>(rpc, "cas", OrderedServerOptions().version_depth(total + 1));
  rpc.barrier();
  OrderedServer server(rpc, "cas");
  if (world.rank() == 0) {
    EXPECT_TRUE(
        server.push("chain", c10::IValue(c10::ivalue::Tuple::create({int64_t{-1}, int64_t{-1}})), 0, std::nullopt));
    // A second creation loses, as any stale push does.
    EXPECT_FALSE(server.push("chain", c10::IValue(int64_t{7}), 1, std::nullopt));
  }
  rpc.barrier();
  int64_t won = 0, lost = 0;
  for (int64_t i = 0; i < n;) {
    const auto newest = server.pull("chain");
    ASSERT_TRUE(newest.has_value());
    const auto mine = c10::ivalue::Tuple::create({int64_t{world.rank()}, i});
    if (server.push("chain", c10::IValue(mine), newest->version + 1, newest->version)) {
      ++won;
      ++i;
    } else {
      ++lost;
    }
  }
  EXPECT_EQ(won, n);
  rpc.barrier();
  if (world.rank() == 0) {
    // One chain 0..total: each version once, and each rank's pushes in its own order, none
    // lost or twice.
    const auto newest = server.pull("chain");
    ASSERT_TRUE(newest.has_value());
    EXPECT_EQ(newest->version, total);
    std::vector<int64_t> next(world.size(), 0);
    for (int64_t v = 1; v <= total; ++v) {
      const auto got = server.pull("chain", v);
      ASSERT_TRUE(got.has_value()) << "version " << v << " missing";
      const auto& t = got->value.toTupleRef().elements();
      const auto rank = t.at(0).toInt();
      ASSERT_TRUE(rank >= 0 && rank < world.size());
      EXPECT_EQ(t.at(1).toInt(), next[rank]++) << "version " << v;
    }
    for (int r = 0; r < world.size(); ++r) EXPECT_EQ(next[r], n) << "rank " << r;
  }
  rpc.barrier();
  host.reset();
  rpc.shutdown();
}

TEST(OrderedServer, ConcurrentCompareAndSetPushesFormOneUnbrokenChain) {
  expect_all_ok(run_workers(4, "ordered_cas", 240s));
}

// Depth, copies, versions, absent keys and bad input, on 2 ranks (the host is rank 1).
PUSH_DIST_WORKER(ordered_basics) {
  auto world = push::testing::test_world(60s);
  auto rpc = world.rpc_group("basics", world.names());
  std::unique_ptr<OrderedServerHost> host;
  if (world.rank() == 1) host = std::make_unique<OrderedServerHost>(rpc, "kv", OrderedServerOptions().version_depth(2));
  rpc.barrier();
  OrderedServer server(rpc, "kv");
  if (world.rank() == 0) {
    EXPECT_FALSE(server.pull("w").has_value());
    auto w = torch::ones({3});
    EXPECT_TRUE(server.push("w", w, 1, std::nullopt));
    w.fill_(5);  // the stored value is a copy
    EXPECT_TRUE(torch::equal(server.pull("w")->value.toTensor(), torch::ones({3})));
    EXPECT_TRUE(server.push("w", w, 2, 1));
    EXPECT_FALSE(server.push("w", w, 3, 1));  // stale
    c10::Dict<std::string, at::Tensor> dict;
    dict.insert("a", torch::full({2}, 3.0));
    EXPECT_TRUE(server.push("w", dict, 3, 2));
    // Depth 2: versions 2 and 3 kept, 1 dropped.
    EXPECT_FALSE(server.pull("w", 1).has_value());
    EXPECT_TRUE(torch::equal(server.pull("w", 2)->value.toTensor(), torch::full({3}, 5.0)));
    auto newest = server.pull("w");
    ASSERT_TRUE(newest.has_value());
    EXPECT_EQ(newest->version, 3);
    EXPECT_TRUE(torch::equal(newest->value.toGenericDict().at("a").toTensor(), torch::full({2}, 3.0)));
    EXPECT_FALSE(server.pull("w", 9).has_value());
    // Versions may go down, but never repeat one still kept, nor equal prev_version.
    EXPECT_PUSH_ERROR(server.push("w", w, 2, 3), "version 2 of key 'w' exists");
    EXPECT_PUSH_ERROR(server.push("w", w, 3, 3), "equals prev_version");
    EXPECT_TRUE(server.push("w", w, -4, 3));
    EXPECT_EQ(server.pull("w")->version, -4);
    // A server nobody hosts.
    EXPECT_PUSH_ERROR(OrderedServer(rpc, "nobody").pull("w"), "pull on server 'nobody'");
    EXPECT_PUSH_ERROR(OrderedServerHost(rpc, "bad", OrderedServerOptions().version_depth(0)),
                      "version_depth must be >= 1");
  }
  rpc.barrier();
  if (world.rank() == 0) {
    // A second host of one name.
    EXPECT_PUSH_ERROR(OrderedServerHost(rpc, "kv"), "kv/push");
  }
  rpc.barrier();
  if (world.rank() == 1) {
    // The host's own process through the client: a copy too.
    auto t = torch::zeros({2});
    EXPECT_TRUE(server.push("own", t, 1, std::nullopt));
    t.fill_(7);
    EXPECT_TRUE(torch::equal(server.pull("own")->value.toTensor(), torch::zeros({2})));
    EXPECT_EQ(host->size(), 2u);
    host.reset();
  }
  rpc.barrier();
  // Once the host is gone, calls fail and name the server.
  EXPECT_PUSH_ERROR(server.pull("w"), "server 'kv'");
  rpc.barrier();
  rpc.shutdown();
}

TEST(OrderedServer, KeepsItsDepthStoresCopiesAndNamesBadInput) {
  expect_all_ok(run_workers(2, "ordered_basics", 120s));
}

}  // namespace
