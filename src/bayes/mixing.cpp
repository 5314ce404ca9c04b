// Split-R̂ over chains' predictions; see mixing.h.
#include <push/bayes/mixing.h>
#include <push/core/errors.h>

#include <torch/torch.h>

#include <limits>

namespace push::bayes {

std::optional<ChainMixing> chain_mixing(const Predictive& pred, int64_t chains) {
  const auto& members = pred.members;
  if (chains < 2 || !members.defined() || members.dim() < 2) return std::nullopt;
  PUSH_CHECK(members.size(0) % chains == 0, "push::bayes::chain_mixing", members.size(0), " members do not split into ",
             chains, " equal chains");
  const int64_t k = members.size(0) / chains, half = k / 2;
  if (half < 2) return std::nullopt;
  // [chains, k, values] -> the latest 2·half samples -> [2·chains, half, values].
  auto x = members.to(torch::kCPU, torch::kFloat64).reshape({chains, k, -1});
  x = x.narrow(1, k - 2 * half, 2 * half).reshape({2 * chains, half, -1});
  const auto within = x.var(1).mean(0);  // W
  const auto means = x.mean(1);          // [2·chains, values]: chain c's halves at rows 2c, 2c + 1
  const auto between = means.var(0);     // B / n
  const auto halves = means.reshape({chains, 2, -1});
  const auto drift = (halves.select(1, 0) - halves.select(1, 1)).pow(2).mean(0) / 2;  // B / n within chains
  const double n = static_cast<double>(half);
  const auto inf = torch::full_like(within, std::numeric_limits<double>::infinity());
  // A value some sample predicts as NaN or ±inf is not mixed, whatever the arithmetic says.
  const auto finite = torch::isfinite(x).all(1).all(0);
  // Values every sample predicts alike: R̂ 1; alike within half-chains but not across: infinite.
  auto rhat_of = [&](const torch::Tensor& b) {
    const auto pooled = within * ((n - 1) / n) + b;
    const auto r =
        torch::where(within > 0, (pooled / within).sqrt(), torch::where(b > 0, inf, torch::ones_like(within)));
    return torch::where(finite, r, inf);
  };
  const auto rhat = rhat_of(between), drifting = rhat_of(drift);
  ChainMixing m;
  m.values = rhat.numel();
  m.samples_per_chain = 2 * half;
  m.rhat_median = rhat.median().item<double>();
  m.rhat_max = rhat.max().item<double>();
  m.above = (rhat > kMixedRhat).to(torch::kFloat64).mean().item<double>();
  m.drift_median = drifting.median().item<double>();
  m.drift_max = drifting.max().item<double>();
  return m;
}

}  // namespace push::bayes
