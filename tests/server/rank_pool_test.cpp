// RankPool and RemoteQueue over 3 ranks: registered functions run on the worker ranks,
// results in order, no worker above its slot count, failures named by item, queued calls
// cancellable; a queue hosted by one rank fed and drained by the others.
#include <push/server/queue_host.h>
#include <push/server/rank_pool.h>

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::parallel::TaskError;
using push::server::QueueHost;
using push::server::RankPool;
using push::server::RemoteQueue;

namespace {

std::atomic<int> g_inside{0}, g_peak{0};

c10::IValue pool_square(const RpcArgs& a) {
  const int now = ++g_inside;
  int peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  std::this_thread::sleep_for(2ms);  // real time is the point: long enough for calls to overlap
  --g_inside;
  const int64_t x = a.at(0).toInt();
  if (x == 13) throw std::runtime_error("thirteen");
  return x * x;
}
PUSH_RPC_FUNCTION(pool_square);

c10::IValue pool_add(const RpcArgs& a) { return a.at(0).toInt() + a.at(1).toInt(); }
PUSH_RPC_FUNCTION(pool_add);

c10::IValue pool_peak(const RpcArgs&) { return static_cast<int64_t>(g_peak.load()); }
PUSH_RPC_FUNCTION(pool_peak);

// A pool's initializer: what it sets, later calls on the same worker read.
std::atomic<int64_t> g_initialized{0};
c10::IValue pool_init(const RpcArgs& a) {
  g_initialized = a.at(0).toInt();
  return c10::IValue();
}
PUSH_RPC_FUNCTION(pool_init);
c10::IValue pool_read_init(const RpcArgs&) { return g_initialized.load(); }
PUSH_RPC_FUNCTION(pool_read_init);

// A pool with worker contexts (machin's CtxPool): the context comes first, then the item;
// the answer names the process it ran in.
std::string g_me;
c10::IValue pool_with_context(const RpcArgs& a) {
  return c10::str(a.at(0).toStringRef(), " in ", g_me, " x", a.at(1).toInt());
}
PUSH_RPC_FUNCTION(pool_with_context);

// A worker's slow calls hold their slots until the test lets them go (pool_release); each
// waits as a suspended handler fiber, so the release gets through.
push::Promise<bool> g_release;

c10::IValue pool_slow(const RpcArgs&) {
  g_release.future().wait();
  return c10::IValue();
}
PUSH_RPC_FUNCTION(pool_slow);

c10::IValue pool_release(const RpcArgs&) {
  g_release.set_value(true);
  return c10::IValue();
}
PUSH_RPC_FUNCTION(pool_release);

PUSH_DIST_WORKER(rank_pool) {
  auto world = push::testing::test_world(120s);
  g_me = "worker" + std::to_string(world.rank());
  auto rpc = world.rpc_group("pool", world.names());
  rpc.barrier();
  if (world.rank() == 0) {
    RankPool pool(rpc, {}, /*per_worker=*/2);
    EXPECT_EQ(pool.workers(), (std::vector<std::string>{"worker1", "worker2"}));
    std::vector<c10::IValue> items;
    for (int64_t i = 0; i < 100; ++i) items.push_back(i == 13 ? 12 : i);
    auto squares = pool.map("pool_square", items);
    for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(squares[i].toInt(), items[i].toInt() * items[i].toInt());
    // No worker ran more than 2 at once, and each ran some.
    for (const char* w : {"worker1", "worker2"}) {
      const auto peak = rpc.rpc_sync(w, "pool_peak").toInt();
      EXPECT_GE(peak, 1) << w;
      EXPECT_LE(peak, 2) << w;
    }
    EXPECT_EQ(pool.starmap("pool_add", {{1, 2}, {3, 4}})[1].toInt(), 7);
    EXPECT_EQ(pool.apply("pool_add", {5, 6}).toInt(), 11);
    try {
      pool.map("pool_square", {1, 13, 2});
      ADD_FAILURE() << "no throw";
    } catch (const TaskError& e) {
      EXPECT_EQ(e.index(), 1u);
      EXPECT_NE(std::string(e.what()).find("thirteen"), std::string::npos) << e.what();
    }
    std::set<size_t> seen;
    auto stream = pool.imap_unordered("pool_square", {1, 2, 3, 4});
    while (auto r = stream.next()) {
      EXPECT_EQ(r->value.toInt(), static_cast<int64_t>((r->index + 1) * (r->index + 1)));
      seen.insert(r->index);
    }
    EXPECT_EQ(seen.size(), 4u);
    auto ordered = pool.imap("pool_square", {3, 4});
    EXPECT_EQ(ordered.next()->value.toInt(), 9);
    EXPECT_EQ(ordered.next()->value.toInt(), 16);
    // 4 slots busy until released; the 6 calls behind them can be cancelled.
    std::vector<push::Future<c10::IValue>> calls;
    for (int i = 0; i < 10; ++i) calls.push_back(pool.apply_async("pool_slow"));
    push::testing::eventually([&] { return pool.queued() <= 6; });
    EXPECT_EQ(pool.queued(), 6u);  // 4 sent, the rest wait for a slot
    EXPECT_EQ(pool.cancel_queued(), 6u);
    for (const char* w : {"worker1", "worker2"}) rpc.rpc_sync(w, "pool_release");
    int cancelled = 0;
    for (auto& c : calls) {
      try {
        c.wait();
      } catch (const push::CancelledError&) {
        ++cancelled;
      }
    }
    EXPECT_EQ(cancelled, 6);
    EXPECT_PUSH_ERROR(pool.apply("no_such_function"), "no_such_function");
    EXPECT_PUSH_ERROR(RankPool(rpc, {"worker7"}), "'worker7' is not a member");
    EXPECT_PUSH_ERROR(RankPool(rpc, {}, 0), "per_worker must be >= 1");
    // machin's map_async / starmap_async, get(timeout), and a callback for an error.
    auto mapped = pool.map_async("pool_square", {2, 3, 4});
    auto starred = pool.starmap_async("pool_add", {{1, 2}, {3, 4}});
    const auto squares3 = mapped.get(30s);
    EXPECT_EQ(squares3.size(), 3u);
    EXPECT_EQ(squares3[2].toInt(), 16);
    EXPECT_EQ(starred.get(30s).at(1).toInt(), 7);
    auto failing = pool.map_async("pool_square", {1, 13});
    failing.wait_ready();
    EXPECT_TRUE(failing.has_error());
    EXPECT_THROW(failing.wait(), TaskError);
    push::Promise<std::string> heard;
    auto thirteen = pool.apply_async("pool_square", {13});
    thirteen.on_complete([thirteen, heard]() mutable {
      heard.set_value(thirteen.has_error() ? push::detail::describe(thirteen.error()) : "a value");
    });
    EXPECT_NE(heard.future().get(30s).find("thirteen"), std::string::npos);
    // A pool-wide initializer ran on every worker before the pool's first call there.
    RankPool initialized(rpc, push::server::RankPoolOptions().initializer("pool_init").initargs({int64_t{42}}));
    const auto read = initialized.starmap_async("pool_read_init", std::vector<RpcArgs>(8)).get(30s);
    for (const auto& v : read) EXPECT_EQ(v.toInt(), 42);
    EXPECT_EQ(rpc.rpc_sync("worker1", "pool_read_init").toInt(), 42);
    EXPECT_EQ(rpc.rpc_sync("worker2", "pool_read_init").toInt(), 42);
    EXPECT_PUSH_ERROR(RankPool(rpc, push::server::RankPoolOptions().initializer("pool_square").initargs({int64_t{13}})),
                      "the initializer 'pool_square' failed on worker");
    // A soft close: queued calls still run, new ones are refused, join waits for the rest.
    EXPECT_PUSH_ERROR(initialized.join(), "join() before close()");
    std::vector<c10::IValue> many;
    for (int64_t i = 20; i < 40; ++i) many.push_back(i);
    auto pending = initialized.map_async("pool_square", many);
    initialized.close();
    EXPECT_PUSH_ERROR(initialized.apply("pool_add", {1, 2}), "the pool is closed");
    initialized.join();
    EXPECT_EQ(initialized.queued(), 0u);
    EXPECT_EQ(pending.get(30s).at(19).toInt(), 39 * 39);
    // Worker contexts: each worker's own, handed to every call that runs there.
    {
      RankPool with_contexts(rpc, push::server::RankPoolOptions()
                                      .workers({"worker1", "worker2"})
                                      .per_worker(2)
                                      .worker_contexts({std::string("ctx of worker1"), std::string("ctx of worker2")}));
      std::vector<c10::IValue> xs;
      for (int64_t i = 0; i < 12; ++i) xs.push_back(i);
      const auto said = with_contexts.map("pool_with_context", xs);
      std::set<std::string> where;
      for (int64_t i = 0; i < 12; ++i) {
        const auto& s = said[i].toStringRef();
        const auto worker = s.substr(s.find(" in ") + 4, 7);
        EXPECT_EQ(s, "ctx of " + worker + " in " + worker + " x" + std::to_string(i));
        where.insert(worker);
      }
      EXPECT_EQ(where.size(), 2u);  // both ran some
      EXPECT_PUSH_ERROR(with_contexts.apply("no_such_function"), "no function named 'no_such_function'");
    }
    EXPECT_PUSH_ERROR(RankPool(rpc, push::server::RankPoolOptions().worker_contexts({int64_t{1}})),
                      "2 workers but 1 worker_contexts");
  }
  rpc.barrier();
  // A queue hosted by rank 1; ranks 0 and 2 put 100 values each, rank 1 and 2 take them.
  std::unique_ptr<QueueHost> host;
  if (world.rank() == 1) host = std::make_unique<QueueHost>(rpc, "jobs");
  rpc.barrier();
  RemoteQueue jobs(rpc, "jobs");
  std::vector<int64_t> got;
  if (world.rank() == 0 || world.rank() == 2) {
    for (int64_t i = 0; i < 100; ++i) jobs.put(world.rank() * 1000 + i);
  }
  if (world.rank() >= 1) {
    for (int i = 0; i < 100; ++i) got.push_back(jobs.get(30s)->toInt());
  }
  std::vector<int64_t> mine_all = got;
  rpc.barrier();
  EXPECT_TRUE(jobs.empty());
  EXPECT_FALSE(jobs.get(10ms).has_value());
  // Every value once: gather what ranks 1 and 2 took on rank 0 through the queue itself.
  rpc.barrier();
  if (world.rank() >= 1) jobs.put(c10::List<int64_t>(got));
  if (world.rank() == 0) {
    std::multiset<int64_t> all;
    for (int i = 0; i < 2; ++i) {
      for (auto v : jobs.get(30s)->toIntVector()) all.insert(v);
    }
    EXPECT_EQ(all.size(), 200u);
    for (int64_t r : {0, 2}) {
      for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(all.count(r * 1000 + i), 1u);
    }
  }
  rpc.barrier();
  // Closing fails a waiting get at once.
  if (world.rank() == 2) {
    EXPECT_PUSH_ERROR(jobs.get(60s), "get on a closed, empty queue");
  }
  if (world.rank() == 1) {
    // Rank 2's get waits at this host before rank 0 closes the queue.
    EXPECT_TRUE(push::testing::eventually([&] { return host->queue().waiting() == 1; }, 30s));
    world.store().set("test/get-waiting", {1});
  }
  if (world.rank() == 0) {
    world.store().wait({"test/get-waiting"}, 60s);
    jobs.close();
    EXPECT_PUSH_ERROR(jobs.put(1), "put on a closed queue");
  }
  rpc.barrier();
  host.reset();
  rpc.shutdown();
}

c10::IValue pool_die(const RpcArgs&) {
  std::_Exit(0);  // as kill -9 would, without a goodbye (0: the harness counts it as done)
}
PUSH_RPC_FUNCTION(pool_die);

// A worker that dies: its call fails, naming it, and the calls after it go to the worker
// still there.
PUSH_DIST_WORKER(rank_pool_dead_worker) {
  auto world = push::testing::test_world(60s);
  auto rpc = world.rpc_group("pool-dead", world.names());
  rpc.barrier();
  if (world.rank() == 0) {
    RankPool pool(rpc, {"worker1", "worker2"});
    EXPECT_THROW(pool.apply("pool_die"), push::Error);  // the least busy, worker1, first
    auto squares = pool.map("pool_square", {1, 2, 3, 4, 5, 6});
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(squares[i].toInt(), (i + 1) * (i + 1));
    EXPECT_EQ(rpc.lost_members(), (std::vector<int>{1}));
    // The last worker dies too: once its loss is known, calls fail at once, naming why.
    EXPECT_THROW(pool.apply("pool_die"), push::Error);
    EXPECT_TRUE(push::testing::eventually([&] { return rpc.lost_members() == std::vector<int>{1, 2}; }, 30s));
    EXPECT_PUSH_ERROR(pool.apply("pool_square", {2}), "every worker of the pool is lost; 'pool_square' was not sent");
  }
  rpc.shutdown();  // its closing barrier waits for the members still there only
}

TEST(RankPool, ADeadWorkerFailsItsCallAndTheOthersGoOnUntilAllAreLost) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "rank_pool_dead_worker", 120s));
}

TEST(RankPool, RunsRegisteredFunctionsOnWorkerRanksAndQueuesFeedAcrossRanks) {
  push::testing::expect_all_ok(push::testing::run_workers(3, "rank_pool", 240s));
}

}  // namespace
