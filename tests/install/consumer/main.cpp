// An outside project: only the installed headers and push::push.
#include <push/push.h>

#include <iostream>

int main() {
  push::Push dist([] { return torch::nn::Linear(1, 1); }, push::PushOptions().cache_size(2));
  auto opts = push::ParticleOptions()
                  .optimizer([](std::vector<torch::Tensor> ps) {
                    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1));
                  })
                  .on("train", [](push::Particle& p, const push::Args& a) {
                    auto x = a[0].toTensor();
                    auto mse = [](const torch::Tensor& o, const torch::Tensor& y) { return torch::mse_loss(o, y); };
                    return p.step(mse, x, 3 * x).wait();
                  });
  std::vector<push::PFuture> fs;
  for (int i = 0; i < 4; ++i) fs.push_back(dist.p_launch(dist.p_create(opts), "train", torch::ones({8, 1})));
  dist.p_wait(fs);
  std::cout << "consumer: " << dist.num_particles() << " particles trained, version " << PUSH_VERSION_STRING
            << std::endl;
  return 0;
}
