// Runtime benchmarks. Each compares push against plain LibTorch / memcpy doing the same
// work in the same run, and reports the ratio as a counter (absolute times are noisy).
//
//   ./build/bench/push_bench_runtime                       # everything
//   ./build/bench/push_bench_runtime --benchmark_filter=Ensemble
//
// Counters:
//   BM_MessageRoundTrip   median_us, p99_us, msgs_per_s: a handler sends to a sibling
//                         (same lane or the other lane) and waits for the reply;
//                         baseline_us: the median round trip of two plain threads handing
//                         a token back and forth with a mutex and condition variable (what
//                         a C++ program without push writes to ask another thread for
//                         work), measured in the same run; ratio = median_us / baseline_us.
//   BM_LaunchRoundTrip    the same, from the main thread through p_launch + wait.
//   BM_CacheSwap          swap_GBps vs memcpy_GBps of the same bytes; ratio (>= 0.5).
//   BM_ManyParticles      per_particle_us of asking each of N particles on one lane for a
//                         forward pass (p_launch, then wait for all), against plain_us: the
//                         same forward passes over N modules in a loop on one thread;
//                         ratio = per_particle_us / plain_us, which must not grow with N
//                         (view=0: a fresh result). view=1 returns a view, which the runtime must
//                         check against every particle of the lane: O(N) each, shown for
//                         N = 1000 only (runtime/message_values.cpp).
//   BM_EnsembleOverhead   push_s vs plain_s for 16 MLPs x 20 epochs; ratio (<= 1.10).
//                         With L lanes the baseline is L plain threads, each training
//                         16/L of the networks with the same intra-op threads as a lane:
//                         the ratio measures push's overhead, not its parallelism.
#include <push/push.h>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <mutex>
#include <numeric>
#include <thread>

#include "workload_w.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median round trip (µs) of `rounds` token hand-offs between two plain threads through a
/// mutex and a condition variable: the baseline of the message benchmarks.
double thread_pingpong_median_us(int64_t rounds) {
  std::mutex m;
  std::condition_variable cv;
  int64_t token = 0;  // odd: the peer's turn
  std::thread peer([&] {
    std::unique_lock<std::mutex> lock(m);
    for (int64_t i = 0; i < rounds; ++i) {
      cv.wait(lock, [&] { return token % 2 == 1; });
      ++token;
      cv.notify_one();
    }
  });
  std::vector<double> us;
  us.reserve(rounds);
  {
    std::unique_lock<std::mutex> lock(m);
    for (int64_t i = 0; i < rounds; ++i) {
      auto t0 = Clock::now();
      ++token;
      cv.notify_one();
      cv.wait(lock, [&] { return token % 2 == 0; });
      us.push_back(seconds_since(t0) * 1e6);
    }
  }
  peer.join();
  return median(std::move(us));
}

void report_latencies(benchmark::State& state, std::vector<double> us, double baseline_us) {
  const double mean = std::accumulate(us.begin(), us.end(), 0.0) / us.size();
  std::sort(us.begin(), us.end());
  state.counters["median_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[us.size() * 99 / 100];
  state.counters["msgs_per_s"] = 1e6 / mean;
  state.counters["baseline_us"] = baseline_us;
  state.counters["ratio"] = us[us.size() / 2] / baseline_us;
}

// ---- message round trip ---------------------------------------------------------------

void BM_MessageRoundTrip(benchmark::State& state) {
  const bool cross_lane = state.range(0) != 0;
  const int64_t rounds = 20000;
  push::Push dist([] { return torch::nn::Linear(1, 1); },
                  push::PushOptions().devices(cross_lane ? 2 : 1).intra_op_threads(1));
  auto opts = push::ParticleOptions()
                  .on("pong", [](push::Particle&, const push::Args&) { return c10::IValue(); })
                  .on("loop", [rounds](push::Particle& p, const push::Args& a) {
                    const push::Pid peer = a[0].toInt();
                    std::vector<double> us;
                    us.reserve(rounds);
                    for (int64_t i = 0; i < rounds; ++i) {
                      auto t0 = Clock::now();
                      p.send(peer, "pong").wait();
                      us.push_back(seconds_since(t0) * 1e6);
                    }
                    return c10::IValue(us);
                  });
  push::Pid a = dist.p_create(push::ParticleOptions(opts).device(0));
  push::Pid b = dist.p_create(push::ParticleOptions(opts).device(cross_lane ? 1 : 0));
  std::vector<double> all, baseline;
  for (auto _ : state) {
    auto us = dist.p_launch(a, "loop", b).wait().toDoubleVector();
    all.insert(all.end(), us.begin(), us.end());
    baseline.push_back(thread_pingpong_median_us(rounds));
  }
  report_latencies(state, all, median(baseline));
}
BENCHMARK(BM_MessageRoundTrip)->Arg(0)->Arg(1)->ArgName("cross_lane")->Iterations(3)->Unit(benchmark::kMillisecond);

void BM_LaunchRoundTrip(benchmark::State& state) {
  push::Push dist([] { return torch::nn::Linear(1, 1); }, push::PushOptions().intra_op_threads(1));
  push::Pid a = dist.p_create(
      push::ParticleOptions().on("pong", [](push::Particle&, const push::Args&) { return c10::IValue(); }));
  std::vector<double> us;
  for (auto _ : state) {
    auto t0 = Clock::now();
    dist.p_launch(a, "pong").wait();
    us.push_back(seconds_since(t0) * 1e6);
  }
  report_latencies(state, us, thread_pingpong_median_us(static_cast<int64_t>(us.size())));
}
BENCHMARK(BM_LaunchRoundTrip)->Iterations(20000);

// ---- cache swap -----------------------------------------------------------------------

// Two particles of `width`^2 parameters with Adam state on one lane. With cache_size 1
// every message to the other particle evicts one and restores the other; the same
// message sequence with cache_size 2 gives the cost without swapping.
void BM_CacheSwap(benchmark::State& state) {
  const int64_t width = state.range(0);
  const int swaps = 100;
  auto factory = [width] { return torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)); };
  auto opts = push::ParticleOptions()
                  .optimizer([](std::vector<torch::Tensor> ps) {
                    return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-3));
                  })
                  .on("prime",
                      [width](push::Particle& p, const push::Args&) {
                        auto x = torch::ones({1, width});
                        p.step([](const torch::Tensor& o, const torch::Tensor&) { return o.sum(); }, x, x).wait();
                        return c10::IValue();
                      })
                  .on("touch", [](push::Particle&, const push::Args&) { return c10::IValue(); });
  auto run = [&](int cache_size) {
    push::Push dist(factory, push::PushOptions().cache_size(cache_size).intra_op_threads(1));
    dist.p_create(opts);
    dist.p_create(opts);
    dist.p_launch(0, "prime").wait();
    dist.p_launch(1, "prime").wait();
    auto t0 = Clock::now();
    for (int i = 0; i < swaps; ++i) dist.p_launch(i % 2, "touch").wait();
    return seconds_since(t0);
  };
  // Parameters + gradients + Adam's two moments, moved out and back per swap.
  const double bytes_per_swap = 2.0 * 4 * width * width * sizeof(float);
  std::vector<char> src(static_cast<size_t>(bytes_per_swap)), dst(src.size());
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  double swap_s = 0, base_s = 0, memcpy_s = 0;
  for (auto _ : state) {
    swap_s += run(1);
    base_s += run(2);
    auto t0 = Clock::now();
    for (int i = 0; i < swaps; ++i) {
      std::memcpy(dst.data(), src.data(), src.size());
      benchmark::DoNotOptimize(dst.data());
    }
    memcpy_s += seconds_since(t0);
  }
  const double n = static_cast<double>(state.iterations()) * swaps;
  const double swap_gbps = bytes_per_swap * n / std::max(1e-9, swap_s - base_s) / 1e9;
  const double memcpy_gbps = bytes_per_swap * n / memcpy_s / 1e9;
  state.counters["MiB_per_swap"] = bytes_per_swap / (1 << 20);
  state.counters["swap_GBps"] = swap_gbps;
  state.counters["memcpy_GBps"] = memcpy_gbps;
  state.counters["ratio"] = swap_gbps / memcpy_gbps;
}
BENCHMARK(BM_CacheSwap)->Arg(512)->Arg(2048)->ArgName("width")->Iterations(5)->Unit(benchmark::kMillisecond);

// ---- many particles ---------------------------------------------------------------------

torch::nn::Sequential small_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(1, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
}

void BM_ManyParticles(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const bool view = state.range(1) != 0;
  const auto x = torch::randn({8, 1});
  push::Push dist(small_mlp, push::PushOptions().devices(1).cache_size(n).intra_op_threads(1));
  for (int i = 0; i < n; ++i) {
    dist.p_create(push::ParticleOptions().on("forward", [view](push::Particle& p, const push::Args& a) {
      torch::NoGradGuard no_grad;
      auto y = p.any_module().forward(a[0].toTensor());
      return c10::IValue(view ? y.unsqueeze(0) : y);
    }));
  }
  std::vector<torch::nn::Sequential> plain;
  for (int i = 0; i < n; ++i) plain.push_back(small_mlp());
  double push_s = 0, plain_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    std::vector<push::PFuture> fs;
    for (push::Pid pid = 0; pid < n; ++pid) fs.push_back(dist.p_launch(pid, "forward", x));
    dist.p_wait(fs);
    push_s += seconds_since(t0);
    t0 = Clock::now();
    {
      torch::NoGradGuard no_grad;
      for (auto& m : plain) benchmark::DoNotOptimize(m->forward(x));
    }
    plain_s += seconds_since(t0);
  }
  const double per = 1e6 / (static_cast<double>(n) * state.iterations());
  state.counters["per_particle_us"] = push_s * per;
  state.counters["plain_us"] = plain_s * per;
  state.counters["ratio"] = push_s / plain_s;
}
BENCHMARK(BM_ManyParticles)
    ->Args({1000, 0})
    ->Args({4000, 0})
    ->Args({1000, 1})
    ->ArgNames({"n", "view"})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

// ---- ensemble overhead ----------------------------------------------------------------

// 16 MLPs 1->64->64->1, Adam(0.01), y = sin x + 0.1 eps on 1,024 points, batch 128,
// 20 epochs: through push (one message per particle per epoch) vs a plain loop doing
// the same steps on the main thread, with the same intra-op threads.
using push_bench::mlp;
using push_bench::mse;
using push_bench::Workload;

/// The plain LibTorch loop over `count` networks on the calling thread; the networks are
/// built before `start` is passed, so only training is timed (as for push).
void plain_networks(const Workload& w, int count, int threads, std::latch& start) {
  at::set_num_threads(threads);
  std::vector<torch::nn::Sequential> nets;
  std::vector<std::unique_ptr<torch::optim::Adam>> opts;
  for (int i = 0; i < count; ++i) {
    nets.push_back(mlp());
    opts.push_back(std::make_unique<torch::optim::Adam>(nets.back()->parameters(), torch::optim::AdamOptions(0.01)));
  }
  start.arrive_and_wait();
  for (int e = 0; e < Workload::kEpochs; ++e) {
    for (int i = 0; i < count; ++i) {
      for (int b = 0; b < Workload::kPoints; b += Workload::kBatch) {
        auto xb = w.x.narrow(0, b, Workload::kBatch), yb = w.y.narrow(0, b, Workload::kBatch);
        opts[i]->zero_grad();
        auto loss = mse(nets[i]->forward(xb), yb);
        loss.backward();
        opts[i]->step();
      }
    }
  }
}

/// `workers` plain threads, each with `threads` intra-op threads, training an equal share
/// of the 16 networks: the equally parallel baseline of push with `workers` lanes (a lane
/// is a thread of its own too).
double plain_loop(const Workload& w, int workers, int threads) {
  std::latch start(workers + 1);
  std::vector<std::thread> pool;
  for (int k = 0; k < workers; ++k) {
    const int count = Workload::kParticles / workers + (k < Workload::kParticles % workers ? 1 : 0);
    pool.emplace_back([&w, &start, count, threads] { plain_networks(w, count, threads, start); });
  }
  start.arrive_and_wait();
  auto t0 = Clock::now();
  for (auto& t : pool) t.join();
  return seconds_since(t0);
}

double through_push(const Workload& w, int lanes, int threads) {
  push::Push dist(mlp, push::PushOptions().devices(lanes).intra_op_threads(threads).cache_size(16));
  auto opts = push::ParticleOptions()
                  .optimizer([](std::vector<torch::Tensor> ps) {
                    return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(0.01));
                  })
                  .on("epoch", [&w](push::Particle& p, const push::Args&) {
                    for (int b = 0; b < Workload::kPoints; b += Workload::kBatch) {
                      p.step(mse, w.x.narrow(0, b, Workload::kBatch), w.y.narrow(0, b, Workload::kBatch));
                    }
                    return c10::IValue();
                  });
  for (int i = 0; i < Workload::kParticles; ++i) dist.p_create(opts);
  auto t0 = Clock::now();
  for (int e = 0; e < Workload::kEpochs; ++e) {
    std::vector<push::PFuture> fs;
    for (push::Pid pid = 0; pid < Workload::kParticles; ++pid) fs.push_back(dist.p_launch(pid, "epoch"));
    dist.p_wait(fs);
  }
  return seconds_since(t0);
}

void BM_EnsembleOverhead(benchmark::State& state) {
  const int lanes = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  Workload w;
  double push_s = 0, plain_s = 0;
  bool push_first = false;
  for (auto _ : state) {
    // Alternate the order so that neither side always runs on a warm allocator.
    if (push_first) push_s += through_push(w, lanes, threads);
    plain_s += plain_loop(w, lanes, threads);
    if (!push_first) push_s += through_push(w, lanes, threads);
    push_first = !push_first;
  }
  state.counters["push_s"] = push_s / state.iterations();
  state.counters["plain_s"] = plain_s / state.iterations();
  state.counters["ratio"] = push_s / plain_s;
}
// (lanes, intra-op threads per lane): the plain baseline runs `lanes` threads with the same
// intra-op threads each.
BENCHMARK(BM_EnsembleOverhead)
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({2, 1})
    ->ArgNames({"lanes", "threads"})
    ->Iterations(4)
    ->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
