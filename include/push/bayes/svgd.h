#pragma once
// Stein variational gradient descent: particles θ_1..θ_n move along
//   φ(θ_i) = (1/n) Σ_j [ k(θ_j, θ_i) ∇log p(θ_j | D) + ∇_{θ_j} k(θ_j, θ_i) ],
// with the RBF kernel k(a, b) = exp(-||a - b||² / h): the first term pulls towards high
// posterior density, the second pushes particles apart (∇_{θ_j} k(θ_j, θ_i) =
// (2/h)(θ_i - θ_j) k points from θ_j to θ_i). h is fixed or, by the median heuristic,
// median(||θ_i - θ_j||²) / log(n + 1). log p(θ | D) = -N mean_nll(batch) - ||θ||²/(2σ_p²).
//
// On the runtime: particle 0 leads each step. It sends "svgd_grad"(φ_prev, batch) to
// every particle; each applies its previous update (grad = -φ, optimizer step), computes
// ∇log p at its new θ and replies (θ, ∇log p). The leader stacks the replies, computes
// one kernel matrix and every φ, and goes on with the next batch.
//
//   push::bayes::SVGD svgd(model, InferOptions().particles(16).lr(1e-2),
//                          SVGDOptions().bandwidth(std::nullopt));
#include <push/bayes/infer.h>

namespace push::bayes {

struct SVGDOptions {
  /// h of the RBF kernel; unset: median heuristic at every step.
  TORCH_ARG(std::optional<double>, bandwidth) = std::nullopt;
  /// Keep the repulsive term; false gives n independent gradient ascents (tests).
  TORCH_ARG(bool, repulsive) = true;
};

/// φ for every particle at once: theta and grad_log_p are [n, D]; returns [n, D].
torch::Tensor svgd_direction(const torch::Tensor& theta, const torch::Tensor& grad_log_p,
                             std::optional<double> bandwidth, bool repulsive = true);

class SVGD : public Infer {
 public:
  SVGD(ModuleFactory model, InferOptions options = {}, SVGDOptions svgd = {});
  std::string name() const override { return "svgd"; }

 protected:
  ParticleOptions particle_options() override;
  std::vector<double> run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) override;

 private:
  SVGDOptions svgd_;
};

}  // namespace push::bayes
