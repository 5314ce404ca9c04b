// Save and load of a distribution over several ranks: every rank writes its own
// particles, rank 0 the manifest; a job of another size (1 process, 3 ranks) loads it and
// re-places the particles; a corrupt file on one rank fails the load on every rank and
// changes nothing anywhere.
#include "dist_test_util.h"
#include "ranks_test_util.h"
#include "scratch_dir.h"

#include <test_util.h>

#include <cstdlib>
#include <fstream>

using namespace std::chrono_literals;
using push::Args;
using push::Particle;
using push::ParticleOptions;
using push::Pid;
using push::PushOptions;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

constexpr int kParticles = 6;

using push::testing::linear;

ParticleOptions saved_particle() {
  return ParticleOptions().optimizer(push::testing::adam(0.1)).on("fill", [](Particle& p, const Args& a) {
    torch::NoGradGuard no_grad;
    for (auto& t : p.module().parameters()) t.fill_(a.at(0).toDouble());
    return c10::IValue();
  });
}

// Particle p holds p + 0.25 everywhere (what the saving job wrote).
void expect_saved_values(push::Push& dist) {
  ASSERT_EQ(dist.num_particles(), kParticles);
  for (Pid pid = 0; pid < kParticles; ++pid) {
    for (const auto& t : dist.p_parameters(pid)) {
      EXPECT_TRUE(torch::equal(t, torch::full_like(t, 0.25 + static_cast<double>(pid)))) << "particle " << pid;
    }
  }
}

std::string dir_from_env() { return push::testing::env_str("PUSH_TEST_DIR"); }

}  // namespace

PUSH_DIST_WORKER(ranks_save) {
  auto world = push::testing::test_world(60s);
  push::Push dist(linear, PushOptions().world(world));
  for (int i = 0; i < kParticles; ++i) dist.p_create(saved_particle());
  // Each rank fills its own particles.
  for (Pid pid : dist.local_particle_ids()) dist.p_launch(pid, "fill", 0.25 + static_cast<double>(pid)).wait();
  dist.save(dir_from_env());
  // Saving again over the checkpoint replaces it as a whole.
  dist.save(dir_from_env());
}

// Loads into a distribution with no particles (created by make_options) or into live
// ones (PUSH_TEST_MODE=live), on however many ranks this job has.
PUSH_DIST_WORKER(ranks_load) {
  auto world = push::testing::test_world(60s);
  push::Push dist(linear, PushOptions().world(world));
  const bool live = std::string(std::getenv("PUSH_TEST_MODE")) == "live";
  if (live) {
    for (int i = 0; i < kParticles; ++i) dist.p_create(saved_particle());
    if (world.rank() == 0) {
      for (Pid pid = 0; pid < kParticles; ++pid) dist.p_launch(pid, "fill", -1.0).wait();
    }
  }
  dist.barrier();
  dist.load(dir_from_env(), [](Pid) { return saved_particle(); });
  for (Pid pid = 0; pid < kParticles; ++pid) EXPECT_EQ(dist.rank_of(pid), pid % world.size());
  expect_saved_values(dist);
  dist.barrier();
}

// The file of particle 1 (rank 1's here) is damaged: every rank's load fails, and every
// particle keeps its values.
PUSH_DIST_WORKER(ranks_load_corrupt) {
  auto world = push::testing::test_world(60s);
  push::Push dist(linear, PushOptions().world(world));
  for (int i = 0; i < kParticles; ++i) dist.p_create(saved_particle());
  for (Pid pid : dist.local_particle_ids()) dist.p_launch(pid, "fill", -1.0).wait();
  if (world.rank() == 1) {
    EXPECT_PUSH_ERROR(dist.load(dir_from_env()), "particle-1.pt");
  } else {
    EXPECT_PUSH_ERROR(dist.load(dir_from_env()), "[push::Push::load] failed on rank 1 (worker1)");
  }
  dist.barrier();
  for (Pid pid = 0; pid < kParticles; ++pid) {
    for (const auto& t : dist.p_parameters(pid)) EXPECT_TRUE(torch::equal(t, torch::full_like(t, -1.0)));
  }
  dist.barrier();
}

TEST(PushRanksCheckpoint, SavedOnTwoRanksLoadsInOneProcessAndOnThreeRanks) {
  const auto dir = push::testing::fresh_dir("ranks", "two") / "ckpt";
  const std::string env = "PUSH_TEST_DIR=" + dir.string();
  expect_all_ok(run_workers(2, "ranks_save", 120s, {env}));
  ASSERT_TRUE(std::filesystem::exists(dir / "push.manifest"));
  // Nothing staged is left behind.
  for (const auto& entry : std::filesystem::directory_iterator(dir.parent_path())) {
    EXPECT_EQ(entry.path().filename(), "ckpt") << entry.path();
  }
  {
    push::Push one(linear, PushOptions().devices(2));
    one.load(dir, [](Pid) { return saved_particle(); });
    expect_saved_values(one);
    // Saved on ranks 0 and 1 (one lane each): back on lanes 0 and 1 of one process.
    for (Pid pid = 0; pid < kParticles; ++pid) EXPECT_EQ(one.lane_of(pid), pid % 2) << "particle " << pid;
  }
  expect_all_ok(run_workers(3, "ranks_load", 120s, {env, "PUSH_TEST_MODE=new"}));
  expect_all_ok(run_workers(2, "ranks_load", 120s, {env, "PUSH_TEST_MODE=live"}));
}

TEST(PushRanksCheckpoint, ACorruptFileOnOneRankFailsTheLoadOnEveryRankAndChangesNothing) {
  const auto dir = push::testing::fresh_dir("ranks", "corrupt") / "ckpt";
  const std::string env = "PUSH_TEST_DIR=" + dir.string();
  expect_all_ok(run_workers(2, "ranks_save", 120s, {env}));
  {
    std::fstream f(dir / "particle-1.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-40, std::ios::end);
    f.put('\x5a');
  }
  expect_all_ok(run_workers(2, "ranks_load_corrupt", 120s, {env}));
}
