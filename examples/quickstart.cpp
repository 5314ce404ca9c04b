// The README's example: an ensemble of 8 networks on y = sin x, trained concurrently on
// two device lanes with room for only 4 of them at a time, then saved and reloaded.
#include <push/push.h>

#include <iostream>

int main() {
  auto x = torch::linspace(-3, 3, 256).unsqueeze(1);
  auto y = torch::sin(x);
  auto mse = [](const torch::Tensor& out, const torch::Tensor& t) { return torch::mse_loss(out, t); };

  push::Push dist(
      [] { return torch::nn::Sequential(torch::nn::Linear(1, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1)); },
      push::PushOptions().devices(2).cache_size(2));
  auto options = push::ParticleOptions()
                     .optimizer([](std::vector<torch::Tensor> ps) {
                       return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2));
                     })
                     .on("train", [&](push::Particle& p, const push::Args& a) {
                       torch::Tensor loss;
                       for (int64_t i = 0; i < a[0].toInt(); ++i) loss = p.step(mse, x, y).wait().toTensor();
                       return c10::IValue(loss.item<double>());
                     });
  for (int i = 0; i < 8; ++i) dist.p_create(options);

  std::vector<push::PFuture> futures;
  for (push::Pid pid : dist.particle_ids()) futures.push_back(dist.p_launch(pid, "train", int64_t{300}));
  auto losses = dist.p_wait(futures);
  for (size_t i = 0; i < losses.size(); ++i) std::cout << "particle " << i << " loss " << losses[i].toDouble() << "\n";

  dist.save("quickstart-checkpoint");
  push::Push again(
      [] { return torch::nn::Sequential(torch::nn::Linear(1, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1)); });
  again.load("quickstart-checkpoint", [&](push::Pid) { return options; });
  std::cout << "reloaded " << again.num_particles() << " particles\n";
}
