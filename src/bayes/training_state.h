#pragma once
// What Infer, its training loop (epoch_engine.h) and the services it offers algorithms
// (push/bayes/algorithm.h, Training) share: the algorithm, its options and objective, the
// particles' optimizer, the distribution and what fit() sets. Infer owns it; the engines
// and Training refer to it. Private to the bayes area.
#include <push/bayes/algorithm.h>
#include <push/bayes/objective.h>
#include <push/bayes/options.h>
#include <push/runtime/push.h>

#include <memory>
#include <vector>

#include "data_parallel_training.h"
#include "epoch_engine.h"

namespace push::bayes::detail {

struct TrainingState {
  TrainingState(Algorithm& algorithm, InferOptions options)
      : algorithm(algorithm), options(std::move(options)), objective(this->options) {}

  Algorithm& algorithm;  // the hooks the loop runs
  InferOptions options;
  Objective objective;
  OptimizerFactory optimizer;                           // the particles' (set when the distribution is built)
  std::vector<double> base_lrs;                         // lr₀ of optimizer's param groups
  Push* dist = nullptr;                                 // Infer's, once made
  std::unique_ptr<DataParallelTraining> data_parallel;  // data_parallel only
  std::unique_ptr<EpochEngine> engine;
  int64_t dataset_size = 0;
  int64_t fit_last_epoch = 0;
  int64_t fit_calls = 0;
};

}  // namespace push::bayes::detail
