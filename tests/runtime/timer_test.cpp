// wait_for() inside a handler: the lane's timers resume a suspended handler at its deadline,
// and a completion that arrives after the deadline does not resume it a second time.
// Each at 1, 2 and 4 lanes.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "test_util.h"

namespace push {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

torch::nn::AnyModule scalar_module() { return torch::nn::AnyModule(torch::nn::Linear(1, 1)); }

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// (ready, elapsed ms) of a wait_for inside a handler.
c10::IValue timed_wait(const PFuture& future, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const bool ready = future.wait_for(timeout);
  return c10::ivalue::Tuple::create({c10::IValue(ready), c10::IValue(ms_since(start))});
}

class Timers : public ::testing::TestWithParam<int> {};

TEST_P(Timers, WaitForInsideAHandlerTimesOut) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto never = std::make_shared<Promise<c10::IValue>>();
  PFuture future = never->future();
  Pid pid = dist.p_create(ParticleOptions().on(
      "poll", [future](Particle&, const Args&) { return timed_wait(future, 50ms); }));
  PFuture f = dist.p_launch(pid, "poll");
  // Without timers the handler waits for completion: complete it late rather than hang.
  if (!f.wait_for(5s)) never->set_value(int64_t{1});
  auto result = f.wait().toTuple();
  EXPECT_FALSE(result->elements()[0].toBool()) << "the handler waited for completion";
  EXPECT_GE(result->elements()[1].toInt(), 50);
  EXPECT_LT(result->elements()[1].toInt(), 2000);
}

TEST_P(Timers, CompletionBeforeTheDeadlineWinsAndTheTimerIsThenIgnored) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto first = std::make_shared<Promise<c10::IValue>>();
  auto second = std::make_shared<Promise<c10::IValue>>();
  auto started = std::make_shared<Promise<c10::IValue>>();
  PFuture a = first->future(), b = second->future();
  Pid pid = dist.p_create(ParticleOptions().on("wait", [=](Particle&, const Args&) {
    started->set_value(c10::IValue());
    const bool ready = a.wait_for(300ms);
    // Still suspended here when the first wait's deadline passes: that timer must not
    // resume this second wait.
    return c10::IValue(c10::List<int64_t>({ready, b.wait().toInt()}));
  }));
  PFuture f = dist.p_launch(pid, "wait");
  started->future().wait();
  first->set_value(int64_t{1});
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(f.is_ready());
  second->set_value(int64_t{7});
  EXPECT_EQ(f.wait().toIntVector(), (std::vector<int64_t>{1, 7}));
}

TEST_P(Timers, LateCompletionDoesNotResumeALaterWait) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto late = std::make_shared<Promise<c10::IValue>>();
  auto next = std::make_shared<Promise<c10::IValue>>();
  auto timed_out = std::make_shared<Promise<c10::IValue>>();
  PFuture a = late->future(), b = next->future();
  Pid pid = dist.p_create(ParticleOptions().on("wait", [=](Particle&, const Args&) {
    const bool ready = a.wait_for(20ms);
    timed_out->set_value(c10::IValue(ready));
    return b.wait();  // the late completion of `a` must not wake this wait
  }));
  PFuture f = dist.p_launch(pid, "wait");
  auto signal = timed_out->future();
  if (!signal.wait_for(5s)) late->set_value(int64_t{1});
  EXPECT_FALSE(signal.wait().toBool());
  late->set_value(int64_t{1});
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(f.is_ready());
  next->set_value(int64_t{9});
  EXPECT_EQ(f.wait().toInt(), 9);
}

TEST_P(Timers, NearestDeadlineFiresFirstAndTheParticleIsRestored) {
  // Two handlers time out on lane 0 in deadline order, not launch order; with cache_size 1
  // the first is evicted while the other runs, and is restored after its timeout.
  Push dist(scalar_module, PushOptions().devices(GetParam()).cache_size(1));
  auto never = std::make_shared<Promise<c10::IValue>>();
  PFuture future = never->future();
  auto order = std::make_shared<std::atomic<int>>(0);
  auto opts = ParticleOptions().device(0).on("sleep", [future, order](Particle& p, const Args& a) {
    const auto start = Clock::now();
    const bool ready = future.wait_for(std::chrono::milliseconds(a[0].toInt()));
    const int64_t elapsed = ms_since(start);
    const int64_t rank = order->fetch_add(1);
    auto out = p.forward(torch::ones({1, 1})).wait().toTensor();  // needs its own parameters
    return c10::IValue(c10::List<int64_t>({ready, elapsed, rank, out.numel()}));
  });
  Pid slow = dist.p_create(opts);
  Pid fast = dist.p_create(opts);
  PFuture fs = dist.p_launch(slow, "sleep", int64_t{400});
  PFuture ff = dist.p_launch(fast, "sleep", int64_t{30});
  if (!fs.wait_for(5s)) never->set_value(int64_t{1});
  auto s = fs.wait().toIntVector(), f = ff.wait().toIntVector();
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(f[0], 0);
  EXPECT_GE(s[1], 400);
  EXPECT_GE(f[1], 30);
  EXPECT_LT(f[1], 400);
  EXPECT_EQ(f[2], 0) << "the nearer deadline fired second";
  EXPECT_EQ(s[2], 1);
  EXPECT_EQ(s[3], 1);
  EXPECT_EQ(f[3], 1);
}

TEST_P(Timers, ZeroTimeoutDoesNotSuspend) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto never = std::make_shared<Promise<c10::IValue>>();
  PFuture pending = never->future();
  PFuture done = PFuture::ready(int64_t{3});
  Pid pid = dist.p_create(ParticleOptions().on("poll", [=](Particle&, const Args&) {
    return c10::IValue(c10::List<bool>({pending.wait_for(0ms), done.wait_for(0ms),
                                        pending.wait_for(-5ms)}));
  }));
  PFuture f = dist.p_launch(pid, "poll");
  if (!f.wait_for(5s)) never->set_value(int64_t{1});
  auto flags = f.wait().toBoolList();
  EXPECT_FALSE(flags.get(0));
  EXPECT_TRUE(flags.get(1));
  EXPECT_FALSE(flags.get(2));
}

INSTANTIATE_TEST_SUITE_P(Runtime, Timers, ::testing::ValuesIn(testing::lane_counts()),
                         [](const auto& info) { return std::to_string(info.param) + "lanes"; });

}  // namespace
}  // namespace push
