#include <push/bayes/predictive.h>

#include <push/bayes/objective.h>
#include <push/core/errors.h>

#include <torch/torch.h>

namespace push::bayes {

Predictive make_predictive(const torch::Tensor& outputs, Likelihood likelihood, double noise_std) {
  PUSH_CHECK(outputs.dim() == 3, "push::bayes::make_predictive", "expected outputs [S, M, out], got ", outputs.sizes());
  Predictive p;
  auto out = outputs.to(torch::kFloat64);
  if (likelihood == Likelihood::categorical) {
    p.task = Task::classification;
    p.members = torch::softmax(out, -1);
    p.probs = p.members.mean(0);
    return p;
  }
  torch::Tensor means = out, noise;
  if (likelihood == Likelihood::heteroscedastic || likelihood == Likelihood::learned_noise) {
    const int64_t t = out.size(2) / 2;
    PUSH_CHECK(out.size(2) == 2 * t, "push::bayes::make_predictive", "a ", to_string(likelihood),
               " model needs an even number of outputs (means, noise), got ", out.size(2));
    means = out.narrow(2, 0, t);
    noise = likelihood == Likelihood::heteroscedastic ? heteroscedastic_variance(out.narrow(2, t, t))
                                                      : torch::exp(-out.narrow(2, t, t));
  } else {
    noise = torch::full_like(out, noise_std * noise_std);
  }
  p.members = means;
  p.mean = means.mean(0);
  p.aleatoric = noise.mean(0);
  p.variance = p.aleatoric + means.var(0, /*unbiased=*/false);
  return p;
}

}  // namespace push::bayes
