// Futures and promises on plain threads; fiber-aware waits are in event_loop_test.cpp.
#include <push/core/cores.h>
#include <push/core/future.h>
// The paths from before the core layer, kept for user code: they must keep compiling.
#include <push/runtime/errors.h>
#include <push/runtime/future.h>

#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "test_util.h"

namespace push {
namespace {

TEST(Future, ReadyValueAndThen) {
  PFuture f = PFuture::ready(c10::IValue(int64_t{41}));
  EXPECT_TRUE(f.is_ready());
  EXPECT_EQ(f.wait().toInt(), 41);
  auto g = f.then([](const c10::IValue& v) { return v.toInt() + 1; });
  EXPECT_EQ(g.wait(), 42);
}

TEST(Future, ErrorPropagatesThroughThen) {
  auto f = PFuture::failed(std::make_exception_ptr(Error("boom")));
  bool called = false;
  auto g = f.then([&](const c10::IValue&) {
    called = true;
    return 1;
  });
  EXPECT_PUSH_ERROR(g.wait(), "boom");
  EXPECT_FALSE(called);
  EXPECT_TRUE(g.has_error());
}

TEST(Future, EmptyFutureNamesTheProblem) {
  PFuture f;
  EXPECT_FALSE(f.valid());
  EXPECT_PUSH_ERROR(f.wait(), "empty");
}

TEST(Future, CompletedFromAnotherThread) {
  Promise<int> promise;
  Future<int> f = promise.future();
  EXPECT_FALSE(f.wait_for(std::chrono::milliseconds(1)));
  std::thread t([promise] { promise.set_value(7); });
  EXPECT_EQ(f.wait(), 7);
  t.join();
  EXPECT_TRUE(f.wait_for(std::chrono::milliseconds(0)));
}

TEST(Future, ContinuationAddedBeforeCompletionRunsOnce) {
  Promise<int> promise;
  Future<int> f = promise.future();
  std::atomic<int> runs{0};
  auto g = f.then([&](const int& v) {
    runs.fetch_add(1);
    return v * 2;
  });
  std::thread t([promise] { promise.set_value(21); });
  EXPECT_EQ(g.wait(), 42);
  t.join();
  EXPECT_EQ(runs.load(), 1);
}

TEST(Future, AThrowingCallbackDoesNotStopTheOthers) {
  Promise<int> promise;
  Future<int> f = promise.future();
  std::atomic<int> runs{0};
  f.on_complete([&] {
    runs.fetch_add(1);
    throw std::runtime_error("a bad callback");
  });
  f.on_complete([&] { runs.fetch_add(1); });
  auto g = f.then([](const int& v) { return v + 1; });  // a waiter behind the bad callback
  EXPECT_NO_THROW(promise.set_value(20));
  EXPECT_EQ(runs.load(), 2);
  ASSERT_TRUE(g.wait_for(std::chrono::seconds(1))) << "a waiter behind the throwing callback hangs";
  EXPECT_EQ(g.wait(), 21);
  EXPECT_EQ(f.wait(), 20);
}

TEST(Future, GetWithATimeoutFailsWhileThePromiseIsUnsetThenGivesTheValue) {
  Promise<int> promise;
  Future<int> f = promise.future();
  EXPECT_PUSH_ERROR(f.get(std::chrono::milliseconds(10)), "no result within 10 ms");
  EXPECT_FALSE(f.is_ready());  // still pending: a later get may have it
  promise.set_value(5);
  EXPECT_EQ(f.get(std::chrono::milliseconds(10)), 5);
}

TEST(Future, ASecondSetIsAnErrorAndKeepsTheFirstValue) {
  Promise<int> promise;
  Future<int> f = promise.future();
  promise.set_value(1);
  EXPECT_PUSH_ERROR(promise.set_value(2), "already has a value or an error");
  EXPECT_EQ(f.wait(), 1);
  EXPECT_PUSH_ERROR(promise.set_error(std::make_exception_ptr(Error("late"))), "already has");
  EXPECT_FALSE(f.has_error());
  EXPECT_EQ(f.wait(), 1);
}

PFuture temporary_future() { return PFuture::ready(c10::IValue(std::string(64, 'v'))); }

TEST(Future, WaitReturnsAValueThatOutlivesTheFuture) {
  // Binding wait()'s result to a reference must not point into a future that is gone.
  EXPECT_FALSE(std::is_reference_v<decltype(std::declval<const PFuture&>().wait())>);
  EXPECT_FALSE(std::is_reference_v<decltype(std::declval<const Future<int>&>().get())>);
  const auto& value = temporary_future().wait();
  EXPECT_EQ(value.toStringRef(), std::string(64, 'v'));
}

// Sets 5 on `promise` 300 ms from now, from a thread of its own: real time is the point, the
// waiter's CPU is measured over it.
std::thread set_five_later(Promise<int> promise) {
  return std::thread([promise] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    promise.set_value(5);
  });
}

TEST(Future, AWaiterLooksForTheValueOnlyWithinTheExpectedWindowThenSleeps) {
  Promise<int> promise;
  promise.expect_within(std::chrono::milliseconds(2));
  std::thread t = set_five_later(promise);
  const auto cpu = testing::thread_cpu();
  EXPECT_EQ(promise.future().wait(), 5);
  // 2 ms of looking, then asleep: far below the 300 ms a wait that kept looking would burn.
  EXPECT_LT(testing::thread_cpu() - cpu, std::chrono::milliseconds(100));
  t.join();
}

TEST(Future, AWaiterThatMayRunOnOneCoreOnlySleepsAtOnce) {
  // Looking there would take the core from the thread that completes the value.
  Promise<int> promise;
  promise.expect_within(std::chrono::seconds(30));
  std::thread t = set_five_later(promise);
  std::chrono::nanoseconds spent{};
  std::thread waiter([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    ASSERT_EQ(usable_cores(), 1);
    const auto cpu = testing::thread_cpu();
    EXPECT_EQ(promise.future().wait(), 5);
    spent = testing::thread_cpu() - cpu;
  });
  waiter.join();
  t.join();
  EXPECT_LT(spent, std::chrono::milliseconds(100));  // looking would have burnt the 300 ms
}

TEST(Future, AnExpectedWindowNeverStretchesAWaitFor) {
  Promise<int> promise;
  promise.expect_within(std::chrono::seconds(30));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(promise.future().wait_for(std::chrono::milliseconds(20)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  std::thread t([promise] { promise.set_value(9); });
  EXPECT_EQ(promise.future().wait(), 9);  // looked for, found
  t.join();
}

TEST(Future, AValueCompletedWithinTheWindowIsFoundWithoutSleeping) {
  auto due = std::make_shared<detail::FutureState<int>>();
  due->expect_within(std::chrono::seconds(30));
  // `stop` is asked once before the waiter takes its seat, then between rounds of looking:
  // the value is completed once the waiter is looking.
  std::atomic<int> asked{0};
  auto looking = [&] {
    asked.fetch_add(1);
    return false;
  };
  std::thread t([due, &asked] {
    testing::eventually([&] { return asked.load() >= 2; });  // bounded: a waiter that never looks fails below
    due->set_value(1);
  });
  EXPECT_TRUE(due->spin_until_ready(std::chrono::seconds(30), looking));  // found by looking, not by a wake-up
  t.join();
  // No window: nothing to look for, at once.
  auto plain = std::make_shared<detail::FutureState<int>>();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(plain->spin_until_ready(std::chrono::seconds(30)));
  // The window counts from expect_within, not from the wait: one that is over looks no more.
  // The window is steady time: a microsecond, waited out on the steady clock.
  auto late = std::make_shared<detail::FutureState<int>>();
  late->expect_within(std::chrono::microseconds(1));
  const auto over = std::chrono::steady_clock::now() + std::chrono::microseconds(1);
  ASSERT_TRUE(testing::eventually([&] { return std::chrono::steady_clock::now() > over; }));
  bool looked = false;
  EXPECT_FALSE(late->spin_until_ready(std::chrono::seconds(30), [&] {
    looked = true;
    return false;
  }));
  EXPECT_FALSE(looked) << "a window that was over was looked through again";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // A window of centuries is cut to an hour, and a limit of 0 looks not at all.
  late->expect_within(std::chrono::nanoseconds::max());
  EXPECT_FALSE(late->spin_until_ready(std::chrono::nanoseconds::zero()));
}

}  // namespace
}  // namespace push
