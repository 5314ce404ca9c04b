// Blocking DataParallel against its baselines, and non-blocking and DASO against it, one run (the binary starts its own
// rank 1; every process at 1 intra-op thread and 1 OpenBLAS thread), one row, DataParallel/cnn: push train's CNN (conv
// 16 - pool - conv 32 - pool - dense 64) on 28x28 images, batches of 64 per rank, SGD.
//   dp_samples_per_s     both ranks together under DataParallel
//   one_samples_per_s    rank 0 alone, the same loop without DataParallel
//   speedup              dp / one (the target: >= 1.8 on 2 cores)
//   both_plain_speedup   the same for two plain loops at once that never communicate: the
//                        machine's own ceiling
//   overhead_us          per step, what DataParallel adds to two plain loops running at
//                        once (the equally parallel baseline; waiting for rank 1 included)
//   overhead_alone_us    per step, what it adds to rank 0's step alone on an idle machine
//                        (this also counts what sharing the machine costs)
//   raw_all_reduce_us    one all_reduce of a gradient-sized flat tensor per step
//   overhead_ratio       overhead_us / raw_all_reduce_us (target <= 1.1)
//   overhead_alone_ratio overhead_alone_us / raw_all_reduce_us
//   nonblocking_vs_blocking  NonBlockingDataParallel's samples/s over blocking's
//   daso_vs_blocking     Daso's (2 ranks as 2 nodes of 1, at global_skip 4: its first value
//                        after the warm-up; the epoch's last batch waits) over blocking's
// PUSH_BENCH_BUCKET_BYTES sets DataParallelOptions::bucket_bytes (default 4 MiB: the CNN's
// 424 KB of gradients are one bucket).
//   push_bench_data_parallel --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <push/bayes/models.h>
#include <push/data_parallel/daso.h>
#include <push/data_parallel/data_parallel.h>
#include <push/data_parallel/non_blocking_data_parallel.h>
#include <push/dist.h>

#include <dlfcn.h>
#include <sys/wait.h>

#include <chrono>
#include <functional>

#include "bench_ranks.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kBatch = 64;
enum Command : int64_t { kStop, kDataParallel, kRawAllReduce, kPlainBoth, kNonBlocking, kDaso };

push::dist::World* g_world = nullptr;
int64_t g_bucket = int64_t{4} << 20;  // PUSH_BENCH_BUCKET_BYTES overrides
push::dist::CollectiveGroup* g_all = nullptr;

void one_thread() {
  using Set = void (*)(int);
  if (auto set = reinterpret_cast<Set>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(1);
  at::set_num_threads(1);
}

torch::nn::AnyModule cnn() { return push::bayes::make_model("cnn", {1, 28, 28}, 10)(); }

struct Loop {
  torch::nn::AnyModule net = cnn();
  torch::optim::SGD sgd{net.ptr()->parameters(), torch::optim::SGDOptions(0.01)};
  torch::Tensor x = torch::randn({kBatch, 1, 28, 28});
  torch::Tensor y = torch::randint(10, {kBatch}, torch::kLong);
  /// One SGD step; `forward` and `update` replace the network's forward and sgd.step().
  void step(const std::function<torch::Tensor(const torch::Tensor&)>& forward = {},
            const std::function<void()>& update = {}) {
    sgd.zero_grad();
    torch::nll_loss(torch::log_softmax(forward ? forward(x) : net.forward(x), 1), y).backward();
    if (update) {
      update();
    } else {
      sgd.step();
    }
  }
};

/// Seconds that `steps` calls of `step` take.
double seconds_of(int64_t steps, const std::function<void()>& step) {
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t flat_gradient_numel(Loop& loop) {
  int64_t n = 0;
  for (const auto& p : loop.net.ptr()->parameters()) n += p.numel();
  return n;
}

// What both ranks run for a command: two untimed steps, then `steps` timed ones from a
// barrier.
double run(int64_t what, int64_t steps) {
  Loop loop;
  auto timed = [&](const std::function<void()>& step) {
    g_all->barrier();
    return seconds_of(steps, step);
  };
  auto plain = [&] { loop.step(); };
  if (what == kDataParallel) {
    push::data_parallel::DataParallel dp(*loop.net.ptr(), *g_all,
                                         push::data_parallel::DataParallelOptions().bucket_bytes(g_bucket));
    seconds_of(2, plain);
    return timed(plain);
  }
  if (what == kNonBlocking) {
    torch::nn::Sequential seq = loop.net.get<push::SequentialNet>()->layers();
    push::data_parallel::NonBlockingDataParallel nb(seq, *g_all);
    auto step = [&] {
      loop.step([&](const torch::Tensor& x) { return nb.forward(x); },
                [&] {
                  loop.sgd.step();
                  nb.start_averaging();
                });
    };
    seconds_of(2, step);
    nb.synchronize();
    return timed([&, left = steps]() mutable {
      step();
      if (--left == 0) nb.synchronize();  // the last average is part of the work
    });
  }
  if (what == kDaso) {
    push::data_parallel::Daso daso(
        *loop.net.ptr(), loop.sgd, *g_world,
        push::data_parallel::DasoOptions(1000).ranks_per_node(1).warmup_epochs(0).cooldown_epochs(0));
    auto step = [&] { loop.step({}, [&] { daso.step(); }); };
    daso.set_batches_per_epoch(2);  // an untimed first epoch; warm-up 0: cycling from the start
    seconds_of(2, step);
    daso.end_epoch(1.0);
    daso.set_batches_per_epoch(steps);
    return timed(step);
  }
  if (what == kPlainBoth) {  // both ranks at once, no communication: what sharing the machine costs
    seconds_of(2, plain);
    return timed(plain);
  }
  // kRawAllReduce: one all_reduce of a flat gradient-sized tensor per step.
  auto flat = torch::randn({flat_gradient_numel(loop)});
  return timed([&] { g_all->all_reduce(flat, push::dist::ReduceOp::average); });
}

double command(int64_t what, int64_t steps) {
  auto c = torch::tensor({what, steps});
  g_all->broadcast(c, 0);
  const double seconds = run(what, steps);
  g_all->barrier();
  return seconds;
}

// One row: every iteration times DataParallel, the two plain loops at once, the raw
// all_reduce and rank 0 alone, in turn.
void BM_DataParallel(benchmark::State& state) {
  const int64_t steps = 20;
  double dp = 0, both = 0, raw = 0, one = 0, nonblocking = 0, daso = 0;
  for (auto _ : state) {
    dp += command(kDataParallel, steps);
    nonblocking += command(kNonBlocking, steps);
    daso += command(kDaso, steps);
    both += command(kPlainBoth, steps);
    raw += command(kRawAllReduce, steps);
    Loop alone;
    seconds_of(2, [&] { alone.step(); });
    one += seconds_of(steps, [&] { alone.step(); });
  }
  const double n = static_cast<double>(steps * state.iterations()), samples = n * kBatch;
  state.counters["dp_samples_per_s"] = 2 * samples / dp;
  state.counters["one_samples_per_s"] = samples / one;
  state.counters["speedup"] = one / dp * 2;
  // The ceiling on this machine: two independent loops at once, no communication.
  state.counters["both_plain_speedup"] = one / both * 2;
  state.counters["overhead_us"] = (dp - both) / n * 1e6;
  state.counters["overhead_alone_us"] = (dp - one) / n * 1e6;
  state.counters["raw_all_reduce_us"] = raw / n * 1e6;
  state.counters["overhead_ratio"] = (dp - both) / raw;
  state.counters["overhead_alone_ratio"] = (dp - one) / raw;
  state.counters["nonblocking_vs_blocking"] = dp / nonblocking;
  state.counters["daso_vs_blocking"] = dp / daso;
}

}  // namespace

int main(int argc, char** argv) {
  const bool is_child = std::getenv("PUSH_DIST_BENCH_CHILD") != nullptr;
  const auto peers = push_bench::start_ranks(argv[0], 2);
  one_thread();
  if (const char* b = std::getenv("PUSH_BENCH_BUCKET_BYTES")) g_bucket = std::atoll(b);
  auto world = push::dist::World::from_env();
  auto all = world.collective();
  g_world = &world;
  g_all = &all;
  if (is_child) {
    for (;;) {
      auto c = torch::zeros({2}, torch::kLong);
      all.broadcast(c, 0);
      if (c[0].item<int64_t>() == kStop) break;
      run(c[0].item<int64_t>(), c[1].item<int64_t>());
      all.barrier();
    }
    return 0;
  }
  benchmark::RegisterBenchmark("DataParallel/cnn", BM_DataParallel)
      ->Iterations(3)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  auto stop = torch::tensor({int64_t{kStop}, int64_t{0}});
  all.broadcast(stop, 0);
  const int failed = push_bench::wait_ranks(peers);
  benchmark::Shutdown();
  return failed;
}
