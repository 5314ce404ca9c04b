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

// pSGLD as Li et al. run it, V adapting on every step (Γ dropped): a few percent wider than
// with V held (docs/bayes.md, *pSGLD*), still within the 15%.
TEST(SGMCMCLong, PreconditionedChainsAdaptingTheirPreconditionerSampleClose) {
  exact::check_chains({"psgld, V adapting", SGMCMCOptions().preconditioned(true).step_size(0.002).burn_in_epochs(1500)},
                      8000, 0.1, 0.15);
}

}  // namespace
}  // namespace push::bayes
