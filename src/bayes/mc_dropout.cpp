// MC dropout: a dropout module with its own generator, and the particle programs that
// train with it and average stochastic passes; see mc_dropout.h.
#include <push/bayes/mc_dropout.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <limits>
#include "core/seed.h"

namespace push::bayes {
namespace seed_purpose = push::detail::seed_purpose;
namespace {}  // namespace

DropoutImpl::DropoutImpl(double p) : p_(p) {
  PUSH_CHECK(p >= 0 && p < 1, "push::bayes::Dropout", "p must be in [0, 1), got ", p);
  // Drawn from the generator the module is built under (a particle's seed).
  reseed(static_cast<uint64_t>(torch::randint(std::numeric_limits<int64_t>::max(), {1}, torch::kLong).item<int64_t>()));
}

void DropoutImpl::reseed(uint64_t seed) { generator_ = at::make_generator<at::CPUGeneratorImpl>(seed); }

torch::Tensor DropoutImpl::forward(const torch::Tensor& x) {
  if (p_ == 0) return x;
  // The generator is a CPU one (a CUDA tensor cannot draw from it): draw the mask on the
  // host and move it. The same seed then gives the same masks on every device.
  return x * next_mask(x.sizes(), x.options()).to(x.device()) / (1 - p_);
}

torch::Tensor DropoutImpl::next_mask(c10::IntArrayRef sizes, const torch::TensorOptions& options) {
  return torch::empty(sizes, options.device(torch::kCPU)).bernoulli_(1 - p_, generator_);
}

namespace {
void reseed_dropouts(torch::nn::Module& module, uint64_t seed) {
  uint64_t i = 0;
  for (const auto& m : module.modules()) {
    if (auto* d = dynamic_cast<DropoutImpl*>(m.get())) d->reseed(push::detail::mix_seed(seed, i++));
  }
}
}  // namespace

MCDropout::MCDropout(ModuleFactory model, InferOptions options, McDropoutOptions mc)
    : Infer(std::move(model), std::move(options)), mc_(mc) {
  PUSH_CHECK(mc_.samples() >= 1, "push::bayes::MCDropout", "samples must be >= 1, got ", mc_.samples());
}

ParticleOptions MCDropout::particle_options() { return ParticleOptions(); }

void MCDropout::prepare_epoch(Particle& p, int64_t epoch) {
  // Data-parallel ranks train on different rows: each draws its own masks (rank 0 the
  // masks of one process). Predictions use one set of masks on every rank.
  uint64_t seed = options().distribution().seed();
  if (const auto& dp = options().data_parallel(); dp && dp->world().rank() > 0) {
    seed = push::detail::mix_seed(seed, dp->world().rank(), seed_purpose::kRank);
  }
  reseed_dropouts(p.module(), push::detail::mix_seed(seed, p.pid(), epoch, seed_purpose::kDropout));
}

torch::Tensor MCDropout::predict_particle(Particle& p, const torch::Tensor& x) {
  reseed_dropouts(p.module(), push::detail::mix_seed(options().distribution().seed(), p.pid(), seed_purpose::kPredict,
                                                     seed_purpose::kDropout));
  std::vector<torch::Tensor> outs;
  for (int64_t s = 0; s < mc_.samples(); ++s) outs.push_back(forward_chunked(p, x));
  return torch::stack(outs);
}

}  // namespace push::bayes
