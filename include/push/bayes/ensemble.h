#pragma once
// Deep ensemble: N particles trained independently and concurrently; the prediction is
// the uniform mixture of the members.
//
//   push::bayes::Ensemble ens(model, InferOptions().particles(8),
//                             EnsembleOptions().bootstrap(true));
#include <push/bayes/infer.h>

namespace push::bayes {

struct EnsembleOptions {
  /// Each particle trains on its own bootstrap resample (N draws with replacement,
  /// seeded by (seed, particle)) instead of the whole training set.
  TORCH_ARG(bool, bootstrap) = false;
};

class Ensemble : public Infer {
 public:
  Ensemble(ModuleFactory model, InferOptions options = {}, EnsembleOptions ensemble = {});
  std::string name() const override { return "ensemble"; }

 protected:
  ParticleOptions particle_options() override;
  torch::Tensor epoch_rows(Particle& p, int64_t n) const override;

 private:
  EnsembleOptions ensemble_;
};

}  // namespace push::bayes
