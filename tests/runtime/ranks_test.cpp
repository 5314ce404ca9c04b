// One distribution over several processes (PushOptions::world): placement, messages,
// chains and cycles of waits that cross ranks, views and parameters of particles on other
// ranks, errors that name the rank, save on some ranks and load on others, a rank killed
// mid-epoch. Each test starts its ranks itself on 127.0.0.1 (tests/dist/dist_test_util.h).
#include "dist_test_util.h"
#include "ranks_test_util.h"

#include <test_util.h>

#include <unistd.h>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

using namespace std::chrono_literals;
using push::Args;
using push::Particle;
using push::ParticleOptions;
using push::Pid;
using push::PushOptions;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

using push::testing::env_int;
using push::testing::env_str;
using push::testing::linear;

torch::Tensor flat(const std::vector<torch::Tensor>& ps) { return torch::nn::utils::parameters_to_vector(ps); }

// Sets every parameter of the particle to `value`.
c10::IValue fill(Particle& p, const Args& a) {
  torch::NoGradGuard no_grad;
  for (auto& t : p.module().parameters()) t.fill_(a.at(0).toDouble());
  return c10::IValue();
}

// Handlers of the tests below; `dist` is read only inside handlers, after it is built.
ParticleOptions test_particle(push::Push*& dist) {
  return ParticleOptions()
      .on("where", [&dist](Particle& p,
                           const Args&) { return c10::IValue(static_cast<int64_t>(dist->rank() * 100 + p.lane())); })
      .on("chain",
          [&dist](Particle& p, const Args& a) {
            // The next particle's chain(n - 1), plus one: consecutive ids alternate ranks.
            const int64_t n = a.at(0).toInt();
            if (n == 0) return c10::IValue(int64_t{0});
            const Pid next = (p.pid() + 1) % dist->num_particles();
            return c10::IValue(p.send(next, "chain", n - 1).wait().toInt() + 1);
          })
      .on("cycle",
          [](Particle& p, const Args& a) {
            // A -> B -> A: B calls back into A while A's handler waits for B.
            const Pid other = a.at(0).toInt();
            return c10::IValue(p.send(other, "back", p.pid()).wait().toInt() + 1);
          })
      .on("back", [](Particle& p,
                     const Args& a) { return c10::IValue(p.send(a.at(0).toInt(), "where").wait().toInt() + 1000); })
      .on("echo",
          [](Particle& p, const Args& a) {
            auto t = a.at(0).toTensor();
            EXPECT_EQ(t.device(), p.device());
            return c10::IValue(t * 2);
          })
      .on("boom", [](Particle&, const Args&) -> c10::IValue { throw std::runtime_error("boom from the handler"); })
      .on("fill", fill)
      .on("flat", [](Particle& p, const Args&) { return c10::IValue(flat(p.module().parameters()).clone()); })
      .on("peek",
          [](Particle& p, const Args& a) {
            auto view = p.get(a.at(0).toInt()).wait();
            return c10::IValue(view.flat_parameters());
          })
      .on("own", [](Particle& p, const Args& a) { return p.forward(a.at(0).toTensor()).wait(); })
      .on("run_view", [](Particle& p, const Args& a) {
        return p.forward_view(p.get(a.at(0).toInt()).wait(), a.at(1).toTensor()).wait();
      });
}

}  // namespace

// 4 particles over 2 ranks (PUSH_TEST_LANES lanes each): every rank drives at once.
PUSH_DIST_WORKER(ranks_messages) {
  auto world = push::testing::test_world(60s);
  const int lanes = env_int("PUSH_TEST_LANES", 1);
  push::Push* handle = nullptr;
  push::Push dist(linear, PushOptions().devices(lanes).cache_size(1).world(world));
  handle = &dist;
  const int n = 2 * world.size() * lanes;
  for (int i = 0; i < n; ++i) EXPECT_EQ(dist.p_create(test_particle(handle)), i);
  EXPECT_EQ(dist.world_size(), world.size());
  EXPECT_EQ(dist.num_particles(), n);
  EXPECT_EQ(static_cast<int>(dist.local_particle_ids().size()), n / world.size());
  for (Pid pid = 0; pid < n; ++pid) {
    // Global lane pid % (ranks x lanes), lanes numbered rank by rank.
    const int g = static_cast<int>(pid % (world.size() * lanes));
    EXPECT_EQ(dist.rank_of(pid), g / lanes);
    EXPECT_EQ(dist.lane_of(pid), g % lanes);
    EXPECT_EQ(dist.p_launch(pid, "where").wait().toInt(), dist.rank_of(pid) * 100 + dist.lane_of(pid));
  }
  // Chains 40 deep and cycles, crossing ranks at every hop, from every rank at once.
  std::vector<push::PFuture> fs;
  for (Pid pid = 0; pid < n; ++pid) fs.push_back(dist.p_launch(pid, "chain", int64_t{40}));
  for (const auto& v : dist.p_wait(fs)) EXPECT_EQ(v.toInt(), 40);
  const Pid a = 0, b = 1;  // on different ranks
  EXPECT_EQ(dist.p_launch(a, "cycle", b).wait().toInt(), 1000 + 0 + 1);
  EXPECT_EQ(dist.p_launch(b, "cycle", a).wait().toInt(), 1000 + 100 * dist.rank_of(b) + dist.lane_of(b) + 1);
  // Tensors cross unchanged and land on the receiver's device.
  auto x = torch::arange(6, torch::kFloat32).reshape({2, 3});
  for (Pid pid = 0; pid < n; ++pid) {
    EXPECT_TRUE(torch::equal(dist.p_launch(pid, "echo", x).wait().toTensor(), x * 2));
  }
  // A view from another rank runs that particle's forward here.
  const auto column = torch::linspace(-1, 1, 4).unsqueeze(1).expand({4, 2}).contiguous();
  EXPECT_TRUE(torch::equal(dist.p_launch(a, "run_view", b, column).wait().toTensor(),
                           dist.p_launch(b, "own", column).wait().toTensor()));
  // A handler that throws on another rank: the error names the rank, particle and message.
  Pid remote = 0;
  while (dist.rank_of(remote) == world.rank()) ++remote;
  EXPECT_PUSH_ERROR(dist.p_launch(remote, "boom").wait(),
                    c10::str("particle ", remote, ", message 'boom': on rank ", dist.rank_of(remote), " (worker",
                             dist.rank_of(remote), "): boom from the handler"));
  EXPECT_PUSH_ERROR(dist.p_launch(remote, "nope").wait(), "unknown message 'nope'");
  EXPECT_PUSH_ERROR(dist.p_launch(99, "where"), "unknown particle id 99 (the distribution has");
  dist.barrier();
  // Parameters of a particle elsewhere are its own (fill them differently first).
  if (world.rank() == 0) {
    for (Pid pid = 0; pid < n; ++pid) dist.p_launch(pid, "fill", 0.5 + static_cast<double>(pid)).wait();
  }
  dist.barrier();
  for (Pid pid = 0; pid < n; ++pid) {
    auto ps = flat(dist.p_parameters(pid));
    EXPECT_TRUE(torch::equal(ps, torch::full_like(ps, 0.5 + static_cast<double>(pid)))) << "particle " << pid;
    EXPECT_TRUE(torch::equal(ps, dist.p_launch(pid, "flat").wait().toTensor()));
  }
  dist.barrier();
}

TEST(PushRanks, MessagesChainsAndCyclesCrossRanksOneLane) {
  expect_all_ok(run_workers(2, "ranks_messages", 120s, {"PUSH_TEST_LANES=1"}));
}

TEST(PushRanks, MessagesChainsAndCyclesCrossRanksTwoLanes) {
  expect_all_ok(run_workers(2, "ranks_messages", 120s, {"PUSH_TEST_LANES=2"}));
}

TEST(PushRanks, MessagesChainsAndCyclesCrossThreeRanks) {
  expect_all_ok(run_workers(3, "ranks_messages", 120s, {"PUSH_TEST_LANES=1"}));
}

// Views of a particle on another rank: cached until that particle runs again.
PUSH_DIST_WORKER(ranks_views) {
  auto world = push::testing::test_world(60s);
  push::Push* handle = nullptr;
  push::Push dist(linear, PushOptions().world(world));
  handle = &dist;
  const Pid a = dist.p_create(test_particle(handle));  // rank 0
  const Pid b = dist.p_create(test_particle(handle));  // rank 1
  ASSERT_EQ(dist.rank_of(a), 0);
  ASSERT_EQ(dist.rank_of(b), 1);
  if (world.rank() == 0) {
    dist.p_launch(b, "fill", 2.0).wait();
    auto first = dist.p_launch(a, "peek", b).wait().toTensor();
    EXPECT_TRUE(torch::equal(first, torch::full_like(first, 2.0)));
    const auto before = dist.cache_stats(0);
    auto again = dist.p_launch(a, "peek", b).wait().toTensor();  // b has not run: still current
    EXPECT_TRUE(torch::equal(again, first));
    const auto after = dist.cache_stats(0);
    EXPECT_EQ(after.view_hits, before.view_hits + 1);
    EXPECT_EQ(after.view_misses, before.view_misses);
    dist.p_launch(b, "fill", 3.0).wait();  // b ran: the next view is a fresh copy
    auto changed = dist.p_launch(a, "peek", b).wait().toTensor();
    EXPECT_TRUE(torch::equal(changed, torch::full_like(changed, 3.0)));
    EXPECT_EQ(dist.cache_stats(0).view_misses, after.view_misses + 1);
  }
  dist.barrier();
}

TEST(PushRanks, ViewsOfParticlesOnOtherRanksAreCachedUntilTheyRun) {
  expect_all_ok(run_workers(2, "ranks_views", 120s));
}

// Many particles over 2 ranks with 2 resident per lane: each keeps its own parameters.
PUSH_DIST_WORKER(ranks_many) {
  auto world = push::testing::test_world(120s);
  push::Push* handle = nullptr;
  push::Push dist(linear, PushOptions().cache_size(2).world(world));
  handle = &dist;
  const int n = static_cast<int>(push::testing::scaled(1000, 100));
  for (int i = 0; i < n; ++i) dist.p_create(test_particle(handle));
  if (world.rank() == 0) {
    std::vector<push::PFuture> fs;
    for (Pid pid = 0; pid < n; ++pid) fs.push_back(dist.p_launch(pid, "fill", static_cast<double>(pid)));
    dist.p_wait(fs);
  }
  dist.barrier();
  // Every rank reads every particle back (half of them from the other rank).
  for (Pid pid = 0; pid < n; ++pid) {
    auto ps = flat(dist.p_parameters(pid));
    ASSERT_TRUE(torch::equal(ps, torch::full_like(ps, static_cast<double>(pid)))) << "particle " << pid;
  }
  dist.barrier();
}

TEST(PushRanks, AThousandParticlesOverTwoRanksKeepTheirOwnParameters) {
  expect_all_ok(run_workers(2, "ranks_many", 300s));
}

// Rank 1 makes a collective call the others do not (a barrier where rank 0 saves): the
// round fails on both, naming both calls, instead of pairing unrelated data; every later
// collective fails at once; the distributions still leave without waiting.
PUSH_DIST_WORKER(ranks_out_of_step) {
  auto world = push::testing::test_world(60s);
  {
    push::Push* handle = nullptr;
    push::Push dist(linear, PushOptions().world(world));
    handle = &dist;
    for (int i = 0; i < 2; ++i) dist.p_create(test_particle(handle));
    const std::string dir = env_str("PUSH_TEST_DIR");
    if (world.rank() == 0) {
      EXPECT_PUSH_ERROR(dist.save(dir), "collective calls do not match");
    } else {
      EXPECT_PUSH_ERROR(dist.barrier(), "collective calls do not match");
    }
    EXPECT_PUSH_ERROR(dist.barrier(), "collective calls do not match");
    EXPECT_FALSE(std::filesystem::exists(dir)) << "nothing published";
  }
  // Ranks whose p_create calls diverged: the next collective says so.
  {
    push::Push* handle = nullptr;
    push::Push dist(linear, PushOptions().world(world));
    handle = &dist;
    for (int i = 0; i < 2 + world.rank(); ++i) dist.p_create(test_particle(handle));
    EXPECT_PUSH_ERROR(dist.barrier(), "particles");
  }
}

TEST(PushRanks, CollectivesOutOfStepFailOnEveryRankInsteadOfPairingUp) {
  const auto dir = std::filesystem::temp_directory_path() / ("push-ranks-step-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  expect_all_ok(run_workers(2, "ranks_out_of_step", 120s, {"PUSH_TEST_DIR=" + (dir / "ckpt").string()}));
  // The staging folder rank 0 made for the save is gone too (its parent may remain).
  EXPECT_TRUE(!std::filesystem::exists(dir) || std::filesystem::is_empty(dir)) << "left behind in " << dir;
  std::filesystem::remove_all(dir);
}

// A message can reach a rank before that rank has made the matching p_create: it waits
// there for the particle.
PUSH_DIST_WORKER(ranks_early_message) {
  auto world = push::testing::test_world(60s);
  push::Push* handle = nullptr;
  push::Push dist(linear, PushOptions().world(world));
  handle = &dist;
  if (world.rank() == 0) world.store().wait({"test/sent"}, 60s);  // rank 1 creates and sends first
  const Pid a = dist.p_create(test_particle(handle));             // lives on rank 0
  dist.p_create(test_particle(handle));
  if (world.rank() == 1) {
    push::PFuture where = dist.p_launch(a, "where");
    world.store().set("test/sent", {1});
    EXPECT_EQ(where.wait().toInt(), 0);
  }
  dist.barrier();
}

TEST(PushRanks, AMessageThatArrivesBeforeItsParticleIsCreatedWaitsForIt) {
  expect_all_ok(run_workers(2, "ranks_early_message", 120s));
}

// The owner of a particle fails to build it (its module factory throws there): a request
// for it from another rank fails at once with the owner's reason, and the next collective
// finds the ranks' particles differ.
PUSH_DIST_WORKER(ranks_failed_creation) {
  auto world = push::testing::test_world(60s);
  const bool owner = world.rank() == 0;
  push::Push* handle = nullptr;
  push::Push dist(
      [owner]() -> torch::nn::AnyModule {
        if (owner) throw std::runtime_error("no memory for this network");
        return linear();
      },
      PushOptions().world(world));
  handle = &dist;
  if (owner) {
    EXPECT_PUSH_ERROR(dist.p_create(test_particle(handle)), "no memory for this network");
    world.store().set("test/failed", {1});
  } else {
    const Pid a = dist.p_create(test_particle(handle));  // rank 0's, by the rule
    world.store().wait({"test/failed"}, 60s);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_PUSH_ERROR(dist.p_launch(a, "where").wait(), "could not be created on rank 0 (worker0)");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "the request waited for the particle";
  }
  EXPECT_PUSH_ERROR(dist.barrier(), "collective calls do not match");
}

TEST(PushRanks, AParticleItsOwnerFailedToBuildFailsRequestsAtOnce) {
  expect_all_ok(run_workers(2, "ranks_failed_creation", 120s));
}

TEST(PushRanks, PlacementBySizeIsForOneProcess) {
  push::dist::World world(push::dist::WorldOptions()
                              .rank(0)
                              .world_size(1)
                              .master_addr("127.0.0.1")
                              .master_port(push::testing::free_port()));
  EXPECT_PUSH_ERROR(push::Push(linear, PushOptions().placement(push::Placement::by_size).world(world)),
                    "placement by_size needs every particle's size on every rank");
}
