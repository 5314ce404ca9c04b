#include <push/bayes/ensemble.h>

#include <torch/torch.h>

#include "core/seed.h"

namespace push::bayes {

Ensemble::Ensemble(ModuleFactory model, InferOptions options, EnsembleOptions ensemble)
    : Infer(std::move(model), std::move(options)), ensemble_(ensemble) {}

ParticleOptions Ensemble::particle_options() { return ParticleOptions(); }

torch::Tensor Ensemble::epoch_rows(Particle& p, int64_t n) const {
  if (!ensemble_.bootstrap()) return {};
  // The same resample every epoch: the particle's own view of the data.
  return torch::randint(n, {n}, training().generator(p.pid(), push::detail::seed_purpose::kBootstrap), torch::kLong);
}

}  // namespace push::bayes
