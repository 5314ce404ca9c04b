// The exact-posterior check of SG-MCMC at the tolerances (long): Bayesian linear
// regression with known noise, where SGLD, pSGLD and SGHMC sample means within 0.1
// posterior sd and variances within 15% of the exact posterior's, after burn-in.
#include <gtest/gtest.h>

#include "sgmcmc_posterior.h"

namespace push::bayes {
namespace {

TEST(SGMCMCLong, EveryMethodSamplesTheExactPosterior) {
  for (const auto& c : exact::chain_cases()) exact::check_chains(c, 8000, 0.1, 0.15);
}

}  // namespace
}  // namespace push::bayes
