#pragma once
// push::bayes: deep ensembles, MultiSWAG, SVGD, MC dropout, SG-MCMC and last-layer Laplace
// as particle programs, the interface a new algorithm is written against (algorithm.h),
// the objective they share, fused particles, and the models push train builds.
//   push::bayes::Ensemble ens(push::bayes::make_model("mlp:64,64", {1}, 2),
//                             push::bayes::InferOptions().particles(8));
//   ens.fit(train, 50);  auto p = ens.predict(test.x);
#include <push/bayes/algorithm.h>
#include <push/bayes/ensemble.h>
#include <push/bayes/fused.h>
#include <push/bayes/infer.h>
#include <push/bayes/laplace.h>
#include <push/bayes/mc_dropout.h>
#include <push/bayes/mixing.h>
#include <push/bayes/models.h>
#include <push/bayes/objective.h>
#include <push/bayes/options.h>
#include <push/bayes/predictive.h>
#include <push/bayes/randomized_prior.h>
#include <push/bayes/sgmcmc.h>
#include <push/bayes/svgd.h>
#include <push/bayes/swag.h>
#include <push/bayes/warnings.h>
