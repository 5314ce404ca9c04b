// Bad input and faults: each gives an exception whose text names the problem, and
// nothing hangs.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

namespace push {
namespace {

using testing::mse;
using testing::tiny_mlp;

TEST(Errors, UnknownParticleId) {
  Push dist(tiny_mlp);
  EXPECT_PUSH_ERROR(dist.p_launch(3, "x"), "unknown particle id 3 (the distribution has no particles)");
  auto opts = ParticleOptions()
                  .on("send", [](Particle& p, const Args&) { return p.send(42, "x").wait(); })
                  .on("get", [](Particle& p, const Args&) { return c10::IValue(p.get(42).wait().pid()); });
  dist.p_create(opts);
  dist.p_create(opts);
  EXPECT_PUSH_ERROR(dist.p_launch(7, "send"), "unknown particle id 7 (the distribution has 2 particles, ids 0..1)");
  EXPECT_PUSH_ERROR(dist.p_parameters(9), "unknown particle id 9");
  EXPECT_PUSH_ERROR(dist.p_launch(0, "send").wait(), "unknown particle id 42");
  EXPECT_PUSH_ERROR(dist.p_launch(1, "get").wait(), "[push::Particle::get] unknown particle id 42");
}

TEST(Errors, UnknownMessageNamesItAndTheKnownOnes) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions().on("train", [](Particle&, const Args&) { return c10::IValue(); }));
  EXPECT_PUSH_ERROR(dist.p_launch(pid, "trian").wait(), "unknown message 'trian' (particle 0 handles 'train')");
}

TEST(Errors, BadOptions) {
  EXPECT_PUSH_ERROR(Push(tiny_mlp, PushOptions().cache_size(0)), "cache_size must be at least 1, got 0");
  EXPECT_PUSH_ERROR(Push(tiny_mlp, PushOptions().view_size(0)), "view_size must be at least 1, got 0");
  EXPECT_PUSH_ERROR(Push(tiny_mlp, PushOptions().devices(0)), "devices must be at least 1, got 0");
  Push dist(tiny_mlp, PushOptions().devices(2));
  EXPECT_PUSH_ERROR(dist.p_create(ParticleOptions().device(2)),
                    "device 2 is out of range: the distribution has 2 devices");
  EXPECT_PUSH_ERROR(dist.p_create(ParticleOptions().device(-1)), "device -1 is out of range");
  EXPECT_PUSH_ERROR(dist.device(5), "device 5 is out of range");
}

TEST(Errors, FactoriesThatFail) {
  Push dist(tiny_mlp);
  EXPECT_PUSH_ERROR(
      dist.p_create(ParticleOptions().optimizer(
          [](std::vector<torch::Tensor>) -> std::unique_ptr<torch::optim::Optimizer> { return nullptr; })),
      "the optimizer factory returned null for particle 0");
  Push empty([] { return torch::nn::AnyModule(); });
  EXPECT_PUSH_ERROR(empty.p_create(), "the module factory returned an empty module");
  Push throwing([]() -> torch::nn::AnyModule { throw std::runtime_error("no weights"); });
  EXPECT_PUSH_ERROR(throwing.p_create(), "the module factory threw for particle 0: no weights");
}

TEST(Errors, HandlerExceptionReachesTheFutureWithPidAndMessage) {
  Push dist(tiny_mlp, PushOptions().devices(2));
  auto opts = ParticleOptions()
                  .on("boom", [](Particle&, const Args&) -> c10::IValue { throw std::runtime_error("kaput"); })
                  .on("relay", [](Particle& p, const Args&) {
                    return p.send(0, "boom").wait();  // rethrows inside this handler
                  });
  dist.p_create(opts);
  dist.p_create(opts);
  try {
    dist.p_launch(0, "boom").wait();
    FAIL() << "expected a ParticleError";
  } catch (const ParticleError& e) {
    EXPECT_EQ(e.pid(), 0);
    EXPECT_EQ(e.message_name(), "boom");
    EXPECT_STREQ(e.what(), "[push] particle 0, message 'boom': kaput");
    EXPECT_THROW(std::rethrow_exception(e.cause()), std::runtime_error);
  }
  EXPECT_PUSH_ERROR(dist.p_launch(1, "relay").wait(),
                    "[push] particle 1, message 'relay': [push] particle 0, message 'boom': kaput");
  // The lane survives: the next message works.
  EXPECT_PUSH_ERROR(dist.p_launch(0, "boom").wait(), "kaput");
}

TEST(Errors, NNOperationErrorsNameTheOperation) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions()
                              .optimizer(testing::adam())
                              .on("bad_step",
                                  [](Particle& p, const Args&) {
                                    return p.step(mse, torch::ones({4, 3}), torch::ones({4, 1})).wait();
                                  })
                              .on("no_sched", [](Particle& p, const Args&) { return p.scheduler_step().wait(); }));
  EXPECT_PUSH_ERROR(dist.p_launch(pid, "bad_step").wait(), "message 'step'");
  EXPECT_PUSH_ERROR(dist.p_launch(pid, "no_sched").wait(), "was created without a scheduler factory");
  Pid bare = dist.p_create(ParticleOptions().on("train", [](Particle& p, const Args&) {
    return p.step(mse, torch::ones({2, 1}), torch::ones({2, 1})).wait();
  }));
  EXPECT_PUSH_ERROR(dist.p_launch(bare, "train").wait(), "was created without an optimizer factory");
}

TEST(Errors, ParticleOutsideItsHandlerIsRefused) {
  Push dist(tiny_mlp);
  Particle* leaked = nullptr;
  Pid pid = dist.p_create(ParticleOptions().on("leak", [&leaked](Particle& p, const Args&) {
    leaked = &p;
    return c10::IValue();
  }));
  dist.p_launch(pid, "leak").wait();
  ASSERT_NE(leaked, nullptr);
  EXPECT_PUSH_ERROR(leaked->module(), "can only be used inside one of its own handlers");
  EXPECT_PUSH_ERROR(leaked->send(pid, "leak"), "can only be used inside one of its own handlers");
}

TEST(Errors, DestroyingWithPendingWorkCancelsItAndJoins) {
  Promise<c10::IValue> never;
  auto blocked = never.future();
  PFuture waiting, queued;
  {
    Push dist(tiny_mlp, PushOptions().devices(2));
    auto opts = ParticleOptions().on("block", [blocked](Particle&, const Args&) {
      return blocked.wait();  // suspended until the distribution goes away
    });
    dist.p_create(opts);
    dist.p_create(opts);
    waiting = dist.p_launch(0, "block");
    queued = dist.p_launch(1, "block");
    EXPECT_FALSE(waiting.wait_for(std::chrono::milliseconds(20)));
  }
  EXPECT_THROW(waiting.wait(), CancelledError);
  EXPECT_PUSH_ERROR(waiting.wait(), "destroyed");
  EXPECT_THROW(queued.wait(), CancelledError);
  // The abandoned wait callback must not touch the destroyed lane.
  never.set_value(int64_t{1});
}

TEST(Errors, AFiberStackThatCannotBeMappedFailsTheJobNotTheProcess) {
  // mmap refuses a 4 PiB stack just as it refuses one more mapping past vm.max_map_count.
  Push dist(tiny_mlp, PushOptions().stack_size(std::size_t{1} << 52));
  Pid pid = dist.p_create(ParticleOptions().on("run", [](Particle&, const Args&) { return c10::IValue(int64_t{1}); }));
  EXPECT_PUSH_ERROR(dist.p_launch(pid, "run").wait(), "cannot map a fiber stack");
  EXPECT_PUSH_ERROR(dist.p_launch(pid, "run").wait(), "stack_size");
  // The lane survives: work that needs no fiber still runs.
  EXPECT_EQ(dist.p_parameters(pid).size(), 4u);
}

TEST(Errors, BrokenPromise) {
  PFuture f;
  {
    Promise<c10::IValue> p;
    f = p.future();
  }
  EXPECT_PUSH_ERROR(f.wait(), "broken promise");
}

}  // namespace
}  // namespace push
