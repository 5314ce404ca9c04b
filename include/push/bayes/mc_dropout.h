#pragma once
// MC dropout: particles trained with dropout, which stays on at prediction; each
// particle averages S stochastic forward passes.
//
// Use push::bayes::Dropout in the network (make_model adds it for
// McDropoutOptions().p()): LibTorch's nn::Dropout draws from the one global generator,
// so with concurrent lanes its masks would depend on scheduling. This one draws from a
// generator of its own, which MCDropout reseeds by (seed, particle, epoch) and
// (seed, particle, "predict").
#include <push/bayes/infer.h>

#include <ATen/core/Generator.h>

namespace push::bayes {

/// Dropout that is always on (training and prediction) and draws from its own generator.
class DropoutImpl : public torch::nn::Module {
 public:
  explicit DropoutImpl(double p = 0.1);
  torch::Tensor forward(const torch::Tensor& x);
  /// The next keep-mask (1 kept, 0 dropped) of a forward pass over an input of `sizes`,
  /// drawn from this module's generator on the host; forward draws exactly this.
  torch::Tensor next_mask(c10::IntArrayRef sizes, const torch::TensorOptions& options);
  void reseed(uint64_t seed);
  double p() const { return p_; }

 private:
  double p_;
  at::Generator generator_;
};
TORCH_MODULE(Dropout);

struct McDropoutOptions {
  /// Stochastic forward passes per particle at prediction.
  TORCH_ARG(int64_t, samples) = 20;
};

class MCDropout : public Infer {
 public:
  MCDropout(ModuleFactory model, InferOptions options = {}, McDropoutOptions mc = {});
  std::string name() const override { return "mcdropout"; }

 protected:
  ParticleOptions particle_options() override;
  void prepare_epoch(Particle& p, int64_t epoch) override;
  torch::Tensor predict_particle(Particle& p, const torch::Tensor& x) override;

 private:
  McDropoutOptions mc_;
};

}  // namespace push::bayes
