// A rank killed mid-epoch: every future that depends on it fails within 2 s naming the
// rank and the particle, the surviving rank's own particles keep working, later messages
// to the dead rank fail at once, and the survivor's distribution shuts down without
// waiting for the dead rank.
#include "dist_test_util.h"

#include <test_util.h>

#include <time.h>

#include <array>
#include <atomic>
#include <csignal>

using namespace std::chrono_literals;
using push::Args;
using push::Particle;
using push::ParticleOptions;
using push::Pid;
using push::PushOptions;

namespace {

// CLOCK_MONOTONIC is one clock for every process of the machine.
double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::atomic<double> g_death{0};  // when rank 1 announced it dies (rank 0's process)

}  // namespace

// Particles 0, 2 on rank 0 and 1, 3 on rank 1. Rank 0 runs an epoch on every particle;
// particle 2 also waits on particle 3 from inside its handler. Particle 1 tells particle
// 0 the time, then kills its process in the middle of its epoch (particle 3's epoch, on
// the same lane, has not started).
PUSH_DIST_WORKER(ranks_killed) {
  auto world = push::dist::World(
      push::dist::WorldOptions::from_env().timeout(60s).rpc_timeout(60s).init_timeout(30s).shutdown_timeout(2s));
  push::Push dist(push::testing::tiny_mlp, PushOptions().world(world));
  auto opts = ParticleOptions()
                  .optimizer(push::testing::adam())
                  .on("epoch",
                      [](Particle& p, const Args&) {
                        auto x = torch::randn({64, 1}), y = torch::sin(x);
                        for (int step = 0; step < 400; ++step) {
                          p.step(push::testing::mse, x, y).wait();
                          if (p.pid() == 1 && step == 20) {
                            p.send(0, "death", now_s());  // written before send returns
                            std::raise(SIGKILL);
                          }
                          // The lane's epochs take turns (a wait on itself), so none of rank
                          // 1's epochs ends before particle 1 dies.
                          if (step % 20 == 0) p.send(p.pid(), "where").wait();
                        }
                        return c10::IValue(int64_t{400});
                      })
                  .on("death",
                      [](Particle&, const Args& a) {
                        g_death = a.at(0).toDouble();
                        return c10::IValue();
                      })
                  .on("relay", [](Particle& p, const Args&) { return p.send(3, "epoch").wait(); })
                  .on("where", [](Particle& p, const Args&) { return c10::IValue(p.pid()); });
  for (int i = 0; i < 4; ++i) dist.p_create(opts);
  if (world.rank() != 0) {
    std::this_thread::sleep_for(100s);  // real time is the point: particle 1 kills this process first
    return;
  }
  std::vector<push::PFuture> fs;
  for (Pid pid = 0; pid < 4; ++pid) fs.push_back(dist.p_launch(pid, "epoch"));
  auto relay = dist.p_launch(2, "relay");
  // When each future that depends on rank 1 completes.
  std::vector<push::PFuture> doomed{fs[1], fs[3], relay};
  const std::vector<Pid> doomed_pids{1, 3, 3};
  auto failed_at = std::make_shared<std::array<std::atomic<double>, 3>>();
  for (size_t i = 0; i < doomed.size(); ++i) {
    doomed[i].on_complete([failed_at, i] { (*failed_at)[i] = now_s(); });
  }
  // Rank 0's own particles finish their epochs.
  EXPECT_EQ(fs[0].wait().toInt(), 400);
  EXPECT_EQ(fs[2].wait().toInt(), 400);
  // Every future that depends on rank 1 fails, naming the particle and the rank, within
  // 2 s of the death.
  // Particle 0 hears of the death once its lane is free (after its epoch and particle 2's).
  push::testing::eventually([] { return g_death.load() != 0; });
  for (size_t i = 0; i < doomed.size(); ++i) {
    const Pid pid = doomed_pids[i];
    try {
      doomed[i].wait();
      ADD_FAILURE() << "particle " << pid << "'s future did not fail";
    } catch (const push::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c10::str("particle ", pid)), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 (worker1)"), std::string::npos) << what;
    }
    ASSERT_GT(g_death.load(), 0) << "particle 1 did not announce its death";
    EXPECT_LT((*failed_at)[i].load() - g_death.load(), 2.0) << "particle " << pid;
  }
  // Later messages to the dead rank fail at once; the living particles still answer.
  const double before = now_s();
  EXPECT_PUSH_ERROR(dist.p_launch(1, "where").wait(), "particle 1, message 'where': on rank 1 (worker1)");
  EXPECT_PUSH_ERROR(dist.p_parameters(3), "rank 1 (worker1)");
  EXPECT_LT(now_s() - before, 2.0);
  EXPECT_EQ(dist.p_launch(2, "where").wait().toInt(), 2);
  // Collectives fail at once instead of waiting for the dead rank.
  EXPECT_PUSH_ERROR(dist.barrier(), "rank 1 (worker1)");
}

TEST(PushRanksFailure, ARankKilledMidEpochFailsItsFuturesWithinTwoSeconds) {
  const auto codes = push::testing::run_workers(2, "ranks_killed", 120s);
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[0], 0) << "rank 0, the survivor";
  EXPECT_EQ(codes[1], 128 + SIGKILL) << "rank 1 killed itself";
}

// 3 ranks, rank 1 killed mid-epoch: rank 0's futures on it fail, and both survivors'
// distributions leave at once without it (they do not wait for a barrier it never reaches).
PUSH_DIST_WORKER(ranks_killed_of_three) {
  auto world = push::dist::World(
      push::dist::WorldOptions::from_env().timeout(60s).rpc_timeout(60s).init_timeout(30s).shutdown_timeout(2s));
  double left_s = 0;
  {
    push::Push dist(push::testing::tiny_mlp, PushOptions().world(world));
    auto opts = ParticleOptions()
                    .optimizer(push::testing::adam())
                    .on("epoch",
                        [](Particle& p, const Args&) {
                          auto x = torch::randn({64, 1}), y = torch::sin(x);
                          for (int step = 0; step < 100; ++step) {
                            p.step(push::testing::mse, x, y).wait();
                            if (p.pid() == 1 && step == 20) std::raise(SIGKILL);
                            // The lane's epochs take turns (a wait on itself), so particle 4's
                            // cannot end before particle 1 dies.
                            if (step % 5 == 0) p.send(p.pid(), "noop").wait();
                          }
                          return c10::IValue(int64_t{100});
                        })
                    .on("noop", [](Particle&, const Args&) { return c10::IValue(); });
    for (int i = 0; i < 6; ++i) dist.p_create(opts);  // rank r holds r and r + 3
    if (world.rank() == 0) {
      std::vector<push::PFuture> fs;
      for (Pid pid = 0; pid < 6; ++pid) fs.push_back(dist.p_launch(pid, "epoch"));
      for (Pid pid = 0; pid < 6; ++pid) {
        if (dist.rank_of(pid) == 1) {
          EXPECT_PUSH_ERROR(fs[static_cast<size_t>(pid)].wait(), "rank 1 (worker1)");
        } else {
          EXPECT_EQ(fs[static_cast<size_t>(pid)].wait().toInt(), 100);
        }
      }
      world.store().set("test/checked", {1});
    } else {
      world.store().wait({"test/checked"}, 60s);  // rank 1 never gets here
    }
    const double t0 = now_s();
    left_s = t0;  // the destructor runs at the end of this block
  }
  EXPECT_LT(now_s() - left_s, 5.0) << "rank " << world.rank() << " waited for the dead rank";
}

TEST(PushRanksFailure, WithThreeRanksTheSurvivorsLeaveWithoutTheDeadOne) {
  const auto codes = push::testing::run_workers(3, "ranks_killed_of_three", 120s);
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}
