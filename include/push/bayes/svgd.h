#pragma once
// Stein variational gradient descent: particles θ_1..θ_n move along
//   φ(θ_i) = (1/n) Σ_j [ k(θ_j, θ_i) ∇log p(θ_j | D) + ∇_{θ_j} k(θ_j, θ_i) ],
// with the RBF kernel k(a, b) = exp(-||a - b||² / h): the first term pulls towards high
// posterior density, the second pushes particles apart (∇_{θ_j} k(θ_j, θ_i) =
// (2/h)(θ_i - θ_j) k points from θ_j to θ_i). h is fixed or follows the particles: by
// default h = median(||θ_i - θ_j||²) (BandwidthRule). log p(θ | D) = -N mean_nll(batch) - ||θ||²/(2σ_p²).
//
// On the runtime: particle 0 leads each step. It sends "svgd_grad"(φ_prev, batch) to
// every group (each particle alone, or a fused group's first member: InferOptions::fuse);
// each applies its previous update (grad = -φ, optimizer step), computes ∇log p at its
// new θ and replies (θ, ∇log p). The leader stacks the replies in id order, computes one
// kernel matrix and every φ, and goes on with the next batch.
//
//   push::bayes::SVGD svgd(model, InferOptions().particles(16).lr(1e-2),
//                          SVGDOptions().bandwidth(std::nullopt));
#include <push/bayes/fused.h>
#include <push/bayes/infer.h>

#include <mutex>

namespace push::bayes {

/// How h follows the particles when SVGDOptions::bandwidth is unset (med² is the median of
/// the squared distances ||θ_i - θ_j||², i < j, recomputed at every step).
enum class BandwidthRule {
  /// h = med²: the default. The kernel between typical neighbours is e^{-1}.
  median,
  /// h = med² / log(n + 1) (Liu & Wang 2016's code): Σ_j k(θ_i, θ_j) ≈ 2 when distances
  /// concentrate. Narrower; on Gaussians of a few dimensions the particles under-disperse
  /// (variance ratio 0.61 at 4 dimensions, 32 particles; 0.45 at 8 and 64; see the test).
  median_log_n,
};

struct SVGDOptions {
  /// h of the RBF kernel; unset: bandwidth_rule at every step.
  TORCH_ARG(std::optional<double>, bandwidth) = std::nullopt;
  TORCH_ARG(BandwidthRule, bandwidth_rule) = BandwidthRule::median;
  /// Keep the repulsive term; false gives n independent gradient ascents (tests).
  TORCH_ARG(bool, repulsive) = true;
  /// The weight w of a batch's mean log-likelihood in log p = w · mean + log prior: unset,
  /// the training set's size (the posterior); 1 steps on the batch's mean loss, as PusH's
  /// SVGD does (a tempered posterior).
  TORCH_ARG(std::optional<double>, likelihood_weight) = std::nullopt;
};

/// φ for every particle at once: theta and grad_log_p are [n, D]; returns [n, D]. An
/// unset bandwidth follows `rule`.
torch::Tensor svgd_direction(const torch::Tensor& theta, const torch::Tensor& grad_log_p,
                             std::optional<double> bandwidth, bool repulsive = true,
                             BandwidthRule rule = BandwidthRule::median);

class SVGD : public Infer {
 public:
  SVGD(ModuleFactory model, InferOptions options = {}, SVGDOptions svgd = {});
  ~SVGD() override;
  std::string name() const override { return "svgd"; }

 protected:
  ParticleOptions particle_options() override;
  std::map<Pid, double> run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) override;
  std::string data_parallel_refusal(DataParallelMode) const override {
    return "its update moves every particle by the kernel-weighted gradients of all of them; spread the "
           "particles over the ranks instead (InferOptions::world)";
  }

 private:
  /// One step of a group (fused, or one unfused particle: p): applies φ [g, D] (unless
  /// empty: the epoch's first batch; it stacks a fused group), then returns
  /// (θ [g, D], ∇log p [g, D], each member's nll) at the new θ.
  c10::IValue group_grad(Particle& p, const std::vector<Pid>& members, const torch::Tensor& phi, const torch::Tensor& x,
                         const torch::Tensor& y, int64_t epoch);
  /// The epoch's last φ; a fused group's stack then goes back into its members.
  void group_apply(Particle& p, const std::vector<Pid>& members, const torch::Tensor& phi, int64_t epoch);
  /// "svgd_epoch": the leader drives every group, one message per group and batch.
  c10::IValue drive_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                          const std::vector<std::vector<Pid>>& groups);

  /// The weight of a batch's mean log-likelihood (SVGDOptions::likelihood_weight).
  double likelihood_weight();

  SVGDOptions svgd_;
  std::mutex stacks_mutex_;
  std::map<Pid, std::unique_ptr<FusedStack>> stacks_;  // by group leader, during an epoch
};

}  // namespace push::bayes
