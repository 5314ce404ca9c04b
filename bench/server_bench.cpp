// push::server and push::parallel against their baselines, one run, processes on 127.0.0.1
// (the binary starts its own ranks 1-4). Rank 0 hosts; the others are clients.
//   OrderedServer/3clients   3 clients, each `pull` then `push` of the next version of its
//                            own key (a small tensor), as fast as they can
//                            counters: rt_per_s (round trips per second, all clients),
//                            raw_rt_per_s (the same clients, RpcGroup::rpc_sync of an echo
//                            of the same tensor to rank 0), ratio = raw_rt_per_s / rt_per_s
//   GradServer/4clients_1MiB 4 clients, each `push` of a 1 MiB model's gradients then
//                            `pull` of its parameters; the server steps (SGD) on every push
//                            counters: updates_per_s, raw_per_s (each client an echo of
//                            1 MiB per update: the same bytes each way), ratio
//   ThreadPool/map_10000     ThreadPool(2).map of 10,000 tiny tasks
//                            counters: tasks_per_s, async_tasks_per_s (a loop of
//                            std::async(std::launch::async) over the same tasks), ratio
//   push_bench_server --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <push/dist.h>
#include <push/parallel/thread_pool.h>
#include <push/server/grad_server.h>

#include <sys/wait.h>

#include <chrono>
#include <future>
#include <thread>

#include "bench_ranks.h"

namespace {

constexpr int kWorldSize = 5;
enum Command : int64_t { kStop, kOrdered, kOrderedRaw, kGrad, kGradRaw };

c10::IValue server_bench_echo(const push::dist::RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(server_bench_echo);

struct Job {
  push::dist::World world;
  push::dist::CollectiveGroup all;
  push::dist::RpcGroup rpc;
};
Job* g_job = nullptr;

// 1 MiB of parameters: 512 x 512 floats.
torch::nn::Linear model_1mib() { return torch::nn::Linear(torch::nn::LinearOptions(512, 512).bias(false)); }

using Clock = std::chrono::steady_clock;

// What a client does for one command, `n` times.
void client(int64_t what, int64_t n) {
  auto& j = *g_job;
  const auto small = torch::ones({16});
  if (what == kOrdered) {
    push::server::OrderedServer server(j.rpc, "bench");
    const std::string key = j.world.name();
    for (int64_t i = 0; i < n; ++i) {
      auto newest = server.pull(key);
      const int64_t v = newest ? newest->version : 0;
      if (!server.push(key, small, v + 1, newest ? std::optional<int64_t>(v) : std::nullopt)) std::abort();
    }
  } else if (what == kOrderedRaw) {
    for (int64_t i = 0; i < 2 * n; ++i) j.rpc.rpc_sync(0, "server_bench_echo", {small});
  } else if (what == kGrad) {
    push::server::GradServer ps(j.rpc, "grads");
    auto net = model_1mib();
    net->weight.mutable_grad() = torch::ones_like(net->weight);
    for (int64_t i = 0; i < n; ++i) {
      ps.push(*net);
      ps.pull(*net);
    }
  } else if (what == kGradRaw) {
    const auto mib = torch::ones({512, 512});
    for (int64_t i = 0; i < n; ++i) j.rpc.rpc_sync(0, "server_bench_echo", {mib});
  }
}

// Rank 0: every client runs `what` n times; returns the seconds from start to the last.
double run_clients(int64_t what, int64_t n) {
  auto c = torch::tensor({what, n});
  g_job->all.broadcast(c, 0);
  const auto t0 = Clock::now();
  g_job->all.barrier();  // the clients reach it when done
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BM_OrderedServer(benchmark::State& state) {
  const int64_t n = 500, clients = 3;
  double seconds = 0, raw = 0;
  run_clients(kOrdered, 20);  // warm-up: connections, lookups
  for (auto _ : state) {
    seconds += run_clients(kOrdered, n);
    raw += run_clients(kOrderedRaw, n);
  }
  const double trips = 2.0 * n * clients * static_cast<double>(state.iterations());
  state.counters["rt_per_s"] = trips / seconds;
  state.counters["raw_rt_per_s"] = trips / raw;
  state.counters["ratio"] = seconds / raw;
}

void BM_GradServer(benchmark::State& state) {
  const int64_t n = 50, clients = 4;
  double seconds = 0, raw = 0;
  run_clients(kGrad, 5);
  for (auto _ : state) {
    seconds += run_clients(kGrad, n);
    raw += run_clients(kGradRaw, n);
  }
  const double updates = static_cast<double>(n * clients * state.iterations());
  state.counters["updates_per_s"] = updates / seconds;
  state.counters["raw_per_s"] = updates / raw;
  state.counters["ratio"] = seconds / raw;
}

void BM_ThreadPoolMap(benchmark::State& state) {
  const int n = 10000;
  std::vector<int> items(n);
  std::iota(items.begin(), items.end(), 0);
  auto tiny = [](int x) { return x * 2 + 1; };
  push::parallel::ThreadPool pool(2);
  double seconds = 0, async_seconds = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    auto out = pool.map(tiny, items);
    benchmark::DoNotOptimize(out);
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    t0 = Clock::now();
    std::vector<std::future<int>> fs;
    fs.reserve(n);
    for (int x : items) fs.push_back(std::async(std::launch::async, tiny, x));
    int64_t sum = 0;
    for (auto& f : fs) sum += f.get();
    benchmark::DoNotOptimize(sum);
    async_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double tasks = static_cast<double>(n) * static_cast<double>(state.iterations());
  state.counters["tasks_per_s"] = tasks / seconds;
  state.counters["async_tasks_per_s"] = tasks / async_seconds;
  state.counters["ratio"] = async_seconds / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const bool is_child = std::getenv("PUSH_DIST_BENCH_CHILD") != nullptr;
  const auto peers = push_bench::start_ranks(argv[0], kWorldSize);
  auto world = push::dist::World::from_env();
  Job job{world, world.collective(), world.rpc_group("bench", world.names())};
  g_job = &job;
  std::unique_ptr<push::server::OrderedServerHost> ordered;
  std::unique_ptr<push::server::GradServerHost> grads;
  auto served = model_1mib();
  torch::optim::SGD sgd(served->parameters(), torch::optim::SGDOptions(1e-6));
  if (!is_child) {
    ordered = std::make_unique<push::server::OrderedServerHost>(job.rpc, "bench");
    grads = std::make_unique<push::server::GradServerHost>(
        job.rpc, "grads", world.name(), std::vector<std::string>{world.name()},
        push::server::GradServerOptions().reduce_batch_size(1).max_queue_size(8));
    grads->manage_model(*served, sgd);
  }
  job.rpc.barrier();
  if (is_child) {
    for (;;) {
      auto c = torch::zeros({2}, torch::kLong);
      job.all.broadcast(c, 0);
      const int64_t what = c[0].item<int64_t>();
      if (what == kStop) break;
      // The ordered server's rows use 3 clients, the gradient server's 4.
      const bool mine = what == kGrad || what == kGradRaw || world.rank() <= 3;
      if (mine) client(what, c[1].item<int64_t>());
      job.all.barrier();
    }
    job.rpc.barrier();
    job.rpc.shutdown();
    return 0;
  }
  benchmark::RegisterBenchmark("OrderedServer/3clients", BM_OrderedServer)
      ->Iterations(3)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("GradServer/4clients_1MiB", BM_GradServer)
      ->Iterations(3)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("ThreadPool/map_10000", BM_ThreadPoolMap)
      ->Iterations(5)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  auto stop = torch::tensor({int64_t{kStop}, int64_t{0}});
  job.all.broadcast(stop, 0);
  job.rpc.barrier();
  grads.reset();
  ordered.reset();
  job.rpc.shutdown();
  const int failed = push_bench::wait_ranks(peers);
  benchmark::Shutdown();
  return failed;
}
