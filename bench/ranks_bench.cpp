// One distribution over 2 ranks (PushOptions::world) on this machine, against its
// baselines in the same run:
//   ParticleRoundTrip  a handler sends a 16-byte tensor to a particle and waits for the
//                      answer: to a particle on its own lane, on the other rank, and (the
//                      raw baseline) a plain RpcGroup::rpc_sync between the same processes
//   Ensemble16         16 MLPs (bench/runtime_bench.cpp's workload W: 1-64-64-1, 1,024
//                      points, batch 128, 20 epochs) on 2 ranks x 1 lane, against 1 rank x
//                      2 lanes (the same lanes, in one process); ratio = 1x2 time / 2x1 time
// Rank 0 runs the benchmarks and starts rank 1 itself (bench/bench_ranks.h); rank 1 builds
// the same distribution and serves until rank 0 is done.
//   ./build/bench/push_bench_ranks --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <push/dist.h>
#include <push/push.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <optional>

#include "bench_ranks.h"
#include "workload_w.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

using push_bench::mlp;
using push_bench::mse;
using push_bench::Workload;
constexpr int kParticles = Workload::kParticles, kEpochs = Workload::kEpochs, kBatch = Workload::kBatch,
              kPoints = Workload::kPoints;
constexpr push::Pid kFirstMlp = 4;  // particles 0..3 answer pings; 4..19 are the ensemble

// Every particle of either distribution: pings, a driver of pings, and an epoch of W (the
// data lives in each process: only the message "epoch" crosses ranks).
push::ParticleOptions particle(const Workload& w) {
  return push::ParticleOptions()
      .optimizer([](std::vector<torch::Tensor> ps) {
        return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(0.01));
      })
      .on("ping", [](push::Particle&, const push::Args& a) { return a.at(0); })
      .on("drive",
          [](push::Particle& p, const push::Args& a) {
            const push::Pid to = a.at(0).toInt();
            const int64_t n = a.at(1).toInt();
            auto payload = torch::ones({4});
            for (int64_t i = 0; i < n; ++i) p.send(to, "ping", payload).wait();
            return c10::IValue();
          })
      .on("epoch", [&w](push::Particle& p, const push::Args&) {
        for (int b = 0; b < kPoints; b += kBatch) p.step(mse, w.x.narrow(0, b, kBatch), w.y.narrow(0, b, kBatch));
        return c10::IValue();
      });
}

c10::IValue echo(const push::dist::RpcArgs& a) { return a.at(0); }
PUSH_RPC_FUNCTION(echo);

struct Job {
  Workload w;
  std::optional<push::dist::World> world;
  std::optional<push::dist::RpcGroup> raw;
  std::optional<push::Push> dist;  // 2 ranks x 1 lane
};
Job* g_job = nullptr;

// Particle 0 (rank 0) sends to particle 2 (rank 0, same lane) or 1 (rank 1).
void BM_ParticleRoundTrip(benchmark::State& state) {
  const push::Pid to = state.range(0) == 0 ? 2 : 1;
  constexpr int64_t kPerLaunch = 200;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    g_job->dist->p_launch(0, "drive", to, kPerLaunch).wait();
    seconds += seconds_since(t0);
  }
  state.counters["us"] = 1e6 * seconds / static_cast<double>(state.iterations() * kPerLaunch);
}
BENCHMARK(BM_ParticleRoundTrip)->Arg(0)->Arg(1)->ArgName("cross_rank")->UseRealTime()->MinTime(1.0);

// The raw RPC round trip between the same two processes, same payload.
void BM_RawRpcRoundTrip(benchmark::State& state) {
  auto payload = torch::ones({4});
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    g_job->raw->rpc_sync(1, "echo", {payload});
    seconds += seconds_since(t0);
  }
  state.counters["us"] = 1e6 * seconds / static_cast<double>(state.iterations());
}
BENCHMARK(BM_RawRpcRoundTrip)->UseRealTime()->MinTime(1.0);

double train(push::Push& d, push::Pid first) {
  const auto t0 = Clock::now();
  for (int e = 0; e < kEpochs; ++e) {
    std::vector<push::PFuture> fs;
    for (push::Pid pid = first; pid < first + kParticles; ++pid) fs.push_back(d.p_launch(pid, "epoch"));
    d.p_wait(fs);
  }
  return seconds_since(t0);
}

void BM_Ensemble16(benchmark::State& state) {
  // The 1 rank x 2 lanes baseline: one intra-op thread per lane, as each rank's lane has.
  push::Push local(mlp, push::PushOptions().devices(2).intra_op_threads(1).cache_size(16));
  for (int i = 0; i < kParticles; ++i) local.p_create(particle(g_job->w));
  double ranks_s = 0, lanes_s = 0;
  bool ranks_first = false;
  for (auto _ : state) {
    if (ranks_first) ranks_s += train(*g_job->dist, kFirstMlp);
    lanes_s += train(local, 0);
    if (!ranks_first) ranks_s += train(*g_job->dist, kFirstMlp);
    ranks_first = !ranks_first;
  }
  state.counters["2x1_s"] = ranks_s / static_cast<double>(state.iterations());
  state.counters["1x2_s"] = lanes_s / static_cast<double>(state.iterations());
  state.counters["ratio"] = lanes_s / ranks_s;
}
BENCHMARK(BM_Ensemble16)->Iterations(4)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  const auto peers = push_bench::start_ranks(argv[0], 2);
  Job job;
  g_job = &job;
  job.world.emplace(push::dist::WorldOptions::from_env());
  job.raw.emplace(job.world->rpc_group("bench-raw", job.world->names()));
  job.dist.emplace(mlp, push::PushOptions().devices(1).cache_size(16).world(*job.world));
  for (int i = 0; i < static_cast<int>(kFirstMlp) + kParticles; ++i) job.dist->p_create(particle(job.w));
  if (job.world->rank() == 0) {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  job.dist->barrier();  // rank 1 serves until here
  job.dist.reset();
  job.raw->barrier();
  job.raw->shutdown();
  return push_bench::wait_ranks(peers);
}
