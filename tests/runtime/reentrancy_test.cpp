// Members of Push called from inside a handler of the same distribution: save and load
// work (their work on the caller's own lane runs inline, the rest is waited for by
// suspending the handler), and destroying the distribution from a handler never joins a
// lane from itself.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "scratch_dir.h"
#include "test_util.h"
#include "thread_count.h"

namespace push {
namespace {

namespace fs = std::filesystem;
using testing::tiny_mlp;

fs::path reentrancy_dir(const std::string& name) { return testing::fresh_dir("reentrancy", name); }

using testing::threads_named;
// Lane threads are named push-lane-N.
int lane_threads() { return threads_named("push-lane"); }

TEST(Reentrancy, SaveFromAHandlerWritesTheCheckpoint) {
  for (int lanes : {1, 2}) {
    const fs::path dir = reentrancy_dir("save-" + std::to_string(lanes));
    Push dist(tiny_mlp, PushOptions().devices(lanes).cache_size(1));
    auto opts = ParticleOptions().optimizer(testing::adam()).on("checkpoint", [&](Particle&, const Args&) {
      dist.save(dir);
      return c10::IValue(true);
    });
    for (int i = 0; i < 3; ++i) dist.p_create(opts);
    EXPECT_TRUE(dist.p_launch(1, "checkpoint").wait().toBool()) << lanes << " lanes";
    Push other(tiny_mlp);
    other.load(dir, [&](Pid) { return opts; });
    ASSERT_EQ(other.num_particles(), 3);
    for (Pid pid = 0; pid < 3; ++pid) {
      EXPECT_TRUE(torch::equal(other.p_parameters(pid)[0], dist.p_parameters(pid)[0]));
    }
  }
}

TEST(Reentrancy, LoadFromAHandlerRestoresEveryParticle) {
  const fs::path dir = reentrancy_dir("load");
  Push dist(tiny_mlp, PushOptions().devices(2).cache_size(1));
  auto opts = ParticleOptions()
                  .optimizer(testing::adam())
                  .on("restore",
                      [&](Particle& p, const Args&) {
                        dist.load(dir);
                        return c10::IValue(p.module().parameters()[0].clone());
                      })
                  .on("nudge", [](Particle& p, const Args&) {
                    torch::NoGradGuard no_grad;
                    for (auto& t : p.module().parameters()) t.add_(1.0);
                    return c10::IValue();
                  });
  for (int i = 0; i < 3; ++i) dist.p_create(opts);
  std::vector<torch::Tensor> saved;
  for (Pid pid = 0; pid < 3; ++pid) saved.push_back(dist.p_parameters(pid)[0]);
  dist.save(dir);
  for (Pid pid = 0; pid < 3; ++pid) dist.p_launch(pid, "nudge").wait();
  auto seen = dist.p_launch(1, "restore").wait().toTensor();  // its own weights, reloaded
  EXPECT_TRUE(torch::equal(seen, saved[1]));
  for (Pid pid = 0; pid < 3; ++pid) {
    EXPECT_TRUE(torch::equal(dist.p_parameters(pid)[0], saved[pid])) << "particle " << pid;
  }
}

TEST(Reentrancy, DestroyingThePushFromAHandlerDefersTheShutdown) {
  const int lanes_before = lane_threads();
  auto dist = std::make_unique<Push>(tiny_mlp, PushOptions().devices(2));
  Promise<c10::IValue> never;
  auto opts = ParticleOptions()
                  .on("die",
                      [&dist](Particle& p, const Args&) {
                        dist.reset();  // the distribution this handler runs in
                        return c10::IValue(p.pid() + 40);
                      })
                  .on("hang", [f = never.future()](Particle&, const Args&) { return f.wait(); });
  dist->p_create(opts);
  dist->p_create(opts);  // both lanes have run a job: their threads are named
  EXPECT_EQ(lane_threads(), lanes_before + 2);
  PFuture hanging = dist->p_launch(1, "hang");  // suspended on the other lane
  PFuture died = dist->p_launch(0, "die");
  EXPECT_EQ(died.wait().toInt(), 40);            // the handler finished normally
  EXPECT_THROW(hanging.wait(), CancelledError);  // the shutdown unwound the other one
  EXPECT_EQ(dist, nullptr);
  // Every lane is joined shortly after by a background thread, which then ends too.
  testing::eventually([&] { return lane_threads() <= lanes_before && threads_named("push-shutdown") == 0; },
                      std::chrono::seconds(20));
  EXPECT_EQ(lane_threads(), lanes_before);
  EXPECT_EQ(threads_named("push-shutdown"), 0);
}

}  // namespace
}  // namespace push
