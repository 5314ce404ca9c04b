// Shared memory between members on one host: large values arrive unchanged through the
// rings (many tensors, odd sizes, more than a ring holds, several senders at once), the
// option turns it off, and a peer that stops reading and then dies fails the sender
// within 2 s instead of leaving it waiting on a full ring.
#include "dist_test_util.h"

#include "core/clock.h"

#include <test_util.h>

#include <torch/torch.h>

#include <unistd.h>
#include <csignal>
#include <fstream>
#include <thread>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::testing::expect_all_ok;
using push::testing::is_stopped;
using push::testing::rings_here;
using push::testing::run_workers;

namespace {

c10::IValue shm_echo(const RpcArgs& a) { return a.at(0); }
c10::IValue shm_pid(const RpcArgs&) { return c10::IValue(static_cast<int64_t>(::getpid())); }
c10::IValue shm_freeze(const RpcArgs&) {
  ::raise(SIGSTOP);  // the whole process, its I/O thread included, stops reading
  return c10::IValue();
}
PUSH_RPC_FUNCTION(shm_echo);
PUSH_RPC_FUNCTION(shm_pid);
PUSH_RPC_FUNCTION(shm_freeze);

/// Tensors that cross slot boundaries in every way: several in one slot, one over many
/// slots, an empty one, a non-contiguous one, and more bytes than a 16-slot ring holds.
c10::IValue large_value(int64_t seed) {
  torch::manual_seed(seed);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::randn({3 << 18}));                         // 3 MiB
  list.push_back(torch::randint(-100, 100, {100}, torch::kInt8));  // 100 bytes
  list.push_back(torch::randn({384, 512}, torch::kDouble).t());    // 1.5 MiB, transposed
  list.push_back(torch::empty({0}));
  list.push_back(torch::randn({5 << 20}));  // 20 MiB
  return list;
}

void expect_same(const c10::IValue& a, const c10::IValue& b) {
  const auto x = a.toListRef(), y = b.toListRef();
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].toTensor().scalar_type(), y[i].toTensor().scalar_type()) << i;
    EXPECT_TRUE(torch::equal(x[i].toTensor(), y[i].toTensor())) << "tensor " << i;
  }
}

}  // namespace

PUSH_DIST_WORKER(shm_values) {
  auto world = push::testing::test_world(60s);
  {
    auto rpc = world.rpc_group("shm", world.names());
    if (world.rank() == 0) {
      EXPECT_EQ(rings_here(), 0);
      const auto v = large_value(1);
      expect_same(rpc.rpc_sync(1, "shm_echo", {v}), v);
      EXPECT_EQ(rings_here(), 1) << "the request went through this member's ring";
      // Several senders at once share the connection and its ring.
      std::vector<std::thread> senders;
      for (int t = 0; t < 4; ++t) {
        senders.emplace_back([&, t] {
          for (int i = 0; i < 5; ++i) {
            torch::manual_seed(100 * t + i);
            const auto x = torch::randn({(1 << 19) + 7 * i});  // 2 MiB and a little
            EXPECT_TRUE(torch::equal(rpc.rpc_sync(1, "shm_echo", {x}).toTensor(), x));
          }
        });
      }
      for (auto& s : senders) s.join();
    } else {
      // Replies of worker1 went through worker1's own ring.
      rpc.barrier();
      EXPECT_EQ(rings_here(), 1);
    }
    if (world.rank() == 0) rpc.barrier();
    rpc.shutdown();
  }
  EXPECT_EQ(rings_here(), 0) << "a ring lives as long as its connection";
  // Turned off, the same values go through the sockets.
  auto off = world.rpc_group("no-shm", world.names(), push::dist::RpcGroupOptions().shared_memory(false));
  if (world.rank() == 0) {
    const auto v = large_value(2);
    expect_same(off.rpc_sync(1, "shm_echo", {v}), v);
  }
  off.barrier();
  EXPECT_EQ(rings_here(), 0);
  off.shutdown();
}

TEST(DistRpcShm, LargeValuesCrossThroughSharedMemoryUnchanged) { expect_all_ok(run_workers(2, "shm_values", 120s)); }

PUSH_DIST_WORKER(shm_reader_dies) {
  auto world = push::dist::World(push::dist::WorldOptions::from_env().rpc_timeout(3s).timeout(3s).shutdown_timeout(2s));
  auto rpc = world.rpc_group("frozen", world.names(), push::dist::RpcGroupOptions().timeout(3s));
  if (world.rank() == 1) {
    rpc.barrier(60s);  // worker0's call of "shm_freeze" stops this process, then it is killed
    return;
  }
  const auto pid = static_cast<pid_t>(rpc.rpc_sync(1, "shm_pid", {}).toInt());
  auto frozen = rpc.rpc_async(1, "shm_freeze", {}, 60s);
  using push::detail::Clock;
  if (!Clock::poll_until(Clock::deadline_after(30s), 1ms, [&] { return is_stopped(pid); })) {
    ::kill(pid, SIGKILL);
    FAIL() << "worker1 never stopped";
  }
  // 64 MiB into a 16 MiB ring that nobody empties: the sender waits for a slot.
  std::atomic<bool> done{false};
  std::string error;
  std::chrono::steady_clock::time_point failed;
  std::thread sender([&] {
    try {
      rpc.rpc_sync(1, "shm_echo", {torch::ones({16 << 20})}, 60s);
    } catch (const push::Error& e) {
      error = e.what();
    }
    failed = std::chrono::steady_clock::now();
    done = true;
  });
  // Real time is the point: the sender, left alone for a while, neither finishes nor gives
  // up while the reader is merely stopped.
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(done) << "the sender should be waiting for the frozen reader: " << error;
  const auto killed = std::chrono::steady_clock::now();
  ::kill(pid, SIGKILL);
  sender.join();
  EXPECT_LT(failed - killed, 2s);
  EXPECT_NE(error.find("worker1 (rank 1"), std::string::npos) << error;
  EXPECT_PUSH_ERROR(frozen.wait(), "worker1 (rank 1)");
  try {
    rpc.shutdown();
  } catch (const push::Error&) {
    // worker1 never reaches the barrier of shutdown.
  }
}

TEST(DistFailure, AReaderThatStopsAndDiesFailsTheSenderOnItsRing) {
  auto codes = run_workers(2, "shm_reader_dies", 60s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
}
