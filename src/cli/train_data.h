#pragma once
// The data of a push train run: --data loaded and split, cut to --limit rows, checked
// against --task and --likelihood, and standardised with the training rows' statistics.
#include <push/bayes.h>

#include "train_config.h"

namespace push::cli {

struct TrainData {
  data::Dataset train_raw, test_raw;  // in the data's own units and labels
  data::Standardizer scaler;          // fitted on train_raw
  data::Dataset train, test;          // standardised: what the networks see
  double load_s = 0;                  // seconds spent loading (metrics.json's timings)
  bool handed_over = false;           // loaded once by push train --nproc, not by this rank
  bool classify() const { return train_raw.task == data::Task::classification; }
};

/// Loads the run's data. Settles what depends on it in `c`: --task (the data's) and
/// --likelihood (categorical for classification, else heteroscedastic unless given).
/// push::Error with one line naming the problem for bad data or a task that does not fit.
TrainData load_train_data(TrainConfig& c);

}  // namespace push::cli
