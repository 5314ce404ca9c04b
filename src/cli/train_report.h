#pragma once
// What `push train` reports about a trained distribution: the test metrics (checked
// finite), predictions.csv and the pictures.
#include <push/bayes.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/staged_folder.h"
#include "train_config.h"

namespace push::cli {

struct Evaluation {
  std::vector<std::pair<std::string, double>> table;  // printed on stdout
  nlohmann::ordered_json metrics;                      // metrics.json's "metrics"
  std::string predictions_csv;
  std::string reliability_data;  // classification: "center accuracy confidence count" per bin
};

/// The test metrics of `pred` (on `test`, standardised like the training data; `test_raw`
/// in the data's own units and labels). Throws push::Error when a metric is not finite:
/// a diverged run has no result to publish.
Evaluation evaluate(const bayes::Predictive& pred, const data::Dataset& test_raw, const data::Dataset& test,
                    const data::Standardizer& scaler, const std::vector<double>& losses);

/// The raw inputs of the predictive-band picture (1-D regression: a grid wider than the
/// data), or nothing when the run has no such picture.
std::optional<torch::Tensor> band_grid(const data::Dataset& train_raw);

/// Renders the run's pictures into `out` (loss curve; reliability diagram or, for 1-D
/// regression, the predictive band at `grid`, predicted as `band`); returns the names of
/// those written. gnuplot missing or failing skips a picture with a warning; a failed
/// write is an error.
std::vector<std::string> write_pictures(const push::detail::StagedFolder& out, const TrainConfig& c, const Evaluation& e,
                                        bayes::Infer& infer, const data::Dataset& train_raw,
                                        const data::Standardizer& scaler, const std::optional<torch::Tensor>& grid,
                                        const std::optional<bayes::Predictive>& band);

}  // namespace push::cli
