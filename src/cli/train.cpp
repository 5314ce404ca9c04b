// push train: trains a deep ensemble on built-in 1-D regression data (y = sin x + noise,
// with a gap in the inputs) through the particle runtime and prints the test RMSE and
// the predictive spread on the data and inside the gap.
//   push train [--particles N] [--devices D] [--epochs E] [--cache-size K] [--seed S]
#include <push/push.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "command.h"

namespace push::cli {
namespace {

struct TrainConfig {
  int particles = 8, devices = 1, epochs = 100, cache_size = 8;
  uint64_t seed = 0;
};

TrainConfig parse(int argc, char** argv) {
  TrainConfig c;
  std::map<std::string, int*> ints{{"--particles", &c.particles}, {"--devices", &c.devices},
                                   {"--epochs", &c.epochs}, {"--cache-size", &c.cache_size}};
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag != "--seed" && !ints.count(flag)) throw std::invalid_argument("unknown option '" + flag + "'");
    if (i + 1 >= argc) throw std::invalid_argument("option " + flag + " needs a value");
    std::string value = argv[++i];
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(value, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (used != value.size() || v < (flag == "--seed" ? 0 : 1)) {
      throw std::invalid_argument("option " + flag + " needs a positive whole number, got '" + value + "'");
    }
    if (flag == "--seed") {
      c.seed = static_cast<uint64_t>(v);
    } else {
      *ints[flag] = static_cast<int>(v);
    }
  }
  return c;
}

torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(1, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                               torch::nn::ReLU(), torch::nn::Linear(64, 1));
}

int train_main(int argc, char** argv) {
  TrainConfig c;
  try {
    c = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "push train: " << e.what() << "\n"
              << "usage: push train [--particles N] [--devices D] [--epochs E] [--cache-size K] [--seed S]\n";
    return 2;
  }
  torch::manual_seed(static_cast<int64_t>(c.seed));
  // Inputs in [-4,-1] and [1,4]: the gap in the middle is where an ensemble disagrees.
  auto x = torch::cat({torch::rand({256, 1}) * 3 - 4, torch::rand({256, 1}) * 3 + 1});
  auto y = torch::sin(x) + 0.1 * torch::randn_like(x);
  auto x_test = torch::linspace(-4, 4, 201).unsqueeze(1);
  auto y_test = torch::sin(x_test);
  const int64_t batch = 64;

  Push dist(mlp, PushOptions().devices(c.devices).cache_size(c.cache_size).seed(c.seed));
  auto mse = [](const torch::Tensor& o, const torch::Tensor& t) { return torch::mse_loss(o, t); };
  auto options =
      ParticleOptions()
          .optimizer([](std::vector<torch::Tensor> ps) {
            return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2));
          })
          .on("epoch",
              [&](Particle& p, const Args& a) {
                // Each particle shuffles with its own generator: reproducible per seed.
                auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed * 1000003 + p.pid() * 7919 +
                                                                    a[0].toInt());
                auto order = torch::randperm(x.size(0), gen);
                double total = 0;
                int64_t batches = 0;
                for (int64_t b = 0; b < x.size(0); b += batch, ++batches) {
                  auto idx = order.narrow(0, b, std::min(batch, x.size(0) - b));
                  total += p.step(mse, x.index_select(0, idx), y.index_select(0, idx))
                               .wait()
                               .toTensor()
                               .item<double>();
                }
                return c10::IValue(total / batches);
              })
          .on("predict", [&](Particle& p, const Args&) {
            torch::NoGradGuard no_grad;
            return p.forward(x_test).wait();
          });
  for (int i = 0; i < c.particles; ++i) dist.p_create(options);

  auto t0 = std::chrono::steady_clock::now();
  for (int e = 0; e < c.epochs; ++e) {
    std::vector<PFuture> fs;
    for (Pid pid : dist.particle_ids()) fs.push_back(dist.p_launch(pid, "epoch", int64_t{e}));
    double loss = 0;
    for (auto& v : dist.p_wait(fs)) loss += v.toDouble() / c.particles;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double eta = elapsed / (e + 1) * (c.epochs - e - 1);
    int filled = 30 * (e + 1) / c.epochs;
    std::fprintf(stderr, "\r[%s%s] epoch %d/%d x %d particles  loss %.4f  ETA %.1fs ",
                 std::string(filled, '#').c_str(), std::string(30 - filled, '.').c_str(), e + 1, c.epochs,
                 c.particles, loss, eta);
  }
  std::fprintf(stderr, "\n");

  std::vector<PFuture> fs;
  for (Pid pid : dist.particle_ids()) fs.push_back(dist.p_launch(pid, "predict"));
  std::vector<torch::Tensor> preds;
  for (auto& v : dist.p_wait(fs)) preds.push_back(v.toTensor());
  auto stacked = torch::stack(preds);  // particles x points x 1
  auto mean = stacked.mean(0), sd = stacked.std(0, /*unbiased=*/false).squeeze(1);
  double rmse = torch::sqrt(torch::mse_loss(mean, y_test)).item<double>();
  auto in_gap = (x_test.abs() < 1).squeeze(1);
  double sd_gap = sd.index({in_gap}).mean().item<double>();
  double sd_data = sd.index({~in_gap}).mean().item<double>();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-28s %10s\n", "metric", "value");
  std::printf("%-28s %10.4f\n", "test RMSE (ensemble mean)", rmse);
  std::printf("%-28s %10.4f\n", "predictive sd, on the data", sd_data);
  std::printf("%-28s %10.4f\n", "predictive sd, in the gap", sd_gap);
  std::printf("%-28s %10.2f\n", "seconds", seconds);
  return 0;
}

}  // namespace

PUSH_CLI_COMMAND(train, "train a deep ensemble on built-in data and report its uncertainty", train_main);

}  // namespace push::cli
