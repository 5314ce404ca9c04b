#include <push/push.h>

#include <gtest/gtest.h>

#include <thread>

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
  auto state = std::make_shared<detail::FutureState<int>>();
  Future<int> f(state);
  EXPECT_FALSE(f.wait_for(std::chrono::milliseconds(1)));
  std::thread t([state] { state->set_value(7); });
  EXPECT_EQ(f.wait(), 7);
  t.join();
  EXPECT_TRUE(f.wait_for(std::chrono::milliseconds(0)));
}

TEST(Future, ContinuationAddedBeforeCompletionRunsOnce) {
  auto state = std::make_shared<detail::FutureState<int>>();
  Future<int> f(state);
  std::atomic<int> runs{0};
  auto g = f.then([&](const int& v) {
    runs.fetch_add(1);
    return v * 2;
  });
  std::thread t([state] { state->set_value(21); });
  EXPECT_EQ(g.wait(), 42);
  t.join();
  EXPECT_EQ(runs.load(), 1);
}

}  // namespace
}  // namespace push
