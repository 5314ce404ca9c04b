// UCI Boston over 20 random 90/10 splits (Hernández-Lobato & Adams 2015's protocol: one
// hidden layer of 50 units, 40 epochs) through `push train`, every algorithm: the table of
// docs/bayes.md ("Boston over 20 splits"), printed, and the new algorithms (sgld, sghmc,
// laplace) checked against the published figures of their family. Long: 160 runs, 178 s
// on 2 cores.
#include "cli_test_util.h"

#include <cstdio>
#include <iostream>
#include <map>

namespace {
using namespace push::testing;

struct Summary {
  double rmse = 0, rmse_sd = 0, nll = 0, nll_sd = 0;
};

/// A published figure: mean ± its spread over the splits, as published (the papers do not
/// all say whether it is a standard deviation or a standard error). A mean counts as within
/// the figure when it lies inside mean ± spread.
struct Published {
  double rmse, rmse_sd, nll, nll_sd;
  const char* source;
};

double sd(const std::vector<double>& v, double mean) {
  double s = 0;
  for (double x : v) s += (x - mean) * (x - mean);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

TEST_F(Cli, BostonOverTwentySplitsIsWithinThePublishedFiguresOfEachFamily) {
  constexpr int kSplits = 20;
  // Deep ensembles (Lakshminarayanan et al. 2017, Table 1): the family of the ensemble and of
  // a mixture of Laplaces built on one. SGHMC (Springenberg et al. 2016, tuned per data set,
  // test log-likelihood -2.49 ± 0.15, as quoted in Table 3 of "Ergodic Measure Preserving
  // Flows", ICLR 2019 submission): no SG-MCMC RMSE on Boston was found, so the RMSE is held
  // to the deep ensembles' bar, the widest published one.
  const Published ensembles{3.28, 1.00, 2.41, 0.25, "deep ensembles"};
  const Published sghmc{3.28, 1.00, 2.49, 0.15, "SGHMC (NLL); deep ensembles (RMSE)"};
  struct Row {
    std::string algo, args;
    const Published* family;  // nullptr: not held to a published figure (the older algorithms)
    double rmse, nll;         // docs/bayes.md's table: every row holds to it, within 0.1 / 0.05
  };
  const std::vector<Row> rows = {
      {"ensemble", "--algo ensemble --epochs 40", nullptr, 3.37, 2.55},
      {"svgd", "--algo svgd --epochs 40", nullptr, 3.51, 2.51},
      {"mswag", "--algo mswag --epochs 40", nullptr, 3.39, 2.46},
      {"mcdropout", "--algo mcdropout --epochs 40", nullptr, 3.42, 2.45},
      // Langevin steps without Adam's scaling fit more slowly: at 40 epochs both chains were
      // at RMSE 4.0, NLL 2.8. push train's default of 150 epochs, half of them burn-in.
      {"sgld", "--algo sgld --no-preconditioned --epochs 150", &sghmc, 3.45, 2.54},
      {"psgld", "--algo sgld --preconditioned --epochs 150", &sghmc, 3.50, 2.48},
      {"sghmc", "--algo sghmc --epochs 150", &sghmc, 3.43, 2.49},
      {"laplace", "--algo ensemble --laplace --epochs 40", &ensembles, 3.37, 2.49},
  };
  std::cout << "algorithm   RMSE          NLL           (20 splits, mean ± sd)\n";
  std::map<std::string, Summary> got;
  for (const auto& row : rows) {
    std::vector<double> rmse, nll;
    for (int split = 0; split < kSplits; ++split) {
      const std::string out = row.algo + "-" + std::to_string(split);
      auto r = run(row.args + " --data boston_house_prices --model mlp:50 --test-fraction 0.1 --seed " +
                   std::to_string(split) + " --quiet --out " + out);
      ASSERT_EQ(r.code, 0) << row.args << " split " << split << ": " << r.err;
      const auto m = metrics(out)["metrics"];
      rmse.push_back(m["rmse"].get<double>());
      nll.push_back(m["nll"].get<double>());
    }
    Summary s;
    for (int i = 0; i < kSplits; ++i) s.rmse += rmse[i] / kSplits, s.nll += nll[i] / kSplits;
    s.rmse_sd = sd(rmse, s.rmse);
    s.nll_sd = sd(nll, s.nll);
    got[row.algo] = s;
    std::printf("%-10s  %.2f ± %.2f   %.2f ± %.2f\n", row.algo.c_str(), s.rmse, s.rmse_sd, s.nll, s.nll_sd);
    std::fflush(stdout);
    EXPECT_NEAR(s.rmse, row.rmse, 0.1) << row.algo << ": docs/bayes.md's table no longer holds";
    EXPECT_NEAR(s.nll, row.nll, 0.05) << row.algo << ": docs/bayes.md's table no longer holds";
    if (row.family == nullptr) continue;
    EXPECT_NEAR(s.rmse, row.family->rmse, row.family->rmse_sd) << row.algo << " against " << row.family->source;
    EXPECT_NEAR(s.nll, row.family->nll, row.family->nll_sd) << row.algo << " against " << row.family->source;
  }
  // The Laplace predictive sits on the ensemble's networks (the same seeds, the same MAPs):
  // the same RMSE, and the last layers' uncertainty does not cost test likelihood.
  EXPECT_NEAR(got["laplace"].rmse, got["ensemble"].rmse, 1e-6);
  EXPECT_LE(got["laplace"].nll, got["ensemble"].nll);
}

}  // namespace
