// RPC handlers are fibers on event loops: nested calls to any depth, cycles between
// members, and a thousand calls waiting at once inside one member, with a bounded number
// of OS threads.
#include "dist_test_util.h"

#include <test_util.h>
#include <thread_count.h>

#include <atomic>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

// Set by the worker before any call can arrive (a barrier follows); atomic because the
// handlers that read them run on the group's threads.
std::atomic<push::dist::RpcGroup*> g_group{nullptr};

/// bounce(n): the other member's bounce(n-1), plus one; so a chain of n nested calls
/// that alternates between the two members, each waiting inside a handler for the next.
c10::IValue bounce(const RpcArgs& a) {
  const int64_t n = a.at(0).toInt();
  if (n == 0) return c10::IValue(int64_t{0});
  const int other = 1 - std::atoi(std::getenv("RANK"));
  return c10::IValue(g_group.load()->rpc_sync(other, "bounce", {c10::IValue(n - 1)}).toInt() + 1);
}
PUSH_RPC_FUNCTION(bounce);

c10::IValue shut_down_from_inside(const RpcArgs&) {
  g_group.load()->shutdown();
  return c10::IValue();
}
PUSH_RPC_FUNCTION(shut_down_from_inside);

// A gate that opens when `kHeld` calls are inside it at once.
constexpr int kHeld = 1000;
std::atomic<int> g_inside{0};
std::atomic<push::Promise<bool>*> g_gate{nullptr};
std::atomic<int> g_peak_threads{0};

c10::IValue hold(const RpcArgs&) {
  auto* gate = g_gate.load();
  auto open = gate->future();
  if (g_inside.fetch_add(1) + 1 == kHeld) {
    g_peak_threads = push::testing::count_threads();
    gate->set_value(true);
  }
  open.wait();  // suspends this handler's fiber until all of them are in
  return c10::IValue(int64_t{1});
}
PUSH_RPC_FUNCTION(hold);

}  // namespace

PUSH_DIST_WORKER(rpc_bounce) {
  auto world = push::testing::test_world(60s);
  auto rpc = world.rpc_group("bounce", world.names());
  g_group = &rpc;
  rpc.barrier();  // nobody calls before every member can answer
  if (world.rank() == 0) {
    // A cycle A -> B -> A -> B, then a chain 200 calls deep.
    EXPECT_EQ(rpc.rpc_sync(1, "bounce", {c10::IValue(int64_t{3})}).toInt(), 3);
    EXPECT_EQ(rpc.rpc_sync(1, "bounce", {c10::IValue(int64_t{200})}).toInt(), 200);
    // A handler cannot shut its own group down (shutdown would wait for the handler).
    EXPECT_PUSH_ERROR(rpc.rpc_sync(1, "shut_down_from_inside"), "cannot be shut down from one of its own handlers");
  }
  rpc.barrier();
  rpc.shutdown();
  g_group = nullptr;
}

TEST(DistRpcFibers, NestedCallsTwoHundredDeepAndCyclesComplete) { expect_all_ok(run_workers(2, "rpc_bounce", 120s)); }

PUSH_DIST_WORKER(rpc_thousand) {
  auto world = push::testing::test_world(60s);
  push::Promise<bool> gate;
  g_gate = &gate;
  const int before = push::testing::count_threads();
  auto rpc = world.rpc_group("thousand", world.names());
  if (world.rank() == 0) {
    std::vector<push::Future<c10::IValue>> calls;
    for (int i = 0; i < kHeld; ++i) calls.push_back(rpc.rpc_async(1, "hold"));
    int64_t sum = 0;
    for (auto& f : calls) sum += f.wait().toInt();
    EXPECT_EQ(sum, kHeld);
  }
  rpc.barrier();
  if (world.rank() == 1) {
    EXPECT_EQ(g_inside.load(), kHeld);
    // The group's event loops, its I/O thread, and the deadline of the barrier this rank is
    // in (store_barrier.h): a fixed number, not one per waiting call.
    EXPECT_LE(g_peak_threads.load() - before, push::dist::RpcGroupOptions().handler_threads() + 3)
        << "threads before the group: " << before << ", with 1000 calls waiting: " << g_peak_threads.load();
  }
  rpc.shutdown();
  g_gate = nullptr;
}

TEST(DistRpcFibers, AThousandCallsWaitAtOnceInOneMember) { expect_all_ok(run_workers(2, "rpc_thousand", 120s)); }
