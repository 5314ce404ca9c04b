// wait_for() inside a handler: the lane's timers resume a suspended handler at its deadline,
// and a completion that arrives after the deadline does not resume it a second time.
// Each at 1, 2 and 4 lanes. Time is a ManualClock's (core/clock.h): a deadline passes when
// the test advances it, so nothing here sleeps, and "not yet" means exactly that.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/clock.h"
#include "test_util.h"

namespace push {
namespace {

using namespace std::chrono_literals;
using detail::Clock;
using detail::ManualClock;
using testing::scalar_module;

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Runs an inline job on `pid`'s lane and waits for it: the lane's loop fires the timers
// that are due before it runs a job, so by the time this returns every deadline up to the
// clock's now has been acted on.
void settle(Push& dist, Pid pid) { dist.p_parameters(pid); }

// Whether `f` completes within `limit` of real time: the lane acts on a manual deadline
// within a tick (Clock::kManualTick) of it passing. The limit only keeps a broken timer
// from hanging the test; it is no measurement.
bool completes(const PFuture& f, std::chrono::seconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!f.is_ready() && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  return f.is_ready();
}

// (ready, elapsed ms) of a wait_for inside a handler.
c10::IValue timed_wait(const PFuture& future, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const bool ready = future.wait_for(timeout);
  return c10::ivalue::Tuple::create({c10::IValue(ready), c10::IValue(ms_since(start))});
}

class Timers : public ::testing::TestWithParam<int> {};

TEST_P(Timers, WaitForInsideAHandlerTimesOut) {
  ManualClock clock;
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  Promise<c10::IValue> never, waiting;
  PFuture future = never.future();
  Pid pid = dist.p_create(ParticleOptions().on("poll", [future, waiting](Particle&, const Args&) {
    waiting.set_value(c10::IValue());
    return timed_wait(future, 50ms);
  }));
  PFuture f = dist.p_launch(pid, "poll");
  waiting.future().wait();
  settle(dist, pid);  // the handler is suspended in its wait now
  clock.advance(49ms);
  settle(dist, pid);
  EXPECT_FALSE(f.is_ready()) << "the deadline fired before it was due";
  clock.advance(1ms);
  // Without timers the handler waits for completion: complete it late rather than hang.
  if (!completes(f)) never.set_value(int64_t{1});
  auto result = f.wait().toTuple();
  EXPECT_FALSE(result->elements()[0].toBool()) << "the handler waited for completion";
  EXPECT_EQ(result->elements()[1].toInt(), 50);
}

TEST_P(Timers, CompletionBeforeTheDeadlineWinsAndTheTimerIsThenIgnored) {
  ManualClock clock;
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
  settle(dist, pid);  // the first wait has returned; the second is suspended
  clock.advance(500ms);
  settle(dist, pid);  // the first wait's deadline has passed and its timer was looked at
  EXPECT_FALSE(f.is_ready());
  second->set_value(int64_t{7});
  EXPECT_EQ(f.wait().toIntVector(), (std::vector<int64_t>{1, 7}));
}

TEST_P(Timers, LateCompletionDoesNotResumeALaterWait) {
  ManualClock clock;
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
  settle(dist, pid);  // suspended in its first wait
  clock.advance(20ms);
  auto signal = timed_out->future();
  if (!completes(signal)) late->set_value(int64_t{1});
  EXPECT_FALSE(signal.wait().toBool());
  late->set_value(int64_t{1});  // its resume of the first wait is stale now
  settle(dist, pid);
  EXPECT_FALSE(f.is_ready());
  next->set_value(int64_t{9});
  EXPECT_EQ(f.wait().toInt(), 9);
}

TEST_P(Timers, NearestDeadlineFiresFirstAndTheParticleIsRestored) {
  // Two handlers time out on lane 0 in deadline order, not launch order; with cache_size 1
  // the first is evicted while the other runs, and is restored after its timeout.
  ManualClock clock;
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
  settle(dist, slow);  // both are suspended now (they share lane 0)
  clock.advance(30ms);
  const bool fast_done = completes(ff);
  EXPECT_FALSE(fs.is_ready()) << "the later deadline fired with the nearer one";
  clock.advance(370ms);
  if (!fast_done || !completes(fs)) never->set_value(int64_t{1});
  auto s = fs.wait().toIntVector(), f = ff.wait().toIntVector();
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(f[0], 0);
  EXPECT_EQ(s[1], 400);
  EXPECT_EQ(f[1], 30);
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
    return c10::IValue(c10::List<bool>({pending.wait_for(0ms), done.wait_for(0ms), pending.wait_for(-5ms)}));
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
