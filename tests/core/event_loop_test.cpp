// The fiber event loop on its own, without particles: what an RPC handler's loop will rely
// on. Fiber jobs wait on futures without blocking the thread, nest, time out, unwind on
// stop, report their exceptions, and a thousand waiting ones need no extra threads.
#include <push/core/errors.h>
#include <push/core/future.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/event_loop.h"
#include "test_util.h"
#include "thread_count.h"

namespace push {
namespace {

using namespace std::chrono_literals;
using detail::EventLoop;
using Clock = std::chrono::steady_clock;

std::shared_ptr<EventLoop> started_loop(EventLoop::Options options = {}) {
  auto loop = std::make_shared<EventLoop>(std::move(options));
  loop->start();
  return loop;
}

// Runs `fn` in a fiber job of `loop`; its value, or what it throws, reaches the future.
template <class F>
auto in_fiber(EventLoop& loop, F fn) -> Future<std::invoke_result_t<F&>> {
  Promise<std::invoke_result_t<F&>> promise;
  loop.post_fiber([promise, fn]() mutable { promise.set_value(fn()); },
                  [promise](std::exception_ptr e) { promise.set_error(std::move(e)); });
  return promise.future();
}

template <class F>
auto inline_job(EventLoop& loop, F fn) -> Future<std::invoke_result_t<F&>> {
  Promise<std::invoke_result_t<F&>> promise;
  loop.post_inline([promise, fn]() mutable { promise.set_value(fn()); },
                   [promise](std::exception_ptr e) { promise.set_error(std::move(e)); });
  return promise.future();
}

TEST(EventLoop, AFiberWaitsOnAFutureCompletedByAnotherThreadWithoutBlockingTheLoop) {
  auto loop = started_loop();
  Promise<int> promise;
  Future<int> awaited = promise.future();
  Future<int> waiter = in_fiber(*loop, [awaited, &loop] {
    EXPECT_EQ(EventLoop::current(), loop.get());
    return awaited.wait() + 1;
  });
  // The loop's one thread runs the next job while the fiber waits: it is not blocked.
  Future<int> next = inline_job(*loop, [] { return 7; });
  const bool loop_ran = next.wait_for(5s);
  EXPECT_FALSE(waiter.is_ready());
  std::thread completer([&] { promise.set_value(41); });
  EXPECT_TRUE(loop_ran) << "the waiting fiber blocked its loop's thread";
  EXPECT_EQ(next.wait(), 7);
  EXPECT_EQ(waiter.wait(), 42);
  completer.join();
  EXPECT_EQ(EventLoop::current(), nullptr);  // this thread runs no loop
}

// Each fiber posts the next to its own loop and waits on it: 200 fibers suspended on one
// thread, resumed innermost first.
int chain(EventLoop& loop, int depth) {
  if (depth == 0) return 0;
  return in_fiber(loop, [&loop, depth] { return chain(loop, depth - 1); }).wait() + 1;
}

TEST(EventLoop, AChainOfNestedFiberJobsOnOneLoopCompletes) {
  auto loop = started_loop();
  Future<int> depth = in_fiber(*loop, [&loop] { return chain(*loop, 199); });
  ASSERT_TRUE(depth.wait_for(30s)) << "the chain deadlocked";
  EXPECT_EQ(depth.wait(), 199);
}

TEST(EventLoop, WaitForInAFiberHonoursItsTimeout) {
  auto loop = started_loop();
  Promise<int> never;
  Future<int> pending = never.future();
  Future<int64_t> elapsed_ms = in_fiber(*loop, [pending] {
    const auto start = Clock::now();
    EXPECT_FALSE(pending.wait_for(50ms));
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  });
  // Without the loop's timer the fiber would wait for completion: complete late, not hang.
  if (!elapsed_ms.wait_for(5s)) never.set_value(1);
  EXPECT_GE(elapsed_ms.wait(), 50);
  EXPECT_LT(elapsed_ms.wait(), 1000);
}

TEST(EventLoop, WaitOutsideAFiberOnTheLoopThreadIsAnErrorNotADeadlock) {
  auto loop = started_loop();
  Promise<int> never;
  Future<int> pending = never.future();
  EXPECT_PUSH_ERROR(inline_job(*loop, [pending] { return pending.wait(); }).wait(), "cannot block an event loop");
}

TEST(EventLoop, StopCancelsQueuedJobsUnwindsSuspendedFibersAndJoins) {
  auto loop = started_loop();
  Promise<int> never;
  Future<int> pending = never.future();
  std::atomic<int> unwound{0};
  std::vector<Future<int>> suspended;
  for (int i = 0; i < 3; ++i) {
    suspended.push_back(in_fiber(*loop, [pending, &unwound] {
      try {
        return pending.wait();
      } catch (const CancelledError&) {
        unwound.fetch_add(1);  // the fiber's own stack unwinds through here
        throw;
      }
    }));
  }
  // An inline job holds the loop while stop() is requested, so the job behind it is
  // still queued when the loop sees the request.
  Promise<int> gate;
  Future<int> opened = gate.future();
  std::atomic<bool> holding{false};
  loop->post_inline(
      [&] {
        holding = true;
        while (!opened.is_ready()) std::this_thread::yield();
      },
      nullptr);
  Future<int> queued = in_fiber(*loop, [] { return 1; });
  while (!holding) std::this_thread::yield();
  std::atomic<pid_t> stopper_tid{0};
  std::thread stopper([&] {
    stopper_tid = ::gettid();
    loop->stop();
  });
  // stop() requests the stop, then joins the loop thread: the stopper lies in that wait.
  testing::eventually([&] { return stopper_tid.load() != 0; });
  testing::ThreadSample last;
  EXPECT_TRUE(testing::eventually([&] { return testing::asleep_in_one_wait(stopper_tid, last); }));
  gate.set_value(0);
  stopper.join();  // joined: the loop thread is gone

  EXPECT_EQ(unwound.load(), 3);
  for (const auto& f : suspended) EXPECT_PUSH_ERROR(f.wait(), "while a handler was waiting");
  EXPECT_THROW(queued.wait(), CancelledError);
  EXPECT_PUSH_ERROR(queued.wait(), "before the work started");
  // A job posted after stop is cancelled at once.
  EXPECT_PUSH_ERROR(in_fiber(*loop, [] { return 1; }).wait(), "the work was not started");
  never.set_value(1);  // the abandoned waits' resume finds no loop and does nothing
}

TEST(EventLoop, AnExceptionInAJobReachesItsFutureAndTheLoopRunsOn) {
  auto loop = started_loop();
  auto fails = []() -> int { throw std::runtime_error("job failed"); };
  EXPECT_THROW(in_fiber(*loop, fails).wait(), std::runtime_error);
  // A fiber's error crosses into the fiber that waits on it, as a thrown exception.
  auto rethrows = [] {
    try {
      return in_fiber(*EventLoop::current(), []() -> int { throw Error("inner fiber failed"); }).wait();
    } catch (const Error& e) {
      throw Error(std::string("caught: ") + e.what());
    }
  };
  EXPECT_PUSH_ERROR(in_fiber(*loop, rethrows).wait(), "caught: inner fiber failed");
  EXPECT_THROW(inline_job(*loop, fails).wait(), std::runtime_error);
  EXPECT_EQ(in_fiber(*loop, [] { return 3; }).wait(), 3);
}

TEST(EventLoop, AThousandWaitingFibersNeedNoMoreThreads) {
  const int n = 1000;
  auto loop = started_loop();  // its thread (and TSan's, started with the first) counted
  const int before = testing::count_threads();
  std::vector<Promise<int>> promises(n);
  std::vector<Future<int>> waiters;
  for (int i = 0; i < n; ++i) {
    Future<int> awaited = promises[i].future();
    waiters.push_back(in_fiber(*loop, [awaited, i] { return awaited.wait() * 2 + i; }));
  }
  // Jobs run in order: when this one runs, every fiber above has started and suspended.
  EXPECT_EQ(inline_job(*loop, [] { return 0; }).wait(), 0);
  EXPECT_LE(testing::count_threads(), before + 1);
  for (int i = n - 1; i >= 0; --i) promises[i].set_value(i);
  for (int i = 0; i < n; ++i) EXPECT_EQ(waiters[i].wait(), 3 * i);
  EXPECT_LE(testing::count_threads(), before + 1);
}

// What a device lane builds on: hooks around each suspension, given the fiber job's owner.
class RecordingLoop final : public EventLoop {
 public:
  RecordingLoop() : EventLoop(Options{}) {}
  ~RecordingLoop() override { stop(); }               // before `events` goes: the loop calls the hooks
  std::vector<std::pair<std::string, void*>> events;  // loop thread; read after a handoff

 private:
  void on_suspend(void* owner) override { events.emplace_back("suspend", owner); }
  void on_resume(void* owner) override { events.emplace_back("resume", owner); }
};

TEST(EventLoop, HooksSeeTheOwnerAroundEachSuspensionButNotACancellation) {
  auto loop = std::make_shared<RecordingLoop>();
  loop->start();
  int a = 0, b = 0;
  Promise<int> first, never;
  Future<int> awaited = first.future(), pending = never.future();
  Promise<int> done;
  loop->post_fiber([awaited, done] { done.set_value(awaited.wait()); }, nullptr, &a);
  loop->post_fiber([pending] { pending.wait(); }, [](std::exception_ptr) {}, &b);
  EXPECT_EQ(inline_job(*loop, [] { return 0; }).wait(), 0);  // both are suspended now
  first.set_value(5);
  EXPECT_EQ(done.future().wait(), 5);
  loop->stop();  // b is unwound: it is not resumed as if its wait had completed
  const std::vector<std::pair<std::string, void*>> expected{{"suspend", &a}, {"suspend", &b}, {"resume", &a}};
  EXPECT_EQ(loop->events, expected);
}

TEST(EventLoop, AFiberLookingForAnExpectedValueGivesWayToWorkPostedMeanwhile) {
  auto loop = started_loop();
  Promise<int> slow;
  Promise<bool> looking;
  slow.expect_within(std::chrono::seconds(60));  // it would look for a minute if left alone
  auto waiter = in_fiber(*loop, [slow, looking] {
    looking.set_value(true);
    return slow.future().wait();
  });
  looking.future().wait();
  const auto start = Clock::now();
  // Work posted meanwhile runs at once: the fiber stops looking and suspends.
  EXPECT_EQ(inline_job(*loop,
                       [slow] {
                         slow.set_value(3);
                         return 1;
                       })
                .wait(),
            1);
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(waiter.wait(), 3);
}

TEST(EventLoop, AFiberLookingForAValueLetsTimersFireAndStopEndIt) {
  auto loop = started_loop();
  // A timer of another fiber comes due while this one looks: it fires on time.
  Promise<int> never;
  auto timed = in_fiber(*loop, [never] { return never.future().wait_for(20ms); });
  Promise<int> slow;
  slow.expect_within(std::chrono::seconds(60));
  const auto start = Clock::now();
  auto looker = in_fiber(*loop, [slow] { return slow.future().wait(); });
  EXPECT_FALSE(timed.wait());
  EXPECT_LT(Clock::now() - start, 10s);
  // A looking fiber's own wait_for ends at its timeout, not at the window's end.
  auto own = in_fiber(*loop, [slow] { return slow.future().wait_for(20ms); });
  EXPECT_FALSE(own.wait());
  EXPECT_LT(Clock::now() - start, 20s);
  // stop() ends the looking too: a fiber looking now is unwound at once, not after a minute.
  Promise<bool> looking;
  auto looker2 = in_fiber(*loop, [slow, looking] {
    looking.set_value(true);
    return slow.future().wait();
  });
  looking.future().wait();
  loop->stop();
  EXPECT_LT(Clock::now() - start, 30s);
  EXPECT_THROW(looker.wait(), CancelledError);
  EXPECT_THROW(looker2.wait(), CancelledError);
}

}  // namespace
}  // namespace push
