// RpcGroup across 2-3 processes: calls by name and rank, services, pairs, remote values,
// barriers, errors, malformed wire messages, a member dying mid-call; and `push launch`.
#include "dist_test_util.h"

#include "core/clock.h"
#include "poll_real.h"

#include <test_util.h>

#include <unistd.h>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <thread>

using namespace std::chrono_literals;
using push::dist::RpcArgs;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

int env_rank() { return std::atoi(std::getenv("RANK")); }

c10::IValue add(const RpcArgs& a) { return a.at(0).toTensor() + a.at(1).toTensor(); }
c10::IValue whoami(const RpcArgs&) { return c10::IValue(static_cast<int64_t>(env_rank())); }
c10::IValue fail(const RpcArgs&) { throw std::runtime_error("boom from the callee"); }
c10::IValue die(const RpcArgs&) { _exit(9); }
c10::IValue echo(const RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(add);
PUSH_RPC_FUNCTION(whoami);
PUSH_RPC_FUNCTION(fail);
PUSH_RPC_FUNCTION(die);
PUSH_RPC_FUNCTION(echo);

std::vector<std::string> first_names(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back("worker" + std::to_string(i));
  return names;
}

/// Expects this member to hold no remote() values within 10 s: their releases arrive
/// asynchronously, after the handles are gone.
void expect_remote_values_released(const push::dist::RpcGroup& rpc) {
  using push::detail::Clock;
  Clock::poll_until(Clock::deadline_after(10s), 10ms, [&] { return rpc.owned_count() == 0; });
  EXPECT_EQ(rpc.owned_count(), 0u);
}

}  // namespace

PUSH_DIST_WORKER(rpc_calls) {
  auto world = push::testing::test_world();
  const int n = world.size(), rank = world.rank();
  auto rpc = world.rpc_group("calls", world.names());
  EXPECT_EQ(rpc.members(), first_names(n));
  EXPECT_TRUE(rpc.is_member("worker1"));
  EXPECT_FALSE(rpc.is_member("worker99"));
  for (int to = 0; to < n; ++to) {  // to itself too
    EXPECT_EQ(rpc.rpc_sync(to, "whoami").toInt(), to);
    auto sum =
        rpc.rpc_sync("worker" + std::to_string(to), "add", {torch::full({3}, rank + 1.0), torch::full({3}, 10.0 * to)});
    EXPECT_EQ(sum.toTensor()[2].item<double>(), rank + 1.0 + 10.0 * to);
  }
  std::vector<push::Future<c10::IValue>> futures;
  for (int i = 0; i < 20; ++i) futures.push_back(rpc.rpc_async(i % n, "whoami"));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(futures[i].wait().toInt(), i % n);
  // A callee's exception comes back with its rank and message.
  const int next = (rank + 1) % n;
  try {
    rpc.rpc_sync(next, "fail");
    ADD_FAILURE() << "expected a RemoteError";
  } catch (const push::dist::RemoteError& e) {
    EXPECT_EQ(e.rank(), next);
    EXPECT_EQ(e.remote_message(), "boom from the callee");
    EXPECT_NE(std::string(e.what()).find("worker" + std::to_string(next)), std::string::npos);
  }
  EXPECT_PUSH_ERROR(rpc.rpc_sync(next, "no_such_function"), "no function named 'no_such_function'");
  EXPECT_PUSH_ERROR(rpc.rpc_sync("worker99", "whoami"), "no worker is named 'worker99'");
  // remote: the value stays on the callee until the handle is gone.
  {
    auto r = rpc.remote(next, "add", {torch::ones({2}), torch::ones({2})});
    EXPECT_EQ(r.owner(), next);
    EXPECT_EQ(r.to_here().toTensor().sum().item<double>(), 4.0);
    auto copy = r;
    EXPECT_EQ(copy.to_here().toTensor().sum().item<double>(), 4.0);
  }
  rpc.barrier();
  // Every remote() handle above is gone: the owners drop the values (asynchronously).
  expect_remote_values_released(rpc);
  rpc.barrier();
  {
    auto kept = rpc.remote(next, "echo", {torch::full({1}, 5.0)});
    kept.wait_confirmed();
    rpc.barrier();
    EXPECT_EQ(rpc.owned_count(), 1u);  // the one `kept` by the previous rank
    rpc.barrier();
  }
  rpc.shutdown();
  EXPECT_PUSH_ERROR(rpc.rpc_sync(next, "whoami"), "shut down");
}

TEST(DistRpc, CallsByNameAndRankRemoteAndErrors) { expect_all_ok(run_workers(3, "rpc_calls")); }

PUSH_DIST_WORKER(rpc_services) {
  auto world = push::testing::test_world();
  const int rank = world.rank();
  // worker2 is not a member: it does not construct the group.
  if (rank == 2) {
    EXPECT_PUSH_ERROR(world.rpc_group("svc", {"worker0", "worker1"}), "only members create");
    world.barrier();
    return;
  }
  auto rpc = world.rpc_group("svc", {"worker1", "worker0"});
  EXPECT_EQ(rpc.members(), first_names(2));
  EXPECT_FALSE(rpc.is_member("worker2"));
  EXPECT_PUSH_ERROR(rpc.rpc_sync("worker2", "whoami"), "not a member of RPC group 'svc'");
  auto counter = std::make_shared<std::atomic<int64_t>>(0);
  if (rank == 0) {
    rpc.register_service("count", [counter](const RpcArgs& a) {
      return c10::IValue(counter->fetch_add(a.at(0).toInt()) + a.at(0).toInt());
    });
    rpc.pair("weights", torch::arange(4.0));
  }
  rpc.barrier();
  EXPECT_TRUE(rpc.is_registered("count"));
  EXPECT_FALSE(rpc.is_registered("nothing"));
  EXPECT_TRUE(rpc.is_paired("weights"));
  EXPECT_PUSH_ERROR(rpc.register_service("count", [](const RpcArgs&) { return c10::IValue(); }), "already registered");
  EXPECT_PUSH_ERROR(rpc.pair("weights", c10::IValue(1)), "already paired");
  EXPECT_PUSH_ERROR(rpc.registered_sync("nothing", {}), "no service 'nothing'");
  EXPECT_PUSH_ERROR(rpc.get_paired("nothing"), "no value is paired under 'nothing'");
  if (rank == 1) {
    EXPECT_PUSH_ERROR(rpc.deregister("count"), "not registered in group 'svc' by this process");
  }
  for (int i = 0; i < 5; ++i) rpc.registered_sync("count", {c10::IValue(int64_t{1})});
  EXPECT_GE(rpc.registered_async("count", {c10::IValue(int64_t{0})}).wait().toInt(), 5);
  auto handle = rpc.registered_remote("count", {c10::IValue(int64_t{0})});
  EXPECT_GE(handle.to_here().toInt(), 5);
  auto w = rpc.get_paired("weights");
  EXPECT_EQ(w.owner_name(), "worker0");
  EXPECT_EQ(w.to_here().toTensor().sum().item<double>(), 6.0);
  rpc.barrier();
  EXPECT_EQ(rpc.registered_sync("count", {c10::IValue(int64_t{0})}).toInt(), 10);
  rpc.barrier();
  if (rank == 0) {
    rpc.deregister("count");
    rpc.unpair("weights");
  }
  rpc.barrier();
  EXPECT_FALSE(rpc.is_registered("count"));
  EXPECT_FALSE(rpc.is_paired("weights"));
  EXPECT_PUSH_ERROR(w.to_here(), "no value is paired under 'weights'");
  // Now worker1 may take the key, once both have seen it free.
  rpc.barrier();
  if (rank == 1) rpc.register_service("count", [](const RpcArgs&) { return c10::IValue(int64_t{-1}); });
  rpc.barrier();
  EXPECT_EQ(rpc.registered_sync("count").toInt(), -1);
  rpc.shutdown();
  world.barrier();
}

TEST(DistRpc, ServicesPairsAndMembership) { expect_all_ok(run_workers(3, "rpc_services")); }

PUSH_DIST_WORKER(rpc_barriers) {
  auto world = push::testing::test_world();
  auto rpc = world.rpc_group("barriers", world.names());
  auto store = world.store();
  // Nobody leaves barrier i before everyone has arrived at it.
  for (int i = 0; i < 1000; ++i) {
    store.add("test/arrived", 1);
    rpc.barrier();
    EXPECT_GE(store.add("test/arrived", 0), static_cast<int64_t>(world.size()) * (i + 1)) << "barrier " << i;
  }
}

TEST(DistRpc, ThousandBarriersInARow) { expect_all_ok(run_workers(3, "rpc_barriers", 120s)); }

PUSH_DIST_WORKER(rpc_dies) {
  // The calls wait up to a minute: their failure must come from the closed connection.
  // The group's own timeout bounds shutdown's barrier, which worker1 never reaches.
  auto world = push::dist::World(push::dist::WorldOptions::from_env().rpc_timeout(3s).timeout(3s).shutdown_timeout(2s));
  auto rpc = world.rpc_group("dying", world.names(), push::dist::RpcGroupOptions().timeout(3s));
  if (world.rank() == 0) {
    EXPECT_EQ(rpc.rpc_sync(1, "whoami", {}, 60s).toInt(), 1);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_PUSH_ERROR(rpc.rpc_sync(1, "die", {}, 60s), "lost the connection to worker1 (rank 1)");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    // Later calls fail at once too: the dead member refuses the new connection.
    const auto again = std::chrono::steady_clock::now();
    EXPECT_PUSH_ERROR(rpc.rpc_sync(1, "whoami", {}, 60s), "worker1 (rank 1)");
    EXPECT_LT(std::chrono::steady_clock::now() - again, 2s);
    try {
      rpc.shutdown();
    } catch (const push::Error&) {
      // worker1 never reaches the barrier of shutdown.
    }
  } else {
    rpc.barrier(30s);  // worker0's call of "die" ends this process
  }
}

TEST(DistFailure, MemberDiesMidRpc) {
  auto codes = run_workers(2, "rpc_dies", 60s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 9);
}

PUSH_DIST_WORKER(rpc_three_one_dies) {
  auto world =
      push::dist::World(push::dist::WorldOptions::from_env().rpc_timeout(60s).timeout(3s).shutdown_timeout(2s));
  // Shutdown's barrier cannot complete without worker2: bound it by the group's timeout.
  auto rpc = world.rpc_group("three", world.names(), push::dist::RpcGroupOptions().timeout(3s));
  const int rank = world.rank();
  rpc.barrier(30s);
  if (rank == 2) {
    rpc.barrier(60s);  // a second barrier, which worker0's call of "die" ends
    return;
  }
  if (rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_PUSH_ERROR(rpc.rpc_sync(2, "die", {}, 60s), "worker2 (rank 2)");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    world.store().set("test/dead", {1});
  }
  world.store().wait({"test/dead"});  // worker1 goes on once worker2 is gone
  // The two that are left go on calling each other, and themselves.
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(rpc.rpc_sync(1 - rank, "whoami", {}, 60s).toInt(), 1 - rank);
    EXPECT_EQ(rpc.rpc_sync(rank, "whoami", {}, 60s).toInt(), rank);
  }
  auto sum = rpc.rpc_sync(1 - rank, "add", {torch::ones({4}), torch::ones({4})}, 60s);
  EXPECT_EQ(sum.toTensor().sum().item<double>(), 8.0);
  EXPECT_PUSH_ERROR(rpc.rpc_sync(2, "whoami", {}, 60s), "worker2 (rank 2)");
  try {
    rpc.shutdown();
  } catch (const push::Error&) {
    // worker2 never reaches the barrier of shutdown.
  }
}

TEST(DistFailure, ThreeMembersOneDiesTheOthersGoOn) {
  auto codes = run_workers(3, "rpc_three_one_dies", 90s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 9);
}

PUSH_DIST_WORKER(rpc_init_timeout) {
  auto world =
      push::dist::World(push::dist::WorldOptions::from_env().init_timeout(2s).timeout(30s).shutdown_timeout(5s));
  if (world.rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_PUSH_ERROR(world.rpc_group("lonely", world.names()),
                      "worker1 (rank 1) did not join RPC group 'lonely' within 2000 ms");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
  }
  world.barrier();  // worker1 never creates the group
}

TEST(DistFailure, GroupCreationObeysInitTimeout) { expect_all_ok(run_workers(2, "rpc_init_timeout", 60s)); }

// The job's store, set before the group exists (its handler threads start after it).
push::dist::Store g_late_store;

/// Echoes its argument once the caller opens the gate "test/late/open": a reply that comes
/// after the caller's timeout, however fast the machine.
c10::IValue gated_echo(const RpcArgs& a) {
  g_late_store.wait({"test/late/open"});
  return a.at(0);
}
PUSH_RPC_FUNCTION(gated_echo);

PUSH_DIST_WORKER(rpc_late_replies) {
  auto world = push::testing::test_world();
  g_late_store = world.store();
  auto rpc = world.rpc_group("late", world.names());
  if (world.rank() == 0) {
    {
      // The calls' deadlines are this process's: a ManualClock passes them while worker1's
      // handlers wait at the gate, so both replies come late.
      push::detail::ManualClock clock;
      auto call = rpc.rpc_async(1, "gated_echo", {torch::ones({2})}, 200ms);
      auto r = rpc.remote(1, "gated_echo", {torch::ones({1 << 16})}, 200ms);
      clock.advance(200ms);
      EXPECT_PUSH_ERROR(call.wait(), "within the timeout");
      EXPECT_PUSH_ERROR(r.wait_confirmed(), "within the timeout");
    }
    world.store().set("test/late/open", {1});
    // The late replies are dropped; calls after them get their own answers. worker1 runs
    // worker0's calls in order on one loop and answers them on one connection, so the late
    // replies arrive before the first answer below.
    for (int i = 0; i < 20; ++i) EXPECT_EQ(rpc.rpc_sync(1, "whoami").toInt(), 1);
    EXPECT_EQ(rpc.rpc_sync(1, "gated_echo", {c10::IValue(int64_t{3})}).toInt(), 3);
  }
  rpc.barrier();
  if (world.rank() == 1) {
    // The value kept for the timed-out remote() is released when its reply finds no caller.
    expect_remote_values_released(rpc);
  }
  rpc.barrier();
}

TEST(DistRpc, LateRepliesAreDroppedAndTheirRemoteValuesReleased) {
  expect_all_ok(run_workers(2, "rpc_late_replies", 60s));
}

// -- push launch --------------------------------------------------------------------------

PUSH_DIST_WORKER(launched) {
  auto world = push::testing::test_world();
  auto t = torch::full({1}, world.rank() + 1.0);
  world.collective().all_reduce(t);
  const int n = world.size();
  EXPECT_EQ(t.item<double>(), n * (n + 1) / 2.0);
  std::cout << "sum=" << t.item<double>() << " local_rank=" << world.local_rank() << std::endl;
}

PUSH_DIST_WORKER(launched_failing) {
  auto world = push::testing::test_world(60s);
  if (world.rank() == 1) std::exit(7);
  world.barrier();  // never completes: the launcher has to stop this rank
}

namespace {

std::vector<std::string> launch(int n, const std::string& worker_args) {
  return {PUSH_CLI_PATH,
          "launch",
          "--nproc",
          std::to_string(n),
          "--master-port",
          "0",
          "--",
          push::testing::self_path(),
          "--gtest_filter=DistWorker.DISABLED_Run",
          "--gtest_also_run_disabled_tests",
          "--gtest_brief=1"};
}

}  // namespace

TEST(DistLaunch, StartsRanksWithEnvironmentAndPrefixesOutput) {
  auto [code, output] = push::testing::run_program(launch(3, ""), {"PUSH_DIST_WORKER=launched"}, 60s);
  EXPECT_EQ(code, 0) << output;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(output.find("[rank " + std::to_string(r) + "] sum=6 local_rank=" + std::to_string(r)), std::string::npos)
        << output;
  }
}

TEST(DistLaunch, OneFailureStopsTheOthersWithItsCode) {
  const auto start = std::chrono::steady_clock::now();
  auto [code, output] = push::testing::run_program(launch(3, ""), {"PUSH_DIST_WORKER=launched_failing"}, 60s);
  EXPECT_EQ(code, 7) << output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_NE(output.find("rank 1 exited with code 7"), std::string::npos) << output;
}

TEST(DistLaunch, ForwardsSigtermAndReapsChildren) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    execl(PUSH_CLI_PATH, PUSH_CLI_PATH, "launch", "--nproc", "2", "--", "/bin/sh", "-c", "echo pid=$$; exec sleep 60",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  // Wait for both children to report their pids.
  std::string output;
  char buffer[256];
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::count(output.begin(), output.end(), '\n') < 2 && std::chrono::steady_clock::now() < deadline) {
    const ssize_t got = read(fds[0], buffer, sizeof(buffer));
    if (got <= 0) break;
    output.append(buffer, static_cast<size_t>(got));
  }
  std::vector<pid_t> children;
  for (size_t at = output.find("pid="); at != std::string::npos; at = output.find("pid=", at + 1)) {
    children.push_back(static_cast<pid_t>(std::atoi(output.c_str() + at + 4)));
  }
  ASSERT_EQ(children.size(), 2u) << output;
  kill(pid, SIGTERM);
  int status = 0;
  const bool reaped = push::testing::poll_real([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 15s,
                                               std::chrono::milliseconds(20));
  if (!reaped) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "push launch ignored SIGTERM";
  }
  close(fds[0]);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  for (pid_t child : children) EXPECT_NE(kill(child, 0), 0) << "child " << child << " survived";
}
