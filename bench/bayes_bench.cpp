// Bayesian algorithms through push vs plain LibTorch loops doing the same arithmetic, on
// the runtime issue's workload: 16 particles, MLP 1->64->64->1, 1,024 points, batch 128,
// 20 epochs, Adam(0.01), Gaussian likelihood + Gaussian prior.
//
//   ./build/bench/push_bench_bayes
//   ./build/bench/push_bench_bayes --benchmark_filter=SVGD
//
// BM_SGLD: SGLD chains (bayes::SGMCMC's defaults) against a plain loop of the same steps,
// noise and kept samples; fused chains in the same run.
// Counters: push_s, plain_s (means), ratio = push_s / plain_s and ratio_min (best run of
// each; targets: ensemble <= 1.1, SVGD <= 1.3). Fused particles (InferOptions::fuse) in the
// same run: fused_s, fused_speedup = plain_s / fused_s (targets at 1 lane x 1 thread:
// ensemble >= 4, SVGD >= 3) and fused_x_limit = fused_s / the arithmetic limit, which is
// the run's FLOPs (3 x 2 x weights per point, network and epoch) at the one-core sgemm
// rate measured in the same run (target at N = 16: <= 4; at N = 64: <= 3), and
// fused_x_floor = fused_s / floor_s, the time of the fit's matrix products alone as one
// sequence of BLAS calls on as many threads as lanes (gemm_floor; target for the ensemble
// at 1 lane: <= 2); with 2 lanes, fused_lanes_speedup = a fused run on 1 lane in the same
// iteration / fused_s (targets: ensemble >= 1.8, SVGD >= 1.6).
// BM_FusedCnn: the Fashion-MNIST CNN ensemble (8 particles), fused against unfused, in
// training images per second (each particle's images counted). The plain ensemble loop trains each
// network in turn with the same seeded shuffles; the plain SVGD loop is vectorised: per
// step every network's gradient, then the particles' flat parameters stacked, one kernel
// matrix, one update. With L lanes the plain loops run on L threads (each with the same
// intra-op threads as a lane, each owning 16/L networks; SVGD meets at a barrier for the
// kernel step), so the ratio measures push's overhead, not its parallelism.
#include <push/push.h>

#include <dlfcn.h>

#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <latch>
#include <memory>
#include <numbers>
#include <thread>

#include "bayes/fused_mlp.h"
#include "core/seed.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kEpochs = 20, kBatch = 128, kPoints = 1024;
int g_particles = 16;  // the benchmark's N, set by each run

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Workload {
  push::data::Dataset data;
  Workload() {
    torch::manual_seed(0);
    data.x = torch::rand({kPoints, 1}) * 8 - 4;
    data.y = torch::sin(data.x) + 0.1 * torch::randn({kPoints, 1});
  }
};

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(1, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                               torch::nn::ReLU(), torch::nn::Linear(64, 1));
}

push::bayes::InferOptions options(int lanes, int threads, bool fuse = false) {
  return push::bayes::InferOptions()
      .fuse(fuse)
      .particles(g_particles)
      .distribution(push::PushOptions().devices(lanes).intra_op_threads(threads).cache_size(g_particles))
      .batch_size(kBatch)
      .lr(0.01);
}

// The objective push::bayes uses: gaussian nll (σ = 1, with its constant) + prior / N.
torch::Tensor nll(const torch::Tensor& out, const torch::Tensor& y) {
  static const double c = 0.5 * std::log(2 * std::numbers::pi);
  return ((y - out).pow(2) * 0.5).sum(1).mean() + c;
}
torch::Tensor prior(torch::nn::Module& m) {
  torch::Tensor s;
  for (const auto& p : m.parameters()) s = s.defined() ? s + p.pow(2).sum() : p.pow(2).sum();
  return s / 2.0;
}
at::Generator gen(uint64_t a, uint64_t b, uint64_t c) {
  return at::make_generator<at::CPUGeneratorImpl>(push::detail::mix_seed(0, a, b, c));
}

/// Networks i = first, first + stride, ... < g_particles, each with its own Adam.
struct Nets {
  std::vector<int> ids;
  std::vector<torch::nn::Sequential> nets;
  std::vector<std::unique_ptr<torch::optim::Adam>> opts;
  Nets(int first, int stride) {
    for (int i = first; i < g_particles; i += stride) {
      ids.push_back(i);
      nets.push_back(mlp());
      opts.push_back(std::make_unique<torch::optim::Adam>(nets.back()->parameters(), torch::optim::AdamOptions(0.01)));
    }
  }
};

/// Runs body(k) on `workers` plain threads with `threads` intra-op threads each; setup(k)
/// runs first on the same thread and is not timed. The equally parallel baseline of push
/// with `workers` lanes (a lane is a thread of its own too).
template <class Setup, class Body>
double on_workers(int workers, int threads, Setup setup, Body body) {
  std::latch start(workers + 1);
  std::vector<std::thread> pool;
  for (int k = 0; k < workers; ++k) {
    pool.emplace_back([&, k] {
      at::set_num_threads(threads);
      auto state = setup(k);
      start.arrive_and_wait();
      body(k, state);
    });
  }
  start.arrive_and_wait();
  auto t0 = Clock::now();
  for (auto& t : pool) t.join();
  return seconds_since(t0);
}

double plain_ensemble(const Workload& w, int workers, int threads) {
  return on_workers(
      workers, threads, [workers](int k) { return std::make_shared<Nets>(k, workers); },
      [&w](int, const std::shared_ptr<Nets>& n) {
        for (int e = 0; e < kEpochs; ++e) {
          for (size_t j = 0; j < n->ids.size(); ++j) {
            const int i = n->ids[j];
            auto order = torch::randperm(kPoints, gen(i, e, 1), torch::kLong);
            double total = 0;
            for (int b = 0; b < kPoints; b += kBatch) {
              auto idx = order.narrow(0, b, kBatch);
              n->opts[j]->zero_grad();
              auto l = nll(n->nets[j]->forward(w.data.x.index_select(0, idx)), w.data.y.index_select(0, idx));
              (l + prior(*n->nets[j]) / kPoints).backward();
              n->opts[j]->step();
              total += l.item<double>();
            }
            benchmark::DoNotOptimize(total);
          }
        }
      });
}

/// Vectorised SVGD: per step each worker computes its networks' gradients, one worker
/// stacks every particle and computes the kernel step, then each worker steps its own.
double plain_svgd(const Workload& w, int workers, int threads) {
  std::vector<torch::Tensor> thetas(g_particles), grads(g_particles);
  torch::Tensor phi;
  std::barrier sync(workers);
  return on_workers(
      workers, threads, [workers](int k) { return std::make_shared<Nets>(k, workers); },
      [&](int k, const std::shared_ptr<Nets>& n) {
        for (int e = 0; e < kEpochs; ++e) {
          auto order = torch::randperm(kPoints, gen(2, e, 3), torch::kLong);
          for (int b = 0; b < kPoints; b += kBatch) {
            auto idx = order.narrow(0, b, kBatch);
            auto xb = w.data.x.index_select(0, idx), yb = w.data.y.index_select(0, idx);
            for (size_t j = 0; j < n->ids.size(); ++j) {
              n->opts[j]->zero_grad();
              auto l = nll(n->nets[j]->forward(xb), yb);
              (l * kPoints + prior(*n->nets[j])).backward();
              std::vector<torch::Tensor> t, g;
              for (const auto& p : n->nets[j]->parameters()) {
                t.push_back(p.detach().reshape(-1));
                g.push_back(-p.grad().reshape(-1));
              }
              thetas[n->ids[j]] = torch::cat(t);
              grads[n->ids[j]] = torch::cat(g);
              benchmark::DoNotOptimize(l.item<double>());
            }
            sync.arrive_and_wait();
            if (k == 0) phi = push::bayes::svgd_direction(torch::stack(thetas), torch::stack(grads), std::nullopt);
            sync.arrive_and_wait();
            for (size_t j = 0; j < n->ids.size(); ++j) {
              int64_t off = 0;
              for (auto& p : n->nets[j]->parameters()) {
                p.mutable_grad() = -phi[n->ids[j]].narrow(0, off, p.numel()).view_as(p);
                off += p.numel();
              }
              n->opts[j]->step();
            }
          }
        }
      });
}

/// SGLD chains as bayes::SGMCMC's defaults take them (step 1e-3 per point, one sample kept
/// every step, the last 20 in a ring on the host): each network in turn, as plain_ensemble,
/// with its noise drawn from a generator of its own.
double plain_sgld(const Workload& w, int workers, int threads) {
  const double eps = 1e-3, noise = std::sqrt(2 * eps / kPoints);
  return on_workers(
      workers, threads, [workers](int k) { return std::make_shared<Nets>(k, workers); },
      [&](int, const std::shared_ptr<Nets>& n) {
        std::vector<torch::Tensor> rings;
        for (auto& net : n->nets)
          rings.push_back(torch::zeros({20, torch::nn::utils::parameters_to_vector(net->parameters()).numel()}));
        int64_t kept = 0;
        for (int e = 0; e < kEpochs; ++e) {
          for (size_t j = 0; j < n->ids.size(); ++j) {
            const int i = n->ids[j];
            auto order = torch::randperm(kPoints, gen(i, e, 1), torch::kLong);
            auto langevin = gen(i, e, 4);
            for (int b = 0; b < kPoints; b += kBatch) {
              auto idx = order.narrow(0, b, kBatch);
              n->nets[j]->zero_grad();
              auto l = nll(n->nets[j]->forward(w.data.x.index_select(0, idx)), w.data.y.index_select(0, idx));
              (l + prior(*n->nets[j]) / kPoints).backward();
              torch::NoGradGuard no_grad;
              for (auto& p : n->nets[j]->parameters()) {
                p.add_(p.grad(), -eps).add_(torch::randn(p.sizes(), langevin), noise);
              }
              rings[j][(kept++) % 20].copy_(torch::nn::utils::parameters_to_vector(n->nets[j]->parameters()));
              benchmark::DoNotOptimize(l.item<double>());
            }
          }
        }
      });
}

template <class Algo>
double through_push(const Workload& w, int lanes, int threads, bool fuse = false) {
  Algo algo([] { return push::to_any_module(mlp()); }, options(lanes, threads, fuse));
  algo.distribution();  // create the particles outside the timed region, as the plain loop does
  auto t0 = Clock::now();
  algo.fit(w.data, kEpochs);
  return seconds_since(t0);
}

// Every pool (intra-op and OpenBLAS's) at one thread.
void one_thread() {
  using Set = void (*)(int);
  if (auto set = reinterpret_cast<Set>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(1);
  at::set_num_threads(1);
}

// One core's sgemm rate (FLOP/s), best of 5 products of 512 x 512 matrices, one_thread().
double sgemm_rate() {
  one_thread();
  const int64_t n = 512;
  auto a = torch::randn({n, n}), b = torch::randn({n, n});
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    benchmark::DoNotOptimize(torch::mm(a, b));
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / best;
}

// The floor of a fused run (issue 49): only the matrix products of the workload's forward
// and backward (three forward, five backward: no input gradient), one BLAS call per
// network and product as a sequence, the same BLAS LibTorch calls and nothing around it;
// on `workers` threads of one intra-op thread each (the equally parallel floor of as many
// lanes), each with its share of the g_particles networks; seconds for the fit's steps,
// best of 3.
double gemm_floor(int workers) {
  if (push::bayes::detail::blas_sgemm() == nullptr) return std::nan("");
  using push::bayes::detail::gemm_each;
  const int64_t steps = kEpochs * ((kPoints + kBatch - 1) / kBatch), b = kBatch;
  const int64_t w[] = {1, 64, 64, 1};
  struct Buffers {
    int64_t n = 0;
    std::vector<torch::Tensor> act, grad, weight, weight_grad;
  };
  auto setup = [&](int k) {
    one_thread();
    auto buffers = std::make_shared<Buffers>();
    buffers->n = (g_particles - k + workers - 1) / workers;  // networks k, k + workers, ...
    for (int l = 0; l < 4; ++l) {
      buffers->act.push_back(torch::randn({buffers->n, b, w[l]}));
      buffers->grad.push_back(torch::randn({buffers->n, b, w[l]}));
    }
    for (int l = 0; l < 3; ++l) {
      buffers->weight.push_back(torch::randn({buffers->n, w[l + 1], w[l]}));
      buffers->weight_grad.push_back(torch::empty({buffers->n, w[l + 1], w[l]}));
    }
    return buffers;
  };
  auto body = [&](int, const std::shared_ptr<Buffers>& x) {
    for (int64_t s = 0; s < steps; ++s) {
      for (int l = 0; l < 3; ++l)
        gemm_each(x->n, false, true, b, w[l + 1], w[l], x->act[l], x->weight[l], 0, x->act[l + 1]);
      for (int l = 2; l >= 0; --l) {
        gemm_each(x->n, true, false, w[l + 1], w[l], b, x->grad[l + 1], x->act[l], 0, x->weight_grad[l]);
        if (l > 0) gemm_each(x->n, false, false, b, w[l], w[l + 1], x->grad[l + 1], x->weight[l], 0, x->grad[l]);
      }
    }
  };
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) best = std::min(best, on_workers(workers, 1, setup, body));
  return best;
}

// The workload's arithmetic: forward 2 FLOPs per weight, backward twice that.
double workload_flops() {
  const double weights = 1 * 64 + 64 * 64 + 64 * 1;
  return 3 * 2 * weights * kPoints * kEpochs * g_particles;
}

template <class Algo>
void run(benchmark::State& state, double (*plain)(const Workload&, int, int)) {
  const int lanes = static_cast<int>(state.range(0)), threads = static_cast<int>(state.range(1));
  g_particles = static_cast<int>(state.range(2));
  Workload w;
  double push_s = 0, plain_s = 0, fused_s = 0, push_min = 1e30, plain_min = 1e30, floor_s = 0, fused_one_lane = 0;
  for (auto _ : state) {
    floor_s += gemm_floor(lanes);
    if (lanes > 1) fused_one_lane += through_push<Algo>(w, 1, threads, /*fuse=*/true);
    // push first: the heap setting its first Push makes (src/runtime/heap.cpp) then holds
    // for the plain loop too, as it would in a program that uses push.
    fused_s += through_push<Algo>(w, lanes, threads, /*fuse=*/true);
    double a = plain(w, lanes, threads), b = through_push<Algo>(w, lanes, threads);
    plain_s += a;
    push_s += b;
    plain_min = std::min(plain_min, a);
    push_min = std::min(push_min, b);
  }
  const double runs = static_cast<double>(state.iterations());
  state.counters["push_s"] = push_s / runs;
  state.counters["plain_s"] = plain_s / runs;
  state.counters["ratio"] = push_s / plain_s;
  // Best of the runs: on a shared machine the least disturbed run of each is the fairer pair.
  state.counters["ratio_min"] = push_min / plain_min;
  state.counters["fused_s"] = fused_s / runs;
  state.counters["fused_speedup"] = plain_s / fused_s;
  state.counters["fused_x_limit"] = (fused_s / runs) / (workload_flops() / sgemm_rate());
  state.counters["floor_s"] = floor_s / runs;
  state.counters["fused_x_floor"] = fused_s / floor_s;
  if (lanes > 1) state.counters["fused_lanes_speedup"] = fused_one_lane / fused_s;
  g_particles = 16;
}

void BM_Ensemble(benchmark::State& state) { run<push::bayes::Ensemble>(state, plain_ensemble); }
void BM_SVGD(benchmark::State& state) { run<push::bayes::SVGD>(state, plain_svgd); }
void BM_SGLD(benchmark::State& state) { run<push::bayes::SGMCMC>(state, plain_sgld); }

BENCHMARK(BM_Ensemble)
    ->Args({1, 1, 16})
    ->Args({2, 1, 16})
    ->Args({1, 1, 64})
    ->ArgNames({"lanes", "threads", "N"})
    ->Iterations(3)
    ->Unit(benchmark::kSecond);
BENCHMARK(BM_SVGD)
    ->Args({1, 1, 16})
    ->Args({2, 1, 16})
    ->ArgNames({"lanes", "threads", "N"})
    ->Iterations(3)
    ->Unit(benchmark::kSecond);
BENCHMARK(BM_SGLD)
    ->Args({1, 1, 16})
    ->Args({2, 1, 16})
    ->ArgNames({"lanes", "threads", "N"})
    ->Iterations(3)
    ->Unit(benchmark::kSecond);

// The CNN of `push train --model cnn` on 2,048 Fashion-MNIST images, 8 particles, 1 epoch.
void BM_FusedCnn(benchmark::State& state) {
  push::data::Dataset train;
  try {
    train = push::data::subsample(push::data::load("fashion-mnist"), 2048, 0);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const int particles = 8;
  auto model = push::bayes::make_model("cnn", train.input_shape(), train.num_classes);
  auto time_it = [&](bool fuse) {
    push::bayes::Ensemble ens(
        model, push::bayes::InferOptions()
                   .particles(particles)
                   .distribution(push::PushOptions().devices(1).intra_op_threads(1).cache_size(particles))
                   .batch_size(64)
                   .likelihood(push::bayes::Likelihood::categorical)
                   .fuse(fuse));
    ens.distribution();
    auto t0 = Clock::now();
    ens.fit(train, 1);
    return seconds_since(t0);
  };
  double fused = 0, unfused = 0;
  for (auto _ : state) {
    unfused += time_it(false);
    fused += time_it(true);
  }
  const double images = static_cast<double>(particles) * train.size() * state.iterations();
  state.counters["fused_img_s"] = images / fused;
  state.counters["unfused_img_s"] = images / unfused;
  state.counters["speedup"] = unfused / fused;
}
BENCHMARK(BM_FusedCnn)->Iterations(2)->Unit(benchmark::kSecond);

// The SVGD leader's own work each batch, the term of the scale model (docs/several-hosts.md)
// that grows as n^2: svgd_direction on n particles of D parameters, against its floor, one
// matrix product of the same n x n x D size (the kernel's pairwise distances).
void BM_SvgdLeaderKernel(benchmark::State& state) {
  one_thread();  // as a leader's lane runs
  const int64_t n = state.range(0), d = state.range(1);
  torch::manual_seed(0);
  const auto theta = torch::randn({n, d}), grad = torch::randn({n, d});
  double push_s = 0, floor_s = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(push::bayes::svgd_direction(theta, grad, std::nullopt));
    push_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(torch::mm(theta, theta.t()));
    floor_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double runs = static_cast<double>(state.iterations());
  state.counters["kernel_s"] = push_s / runs;
  state.counters["matmul_s"] = floor_s / runs;
  state.counters["ratio"] = push_s / floor_s;
}
BENCHMARK(BM_SvgdLeaderKernel)
    ->Args({64, 4418})
    ->Args({256, 4418})
    ->Args({1024, 4418})
    ->ArgNames({"n", "D"})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
