// ThreadPool, CtxThreadPool and SimpleQueue in one process: results in order, failures
// named by item, completion order, tasks that wait on each other, bounded and joined
// threads, cancellation, per-worker contexts, a queue whose get suspends a fiber.
#include <push/parallel/queue.h>
#include <push/parallel/thread_pool.h>

#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <future>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <tuple>

#include "test_util.h"
#include "thread_count.h"

using namespace std::chrono_literals;
using push::parallel::CtxThreadPool;
using push::parallel::SimpleQueue;
using push::parallel::TaskError;
using push::parallel::ThreadPool;

namespace {

TEST(ThreadPool, ADefaultPoolHasAWorkerPerCoreItsCreatorMayRunOn) {
  EXPECT_EQ(ThreadPool().size(), push::usable_cores());
  // Made on a thread pinned to one core (as under `taskset -c 0`): one worker, not one per
  // core of the machine.
  int pinned = 0;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    pinned = ThreadPool().size();
  });
  t.join();
  EXPECT_EQ(pinned, 1);
}

TEST(ThreadPool, MapStarmapAndApplyKeepTheOrderOfTheirItems) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.size(), 2);
  std::vector<int> items(1000);
  std::iota(items.begin(), items.end(), 0);
  auto squares = pool.map([](int x) { return x * x; }, items);
  ASSERT_EQ(squares.size(), items.size());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(squares[i], i * i);
  auto sums = pool.starmap([](int a, double b) { return a + b; },
                           std::vector<std::tuple<int, double>>{{1, 0.5}, {2, 0.25}, {3, 0.125}});
  EXPECT_EQ(sums, (std::vector<double>{1.5, 2.25, 3.125}));
  EXPECT_EQ(pool.apply([](const std::string& s, int n) { return s + std::to_string(n); }, std::string("x"), 7), "x7");
  std::atomic<int> ran{0};
  pool.apply_async([&] { ++ran; }).wait();  // a void task's value is Unit
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(pool.map([](int x) { return x; }, std::vector<int>{}).empty());
}

TEST(ThreadPool, ThreadsMaySubmitAtOnceAndCloseWhileOthersSubmit) {
  // thread_pool.h: every method may be called from several threads at once.
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<push::Future<push::parallel::Unit>> futures;
      for (int i = 0; i < 200; ++i) futures.push_back(pool.apply_async([&] { ++ran; }));
      const auto squares = pool.map([](int x) { return x * x; }, std::vector<int>{t, t + 1});
      EXPECT_EQ(squares, (std::vector<int>{t * t, (t + 1) * (t + 1)}));
      for (auto& f : futures) f.wait();
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(ran.load(), 800);
  // close() from one thread while another submits: each submission either runs or is
  // refused with push::Error, never lost.
  std::atomic<int> accepted{0}, refused{0};
  std::thread submitter([&] {
    for (int i = 0; i < 500; ++i) {
      try {
        pool.apply_async([] {});
        ++accepted;
      } catch (const push::Error&) {
        ++refused;
      }
    }
  });
  pool.close();
  submitter.join();
  pool.join();
  EXPECT_EQ(accepted.load() + refused.load(), 500);
}

TEST(ThreadPool, AFailedItemIsRethrownByIndexAfterEveryTaskEnded) {
  ThreadPool pool(2);
  std::atomic<int> ended{0};
  std::vector<int> items(200);
  std::iota(items.begin(), items.end(), 0);
  try {
    pool.map(
        [&](int x) {
          ++ended;
          if (x == 37 || x == 150) throw std::runtime_error("bad item " + std::to_string(x));
          return x;
        },
        items);
    ADD_FAILURE() << "map did not throw";
  } catch (const TaskError& e) {
    EXPECT_EQ(e.index(), 37u);  // the first in item order
    EXPECT_NE(std::string(e.what()).find("task 37 failed: bad item 37"), std::string::npos) << e.what();
    EXPECT_EQ(ended.load(), 200);  // nothing left running that refers to the caller's data
  }
  // apply_async: the task's own exception.
  auto f = pool.apply_async([]() -> int { throw std::invalid_argument("no"); });
  EXPECT_THROW(f.wait(), std::invalid_argument);
  // imap: at the failing item only; the others are there.
  auto stream = pool.imap(
      [](int x) {
        if (x == 1) throw std::runtime_error("one");
        return x;
      },
      std::vector<int>{0, 1, 2});
  EXPECT_EQ(stream.next()->value, 0);
  EXPECT_THROW(stream.next(), TaskError);
  EXPECT_EQ(stream.next()->value, 2);
  EXPECT_FALSE(stream.next().has_value());
}

// One thread: each task waits for its own gate (a fiber wait), so all four wait at once;
// opening the gates in the order 2, 0, 3, 1 is the order imap_unordered returns them in.
TEST(ThreadPool, MapAsyncAndStarmapAsyncGiveAFutureOfEveryResultInItemOrder) {
  ThreadPool pool(2);
  push::Promise<int> gate;
  std::vector<int> items(50);
  std::iota(items.begin(), items.end(), 0);
  auto squares = pool.map_async(
      [gate](int x) {
        if (x == 49) gate.future().wait();  // the last item waits: the map is not ready before it
        return x * x;
      },
      items);
  EXPECT_FALSE(squares.wait_for(20ms));
  EXPECT_FALSE(squares.is_ready());
  gate.set_value(1);
  const std::vector<int> got = squares.wait();
  ASSERT_EQ(got.size(), items.size());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(got[i], i * i);
  EXPECT_FALSE(squares.has_error());  // machin's successful()
  auto sums = pool.starmap_async([](int a, int b) { return a + b; }, std::vector<std::tuple<int, int>>{{1, 2}, {3, 4}});
  EXPECT_EQ(sums.wait(), (std::vector<int>{3, 7}));
  // A failure ends it once every task has ended, naming the first failed item.
  std::atomic<int> ended{0};
  auto failing = pool.map_async(
      [&](int x) {
        ++ended;
        if (x % 10 == 3) throw std::runtime_error("bad item");
        return x;
      },
      items);
  failing.wait_ready();
  EXPECT_EQ(ended.load(), 50);
  EXPECT_TRUE(failing.has_error());
  try {
    failing.wait();
    FAIL() << "no error";
  } catch (const TaskError& e) {
    EXPECT_EQ(e.index(), 3u);
    EXPECT_NE(std::string(e.what()).find("map_async] task 3 failed: bad item"), std::string::npos) << e.what();
  }
  // A callback on completion (machin's callback and error_callback) is then().
  auto total = pool.map_async([](int x) { return x; }, items).then([](const std::vector<int>& v) {
    return std::accumulate(v.begin(), v.end(), 0);
  });
  EXPECT_EQ(total.wait(), 49 * 50 / 2);
  EXPECT_TRUE(pool.map_async([](int x) { return x; }, std::vector<int>{}).wait().empty());
}

TEST(ThreadPool, ImapNextWithATimeoutFailsWhenTheResultIsLateAndLaterGetsIt) {
  ThreadPool pool(2);
  push::Promise<int> gate;
  auto results = pool.imap([gate](int x) { return x == 0 ? gate.future().wait() : x; }, std::vector<int>{0, 1});
  EXPECT_PUSH_ERROR(results.next(20ms), "result 0 of 2 is not there within 20 ms");
  gate.set_value(7);
  auto first = results.next(10s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->value, 7);
  EXPECT_EQ(results.next(10s)->value, 1);
  EXPECT_FALSE(results.next(10s).has_value());
}

thread_local int g_initialized_worker = -1;

TEST(ThreadPool, TheInitializerRunsOnEveryWorkerThreadBeforeItsTasks) {
  std::mutex mutex;
  std::set<std::thread::id> initialized;
  ThreadPool pool(3, [&](int worker) {
    g_initialized_worker = worker;
    std::lock_guard lock(mutex);
    initialized.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(initialized.size(), 3u);
  std::vector<int> items(60);
  const auto seen = pool.map(
      [&](int) {
        std::lock_guard lock(mutex);
        return std::make_pair(g_initialized_worker, initialized.count(std::this_thread::get_id()));
      },
      items);
  for (const auto& [worker, known] : seen) {
    EXPECT_GE(worker, 0);
    EXPECT_EQ(known, 1u);
  }
}

TEST(ThreadPool, AnInitializerThatFailsStopsThePoolAndNamesTheWorker) {
  // TSan starts its own background thread at the process's first pthread_create.
  if (push::testing::sanitized()) std::thread([] {}).join();
  const int before = push::testing::count_threads();
  EXPECT_PUSH_ERROR(ThreadPool(2,
                               [](int worker) {
                                 if (worker == 1) throw std::runtime_error("no GPU here");
                               }),
                    "the initializer failed on worker 1: no GPU here");
  EXPECT_EQ(push::testing::settled_thread_count(before), before);
}

TEST(ThreadPool, ImapUnorderedGivesResultsAsTheyCompleteAndWaitingTasksShareAThread) {
  ThreadPool pool(1);
  std::vector<push::Promise<int>> gates(4);
  std::vector<push::Future<int>> opened;
  for (auto& g : gates) opened.push_back(g.future());
  auto stream = pool.imap_unordered([&](int i) { return opened[i].wait() * 10 + i; }, std::vector<int>{0, 1, 2, 3});
  auto ordered = pool.imap([&](int i) { return opened[i].wait(); }, std::vector<int>{0, 1, 2, 3});
  for (int i : {2, 0, 3, 1}) {
    gates[i].set_value(i);
    auto r = stream.next();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->index, static_cast<size_t>(i));
    EXPECT_EQ(r->value, i * 10 + i);
  }
  EXPECT_FALSE(stream.next().has_value());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ordered.next()->index, static_cast<size_t>(i));
}

TEST(ThreadPool, ATaskLookingForAnExpectedValueLetsQueuedTasksRun) {
  ThreadPool pool(1);
  push::Promise<int> due;
  due.expect_within(std::chrono::seconds(60));  // the first task would look for a minute
  const auto start = std::chrono::steady_clock::now();
  auto waiter = pool.apply_async([due] { return due.future().wait(); });
  auto setter = pool.apply_async([due] {
    due.set_value(4);
    return 0;
  });
  EXPECT_EQ(waiter.wait(), 4);
  setter.wait();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(ThreadPool, TasksThatWaitOnTasksOfTheSamePoolDoNotDeadlock) {
  ThreadPool pool(1);
  // Each level waits for the next, on the pool's single thread: 50 deep.
  std::function<int(int)> depth = [&](int n) { return n == 0 ? 0 : pool.apply(depth, n - 1) + 1; };
  EXPECT_EQ(pool.apply(depth, 50), 50);
}

TEST(ThreadPool, ThreadsAreBoundedAndJoinedQueuedTasksCancellable) {
  {
    // Threads the process starts on its first use of threads (a sanitizer's own) are
    // counted in `before`.
    ThreadPool warm(1);
    warm.apply([] { return 0; });
  }
  const int before = push::testing::count_threads();
  {
    ThreadPool pool(3);
    std::vector<int> items(300);
    std::iota(items.begin(), items.end(), 0);
    pool.map([](int x) { return x; }, items);
    EXPECT_EQ(push::testing::count_threads(), before + 3);
    // A task that holds its thread (a blocking wait, not a fiber wait) on each worker;
    // what is queued behind them can be cancelled.
    std::promise<void> release_promise;
    std::shared_future<void> release = release_promise.get_future().share();
    std::atomic<int> started{0};
    std::vector<push::Future<int>> blockers;
    for (int i = 0; i < 3; ++i) {
      blockers.push_back(pool.apply_async([&started, release] {
        ++started;
        release.wait();
        return 1;
      }));
    }
    ASSERT_TRUE(push::testing::eventually([&] { return started == 3; }));
    std::vector<push::Future<int>> queued;
    for (int i = 0; i < 10; ++i) queued.push_back(pool.apply_async([] { return 2; }));
    EXPECT_EQ(pool.cancel_queued(), 10u);
    for (auto& q : queued) EXPECT_THROW(q.wait(), push::CancelledError);
    release_promise.set_value();
    for (auto& b : blockers) EXPECT_EQ(b.wait(), 1);
    pool.close();
    EXPECT_PUSH_ERROR(pool.apply_async([] { return 0; }), "the pool is closed");
    pool.join();
  }
  EXPECT_EQ(push::testing::count_threads(), before);
  {
    // Destroyed with a task waiting forever: the task is unwound, the thread joined.
    ThreadPool pool(1);
    push::Promise<int> never;
    std::atomic<bool> waits{false};
    auto waiting = pool.apply_async([&waits, f = never.future()] {
      waits = true;
      return f.wait();
    });
    ASSERT_TRUE(push::testing::eventually([&] { return waits.load(); }));
    pool.terminate();
    EXPECT_THROW(waiting.wait(), push::CancelledError);
    try {
      waiting.wait();
    } catch (const push::CancelledError& e) {
      EXPECT_NE(std::string(e.what()).find("while a handler was waiting"), std::string::npos) << e.what();
    }
    // From one of its own tasks, terminate would wait for itself: refused.
    ThreadPool other(1);
    EXPECT_THROW(other.apply([&] { other.terminate(); }), push::Error);
  }
  EXPECT_EQ(push::testing::count_threads(), before);
}

TEST(CtxThreadPool, EachTaskGetsItsWorkersContext) {
  struct Counter {
    int worker = -1;
    int64_t tasks = 0;
    std::thread::id thread;
  };
  CtxThreadPool<Counter> pool(2, [](int w) { return Counter{w, 0, {}}; });
  std::vector<int> items(500);
  std::iota(items.begin(), items.end(), 0);
  auto workers = pool.map(
      [](Counter& c, int) {
        // One thread per context: the same thread every time.
        if (c.tasks == 0) c.thread = std::this_thread::get_id();
        EXPECT_EQ(c.thread, std::this_thread::get_id());
        ++c.tasks;
        return c.worker;
      },
      items);
  pool.close();
  pool.join();
  EXPECT_EQ(pool.context(0).tasks + pool.context(1).tasks, 500);
  for (int w : workers) EXPECT_TRUE(w == 0 || w == 1);
}

TEST(SimpleQueue, PutGetTimeoutAndClose) {
  SimpleQueue<int> q;
  EXPECT_TRUE(q.empty());
  for (int i = 0; i < 5; ++i) q.put(i);
  EXPECT_EQ(q.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(q.get(), i);
  EXPECT_FALSE(q.get(20ms).has_value());
  EXPECT_FALSE(q.try_get().has_value());
  q.put(9);
  q.close();
  EXPECT_PUSH_ERROR(q.put(1), "put on a closed queue");
  EXPECT_EQ(q.get(), 9);  // what was in stays gettable
  EXPECT_PUSH_ERROR(q.get(), "get on a closed, empty queue");
}

TEST(SimpleQueue, CountsTheGetsWaitingAndAPutOrCloseServesThem) {
  SimpleQueue<int> q;
  EXPECT_EQ(q.waiting(), 0u);
  std::atomic<int> got{-1};
  std::thread first([&] { got = *q.get(); });
  ASSERT_TRUE(push::testing::eventually([&] { return q.waiting() == 1; }));
  EXPECT_FALSE(q.get(0ms).has_value());  // a get that does not wait is not counted
  EXPECT_EQ(q.waiting(), 1u);
  q.put(4);
  first.join();
  EXPECT_EQ(got.load(), 4);
  EXPECT_EQ(q.waiting(), 0u);
  std::atomic<bool> failed{false};
  std::thread second([&] {
    try {
      q.get();
    } catch (const push::Error&) {
      failed = true;
    }
  });
  ASSERT_TRUE(push::testing::eventually([&] { return q.waiting() == 1; }));
  q.close();
  second.join();
  EXPECT_TRUE(failed.load());
  EXPECT_EQ(q.waiting(), 0u);
}

// Producers and consumers on threads and fibers at once: every value out exactly once, and
// a get inside a pool task suspends the task (one thread serves consumers and producers).
TEST(SimpleQueue, ManyProducersAndConsumersIncludingFibersOnOneThread) {
  SimpleQueue<int> q;
  ThreadPool pool(1);
  const int n = static_cast<int>(push::testing::scaled(2000, 200));
  auto take = [&] {
    int64_t sum = 0;
    for (int i = 0; i < n / 4; ++i) sum += *q.get();
    return sum;
  };
  // Two fibers on the pool's one thread, both waiting in get(), and a plain thread.
  auto fiber_a = pool.apply_async(take), fiber_b = pool.apply_async(take);
  std::atomic<int64_t> thread_sum{0};
  std::thread consumer([&] {
    int64_t s = 0;
    for (int i = 0; i < n / 2; ++i) s += *q.get();
    thread_sum = s;
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < 2; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < n / 2; ++i) q.put(p * (n / 2) + i);
    });
  }
  for (auto& t : producers) t.join();
  consumer.join();
  EXPECT_EQ(fiber_a.wait() + fiber_b.wait() + thread_sum.load(), int64_t{n} * (n - 1) / 2);
  EXPECT_TRUE(q.empty());
}

}  // namespace
