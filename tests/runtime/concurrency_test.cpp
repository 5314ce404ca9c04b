// The event loops: overlap across lanes, interleaving at wait points on one lane,
// chains and cycles of waits, many particles on bounded threads. Each at 1, 2, 4 lanes.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "test_util.h"
#include "thread_count.h"

namespace push {
namespace {

using testing::count_threads;
using testing::scalar_module;
using testing::settled_thread_count;
using testing::threads_named;

// OpenBLAS's process-wide thread count, or -1 where LibTorch uses another BLAS.
int openblas_threads() {
  using Get = int (*)();
  static const auto get = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get != nullptr ? get() : -1;
}

class Lanes : public ::testing::TestWithParam<int> {};

TEST_P(Lanes, PingPongBetweenAThousandParticles) {
  const int n = 1000;
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto opts = ParticleOptions()
                  .on("ping",
                      [n](Particle& p, const Args&) {
                        Pid next = (p.pid() + 1) % n;
                        return p.send(next, "pong", p.pid()).wait();
                      })
                  .on("pong", [](Particle& p, const Args& a) { return c10::IValue(a[0].toInt() * 10000 + p.pid()); });
  for (int i = 0; i < n; ++i) dist.p_create(opts);
  const int threads_before = count_threads();
  std::vector<PFuture> fs;
  for (Pid pid = 0; pid < n; ++pid) fs.push_back(dist.p_launch(pid, "ping"));
  auto results = dist.p_wait(fs);
  for (Pid pid = 0; pid < n; ++pid) EXPECT_EQ(results[pid].toInt(), pid * 10000 + (pid + 1) % n);
  // Suspended handlers are fibers, not threads.
  EXPECT_LE(count_threads(), threads_before);
}

TEST_P(Lanes, ChainsOfWaitsOnOneDevice) {
  // A waits on B waits on C ... all on device 0.
  const int depth = 50;
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto opts = ParticleOptions().device(0).on("chain", [](Particle& p, const Args& a) {
    int64_t left = a[0].toInt();
    if (left == 0) return c10::IValue(p.pid());
    Pid next = (p.pid() + 1) % static_cast<Pid>(p.particle_ids().size());
    return c10::IValue(p.send(next, "chain", left - 1).wait().toInt() + 1000);
  });
  for (int i = 0; i < 5; ++i) dist.p_create(opts);
  auto out = dist.p_launch(0, "chain", int64_t{depth}).wait().toInt();
  EXPECT_EQ(out, depth * 1000 + depth % 5);
}

TEST_P(Lanes, CyclesReenterAWaitingParticle) {
  // A's handler waits on B, whose handler calls back into A while A is still waiting.
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto opts =
      ParticleOptions()
          .on("start", [](Particle& p, const Args& a) { return p.send(a[0].toInt(), "bounce", p.pid()).wait(); })
          .on("bounce",
              [](Particle& p, const Args& a) { return c10::IValue(p.send(a[0].toInt(), "leaf").wait().toInt() + 1); })
          .on("leaf", [](Particle& p, const Args&) { return c10::IValue(p.pid() * 100); });
  for (int i = 0; i < 4; ++i) dist.p_create(opts);
  std::vector<PFuture> fs;
  for (Pid a = 0; a < 4; ++a) fs.push_back(dist.p_launch(a, "start", (a + 1) % 4));
  auto out = dist.p_wait(fs);
  for (Pid a = 0; a < 4; ++a) EXPECT_EQ(out[a].toInt(), a * 100 + 1);
}

TEST_P(Lanes, HandlersInterleaveAtWaitPointsOnOneDevice) {
  // Both particles on device 0: "first" can only finish after "second" ran, which it
  // can only do while "first" is suspended in wait().
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  Promise<c10::IValue> promise;
  auto shared = std::make_shared<Promise<c10::IValue>>(std::move(promise));
  auto future = shared->future();
  Pid a = dist.p_create(ParticleOptions().device(0).on(
      "first", [future](Particle&, const Args&) { return c10::IValue(future.wait().toInt() + 1); }));
  Pid b = dist.p_create(ParticleOptions().device(0).on("second", [shared](Particle&, const Args&) {
    shared->set_value(int64_t{41});
    return c10::IValue();
  }));
  auto f1 = dist.p_launch(a, "first");
  auto f2 = dist.p_launch(b, "second");
  EXPECT_EQ(f1.wait().toInt(), 42);
  f2.wait();
}

// Happens-before proof that two lanes run at the same time: each handler blocks its lane
// until the other has arrived. Serialized lanes could never both arrive.
TEST_P(Lanes, DistinctLanesRunInParallel) {
  const int lanes = GetParam();
  if (lanes < 2) GTEST_SKIP() << "needs two lanes";
  struct Rendezvous {
    std::mutex m;
    std::condition_variable cv;
    int arrived = 0;
  };
  auto r = std::make_shared<Rendezvous>();
  Push dist(scalar_module, PushOptions().devices(lanes));
  auto opts = ParticleOptions().on("meet", [r, lanes](Particle&, const Args&) {
    std::unique_lock<std::mutex> lock(r->m);
    ++r->arrived;
    r->cv.notify_all();
    bool all = r->cv.wait_for(lock, std::chrono::seconds(30), [&] { return r->arrived == lanes; });
    return c10::IValue(all);
  });
  std::vector<PFuture> fs;
  for (int l = 0; l < lanes; ++l) fs.push_back(dist.p_launch(dist.p_create(opts.device(l)), "meet"));
  for (auto& v : dist.p_wait(fs)) EXPECT_TRUE(v.toBool());
}

TEST_P(Lanes, LaunchesFromManyThreads) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto opts = ParticleOptions().on("count", [](Particle& p, const Args&) {
    auto& c = p.state()["n"];
    c = (c.isNone() ? 0 : c.toInt()) + 1;
    return c;
  });
  for (int i = 0; i < 8; ++i) dist.p_create(opts);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&dist] {
      std::vector<PFuture> fs;
      for (int i = 0; i < 100; ++i) fs.push_back(dist.p_launch(i % 8, "count"));
      dist.p_wait(fs);
    });
  }
  for (auto& t : threads) t.join();
  int64_t total = 0;
  for (Pid pid = 0; pid < 8; ++pid) total += dist.p_launch(pid, "count").wait().toInt() - 1;
  EXPECT_EQ(total, 400);
}

TEST_P(Lanes, LaneThreadsAreBoundedAndJoined) {
  // Per lane: its thread and its OpenMP team (intra - 1 workers); process-wide: LibTorch's
  // pthreadpool and OpenBLAS's pool, at most intra - 1 workers each. Intra 2 first, so that
  // the intra 1 round checks that nothing is left behind.
  const int lanes = GetParam();
  // TSan starts its own background thread at the process's first pthread_create.
  if (push::testing::sanitized()) std::thread([] {}).join();
  // push never grows OpenBLAS's pool past its size at start (OPENBLAS_NUM_THREADS or the
  // cores, the size OpenBLAS starts with).
  const char* blas_env = std::getenv("OPENBLAS_NUM_THREADS");
  const int blas_cap =
      blas_env != nullptr ? std::max(1, std::atoi(blas_env)) : static_cast<int>(std::thread::hardware_concurrency());
  for (int intra : {2, 1}) {
    SCOPED_TRACE("intra_op_threads " + std::to_string(intra));
    const int before = count_threads();
    {
      Push dist(scalar_module, PushOptions().devices(lanes).intra_op_threads(intra));
      for (int i = 0; i < 200; ++i) dist.p_create();
      // BLAS and OpenMP work on every lane, so that every pool a lane can grow has grown.
      auto opts = ParticleOptions().on("work", [](Particle&, const Args&) {
        auto a = torch::randn({256, 256});
        auto product = torch::mm(a, a).sum() + (torch::randn({1 << 18}).exp() + 1).sum();
        EXPECT_TRUE(std::isfinite(product.item<double>()));
        return c10::IValue(int64_t{openblas_threads()});
      });
      std::vector<PFuture> fs;
      for (int l = 0; l < lanes; ++l) fs.push_back(dist.p_launch(dist.p_create(opts.device(l)), "work"));
      for (const auto& blas : dist.p_wait(fs)) {
        // One lane may use its intra-op threads for BLAS; several lanes would share the one
        // pool, so each runs BLAS on its own thread.
        if (blas.toInt() >= 0) EXPECT_EQ(blas.toInt(), lanes == 1 ? std::min(intra, blas_cap) : 1);
      }
      EXPECT_LE(count_threads(), before + (lanes + 2) * intra);
    }
    // The lanes and their OpenMP teams are gone; only the process-wide pools may remain.
    const int left = before + 2 * (intra - 1);
    EXPECT_LE(settled_thread_count(left), left);
  }
  // With one intra-op thread no pool keeps a worker a lane created: none is left.
  testing::eventually([] { return threads_named("push-lane-") == 0; }, std::chrono::seconds(5));
  EXPECT_EQ(threads_named("push-lane-"), 0);
}

TEST_P(Lanes, GradModeIsPerHandler) {
  // A handler suspended inside a NoGradGuard must not leak it into another handler.
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto shared = std::make_shared<Promise<c10::IValue>>();
  auto future = shared->future();
  Pid a = dist.p_create(ParticleOptions().device(0).on("nograd", [future](Particle&, const Args&) {
    torch::NoGradGuard guard;
    future.wait();
    return c10::IValue(torch::GradMode::is_enabled());
  }));
  Pid b = dist.p_create(ParticleOptions().device(0).on("grad", [shared](Particle&, const Args&) {
    bool enabled = torch::GradMode::is_enabled();
    shared->set_value(c10::IValue());
    return c10::IValue(enabled);
  }));
  auto fa = dist.p_launch(a, "nograd");
  auto fb = dist.p_launch(b, "grad");
  EXPECT_TRUE(fb.wait().toBool());
  EXPECT_FALSE(fa.wait().toBool());
}

TEST_P(Lanes, WaitInsideCatchBlockKeepsExceptionState) {
  Push dist(scalar_module, PushOptions().devices(GetParam()));
  auto opts = ParticleOptions()
                  .on("catcher",
                      [](Particle& p, const Args& a) {
                        try {
                          throw std::runtime_error("outer");
                        } catch (const std::exception& e) {
                          // Suspend inside the catch block; other handlers throw meanwhile.
                          p.send(a[0].toInt(), "thrower").wait();
                          return c10::IValue(std::string(e.what()) + "/" + std::to_string(std::uncaught_exceptions()));
                        }
                      })
                  .on("thrower", [](Particle&, const Args&) {
                    try {
                      throw std::logic_error("inner");
                    } catch (const std::exception&) {
                    }
                    return c10::IValue();
                  });
  dist.p_create(opts.device(0));
  dist.p_create(opts.device(0));
  EXPECT_EQ(dist.p_launch(0, "catcher", int64_t{1}).wait().toStringRef(), "outer/0");
}

INSTANTIATE_TEST_SUITE_P(Runtime, Lanes, ::testing::ValuesIn(testing::lane_counts()),
                         [](const auto& info) { return std::to_string(info.param) + "lanes"; });

}  // namespace
}  // namespace push
