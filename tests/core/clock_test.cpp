// The one clock (core/clock.h) and the futures' promise: a ManualClock makes time a value
// the test moves, for every deadline push keeps (here a plain thread's wait_for, a
// poll_until, the deadline queue); copies of a Promise complete one future, once.
#include <push/core/future.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/clock.h"
#include "core/timer_queue.h"
#include "test_util.h"
#include "thread_count.h"

namespace push {
namespace {

using namespace std::chrono_literals;
using detail::Clock;
using detail::ManualClock;

// Whether `done` turns true within `limit` of real time (a guard against a hang, no measure).
template <class Done>
bool within(Done done, std::chrono::seconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  return done();
}

TEST(Clock, AManualClockMovesOnlyWhenAdvanced) {
  ManualClock clock;
  EXPECT_TRUE(Clock::manual());
  const auto t0 = Clock::now();
  const auto real0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(within([&] { return std::chrono::steady_clock::now() > real0; }));  // real time passes...
  EXPECT_EQ(Clock::now(), t0);                                                    // ...manual time does not
  clock.advance(250ms);
  EXPECT_EQ(Clock::now() - t0, 250ms);
  EXPECT_PUSH_ERROR(clock.advance(-1ms), "only moves forward");
  EXPECT_PUSH_ERROR(ManualClock(), "installed already");
}

TEST(Clock, DeadlinesSaturateInsteadOfWrapping) {
  EXPECT_EQ(Clock::deadline_after(std::chrono::nanoseconds::max()), Clock::time_point::max());
  const auto before = Clock::now();
  const auto past = Clock::deadline_after(-5s);  // a timeout that has run out: now
  EXPECT_GE(past, before);
  EXPECT_LE(past, Clock::now());
  EXPECT_GE(Clock::deadline_after(1h), before + 1h);
  EXPECT_EQ(Clock::deadline_after(std::chrono::milliseconds::max()), Clock::time_point::max());
  EXPECT_EQ(Clock::deadline_after(std::chrono::hours(24 * 365 * 1000)), Clock::time_point::max());
}

TEST(Clock, AThreadsWaitForEndsExactlyWhenManualTimePassesItsDeadline) {
  ManualClock clock;
  Promise<int> never;
  const Future<int> f = never.future();
  std::atomic<int> result{-1};
  std::atomic<pid_t> tid{0};
  std::thread waiter([&] {
    tid = ::gettid();
    result = f.wait_for(100ms) ? 1 : 0;
  });
  ASSERT_TRUE(within([&] { return clock.waiters() == 1; }));  // its deadline: now + 100 ms
  clock.advance(99ms);
  // The wait sleeps a tick at a time and compares the deadline at each wake-up: a few more
  // sleeps, and it has looked at 99 ms.
  const long sleeps = testing::sample_thread(tid).sleeps;
  EXPECT_TRUE(within([&] { return testing::sample_thread(tid).sleeps >= sleeps + 3; }));
  EXPECT_EQ(result.load(), -1) << "the wait ended before its deadline";
  clock.advance(1ms);
  const bool ended = within([&] { return result.load() != -1; });
  if (!ended) never.set_value(0);  // a broken clock must not hang the test
  waiter.join();
  EXPECT_TRUE(ended);
  EXPECT_EQ(result.load(), 0);
}

TEST(Clock, PollUntilSeesItsConditionAtOnceAndItsDeadlineInManualTime) {
  ManualClock clock;
  // A condition that turns true while manual time stands still is seen.
  std::atomic<bool> flag{false};
  std::atomic<int> result{-1};
  std::thread poller(
      [&] { result = Clock::poll_until(Clock::deadline_after(1s), 100ms, [&] { return flag.load(); }); });
  ASSERT_TRUE(within([&] { return clock.waiters() == 1; }));
  flag = true;
  const bool seen = within([&] { return result.load() != -1; });
  if (!seen) clock.advance(1s);  // a broken poll must not hang the test
  poller.join();
  EXPECT_TRUE(seen);
  EXPECT_EQ(result.load(), 1);
  // A condition that never turns true fails exactly when manual time passes the deadline.
  // Its condition counts the looks: a look after the advance also compared the deadline.
  result = -1;
  std::atomic<int> looks{0};
  std::thread timing_out([&] {
    result = Clock::poll_until(Clock::deadline_after(1s), 100ms, [&] {
      looks.fetch_add(1);
      return false;
    });
  });
  ASSERT_TRUE(within([&] { return clock.waiters() == 1; }));
  clock.advance(999ms);
  const int before = looks.load();
  EXPECT_TRUE(within([&] { return looks.load() >= before + 2; }));  // a whole look at 999 ms
  EXPECT_EQ(result.load(), -1) << "the poll gave up before its deadline";
  clock.advance(1ms);
  EXPECT_TRUE(within([&] { return result.load() != -1; }));
  timing_out.join();
  EXPECT_EQ(result.load(), 0);
}

TEST(TimerQueue, GivesBackWhatIsDueNearestFirstAndForgetsCancelled) {
  detail::TimerQueue<int> timers;
  const auto t0 = Clock::now();
  timers.add(t0 + 30ms, 3);
  auto cancelled = timers.add(t0 + 10ms, 1);
  timers.add(t0 + 20ms, 2);
  timers.cancel(cancelled);
  EXPECT_EQ(timers.next(), t0 + 20ms);
  EXPECT_EQ(timers.pop_expired(t0 + 19ms), std::nullopt);
  EXPECT_EQ(timers.take_expired(t0 + 30ms), (std::vector<int>{2, 3}));
  EXPECT_TRUE(timers.empty());
  EXPECT_EQ(timers.next(), std::nullopt);
}

TEST(Promise, CopiesCompleteOneFutureOnceAndTheLastOneGoneBreaksIt) {
  PFuture f;
  {
    Promise<c10::IValue> a;
    Promise<c10::IValue> b = a;  // the same future
    f = b.future();
    a.set_value(int64_t{5});
    EXPECT_PUSH_ERROR(b.set_value(int64_t{6}), "already has a value");
    EXPECT_TRUE(b.is_set());
  }
  EXPECT_EQ(f.wait().toInt(), 5);
  PFuture broken;
  {
    Promise<c10::IValue> a;
    broken = a.future();
    Promise<c10::IValue> b = a;
    { Promise<c10::IValue> gone = std::move(a); }  // a moved-from and a destroyed copy: b still holds it
    EXPECT_FALSE(broken.is_ready());
  }
  EXPECT_PUSH_ERROR(broken.wait(), "broken promise");
}

TEST(Future, ThenCompleteSeesTheErrorAndOnCompleteRunsOnce) {
  Promise<int> p;
  std::atomic<int> runs{0};
  p.future().on_complete([&] { ++runs; });
  auto seen = p.future().then_complete([](const Future<int>& done) {
    return done.error() != nullptr ? std::string("error") : std::to_string(done.wait());
  });
  p.set_error(std::make_exception_ptr(Error("boom")));
  EXPECT_EQ(seen.wait(), "error");
  EXPECT_EQ(runs.load(), 1);
  EXPECT_TRUE(p.future().has_error());
}

}  // namespace
}  // namespace push
