// Asynchronous training through a gradient server: rank 0 serves (primary and secondary
// reducer, holding the model and its Adam optimizer), every other rank is a worker that
// pulls the newest parameters, computes a gradient on a minibatch of its own shard of the
// sine-gap data, and pushes it. The server steps on each gradient as it arrives (no worker
// waits for another); at the end rank 0 prints the training MSE of the first and the last
// model; each worker prints its own steps per second. --seconds S stops every worker after
// S seconds, steps left or not.
//
//   ./build/push launch --nproc 3 -- ./build/examples/push_example_parameter_server --steps 400
#include <push/data/dataset.h>
#include <push/dist.h>
#include <push/server/grad_server.h>

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(1, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                               torch::nn::Tanh(), torch::nn::Linear(32, 1));
}

double mse(torch::nn::Sequential& net, const push::data::Dataset& d) {
  torch::NoGradGuard no_grad;
  return torch::mse_loss(net->forward(d.x), d.y).item<double>();
}

// Gradients the workers pushed, counted on rank 0: each worker reports its own at the end.
std::atomic<int64_t> pushed{0};
c10::IValue count_pushed(const push::dist::RpcArgs& a) {
  pushed += a.at(0).toInt();
  return c10::IValue();
}
PUSH_RPC_FUNCTION(count_pushed);

/// A positive number from the command line, or exit 2 naming the option.
double positive(const char* option, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v > 0)) {
    std::fprintf(stderr, "parameter_server: %s wants a positive number, got '%s'\n", option, text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 400;
  double lr = 3e-3;
  double seconds = 0;  // no limit
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc) {
      std::fprintf(stderr, "usage: %s [--steps N] [--lr LR] [--seconds S]\n", argv[0]);
      return 2;
    }
    if (std::strcmp(argv[i], "--steps") == 0) {
      steps = static_cast<int64_t>(positive("--steps", argv[i + 1]));
    } else if (std::strcmp(argv[i], "--lr") == 0) {
      lr = positive("--lr", argv[i + 1]);
    } else if (std::strcmp(argv[i], "--seconds") == 0) {
      seconds = positive("--seconds", argv[i + 1]);  // each worker stops then, steps or not
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--lr LR] [--seconds S]\n", argv[0]);
      return 2;
    }
  }
  try {
    push::dist::World world(push::dist::WorldOptions::from_env());
    if (world.size() < 2) throw push::Error("run it with at least 2 ranks: push launch --nproc 3 -- ...");
    auto rpc = world.rpc_group("ps", world.names());
    const auto raw = push::data::synthetic_gap(512, /*seed=*/1);
    const auto data = push::data::Standardizer::fit(raw).apply(raw);  // inputs and targets scaled
    torch::manual_seed(0);
    auto served = mlp();
    torch::optim::Adam adam(served->parameters(), torch::optim::AdamOptions(lr));
    const double start = mse(served, data);
    // Every rank builds the host object; only the primary and secondaries (rank 0) serve.
    std::unique_ptr<push::server::GradServerHost> host;
    if (world.rank() == 0) {
      host = std::make_unique<push::server::GradServerHost>(
          rpc, "ps", world.name(), std::vector<std::string>{world.name()},
          push::server::GradServerOptions().reduce_method(push::server::ReduceMethod::mean).reduce_batch_size(1));
      host->manage_model(*served, adam);
    }
    rpc.barrier();
    if (world.rank() != 0) {
      push::server::GradServer ps(rpc, "ps");
      auto net = mlp();
      // This worker's shard: every (size - 1)-th point.
      auto shard = data.subset(torch::arange(world.rank() - 1, data.size(), world.size() - 1));
      auto gen = at::make_generator<at::CPUGeneratorImpl>(world.rank());
      const auto began = std::chrono::steady_clock::now();
      const auto elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      };
      int64_t done = 0;
      for (; done < steps && (seconds == 0 || elapsed() < seconds); ++done) {
        ps.pull(*net);
        auto idx = torch::randint(shard.size(), {32}, gen, torch::kLong);
        net->zero_grad();
        torch::mse_loss(net->forward(shard.x.index_select(0, idx)), shard.y.index_select(0, idx)).backward();
        ps.push(*net);
      }
      ps.flush();
      // Each worker's own pace: with asynchronous pushes a slow one holds nobody back.
      const double took = elapsed();
      std::printf("worker %d: %lld steps in %.2f s, %.1f steps/s\n", world.rank(), static_cast<long long>(done), took,
                  static_cast<double>(done) / took);
      std::fflush(stdout);
      rpc.rpc_sync(0, "count_pushed", {c10::IValue(done)});
    }
    rpc.barrier();
    if (world.rank() == 0) {
      std::printf("steps %lld (of %lld pushed), training mse first %.4f last %.4f\n",
                  static_cast<long long>(host->steps()), static_cast<long long>(pushed.load()), start,
                  mse(served, data));
    }
    rpc.barrier();
    host.reset();
    rpc.shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parameter_server: %s\n", e.what());
    return 1;
  }
  return 0;
}
