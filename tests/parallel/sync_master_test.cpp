// SyncMaster's run-time registration (jactorch's register_slave / SlavePipe.run_slave):
// slaves join after construction, a new replication retires the pipes before it, and
// misuse is named. (The fixed-count rendezvous is tested with synchronized batch norm.)
#include <push/parallel/sync_master.h>
#include <push/parallel/thread_pool.h>

#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

#include "test_util.h"

using push::parallel::SyncMaster;

namespace {

// Each participant gets the round's total plus its own index.
std::vector<int> total_plus_index(std::vector<int> messages) {
  const int total = std::accumulate(messages.begin(), messages.end(), 0);
  std::vector<int> out;
  for (size_t i = 0; i < messages.size(); ++i) out.push_back(total + static_cast<int>(i));
  return out;
}

TEST(SyncMaster, SlavesRegisterAtRunTimeAndANewSetRetiresTheEarlierPipes) {
  SyncMaster<int, int> master(total_plus_index);
  EXPECT_EQ(master.slaves(), 0);
  EXPECT_EQ(master.run_master(5), 5);  // alone: the master is the whole round
  // A replication: three slaves join, in the callback's order after the master.
  std::vector<SyncMaster<int, int>::SlavePipe> pipes;
  for (int i = 0; i < 3; ++i) pipes.push_back(master.register_slave());
  EXPECT_EQ(master.slaves(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pipes[i].index(), i + 1);
  for (int round = 0; round < 2; ++round) {  // rounds repeat with the same pipes
    std::vector<int> got(3);
    std::vector<std::thread> slaves;
    for (int i = 0; i < 3; ++i) slaves.emplace_back([&, i] { got[i] = pipes[i].run_slave(10 * (i + 1) + round); });
    const int total = 1 + 10 + 20 + 30 + 3 * round;
    EXPECT_EQ(master.run_master(1), total);
    for (auto& s : slaves) s.join();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], total + i + 1);
  }
  // The next replication: registering after a round has run starts a new set of one.
  auto fresh = master.register_slave();
  EXPECT_EQ(fresh.index(), 1);
  EXPECT_EQ(master.slaves(), 1);
  EXPECT_PUSH_ERROR(pipes[2].run_slave(7), "the pipe of participant 3 was retired");
  int got = 0;
  std::thread slave([&] { got = fresh.run_slave(4); });
  EXPECT_EQ(master.run_master(2), 6);
  slave.join();
  EXPECT_EQ(got, 7);
}

TEST(SyncMaster, RegisteringDuringARoundOrOnAFixedCountIsRefused) {
  SyncMaster<int, int> fixed(2, total_plus_index);
  EXPECT_PUSH_ERROR(fixed.register_slave(), "has a fixed 2 participants");
  SyncMaster<int, int> master(total_plus_index);
  auto pipe = master.register_slave();
  // On a one-thread pool the slave's wait suspends its fiber, so the registration below runs
  // while the slave has arrived and the master has not.
  push::parallel::ThreadPool one(1);
  auto slave = one.apply_async([&] { return pipe.run_slave(3); });
  EXPECT_PUSH_ERROR(one.apply([&] { master.register_slave(); }), "a round is under way (1 of 2 have arrived)");
  EXPECT_EQ(master.run_master(4), 7);
  EXPECT_EQ(slave.wait(), 8);
}

}  // namespace
